"""Open-QA answer metrics as pure functions on strings: exact match, F1, regex match, answer containment, recall@k.

The normalisation is ORQA's (`language/orqa/utils/eval_utils.py`, copied by qqaatw/pytorch-realm-orqa): Unicode NFD,
then SQuAD's lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace. A prediction is correct
when it matches *any* reference. CuratedTrec references are regular expressions instead of strings.
"""

import math
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)
# ORQA's regex references: `re.compile(ref, IGNORECASE | UNICODE | MULTILINE)` (DrQA's CuratedTrec convention).
_REGEX_FLAGS = re.IGNORECASE | re.UNICODE | re.MULTILINE


def _as_answer_list(answers: str | Iterable[str]) -> list[str]:
    if isinstance(answers, str):
        return [answers]
    answers = list(answers)
    for answer in answers:
        if not isinstance(answer, str):
            raise TypeError(f"answers must be strings, got {type(answer).__name__}: {answer!r:.80}")
    return answers


def normalize_answer(text: str) -> str:
    r"""
    ORQA's answer normalisation: `unicodedata.normalize("NFD")`, lower-case, remove `string.punctuation`, replace the
    articles `a`/`an`/`the` (whole words) with a space, and collapse whitespace.

    NFD decomposes accented letters but keeps the combining marks, so "café" stays different from "cafe" (as in
    ORQA; uncased BERT wordpieces strip accents, which is why decoded predictions can miss accented references).

    Args:
        text (`str`): a prediction or a reference answer.

    Returns:
        `str`: the normalised text.

    Example:

    ```python
    >>> normalize_answer("The  Beatles!")
    'beatles'
    ```
    """
    text = unicodedata.normalize("NFD", text).lower()
    text = "".join(character for character in text if character not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: str | Iterable[str]) -> float:
    r"""
    Normalised exact match: 1.0 when `normalize_answer(prediction)` equals the normalised form of any answer, else 0.0.
    This is the EM of the REALM and ORQA papers (NQ-open, WebQuestions).

    Args:
        prediction (`str`): the predicted answer.
        answers (`str` or iterable of `str`): the reference answers.

    Returns:
        `float`: 1.0 or 0.0 (0.0 with no answers).
    """
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(answer) for answer in _as_answer_list(answers)))


def regex_match(prediction: str, patterns: str | Iterable[str]) -> float:
    r"""
    CuratedTrec match, as ORQA's `evaluate_predictions.py --is_regex`: 1.0 when any pattern, compiled with
    `IGNORECASE | UNICODE | MULTILINE`, matches the **raw** (unnormalised) prediction with `re.match`, i.e. anchored at
    its start (not at its end). An invalid pattern counts as no match.

    Args:
        prediction (`str`): the predicted answer.
        patterns (`str` or iterable of `str`): the reference regular expressions.

    Returns:
        `float`: 1.0 or 0.0.
    """
    for pattern in _as_answer_list(patterns):
        try:
            compiled = re.compile(pattern, _REGEX_FLAGS)
        except re.error:
            continue
        if compiled.match(prediction) is not None:
            return 1.0
    return 0.0


def official_exact_match(prediction: str, answers: str | Iterable[str], is_regex: bool = False) -> float:
    r"""
    The "official EM" of REALM/ORQA evaluation (`language/orqa/evaluation/evaluate_predictions.py`, and
    `official_exact_match` in qqaatw/pytorch-realm-orqa): correct when the ORQA-normalised prediction equals any
    ORQA-normalised reference; with `is_regex=True` (CuratedTrec) the references are regexes matched by
    [`regex_match`] on the raw prediction instead.

    On string references it equals [`exact_match`]. Both differ from the `exact_match` that REALM/ORQA log during
    training, which compares the predicted *wordpiece span* with the answers' wordpieces inside the reader input
    (lower-cased, accents stripped, no article or punctuation removal) and cannot be computed from strings alone.

    Args:
        prediction (`str`): the predicted answer.
        answers (`str` or iterable of `str`): references (strings, or regexes with `is_regex=True`).
        is_regex (`bool`, *optional*, defaults to `False`): treat the references as regexes.

    Returns:
        `float`: 1.0 or 0.0.
    """
    if is_regex:
        return regex_match(prediction, answers)
    return exact_match(prediction, answers)


def f1_score(prediction: str, answers: str | Iterable[str]) -> float:
    r"""
    SQuAD token-level F1 between the normalised prediction and each normalised answer, maximised over the answers.
    Tokens are the whitespace-separated words of [`normalize_answer`]; overlap counts repeated tokens as a multiset.
    Two empty token lists score 1.0; one empty list scores 0.0.

    Args:
        prediction (`str`): the predicted answer.
        answers (`str` or iterable of `str`): the reference answers.

    Returns:
        `float` in `[0, 1]` (0.0 with no answers).
    """
    prediction_tokens = normalize_answer(prediction).split()
    best = 0.0
    for answer in _as_answer_list(answers):
        answer_tokens = normalize_answer(answer).split()
        if not prediction_tokens or not answer_tokens:
            best = max(best, float(prediction_tokens == answer_tokens))
            continue
        overlap = sum((Counter(prediction_tokens) & Counter(answer_tokens)).values())
        if overlap == 0:
            continue
        precision, recall = overlap / len(prediction_tokens), overlap / len(answer_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _contains_sequence(tokens: list[str], sequence: list[str]) -> bool:
    width = len(sequence)
    return any(tokens[start : start + width] == sequence for start in range(len(tokens) - width + 1))


def has_answer(text: str, answers: str | Iterable[str], match: str = "string") -> bool:
    r"""
    Whether a passage contains an answer: the "retriever correct" test behind reader oracle and recall@k.

    - `match="string"` (default, as DPR's `has_answer`): the normalised tokens of some answer
      ([`normalize_answer`] then whitespace split) occur as a contiguous run of the passage's normalised tokens. Whole
      words only: "cat" is not found in "concatenate". An answer that normalises to nothing is never found.
    - `match="regex"` (CuratedTrec): some pattern, compiled with `IGNORECASE | UNICODE | MULTILINE`, is found anywhere
      in the raw passage (`re.search`). Invalid patterns never match.
    - `match="substring"` (ORQA's `orqa_ops.has_answer`): some answer is a raw, case-sensitive substring of the
      passage.

    Args:
        text (`str`): the passage (block) text.
        answers (`str` or iterable of `str`): answer strings or regexes.
        match (`str`, *optional*, defaults to `"string"`): `"string"`, `"regex"` or `"substring"`.

    Returns:
        `bool`.
    """
    answers = _as_answer_list(answers)
    if match == "string":
        tokens = normalize_answer(text).split()
        for answer in answers:
            answer_tokens = normalize_answer(answer).split()
            if answer_tokens and _contains_sequence(tokens, answer_tokens):
                return True
        return False
    if match == "regex":
        for pattern in answers:
            try:
                if re.search(pattern, text, _REGEX_FLAGS) is not None:
                    return True
            except re.error:
                continue
        return False
    if match == "substring":
        return any(answer and answer in text for answer in answers)
    raise ValueError(f"match must be 'string', 'regex' or 'substring', got {match!r}.")


def answer_recall_at_k(
    passages_per_question: Sequence[Sequence[str]],
    answers_per_question: Sequence[str | Iterable[str]],
    ks: Iterable[int] = (1, 5, 20, 100),
    match: str = "string",
) -> dict[int, float]:
    r"""
    Answer recall@k: for each `k`, the fraction of questions with an answer in at least one of their top-`k` retrieved
    passages ([`has_answer`]). It is non-decreasing in `k`, and a question with fewer than `k` passages counts with
    those it has.

    Pass the passages of the full search beam (at least `max(ks)` per question), best first. The reference
    reimplementation (qqaatw/pytorch-realm-orqa, HF `RealmForOpenQA` in eval mode) retrieved only `reader_beam_size`
    (5) blocks, so its "top-k match" for every k >= 5 equalled recall@5; ORQA evaluated over its 5000-block beam.

    Args:
        passages_per_question (`Sequence[Sequence[str]]`): per question, the retrieved passage texts, best first.
        answers_per_question (`Sequence[str | Iterable[str]]`): per question, its answers (regexes with
            `match="regex"`).
        ks (iterable of `int`, *optional*, defaults to `(1, 5, 20, 100)`): cut-offs, each >= 1.
        match (`str`, *optional*, defaults to `"string"`): how [`has_answer`] matches.

    Returns:
        `dict[int, float]`: `{k: recall}` for each `k` in ascending order, each in `[0, 1]`.
    """
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must hold positive cut-offs, got {ks}.")
    if len(passages_per_question) != len(answers_per_question):
        raise ValueError(f"passages_per_question and answers_per_question must have the same length: "
                         f"{len(passages_per_question)} vs {len(answers_per_question)}.")  # fmt: skip
    if not passages_per_question:
        raise ValueError("answer_recall_at_k needs at least one question, got 0.")
    # Rank of the first passage holding an answer, per question (None: no passage does), then one count per k.
    first_hits = []
    for passages, answers in zip(passages_per_question, answers_per_question, strict=True):
        hits = (rank for rank, text in enumerate(passages[: ks[-1]], start=1) if has_answer(text, answers, match))
        first = next(hits, None)
        first_hits.append(first)
    total = len(first_hits)
    return {k: sum(1 for first in first_hits if first is not None and first <= k) / total for k in ks}


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test for two systems on the same questions: how likely a split at least as uneven as
    `wins` to `losses` (the questions only one system gets right; ties dropped) is if each system were as likely as the
    other to be that one. 1.0 when no question tells them apart."""
    if wins < 0 or losses < 0:
        raise ValueError(f"expected counts of questions >= 0, received wins={wins!r}, losses={losses!r}")
    trials = wins + losses
    if trials == 0:
        return 1.0
    tail = sum(math.comb(trials, i) for i in range(min(wins, losses) + 1)) / 2**trials
    return min(1.0, 2 * tail)


def paired_exact_match(new: Sequence[float], old: Sequence[float]) -> dict:
    """Two systems scored on the same questions (EM per question, in the same order): the EM of each, the questions
    only the new one gets right (`wins`) and only the old one (`losses`), and the two-sided [`sign_test`] over those."""
    new, old = [float(score) for score in new], [float(score) for score in old]
    if len(new) != len(old) or not new:
        raise ValueError(f"expected scores of the same questions, at least one, received {len(new)} new and {len(old)} "
                         "old")  # fmt: skip
    wins = sum(a > b for a, b in zip(new, old))
    losses = sum(a < b for a, b in zip(new, old))
    return {"new_em": sum(new) / len(new), "old_em": sum(old) / len(old), "wins": wins, "losses": losses,
            "sign_test_p": sign_test(wins, losses)}  # fmt: skip


__all__ = [
    "answer_recall_at_k",
    "exact_match",
    "f1_score",
    "has_answer",
    "normalize_answer",
    "official_exact_match",
    "paired_exact_match",
    "regex_match",
    "sign_test",
]

"""`OpenQAEvaluator`: open-domain QA metrics over a question set, from duck-typed `answer` / `retrieve` callables.

Nothing here imports the rest of `realm_hf`: any system fits that answers a list of questions with strings (or with
dicts holding an `"answer"`, as the "open-qa" pipeline returns) and, for retrieval metrics, returns each question's
passages best first. `realm_hf.evaluation.realm.RealmOpenQASystem` wraps a `RealmForOpenQA` so.
"""

from collections.abc import Callable, Sequence

from tqdm.auto import tqdm

from .metrics import answer_recall_at_k, exact_match, f1_score, has_answer, official_exact_match


class OpenQAEvaluator:
    r"""
    Evaluates an open-QA system on questions with reference answers and returns one flat dict of metrics
    (sentence-transformers' evaluator convention): keys prefixed with `name_` when a name is given, and
    `primary_metric = "exact_match"` (prefixed likewise).

    Args:
        questions (`Sequence[str]`): the questions.
        answers (`Sequence[str | Sequence[str]]`): per question, its reference answers (a single string is one
            answer); regexes when `is_regex=True` (CuratedTrec).
        relations (`Sequence[str | None]`, *optional*): per question, a relation / category (e.g. the relation of a
            slot-filling question). Adds `{relation}/exact_match`, `{relation}/f1` and `{relation}/count` keys.
        ks (`Sequence[int]`, *optional*, defaults to `(1, 5, 20, 100)`): recall@k cut-offs; the system is asked for
            `max(ks)` passages per question, which is what makes them real recall@k.
        name (`str`, *optional*): prefix of every key (`f"{name}_exact_match"`).
        is_regex (`bool`, *optional*, defaults to `False`): the answers are regexes: `exact_match` and
            `official_exact_match` become [`regex_match`] on the raw prediction, F1 is not reported, and passages
            contain an answer when a pattern is found in them.
        reader_beam_size (`int`, *optional*): blocks the reader reads per question; with `retrieve`, the reader
            oracle is computed on the top `reader_beam_size` retrieved passages.
        batch_size (`int`, *optional*, defaults to 32): questions per call of `answer` / `retrieve`.
        progress (`bool`, *optional*, defaults to `False`): show a progress bar (on stderr) for each pass over the
            questions (answering, retrieving, reading).

    Calling it: `evaluator(answer, retrieve=None, read=None)`.

    - `answer`: `answer(questions) -> list[str]` (or a list of dicts with an `"answer"` key, or one dict per
      question, as a pipeline returns), or an object with an `answer` method (and then `retrieve`, `read` and
      `reader_beam_size` are taken from it when present).
    - `retrieve`: `retrieve(questions, k) -> list[list[str]]`, each question's top-`k` passage texts, best first.
    - `read`: `read(questions) -> list[list[str]]`, the passages the reader read per question (reader oracle);
      defaults to the top `reader_beam_size` passages of `retrieve`.

    After a call, `predictions` holds its answer per question (in the order of `questions`), to see which ones missed.

    Keys: `exact_match`, `official_exact_match`, `f1`, `reader_oracle` (with `read` or `retrieve` and a reader beam),
    `recall@{k}` for each k (with `retrieve`), `num_questions`, per-relation keys, and `primary_metric`.
    `reader_oracle` is the fraction of questions whose answer appears ([`has_answer`]) in a block the reader read:
    an upper bound on exact match given retrieval (ORQA counts gold spans of at most `max_span_width` wordpieces).
    """

    def __init__(
        self,
        questions: Sequence[str],
        answers: Sequence[str | Sequence[str]],
        relations: Sequence[str | None] | None = None,
        ks: Sequence[int] = (1, 5, 20, 100),
        name: str = "",
        is_regex: bool = False,
        reader_beam_size: int | None = None,
        batch_size: int = 32,
        progress: bool = False,
    ):
        self.questions = list(questions)
        self.answers = [[answer] if isinstance(answer, str) else list(answer) for answer in answers]
        if len(self.questions) != len(self.answers):
            raise ValueError(f"questions and answers must have the same length: {len(self.questions)} vs "
                             f"{len(self.answers)}.")  # fmt: skip
        if not self.questions:
            raise ValueError("OpenQAEvaluator needs at least one question, got 0.")
        self.relations = list(relations) if relations is not None else None
        if self.relations is not None and len(self.relations) != len(self.questions):
            raise ValueError(f"relations must have one entry per question: {len(self.relations)} vs "
                             f"{len(self.questions)}.")  # fmt: skip
        self.ks = sorted({int(k) for k in ks})
        if not self.ks or self.ks[0] < 1:
            raise ValueError(f"ks must hold positive cut-offs, got {list(ks)}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}.")
        self.name = name
        self.is_regex = is_regex
        self.reader_beam_size = reader_beam_size
        self.batch_size = batch_size
        self.progress = progress
        self.greater_is_better = True
        self.primary_metric = "exact_match"
        self.predictions: list[str] | None = None  # the last call's answers

    def __call__(
        self,
        answer: Callable | object,
        retrieve: Callable[[list[str], int], list[list[str]]] | None = None,
        read: Callable[[list[str]], list[list[str]]] | None = None,
    ) -> dict[str, float | int | str]:
        reader_beam_size = self.reader_beam_size
        if not callable(answer) and hasattr(answer, "answer"):
            system = answer
            retrieve = retrieve if retrieve is not None else getattr(system, "retrieve", None)
            read = read if read is not None else getattr(system, "read", None)
            if reader_beam_size is None:
                reader_beam_size = getattr(system, "reader_beam_size", None)
            answer = system.answer
        predictions = []
        for batch in self._batches("answering"):
            predictions.extend(_as_answer_strings(answer(batch), len(batch)))
        self.predictions = predictions
        retrieved = None
        if retrieve is not None:
            retrieved = []
            for batch in self._batches("retrieving"):
                retrieved.extend(_check_passages(retrieve(batch, self.ks[-1]), len(batch), "retrieve"))
        read_passages = None
        if read is not None:
            read_passages = []
            for batch in self._batches("reading"):
                read_passages.extend(_check_passages(read(batch), len(batch), "read"))
        elif retrieved is not None and reader_beam_size is not None:
            read_passages = [passages[:reader_beam_size] for passages in retrieved]
        return self.compute_metrics(predictions, retrieved=retrieved, read_passages=read_passages)

    def exact_match_of(self, prediction: str, answers: Sequence[str]) -> float:
        """One question's `exact_match` as this evaluator counts it: [`regex_match`] of the raw prediction with
        `is_regex`, else [`exact_match`]."""
        if self.is_regex:
            return official_exact_match(prediction, answers, is_regex=True)
        return exact_match(prediction, answers)

    def compute_metrics(
        self,
        predictions: Sequence[str],
        retrieved: Sequence[Sequence[str]] | None = None,
        read_passages: Sequence[Sequence[str]] | None = None,
    ) -> dict[str, float | int | str]:
        r"""
        The metrics from precomputed outputs (what `__call__` returns once it has them).

        Args:
            predictions (`Sequence[str]`): one predicted answer per question.
            retrieved (`Sequence[Sequence[str]]`, *optional*): per question, the retrieved passages, best first.
            read_passages (`Sequence[Sequence[str]]`, *optional*): per question, the passages the reader read.

        Returns:
            `dict`: the flat metrics dict (see [`OpenQAEvaluator`]).
        """
        if len(predictions) != len(self.questions):
            raise ValueError(f"expected {len(self.questions)} predictions, got {len(predictions)}.")
        match = "regex" if self.is_regex else "string"
        em = [self.exact_match_of(p, a) for p, a in zip(predictions, self.answers, strict=True)]
        official = [official_exact_match(p, a, is_regex=self.is_regex) for p, a in zip(predictions, self.answers)]
        metrics: dict[str, float | int | str] = {
            "exact_match": _mean(em),
            "official_exact_match": _mean(official),
        }
        f1 = None
        if not self.is_regex:
            f1 = [f1_score(p, a) for p, a in zip(predictions, self.answers, strict=True)]
            metrics["f1"] = _mean(f1)
        if read_passages is not None:
            oracle = [any(has_answer(text, a, match) for text in passages)
                      for passages, a in zip(read_passages, self.answers, strict=True)]  # fmt: skip
            metrics["reader_oracle"] = _mean(oracle)
        if retrieved is not None:
            for k, recall in answer_recall_at_k(retrieved, self.answers, self.ks, match=match).items():
                metrics[f"recall@{k}"] = recall
        metrics["num_questions"] = len(self.questions)
        if self.relations is not None:
            groups: dict[str, list[int]] = {}
            for index, relation in enumerate(self.relations):
                if relation is not None:
                    groups.setdefault(str(relation), []).append(index)
            for relation, indices in sorted(groups.items()):
                metrics[f"{relation}/exact_match"] = _mean([em[index] for index in indices])
                if f1 is not None:
                    metrics[f"{relation}/f1"] = _mean([f1[index] for index in indices])
                metrics[f"{relation}/count"] = len(indices)
        prefix = f"{self.name}_" if self.name else ""
        metrics = {prefix + key: value for key, value in metrics.items()}
        metrics["primary_metric"] = prefix + self.primary_metric
        return metrics

    def _batches(self, what: str):
        with tqdm(total=len(self.questions), desc=what, unit="question", disable=not self.progress) as bar:
            for start in range(0, len(self.questions), self.batch_size):
                batch = self.questions[start : start + self.batch_size]
                yield batch
                bar.update(len(batch))


def _as_answer_strings(outputs, expected: int) -> list[str]:
    if isinstance(outputs, (str, dict)):
        outputs = [outputs]
    outputs = list(outputs)
    if len(outputs) != expected:
        raise ValueError(f"answer(questions) must return one answer per question: {expected} asked, "
                         f"{len(outputs)} returned.")  # fmt: skip
    answers = []
    for output in outputs:
        if isinstance(output, list):  # a pipeline with top_k > 1: the best answer comes first
            output = output[0] if output else ""
        if isinstance(output, dict):
            output = output.get("answer", "")
        if not isinstance(output, str):
            raise TypeError(f"answer(questions) must return strings or dicts with an 'answer', got "
                            f"{type(output).__name__}.")  # fmt: skip
        answers.append(output)
    return answers


def _check_passages(outputs, expected: int, name: str) -> list[list[str]]:
    outputs = [list(passages) for passages in outputs]
    if len(outputs) != expected:
        raise ValueError(f"{name} must return one list of passages per question: {expected} asked, "
                         f"{len(outputs)} returned.")  # fmt: skip
    return outputs


def _mean(values) -> float:
    values = list(values)
    return float(sum(values)) / len(values) if values else 0.0


__all__ = ["OpenQAEvaluator"]

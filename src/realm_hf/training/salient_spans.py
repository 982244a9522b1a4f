"""Salient-span masking for REALM pretraining (Guu et al. 2020): mask one named entity or date of a sentence.

REALM's masked-language-model queries are single sentences in which ONE salient span (a named entity or a date) is
replaced by `[MASK]` wordpieces (one `[MASK]` per wordpiece, no 80/10/10 replacement); the model must recover it,
which rewards retrieving documents that state the fact. The original tagged entities with a CoNLL-trained BERT tagger
and dates with regexes (reference: orqa-realm-training §2.4). Here the taggers are offline and dependency-free:

- [`DateTagger`]: regexes for clear date patterns ("16 April 1889", "April 16, 1889", "April 1889", "1889", "1990s").
- [`TitleEntityTagger`]: known entity names (e.g. the corpus's document titles) matched as whole words.
- [`CombinedTagger`]: the union of several taggers, overlaps resolved in favour of the longer span.

Any callable `text -> [(start, end, kind), ...]` is a [`SalientSpanTagger`], so a real NER model can be plugged in.

    B - batch (rows that have a salient span)     L - sequence length (<= max_length), `[CLS] sentence [SEP]`
"""

import operator
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from transformers.utils import logging

from ..retrieval.document_store import block_text

logger = logging.get_logger(__name__)

# The label of positions that are not predicted (ignored by `torch.nn.functional.cross_entropy`).
IGNORE_INDEX = -100

Span = tuple[int, int, str]


@runtime_checkable
class SalientSpanTagger(Protocol):
    """Finds salient spans in a text: a list of `(start, end, kind)` character spans, `kind` "entity" or "date"."""

    def __call__(self, text: str) -> list[Span]: ...


def select_longest(spans: Iterable[Span]) -> list[Span]:
    """Non-overlapping spans, chosen greedily longest first (ties: the earlier start, then the earlier in `spans`);
    returned sorted by start."""
    ranked = sorted(enumerate(spans), key=lambda item: (item[1][0] - item[1][1], item[1][0], item[0]))
    chosen: list[Span] = []
    for _, span in ranked:
        if all(span[1] <= other[0] or other[1] <= span[0] for other in chosen):
            chosen.append(span)
    return sorted(chosen)


# ---------------------------------------------------------------------------------------------------------------------
# dates

_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
_DAY = r"(?:3[01]|[12][0-9]|0?[1-9])"
_YEAR = r"(?:1[0-9]{3}|20[0-9]{2})"  # 1000-2099
# A number is not a year when it is part of a longer number ("1,889", "3.1415", "12345") or glued to a word ("1889s").
_NOT_BEFORE = r"(?<![\w.,])"
_NOT_AFTER = r"(?![\w]|[.,][0-9])"

# The date patterns, all case-sensitive (month names capitalised, so "may" the verb never matches):
#   "16 April 1889"      day month year
#   "April 16, 1889"     month day[st|nd|rd|th][,] year
#   "April 1889"         month year
#   "1990s"              a decade, 1000s-2090s
#   "1889"               a standalone 4-digit year, 1000-2099
# Deliberately left out: a day and month without a year ("16 April"), numeric dates ("16/04/1889"), abbreviated
# months ("Apr."), eras and centuries ("5th century BC"). A bare year also catches other numbers ("2000 people"): an
# accepted false positive, since masking it still asks the model for a specific fact of the sentence.
_DATE_PATTERNS = [
    re.compile(rf"{_NOT_BEFORE}{_DAY}\s+{_MONTH}\s+{_YEAR}{_NOT_AFTER}"),
    re.compile(rf"\b{_MONTH}\s+{_DAY}(?:st|nd|rd|th)?,?\s+{_YEAR}{_NOT_AFTER}"),
    re.compile(rf"\b{_MONTH}\s+{_YEAR}{_NOT_AFTER}"),
    re.compile(rf"{_NOT_BEFORE}(?:1[0-9]{{2}}0|20[0-9]0)s\b"),
    re.compile(rf"{_NOT_BEFORE}{_YEAR}{_NOT_AFTER}"),
]


class DateTagger:
    r"""
    Tags dates with the regexes above; returns non-overlapping `(start, end, "date")` spans, longest first ("16 April
    1889" wins over "April 1889" and "1889"), sorted by start.
    """

    kind = "date"

    def __call__(self, text: str) -> list[Span]:
        spans = [(match.start(), match.end(), self.kind) for pattern in _DATE_PATTERNS
                 for match in pattern.finditer(text)]  # fmt: skip
        return select_longest(spans)


# ---------------------------------------------------------------------------------------------------------------------
# entities

_WORD = re.compile(r"\w+")
# A Wikipedia disambiguation suffix, as in "Mercury (planet)": it never occurs in running text.
_DISAMBIGUATION = re.compile(r"\s*\([^()]*\)\s*$")


class TitleEntityTagger:
    r"""
    Tags occurrences of known entity names (e.g. the corpus's document titles) as whole words.

    Titles are indexed by their first word: at each word of the text only the titles starting with that word are
    tried, so tagging costs about one dictionary look-up per word however many titles there are. Matches must start
    and end at word boundaries ("France" does not match in "Franceville"); overlapping matches are resolved longest
    first ("Mount Everest" over "Everest").

    Args:
        titles (`Iterable[str]`): the entity names. Surrounding whitespace and a trailing disambiguation in
            parentheses ("Mercury (planet)" -> "Mercury") are removed; names that do not start with a letter or digit
            are skipped.
        min_length (`int`, defaults to 3): names shorter than this many characters are skipped ("US", "Go").
        case_sensitive (`bool`, defaults to True): match names exactly. With False, "france" also matches "France";
            beware that titles which are common words ("The", "Water") then match everywhere.
        kind (`str`, defaults to "entity"): the kind of the returned spans.
    """

    def __init__(self, titles: Iterable[str], min_length: int = 3, case_sensitive: bool = True, kind: str = "entity"):
        if min_length < 1:
            raise ValueError(f"min_length must be >= 1, got {min_length}.")
        self.min_length = min_length
        self.case_sensitive = case_sensitive
        self.kind = kind
        names = set()
        for title in titles:
            if not isinstance(title, str):
                raise ValueError(f"expected titles of type str, got {type(title).__name__}: {title!r}.")
            name = _DISAMBIGUATION.sub("", title.strip()).strip()
            if len(name) >= min_length and _WORD.match(name):
                names.add(name if case_sensitive else name.lower())
        # First word -> names starting with it, longest first. Names only ever compare with text of their own length.
        self._by_first_word: dict[str, list[str]] = {}
        for name in sorted(names, key=lambda name: (-len(name), name)):
            self._by_first_word.setdefault(_WORD.match(name).group(0), []).append(name)
        self.num_titles = len(names)

    def __call__(self, text: str) -> list[Span]:
        folded = text if self.case_sensitive else text.lower()
        if len(folded) != len(text):  # a few characters change length when lower-cased ("İ"): keep offsets exact
            folded = text
        spans = []
        for word in _WORD.finditer(folded):  # maximal runs of word characters: each starts at a word boundary
            start = word.start()
            for name in self._by_first_word.get(word.group(0), ()):
                end = start + len(name)
                # Whole words: a name that ends in a word character must not be followed by one.
                cut = end < len(folded) and _WORD.match(name[-1]) and _WORD.match(folded[end])
                if folded.startswith(name, start) and not cut:
                    spans.append((start, end, self.kind))
                    break  # the longest name at this position
        return select_longest(spans)

    def __repr__(self) -> str:
        return f"TitleEntityTagger(num_titles={self.num_titles}, case_sensitive={self.case_sensitive})"


class CombinedTagger:
    """The union of several taggers' spans; overlaps are resolved in favour of the longer span (ties: the earlier
    start, then the earlier tagger)."""

    def __init__(self, *taggers: SalientSpanTagger):
        if not taggers:
            raise ValueError("expected at least one tagger.")
        for tagger in taggers:
            if not callable(tagger):
                raise ValueError(f"expected callable taggers (text -> [(start, end, kind)]), got {tagger!r}.")
        self.taggers = taggers

    def __call__(self, text: str) -> list[Span]:
        return select_longest(span for tagger in self.taggers for span in tagger(text))


# ---------------------------------------------------------------------------------------------------------------------
# masking


def _validate_spans(spans: Sequence[Span], text: str) -> list[Span]:
    valid = []
    for span in spans:
        if len(span) != 3 or not (0 <= span[0] < span[1] <= len(text)):
            raise ValueError(
                f"expected a tagger to return (start, end, kind) spans with 0 <= start < end <= {len(text)}, got "
                f"{span!r} for text {text!r}."
            )
        valid.append((int(span[0]), int(span[1]), str(span[2])))
    return valid


def mask_salient_span(
    text: str,
    tokenizer: Any,
    tagger: SalientSpanTagger,
    rng: random.Random,
    max_length: int = 128,
    title: str | None = None,
) -> dict[str, Any] | None:
    r"""
    Masks one salient span of a sentence for REALM's masked-language-model pretraining.

    The sentence is encoded as `[CLS] sentence [SEP]` and truncated to `max_length` wordpieces. One span is chosen
    uniformly at random (`rng.randrange`) among the tagger's spans whose wordpieces all survive truncation; every
    wordpiece that overlaps the span is replaced by `[MASK]` (for word-aligned spans these are exactly the wordpieces
    inside the span, REALM's rule; with a span that cuts a word, overlap leaves none of the span's characters visible).

    Args:
        text (`str`): the sentence.
        tokenizer: a fast (Rust) BERT tokenizer such as `RealmTokenizer`; its offset mapping maps spans to wordpieces.
        tagger ([`SalientSpanTagger`]): finds the candidate spans.
        rng (`random.Random`): chooses the span.
        max_length (`int`, defaults to 128): wordpieces per sequence, `[CLS]` and `[SEP]` included.
        title (`str`, *optional*): context read before the sentence and never masked: the sequence is
            `[CLS] title: sentence [SEP]` ([`block_text`]'s layout). For corpora of titled records whose sentences do
            not name their subject ("3 October 1932 (from League of Nations mandate)" under "Iraq. Government.
            Independence"), where the bare sentence gives the retriever nothing to go on.

    Returns:
        `None` when the sentence has no salient span (or none that fits in `max_length`): the caller drops the
        sentence, as REALM only builds examples from sentences with a salient span. Otherwise a `dict` with
        `input_ids` (`list[int]`, `[CLS] ... [SEP]` with the span's wordpieces replaced by `[MASK]`), `labels`
        (`list[int]`, the original ids at the masked positions and -100 elsewhere), `span` (the chosen
        `(start, end, kind)`) and `masked_text` (`text` with the masked wordpieces' characters replaced by
        space-separated `[MASK]`s, for inspection); with a `title`, both are in `title: sentence` terms.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("mask_salient_span needs a fast tokenizer (return_offsets_mapping), e.g. RealmTokenizer.")
    if max_length < 3:
        raise ValueError(f"max_length must be >= 3 ([CLS], one wordpiece, [SEP]), got {max_length}.")
    if tokenizer.mask_token_id is None:
        raise ValueError("the tokenizer has no mask token ([MASK]).")
    spans = _validate_spans(tagger(text), text)
    if not spans:
        return None
    if title:
        # Spans are found in the sentence alone, so the title is context only; shift them past it.
        prefix = block_text(title, "")
        spans = [(start + len(prefix), end + len(prefix), kind) for start, end, kind in spans]
        text = prefix + text
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    offsets = encoding["offset_mapping"][: max_length - 2]  # the wordpieces that survive truncation
    candidates = []  # (span, indices of its wordpieces in `offsets`)
    for span in spans:
        pieces = [i for i, (start, end) in enumerate(encoding["offset_mapping"]) if start < span[1] and span[0] < end]
        if pieces and pieces[-1] < len(offsets):
            candidates.append((span, pieces))
    if not candidates:
        return None
    span, pieces = candidates[rng.randrange(len(candidates))]

    original = [tokenizer.cls_token_id, *encoding["input_ids"][: max_length - 2], tokenizer.sep_token_id]
    input_ids = list(original)
    labels = [IGNORE_INDEX] * len(original)
    for piece in pieces:
        input_ids[piece + 1] = tokenizer.mask_token_id  # +1: [CLS]
        labels[piece + 1] = original[piece + 1]
    first, last = offsets[pieces[0]][0], offsets[pieces[-1]][1]
    masked_text = text[:first] + " ".join([tokenizer.mask_token] * len(pieces)) + text[last:]
    return {"input_ids": input_ids, "labels": labels, "span": span, "masked_text": masked_text}


def _block_id(row: Mapping[str, Any]) -> int:
    try:
        return operator.index(row["block_id"])
    except (KeyError, TypeError):
        raise ValueError(f"expected every row to have an integer 'block_id', got {row.get('block_id')!r}.") from None


@dataclass
class SalientSpanCollator:
    r"""
    Turns sentences into REALM masked-language-model batches: `input_ids`, `attention_mask`, `token_type_ids` and
    `labels`, all `torch.LongTensor` of shape `(B, L)`, padded to the longest row (`labels` padded with -100).

    Rows are mappings with `text` (one sentence), optionally `title` (unmasked context read first, see
    [`mask_salient_span`]) and optionally `block_id` (the corpus block the sentence comes from;
    then the batch also holds `source_block_ids`, `torch.LongTensor` of shape `(B,)`, which REALM pretraining keeps
    out of the sentence's retrieved candidates). Rows without a salient span are dropped, so `B` may be smaller than
    the number of rows; a batch in which no row has one raises `ValueError` (tag and filter the corpus beforehand, or
    use larger batches). The span masked in a row depends only on `seed` and the row's text, not on the batch or
    process it lands in; use another `seed` per epoch to mask other spans of the same sentences.
    """

    tokenizer: Any = field(metadata={"help": "A fast BERT tokenizer with [MASK], e.g. `RealmTokenizer`."})
    tagger: Any = field(metadata={"help": "A `SalientSpanTagger`: text -> [(start, end, kind)]."})
    max_length: int = field(default=128, metadata={"help": "Wordpieces per sentence, [CLS] and [SEP] included."})
    seed: int = field(default=0, metadata={"help": "Seed of the per-row span choice."})

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not rows:
            raise ValueError("expected a non-empty list of rows, got an empty one.")
        examples, block_ids = [], []
        with_block_ids = "block_id" in rows[0]
        for row in rows:
            if "text" not in row or not isinstance(row["text"], str):
                raise ValueError(f"expected rows with a 'text' string, got keys {sorted(row)}.")
            # A string seed is hashed with SHA-512 by `random.Random`: stable across processes, unlike `hash()`.
            rng = random.Random(f"{self.seed}\ntext={row['text']}")
            example = mask_salient_span(row["text"], self.tokenizer, self.tagger, rng, max_length=self.max_length,
                                        title=row.get("title"))  # fmt: skip
            if example is not None:
                examples.append(example)
                if with_block_ids:
                    block_ids.append(_block_id(row))
        if not examples:
            raise ValueError(
                f"none of the {len(rows)} rows has a salient span (an entity or date found by {self.tagger!r}); "
                "filter the corpus to sentences with one, or use larger batches."
            )
        if len(examples) < len(rows):
            logger.debug(f"dropped {len(rows) - len(examples)} of {len(rows)} rows without a salient span.")
        length = max(len(example["input_ids"]) for example in examples)
        input_ids = torch.full((len(examples), length), self.tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
        for index, example in enumerate(examples):
            n = len(example["input_ids"])
            input_ids[index, :n] = torch.tensor(example["input_ids"])
            labels[index, :n] = torch.tensor(example["labels"])
            attention_mask[index, :n] = 1
        batch = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": torch.zeros_like(input_ids),
            "labels": labels,
        }
        if with_block_ids:
            batch["source_block_ids"] = torch.tensor(block_ids, dtype=torch.long)
        return batch


__all__ = [
    "IGNORE_INDEX",
    "CombinedTagger",
    "DateTagger",
    "SalientSpanCollator",
    "SalientSpanTagger",
    "TitleEntityTagger",
    "mask_salient_span",
    "select_longest",
]

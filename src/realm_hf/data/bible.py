"""Two English translations of the Bible, read from Debian packages at run time: a corpus of parallel documents.

The King James Version (1611; Debian `bible-kjv-text`, read with the package's own `bible` program from `bible-kjv`)
and the World English Bible (2015 edition, public domain; Debian `sword-text-web`, a SWORD `zText` module read here
in pure Python) tell the same 66 books in different words ("And God said, Let there be light" / "God said, Let
there be light"). Every book is a document of each translation, so a held-out book of one translation has its other
translation in the database: the setting where retrieval can supply what a language model cannot know (names,
numbers, the next verse), used by `examples/retro_factbook.py --corpus bible` (docs/retro.md).

[`fetch_bible_packages`] downloads and unpacks the three packages (nothing is installed; [`~realm_hf.data.debian`]),
[`read_kjv`] and [`read_sword_ztext`] return verses `{"book", "chapter", "verse", "text"}` with OSIS book ids
(`"Gen"`, `"Matt"`, ...), and [`build_bible`] joins them into one document per book.

A SWORD `zText` module is three files per testament (`ot.*`, `nt.*`): `.bzz` holds zlib-compressed blocks, `.bzs`
indexes the blocks (offset, compressed size, uncompressed size: three little-endian uint32), `.bzv` indexes every
verse slot of the versification in order (block, offset in the uncompressed block: uint32; size: uint16). Slots
hold OSIS XML; a chapter's first slot holds its `<chapter osisID="Gen.1"/>` start tag and headings, the next slots
its verses.
"""

from __future__ import annotations

import html
import os
import re
import struct
import subprocess
import zlib
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "BIBLE_BOOKS",
    "build_bible",
    "fetch_bible_packages",
    "osis_to_text",
    "parse_kjv_lines",
    "read_kjv",
    "read_sword_ztext",
]

# The 66 books of both translations in canonical order: (OSIS id, English name).
BIBLE_BOOKS: tuple[tuple[str, str], ...] = tuple(
    tuple(entry.split(":")) for entry in (
        "Gen:Genesis|Exod:Exodus|Lev:Leviticus|Num:Numbers|Deut:Deuteronomy|Josh:Joshua|Judg:Judges|Ruth:Ruth|"
        "1Sam:1 Samuel|2Sam:2 Samuel|1Kgs:1 Kings|2Kgs:2 Kings|1Chr:1 Chronicles|2Chr:2 Chronicles|Ezra:Ezra|"
        "Neh:Nehemiah|Esth:Esther|Job:Job|Ps:Psalms|Prov:Proverbs|Eccl:Ecclesiastes|Song:Song of Solomon|Isa:Isaiah|"
        "Jer:Jeremiah|Lam:Lamentations|Ezek:Ezekiel|Dan:Daniel|Hos:Hosea|Joel:Joel|Amos:Amos|Obad:Obadiah|"
        "Jonah:Jonah|Mic:Micah|Nah:Nahum|Hab:Habakkuk|Zeph:Zephaniah|Hag:Haggai|Zech:Zechariah|Mal:Malachi|"
        "Matt:Matthew|Mark:Mark|Luke:Luke|John:John|Acts:Acts|Rom:Romans|1Cor:1 Corinthians|2Cor:2 Corinthians|"
        "Gal:Galatians|Eph:Ephesians|Phil:Philippians|Col:Colossians|1Thess:1 Thessalonians|2Thess:2 Thessalonians|"
        "1Tim:1 Timothy|2Tim:2 Timothy|Titus:Titus|Phlm:Philemon|Heb:Hebrews|Jas:James|1Pet:1 Peter|2Pet:2 Peter|"
        "1John:1 John|2John:2 John|3John:3 John|Jude:Jude|Rev:Revelation"
    ).split("|")
)  # fmt: skip
_BOOK_NAMES = dict(BIBLE_BOOKS)

KJV_PACKAGES = ("bible-kjv", "bible-kjv-text")
WEB_PACKAGE = "sword-text-web"
_KJV_PROGRAM, _KJV_DATA = Path("usr/bin/bible"), Path("usr/lib/bible.data")
WEB_MODULE = Path("usr/share/sword/modules/texts/ztext/engWEB2015eb")


def _default_cache() -> Path:
    from ..home import realm_hf_home

    return realm_hf_home() / "bible"


def fetch_bible_packages(cache_dir: str | os.PathLike | None = None) -> Path:
    """Downloads (`apt-get download bible-kjv bible-kjv-text sword-text-web`) and unpacks the two translations into
    `cache_dir` (default `$REALM_HF_HOME/bible`) the first time; returns `cache_dir`. Nothing is installed."""
    from .debian import fetch_debian_packages

    cache = Path(cache_dir) if cache_dir is not None else _default_cache()
    return fetch_debian_packages([*KJV_PACKAGES, WEB_PACKAGE], [_KJV_PROGRAM, _KJV_DATA, WEB_MODULE / "nt.bzz"], cache)


# ---------------------------------------------------------------------------------------------------------------------
# King James Version: the `bible` program prints "Ge1:1 In the beginning ..." lines, books in canonical order

_KJV_LINE = re.compile(r"^(?P<book>\d?[A-Za-z]+)(?P<chapter>\d+):(?P<verse>\d+) (?P<text>.*)$")


def parse_kjv_lines(lines: Iterable[str]) -> list[dict]:
    r"""
    Verses from the `bible -f` program's output lines (`"Ge1:1 In the beginning God created ..."`).

    The program's own book abbreviations (`Ge`, `Exo`, `1Sm`, ...) are mapped to OSIS ids by their order: the
    program prints the books in canonical order, so the n-th abbreviation met is the n-th of [`BIBLE_BOOKS`].

    Raises:
        ValueError: a line that is not a verse, or more books than the 66.
    """
    verses, books = [], {}
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        match = _KJV_LINE.match(line)
        if match is None:
            raise ValueError(f"line {number} of the KJV text is not a verse (expected 'Ge1:1 text'): {line[:80]!r}")
        abbreviation = match["book"]
        if abbreviation not in books:
            if len(books) == len(BIBLE_BOOKS):
                raise ValueError(f"line {number}: a 67th book {abbreviation!r}; the KJV has {len(BIBLE_BOOKS)}")
            books[abbreviation] = BIBLE_BOOKS[len(books)][0]
        verses.append({"book": books[abbreviation], "chapter": int(match["chapter"]), "verse": int(match["verse"]),
                       "text": _tidy(match["text"])})  # fmt: skip
    return verses


def read_kjv(root: str | os.PathLike) -> list[dict]:
    """Every KJV verse, read with the `bible` program of a [`fetch_bible_packages`] directory."""
    root = Path(root)
    result = subprocess.run(
        [str(root / _KJV_PROGRAM), "-p", str(root / _KJV_DATA.parent), "-f", "gen1:1-rev22:21"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0 or not result.stdout:
        raise RuntimeError(f"`bible -f gen1:1-rev22:21` failed (exit code {result.returncode}): "
                           f"{result.stderr.strip()[-300:]}")  # fmt: skip
    return parse_kjv_lines(result.stdout.splitlines())


# ---------------------------------------------------------------------------------------------------------------------
# World English Bible: a SWORD zText module of OSIS XML

_NOTE = re.compile(r"<note\b[^>]*>.*?</note>", re.DOTALL)
_TITLE = re.compile(r"<title\b[^>]*>.*?</title>", re.DOTALL)
_TAG = re.compile(r"<[^<>]*>")
_SPACE_BEFORE_PUNCTUATION = re.compile(r" (?=[,.;:!?])")
_CHAPTER = re.compile(r"<chapter\b[^>]*\bosisID=\"(?P<book>[^\".]+)\.(?P<chapter>\d+)\"")
_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'", "\u2014": " - "})


def _tidy(text: str) -> str:
    return " ".join(text.translate(_QUOTES).split())


def osis_to_text(osis: str) -> str:
    """The words of an OSIS XML fragment: footnotes and headings dropped, tags removed, entities unescaped."""
    # A footnote sits between two words with no space around it ("God</w><note>...</note><w>created"): it becomes a
    # space, and a space it leaves before punctuation goes.
    text = _tidy(html.unescape(_TAG.sub("", _TITLE.sub(" ", _NOTE.sub(" ", osis)))))
    return _SPACE_BEFORE_PUNCTUATION.sub("", text)


def _testament_slots(module: Path, testament: str) -> Iterable[str]:
    blocks_index = (module / f"{testament}.bzs").read_bytes()
    verses_index = (module / f"{testament}.bzv").read_bytes()
    data = (module / f"{testament}.bzz").read_bytes()
    blocks = [struct.unpack_from("<III", blocks_index, offset) for offset in range(0, len(blocks_index), 12)]
    cached_number, cached = -1, b""
    for offset in range(0, len(verses_index) - len(verses_index) % 10, 10):
        block, start, size = struct.unpack_from("<IIH", verses_index, offset)
        if size == 0:
            yield ""
            continue
        if block >= len(blocks):
            raise ValueError(f"{module}/{testament}.bzv names block {block}; {testament}.bzs has {len(blocks)}")
        if block != cached_number:  # slots come in block order: one block decompressed at a time
            position, compressed, _ = blocks[block]
            cached_number, cached = block, zlib.decompress(data[position : position + compressed])
        yield cached[start : start + size].decode("utf-8")


def read_sword_ztext(module_dir: str | os.PathLike) -> list[dict]:
    r"""
    Every verse of a SWORD `zText` module (`ot.*` and `nt.*` files; a testament whose files are absent is skipped).

    A verse's book and chapter come from the last `<chapter osisID="Book.N"/>` slot before it and its number from
    its place after that slot; slots before the first chapter (prefaces) and empty slots are skipped.
    """
    module = Path(module_dir)
    verses = []
    for testament in ("ot", "nt"):
        if not (module / f"{testament}.bzv").exists():
            continue
        book, chapter, verse = None, 0, 0
        for slot in _testament_slots(module, testament):
            match = _CHAPTER.search(slot)
            if match is not None:
                book, chapter, verse = match["book"], int(match["chapter"]), 0
                continue
            if book is None:
                continue
            verse += 1
            text = osis_to_text(slot)
            if text:
                verses.append({"book": book, "chapter": chapter, "verse": verse, "text": text})
    return verses


# ---------------------------------------------------------------------------------------------------------------------
# documents


def build_bible(translation: str, cache_dir: str | os.PathLike | None = None, verses: list[dict] | None = None):
    r"""
    One document per book of the 66, in canonical order: `{"book": "Gen", "name": "Genesis", "translation": "kjv",
    "text": ...}`, the text one line per chapter, verses joined by spaces.

    Args:
        translation (`str`): `"kjv"` or `"web"`.
        cache_dir (*optional*): the [`fetch_bible_packages`] directory (fetched when needed).
        verses (`list[dict]`, *optional*): verses already read (tests); nothing is fetched then.
    """
    readers = {"kjv": lambda root: read_kjv(root), "web": lambda root: read_sword_ztext(Path(root) / WEB_MODULE)}
    if translation not in readers:
        raise ValueError(f"translation must be one of {sorted(readers)}, got {translation!r}")
    if verses is None:
        verses = readers[translation](fetch_bible_packages(cache_dir))
    chapters: dict[str, dict[int, list[str]]] = {}
    for verse in verses:
        if verse["book"] in _BOOK_NAMES:  # the WEB's deuterocanonical books have no KJV counterpart here
            chapters.setdefault(verse["book"], {}).setdefault(verse["chapter"], []).append(verse["text"])
    return [{"book": book, "name": name, "translation": translation,
             "text": "\n".join(" ".join(texts) for _, texts in sorted(chapters[book].items()))}
            for book, name in BIBLE_BOOKS if book in chapters]  # fmt: skip

"""The Bible readers on synthetic inputs: the KJV program's lines, a SWORD zText module written here, the Debian
fetcher's cache and errors (nothing is downloaded)."""

import shutil
import struct
import zlib

import pytest

from realm_hf.data import bible, debian


def test_kjv_lines_map_the_programs_abbreviations_to_osis_ids_in_order():
    lines = ["Ge1:1 In the  beginning God created the heaven and the earth.", "Ge1:2 And the earth was ...", "",
             "Exo1:1 Now these are the names", "Rev22:21 The grace of our Lord"]  # fmt: skip
    verses = bible.parse_kjv_lines(lines)
    assert [(v["book"], v["chapter"], v["verse"]) for v in verses] == [("Gen", 1, 1), ("Gen", 1, 2), ("Exod", 1, 1),
                                                                        ("Lev", 22, 21)]  # fmt: skip
    assert verses[0]["text"] == "In the beginning God created the heaven and the earth."
    with pytest.raises(ValueError, match=r"line 2 of the KJV text is not a verse \(expected 'Ge1:1 text'\)"):
        bible.parse_kjv_lines(["Ge1:1 x", "Genesis 1"])
    too_many = [f"B{'x' * index}1:1 text" for index in range(len(bible.BIBLE_BOOKS) + 1)]
    with pytest.raises(ValueError, match="a 67th book"):
        bible.parse_kjv_lines(too_many)


def test_osis_markup_becomes_plain_words():
    osis = ('<w lemma="strong:H0430">God</w><note placement="foot"><reference>1:1 </reference>The Hebrew word '
            'rendered “God” is Elohim.</note><w>created</w> the <w>heavens</w>,<note>n</note> and '
            '<title type="psalm">A Psalm</title>“Let there be light” &amp; it’s <l level="1"/>good.')  # fmt: skip
    assert bible.osis_to_text(osis) == 'God created the heavens, and "Let there be light" & it\'s good.'


def _write_ztext(directory, testament, slots, block_size=2):
    """A zText module: `slots` (OSIS strings, "" for an empty slot) stored `block_size` slots per zlib block."""
    blocks, verse_index, data = [], b"", b""
    for first in range(0, len(slots), block_size):
        raw = b""
        for slot in slots[first : first + block_size]:
            encoded = slot.encode("utf-8")
            verse_index += struct.pack("<IIH", len(blocks), len(raw), len(encoded))
            raw += encoded
        compressed = zlib.compress(raw)
        blocks.append(struct.pack("<III", len(data), len(compressed), len(raw)))
        data += compressed
    (directory / f"{testament}.bzs").write_bytes(b"".join(blocks))
    (directory / f"{testament}.bzv").write_bytes(verse_index)
    (directory / f"{testament}.bzz").write_bytes(data)


def test_sword_ztext_verses_take_book_and_chapter_from_the_chapter_slots(tmp_path):
    _write_ztext(tmp_path, "ot", ["", "<milestone/>", "<title>Preface</title> words before any chapter",
                                  '<chapter n="1" osisID="Gen.1" sID="Gen.1"/>', "<w>In</w> the beginning",
                                  "", "God said", '<chapter osisID="Gen.2"/><title>Rest</title>', "The heavens"])  # fmt: skip
    _write_ztext(tmp_path, "nt", ['<div osisID="Matt" type="book"/>', '<chapter osisID="Matt.1"/>', "The book"])
    verses = bible.read_sword_ztext(tmp_path)
    assert [(v["book"], v["chapter"], v["verse"], v["text"]) for v in verses] == [
        ("Gen", 1, 1, "In the beginning"),
        ("Gen", 1, 3, "God said"),  # the empty slot is verse 2, absent from this translation
        ("Gen", 2, 1, "The heavens"),
        ("Matt", 1, 1, "The book"),
    ]
    documents = bible.build_bible("web", verses=verses + [{"book": "Tob", "chapter": 1, "verse": 1, "text": "x"}])
    assert [(d["book"], d["name"], d["text"]) for d in documents] == [
        ("Gen", "Genesis", "In the beginning God said\nThe heavens"),  # one line per chapter
        ("Matt", "Matthew", "The book"),  # Tobit has no KJV counterpart and is left out
    ]
    with pytest.raises(ValueError, match=r"translation must be one of \['kjv', 'web'\], got 'niv'"):
        bible.build_bible("niv", verses=verses)


def test_the_fetcher_uses_an_unpacked_cache_and_explains_missing_tools(tmp_path, monkeypatch):
    wanted = ["usr/bin/bible", "usr/lib/bible.data"]
    for path in wanted:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    monkeypatch.setattr(shutil, "which", lambda tool: None)  # nothing would download
    assert debian.fetch_debian_packages(["bible-kjv", "bible-kjv-text"], wanted, tmp_path) == tmp_path
    with pytest.raises(RuntimeError, match="`apt-get download bible-kjv bible-kjv-text`, then `dpkg-deb -x`"):
        debian.fetch_debian_packages(["bible-kjv", "bible-kjv-text"], [*wanted, "usr/share/missing"], tmp_path)

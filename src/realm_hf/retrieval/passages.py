"""A user's documents as passages REALM can read: long texts split, plain-text and Markdown files read.

REALM reads blocks of 288 wordpieces (question and title included) and embeds each block once, so a document longer
than about 200 words would be cut: what follows is never embedded nor read. [`split_long_documents`] splits every
longer text into passages of at most `max_words` words, at sentence ends where it can (a sentence longer than that is
cut into even parts), each keeping its document's title and other columns plus `source_id` (the document it came
from) and `passage` (its place in it). [`read_text_files`] turns `.txt` and Markdown files into documents: one per
paragraph (blank-line separated), titled by the file's name, and for Markdown by the heading it stands under.
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import not_utf8_error

__all__ = [
    "DEFAULT_MAX_WORDS",
    "TEXT_SUFFIXES",
    "drop_empty_documents",
    "even_parts",
    "read_text_files",
    "split_long_documents",
    "split_text",
]

# 120 words is about 160 wordpieces: with a title and a question a passage fits the reader's 288.
DEFAULT_MAX_WORDS = 120
TEXT_SUFFIXES = (".txt", ".text", ".md", ".markdown")

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
# A sentence ends at . ! ? (closing quotes or brackets may follow) before a space and a capital, digit or quote.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(\s+)(?=[\"'(\[]?[A-Z0-9])")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def even_parts(words: list[str], max_words: int) -> list[str]:
    """The fewest parts of at most `max_words` words, as even in length as possible (also how the offline corpus
    splits long factbook fields, `realm_hf.data.corpora`)."""
    parts = -(-len(words) // max_words)
    bounds = [round(index * len(words) / parts) for index in range(parts + 1)]
    return [" ".join(words[start:end]) for start, end in zip(bounds[:-1], bounds[1:], strict=True)]


def _sentences(paragraph: str) -> list[str]:
    """`paragraph` cut at the spaces after sentence ends (closing quotes and brackets stay with their sentence)."""
    pieces, start = [], 0
    for end in _SENTENCE_END.finditer(paragraph):
        pieces.append(paragraph[start : end.start(1)])
        start = end.end(1)
    return [*pieces, paragraph[start:]]


def split_text(text: str, max_words: int) -> list[str]:
    r"""
    `text` in passages of at most `max_words` words: whole sentences packed in order, a longer sentence in even parts.
    A text of at most `max_words` words comes back unchanged, as the only passage.

    Example: `split_text("One two. Three four five. Six.", 4)` is `["One two.", "Three four five. Six."]`.
    """
    if max_words < 1:
        raise ValueError(f"max_words must be at least 1, received {max_words}")
    if len(text.split()) <= max_words:
        return [text]
    units = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        for sentence in _sentences(paragraph.strip()):
            words = sentence.split()
            if words:
                units.extend(even_parts(words, max_words) if len(words) > max_words else [" ".join(words)])
    passages, current, count = [], [], 0
    for unit in units:
        size = len(unit.split())
        if current and count + size > max_words:
            passages.append(" ".join(current))
            current, count = [], 0
        current.append(unit)
        count += size
    if current:
        passages.append(" ".join(current))
    return passages


def split_long_documents(store, max_words: int = DEFAULT_MAX_WORDS, cache_dir: str | os.PathLike | None = None):
    r"""
    `store` with every text longer than `max_words` words split into passages ([`split_text`]).

    Returns the same store when no text is longer. Otherwise a new `DocumentStore` in which each document becomes one
    or more consecutive blocks with its title and other columns, plus `source_id` (the document's id, or its own
    `source_id`) and `passage` (0, 1, ... within the document), so every block leads back to where it came from.

    Args:
        store (`DocumentStore`): the documents.
        max_words (`int`, *optional*, defaults to 120): the longest passage, in words.
        cache_dir (*optional*): scratch directory of the new store.
    """
    from .document_store import DocumentStore

    if max_words < 1:
        raise ValueError(f"max_words must be at least 1, received {max_words}")
    if not any(len(text.split()) > max_words for _, _, texts in store.iter_batches(10_000) for text in texts):
        return store

    def records() -> Iterator[dict[str, Any]]:
        for document in store:
            source = document.pop("source_id", document["id"])
            del document["id"]
            for index, passage in enumerate(split_text(document["text"], max_words)):
                yield {**document, "text": passage, "source_id": source, "passage": index}

    return DocumentStore.from_records(records(), cache_dir=cache_dir)


def drop_empty_documents(store, cache_dir: str | os.PathLike | None = None):
    r"""
    `store` without the documents that have neither a text nor a title (both empty or whitespace): REALM would embed
    and read an empty block, which answers nothing. A document with a title and no text is kept (its title is its
    block).

    Returns `(documents, dropped)`: the same store when nothing is dropped, else a new `DocumentStore` of the others
    (ids renumbered `0 .. n-1`, other columns kept); `dropped` lists the ids left out, in `store`'s numbering.
    """
    from .document_store import DocumentStore

    dropped = [start + offset for start, titles, texts in store.iter_batches(10_000)
               for offset, (title, text) in enumerate(zip(titles, texts, strict=True))
               if not text.strip() and not (title or "").strip()]  # fmt: skip
    if not dropped:
        return store, []
    left_out = set(dropped)

    def records() -> Iterator[dict[str, Any]]:
        for document in store:
            if document.pop("id") not in left_out:
                yield document

    return DocumentStore.from_records(records(), cache_dir=cache_dir), dropped


def _decode(path: Path, fallback_encoding: str | None) -> tuple[str, bool]:
    """A text file's text, and whether it was read with `fallback_encoding` (it is not UTF-8). A byte order mark
    (Notepad's) is dropped; one of UTF-16 (Notepad's "Unicode") reads the file as UTF-16."""
    data = path.read_bytes()
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16").removeprefix("\ufeff"), False
        except UnicodeDecodeError:
            pass  # not UTF-16 after all: read as any other file
    try:
        return data.decode("utf-8").removeprefix("\ufeff"), False
    except UnicodeDecodeError as error:
        if fallback_encoding is not None:
            try:
                return data.decode(fallback_encoding), True
            except UnicodeDecodeError:
                pass
        raise not_utf8_error(str(path), data, error.start, path=path) from None


def _paragraph_documents(path: Path, title: str, content: str) -> Iterator[dict[str, str]]:
    markdown = path.suffix.lower() in (".md", ".markdown")
    heading = None

    def document(lines: list[str]) -> dict[str, str]:
        return {"title": f"{title}: {heading}" if heading else title, "text": " ".join(lines)}

    for block in _PARAGRAPH_BREAK.split(content.replace("\r\n", "\n")):
        lines = []
        for line in block.split("\n"):
            found = _HEADING.match(line) if markdown else None
            if found:
                if lines:  # text right above the heading belongs to the previous section
                    yield document(lines)
                    lines = []
                heading = found.group(2) or heading
            elif line.strip():
                lines.append(line.strip())
        if lines:
            yield document(lines)


def read_text_files(
    paths: Sequence[str | os.PathLike], *, fallback_encoding: str | None = None,
    on_fallback: Callable[[Path], None] | None = None,
) -> list[dict[str, str]]:  # fmt: skip
    r"""
    Documents from plain-text and Markdown files, in the order given: one per paragraph (text between blank lines),
    `{"title", "text", "source"}`. The title is the file's name without its suffix (`warranty_terms.txt` ->
    "warranty terms"), followed for Markdown by the heading the paragraph stands under ("manual: Descaling"); `source`
    is the file's path. Headings themselves are not documents.

    Files are read as UTF-8 (UTF-16 where they start with its byte order mark). With `fallback_encoding` (the command
    line passes `"cp1252"`, Windows' Western European code page, which reads Latin-1 too), a file that is not UTF-8 is
    read with it instead, and `on_fallback(path)` is called so that the caller can say so.

    Raises:
        FileFormatError: a file is not UTF-8 and not `fallback_encoding` (named, with the byte offset of its first
            byte that is not UTF-8).
    """
    documents = []
    for path in map(Path, paths):
        title = re.sub(r"[_-]+", " ", path.stem).strip()
        content, fell_back = _decode(path, fallback_encoding)
        if fell_back and on_fallback is not None:
            on_fallback(path)
        documents.extend({**document, "source": str(path)} for document in _paragraph_documents(path, title, content))
    return documents

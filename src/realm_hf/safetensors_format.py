"""realm_hf's one reader of safetensors headers and its one streaming writer of ragged files.

Every safetensors file realm_hf reads by hand goes through [`read_header`]: block records
(`block_records.safetensors`), pre-tokenized corpora, index shards and the diagnosis of damaged checkpoints. The
ragged files (block records and pre-tokenized corpora) are a safetensors file with two 1-D tensors: `offsets` (int64,
`count + 1` entries from 0) and a data tensor (entry `i` is `data[offsets[i]:offsets[i + 1]]`); [`RaggedWriter`]
streams them to disk without holding the data, and [`read_ragged_header`] checks one completely.

Layout of a safetensors file: an 8-byte little-endian header length `n`, `n` bytes of JSON (`{name: {"dtype",
"shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`), then the data; offsets are relative to the
data section.
"""

import io
import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_path
from .errors import FileFormatError

# safetensors refuses headers above 100 MB; ours are a few hundred bytes.
MAX_HEADER_BYTES = 100_000_000
# Any size below 10**19 (every int64) prints in at most this many digits: header room reserved before sizes are known.
_PLACEHOLDER = 10**19 - 1
_ITEM_SIZES = {"U8": 1, "I32": 4, "I64": 8, "F16": 2, "F32": 4}
# Every safetensors dtype, for checking the headers of any file (checkpoints included).
_SAFETENSORS_ITEM_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4,
    "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip
_NUMPY_DTYPES = {"U8": np.uint8, "I32": "<i4", "I64": "<i8", "F16": "<f2", "F32": "<f4"}


def read_header(fp: io.BufferedIOBase, file_size: int, source_name: str) -> tuple[int, dict[str, Any]]:
    """Reads a safetensors header from `fp` (at offset 0) of a `file_size`-byte file: `(data start, header)`.

    Raises `ValueError` naming `source_name`, what was expected and what was found when the file is shorter than its
    header length, the header runs past the file or is not a JSON object.
    """
    if file_size < 8:
        raise FileFormatError(
            f"{source_name} is truncated: expected at least 8 bytes (header length), received {file_size}"
        )
    (header_nbytes,) = struct.unpack("<Q", fp.read(8))
    if header_nbytes > min(MAX_HEADER_BYTES, file_size - 8):
        raise FileFormatError(
            f"{source_name} is truncated or corrupt: expected a safetensors header of {header_nbytes} bytes (at most "
            f"{MAX_HEADER_BYTES}), received {file_size - 8} bytes after the header length"
        )
    try:
        header = json.loads(fp.read(header_nbytes).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FileFormatError(
            f"{source_name} is corrupt: its safetensors header is not valid JSON ({error})"
        ) from error
    if not isinstance(header, dict):
        raise FileFormatError(
            f"{source_name} is corrupt: expected a JSON object header, received {type(header).__name__}"
        )
    return 8 + header_nbytes, header


def read_file_header(path: str | os.PathLike) -> tuple[int, dict[str, Any], int]:
    """[`read_header`] of the file at `path`: `(data start, header, file size)`."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fp:
        data_start, header = read_header(fp, size, path.name)
    return data_start, header, size


def _tensor_entries(header: dict[str, Any], source_name: str) -> dict[str, dict[str, Any]]:
    """The header's tensor entries, each checked to have a known dtype, a shape of non-negative ints and
    `data_offsets` `[begin, end]` that span exactly the bytes that shape needs; `FileFormatError` otherwise."""
    entries = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not (
            isinstance(entry, dict)
            and entry.get("dtype") in _SAFETENSORS_ITEM_SIZES
            and isinstance(entry.get("shape"), list)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in entry["shape"])
            and _is_int_list(entry.get("data_offsets"), 2)
        ):
            raise FileFormatError(
                f"{source_name} is corrupt: expected tensor {key!r} to have a safetensors dtype, a "
                f"shape and data_offsets [begin, end], received {entry!r:.200}"
            )
        begin, end = entry["data_offsets"]
        if end - begin != int(np.prod(entry["shape"], dtype=np.int64)) * _SAFETENSORS_ITEM_SIZES[entry["dtype"]]:
            raise FileFormatError(
                f"{source_name} is corrupt: tensor {key!r} of shape {entry['shape']} ({entry['dtype']}) cannot span "
                f"bytes {begin}..{end}"
            )
        entries[key] = entry
    return entries


def data_end(header: dict[str, Any], source_name: str = "the file") -> int:
    """End of the data section the header describes (relative to the data start)."""
    return max((entry["data_offsets"][1] for entry in _tensor_entries(header, source_name).values()), default=0)


def check_complete(header: dict[str, Any], data_start: int, file_size: int, source_name: str) -> None:
    """Raises `FileFormatError` unless every tensor entry is well formed and the file is exactly as long as its
    header says."""
    expected_size = data_start + data_end(header, source_name)
    if file_size != expected_size:
        raise FileFormatError(
            f"{source_name} is {'truncated' if file_size < expected_size else 'corrupt'}: expected {expected_size} "
            f"bytes from its header, received {file_size}"
        )


def memmap_tensor(path: str | os.PathLike, data_start: int, entry: dict[str, Any]) -> np.ndarray:
    """The tensor described by header `entry` (checked by [`check_complete`]), memory-mapped read-only (an empty array
    when it holds no data)."""
    dtype = _NUMPY_DTYPES[entry["dtype"]]
    shape = tuple(entry["shape"])
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=data_start + entry["data_offsets"][0], shape=shape)


def _is_int_list(value: Any, length: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == length
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    )


def read_ragged_header(
    fp: io.BufferedIOBase,
    file_size: int,
    source_name: str,
    *,
    file_format: str,
    version: str,
    description: str,
    tensors: tuple[tuple[str, str, int], ...],
    count_key: str,
) -> tuple[int, dict[str, Any]]:
    """Parse and validate the header of one of realm_hf's ragged safetensors files: 1-D tensors, one of them
    `offsets` (`count + 1` int64 entries), with metadata `format`, `version` and `count_key` (the count as a string).
    Returns `(start of the data section, header dict)`.

    Args:
        file_format, version: the expected metadata `format` and `version`.
        description: the file kind, for error messages (e.g. "block records").
        tensors: `(name, safetensors dtype, item size)` of every tensor the file must hold, and no other.
        count_key: the metadata key holding the number of entries (`offsets` holds one more).
    """
    data_start, header = read_header(fp, file_size, source_name)
    metadata = header.get("__metadata__")
    if not isinstance(metadata, dict):
        metadata = {}
    if metadata.get("format") != file_format:
        raise FileFormatError(
            f"{source_name}: expected safetensors metadata format {file_format!r}, received {metadata.get('format')!r}"
        )
    if metadata.get("version") != version:
        raise FileFormatError(
            f"{source_name}: expected {description} format version {version!r}, received {metadata.get('version')!r}"
        )
    tensor_names = sorted(key for key in header if key != "__metadata__")
    expected_names = sorted(name for name, _, _ in tensors)
    if tensor_names != expected_names:
        raise FileFormatError(f"{source_name}: expected tensors {expected_names}, received {tensor_names}")

    for name, dtype, itemsize in tensors:
        info = header[name]
        if not isinstance(info, dict):
            info = {}
        shape = info.get("shape")
        span = info.get("data_offsets")
        if info.get("dtype") != dtype or not _is_int_list(shape, 1) or not _is_int_list(span, 2):
            raise FileFormatError(
                f"{source_name}: expected tensor {name!r} with dtype {dtype}, a 1-D shape and two data_offsets, "
                f"received {header[name]!r}"
            )
        if span[1] - span[0] != shape[0] * itemsize or span[0] < 0:
            raise FileFormatError(
                f"{source_name} is corrupt: tensor {name!r} of shape {shape} needs {shape[0] * itemsize} bytes, "
                f"its data_offsets {span} span {span[1] - span[0]}"
            )

    count = header["offsets"]["shape"][0] - 1
    if count < 0 or metadata.get(count_key) != str(count):
        raise FileFormatError(
            f"{source_name} is corrupt: metadata {count_key} is {metadata.get(count_key)!r}, the offsets tensor "
            f"holds {count + 1} entries (expected {count_key} + 1)"
        )
    check_complete(header, data_start, file_size, source_name)
    return data_start, header


def _ragged_header(metadata: dict[str, str], data_name: str, data_dtype: str, count: int, data_items: int) -> bytes:
    offsets_nbytes = 8 * (count + 1)
    data_nbytes = data_items * _ITEM_SIZES[data_dtype]
    header = {
        "__metadata__": metadata,
        # `offsets` first so that both tensors stay aligned (the header is padded to a multiple of 8).
        "offsets": {"dtype": "I64", "shape": [count + 1], "data_offsets": [0, offsets_nbytes]},
        data_name: {
            "dtype": data_dtype,
            "shape": [data_items],
            "data_offsets": [offsets_nbytes, offsets_nbytes + data_nbytes],
        },
    }
    return json.dumps(header, separators=(",", ":")).encode("utf-8")


class RaggedWriter:
    """Streams a ragged safetensors file of `count` entries to `path`, atomically: `offsets` (int64) then the data
    tensor `data_name` (`data_dtype`, "U8" or "I32"). Entries are appended in id order with [`RaggedWriter.write`];
    the header goes in last, into room reserved at the start, so memory holds one batch and the offsets only.

    ```python
    with RaggedWriter(path, count=len(texts), metadata={...}, data_name="data", data_dtype="U8") as writer:
        for batch in batches:
            writer.write(batch)  # a list of bytes (U8) or of int arrays (I32)
    ```

    Leaving the block with an exception, or with fewer or more than `count` entries written (a `ValueError`), leaves
    any existing file at `path` untouched.
    """

    def __init__(self, path: str | os.PathLike, *, count: int, metadata: dict[str, str], data_name: str,
                 data_dtype: str, description: str = "entries"):  # fmt: skip
        if data_dtype not in ("U8", "I32"):
            raise FileFormatError(f"ragged data is U8 (bytes) or I32 (token ids), received {data_dtype!r}")
        self.path = Path(path)
        self.count = count
        self.metadata = dict(metadata)
        self.data_name = data_name
        self.data_dtype = data_dtype
        self.description = description
        self.offsets = np.zeros(count + 1, dtype="<i8")
        self.written = 0
        reserved = len(_ragged_header(self.metadata, data_name, data_dtype, count, _PLACEHOLDER // 8))
        self._reserved = reserved + -(8 + reserved) % 8

    def __enter__(self) -> "RaggedWriter":
        self._atomic = atomic_path(self.path)
        temporary = self._atomic.__enter__()
        self._file = open(temporary, "wb")
        self._file.seek(8 + self._reserved + 8 * (self.count + 1))
        return self

    def write(self, entries: Iterable[bytes] | Iterable[np.ndarray]) -> None:
        """Appends entries: `bytes` for "U8" data, 1-D integer arrays (or lists) for "I32"."""
        entries = list(entries)
        if self.written + len(entries) > self.count:
            raise FileFormatError(f"expected {self.count} {self.description}, received more")
        if self.data_dtype == "U8":
            payload = b"".join(entries)
            lengths = np.fromiter(map(len, entries), dtype=np.int64, count=len(entries))
        else:
            arrays = [np.asarray(entry, dtype="<i4").reshape(-1) for entry in entries]
            payload = np.concatenate(arrays).tobytes() if arrays else b""
            lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        self._file.write(payload)
        window = self.offsets[self.written + 1 : self.written + 1 + len(entries)]
        np.cumsum(lengths, out=window)
        window += self.offsets[self.written]
        self.written += len(entries)

    def __exit__(self, exc_type, exc, traceback) -> bool:
        try:
            if exc_type is None:
                if self.written != self.count:
                    raise FileFormatError(f"expected {self.count} {self.description}, received {self.written}")
                header = _ragged_header(
                    self.metadata, self.data_name, self.data_dtype, self.count, int(self.offsets[-1])
                )
                self._file.seek(8 + self._reserved)
                self._file.write(memoryview(self.offsets).cast("B"))
                self._file.seek(0)
                self._file.write(struct.pack("<Q", self._reserved))
                self._file.write(header.ljust(self._reserved, b" "))
        except BaseException as error:
            self._file.close()
            self._atomic.__exit__(type(error), error, error.__traceback__)
            raise
        self._file.close()
        return bool(self._atomic.__exit__(exc_type, exc, traceback))

    @property
    def total(self) -> int:
        """Data items written so far (bytes or token ids)."""
        return int(self.offsets[self.written])


__all__ = [
    "MAX_HEADER_BYTES",
    "RaggedWriter",
    "check_complete",
    "data_end",
    "memmap_tensor",
    "read_file_header",
    "read_header",
    "read_ragged_header",
]

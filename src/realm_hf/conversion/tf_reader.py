"""Read TensorFlow checkpoints and TFRecord files without TensorFlow.

Two small, stable on-disk formats, parsed by hand:

- A **tensor bundle** (what `tf.train.Saver` / `tf.train.Checkpoint` write): `PREFIX.index` is an SSTable (LevelDB
  table format) whose keys are variable names and whose values are `BundleEntryProto` messages (dtype, shape, shard,
  offset, size, masked crc32c); the key `""` holds a `BundleHeaderProto` (number of shards, endianness). The tensors
  themselves are raw little-endian bytes in `PREFIX.data-SSSSS-of-NNNNN`.
- A **TFRecord file**: records framed as `uint64 length | uint32 masked_crc32c(length) | data |
  uint32 masked_crc32c(data)`, optionally GZIP-compressed as a whole.

Protobuf messages are decoded with a few-line wire-format parser (no `protobuf` dependency). Checksums are verified
with the `google-crc32c` or `crc32c` package when one is installed (GB/s), else with a numpy implementation that
checksums many chunks or records at once (tens of MB/s: minutes for the 6.8 GB `block_emb`; `pip install
realm_hf[tf]`, or pass `verify_checksums=False`).
"""

from __future__ import annotations

import gzip
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers.utils import logging

logger = logging.get_logger(__name__)

# ---------------------------------------------------------------------------------------------------------------------
# crc32c (Castagnoli), as TensorFlow masks it


def _python_crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _python_crc32c_table()


def _python_crc32c(data: bytes, crc: int = 0) -> int:
    return _python_register(data, crc ^ 0xFFFFFFFF) ^ 0xFFFFFFFF


def _python_register(data: bytes, register: int) -> int:
    """The CRC register after feeding `data` from `register` (no pre/post inversion), one byte at a time."""
    table = _CRC_TABLE
    for byte in data:
        register = table[(register ^ byte) & 0xFF] ^ (register >> 8)
    return register


# Without a C library, large inputs are checksummed by numpy, many independent byte streams at a time. The CRC
# register update is linear over GF(2), so (1) a message's register from a zero start ignores leading zero bytes,
# and (2) feeding n bytes from register r gives shift_n(r) ^ register_from_zero(bytes): chunks checksummed in
# parallel are combined by shifting. About 100x the byte-at-a-time speed.
_NUMPY_TABLE = np.array(_CRC_TABLE, dtype=np.uint32)
_CHUNK_BYTES = 1024
_NUMPY_BLOCK_BYTES = 16 * 2**20
_NUMPY_MIN_BYTES = 64 * 1024


def _registers_from_zero(columns: np.ndarray) -> np.ndarray:
    """`(count,)` registers after feeding every column of a `(length, count)` uint8 matrix from a zero register."""
    register = np.zeros(columns.shape[1], dtype=np.uint32)
    index = np.empty_like(register)
    looked_up = np.empty_like(register)
    for row in columns:  # register = table[(register ^ byte) & 0xFF] ^ (register >> 8), in place
        np.bitwise_xor(register, row, out=index)
        np.bitwise_and(index, 0xFF, out=index)
        np.take(_NUMPY_TABLE, index, out=looked_up)
        np.right_shift(register, 8, out=register)
        np.bitwise_xor(register, looked_up, out=register)
    return register


def _shift_tables(num_bytes: int) -> list[list[int]]:
    """Byte tables of the linear map `r -> register after feeding num_bytes zero bytes from r`."""
    basis = np.array([1 << bit for bit in range(32)], dtype=np.uint32)
    for _ in range(num_bytes):
        basis = _NUMPY_TABLE[basis & 0xFF] ^ (basis >> 8)
    bits = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool)  # (byte value, bit)
    return [np.bitwise_xor.reduce(np.where(bits, basis[8 * k : 8 * k + 8], 0), axis=1).tolist() for k in range(4)]


_CHUNK_SHIFT = _shift_tables(_CHUNK_BYTES)


def _numpy_crc32c(data: bytes, crc: int = 0) -> int:
    array = np.frombuffer(data, dtype=np.uint8)
    register = crc ^ 0xFFFFFFFF
    t0, t1, t2, t3 = _CHUNK_SHIFT
    whole = len(array) - len(array) % _CHUNK_BYTES
    for start in range(0, whole, _NUMPY_BLOCK_BYTES):
        block = array[start : min(start + _NUMPY_BLOCK_BYTES, whole)]
        chunks = np.ascontiguousarray(block.reshape(-1, _CHUNK_BYTES).T)  # (chunk byte, chunk)
        for value in _registers_from_zero(chunks).tolist():
            shifted = (
                t0[register & 0xFF] ^ t1[(register >> 8) & 0xFF] ^ t2[(register >> 16) & 0xFF] ^ t3[register >> 24]
            )
            register = shifted ^ value
    return _python_register(array[whole:].tobytes(), register) ^ 0xFFFFFFFF


_ones_shifted = [0xFFFFFFFF]  # [n]: the register after n zero bytes from 0xFFFFFFFF (the CRC-32C initial value)


def crc32c_many(buffers: list[bytes]) -> list[int]:
    """The CRC-32C of each buffer (e.g. the records of a TFRecord batch). Without a C library, buffers up to 64 KiB
    are checksummed together: each is left-padded with zeros to the longest of its group (which leaves a register
    started at zero unchanged), then the initial value, shifted by the buffer's length, is added in."""
    if _FAST_CRC32C is not None:
        return [crc32c(buffer) for buffer in buffers]
    results = [crc32c(buffer) if len(buffer) > _NUMPY_MIN_BYTES else None for buffer in buffers]
    small = [index for index, result in enumerate(results) if result is None]
    if not small:
        return results
    longest = max(len(buffers[index]) for index in small)
    while len(_ones_shifted) <= longest:
        last = _ones_shifted[-1]
        _ones_shifted.append(_CRC_TABLE[last & 0xFF] ^ (last >> 8))
    ones_shifted = np.array(_ones_shifted, dtype=np.uint32)
    group_size = max(1, _NUMPY_BLOCK_BYTES // max(longest, 1))
    for start in range(0, len(small), group_size):
        group = small[start : start + group_size]
        lengths = np.array([len(buffers[index]) for index in group], dtype=np.int64)
        width = int(lengths.max())
        rows = np.zeros((len(group), width), dtype=np.uint8)
        for row, index in zip(rows, group):
            if buffers[index]:
                row[width - len(buffers[index]) :] = np.frombuffer(buffers[index], dtype=np.uint8)
        registers = (
            _registers_from_zero(np.ascontiguousarray(rows.T)) ^ ones_shifted[lengths]
        )  # rows.T: (byte, buffer)
        for index, register in zip(group, (registers ^ 0xFFFFFFFF).tolist()):
            results[index] = register
    return results


def _fast_crc32c():
    """`extend(crc, data) -> crc` from a C implementation, or `None` when neither package is installed."""
    try:
        import google_crc32c

        if google_crc32c.implementation == "c":
            return google_crc32c.extend
    except ImportError:
        pass
    try:
        import crc32c

        return lambda crc, data: crc32c.crc32c(data, value=crc)
    except ImportError:
        return None


_FAST_CRC32C = _fast_crc32c()


def crc32c(data: bytes, crc: int = 0) -> int:
    """The CRC-32C of `data`, continuing from `crc` (the CRC of the bytes before it)."""
    if _FAST_CRC32C is not None:
        return _FAST_CRC32C(crc, data if isinstance(data, bytes) else bytes(data))
    if len(data) >= _NUMPY_MIN_BYTES:
        return _numpy_crc32c(data, crc)
    return _python_crc32c(data, crc)


def masked_crc32c(data: bytes) -> int:
    """TensorFlow's masked CRC-32C (rotated right by 15 bits plus a constant), stored in bundles and TFRecords."""
    return _mask(crc32c(data))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_warned_slow_crc = False


def _warn_if_slow_crc(nbytes: int, source: str) -> None:
    global _warned_slow_crc
    if _FAST_CRC32C is None and nbytes > 256 * 2**20 and not _warned_slow_crc:
        _warned_slow_crc = True
        logger.warning(
            f"Verifying the checksums of {source} ({nbytes / 2**20:.0f} MiB) with numpy (tens of MB/s); install "
            "google-crc32c (`pip install realm_hf[tf]`) for GB/s, or pass verify_checksums=False (--no-verify)."
        )


# ---------------------------------------------------------------------------------------------------------------------
# protobuf wire format and SSTable blocks


def _varint(data: bytes, position: int, source: str) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if position >= len(data):
            raise ValueError(f"{source} is truncated or corrupt: a varint runs past the end of its {len(data)} bytes")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise ValueError(f"{source} is corrupt: a varint is longer than 10 bytes")


def _parse_message(data: bytes, source: str) -> dict[int, list]:
    """Field number -> list of raw values (int for varints, bytes for the rest) of one protobuf message."""
    fields: dict[int, list] = {}
    position = 0
    while position < len(data):
        key, position = _varint(data, position, source)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = _varint(data, position, source)
        elif wire_type == 1:
            value, position = data[position : position + 8], position + 8
        elif wire_type == 2:
            length, position = _varint(data, position, source)
            value, position = data[position : position + length], position + length
        elif wire_type == 5:
            value, position = data[position : position + 4], position + 4
        else:
            raise ValueError(f"{source} is corrupt: expected protobuf wire type 0, 1, 2 or 5, received {wire_type}")
        if position > len(data):
            raise ValueError(f"{source} is truncated or corrupt: field {number} runs past the end of its message")
        fields.setdefault(number, []).append(value)
    return fields


_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_BYTES = 48
_BLOCK_TRAILER_BYTES = 5  # compression type (1 byte) + masked crc32c (4 bytes)


def _block(index_bytes: bytes, handle: bytes, source: str, verify: bool) -> bytes:
    offset, position = _varint(handle, 0, source)
    size, _ = _varint(handle, position, source)
    end = offset + size + _BLOCK_TRAILER_BYTES
    if end > len(index_bytes):
        raise ValueError(
            f"{source} is truncated: a table block needs bytes {offset}..{end}, the file has {len(index_bytes)}"
        )
    contents = index_bytes[offset : offset + size]
    compression = index_bytes[offset + size]
    if verify:
        (expected,) = struct.unpack("<I", index_bytes[offset + size + 1 : end])
        received = _mask(crc32c(index_bytes[offset : offset + size + 1]))
        if received != expected:
            raise ValueError(
                f"{source} is corrupt: table block at byte {offset} has crc32c {received:#010x}, expected {expected:#010x}"
            )
    if compression != 0:
        raise ValueError(
            f"{source}: expected uncompressed table blocks (type 0, what TensorFlow writes for checkpoints), received "
            f"compression type {compression}"
        )
    return contents


def _block_entries(block: bytes, source: str) -> Iterator[tuple[bytes, bytes]]:
    """`(key, value)` pairs of one SSTable block: prefix-compressed keys, then a restart array we do not need."""
    if len(block) < 4:
        raise ValueError(f"{source} is corrupt: a table block of {len(block)} bytes has no restart count")
    (num_restarts,) = struct.unpack("<I", block[-4:])
    limit = len(block) - 4 - 4 * num_restarts
    if limit < 0:
        raise ValueError(f"{source} is corrupt: a {len(block)}-byte table block declares {num_restarts} restarts")
    key, position = b"", 0
    while position < limit:
        shared, position = _varint(block, position, source)
        unshared, position = _varint(block, position, source)
        value_length, position = _varint(block, position, source)
        if shared > len(key) or position + unshared + value_length > limit:
            raise ValueError(f"{source} is corrupt: a table entry at byte {position} runs past its block")
        key = key[:shared] + block[position : position + unshared]
        position += unshared
        yield key, block[position : position + value_length]
        position += value_length


def read_sstable(path: str | os.PathLike, verify_checksums: bool = True) -> Iterator[tuple[bytes, bytes]]:
    """Every `(key, value)` of a LevelDB-format table file (a checkpoint's `.index`), in key order."""
    path = Path(path)
    data = path.read_bytes()
    source = str(path)
    if len(data) < _FOOTER_BYTES:
        raise ValueError(
            f"{source} is truncated: expected at least the {_FOOTER_BYTES}-byte table footer, received {len(data)} bytes"
        )
    (magic,) = struct.unpack("<Q", data[-8:])
    if magic != _TABLE_MAGIC:
        raise ValueError(
            f"{source} is not a TensorFlow checkpoint index: expected table magic {_TABLE_MAGIC:#x} in its last 8 "
            f"bytes, received {magic:#x} (truncated, or not a tensor-bundle .index file)"
        )
    footer = data[-_FOOTER_BYTES:]
    _, position = _varint(footer, 0, source)  # metaindex handle: offset
    _, position = _varint(footer, position, source)  # metaindex handle: size
    index_block = _block(data, footer[position:], source, verify_checksums)
    for _, handle in _block_entries(index_block, source):
        yield from _block_entries(_block(data, handle, source, verify_checksums), source)


# ---------------------------------------------------------------------------------------------------------------------
# tensor bundles

# TensorFlow DataType enum -> numpy dtype (little-endian). bfloat16 is read as its uint16 bit pattern and widened.
_DTYPES = {
    1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<i4"), 4: np.dtype("u1"), 5: np.dtype("<i2"),
    6: np.dtype("i1"), 9: np.dtype("<i8"), 10: np.dtype("?"), 14: np.dtype("<u2"), 17: np.dtype("<u2"),
    19: np.dtype("<f2"), 22: np.dtype("<u4"), 23: np.dtype("<u8"),
}  # fmt: skip
_DT_STRING = 7
_DT_BFLOAT16 = 14


@dataclass(frozen=True)
class BundleEntry:
    """Where one tensor of a checkpoint lives: `size` bytes at `offset` of data shard `shard_id`."""

    name: str
    dtype: int  # TensorFlow DataType enum value
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int | None  # masked
    sliced: bool

    @property
    def numpy_dtype(self) -> np.dtype:
        if self.dtype == _DT_STRING:
            return np.dtype(object)
        if self.dtype == _DT_BFLOAT16:
            return np.dtype("<f4")
        if self.dtype not in _DTYPES:
            raise ValueError(
                f"variable {self.name!r} has TensorFlow dtype enum {self.dtype}; expected one of "
                f"{sorted([*_DTYPES, _DT_STRING])}"
            )
        return _DTYPES[self.dtype]


def _bundle_entry(name: str, value: bytes, source: str) -> BundleEntry:
    fields = _parse_message(value, f"{source} (entry {name!r})")
    shape: tuple[int, ...] = ()
    if 2 in fields:
        shape_fields = _parse_message(fields[2][0], source)
        dims = [_parse_message(dim, source).get(1, [0])[0] for dim in shape_fields.get(2, [])]
        shape = tuple(dim - (1 << 64) if dim >= 1 << 63 else dim for dim in dims)
    checksum = struct.unpack("<I", fields[6][0])[0] if 6 in fields else None
    return BundleEntry(
        name=name, dtype=fields.get(1, [0])[0], shape=shape, shard_id=fields.get(3, [0])[0],
        offset=fields.get(4, [0])[0], size=fields.get(5, [0])[0], crc32c=checksum, sliced=7 in fields,
    )  # fmt: skip


def resolve_checkpoint_prefix(path: str | os.PathLike) -> Path:
    """The `PREFIX` of a tensor bundle from what users pass: the prefix itself (`model.ckpt-300000`,
    `variables/variables`), its `.index` or a `.data-*` file, or a directory holding a `checkpoint` state file or a
    single `.index` (a SavedModel directory works too, through its `variables/`)."""
    path = Path(path)
    if path.is_dir():
        state = path / "checkpoint"
        if state.is_file():
            match = re.search(r'^model_checkpoint_path:\s*"(.*)"', state.read_text(encoding="utf-8"), re.MULTILINE)
            if match:
                prefix = Path(match.group(1))
                return prefix if prefix.is_absolute() else path / prefix
        if (path / "variables" / "variables.index").is_file():
            return path / "variables" / "variables"
        indexes = sorted(path.glob("*.index"))
        if len(indexes) == 1:
            return indexes[0].with_suffix("")
        raise FileNotFoundError(
            f"expected a TensorFlow checkpoint in {path}: a `checkpoint` state file, variables/variables.index or "
            f"exactly one *.index file; found {len(indexes)} *.index files: {[index.name for index in indexes]}"
        )
    if path.suffix == ".index":
        return path.with_suffix("")
    match = re.fullmatch(r"(.*)\.data-\d{5}-of-\d{5}", path.name)
    if match:
        return path.with_name(match.group(1))
    return path


class TFCheckpointReader:
    r"""
    Reads the variables of a TensorFlow checkpoint (tensor-bundle format, V2) without TensorFlow: the equivalent of
    `tf.train.list_variables` and `tf.train.load_variable`.

    Args:
        checkpoint_path (`str` or `os.PathLike`):
            The checkpoint prefix (e.g. `model.ckpt-300000`, `encoded/encoded.ckpt`), its `.index` file, or a
            directory (see [`resolve_checkpoint_prefix`]).
        verify_checksums (`bool`, *optional*, defaults to `True`):
            Check every tensor's crc32c as it is read (see the module docstring for the speed).

    Example:

    ```python
    >>> reader = TFCheckpointReader("orqa_nq_model_from_realm/export/best_default/checkpoint/model.ckpt-300000")
    >>> reader.shape("reader/dense/kernel")
    (768, 512)
    >>> kernel = reader.read("reader/dense/kernel")  # np.ndarray, float32
    ```
    """

    def __init__(self, checkpoint_path: str | os.PathLike, verify_checksums: bool = True):
        self.prefix = resolve_checkpoint_prefix(checkpoint_path)
        self.verify_checksums = verify_checksums
        index = Path(f"{self.prefix}.index")
        if not index.is_file():
            siblings = (
                sorted(p.name for p in index.parent.glob(f"{self.prefix.name}*")) if index.parent.is_dir() else []
            )
            raise FileNotFoundError(
                f"expected a TensorFlow checkpoint index at {index} (a tensor bundle: PREFIX.index plus "
                f"PREFIX.data-00000-of-NNNNN); found {siblings or 'no file with that prefix'}"
            )
        self._entries: dict[str, BundleEntry] = {}
        self.num_shards = 1
        for key, value in read_sstable(index, verify_checksums):
            if key == b"":
                header = _parse_message(value, f"{index} (header)")
                self.num_shards = header.get(1, [1])[0]
                if header.get(2, [0])[0] != 0:
                    raise ValueError(f"{index}: expected a little-endian checkpoint, received a big-endian one")
                continue
            name = key.decode("utf-8")
            self._entries[name] = _bundle_entry(name, value, str(index))

    def data_file(self, shard_id: int) -> Path:
        return Path(f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}")

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, name: str) -> BundleEntry:
        if name not in self._entries:
            raise KeyError(f"{self.prefix} has no variable {name!r}; it has {len(self)}: {sorted(self._entries)[:20]}")
        return self._entries[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entry(name).shape

    def variables(self) -> dict[str, tuple[int, ...]]:
        """Variable name -> shape, sorted by name (as `tf.train.list_variables`)."""
        return {name: entry.shape for name, entry in sorted(self._entries.items())}

    def _check_entry(self, entry: BundleEntry) -> Path:
        if entry.sliced:
            raise ValueError(
                f"variable {entry.name!r} of {self.prefix} is partitioned (saved as slices); expected whole tensors. "
                "Re-save the checkpoint with unpartitioned variables."
            )
        data_file = self.data_file(entry.shard_id)
        if not data_file.is_file():
            raise FileNotFoundError(f"expected the checkpoint data file {data_file} (for {entry.name!r}), not found")
        file_size = data_file.stat().st_size
        if entry.offset + entry.size > file_size:
            raise ValueError(
                f"{data_file} is truncated: variable {entry.name!r} needs bytes {entry.offset}..{entry.offset + entry.size}, "
                f"the file has {file_size}"
            )
        if entry.dtype != _DT_STRING:
            expected = int(np.prod(entry.shape, dtype=np.int64)) * entry.numpy_dtype.itemsize
            if entry.dtype == _DT_BFLOAT16:
                expected //= 2
            if expected != entry.size:
                raise ValueError(
                    f"{self.prefix}.index is corrupt: variable {entry.name!r} of shape {entry.shape} needs {expected} "
                    f"bytes, its entry declares {entry.size}"
                )
        return data_file

    def read(self, name: str) -> np.ndarray:
        """The variable as a numpy array (a copy; bfloat16 is widened to float32, strings are an object array of
        bytes). Raises `ValueError` naming the expected and received checksum if the bytes are damaged."""
        entry = self.entry(name)
        data_file = self._check_entry(entry)
        with open(data_file, "rb") as reader:
            reader.seek(entry.offset)
            raw = reader.read(entry.size)
        if self.verify_checksums and entry.crc32c is not None:
            _warn_if_slow_crc(len(raw), f"{name!r}")
            received = masked_crc32c(raw)
            if received != entry.crc32c:
                raise ValueError(
                    f"{data_file} is corrupt: variable {name!r} has crc32c {received:#010x}, the index expects "
                    f"{entry.crc32c:#010x}"
                )
        if entry.dtype == _DT_STRING:
            return _decode_string_tensor(raw, entry, str(data_file))
        array = np.frombuffer(raw, dtype=_DTYPES[entry.dtype]).reshape(entry.shape)
        if entry.dtype == _DT_BFLOAT16:
            return (array.astype(np.uint32) << 16).view(np.float32)
        return array.copy()

    def memmap(self, name: str) -> np.ndarray:
        """The variable memory-mapped read-only, for tensors too big to read at once (e.g. `block_emb`, 6.8 GB for
        13M blocks). Not checksummed here: see [`ChecksummedRows`]."""
        entry = self.entry(name)
        data_file = self._check_entry(entry)
        if entry.dtype in (_DT_STRING, _DT_BFLOAT16):
            raise ValueError(f"variable {name!r}: expected a numeric, non-bfloat16 tensor to memory-map")
        return np.memmap(data_file, dtype=_DTYPES[entry.dtype], mode="r", offset=entry.offset, shape=entry.shape)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.prefix)!r}, num_variables={len(self)}, num_shards={self.num_shards})"


def _decode_string_tensor(raw: bytes, entry: BundleEntry, source: str) -> np.ndarray:
    # Layout: varint64 length of every element | uint32 masked crc32c of those varints | the elements' bytes.
    count = int(np.prod(entry.shape, dtype=np.int64))
    lengths, position = [], 0
    for _ in range(count):
        length, position = _varint(raw, position, source)
        lengths.append(length)
    position += 4
    values = []
    for length in lengths:
        values.append(raw[position : position + length])
        position += length
    if position != len(raw):
        raise ValueError(
            f"{source} is corrupt: string variable {entry.name!r} has {len(raw)} bytes, expected {position}"
        )
    array = np.empty(count, dtype=object)
    array[:] = values
    return array.reshape(entry.shape)


class ChecksummedRows:
    """Row slices of a memory-mapped bundle tensor that verify its crc32c as they are read front to back.

    `write_index` reads `rows[start:stop]` in order; once the last row has been read the running checksum is
    compared with the checkpoint's and a mismatch raises (before the index manifest is written, so a damaged file
    never yields a loadable index). Out-of-order reads switch verification off. `on_rows(count)` is called after
    every slice (progress bars).
    """

    def __init__(self, reader: TFCheckpointReader, name: str, on_rows=None):
        self._entry = reader.entry(name)
        self._array = reader.memmap(name)
        self._data_file = reader.data_file(self._entry.shard_id)
        self._verify = reader.verify_checksums and self._entry.crc32c is not None
        if self._verify:
            _warn_if_slow_crc(self._entry.size, f"{name!r}")
        self._crc = 0
        self._next_row = 0
        self._on_rows = on_rows
        self.shape = self._array.shape
        self.dtype = self._array.dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        rows = np.asarray(self._array[key])
        if isinstance(key, slice) and self._verify:
            start, stop, step = key.indices(self.shape[0])
            if start == self._next_row and step == 1:
                self._crc = crc32c(np.ascontiguousarray(rows).tobytes(), self._crc)
                self._next_row = stop
                if stop == self.shape[0]:
                    received = _mask(self._crc)
                    if received != self._entry.crc32c:
                        raise ValueError(
                            f"{self._data_file} is corrupt: variable {self._entry.name!r} has crc32c {received:#010x}, "
                            f"the index expects {self._entry.crc32c:#010x}"
                        )
            else:
                self._verify = False
                logger.info(f"{self._entry.name!r} read out of order; its checksum is not verified")
        if self._on_rows is not None and isinstance(key, slice):
            self._on_rows(len(rows))
        return rows


# ---------------------------------------------------------------------------------------------------------------------
# TFRecord files

_GZIP_MAGIC = b"\x1f\x8b"
_CHECK_BATCH_RECORDS = 4096
_LARGE_RECORD_BYTES = 2**20


class TFRecordFile:
    r"""
    The records of a TFRecord file (e.g. ORQA's `blocks.tfr`, `titles.tfr`), read as a stream of `bytes`.

    `len()` counts the records by walking their length headers (fast: the data is skipped, not read); iterating
    yields each record's bytes and checks the framing and both crc32c of every record (a few thousand records at a
    time, so that checking is vectorised). GZIP-compressed files are recognised by their magic bytes.

    Args:
        path (`str` or `os.PathLike`): the TFRecord file.
        verify_checksums (`bool`, *optional*, defaults to `True`): check each record's data crc32c (the length crc
            is always checked).

    Raises:
        ValueError: a record is truncated or a checksum does not match (the message names the record, its byte
            offset, and the expected and received values).
    """

    def __init__(self, path: str | os.PathLike, verify_checksums: bool = True):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"expected a TFRecord file at {self.path}, not found")
        self.verify_checksums = verify_checksums
        with open(self.path, "rb") as reader:
            self.compressed = reader.read(2) == _GZIP_MAGIC
        self._length: int | None = None

    def _open(self):
        return gzip.open(self.path, "rb") if self.compressed else open(self.path, "rb")

    def _headers(self, reader) -> Iterator[tuple[int, int, bytes, int]]:
        """`(index, byte offset, 12-byte header, data length)` of each record, the reader left at its data."""
        index, offset = 0, 0
        while True:
            header = reader.read(12)
            if not header:
                return
            if len(header) < 12:
                raise ValueError(
                    f"{self.path.name} is truncated: record {index} at byte {offset} needs a 12-byte header (uint64 "
                    f"length + crc32c), received {len(header)} bytes"
                )
            (length,) = struct.unpack("<Q", header[:8])
            if length > _LARGE_RECORD_BYTES:  # check before trusting it with a large read
                self._check_length(index, offset, header, masked_crc32c(header[:8]))
            yield index, offset, header, length
            index += 1
            offset += 16 + length

    def _check_length(self, index: int, offset: int, header: bytes, received: int) -> None:
        (expected,) = struct.unpack("<I", header[8:12])
        if received != expected:
            raise ValueError(
                f"{self.path.name} is corrupt: record {index} at byte {offset} has a length crc32c of {received:#010x}, "
                f"expected {expected:#010x} (not a TFRecord file, or damaged)"
            )

    def _raise_truncated(self, index: int, offset: int, header: bytes, received: int):
        self._check_length(index, offset, header, masked_crc32c(header[:8]))
        (length,) = struct.unpack("<Q", header[:8])
        raise ValueError(
            f"{self.path.name} is truncated: record {index} at byte {offset} declares {length} bytes of data plus a "
            f"4-byte crc32c, received {received} bytes"
        )

    def __len__(self) -> int:
        if self._length is None:
            count = 0
            with self._open() as reader:
                for index, offset, header, length in self._headers(reader):
                    skipped = self._skip(reader, length + 4)
                    if skipped < length + 4:
                        self._raise_truncated(index, offset, header, skipped)
                    count = index + 1
            self._length = count
        return self._length

    def _skip(self, reader, count: int) -> int:
        if not self.compressed:
            start = reader.tell()
            end = reader.seek(0, os.SEEK_END)
            reader.seek(min(start + count, end))
            return min(count, end - start)
        skipped = 0
        while skipped < count:
            chunk = reader.read(min(count - skipped, 1 << 20))
            if not chunk:
                break
            skipped += len(chunk)
        return skipped

    def __iter__(self) -> Iterator[bytes]:
        if self.verify_checksums:
            _warn_if_slow_crc(self.path.stat().st_size, self.path.name)
        with self._open() as reader:
            batch = []
            for index, offset, header, length in self._headers(reader):
                body = reader.read(length + 4)
                if len(body) < length + 4:
                    yield from self._checked(batch)
                    self._raise_truncated(index, offset, header, len(body))
                batch.append((index, offset, header, body))
                if len(batch) == _CHECK_BATCH_RECORDS:
                    yield from self._checked(batch)
                    batch = []
            yield from self._checked(batch)

    def _checked(self, batch: list[tuple[int, int, bytes, bytes]]) -> Iterator[bytes]:
        length_crcs = crc32c_many([header[:8] for _, _, header, _ in batch])
        data_crcs = crc32c_many([body[:-4] for *_, body in batch]) if self.verify_checksums else length_crcs
        for (index, offset, header, body), length_crc, data_crc in zip(batch, length_crcs, data_crcs):
            self._check_length(index, offset, header, _mask(length_crc))
            if self.verify_checksums:
                (expected,) = struct.unpack("<I", body[-4:])
                if _mask(data_crc) != expected:
                    raise ValueError(
                        f"{self.path.name} is corrupt: record {index} at byte {offset} has a data crc32c of "
                        f"{_mask(data_crc):#010x}, expected {expected:#010x}"
                    )
            yield body[:-4]
        batch.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"


def write_tfrecords(path: str | os.PathLike, records) -> Path:
    """Writes `records` (`bytes`) as an uncompressed TFRecord file, atomically (used by tests and for exports)."""
    from ..atomic import atomic_path

    path = Path(path)
    with atomic_path(path) as temporary, open(temporary, "wb") as writer:
        for record in records:
            length = struct.pack("<Q", len(record))
            writer.write(length + struct.pack("<I", masked_crc32c(length)) + record)
            writer.write(struct.pack("<I", masked_crc32c(record)))
    return path


__all__ = [
    "BundleEntry",
    "ChecksummedRows",
    "TFCheckpointReader",
    "TFRecordFile",
    "crc32c",
    "crc32c_many",
    "masked_crc32c",
    "read_sstable",
    "resolve_checkpoint_prefix",
    "write_tfrecords",
]

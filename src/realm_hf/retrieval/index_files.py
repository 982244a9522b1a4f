"""The on-disk block-embedding index: a JSON manifest plus safetensors shards, memory-mapped on load.

    INDEX_DIR/
      index.json                       {"format": "realm_hf.index", "version": 1, "dim": 128, "metric": "ip",
                                        "num_blocks": N, "dtype": "float32", "shard_size": S,
                                        "shards": [{"file": "embeddings-00000.safetensors", "start": 0, "count": S}, ...],
                                        ...provenance (model, corpus)...}
      embeddings-00000.safetensors     one tensor "embeddings" of shape (count, dim)

Shards hold consecutive block ids (`start .. start + count - 1`), so appending documents appends shards and never
renumbers. Every file is written to a temporary name and renamed into place, so a crash leaves either the old file
or the new one, never half of one.
"""

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file

from ..atomic import atomic_path, atomic_write_bytes
from ..errors import FileFormatError, IndexMismatchError, MissingFileError
from ..safetensors_format import check_complete, memmap_tensor, read_file_header

INDEX_FORMAT = "realm_hf.index"
INDEX_VERSION = 1
MANIFEST_NAME = "index.json"
EMBEDDINGS_KEY = "embeddings"


def shard_file_name(shard_index: int) -> str:
    return f"embeddings-{shard_index:05d}.safetensors"


def write_embedding_shard(path: Path, embeddings: np.ndarray | torch.Tensor, dtype: str = "float32") -> None:
    """Writes one `(count, dim)` shard atomically, as float32 (default) or float16 (half the size; searchers
    compute in float32)."""
    if dtype not in ("float32", "float16"):
        raise ValueError(f"an index stores float32 or float16 embeddings, got dtype={dtype!r}.")
    if isinstance(embeddings, torch.Tensor):
        embeddings = embeddings.detach().float().cpu().numpy()
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float16 if dtype == "float16" else np.float32)
    if embeddings.ndim != 2:
        raise ValueError(f"an embedding shard must be 2-D (count, dim), got shape {embeddings.shape}.")
    with atomic_path(path) as temporary:
        save_file({EMBEDDINGS_KEY: embeddings}, temporary, metadata={"format": INDEX_FORMAT})


def open_embedding_shard(path: Path) -> np.ndarray:
    """Memory-maps a shard's `(count, dim)` array read-only, checking that the file is complete."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"index shard {path} is missing")
    data_start, header, size = read_file_header(path)
    entry = header.get(EMBEDDINGS_KEY)
    if not isinstance(entry, dict) or entry.get("dtype") not in ("F32", "F16") or len(entry.get("shape", ())) != 2:
        raise FileFormatError(
            f"{path} holds no 2-D float32/float16 tensor named {EMBEDDINGS_KEY!r}: {sorted(header)}.", path=path
        )
    check_complete(header, data_start, size, str(path))
    return memmap_tensor(path, data_start, entry)


def read_manifest(directory: Path) -> dict:
    """Reads and checks `index.json`; raises `FileFormatError` naming the file and what is missing or inconsistent,
    `MissingFileError` if there is none."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise MissingFileError(f"{directory} is not a realm_hf index: {MANIFEST_NAME} is missing.")
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as error:  # also a UnicodeDecodeError
        raise FileFormatError(f"{path} is not valid JSON: {error}", path=path) from None
    if not isinstance(manifest, dict):
        raise FileFormatError(f"{path}: expected a JSON object, got {type(manifest).__name__}.", path=path)
    if manifest.get("format") != INDEX_FORMAT:
        raise FileFormatError(f"{path} has format {manifest.get('format')!r}, expected {INDEX_FORMAT!r}.", path=path)
    shards, num_blocks, dim = manifest.get("shards"), manifest.get("num_blocks"), manifest.get("dim")
    if not isinstance(shards, list) or not _is_count(num_blocks) or not _is_count(dim) or dim == 0:
        raise FileFormatError(f"{path}: expected a list of shards and integer num_blocks and dim >= 1, got shards "
                              f"{type(shards).__name__}, num_blocks {num_blocks!r}, dim {dim!r}.", path=path)  # fmt: skip
    expected_start = 0
    for shard in shards:
        if (
            not isinstance(shard, dict)
            or not isinstance(shard.get("file"), str)
            or "/" in shard["file"]
            or not all(_is_count(shard.get(key)) for key in ("start", "count"))
        ):
            raise FileFormatError(f"{path}: expected each shard as {{file, start, count}}, got {shard!r:.200}.",
                                  path=path)  # fmt: skip
        if shard["start"] != expected_start:
            raise IndexMismatchError(f"{path}: shard {shard['file']} starts at {shard['start']}, expected "
                                     f"{expected_start}.", path=path)  # fmt: skip
        expected_start += shard["count"]
    if expected_start != num_blocks:
        raise IndexMismatchError(f"{path}: shards hold {expected_start} blocks but num_blocks is {num_blocks}.",
                                 path=path)  # fmt: skip
    return manifest


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def write_manifest(directory: Path, manifest: dict) -> None:
    manifest = {"format": INDEX_FORMAT, "version": INDEX_VERSION, **manifest}
    atomic_write_bytes(Path(directory) / MANIFEST_NAME, json.dumps(manifest, indent=2).encode("utf-8"))


def open_index_shards(directory: Path) -> tuple[dict, list[np.ndarray]]:
    """The manifest and every shard of an index directory, memory-mapped, in block-id order."""
    manifest = read_manifest(directory)
    shards = []
    for shard in manifest["shards"]:
        array = open_embedding_shard(Path(directory) / shard["file"])
        if array.shape != (shard["count"], manifest["dim"]):
            raise IndexMismatchError(
                f"{Path(directory) / shard['file']} has shape {array.shape}, the manifest says ({shard['count']}, "
                f"{manifest['dim']}).",
                path=Path(directory) / shard["file"],
            )
        shards.append(array)
    return manifest, shards


__all__ = [
    "EMBEDDINGS_KEY",
    "INDEX_FORMAT",
    "MANIFEST_NAME",
    "open_embedding_shard",
    "open_index_shards",
    "read_manifest",
    "shard_file_name",
    "write_embedding_shard",
    "write_manifest",
]

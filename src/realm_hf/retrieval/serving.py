"""Serving REALM light: which searcher an index directory holds, and compressing an open-QA checkpoint for it.

[`open_searcher`] is the one place that decides how an index directory is searched:

    INDEX_DIR/
      faiss_searcher.json + index.faiss    a compressed faiss index (FaissSearcher); wins when present
      index.json + embeddings-*.safetensors  fp32 block embeddings (ExactSearcher, memory-mapped); with a faiss index
                                             beside them they are its exact re-rank source, read a few rows at a time

[`compress_open_qa`] (`realm-hf index compress`) turns a `RealmForOpenQA` checkpoint (a Hub repo id or directory with
`block_emb`, e.g. `google/realm-orqa-nq-openqa`, 7.9 GB) into a light server directory:

    OUTPUT/
      config.json, model.safetensors    the encoders without block_emb (`store_block_emb: false`), bf16 by default
      tokenizer files, block_records.safetensors   the corpus, memory-mapped on load (no pickle)
      index/                            the compressed faiss index + the fp32 shards it re-ranks from (see above)

`load_open_qa(OUTPUT)`, `pipeline("open-qa", model=OUTPUT)` and `realm-hf ask --model OUTPUT` then load it without
ever reading `block_emb`: the faiss codes are in RAM (about 24 bytes per block with the default factory) and a question
reads only its re-rank candidates' rows of the fp32 shards.
"""

import json
import math
import os
import time
from pathlib import Path

import torch
from transformers.utils import logging

from .faiss_search import INDEX_FILE_NAME, SIDECAR_NAME, FaissSearcher, import_faiss, make_faiss_index
from .index_files import MANIFEST_NAME
from .torch_search import ExactSearcher

logger = logging.get_logger(__name__)

INDEX_DIR = "index"
SERVING_FILE = "realm_hf_serving.json"
# A pool of max(5 * 100, 5 + 32) = 500 candidates per question at reader_beam_size 5: re-scoring them exactly reads 500
# fp32 rows (256 KB). At 13.35M blocks (benchmarks/load_memory.py) a pool of 100 gave recall@5 0.71 against exact
# search and 500 gave 0.98, for 0.005 -> 0.009 s of search per question on one thread.
DEFAULT_SERVING_RERANK_FACTOR = 100
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_searcher_directory(directory: str | os.PathLike) -> bool:
    """Whether `directory` holds something [`open_searcher`] opens (a faiss searcher or an fp32/fp16 index)."""
    directory = Path(directory)
    return (directory / SIDECAR_NAME).is_file() or (directory / MANIFEST_NAME).is_file()


def open_searcher(directory: str | os.PathLike, *, rerank: bool = True, **kwargs) -> ExactSearcher | FaissSearcher:
    r"""
    Opens the searcher an index directory holds: a [`FaissSearcher`] when it has `faiss_searcher.json` (a compressed
    index, re-ranked from the fp32 embeddings it recorded unless `rerank=False`), else an [`ExactSearcher`] over its
    memory-mapped shards (`index.json`).

    Args:
        directory (`str` or `os.PathLike`): an index directory (`realm-hf index build | offload | compress`).
        rerank (`bool`, defaults to `True`): for a faiss index, re-open the fp32 re-rank embeddings it recorded.
        kwargs: passed to [`ExactSearcher.from_index`] (e.g. `storage_dtype`, `device`) for an exact index.

    Raises:
        `FileNotFoundError` when the directory holds neither; `ImportError` naming the `faiss` extra when the
        directory holds a faiss index and faiss is not installed.
    """
    directory = Path(directory)
    if (directory / SIDECAR_NAME).is_file():
        if kwargs:
            raise TypeError(
                f"{directory} holds a faiss index; unexpected arguments {sorted(kwargs)} (exact index only)."
            )
        return FaissSearcher.load(directory, rerank=rerank)
    if (directory / MANIFEST_NAME).is_file():
        return ExactSearcher.from_index(directory, **kwargs)
    if not directory.is_dir():
        raise FileNotFoundError(f"index directory {directory} does not exist.")
    raise FileNotFoundError(
        f"{directory} holds no searchable index: expected {SIDECAR_NAME} + {INDEX_FILE_NAME} (a faiss index, "
        f"`realm-hf index compress`) or {MANIFEST_NAME} + shards (`realm-hf index build | offload`); found "
        f"{sorted(path.name for path in directory.iterdir())[:10]}."
    )


# Fewer blocks than this are searched exactly: faiss trains its 16 4-bit PQ centroids on at least 39 points each, and
# an exact search over so few blocks takes well under a millisecond.
MIN_BLOCKS_FOR_IVF = 1000


def default_factory(num_blocks: int, dim: int) -> str:
    """IVF with about 4 sqrt(N) lists (64 to 4096; never more than N / 39, the fewest training points per list faiss
    takes without a warning) over 4-bit fast-scan PQ codes of half a byte per 4 dims (`IVF4096,PQ32x4fs` for REALM's
    13.35M x 128: 16-byte codes + 8-byte ids per block); `Flat` (exact) below `MIN_BLOCKS_FOR_IVF` blocks."""
    if num_blocks < MIN_BLOCKS_FOR_IVF:
        return "Flat"
    nlist = int(min(4096, max(64, 2 ** round(math.log2(4 * math.sqrt(num_blocks))))))
    nlist = min(nlist, num_blocks // 39)
    subquantizers = dim // 4 if dim % 4 == 0 else dim
    return f"IVF{nlist},PQ{subquantizers}x4fs"


def _resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}.")
        return DTYPES[dtype]
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype}.")
    return dtype


def compress_open_qa(
    model_name_or_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    factory: str | None = None,
    nprobe: int | None = None,
    rerank: bool = True,
    rerank_factor: int = DEFAULT_SERVING_RERANK_FACTOR,
    dtype: torch.dtype | str = torch.bfloat16,
    train_size: int | None = None,
    shard_size: int = 262_144,
    seed: int = 0,
) -> dict:
    r"""
    Writes a light serving directory from a `RealmForOpenQA` checkpoint that stores `block_emb` (see the module
    docstring for the layout): the encoders without `block_emb` in `dtype`, the tokenizer and block records, and under
    `index/` a faiss index of the block embeddings plus (with `rerank`) their fp32 shards for an exact re-rank.

    The checkpoint is memory-mapped, so `block_emb` is streamed from disk, never copied whole into RAM. Resumable: run
    again with the same arguments after an interruption and the finished steps (fp32 shards, faiss index) are kept.

    Args:
        model_name_or_path: the source checkpoint (directory or Hub repo id), with `block_emb`.
        output_dir: the directory to write (created).
        factory (`str`, *optional*): faiss factory string; defaults to [`default_factory`] (IVF-PQ, 4-bit fast-scan).
        nprobe (`int`, *optional*): IVF lists visited per query; defaults to a quarter of the lists.
        rerank (`bool`, defaults to `True`): keep fp32 shards (as large as `block_emb`, on disk) and re-score each
            question's faiss candidates exactly from them; `False` serves the compressed scores as they are.
        rerank_factor (`int`, defaults to 100): candidates re-scored per retrieved block (at least k + 32).
        dtype (`torch.dtype` or `str`, defaults to bfloat16): the saved weights' dtype (`"float32"`, `"bfloat16"` or
            `"float16"`); bf16 halves the encoders (0.88 -> 0.44 GB for BERT-base) and runs fast on CPUs with AMX.

    Returns:
        A summary dict: `output`, `num_blocks`, `factory`, `nprobe`, `rerank`, `dtype`, `index_bytes` (faiss
        structures resident once loaded), `files` (bytes on disk per part) and timings.
    """
    from ..modeling import RealmForOpenQA, RealmTokenizer
    from .index_builder import write_index
    from .retriever import RealmRetriever

    import_faiss()  # before anything is written: a missing faiss names the extra that provides it
    weights_dtype = _resolve_dtype(dtype)
    output = Path(output_dir)
    index_dir = output / INDEX_DIR
    started = time.perf_counter()
    model = RealmForOpenQA.from_pretrained(model_name_or_path, dtype=torch.float32)
    block_emb = model.block_emb
    num_blocks, dim = int(block_emb.shape[0]), int(block_emb.shape[1])
    if num_blocks == 0:
        raise ValueError(
            f"{model_name_or_path} has no block_emb (config.store_block_emb is false): expected a RealmForOpenQA "
            "checkpoint that stores its block embeddings, e.g. google/realm-orqa-nq-openqa. For an index directory, "
            "build a faiss index with FaissSearcher.build(ExactSearcher.from_index(dir), factory).save(dir)."
        )
    try:
        retriever = RealmRetriever.from_pretrained(model_name_or_path)
    except (FileNotFoundError, OSError):
        retriever = None
    if retriever is not None and len(retriever.block_records) != num_blocks:
        raise ValueError(
            f"{model_name_or_path}: block_emb has {num_blocks} rows but the block records hold "
            f"{len(retriever.block_records)}: block ids would point at the wrong text."
        )
    factory = factory or default_factory(num_blocks, dim)
    make_faiss_index(dim, factory)  # a factory faiss cannot make is named now, not after the shards are written
    summary = {"output": str(output), "source": str(model_name_or_path), "num_blocks": num_blocks, "dim": dim,
               "factory": factory, "rerank": rerank, "dtype": str(weights_dtype).replace("torch.", "")}  # fmt: skip

    index_dir.mkdir(parents=True, exist_ok=True)
    # 1. The fp32 shards (the exact re-rank source): streamed from the memory-mapped checkpoint, one shard at a time.
    provenance = {"source": "block_emb", "model": str(model_name_or_path)}
    if rerank:
        if _index_is_complete(index_dir, num_blocks, dim, provenance):
            logger.info(f"Keeping the fp32 shards already in {index_dir}.")
        else:
            logger.info(f"Writing {num_blocks:,} x {dim} fp32 block embeddings to {index_dir} (re-rank source).")
            write_index(block_emb, index_dir, shard_size=shard_size, provenance=provenance)
        source = ExactSearcher.from_index(index_dir)
    else:
        source = ExactSearcher(block_emb)
    summary["shards_s"] = time.perf_counter() - started

    # 2. The faiss index, trained and filled from the shards (or the memory-mapped buffer).
    started = time.perf_counter()
    sidecar = _read_sidecar(index_dir)
    if sidecar is not None and sidecar.get("factory") == factory and sidecar.get("num_blocks") == num_blocks:
        logger.info(f"Keeping the faiss {factory!r} index already in {index_dir}.")
        searcher = FaissSearcher.load(index_dir, rerank=False)
    else:
        searcher = FaissSearcher.build(source, factory, train_size=train_size, seed=seed)
    if nprobe is None:
        nprobe = default_nprobe(searcher)
    if nprobe is not None:
        searcher.nprobe = nprobe
    searcher.rerank_factor = int(rerank_factor)
    searcher.rerank = source if rerank else None
    searcher.save(index_dir)
    summary.update({"nprobe": searcher.nprobe, "rerank_factor": searcher.rerank_factor,
                    "index_bytes": searcher.memory_bytes(), "faiss_s": time.perf_counter() - started})  # fmt: skip
    del searcher, source

    # 3. The model without block_emb, in the serving dtype; the tokenizer and block records next to it.
    started = time.perf_counter()
    model.register_buffer("block_emb", torch.empty(0, dim), persistent=False)
    model.config.store_block_emb = False
    model.to(weights_dtype)
    model.save_pretrained(output)
    if retriever is not None:
        retriever.save_pretrained(output)
    else:
        RealmTokenizer.from_pretrained(model_name_or_path).save_pretrained(output)
        logger.warning(f"{model_name_or_path} has no block records: add block_records.safetensors to {output}.")
    summary["model_s"] = time.perf_counter() - started
    summary["files"] = _sizes(output)
    from ..atomic import atomic_write_bytes

    atomic_write_bytes(output / SERVING_FILE, json.dumps(summary, indent=2).encode("utf-8"))
    return summary


def default_nprobe(searcher: FaissSearcher) -> int | None:
    """The IVF lists probed per query by default: a quarter of them; `None` for an index without lists."""
    return max(1, ivf_lists(searcher) // 4) if searcher.nprobe is not None else None


def ivf_lists(searcher: FaissSearcher) -> int:
    """The number of IVF lists of a faiss searcher's index; 0 when it has none (Flat, HNSW)."""
    ivf = import_faiss().try_extract_index_ivf(searcher.index)
    return int(ivf.nlist) if ivf is not None else 0


def _index_is_complete(directory: Path, num_blocks: int, dim: int, provenance: dict) -> bool:
    from .index_files import read_manifest

    try:
        manifest = read_manifest(directory)
    except (OSError, ValueError):
        return False
    if (manifest.get("num_blocks"), manifest.get("dim"), manifest.get("dtype")) != (num_blocks, dim, "float32"):
        return False
    if manifest.get("provenance") != provenance:
        return False
    return all((directory / shard["file"]).is_file() for shard in manifest["shards"])


def _read_sidecar(directory: Path) -> dict | None:
    path = directory / SIDECAR_NAME
    if not (path.is_file() and (directory / INDEX_FILE_NAME).is_file()):
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None


def _sizes(output: Path) -> dict:
    """Bytes on disk: the model weights, the block records, the faiss index and the fp32 re-rank shards."""
    sizes = {"model": 0, "block_records": 0, "faiss_index": 0, "rerank_shards": 0, "other": 0}
    for path in output.rglob("*"):
        if not path.is_file():
            continue
        size = path.stat().st_size
        if path.parent == output and path.suffix in (".safetensors", ".bin") and path.name.startswith("model"):
            sizes["model"] += size
        elif path.name.startswith("block_records"):
            sizes["block_records"] += size
        elif path.name == INDEX_FILE_NAME:
            sizes["faiss_index"] += size
        elif path.parent.name == INDEX_DIR and path.name.startswith("embeddings-"):
            sizes["rerank_shards"] += size
        else:
            sizes["other"] += size
    return sizes


__all__ = ["compress_open_qa", "default_factory", "default_nprobe", "is_searcher_directory", "open_searcher"]

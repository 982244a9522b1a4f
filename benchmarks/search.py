#!/usr/bin/env python3
"""Maximum inner-product search over REALM-sized block embeddings: the transformers 4.x way vs realm_hf's searchers.

The script

1. writes (once, reused from `--workdir`) `num_blocks x 128` float32 block embeddings to a `.npy` memory map, in
   chunks so that 13,353,718 x 128 (6.8 GB) never has to fit in RAM at once. The data imitate REALM's
   `projected_score`, a LayerNorm output: Gaussian clusters (`num_blocks / 256` of them, at most 100k, with log-normal
   sizes and random radii), each vector standardised to zero mean and unit variance, then scaled and shifted by a
   fixed per-dimension gamma and beta. Queries are perturbed copies of random blocks, passed through the same
   LayerNorm, as questions land near (not on) their evidence. `--real-embeddings PATH.npy` uses real embeddings
   instead (the run is skipped when the file is missing);
2. computes the exact top-k (`ExactSearcher`, fp32) of every query in batches: the ground truth and the `exact` row;
3. runs every method in `--methods` on the same queries, batch by batch, until all queries are done or
   `--max-seconds` have passed (at least one batch), and measures queries/s, the median latency of a batch, resident
   bytes per block, recall@5 and recall@100 against the exact top-k, and build time. Every method searches k=100;
   recall@5 is over its first 5 results. Approximate indexes pick their `nprobe` / `ef_search` on separate tuning
   queries, as the smallest value reaching `--target-recall` recall@5;
4. prints a markdown table, the memory-bandwidth and compute bounds of an exact fp32 scan on this machine, and writes
   `--json`.

Methods: `transformers4` (4.x's `RealmForOpenQA`: one question at a time, `torch.einsum("BD,QD->QB", block_emb, q)`
and `torch.topk` over the full fp32 buffer), `exact` (ExactSearcher fp32), `exact_bf16` / `exact_fp16` (a half
precision copy for the scan, exact fp32 re-rank of the candidates), `faiss_flat`, `faiss_hnsw` (HNSW32 over the first
`--hnsw-max-blocks` blocks only: building it over 13M on two cores takes hours), `faiss_ivfpq` (IVF-PQ codes in RAM,
candidates re-ranked exactly against the memory-mapped fp32 file; also timed once more with that file dropped from
the page cache).

Usage (from the repository root):

    .venv/bin/python benchmarks/search.py --num-blocks 200000                       # smoke test, ~2 minutes
    .venv/bin/python benchmarks/search.py --num-blocks 13353718 --json search.json  # REALM's size; long on 2 cores
    .venv/bin/python benchmarks/search.py --num-blocks 1000000 --methods exact faiss_ivfpq --batch-size 256
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from realm_hf.retrieval.evaluation import recall_at_k
from realm_hf.retrieval.torch_search import ExactSearcher

FULL_NUM_BLOCKS = 13_353_718
DIM = 128
DATA_FORMAT = 1  # bump when the generator changes, so that old --workdir files are rewritten
GENERATE_ROWS = 1 << 20
METHODS = ["transformers4", "exact", "exact_bf16", "exact_fp16", "faiss_flat", "faiss_hnsw", "faiss_ivfpq"]


def log(message: str) -> None:
    print(f"[search {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# data


def synthetic_parameters(num_blocks: int, seed: int) -> dict:
    rng = np.random.default_rng([seed, 0])
    num_clusters = int(min(100_000, max(16, num_blocks // 256)))
    weights = rng.lognormal(0.0, 1.0, num_clusters)  # skewed cluster sizes, as topics are in a corpus
    return {
        "centers": rng.standard_normal((num_clusters, DIM)).astype(np.float32),
        "radii": rng.uniform(0.4, 1.2, num_clusters).astype(np.float32),
        "probabilities": weights / weights.sum(),
        "gamma": rng.uniform(0.7, 1.3, DIM).astype(np.float32),
        "beta": rng.normal(0.0, 0.05, DIM).astype(np.float32),
    }


def clustered_chunks(parameters: dict, num_blocks: int, seed: int):
    """Yields `(start, points)`: the clustered, layer-normed embeddings of blocks `start..start + len(points)`, in
    chunks of `GENERATE_ROWS` (each chunk from its own generator, so the data depends only on `seed`)."""
    for chunk_index, start in enumerate(range(0, num_blocks, GENERATE_ROWS)):
        stop = min(start + GENERATE_ROWS, num_blocks)
        rng = np.random.default_rng([seed, 1, chunk_index])
        cluster = rng.choice(len(parameters["centers"]), size=stop - start, p=parameters["probabilities"])
        points = rng.standard_normal((stop - start, DIM), dtype=np.float32)
        points *= parameters["radii"][cluster, None]
        points += parameters["centers"][cluster]
        yield start, layer_norm(points, parameters["gamma"], parameters["beta"])


def layer_norm(points: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    points = points - points.mean(axis=1, keepdims=True)
    points /= np.sqrt((points * points).mean(axis=1, keepdims=True) + 1e-12)
    return points * gamma + beta


def synthetic_blocks(workdir: Path, num_blocks: int, seed: int) -> np.ndarray:
    """The clustered embeddings as a read-only memory map, generated chunk by chunk on the first call."""
    path = workdir / f"clustered-n{num_blocks}-d{DIM}-seed{seed}.npy"
    marker = path.with_suffix(".json")
    expected = {"format": DATA_FORMAT, "num_blocks": num_blocks, "dim": DIM, "seed": seed}
    if path.exists() and marker.exists() and json.loads(marker.read_text()) == expected:
        log(f"reusing {path}")
        return np.load(path, mmap_mode="r")
    workdir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    parameters = synthetic_parameters(num_blocks, seed)
    log(f"writing {num_blocks:,} x {DIM} float32 ({num_blocks * DIM * 4 / 1e9:.2f} GB, "
        f"{len(parameters['centers']):,} clusters) to {path}")  # fmt: skip
    started = time.perf_counter()
    output = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(num_blocks, DIM))
    for start, points in clustered_chunks(parameters, num_blocks, seed):
        output[start : start + len(points)] = points
    output.flush()
    del output
    marker.write_text(json.dumps(expected))
    log(f"wrote the embeddings in {time.perf_counter() - started:.0f} s")
    return np.load(path, mmap_mode="r")


def synthetic_queries(blocks: np.ndarray, num_queries: int, seed: int, noise: float) -> np.ndarray:
    """Perturbed copies of random blocks, through the same LayerNorm as the blocks."""
    parameters = synthetic_parameters(len(blocks), seed)
    rng = np.random.default_rng([seed, 2, num_queries])
    rows = np.asarray(blocks[np.sort(rng.choice(len(blocks), size=num_queries, replace=False))], dtype=np.float32)
    standardized = (rows - parameters["beta"]) / parameters["gamma"]
    perturbed = standardized + noise * rng.standard_normal(rows.shape, dtype=np.float32)
    return rng.permutation(layer_norm(perturbed, parameters["gamma"], parameters["beta"]).astype(np.float32))


def real_queries(blocks: np.ndarray, num_queries: int, seed: int, noise: float) -> np.ndarray:
    rng = np.random.default_rng([seed, 2, num_queries])
    rows = np.asarray(blocks[np.sort(rng.choice(len(blocks), size=num_queries, replace=False))], dtype=np.float32)
    scale = rows.std(axis=0, keepdims=True)
    return rng.permutation(rows + noise * scale * rng.standard_normal(rows.shape, dtype=np.float32))


# ---------------------------------------------------------------------------------------------------------------------
# machine limits


def measure_machine(batch_size: int) -> dict:
    """Read and copy bandwidth (1 GiB tensors) and the GEMM rate of the exact scan's kernel on cache-resident rows."""
    read_s, copy_s = _bandwidth_seconds(1 << 28)  # 1 GiB of float32
    queries, rows = torch.randn(batch_size, DIM), torch.randn(16_384, DIM)  # 8 MB of rows: stays in cache
    gemm_s = min(_timed(lambda: queries @ rows.T) for _ in range(20))
    return {
        "read_bandwidth_gbps": (1 << 30) / read_s / 1e9,
        "copy_bandwidth_gbps": 2 * (1 << 30) / copy_s / 1e9,  # bytes read + bytes written
        "gemm_gflops": 2 * batch_size * DIM * 16_384 / gemm_s / 1e9,
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],  # > 0 before we start: other processes share the CPUs
    }


def _bandwidth_seconds(numel: int) -> tuple[float, float]:
    """Best of 3 for reading (a sum over) and for copying `numel` float32 values."""
    source = torch.ones(numel)
    target = torch.empty_like(source)
    read_s = min(_timed(lambda: source.sum()) for _ in range(3))
    copy_s = min(_timed(lambda: target.copy_(source)) for _ in range(3))
    return read_s, copy_s


def _timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------------------------------------
# timing loop


def run_batches(search, queries: np.ndarray, batch_size: int, max_seconds: float | None) -> tuple[np.ndarray, dict]:
    """Searches `queries` batch by batch (after one single-query warm-up) until done or out of time.

    Returns the ids of the queries searched `(n, k)` and, per batch, the wall time and this process's CPU time (all
    threads). CPU time barely moves when other processes share the machine; wall time does."""
    search(queries[:1])  # warm-up: first-call allocations, and for a scan the page cache
    results, timings, started = [], {"wall": [], "cpu": []}, time.perf_counter()
    for start in range(0, len(queries), batch_size):
        batch_started, cpu_started = time.perf_counter(), time.process_time()
        results.append(np.asarray(search(queries[start : start + batch_size])))
        timings["wall"].append(time.perf_counter() - batch_started)
        timings["cpu"].append(time.process_time() - cpu_started)
        if max_seconds is not None and time.perf_counter() - started > max_seconds:
            break
    return np.concatenate(results), timings


def summarize(ids, timings, exact_ids, batch_size, num_blocks, bytes_per_block, build_s, k, **extra) -> dict:
    searched = len(ids)
    return {
        "qps": searched / sum(timings["wall"]),
        "recall_at_5": recall_at_k(ids, exact_ids[:searched], min(5, k)),
        "recall_at_100": recall_at_k(ids, exact_ids[:searched], min(100, k)),
        "bytes_per_block": bytes_per_block,
        "p50_latency_s": statistics.median(timings["wall"]),
        "p50_cpu_s": statistics.median(timings["cpu"]),  # CPU seconds of all threads per batch
        "build_s": build_s,
        "num_blocks": num_blocks,
        "batch_size": batch_size,
        "num_queries": searched,
        "k": k,
        **extra,
    }


def smallest_setting(build_searcher, values, tune_queries, tune_exact_ids, k, batch_size, target) -> tuple:
    """The smallest parameter value whose recall@5 on the tuning queries reaches `target` (else the largest)."""
    sweep = {}
    for value in values:
        search = build_searcher(value)
        ids = np.concatenate([search(tune_queries[start : start + batch_size])
                              for start in range(0, len(tune_queries), batch_size)])  # fmt: skip
        sweep[value] = recall_at_k(ids, tune_exact_ids, min(5, k))
        log(f"  tuning {value}: recall@5 {sweep[value]:.4f}")
        if sweep[value] >= target:
            return value, sweep
    return values[-1], sweep


# ---------------------------------------------------------------------------------------------------------------------
# methods


def transformers4_search(block_emb: torch.Tensor, k: int):
    """4.x `RealmForOpenQA.forward`: one question per call, a full fp32 scan and a topk over every block."""

    def search(question_projection: np.ndarray) -> np.ndarray:
        question_projection = torch.from_numpy(question_projection)
        with torch.no_grad():
            # [1, block_emb_size]
            batch_scores = torch.einsum("BD,QD->QB", block_emb, question_projection.to(block_emb.device))
            # [1, searcher_beam_size]
            _, retrieved_block_ids = torch.topk(batch_scores, k=k, dim=-1)
        return retrieved_block_ids.numpy()

    return search


def exact_search(searcher: ExactSearcher, k: int):
    return lambda batch: searcher.search(batch, k).ids.numpy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-blocks", type=int, default=FULL_NUM_BLOCKS, help="blocks (default: REALM's 13,353,718)")
    parser.add_argument("--batch-size", type=int, default=64, help="queries per search call (default: 64)")
    parser.add_argument("--num-queries", type=int, default=512, help="evaluation queries (default: 512)")
    parser.add_argument("--num-tune-queries", type=int, default=128, help="queries to tune nprobe/ef_search on")
    parser.add_argument("--k", type=int, default=100, help="results per query (default: 100)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=METHODS, metavar="METHOD",
                        help=f"any of {', '.join(METHODS)} (default: all)")  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/realm_search_bench"),
                        help="synthetic embeddings are written and reused here")  # fmt: skip
    parser.add_argument("--real-embeddings", type=Path, help="a (num_blocks, dim) float32 .npy to use instead")
    parser.add_argument(
        "--real-queries", type=Path, help="a (num_queries, dim) float32 .npy of real question embeddings"
    )
    parser.add_argument("--query-noise", type=float, default=0.5, help="query perturbation, per unit variance")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=90.0,
                        help="seconds per method after warm-up; at least one batch (default: 90)")  # fmt: skip
    parser.add_argument("--transformers4-queries", type=int, default=8,
                        help="questions timed for the 4.x way, one at a time (default: 8)")  # fmt: skip
    parser.add_argument("--hnsw-max-blocks", type=int, default=1_000_000, help="HNSW indexes the first N blocks")
    parser.add_argument("--nlist", type=int, help="IVF lists (default: 4*sqrt(num_blocks) rounded to a power of 2, "
                                                  "64 to 4096)")  # fmt: skip
    parser.add_argument("--pq-m", type=int, default=32, help="PQ sub-quantizers (default: 32)")
    parser.add_argument("--pq-bits", type=int, choices=[4, 8], default=4,
                        help="bits per sub-quantizer: 4 uses faiss's SIMD fast-scan (default), 8 plain PQ; codes take "
                             "pq_m * pq_bits / 8 bytes per block, plus 8 bytes of id")  # fmt: skip
    parser.add_argument("--rerank-factor", type=int, default=4, help="candidates per result for re-ranking")
    parser.add_argument("--target-recall", type=float, default=0.95, help="recall@5 the tuned indexes aim for")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    # ------------------------------------------------------------------------------------------------------- data
    if args.real_embeddings is not None:
        if not args.real_embeddings.exists():
            log(f"skipped: --real-embeddings {args.real_embeddings} does not exist")
            return 0
        blocks = np.load(args.real_embeddings, mmap_mode="r")
        if blocks.ndim != 2 or blocks.dtype != np.float32:
            raise SystemExit(f"--real-embeddings must be a 2-D float32 array, got {blocks.dtype} {blocks.shape}")
        data_name, data_file = "real", args.real_embeddings
    else:
        blocks = synthetic_blocks(args.workdir, args.num_blocks, args.seed)
        data_name, data_file = "synthetic clustered", Path(blocks.filename)
    num_blocks, dim = blocks.shape
    if args.real_queries is not None:
        queries = np.ascontiguousarray(np.load(args.real_queries)[: args.num_queries], dtype=np.float32)
        tune_queries = real_queries(blocks, args.num_tune_queries, args.seed + 1, args.query_noise)
    elif args.real_embeddings is not None:
        queries = real_queries(blocks, args.num_queries, args.seed, args.query_noise)
        tune_queries = real_queries(blocks, args.num_tune_queries, args.seed + 1, args.query_noise)
    else:
        queries = synthetic_queries(blocks, args.num_queries, args.seed, args.query_noise)
        tune_queries = synthetic_queries(blocks, args.num_tune_queries, args.seed + 1, args.query_noise)
    k, batch_size = args.k, args.batch_size
    log(f"{data_name} data: {num_blocks:,} x {dim}; {len(queries)} queries, batch {batch_size}, k={k}")

    machine = measure_machine(batch_size)
    scan_bytes = num_blocks * dim * 4
    bandwidth_bound_s = scan_bytes / (machine["read_bandwidth_gbps"] * 1e9)
    compute_bound_s = 2 * batch_size * num_blocks * dim / (machine["gemm_gflops"] * 1e9)
    log(f"machine: read {machine['read_bandwidth_gbps']:.1f} GB/s, copy {machine['copy_bandwidth_gbps']:.1f} GB/s, "
        f"fp32 GEMM {machine['gemm_gflops']:.0f} GFLOP/s on {machine['torch_threads']} threads")  # fmt: skip

    results: dict[str, dict] = {}

    def save_json():
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=2))

    # ---------------------------------------------------------------------------- exact: the ground truth and a row
    started = time.perf_counter()
    exact = ExactSearcher(blocks)
    build_s = time.perf_counter() - started
    log("exact (fp32): ground truth for every query")
    exact_ids, timings = run_batches(exact_search(exact, k), queries, batch_size, max_seconds=None)
    tune_exact_ids, _ = run_batches(exact_search(exact, k), tune_queries, batch_size, max_seconds=None)
    if "exact" in args.methods:
        results["exact"] = summarize(exact_ids, timings, exact_ids, batch_size, num_blocks, dim * 4, build_s, k,
                                     bandwidth_bound_s=bandwidth_bound_s, compute_bound_s=compute_bound_s,
                                     machine=machine, data=data_name,
                                     notes="fp32 scan of the memory-mapped file (page cache)")  # fmt: skip
        log(f"  {results['exact']['qps']:.2f} q/s, p50 {results['exact']['p50_latency_s']:.2f} s per batch")
        save_json()

    # ---------------------------------------------------------------------------------------------- the 4.x way
    if "transformers4" in args.methods:
        log(f"transformers4: {args.transformers4_queries} questions, one at a time")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            block_emb = torch.from_numpy(blocks)  # the full fp32 buffer (here backed by the page cache)
        count = min(args.transformers4_queries, len(queries))
        ids, timings = run_batches(transformers4_search(block_emb, k), queries[:count], 1, max_seconds=None)
        identical = float((ids == exact_ids[:count]).all(axis=1).mean())
        results["transformers4"] = summarize(ids, timings, exact_ids, 1, num_blocks, dim * 4, 0.0, k,
                                             identical_topk_fraction=identical,
                                             notes="einsum + topk per question over the full fp32 buffer")  # fmt: skip
        del block_emb
        log(f"  {results['transformers4']['qps']:.3f} q/s; top-{k} identical to exact for {identical:.0%} of queries")
        save_json()

    # ------------------------------------------------------------------------------ reduced-precision exact scans
    for method, dtype in (("exact_bf16", torch.bfloat16), ("exact_fp16", torch.float16)):
        if method not in args.methods:
            continue
        log(f"{method}: {dtype} copy for the scan, fp32 re-rank of {args.rerank_factor}x candidates")
        started = time.perf_counter()
        searcher = ExactSearcher(blocks, storage_dtype=dtype, rerank_factor=args.rerank_factor)
        build_s = time.perf_counter() - started
        ids, timings = run_batches(exact_search(searcher, k), queries, batch_size, args.max_seconds)
        results[method] = summarize(ids, timings, exact_ids, batch_size, num_blocks,
                                    searcher.memory_bytes() / num_blocks, build_s, k, rerank_factor=args.rerank_factor,
                                    notes="half-precision copy in RAM; fp32 rows read from the memory map "
                                          "for the candidates only")  # fmt: skip
        del searcher
        gc.collect()
        save_json()

    faiss_methods = [method for method in args.methods if method.startswith("faiss_")]
    if faiss_methods:
        from realm_hf.retrieval.faiss_search import FaissSearcher, import_faiss

        faiss = import_faiss()
        log(f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} OpenMP threads")

    def faiss_ids(searcher):
        return lambda batch: searcher.search(batch, k).ids.numpy()

    # -------------------------------------------------------------------------------------------------- IVF-PQ
    ivfpq = None
    if "faiss_ivfpq" in args.methods:
        nlist = args.nlist or int(min(4096, max(64, 2 ** round(math.log2(4 * math.sqrt(num_blocks))))))
        factory = f"IVF{nlist},PQ{args.pq_m}x4fs" if args.pq_bits == 4 else f"IVF{nlist},PQ{args.pq_m}"
        log(f"faiss_ivfpq: {factory}, exact fp32 re-rank from the memory map")
        started = time.perf_counter()
        ivfpq = FaissSearcher.build(exact, factory, train_size=min(num_blocks, 64 * nlist), seed=args.seed,
                                    rerank=True, rerank_factor=args.rerank_factor)  # fmt: skip
        build_s = time.perf_counter() - started
        log(f"  built in {build_s:.0f} s")

        def with_nprobe(value):
            ivfpq.nprobe = value
            return faiss_ids(ivfpq)

        nprobes = [value for value in (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if value <= nlist]
        nprobe, sweep = smallest_setting(with_nprobe, nprobes, tune_queries, tune_exact_ids, k,
                                         batch_size, args.target_recall)  # fmt: skip
        ivfpq.nprobe = nprobe
        ids, timings = run_batches(faiss_ids(ivfpq), queries, batch_size, args.max_seconds)
        bytes_per_block = ivfpq.memory_bytes() / num_blocks  # the fp32 memory map is not counted: see notes
        notes = (f"PQ codes + ids + centroids in RAM; the re-rank reads {args.rerank_factor * k} fp32 rows per query "
                 "from the memory-mapped file")  # fmt: skip
        results["faiss_ivfpq"] = summarize(ids, timings, exact_ids, batch_size, num_blocks, bytes_per_block, build_s,
                                           k, factory=factory, nprobe=nprobe, rerank_factor=args.rerank_factor,
                                           tuning_recall_at_5=sweep, notes=notes)  # fmt: skip
        save_json()

    # ---------------------------------------------------------------------------------------------------- HNSW
    if "faiss_hnsw" in args.methods:
        subset = min(num_blocks, args.hnsw_max_blocks)
        log(f"faiss_hnsw: HNSW32,Flat over the first {subset:,} blocks")
        subset_exact = ExactSearcher(blocks[:subset])
        subset_ids, _ = run_batches(exact_search(subset_exact, k), queries, batch_size, max_seconds=None)
        subset_tune_ids, _ = run_batches(exact_search(subset_exact, k), tune_queries, batch_size, max_seconds=None)
        started = time.perf_counter()
        hnsw = FaissSearcher.build(subset_exact, "HNSW32,Flat")
        build_s = time.perf_counter() - started
        log(f"  built in {build_s:.0f} s")

        def with_ef_search(value):
            hnsw.ef_search = value
            return faiss_ids(hnsw)

        ef_search, sweep = smallest_setting(with_ef_search, [64, 128, 256, 512, 1024], tune_queries, subset_tune_ids,
                                            k, batch_size, args.target_recall)  # fmt: skip
        hnsw.ef_search = ef_search
        ids, timings = run_batches(faiss_ids(hnsw), queries, batch_size, args.max_seconds)
        results["faiss_hnsw"] = summarize(ids, timings, subset_ids, batch_size, subset,
                                          hnsw.memory_bytes() / subset, build_s, k, ef_search=ef_search,
                                          tuning_recall_at_5=sweep,
                                          notes=f"first {subset:,} blocks only; recall against exact search over "
                                                "the same blocks")  # fmt: skip
        del hnsw, subset_exact
        gc.collect()
        save_json()

    # ---------------------------------------------------------------------------------------------------- Flat
    if "faiss_flat" in args.methods:
        log("faiss_flat: IndexFlatIP (a full fp32 copy inside faiss)")
        started = time.perf_counter()
        flat = FaissSearcher.build(exact, "Flat")
        build_s = time.perf_counter() - started
        ids, timings = run_batches(faiss_ids(flat), queries, batch_size, args.max_seconds)
        results["faiss_flat"] = summarize(ids, timings, exact_ids, batch_size, num_blocks,
                                          flat.memory_bytes() / num_blocks, build_s, k)  # fmt: skip
        del flat
        gc.collect()
        save_json()

    # -------------------------------------------------------- IVF-PQ again, with the fp32 file out of the page cache
    if ivfpq is not None and hasattr(os, "posix_fadvise"):
        ivfpq.rerank = None
        del exact
        blocks = None
        gc.collect()
        with open(data_file, "rb") as reader:
            os.posix_fadvise(reader.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        ivfpq.rerank = ExactSearcher(np.load(data_file, mmap_mode="r"))
        ids, timings = run_batches(faiss_ids(ivfpq), queries, batch_size, args.max_seconds)
        results["faiss_ivfpq"]["qps_cold_cache"] = len(ids) / sum(timings["wall"])
        results["faiss_ivfpq"]["p50_latency_s_cold_cache"] = statistics.median(timings["wall"])
        log(f"  faiss_ivfpq with a cold page cache: {results['faiss_ivfpq']['qps_cold_cache']:.1f} q/s")
        save_json()

    # Other processes can steal the CPU during the first measurement; keep the faster of two, at the start and the end.
    machine_end = measure_machine(batch_size)
    for key in ("read_bandwidth_gbps", "copy_bandwidth_gbps", "gemm_gflops"):
        machine[key] = max(machine[key], machine_end[key])
    machine["load_average_1min_end"] = machine_end["load_average_1min"]
    bandwidth_bound_s = scan_bytes / (machine["read_bandwidth_gbps"] * 1e9)
    compute_bound_s = 2 * batch_size * num_blocks * dim / (machine["gemm_gflops"] * 1e9)
    if "exact" in results:
        results["exact"].update(bandwidth_bound_s=bandwidth_bound_s, compute_bound_s=compute_bound_s, machine=machine)

    # ---------------------------------------------------------------------------------------------------- report
    print(render_report(results, num_blocks, data_name, data_file, machine, bandwidth_bound_s, compute_bound_s,
                        batch_size, k))  # fmt: skip
    save_json()
    return 0


def render_report(results, num_blocks, data_name, data_file, machine, bandwidth_bound_s, compute_bound_s, batch_size,
                  k) -> str:  # fmt: skip
    baseline = results.get("transformers4", {}).get("qps")
    lines = [
        f"MIPS over {num_blocks:,} x {DIM} float32 block embeddings ({data_name}, {data_file}); k={k}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({machine['torch_threads']} threads); 1-min load average {machine['load_average_1min']:.1f} at the "
        f"start, {machine.get('load_average_1min_end', float('nan')):.1f} at the end",
        "",
        "| method | blocks | batch | queries/s | vs 4.x | p50 s/batch | p50 CPU s/batch | bytes/block in RAM "
        "| recall@5 | recall@100 | build s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, row in results.items():
        speedup = f"{row['qps'] / baseline:.1f}x" if baseline else "n/a"
        lines.append(
            f"| {method} | {row['num_blocks']:,} | {row['batch_size']} | {row['qps']:.2f} | {speedup} | "
            f"{row['p50_latency_s']:.3f} | {row['p50_cpu_s']:.3f} | {row['bytes_per_block']:.1f} | "
            f"{row['recall_at_5']:.4f} | {row['recall_at_100']:.4f} | {row['build_s']:.1f} |"
        )
    lines.append("")
    lines.append(
        f"Exact fp32 scan of {num_blocks * DIM * 4 / 1e9:.2f} GB per batch of {batch_size}: memory-bandwidth bound "
        f"{bandwidth_bound_s:.3f} s at {machine['read_bandwidth_gbps']:.1f} GB/s read (copy: "
        f"{machine['copy_bandwidth_gbps']:.1f} GB/s read+write); compute bound {compute_bound_s:.3f} s at "
        f"{machine['gemm_gflops']:.0f} GFLOP/s fp32 GEMM."
    )
    if "exact" in results:
        measured = results["exact"]["p50_latency_s"]
        lines.append(
            f"`exact` takes {measured:.3f} s per batch: {bandwidth_bound_s / measured:.0%} of the bandwidth bound's "
            f"speed, {max(bandwidth_bound_s, compute_bound_s) / measured:.0%} of the tighter of the two bounds."
        )
    for method, row in results.items():
        notes = [row["notes"]] if row.get("notes") else []
        for key in ("identical_topk_fraction", "nprobe", "ef_search", "factory", "qps_cold_cache"):
            if key in row:
                notes.append(f"{key}={row[key]:.2f}" if isinstance(row[key], float) else f"{key}={row[key]}")
        if notes:
            lines.append(f"- {method}: " + "; ".join(notes))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

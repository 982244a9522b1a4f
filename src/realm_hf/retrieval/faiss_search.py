"""Approximate maximum inner-product search with faiss (Flat, HNSW, IVF-PQ/SQ), optionally re-ranked exactly in fp32.

faiss is an optional dependency (`pip install 'realm_hf[faiss]'`), imported only when a `FaissSearcher` is built or
loaded. A saved searcher is a directory:

    SEARCHER_DIR/
      index.faiss            faiss.write_index (faiss's own binary format; no pickle)
      faiss_searcher.json    {"format": "realm_hf.faiss_searcher", "factory": ..., "metric": ..., "nprobe": ...,
                              "rerank_index": path of the fp32 index directory used for re-ranking, or null}
      rerank_embeddings/     only when the re-rank embeddings were in memory: an index directory (see index_files)

Shape legend: Q - queries, D - embedding dim, K' - candidates fetched from faiss before exact re-ranking.
"""

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
from transformers.utils import logging

from ..atomic import atomic_path, atomic_write_bytes
from .index_files import read_manifest
from .interfaces import SearchResult, as_query_matrix
from .torch_search import DEFAULT_RERANK_FACTOR, ExactSearcher, rerank_pool_size

logger = logging.get_logger(__name__)

SEARCHER_FORMAT = "realm_hf.faiss_searcher"
SEARCHER_VERSION = 1
INDEX_FILE_NAME = "index.faiss"
SIDECAR_NAME = "faiss_searcher.json"
RERANK_DIRECTORY_NAME = "rerank_embeddings"
# faiss k-means wants at least 39 training points per centroid and gains little beyond 256.
TRAIN_POINTS_PER_CENTROID = 64
DEFAULT_TRAIN_SIZE = 65_536


def import_faiss():
    """Imports faiss, or raises an `ImportError` that names the pip extra providing it."""
    try:
        import faiss
    except ImportError as error:
        raise ImportError(
            "FaissSearcher needs faiss, which is not installed. Install it with `pip install 'realm_hf[faiss]'` "
            "(faiss-cpu), or install faiss-gpu yourself."
        ) from error
    return faiss


def _faiss_metric(faiss, metric: str) -> int:
    if metric == "ip":
        return faiss.METRIC_INNER_PRODUCT
    if metric == "l2":
        return faiss.METRIC_L2
    raise ValueError(f"metric must be 'ip' or 'l2', got {metric!r}.")


def make_faiss_index(dim: int, factory: str, metric: str = "ip"):
    """`faiss.index_factory(dim, factory, metric)`, with a `ValueError` naming the factory string where faiss cannot
    make it (faiss's own error is a C++ message with its source file and line)."""
    faiss = import_faiss()
    try:
        return faiss.index_factory(dim, factory, _faiss_metric(faiss, metric))
    except RuntimeError as error:
        # faiss says "Error in <C++ signature> at <file>:<line>: <reason>": the reason alone
        reason = (
            str(error).strip().splitlines()[-1].rsplit(": ", 1)[-1] if str(error).strip() else type(error).__name__
        )
        raise ValueError(f"factory {factory!r}: faiss cannot make an index of it for {dim}-d vectors ({reason}); "
                         "expected a faiss index_factory string such as 'Flat', 'HNSW32,Flat' or "
                         "'IVF4096,PQ64x8'") from None  # fmt: skip


def _as_exact_searcher(embeddings, metric: str, dim: int | None = None) -> ExactSearcher:
    """Wraps arrays, tensors, a list of chunks or an index directory as an `ExactSearcher` (no copy)."""
    if isinstance(embeddings, ExactSearcher):
        if embeddings.metric != metric:
            raise ValueError(f"the embeddings' searcher uses metric {embeddings.metric!r}, expected {metric!r}.")
        return embeddings
    if isinstance(embeddings, (str, os.PathLike)):
        return ExactSearcher.from_index(embeddings, metric=metric)
    return ExactSearcher(embeddings, dim=dim, metric=metric)


class FaissSearcher:
    r"""
    A faiss index behind the `Searcher` protocol, with optional exact fp32 re-ranking of its candidates.

    With re-ranking, a search asks faiss for `max(k * rerank_factor, k + 32)` candidates, re-scores them against the
    original fp32 embeddings (usually a memory-mapped index directory: only the candidates' rows are read) and
    returns their exact top `k`. This is how a compressed index (IVF-PQ: ~24 bytes per block resident) reaches high
    recall: the compressed codes only have to get the true neighbours into the candidate pool.

    Build one with [`~FaissSearcher.build`], or wrap an existing faiss index.

    Args:
        index (`faiss.Index`): a trained faiss index whose metric matches `metric`.
        metric (`str`, defaults to `"ip"`): `"ip"` or `"l2"`; with `"l2"` scores are negative squared distances.
        factory (`str`, *optional*): the faiss factory string the index was built from (recorded by `save`).
        rerank (`ExactSearcher`, *optional*): the fp32 embeddings to re-score candidates with; must hold as many
            blocks as the index.
        rerank_factor (`int`, defaults to 4): candidate pool multiplier when re-ranking.
    """

    def __init__(
        self,
        index,
        *,
        metric: str = "ip",
        factory: str | None = None,
        rerank: ExactSearcher | None = None,
        rerank_factor: int = DEFAULT_RERANK_FACTOR,
    ):
        faiss = import_faiss()
        if index.metric_type != _faiss_metric(faiss, metric):
            raise ValueError(
                f"the faiss index uses metric_type {index.metric_type}, expected {_faiss_metric(faiss, metric)} for "
                f"metric={metric!r}."
            )
        if rerank is not None:
            if rerank.dim != index.d:
                raise ValueError(f"re-rank embeddings must have dim {index.d} like the index, got {rerank.dim}.")
            if rerank.num_blocks != index.ntotal:
                raise ValueError(
                    f"re-rank embeddings must hold one row per indexed block: expected {index.ntotal}, got "
                    f"{rerank.num_blocks}."
                )
            if rerank.metric != metric:
                raise ValueError(f"re-rank embeddings use metric {rerank.metric!r}, expected {metric!r}.")
        if rerank_factor < 1:
            raise ValueError(f"rerank_factor must be >= 1, got {rerank_factor}.")
        self.index = index
        self.dim = int(index.d)
        self.metric = metric
        self.factory = factory
        self.rerank = rerank
        self.rerank_factor = int(rerank_factor)

    # ----------------------------------------------------------------------------------------------- construction

    @classmethod
    def build(
        cls,
        embeddings,
        factory: str = "Flat",
        *,
        metric: str = "ip",
        train_size: int | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rerank: bool | ExactSearcher | str | os.PathLike | None = None,
        rerank_factor: int = DEFAULT_RERANK_FACTOR,
        add_batch_size: int = 65_536,
        seed: int = 0,
    ) -> "FaissSearcher":
        r"""
        Builds a faiss index from a factory string: trains it on a seeded random sample, then adds every block in
        batches (logging progress).

        Args:
            embeddings: the block embeddings: a `(num_blocks, dim)` tensor or array, a list of such chunks (e.g.
                memory-mapped shards), an [`ExactSearcher`], or the path of an index directory.
            factory (`str`, defaults to `"Flat"`): a faiss `index_factory` string, e.g. `"Flat"`, `"HNSW32,Flat"`,
                `"IVF4096,PQ16"`, `"IVF4096,SQ8"`.
            metric (`str`, defaults to `"ip"`): `"ip"` (maximum inner product) or `"l2"`.
            train_size (`int`, *optional*): training sample size; defaults to 64 points per IVF list (at least
                65536), capped at `num_blocks`.
            nprobe (`int`, *optional*): IVF lists visited per query.
            ef_search (`int`, *optional*): HNSW search beam (for an HNSW index or an HNSW coarse quantizer).
            rerank (`bool`, `ExactSearcher`, `str` or `PathLike`, *optional*): exact fp32 re-ranking. `True` re-ranks
                against `embeddings` themselves (referenced, not copied); a searcher or an index-directory path
                gives the fp32 source explicitly. `None`/`False`: faiss's scores as they are.
            rerank_factor (`int`, defaults to 4): candidate pool multiplier when re-ranking.
            add_batch_size (`int`, defaults to 65536): rows per `index.add` call.
            seed (`int`, defaults to 0): seed of the training sample.
        """
        faiss = import_faiss()
        source = _as_exact_searcher(embeddings, metric)
        num_blocks, dim = source.num_blocks, source.dim
        index = make_faiss_index(dim, factory, metric)
        started = time.perf_counter()
        if not index.is_trained:
            if train_size is None:
                ivf = faiss.try_extract_index_ivf(index)
                nlist = ivf.nlist if ivf is not None else 0
                train_size = max(DEFAULT_TRAIN_SIZE, TRAIN_POINTS_PER_CENTROID * nlist)
            train_size = min(int(train_size), num_blocks)
            if train_size < 1:
                raise ValueError(f"index {factory!r} needs training, but there are {num_blocks} blocks to train on.")
            rng = np.random.default_rng(seed)
            sample_ids = np.sort(rng.choice(num_blocks, size=train_size, replace=False))
            logger.info(f"Training faiss {factory!r} on {train_size:,} of {num_blocks:,} blocks.")
            index.train(np.ascontiguousarray(source.embeddings(sample_ids).cpu().numpy()))
            logger.info(f"Trained in {time.perf_counter() - started:.1f}s.")
        searcher = cls(index, metric=metric, factory=factory, rerank_factor=rerank_factor)
        searcher._add_batches(source.iter_embeddings(add_batch_size), num_blocks)
        if nprobe is not None:
            searcher.nprobe = nprobe
        if ef_search is not None:
            searcher.ef_search = ef_search
        if rerank is True:
            searcher.rerank = source
        elif rerank is not None and rerank is not False:
            searcher.rerank = _as_exact_searcher(rerank, metric)
            if searcher.rerank.num_blocks != index.ntotal or searcher.rerank.dim != dim:
                raise ValueError(
                    f"re-rank embeddings must be ({index.ntotal}, {dim}) like the index, got "
                    f"({searcher.rerank.num_blocks}, {searcher.rerank.dim})."
                )
        logger.info(f"Built faiss {factory!r} over {num_blocks:,} blocks in {time.perf_counter() - started:.1f}s.")
        return searcher

    def _add_batches(self, batches, total: int) -> None:
        started, added, next_report = time.perf_counter(), 0, 0.1
        for batch in batches:
            # Adding in large batches lets faiss parallelise the coarse assignment and encoding.
            self.index.add(batch)
            added += len(batch)
            if total and added / total >= next_report:
                elapsed = time.perf_counter() - started
                logger.info(f"Added {added:,}/{total:,} blocks to faiss ({elapsed:.0f}s).")
                next_report = math.floor(added / total * 10 + 1) / 10

    def add(self, embeddings: torch.Tensor | np.ndarray) -> None:
        """Appends `(n, dim)` embeddings with ids `num_blocks ..`; also to the re-rank embeddings, if any."""
        if not self.index.is_trained:
            raise ValueError("the faiss index is not trained; build it with FaissSearcher.build() first.")
        chunk = ExactSearcher(embeddings, dim=self.dim, metric=self.metric)
        self._add_batches(chunk.iter_embeddings(), chunk.num_blocks)
        if self.rerank is not None:
            self.rerank.add(embeddings)

    # ------------------------------------------------------------------------------------------------- parameters

    @property
    def num_blocks(self) -> int:
        return int(self.index.ntotal)

    @property
    def nprobe(self) -> int | None:
        """IVF lists visited per query (`None` for an index without inverted lists)."""
        ivf = import_faiss().try_extract_index_ivf(self.index)
        return None if ivf is None else int(ivf.nprobe)

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        ivf = import_faiss().try_extract_index_ivf(self.index)
        if ivf is None:
            raise ValueError(
                f"nprobe applies to IVF indexes; this one is {self.factory or type(self.index).__name__}."
            )
        if value < 1:
            raise ValueError(f"nprobe must be >= 1, got {value}.")
        ivf.nprobe = int(value)

    def _hnsw(self):
        """The HNSW graph of an HNSW index or of an IVF index's HNSW coarse quantizer, else None."""
        faiss = import_faiss()
        index = faiss.downcast_index(self.index)
        if isinstance(index, faiss.IndexPreTransform):
            index = faiss.downcast_index(index.index)
        if isinstance(index, faiss.IndexHNSW):
            return index.hnsw
        ivf = faiss.try_extract_index_ivf(self.index)
        if ivf is not None:
            quantizer = faiss.downcast_index(ivf.quantizer)
            if isinstance(quantizer, faiss.IndexHNSW):
                return quantizer.hnsw
        return None

    @property
    def ef_search(self) -> int | None:
        """HNSW search beam (`None` when the index has no HNSW graph)."""
        hnsw = self._hnsw()
        return None if hnsw is None else int(hnsw.efSearch)

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        hnsw = self._hnsw()
        if hnsw is None:
            raise ValueError(
                f"ef_search applies to HNSW indexes; this one is {self.factory or type(self.index).__name__}."
            )
        if value < 1:
            raise ValueError(f"ef_search must be >= 1, got {value}.")
        hnsw.efSearch = int(value)

    def embeddings(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        r"""
        The vectors of some blocks (any id shape, e.g. the `(B, K)` ids of a search): exact fp32 from the re-rank
        embeddings when there are some, else faiss's reconstruction (lossy for PQ/SQ codes; an IVF index first
        builds its id -> list map, 8 bytes per block).

        Returns:
            `torch.FloatTensor` of shape `(*ids.shape, dim)` on the CPU.
        """
        if self.rerank is not None:
            return self.rerank.embeddings(ids).cpu()
        ids = torch.as_tensor(ids).detach().to("cpu", torch.long)
        flat = ids.reshape(-1).numpy()
        if flat.size and (flat.min() < 0 or flat.max() >= self.num_blocks):
            raise ValueError(
                f"block ids must lie in [0, {self.num_blocks}), got ids from {flat.min()} to {flat.max()}."
            )
        ivf = import_faiss().try_extract_index_ivf(self.index)
        if ivf is not None and ivf.direct_map.type == 0:  # DirectMap.NoMap
            ivf.make_direct_map()
        rows = self.index.reconstruct_batch(np.ascontiguousarray(flat))  # (n, D)
        return torch.from_numpy(rows).float().view(*ids.shape, self.dim)

    def memory_bytes(self) -> int:
        """
        Estimated resident bytes of the faiss index (codes, ids, graph links, centroids, codebooks), plus any
        in-memory re-rank embeddings. Memory-mapped re-rank embeddings count zero: a search reads only its
        candidates' rows through the page cache.
        """
        total = _index_bytes(import_faiss(), self.index)
        if self.rerank is not None:
            for chunk in self.rerank.chunks:
                if not isinstance(chunk, np.memmap):
                    total += chunk.nbytes if isinstance(chunk, np.ndarray) else chunk.numel() * chunk.element_size()
            total += self.rerank.memory_bytes()
        return total

    # ----------------------------------------------------------------------------------------------------- search

    @torch.no_grad()
    def search(self, query_embeddings: torch.Tensor | np.ndarray, k: int) -> SearchResult:
        r"""
        The `k` best blocks per query, best first.

        Args:
            query_embeddings (`torch.Tensor` or `np.ndarray` of shape `(num_queries, dim)` or `(dim,)`): the queries.
            k (`int`): blocks per query; missing results have id -1 and score -inf.

        Returns:
            [`SearchResult`]: `(num_queries, k)` float32 scores and int64 ids on the CPU. Without re-ranking the
            scores are faiss's (approximate for compressed indexes) and equal scores come in faiss's order; with it
            they are exact fp32 scores and equal scores put the lower id first, as in [`ExactSearcher`].
        """
        if k < 1:
            raise ValueError(f"k must be a positive number of blocks, got {k}.")
        queries = as_query_matrix(query_embeddings, self.dim).detach().to("cpu", torch.float32).contiguous()  # (Q, D)
        num_fetched = rerank_pool_size(k, self.rerank_factor) if self.rerank is not None else k
        distances, ids = self.index.search(queries.numpy(), num_fetched)  # (Q, K'), (Q, K')
        ids = torch.from_numpy(ids).long()
        if self.rerank is not None:
            return self.rerank.rescore(queries, ids, k)
        scores = torch.from_numpy(distances).float()
        if self.metric == "l2":
            scores = scores.neg()  # faiss returns squared distances; our scores grow with similarity
        scores[ids < 0] = -math.inf  # faiss pads with -FLT_MAX or +FLT_MAX depending on the metric
        return SearchResult(scores, ids)

    # -------------------------------------------------------------------------------------------------- save/load

    def save(self, directory: str | Path) -> None:
        r"""
        Writes `index.faiss` and `faiss_searcher.json` atomically (temporary file + rename each). Re-rank
        embeddings loaded from an index directory are referenced by path; in-memory ones are saved to
        `rerank_embeddings/`.
        """
        faiss = import_faiss()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        rerank_index = None
        if self.rerank is not None:
            on_disk = self.rerank.index_directory
            if on_disk is not None and read_manifest(on_disk)["num_blocks"] != self.rerank.num_blocks:
                on_disk = None  # blocks were added in memory since it was loaded: save them all with the index
            if on_disk is not None:
                rerank_path = Path(os.path.abspath(on_disk))
                try:
                    rerank_index = str(rerank_path.relative_to(Path(os.path.abspath(directory))))
                except ValueError:
                    rerank_index = str(rerank_path)
            else:
                self.rerank.save(directory / RERANK_DIRECTORY_NAME)
                rerank_index = RERANK_DIRECTORY_NAME
        with atomic_path(directory / INDEX_FILE_NAME) as temporary:
            faiss.write_index(self.index, temporary)
        sidecar = {
            "format": SEARCHER_FORMAT,
            "version": SEARCHER_VERSION,
            "factory": self.factory,
            "metric": self.metric,
            "dim": self.dim,
            "num_blocks": self.num_blocks,
            "nprobe": self.nprobe,
            "ef_search": self.ef_search,
            "rerank_factor": self.rerank_factor,
            "rerank_index": rerank_index,
            "faiss_version": faiss.__version__,
        }
        atomic_write_bytes(directory / SIDECAR_NAME, json.dumps(sidecar, indent=2).encode("utf-8"))
        logger.info(f"Saved faiss {self.factory!r} ({self.num_blocks:,} blocks) to {directory}.")

    @classmethod
    def load(
        cls, directory: str | Path, *, rerank: bool | ExactSearcher | str | os.PathLike | None = True
    ) -> "FaissSearcher":
        r"""
        Loads a directory written by [`~FaissSearcher.save`].

        Args:
            directory (`str` or `Path`): the searcher directory.
            rerank (`bool`, `ExactSearcher`, `str` or `PathLike`, defaults to `True`): `True` re-opens the re-rank
                embeddings recorded at save time (memory-mapped); `False`/`None` loads the index alone; a searcher or
                path overrides the recorded source.
        """
        faiss = import_faiss()
        directory = Path(directory)
        sidecar_path = directory / SIDECAR_NAME
        if not sidecar_path.is_file():
            raise FileNotFoundError(f"{directory} is not a FaissSearcher directory: {SIDECAR_NAME} is missing.")
        sidecar = json.loads(sidecar_path.read_text(encoding="utf-8"))
        if sidecar.get("format") != SEARCHER_FORMAT:
            raise ValueError(f"{sidecar_path} has format {sidecar.get('format')!r}, expected {SEARCHER_FORMAT!r}.")
        index = faiss.read_index(str(directory / INDEX_FILE_NAME))
        if index.d != sidecar["dim"] or index.ntotal != sidecar["num_blocks"]:
            raise ValueError(
                f"{directory / INDEX_FILE_NAME} holds {index.ntotal} blocks of dim {index.d}, but {SIDECAR_NAME} says "
                f"{sidecar['num_blocks']} of dim {sidecar['dim']}."
            )
        metric = sidecar["metric"]
        rerank_source = None
        if rerank is True:
            if sidecar.get("rerank_index") is not None:
                path = Path(sidecar["rerank_index"])
                rerank_source = ExactSearcher.from_index(
                    path if path.is_absolute() else directory / path, metric=metric
                )
        elif rerank is not None and rerank is not False:
            rerank_source = _as_exact_searcher(rerank, metric)
        searcher = cls(
            index,
            metric=metric,
            factory=sidecar.get("factory"),
            rerank=rerank_source,
            rerank_factor=sidecar.get("rerank_factor", DEFAULT_RERANK_FACTOR),
        )
        if sidecar.get("nprobe") is not None:
            searcher.nprobe = sidecar["nprobe"]
        if sidecar.get("ef_search") is not None:
            searcher.ef_search = sidecar["ef_search"]
        return searcher

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(factory={self.factory!r}, metric={self.metric!r}, num_blocks={self.num_blocks}, "
            f"nprobe={self.nprobe}, ef_search={self.ef_search}, rerank={self.rerank is not None})"
        )


def _index_bytes(faiss, index) -> int:
    """Resident bytes of a faiss index, from its data structures (serializing a large flat index would copy it)."""
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        transforms = 0
        for position in range(index.chain.size()):
            transform = faiss.downcast_VectorTransform(index.chain.at(position))
            for name in ("A", "b"):
                if hasattr(transform, name):
                    transforms += getattr(transform, name).size() * 4
        return transforms + _index_bytes(faiss, index.index)
    if isinstance(index, faiss.IndexIVF):
        invlists = index.invlists
        sizes = np.array([invlists.list_size(list_no) for list_no in range(invlists.nlist)], dtype=np.int64)
        block_lists = faiss.downcast_InvertedLists(invlists)
        if isinstance(block_lists, faiss.BlockInvertedLists):
            # fast-scan lists store codes in blocks of n_per_block vectors
            codes = int((-(-sizes // block_lists.n_per_block)).sum()) * block_lists.block_size
        else:
            codes = int(sizes.sum()) * invlists.code_size
        total = codes + int(sizes.sum()) * 8 + _index_bytes(faiss, index.quantizer)  # ids are int64
        total += index.direct_map.array.size() * 8  # the id -> list map, once built (DirectMap.Array)
        for owner, name in (("pq", "centroids"), ("sq", "trained"), (None, "precomputed_table")):
            holder = getattr(index, owner, None) if owner else index
            if holder is not None and hasattr(holder, name):
                total += getattr(holder, name).size() * 4
        return total
    if isinstance(index, faiss.IndexHNSW):
        hnsw = index.hnsw
        graph = hnsw.neighbors.size() * 4 + hnsw.offsets.size() * 8 + hnsw.levels.size() * 4
        return graph + _index_bytes(faiss, index.storage)
    if isinstance(index, faiss.IndexFlatCodes):
        total = index.codes.size()
        if isinstance(index, faiss.IndexPQ):
            total += index.pq.centroids.size() * 4
        if isinstance(index, faiss.IndexScalarQuantizer):
            total += index.sq.trained.size() * 4
        return total
    return len(faiss.serialize_index(index))


__all__ = ["FaissSearcher", "import_faiss"]

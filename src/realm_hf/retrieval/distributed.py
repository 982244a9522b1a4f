"""Sharded maximum inner-product search across the ranks of a `torch.distributed` process group.

Each rank holds one shard of the block embeddings behind any `Searcher` (exact torch search, a faiss index, ...);
the shard's local ids map to global ids by `+ id_offset`. Every rank calls `ShardedSearcher.search` collectively
with its own queries (any count, including 0):

    1. all_gather the per-rank query counts (and k, to check it)  2 * W int64             (every rank receives)
    2. all_gather the queries, padded to the largest count        W * Q_max * d float32   (every rank receives this)
    3. every rank searches all Q = sum(counts) queries on its shard and keeps a local top-k
    4. all_to_all the partial (scores, global ids): rank r gets only its own queries' rows from each rank,
       W * Q_r * k * (4 + 8) bytes received and Q * k * (4 + 8) bytes sent per rank
    5. merge the W partial top-k lists per query to the global top-k (higher score first, then lower global id)

So one `search` costs 4 collectives (counts, queries, scores, ids) and `Q * num_blocks_r * d` multiply-adds on rank
r. The results dominate the traffic: with W = 8 ranks of Q_r = 128 queries and k = 5000, each rank receives 61 MB of
partial results (all-gathering them instead would be W times more, 492 MB) and 0.5 MB of queries (d = 128). This is
faiss's `IndexShards(successive_ids=True)` (retrieval-anchors §3.2) over torch.distributed instead of threads or RPC.

    W - world size (ranks in the group)       Q_r - queries of rank r      Q - queries of all ranks
    d - embedding dim                         k - results per query
"""

import bisect
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers.utils import logging

from .index_files import open_embedding_shard, read_manifest
from .interfaces import Searcher, SearchResult, as_query_matrix

logger = logging.get_logger(__name__)


def process_state():
    """accelerate's `PartialState` for this process, with a gloo process group on machines without a GPU.

    accelerate sets up a CPU process group only when asked (`cpu=True`); without it, `torchrun --nproc_per_node 2`
    on a CPU-only machine would give two independent "main" processes. Single-process runs are unaffected.
    """
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


# Padding entries (fewer than k blocks) carry this score and id -1; the merge ignores them whatever their score.
PADDING_SCORE = float("-inf")


def shard_ranges(shard_counts: Sequence[int], world_size: int) -> list[tuple[int, int, int]]:
    r"""
    Splits an index's consecutive shards into `world_size` contiguous ranges, as evenly as possible by block count.

    The split minimises the largest range's block count, since the slowest rank sets the latency of every collective
    search. Among such splits, each boundary between rank `r - 1` and rank `r` is the shard edge nearest to the ideal
    `total * r / world_size` (ties go to the later edge). With fewer shards than ranks some ranges are empty.

    Args:
        shard_counts (`Sequence[int]`): number of blocks in each shard, in block-id order (the manifest's `count`s).
        world_size (`int`): number of ranks.

    Returns:
        `list[tuple[int, int, int]]`: for each rank, `(first_shard, last_shard_exclusive, id_offset)`, where
        `id_offset` is the global id of the range's first block (for an empty range, of the next block).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}.")
    if any(count < 0 for count in shard_counts):
        raise ValueError(f"shard counts must be non-negative, got {list(shard_counts)}.")
    block_offsets = [0, *itertools.accumulate(shard_counts)]  # block_offsets[edge] = first global id of shard `edge`
    total, num_shards = block_offsets[-1], len(shard_counts)

    def furthest_edge(edge: int, max_load: int) -> int:
        """The last edge a range starting at `edge` can reach with at most `max_load` blocks."""
        return bisect.bisect_right(block_offsets, block_offsets[edge] + max_load) - 1

    def ranges_needed(max_load: int) -> list[int]:
        """For each edge, the fewest ranges of at most `max_load` blocks that cover the shards after it (greedy)."""
        needed = [0] * (num_shards + 1)
        for edge in reversed(range(num_shards)):
            needed[edge] = 1 + needed[furthest_edge(edge, max_load)]
        return needed

    # The smallest feasible largest load, by bisection between the largest shard and the whole index.
    low, high = max(shard_counts, default=0), total
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if ranges_needed(middle)[0] <= world_size else (middle + 1, high)
    max_load, needed = low, ranges_needed(low)

    boundaries = [0]
    for rank in range(1, world_size):
        # Edges that keep rank - 1 within max_load and leave few enough shards for the ranks after it.
        candidates = [
            edge
            for edge in range(boundaries[-1], furthest_edge(boundaries[-1], max_load) + 1)
            if needed[edge] <= world_size - rank
        ]
        # The nearest to the ideal split, later edge on a tie; `offset * world_size` against `total * rank` keeps
        # the comparison in exact integers.
        _, negative_edge = min((abs(block_offsets[edge] * world_size - total * rank), -edge) for edge in candidates)
        boundaries.append(-negative_edge)
    boundaries.append(num_shards)
    return [(first, last, block_offsets[first]) for first, last in zip(boundaries, boundaries[1:])]


def merge_search_results(partials: Sequence[SearchResult], k: int) -> SearchResult:
    r"""
    Merges several top-k lists over disjoint blocks into one global top-k, deterministically.

    Results are ordered by higher score first, then lower id, whatever the order of `partials` and of ties within
    them. Entries with id -1 (padding) are dropped; the output is padded with score `-inf` and id -1 when fewer than
    `k` real entries exist.

    Args:
        partials (`Sequence[SearchResult]`): each with `scores` and `ids` of shape `(num_queries, k_i)`, on one device.
        k (`int`): results to keep per query.

    Returns:
        `SearchResult` with `scores` (float32) and `ids` (int64) of shape `(num_queries, k)`.
    """
    if not partials:
        raise ValueError("merge_search_results needs at least one partial result, got none.")
    scores = torch.cat([partial.scores for partial in partials], dim=1).float()  # (num_queries, num_candidates)
    ids = torch.cat([partial.ids for partial in partials], dim=1).long()
    padding = ids < 0
    scores = scores.masked_fill(padding, PADDING_SCORE)
    # Padding sorts after every real block, even one whose score is -inf.
    sort_ids = ids.masked_fill(padding, torch.iinfo(torch.int64).max)
    # Two stable sorts, by id and then by score, order equal scores by id (a lexicographic sort on (-score, id)).
    order = sort_ids.argsort(dim=1, stable=True)
    scores, sort_ids = scores.gather(1, order), sort_ids.gather(1, order)
    order = scores.argsort(dim=1, descending=True, stable=True)[:, :k]
    scores, sort_ids = scores.gather(1, order), sort_ids.gather(1, order)
    ids = sort_ids.masked_fill(sort_ids == torch.iinfo(torch.int64).max, -1)
    return _pad_columns(SearchResult(scores, ids), k)


def _pad_columns(result: SearchResult, k: int) -> SearchResult:
    """Right-pads a result with fewer than `k` columns with score `-inf` and id -1."""
    scores, ids = result
    missing = k - scores.shape[1]
    if missing <= 0:
        return result
    num_queries = scores.shape[0]
    return SearchResult(
        torch.cat([scores, scores.new_full((num_queries, missing), PADDING_SCORE)], dim=1),
        torch.cat([ids, ids.new_full((num_queries, missing), -1)], dim=1),
    )


def _group_size_and_rank(group) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialised.")
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


class _EmptyShard:
    """The local searcher of a rank that holds no blocks (an index with fewer shards than ranks)."""

    def __init__(self, dim: int, device: torch.device | str = "cpu"):
        self.dim = dim
        self.device = torch.device(device)

    @property
    def num_blocks(self) -> int:
        return 0

    def search(self, query_embeddings, k: int) -> SearchResult:
        num_queries = as_query_matrix(query_embeddings, self.dim).shape[0]
        return SearchResult(
            torch.full((num_queries, k), PADDING_SCORE, device=self.device),
            torch.full((num_queries, k), -1, dtype=torch.long, device=self.device),
        )

    def embeddings(self, ids) -> torch.Tensor:
        if torch.as_tensor(ids).numel():
            raise ValueError("an empty shard of a ShardedSearcher holds no embeddings.")
        return torch.empty((0, self.dim), device=self.device)

    def add(self, embeddings) -> None:
        raise NotImplementedError("an empty shard of a ShardedSearcher does not take new blocks.")

    def save(self, directory) -> None:
        raise NotImplementedError("an empty shard of a ShardedSearcher has nothing to save.")


class ShardedSearcher:
    r"""
    Exact (or approximate) maximum inner-product search over blocks sharded across a process group, one shard a rank.

    Construction and `search` are collective: every rank of `group` must call them, in the same order, with the same
    `k`. Mismatched shards or `k`s raise on every rank; an error raised on one rank alone (a bad query shape) leaves
    the others waiting in the collective. Without an initialised `torch.distributed` it is a plain local search over
    `local_searcher` (world size 1).

    The merge is deterministic (higher score, then lower global id). A tie at a shard's k-th result is settled by the
    local searcher, so results equal a single-process search exactly when the local searchers break ties by lower id.

    Args:
        local_searcher (`Searcher`): this rank's shard; its ids `0 .. n - 1` are global ids
            `id_offset .. id_offset + n - 1`. It is asked for at most `n` results, so it never needs to pad.
        id_offset (`int`): global id of the shard's first block. Shards of different ranks must not overlap.
        group (`torch.distributed.ProcessGroup`, *optional*): the ranks sharing the index; the default group if
            `None`.
        device (`torch.device` or `str`, *optional*): where queries and results are exchanged and returned; it must
            suit the group's backend (cuda for NCCL; cpu for gloo). Defaults to `local_searcher.device` if it has one,
            else the CPU.

    Attributes:
        dim (`int`): embedding dim (equal on every rank, checked at construction).
        num_blocks (`int`): blocks over all ranks, counted at construction; after adding blocks to a local searcher,
            build a new `ShardedSearcher`.
        shard_layout (`list[tuple[int, int]]`): `(id_offset, num_blocks)` of every rank's shard.
    """

    def __init__(self, local_searcher: Searcher, id_offset: int, group=None, *, device=None):
        self.local_searcher = local_searcher
        self.id_offset = int(id_offset)
        self.group = group
        self.dim = int(local_searcher.dim)
        self.device = torch.device(device if device is not None else getattr(local_searcher, "device", "cpu"))
        self.world_size, self.rank = _group_size_and_rank(group)
        self.local_num_blocks = int(local_searcher.num_blocks)

        # One all-gather of (id_offset, num_blocks, dim) gives num_blocks and checks that the shards fit together;
        # the checks run after it, on every rank alike, so that a bad shard raises everywhere instead of hanging.
        layout = torch.tensor([self.id_offset, self.local_num_blocks, self.dim], dtype=torch.long, device=self.device)
        layout = self._all_gather(layout).tolist()  # (world_size, 3)
        offsets, dims = [offset for offset, _, _ in layout], [dim for _, _, dim in layout]
        if min(offsets) < 0:
            raise ValueError(f"id_offset must be non-negative, got {offsets} for ranks 0..{len(offsets) - 1}.")
        if len(set(dims)) != 1:
            raise ValueError(f"every rank's shard must have the same dim, got {dims} for ranks 0..{len(dims) - 1}.")
        self.shard_layout = [(offset, count) for offset, count, _ in layout]
        ranges = sorted((offset, offset + count, rank) for rank, (offset, count) in enumerate(self.shard_layout))
        ranges = [block_range for block_range in ranges if block_range[1] > block_range[0]]
        for (_, end, rank), (start, _, next_rank) in zip(ranges, ranges[1:]):
            if start < end:
                raise ValueError(
                    f"the shards of ranks {rank} and {next_rank} overlap: ids {self.shard_layout[rank]} and "
                    f"{self.shard_layout[next_rank]} as (id_offset, num_blocks); shards must hold disjoint ids."
                )
        self._num_blocks = sum(count for _, count in self.shard_layout)

    @classmethod
    def from_index(
        cls,
        directory: str | Path,
        group=None,
        *,
        searcher_factory: Callable[..., Searcher] | None = None,
        **searcher_kwargs,
    ) -> "ShardedSearcher":
        r"""
        Opens this rank's contiguous range of an index directory's shards (see `shard_ranges`) and searches it.

        Collective: every rank of `group` calls it. A rank opens (memory-maps) only the shard files of its range; a
        rank whose range is empty holds no blocks and returns only padding from its shard.

        Args:
            directory (`str` or `Path`): an index written with `realm_hf.retrieval.index_files`.
            group (`torch.distributed.ProcessGroup`, *optional*): as in `ShardedSearcher`.
            searcher_factory (`Callable`, *optional*): builds the local searcher as
                `searcher_factory(chunks, **searcher_kwargs)` from the range's memory-mapped `(count, dim)` arrays;
                defaults to `ExactSearcher` from `realm_hf.retrieval.torch_search`, which also gets the manifest's
                `dim` and `metric`.
            searcher_kwargs: passed to the factory. On GPUs give every rank its own device, e.g.
                `device=f"cuda:{local_rank}"`; it is also the device results are exchanged on. A `metric` other than
                the manifest's raises.
        """
        manifest = read_manifest(directory)
        stored_metric = manifest.get("metric", "ip")
        if searcher_kwargs.get("metric", stored_metric) != stored_metric:
            raise ValueError(
                f"{directory} was built for metric {stored_metric!r}, "
                f"but metric={searcher_kwargs['metric']!r} was asked."
            )
        world_size, rank = _group_size_and_rank(group)
        shards = manifest["shards"]
        first, last, id_offset = shard_ranges([shard["count"] for shard in shards], world_size)[rank]
        chunks = []
        for shard in shards[first:last]:
            array = open_embedding_shard(Path(directory) / shard["file"])
            if array.shape != (shard["count"], manifest["dim"]):
                raise ValueError(
                    f"{shard['file']} has shape {array.shape}, "
                    f"the manifest says ({shard['count']}, {manifest['dim']})."
                )
            if len(array):
                chunks.append(array)
        device = searcher_kwargs.get("device")
        if chunks:
            if searcher_factory is None:
                from .torch_search import ExactSearcher

                searcher_factory = ExactSearcher
                searcher_kwargs = {"dim": manifest["dim"], "metric": stored_metric, **searcher_kwargs}
            local_searcher = searcher_factory(chunks, **searcher_kwargs)
        else:
            local_searcher = _EmptyShard(manifest["dim"], device or "cpu")
        logger.info(
            f"rank {rank}/{world_size} searches shards {first}..{last - 1} of {directory} "
            f"({sum(len(chunk) for chunk in chunks)} blocks from id {id_offset})."
        )
        return cls(local_searcher, id_offset, group, device=device)

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def search(self, query_embeddings: torch.Tensor | np.ndarray, k: int) -> SearchResult:
        r"""
        Collective top-k search of this rank's queries over the blocks of every rank.

        Args:
            query_embeddings (`torch.Tensor` or `np.ndarray` of shape `(num_queries, dim)`): this rank's queries;
                `num_queries` may differ between ranks and may be 0.
            k (`int`): results per query.

        Returns:
            `SearchResult` with `scores` (float32) and global `ids` (int64) of shape `(num_queries, k)` on
            `self.device`, best first, ties broken by lower id; padded with score `-inf` and id -1 past `num_blocks`.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}.")
        # float32 on every rank, since all_gather needs one dtype; the local searcher casts as it needs.
        queries = as_query_matrix(query_embeddings, self.dim).to(self.device, torch.float32)
        if self.world_size == 1:
            return merge_search_results([self._search_shard(queries, k)], k)

        counts_and_ks = torch.tensor([queries.shape[0], k], dtype=torch.long, device=self.device)
        counts_and_ks = self._all_gather(counts_and_ks).tolist()  # (world_size, 2)
        query_counts, ks = [count for count, _ in counts_and_ks], [rank_k for _, rank_k in counts_and_ks]
        if len(set(ks)) != 1:
            raise ValueError(f"every rank must search with the same k, got {ks} for ranks 0..{len(ks) - 1}.")
        max_count = max(query_counts)
        if max_count == 0:
            return self._search_shard(queries, k)  # every rank has no queries: (0, k) and no more collectives

        padded_queries = queries.new_zeros((max_count, self.dim))
        padded_queries[: queries.shape[0]] = queries
        gathered_queries = self._all_gather(padded_queries)  # (world_size, max_count, dim)
        all_queries = torch.cat([gathered_queries[rank, :count] for rank, count in enumerate(query_counts)])

        # Rows of all_queries are grouped by owning rank, so an all_to_all hands each rank only its own rows.
        partial_scores, partial_ids = self._search_shard(all_queries, k)  # (sum(query_counts), k)
        own_count = query_counts[self.rank]
        received_scores = partial_scores.new_empty((self.world_size * own_count, k))
        received_ids = partial_ids.new_empty((self.world_size * own_count, k))
        for received, sent in ((received_scores, partial_scores), (received_ids, partial_ids)):
            dist.all_to_all_single(
                received,
                sent.contiguous(),
                output_split_sizes=[own_count] * self.world_size,
                input_split_sizes=query_counts,
                group=self.group,
            )
        partials = [
            SearchResult(scores, ids)
            for scores, ids in zip(
                received_scores.view(self.world_size, own_count, k).unbind(0),
                received_ids.view(self.world_size, own_count, k).unbind(0),
            )
        ]
        return merge_search_results(partials, k)

    def embeddings(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        r"""
        Collective: the stored vectors of global block `ids` (any shape, e.g. the `(B, K)` ids of `search`), fetched
        from the ranks that own them with two all_to_all exchanges (ids out, rows back).

        Returns:
            `torch.FloatTensor` of shape `(*ids.shape, dim)` on `self.device`.
        """
        ids = torch.as_tensor(ids, dtype=torch.long)
        flat_ids = ids.reshape(-1).to(self.device)
        if flat_ids.numel() and (flat_ids.min() < 0 or flat_ids.max() >= self._num_blocks):
            raise ValueError(
                f"block ids must lie in [0, {self._num_blocks}), got ids from {int(flat_ids.min())} to "
                f"{int(flat_ids.max())}."
            )
        if self.world_size == 1:
            return self._local_embeddings(flat_ids - self.id_offset).view(*ids.shape, self.dim)

        shard_ends = torch.tensor([offset + count for offset, count in self.shard_layout], device=self.device)
        owners = torch.searchsorted(shard_ends, flat_ids, right=True)  # rank holding each id
        order = torch.argsort(owners, stable=True)
        send_counts = torch.bincount(owners, minlength=self.world_size)
        receive_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(receive_counts, send_counts, group=self.group)
        send_counts, receive_counts = send_counts.tolist(), receive_counts.tolist()

        requested = flat_ids.new_empty(sum(receive_counts))
        dist.all_to_all_single(requested, flat_ids[order].contiguous(), output_split_sizes=receive_counts,
                               input_split_sizes=send_counts, group=self.group)  # fmt: skip
        rows = self._local_embeddings(requested - self.id_offset)  # (sum(receive_counts), dim)
        returned = rows.new_empty((flat_ids.numel(), self.dim))
        dist.all_to_all_single(returned, rows.contiguous(), output_split_sizes=send_counts,
                               input_split_sizes=receive_counts, group=self.group)  # fmt: skip
        result = torch.empty_like(returned)
        result[order] = returned
        return result.view(*ids.shape, self.dim)

    def _local_embeddings(self, local_ids: torch.Tensor) -> torch.Tensor:
        if local_ids.numel() == 0:
            return torch.empty((0, self.dim), device=self.device)
        return torch.as_tensor(self.local_searcher.embeddings(local_ids.cpu())).to(self.device, torch.float32)

    def add(self, embeddings) -> None:
        raise NotImplementedError(
            "ShardedSearcher cannot add blocks: append shards to the index directory and reopen it with "
            "ShardedSearcher.from_index on every rank."
        )

    def save(self, directory) -> None:
        raise NotImplementedError(
            "ShardedSearcher has no file of its own: save the index with realm_hf.retrieval.index_files, and reopen "
            "it with ShardedSearcher.from_index."
        )

    def _search_shard(self, queries: torch.Tensor, k: int) -> SearchResult:
        """This rank's top-`k` of `queries` with global ids: float32 scores and int64 ids `(num_queries, k)`."""
        num_queries = queries.shape[0]
        local_k = min(k, self.local_num_blocks)
        if num_queries == 0 or local_k == 0:
            return _pad_columns(
                SearchResult(
                    torch.empty((num_queries, 0), device=self.device),
                    torch.empty((num_queries, 0), dtype=torch.long, device=self.device),
                ),
                k,
            )
        scores, ids = self.local_searcher.search(queries, local_k)
        scores = torch.as_tensor(scores).to(self.device, torch.float32)
        ids = torch.as_tensor(ids).to(self.device, torch.long)
        ids = torch.where(ids >= 0, ids + self.id_offset, -1)
        return _pad_columns(SearchResult(scores, ids), k)

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stacks every rank's `tensor` (same shape on all ranks) into `(world_size, *tensor.shape)`."""
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(gathered, tensor.contiguous(), group=self.group)
        return torch.stack(gathered)


__all__ = ["ShardedSearcher", "merge_search_results", "process_state", "shard_ranges"]

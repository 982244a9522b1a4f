"""Tests for realm_hf.retrieval.distributed: shard_ranges, the merge, world size 1 in-process, and 2 gloo ranks."""

import importlib.util
import itertools
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import torchrun

from realm_hf.retrieval.distributed import ShardedSearcher, merge_search_results, shard_ranges
from realm_hf.retrieval.index_files import shard_file_name, write_embedding_shard, write_manifest
from realm_hf.retrieval.interfaces import Searcher, SearchResult, as_query_matrix

WORKER = Path(__file__).parent / "distributed_search_worker.py"
HAS_EXACT_SEARCHER = importlib.util.find_spec("realm_hf.retrieval.torch_search") is not None


class BruteForceSearcher:
    """A minimal exact local searcher over one `(num_blocks, dim)` matrix or a list of chunks."""

    def __init__(self, embeddings_or_chunks):
        if isinstance(embeddings_or_chunks, list):
            embeddings_or_chunks = np.concatenate(embeddings_or_chunks)
        self.embeddings = torch.as_tensor(np.asarray(embeddings_or_chunks, dtype=np.float32))
        self.dim = self.embeddings.shape[1]
        self.requested_k = []

    @property
    def num_blocks(self) -> int:
        return self.embeddings.shape[0]

    def search(self, query_embeddings, k: int) -> SearchResult:
        self.requested_k.append(k)
        return SearchResult(*(as_query_matrix(query_embeddings, self.dim) @ self.embeddings.T).topk(k, dim=1))

    def add(self, embeddings) -> None:
        self.embeddings = torch.cat([self.embeddings, torch.as_tensor(embeddings)])

    def save(self, directory) -> None:
        raise NotImplementedError


def brute_force(embeddings: torch.Tensor, queries: torch.Tensor, k: int) -> SearchResult:
    scores, ids = (queries @ embeddings.T).topk(min(k, embeddings.shape[0]), dim=1)
    missing = k - scores.shape[1]
    return SearchResult(
        torch.cat([scores, torch.full((scores.shape[0], missing), float("-inf"))], dim=1),
        torch.cat([ids, torch.full((ids.shape[0], missing), -1, dtype=torch.long)], dim=1),
    )


def write_index(directory: Path, embeddings: torch.Tensor, shard_counts: list[int], metric: str = "ip") -> Path:
    """An index directory in the `index_files` format with the given shard sizes."""
    directory.mkdir(parents=True)
    shards, start = [], 0
    for shard_index, count in enumerate(shard_counts):
        write_embedding_shard(directory / shard_file_name(shard_index), embeddings[start : start + count])
        shards.append({"file": shard_file_name(shard_index), "start": start, "count": count})
        start += count
    write_manifest(
        directory,
        {
            "dim": embeddings.shape[1],
            "metric": metric,
            "num_blocks": start,
            "dtype": "float32",
            "shard_size": max(shard_counts),
            "shards": shards,
        },
    )
    return directory


# ---------------------------------------------------------------------------------------------------------------------
# shard_ranges


@pytest.mark.parametrize(
    ("shard_counts", "world_size", "expected"),
    [
        ([13, 13, 11], 1, [(0, 3, 0)]),
        ([13, 13, 11], 2, [(0, 1, 0), (1, 3, 13)]),
        ([10, 10, 10, 10], 2, [(0, 2, 0), (2, 4, 20)]),
        ([10] * 10, 3, [(0, 3, 0), (3, 7, 30), (7, 10, 70)]),
        ([10, 10, 10], 4, [(0, 1, 0), (1, 2, 10), (2, 2, 20), (2, 3, 20)]),  # fewer shards than ranks
        ([9], 2, [(0, 1, 0), (1, 1, 9)]),
        ([1, 1, 10], 2, [(0, 2, 0), (2, 3, 2)]),
        ([0, 5, 0, 5], 2, [(0, 3, 0), (3, 4, 5)]),
        # As index_files writes them, equal shards and a shorter last one: the largest rank holds the optimum (100
        # blocks, 200 blocks) and the boundaries stay near the even split, so the empty rank or the light ranks are
        # spread out rather than piled at the end.
        (
            [100] * 11 + [37],
            13,
            [(rank, rank + 1, 100 * rank) for rank in range(3)]
            + [(3, 3, 300)]
            + [(rank, rank + 1, 100 * rank) for rank in range(3, 12)],
        ),
        (
            [100] * 12 + [37],
            8,
            [(0, 2, 0), (2, 3, 200), (3, 5, 300), (5, 6, 500), (6, 8, 600), (8, 9, 800), (9, 11, 900), (11, 13, 1100)],
        ),
        ([], 2, [(0, 0, 0), (0, 0, 0)]),
    ],
)
def test_shard_ranges(shard_counts, world_size, expected):
    assert shard_ranges(shard_counts, world_size) == expected


def smallest_largest_load(shard_counts: list[int], world_size: int) -> int:
    """The optimum by exhaustive search over every way of placing world_size - 1 boundaries on the shard edges."""
    block_offsets = [0, *itertools.accumulate(shard_counts)]
    return min(
        max(
            block_offsets[last] - block_offsets[first] for first, last in zip((0, *inner), (*inner, len(shard_counts)))
        )
        for inner in itertools.combinations_with_replacement(range(len(shard_counts) + 1), world_size - 1)
    )


@pytest.mark.parametrize("seed", range(40))
def test_shard_ranges_tile_the_index_and_minimise_the_largest_rank(seed):
    generator = np.random.default_rng(seed)
    shard_counts = generator.integers(0, 20, size=generator.integers(0, 7)).tolist()
    world_size = int(generator.integers(1, 5))
    ranges = shard_ranges(shard_counts, world_size)
    assert len(ranges) == world_size
    assert ranges[0][0] == 0 and ranges[-1][1] == len(shard_counts)
    for (_, last, _), (first, _, _) in zip(ranges, ranges[1:]):
        assert last == first
    for first, _, id_offset in ranges:
        assert id_offset == sum(shard_counts[:first])
    largest = max(sum(shard_counts[first:last]) for first, last, _ in ranges)
    assert largest == smallest_largest_load(shard_counts, world_size), (shard_counts, world_size, ranges)


def test_shard_ranges_rejects_bad_input():
    with pytest.raises(ValueError, match="world_size must be at least 1, got 0"):
        shard_ranges([3], 0)
    with pytest.raises(ValueError, match="non-negative"):
        shard_ranges([3, -1], 2)


# ---------------------------------------------------------------------------------------------------------------------
# merge_search_results


def test_merge_breaks_ties_by_lower_id_whatever_the_order():
    first = SearchResult(torch.tensor([[3.0, 1.0, 1.0]]), torch.tensor([[7, 9, 4]]))
    second = SearchResult(torch.tensor([[2.0, 1.0, 0.5]]), torch.tensor([[8, 2, 5]]))
    expected_ids = [[7, 8, 2, 4, 9]]
    for partials in ([first, second], [second, first]):
        merged = merge_search_results(partials, 5)
        assert merged.ids.tolist() == expected_ids
        assert merged.scores.tolist() == [[3.0, 2.0, 1.0, 1.0, 1.0]]
        assert merged.scores.dtype == torch.float32 and merged.ids.dtype == torch.int64


def test_merge_ignores_padding_and_pads_to_k():
    # Padding (-1) comes with a misleading high score; a real block with score -inf still beats padding.
    first = SearchResult(torch.tensor([[0.5, 99.0], [1.0, 0.0]]), torch.tensor([[3, -1], [0, 1]]))
    second = SearchResult(torch.tensor([[float("-inf"), 7.0], [2.0, 9.0]]), torch.tensor([[6, -1], [5, -1]]))
    merged = merge_search_results([first, second], 4)
    assert merged.ids.tolist() == [[3, 6, -1, -1], [5, 0, 1, -1]]
    padding = float("-inf")
    assert merged.scores.tolist() == [[0.5, padding, padding, padding], [2.0, 1.0, 0.0, padding]]


def test_merge_keeps_the_global_top_k():
    generator = torch.Generator().manual_seed(0)
    embeddings, queries = torch.randn(50, 8, generator=generator), torch.randn(6, 8, generator=generator)
    partials = []
    for start, end in [(0, 17), (17, 20), (20, 50)]:
        scores, ids = (queries @ embeddings[start:end].T).topk(min(10, end - start), dim=1)
        partials.append(SearchResult(scores, ids + start))
    merged = merge_search_results(partials, 10)
    expected = brute_force(embeddings, queries, 10)
    assert merged.ids.tolist() == expected.ids.tolist()
    torch.testing.assert_close(merged.scores, expected.scores)


def test_merge_of_no_queries():
    empty = SearchResult(torch.empty(0, 3), torch.empty(0, 3, dtype=torch.long))
    merged = merge_search_results([empty, empty], 3)
    assert merged.scores.shape == (0, 3) and merged.ids.shape == (0, 3)


# ---------------------------------------------------------------------------------------------------------------------
# ShardedSearcher without torch.distributed (world size 1)


def test_world_size_one_is_a_local_search_with_shifted_ids():
    generator = torch.Generator().manual_seed(1)
    embeddings, queries = torch.randn(12, 8, generator=generator), torch.randn(5, 8, generator=generator)
    local_searcher = BruteForceSearcher(embeddings)
    searcher = ShardedSearcher(local_searcher, id_offset=100)
    assert isinstance(searcher, Searcher)
    assert (searcher.world_size, searcher.rank, searcher.num_blocks, searcher.dim) == (1, 0, 12, 8)
    assert searcher.shard_layout == [(100, 12)]

    result = searcher.search(queries.numpy(), 4)
    expected = brute_force(embeddings, queries, 4)
    assert result.ids.tolist() == (expected.ids + 100).tolist()
    torch.testing.assert_close(result.scores, expected.scores)

    # k past the shard: the local searcher is asked for at most num_blocks, the rest is padding.
    result = searcher.search(queries, 15)
    assert local_searcher.requested_k[-1] == 12
    assert result.ids[:, 12:].eq(-1).all() and result.scores[:, 12:].eq(float("-inf")).all()
    assert result.ids[:, :12].sort(dim=1).values.tolist() == [list(range(100, 112))] * 5

    assert searcher.search(torch.empty(0, 8), 3).ids.shape == (0, 3)


def test_world_size_one_rejects_bad_arguments():
    searcher = ShardedSearcher(BruteForceSearcher(torch.randn(4, 8)), id_offset=0)
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        searcher.search(torch.randn(2, 8), 0)
    with pytest.raises(ValueError, match=r"shape \(num_queries, 8\), got \(2, 7\)"):
        searcher.search(torch.randn(2, 7), 1)
    with pytest.raises(ValueError, match="not initialised"):
        ShardedSearcher(BruteForceSearcher(torch.randn(4, 8)), id_offset=0, group=object())
    with pytest.raises(NotImplementedError, match="from_index"):
        searcher.add(torch.randn(1, 8))


@pytest.mark.parametrize("searcher_factory", [BruteForceSearcher, None], ids=["brute_force", "ExactSearcher"])
def test_from_index_world_size_one_opens_every_shard(tmp_path, searcher_factory):
    if searcher_factory is None and not HAS_EXACT_SEARCHER:
        pytest.skip("realm_hf.retrieval.torch_search is not written yet")
    generator = torch.Generator().manual_seed(2)
    embeddings, queries = torch.randn(37, 16, generator=generator), torch.randn(4, 16, generator=generator)
    index_dir = write_index(tmp_path / "index", embeddings, [13, 13, 11])
    searcher = ShardedSearcher.from_index(index_dir, searcher_factory=searcher_factory)
    assert (searcher.num_blocks, searcher.dim, searcher.id_offset) == (37, 16, 0)
    result, expected = searcher.search(queries, 5), brute_force(embeddings, queries, 5)
    assert result.ids.tolist() == expected.ids.tolist()
    torch.testing.assert_close(result.scores, expected.scores)


def test_from_index_keeps_the_index_metric(tmp_path):
    generator = torch.Generator().manual_seed(4)
    embeddings, queries = torch.randn(20, 8, generator=generator), torch.randn(3, 8, generator=generator)
    index_dir = write_index(tmp_path / "index", embeddings, [10, 10], metric="l2")
    with pytest.raises(ValueError, match="built for metric 'l2', but metric='ip' was asked"):
        ShardedSearcher.from_index(index_dir, searcher_factory=BruteForceSearcher, metric="ip")
    if not HAS_EXACT_SEARCHER:
        pytest.skip("realm_hf.retrieval.torch_search is not written yet")
    expected_ids = torch.cdist(queries, embeddings).topk(4, dim=1, largest=False).indices
    assert ShardedSearcher.from_index(index_dir).search(queries, 4).ids.tolist() == expected_ids.tolist()


# ---------------------------------------------------------------------------------------------------------------------
# two gloo ranks on the CPU


def test_two_ranks_match_single_process_brute_force(tmp_path):
    generator = torch.Generator().manual_seed(3)
    three_shard_index = write_index(tmp_path / "three_shards", torch.randn(37, 16, generator=generator), [13, 13, 11])
    one_shard_index = write_index(tmp_path / "one_shard", torch.randn(9, 16, generator=generator), [9])
    output_dir = tmp_path / "results"
    output_dir.mkdir()
    command = [*torchrun(2), str(WORKER), str(output_dir), str(three_shard_index), str(one_shard_index)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    reports = [json.loads((output_dir / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, report in enumerate(reports):
        assert (report["rank"], report["world_size"], report["num_blocks"]) == (rank, 2, 37)
        assert report["local_searcher"] == ("ExactSearcher" if HAS_EXACT_SEARCHER else "BruteForceSearcher")
        assert len(report["cases"]) == 8
        for name, case in report["cases"].items():
            assert case["ids"] == case["expected_ids"], f"rank {rank}, {name}"
            torch.testing.assert_close(
                torch.tensor(case["scores"]), torch.tensor(case["expected_scores"]), msg=f"rank {rank}, {name}"
            )
    # Per-rank query counts came through: rank 0 had 3 queries and rank 1 had 5; k past the shard pads with -1.
    assert [len(report["cases"]["uneven_counts"]["ids"]) for report in reports] == [3, 5]
    assert [len(report["cases"]["rank0_no_queries"]["ids"]) for report in reports] == [0, 5]
    assert all(len(row) == 40 and row[-3:] == [-1, -1, -1] for row in reports[0]["cases"]["k_over_num_blocks"]["ids"])
    for report in reports:
        assert "same k, got [3, 4]" in report["errors"]["different_k"]
        assert "ranks 0 and 1 overlap" in report["errors"]["overlapping_shards"]
        assert "same dim, got [16, 15]" in report["errors"]["different_dims"]
    # 3 shards (13, 13, 11) over 2 ranks: rank 0 holds shard 0, rank 1 shards 1-2; a 1-shard index leaves rank 1 empty.
    assert reports[0]["cases"]["from_index_three_shards"]["shard_layout"] == [[0, 13], [13, 24]]
    assert reports[1]["cases"]["from_index_one_shard"]["shard_layout"] == [[0, 9], [9, 0]]

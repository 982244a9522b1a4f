"""ExactSearcher vs brute-force torch (chunking, shards, ties, k > n, reduced precision, l2, files); recall_at_k."""

import json
import math

import numpy as np
import pytest
import torch
from search_helpers import brute_force, make_clustered, make_queries

from realm_hf.retrieval.evaluation import recall_at_k
from realm_hf.retrieval.index_files import read_manifest, shard_file_name, write_embedding_shard, write_manifest
from realm_hf.retrieval.interfaces import Searcher, SearchResult
from realm_hf.retrieval.torch_search import ExactSearcher, rerank_pool_size

NUM_BLOCKS, DIM = 3000, 32


@pytest.fixture(scope="module")
def blocks() -> np.ndarray:
    return make_clustered(NUM_BLOCKS, DIM, num_clusters=30, seed=0)


@pytest.fixture(scope="module")
def queries(blocks) -> np.ndarray:
    return make_queries(blocks, num_queries=20)


def assert_same_result(result: SearchResult, expected: SearchResult, atol: float = 1e-4):
    assert result.ids.dtype == torch.long and result.scores.dtype == torch.float32
    torch.testing.assert_close(result.ids, expected.ids, rtol=0, atol=0)
    torch.testing.assert_close(result.scores, expected.scores, rtol=0, atol=atol)


@pytest.mark.parametrize("chunk_size", [7, 256, 1000, 4096, None])
@pytest.mark.parametrize("splits", [[], [1000, 1001, 2999]], ids=["one_chunk", "three_chunks"])
@pytest.mark.parametrize("k", [1, 10, 100])
def test_matches_brute_force(blocks, queries, chunk_size, splits, k):
    chunks = np.split(blocks, splits) if splits else blocks
    searcher = ExactSearcher(chunks, chunk_size=chunk_size)
    assert searcher.num_blocks == NUM_BLOCKS and searcher.dim == DIM
    assert_same_result(searcher.search(queries, k), brute_force(blocks, queries, k))


def test_torch_topk_agrees_without_ties(blocks, queries):
    scores, ids = (torch.from_numpy(queries) @ torch.from_numpy(blocks).T).topk(50, dim=1)
    result = ExactSearcher(torch.from_numpy(blocks), chunk_size=500).search(torch.from_numpy(queries), 50)
    assert torch.equal(result.ids, ids)
    torch.testing.assert_close(result.scores, scores, rtol=0, atol=1e-4)


@pytest.mark.parametrize("chunk_size", [1, 3, 50, 1000])
def test_ties_prefer_the_lower_id(chunk_size):
    generator = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 3, (600, 4), generator=generator).float()  # many exactly equal scores
    queries = torch.randint(0, 3, (6, 4), generator=generator).float()
    for k in (1, 7, 40, 599):
        assert_same_result(
            ExactSearcher(blocks, chunk_size=chunk_size).search(queries, k), brute_force(blocks, queries, k)
        )


def test_identical_blocks_return_ascending_ids():
    blocks = torch.zeros(1000, 8)  # e.g. the zero rows of a partly filled block_emb
    result = ExactSearcher(blocks, chunk_size=128).search(torch.ones(2, 8), 5)
    assert result.ids.tolist() == [[0, 1, 2, 3, 4]] * 2


@pytest.mark.parametrize("storage_dtype", [None, torch.bfloat16, "fp16"])
def test_k_larger_than_num_blocks_pads(storage_dtype):
    blocks = torch.randn(5, 8)
    result = ExactSearcher([blocks[:2], blocks[2:]], storage_dtype=storage_dtype).search(torch.randn(3, 8), 9)
    assert result.ids.shape == (3, 9) and result.scores.shape == (3, 9)
    assert (result.ids[:, 5:] == -1).all() and torch.isneginf(result.scores[:, 5:]).all()
    assert sorted(result.ids[0, :5].tolist()) == [0, 1, 2, 3, 4]


def test_empty_searcher_and_empty_queries():
    searcher = ExactSearcher(dim=8)
    result = searcher.search(torch.randn(2, 8), 3)
    assert (result.ids == -1).all() and torch.isneginf(result.scores).all()
    searcher.add(torch.randn(4, 8))
    assert searcher.search(torch.empty(0, 8), 3).ids.shape == (0, 3)


@pytest.mark.parametrize("storage_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_reduced_precision_with_rerank_is_exact_on_separated_data(blocks, queries, storage_dtype, metric):
    searcher = ExactSearcher(blocks, storage_dtype=storage_dtype, metric=metric, chunk_size=1024)
    assert searcher.memory_bytes() == NUM_BLOCKS * DIM * 2  # the half-precision copy (+ l2 norms once searched)
    assert_same_result(searcher.search(queries, 10), brute_force(blocks, queries, 10, metric=metric), atol=1e-3)


def test_rerank_pool_size():
    assert rerank_pool_size(5, 4) == 37  # at least k + 32
    assert rerank_pool_size(100, 4) == 400


@pytest.mark.parametrize("storage_dtype", [None, "bf16"])
def test_l2_metric(blocks, queries, storage_dtype):
    searcher = ExactSearcher(np.split(blocks, [1234]), metric="l2", chunk_size=500, storage_dtype=storage_dtype)
    assert_same_result(searcher.search(queries, 20), brute_force(blocks, queries, 20, metric="l2"), atol=1e-3)


def test_add_keeps_ids_stable(blocks, queries):
    searcher = ExactSearcher(blocks[:2000])
    before = searcher.search(queries, 5)
    zeros = torch.zeros(3, DIM)  # score 0, far below the top blocks of any query
    searcher.add(zeros)
    boosted = 10 * torch.from_numpy(queries[:2])  # score 10 |q|^2: the best match of the first two queries
    searcher.add(boosted)
    assert searcher.num_blocks == 2005
    after = searcher.search(queries, 5)
    assert after.ids[0, 0] == 2003 and after.ids[1, 0] == 2004
    assert_same_result(after, brute_force(torch.cat([torch.from_numpy(blocks[:2000]), zeros, boosted]), queries, 5))
    for ids_before, ids_after in zip(before.ids.tolist(), after.ids.tolist()):
        old_ids = [block_id for block_id in ids_after if block_id < 2000]  # the old blocks kept their ids
        assert old_ids == ids_before[: len(old_ids)]
    torch.testing.assert_close(searcher.embeddings(torch.tensor([2000, 2004])), torch.stack([zeros[0], boosted[1]]))


def test_embeddings_returns_stored_rows(blocks):
    searcher = ExactSearcher(np.split(blocks, [100, 2000]))
    ids = torch.tensor([[2999, 0, 1999], [100, 99, 2000]])
    rows = searcher.embeddings(ids)
    assert rows.shape == (2, 3, DIM) and rows.dtype == torch.float32
    torch.testing.assert_close(rows, torch.from_numpy(blocks)[ids], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"\[0, 3000\).*-1"):
        searcher.embeddings(torch.tensor([-1, 3]))


def test_save_and_load_round_trip(tmp_path, blocks, queries):
    searcher = ExactSearcher([blocks[:10], torch.from_numpy(blocks[10:])], metric="ip")
    searcher.save(tmp_path / "index", shard_size=1024)
    manifest = read_manifest(tmp_path / "index")
    assert manifest["num_blocks"] == NUM_BLOCKS and manifest["metric"] == "ip" and manifest["dtype"] == "float32"
    assert [shard["count"] for shard in manifest["shards"]] == [1024, 1024, 952]  # re-packed across chunks
    loaded = ExactSearcher.load(tmp_path / "index")
    assert all(isinstance(chunk, np.memmap) for chunk in loaded.chunks)
    # Same ids; scores to rounding, since re-packed chunks give matmuls of other shapes (another summation order).
    assert_same_result(loaded.search(queries, 10), searcher.search(queries, 10), atol=1e-5)
    assert not list(tmp_path.glob("index/*.tmp"))


def test_save_keeps_provenance_and_can_overwrite_its_source(tmp_path, blocks, queries):
    directory = tmp_path / "index"
    directory.mkdir()
    write_embedding_shard(directory / shard_file_name(0), blocks)
    write_manifest(directory, {"dim": DIM, "metric": "l2", "num_blocks": NUM_BLOCKS, "dtype": "float32",
                               "shard_size": NUM_BLOCKS, "shards": [{"file": shard_file_name(0), "start": 0,
                               "count": NUM_BLOCKS}], "provenance": {"model": "tiny"}})  # fmt: skip
    searcher = ExactSearcher.from_index(directory)
    assert searcher.metric == "l2" and searcher.index_directory == directory
    searcher.add(torch.from_numpy(queries[:1]))
    searcher.save(directory, shard_size=1000)  # the memory maps keep reading the replaced files
    manifest = json.loads((directory / "index.json").read_text())
    assert manifest["provenance"] == {"model": "tiny"} and manifest["num_blocks"] == NUM_BLOCKS + 1
    reloaded = ExactSearcher.from_index(directory)
    assert_same_result(reloaded.search(queries, 5), searcher.search(queries, 5), atol=0)
    with pytest.raises(ValueError, match="metric 'l2'.*metric='ip'"):
        ExactSearcher.from_index(directory, metric="ip")


def test_index_directory_from_index_files(tmp_path, blocks, queries):
    """An index written shard by shard with index_files (as the index builder does) is searched in place."""
    counts = [1000, 0, 1500, 500]
    shards, start = [], 0
    for number, count in enumerate(counts):
        write_embedding_shard(tmp_path / shard_file_name(number), blocks[start : start + count])
        shards.append({"file": shard_file_name(number), "start": start, "count": count})
        start += count
    write_manifest(tmp_path, {"dim": DIM, "metric": "ip", "num_blocks": NUM_BLOCKS, "dtype": "float32",
                              "shard_size": 1500, "shards": shards})  # fmt: skip
    for storage_dtype in (None, torch.bfloat16):
        searcher = ExactSearcher.from_index(tmp_path, chunk_size=300, storage_dtype=storage_dtype)
        assert_same_result(searcher.search(queries, 15), brute_force(blocks, queries, 15), atol=1e-3)


def test_float16_shards_and_numpy_or_1d_queries(blocks, queries):
    half = blocks.astype(np.float16)
    searcher = ExactSearcher(half)
    expected = brute_force(half.astype(np.float32), queries, 5)
    assert_same_result(searcher.search(queries, 5), expected)
    single = searcher.search(torch.from_numpy(queries[0]).double(), 5)
    assert single.ids.shape == (1, 5) and torch.equal(single.ids[0], expected.ids[0])


def test_nan_blocks_are_never_returned():
    blocks = torch.randn(300, 8)
    blocks[[3, 150, 299]] = math.nan
    result = ExactSearcher(blocks, chunk_size=64).search(torch.randn(4, 8), 300)
    assert not torch.isnan(result.scores).any()
    assert set(result.ids[0].tolist()) == set(range(300)) - {3, 150, 299} | {-1}


def test_rescore_sorts_candidates_exactly(blocks, queries):
    searcher = ExactSearcher(blocks)
    exact = brute_force(blocks, queries, 8)
    shuffled = exact.ids[:, torch.randperm(8)]
    padded = torch.cat([shuffled, torch.full((len(queries), 2), -1)], dim=1)
    assert_same_result(searcher.rescore(queries, padded, 8), exact)
    more = searcher.rescore(queries, shuffled[:, :3], 5)
    assert (more.ids[:, 3:] == -1).all() and torch.isneginf(more.scores[:, 3:]).all()


def test_implements_the_searcher_protocol(blocks):
    assert isinstance(ExactSearcher(blocks), Searcher)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda s: s.search(torch.randn(2, DIM + 1), 3), r"\(num_queries, 32\), got \(2, 33\)"),
        (lambda s: s.search(torch.randn(2, DIM), 0), "k must be a positive number of blocks, got 0"),
        (lambda s: s.add(torch.randn(4, 31)), r"shape \(n, 32\), got \(4, 31\)"),
        (lambda s: s.add(torch.randn(4)), r"2-D \(num_blocks, dim\), got shape \(4,\)"),
        (lambda s: s.add(torch.ones(2, DIM, dtype=torch.long)), "floating point, got torch.int64"),
    ],
)
def test_errors_name_expected_and_received(make, message):
    with pytest.raises(ValueError, match=message):
        make(ExactSearcher(torch.randn(10, DIM)))


def test_constructor_errors():
    with pytest.raises(ValueError, match="needs `dim`"):
        ExactSearcher()
    with pytest.raises(ValueError, match="metric must be one of .*got 'cosine'"):
        ExactSearcher(dim=4, metric="cosine")
    with pytest.raises(ValueError, match="storage_dtype must be one of .*got 'int8'"):
        ExactSearcher(dim=4, storage_dtype="int8")
    with pytest.raises(TypeError, match="got list"):
        ExactSearcher([[1.0, 2.0]], dim=2)


def test_recall_at_k():
    exact = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert recall_at_k(exact, exact, 4) == 1.0
    assert recall_at_k(torch.tensor([[4, 3, 2, 1], [8, 9, 10, 11]]), exact, 4) == pytest.approx((1.0 + 0.25) / 2)
    assert recall_at_k(np.array([[1, 1, 9, -1], [-1, -1, 5, 6]]), exact, 2) == pytest.approx((0.5 + 0.0) / 2)
    assert recall_at_k(np.array([[-1, 2], [5, 6]]), np.array([[-1, 2], [5, 6]]), 2) == pytest.approx(0.75)
    with pytest.raises(ValueError, match=r"at least k=5 ids per query, got shape \(2, 4\)"):
        recall_at_k(exact, exact, 5)
    with pytest.raises(ValueError, match="same number of queries: 1 vs 2"):
        recall_at_k(exact[:1], exact, 2)

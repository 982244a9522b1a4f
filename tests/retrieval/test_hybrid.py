"""HybridSearcher: BM25 and dense candidates in one union, scored exactly as ExactSearcher scores them."""

import importlib.util

import pytest
import torch

if importlib.util.find_spec("bm25s") is None:  # not imported here: realm_hf imports it without JAX
    pytest.skip("bm25s is not installed", allow_module_level=True)

from realm_hf.retrieval import ExactSearcher, HybridSearcher, Searcher  # noqa: E402
from realm_hf.retrieval.bm25 import BM25Searcher  # noqa: E402

TEXTS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "Mount Fuji is the highest mountain in Japan.",
    "Oxygen is a chemical element with atomic number 8.",
    "Indium is a chemical element; it has symbol In and atomic number 49.",
    "The Nile is a river in Africa.",
    "Lima is the capital of Peru.",
    "Gold has the symbol Au.",
]
QUESTIONS = ["Which element has atomic number 49?", "What is the capital of Peru?"]


@pytest.fixture(scope="module")
def searchers():
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(len(TEXTS), 6, generator=generator)
    return ExactSearcher(embeddings), BM25Searcher.from_documents(TEXTS), torch.randn(2, 6, generator=generator)


def test_union_of_dense_and_bm25_candidates_scored_exactly(searchers):
    dense, bm25, queries = searchers
    hybrid = HybridSearcher(dense, bm25, bm25_fraction=0.4)
    assert isinstance(hybrid, Searcher) and hybrid.num_blocks == len(TEXTS) and hybrid.dim == 6
    k = 5
    with hybrid.query_texts(QUESTIONS):
        scores, ids = hybrid.search(queries, k)
    assert scores.shape == ids.shape == (2, k)
    exact_scores, exact_ids = dense.search(queries, len(TEXTS))  # every block, scored and ranked exactly
    bm25_ids = bm25.search_text(QUESTIONS, len(TEXTS)).ids
    for row in range(2):
        dense_part = exact_ids[row, :3].tolist()  # k - round(0.4 k) = 3 dense slots
        bm25_part = [block for block in bm25_ids[row].tolist() if block not in dense_part][:2]
        assert set(ids[row].tolist()) == set(dense_part + bm25_part)
        # Each candidate carries the score exact search gives it, best first.
        exact = dict(zip(exact_ids[row].tolist(), exact_scores[row].tolist(), strict=True))
        assert scores[row].tolist() == pytest.approx([exact[block] for block in ids[row].tolist()], rel=1e-5)
        assert torch.all(scores[row, :-1] >= scores[row, 1:])
    # The BM25 favourites are in: block 4 (indium, 49) and block 6 (Lima, Peru).
    assert 4 in ids[0].tolist() and 6 in ids[1].tolist()
    assert torch.equal(hybrid.embeddings(ids), dense.embeddings(ids))


def test_fraction_zero_is_the_dense_searcher_and_one_is_bm25_rescored(searchers):
    dense, bm25, queries = searchers
    dense_only = HybridSearcher(dense, bm25, bm25_fraction=0.0)
    assert all(torch.equal(a, b) for a, b in zip(dense_only.search(queries, 3), dense.search(queries, 3), strict=True))
    bm25_only = HybridSearcher(dense, bm25, bm25_fraction=1.0)
    with bm25_only.query_texts(QUESTIONS):
        _, ids = bm25_only.search(queries, 3)
    expected = bm25.search_text(QUESTIONS, 3).ids
    assert [set(row) for row in ids.tolist()] == [set(row) for row in expected.tolist()]


def test_a_bm25_weight_adds_the_normalised_bm25_score_to_the_relevance(searchers):
    dense, bm25, queries = searchers
    plain = HybridSearcher(dense, bm25, bm25_fraction=0.4)
    weighted = HybridSearcher(dense, bm25, bm25_fraction=0.4, bm25_weight=3.0)
    k = 5
    with plain.query_texts(QUESTIONS), weighted.query_texts(QUESTIONS):
        plain_scores, plain_ids = plain.search(queries, k)
        (scores, ids), bias = weighted.search_with_bias(queries, k)
        again = weighted.search(queries, k)
        _, zero_bias = plain.search_with_bias(queries, k)
    assert torch.equal(again.ids, ids) and torch.equal(again.scores, scores)
    assert torch.equal(zero_bias, torch.zeros(2, k))
    found = bm25.search_text(QUESTIONS, k)
    for row in range(2):
        assert set(ids[row].tolist()) == set(plain_ids[row].tolist())  # the same candidates, weighed differently
        best = found.scores[row].max().item()
        bm25_score = dict(zip(found.ids[row].tolist(), found.scores[row].tolist(), strict=True))
        expected_bias = [3.0 * bm25_score.get(block, 0.0) / best for block in ids[row].tolist()]
        assert bias[row].tolist() == pytest.approx(expected_bias, rel=1e-5)
        exact = dict(zip(plain_ids[row].tolist(), plain_scores[row].tolist(), strict=True))
        expected = [exact[block] + extra for block, extra in zip(ids[row].tolist(), expected_bias, strict=True)]
        assert scores[row].tolist() == pytest.approx(expected, rel=1e-5)
        assert torch.all(scores[row, :-1] >= scores[row, 1:])
    # BM25's best block for each question has the full weight; a weight far above the dense scores puts it first
    assert sorted(bias.max(dim=1).values.tolist()) == pytest.approx([3.0, 3.0])
    strong = HybridSearcher(dense, bm25, bm25_fraction=0.4, bm25_weight=1000.0)
    with strong.query_texts(QUESTIONS):
        assert strong.search(queries, k).ids[:, 0].tolist() == [4, 6]  # indium (49) and Lima (Peru)
    # a weight with fraction 0: the dense candidates alone, weighed by BM25 too
    dense_weighted = HybridSearcher(dense, bm25, bm25_fraction=0.0, bm25_weight=1.0)
    with dense_weighted.query_texts(QUESTIONS):
        assert set(dense_weighted.search(queries, 3).ids[0].tolist()) == set(dense.search(queries, 3).ids[0].tolist())
    with pytest.raises(ValueError, match="bm25_weight"):
        HybridSearcher(dense, bm25, bm25_weight=-1.0)
    with pytest.raises(ValueError, match="bm25_weight"):
        HybridSearcher(dense, bm25, bm25_weight=float("nan"))


def test_num_read_takes_the_bm25_share_of_the_blocks_read_first(searchers):
    """Training as served: `k` blocks for the retriever's loss, of which the first `num_read` are the union the model
    reads when it serves with `k = num_read`, then the next dense blocks."""
    dense, bm25, queries = searchers
    served = HybridSearcher(dense, bm25, bm25_fraction=0.4)
    training = HybridSearcher(dense, bm25, bm25_fraction=0.4, num_read=3)
    with served.query_texts(QUESTIONS), training.query_texts(QUESTIONS):
        read = served.search(queries, 3)
        scores, ids = training.search(queries, 7)
        assert all(torch.equal(a, b) for a, b in zip(training.search(queries, 3), read, strict=True))
    exact_scores, exact_ids = dense.search(queries, len(TEXTS))
    for row in range(2):
        assert ids[row, :3].tolist() == read.ids[row].tolist()  # what the reader reads: the served union, best first
        rest = [block for block in exact_ids[row].tolist() if block not in read.ids[row].tolist()][:4]
        assert ids[row, 3:].tolist() == rest  # then the next dense blocks, best first
        assert len(set(ids[row].tolist())) == 7
        exact = dict(zip(exact_ids[row].tolist(), exact_scores[row].tolist(), strict=True))
        assert scores[row].tolist() == pytest.approx([exact[block] for block in ids[row].tolist()], rel=1e-5)
    # without num_read, 7 blocks give BM25 round(0.4 * 7) = 3 slots, not 1 of the first 3
    with served.query_texts(QUESTIONS):
        assert served.search(queries, 7).ids.tolist() != ids.tolist()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="num_read"):
            HybridSearcher(dense, bm25, num_read=bad)


def test_searcher_settings_keep_the_bm25_weight(searchers, tmp_path):
    from realm_hf.errors import FileFormatError
    from realm_hf.retrieval.hybrid import load_searcher_settings, save_searcher_settings, with_searcher_settings

    dense, bm25, _ = searchers
    save_searcher_settings(HybridSearcher(dense, bm25, bm25_fraction=0.6, bm25_weight=2.5), tmp_path)
    settings = load_searcher_settings(tmp_path)
    assert settings == {"searcher": "hybrid", "bm25_fraction": 0.6, "bm25_weight": 2.5}
    rebuilt = with_searcher_settings(dense, [text.encode() for text in TEXTS], settings)
    assert (rebuilt.bm25_fraction, rebuilt.bm25_weight) == (0.6, 2.5)
    (tmp_path / "searcher.json").write_text('{"searcher": "hybrid", "bm25_fraction": 0.4}')  # written before weights
    assert load_searcher_settings(tmp_path)["bm25_weight"] == 0.0
    (tmp_path / "searcher.json").write_text('{"searcher": "hybrid", "bm25_weight": -2}')
    with pytest.raises(FileFormatError, match="received bm25_weight -2"):
        load_searcher_settings(tmp_path)


def test_errors(searchers):
    dense, bm25, queries = searchers
    hybrid = HybridSearcher(dense, bm25)
    with pytest.raises(ValueError, match="query_texts"):
        hybrid.search(queries, 3)
    with hybrid.query_texts(["only one"]), pytest.raises(ValueError, match="2 queries"):
        hybrid.search(queries, 3)
    with pytest.raises(TypeError, match="one str"), hybrid.query_texts("a question"):
        pass
    with pytest.raises(ValueError, match="bm25_fraction"):
        HybridSearcher(dense, bm25, bm25_fraction=1.5)
    with pytest.raises(ValueError, match="same blocks"):
        HybridSearcher(ExactSearcher(torch.randn(3, 6)), bm25)
    with pytest.raises(TypeError, match="search by text"):
        HybridSearcher(dense, dense)


def _tiny_model_over(tmp_path, bm25_weight: float = 0.0):
    """A random tiny `RealmForOpenQA` over TEXTS that reads 3 hybrid candidates (2 dense, 1 BM25), and its tokenizer
    and retriever."""
    from conftest import tiny_config, write_vocab

    from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer

    words = sorted({word.strip(".,;?").lower() for text in TEXTS + QUESTIONS for word in text.split()})
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])))
    config = tiny_config(vocab_size=len(tokenizer), num_block_records=len(TEXTS), reader_beam_size=3,
                         searcher_beam_size=3, store_block_emb=False)  # fmt: skip
    torch.manual_seed(0)
    retriever = RealmRetriever(block_records=[text.encode() for text in TEXTS], tokenizer=tokenizer)
    dense = ExactSearcher(torch.randn(len(TEXTS), config.retriever_proj_size))
    hybrid = HybridSearcher(dense, BM25Searcher.from_documents(TEXTS), bm25_fraction=0.34, bm25_weight=bm25_weight)
    return RealmForOpenQA(config, retriever=retriever, searcher=hybrid).eval(), tokenizer, retriever


def test_a_model_reads_the_hybrid_candidates(tmp_path):
    """Through RealmForOpenQA and the pipeline: the blocks read are the hybrid union, their logits the model's."""
    from transformers import pipeline

    model, tokenizer, retriever = _tiny_model_over(tmp_path)
    hybrid = model.searcher
    open_qa = pipeline("open-qa", model=model, tokenizer=tokenizer, retriever=retriever, device="cpu")
    answer = open_qa(QUESTIONS[1])
    with torch.no_grad():
        inputs = tokenizer([QUESTIONS[1]], return_tensors="pt")
        question = model.embedder(**inputs).projected_score
        with hybrid.query_texts([tokenizer.decode(inputs["input_ids"][0], skip_special_tokens=True)]):
            expected_scores, expected_ids = hybrid.search(question, 3)
    assert 6 in expected_ids[0].tolist()  # Lima / Peru, from BM25
    assert answer["block_id"] in expected_ids[0].tolist()
    with torch.no_grad(), hybrid.query_texts([QUESTIONS[1].lower()]):
        spans = model.score_spans(**inputs)
    assert torch.equal(spans.retrieved_block_ids, expected_ids)
    assert torch.allclose(spans.retrieved_logits, expected_scores, atol=1e-5)


def test_a_model_adds_the_searchers_bm25_term_to_its_retrieval_logits(tmp_path):
    """The blocks read and the logits REALM marginalises over are the weighted hybrid's: q . block + the BM25 term."""
    model, tokenizer, _ = _tiny_model_over(tmp_path, bm25_weight=4.0)
    weighted, dense = model.searcher, model.searcher.dense
    inputs = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    with torch.no_grad(), weighted.query_texts([question.lower() for question in QUESTIONS]):
        spans = model.score_spans(**inputs)
        question = model.embedder(**inputs).projected_score
        (_, expected_ids), bias = weighted.search_with_bias(question, 3)
    assert torch.equal(spans.retrieved_block_ids, expected_ids) and bias.abs().sum() > 0
    plain = torch.einsum("bd,bkd->bk", question, dense.embeddings(expected_ids))
    torch.testing.assert_close(spans.retrieved_logits, plain + bias, rtol=1e-5, atol=1e-5)

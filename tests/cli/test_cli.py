"""The `realm-hf` command line: demo, ask, help and errors."""

import json

import pytest
from conftest import skip_without_bm25s

from realm_hf import RealmForOpenQA, RealmRetriever
from realm_hf.cli.main import main
from realm_hf.demo import DEMO_QUESTIONS, load_demo_corpus


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--untrained", "--output", str(directory)]) == 0
    return directory


def test_demo_says_it_is_untrained_and_answers_with_evidence(demo_dir, capsys):
    assert main(["demo", "--untrained", "--output", str(demo_dir)]) == 0
    out = capsys.readouterr().out
    assert "UNTRAINED" in out
    assert out.count("Q: ") == len(DEMO_QUESTIONS) and out.count("evidence [block ") == len(DEMO_QUESTIONS)


def test_demo_model_reloads_with_a_memory_mapped_retriever(demo_dir):
    retriever = RealmRetriever.from_pretrained(demo_dir)
    model = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever)
    assert model.retriever is retriever
    corpus = load_demo_corpus()
    assert len(retriever) == model.config.num_block_records == len(corpus)
    assert retriever.block_records[0].decode().startswith(corpus[0]["title"])


def test_ask_json_returns_the_evidence_block(demo_dir, capsys):
    assert main(["ask", "--model", str(demo_dir), "--json", "Who wrote Hamlet?", "What is the capital of Japan?"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [line["question"] for line in lines] == ["Who wrote Hamlet?", "What is the capital of Japan?"]
    retriever = RealmRetriever.from_pretrained(demo_dir)
    for line in lines:
        assert set(line) == {
            "question",
            "rank",
            "answer",
            "score",
            "block_id",
            "title",
            "source",
            "evidence",
            "start",
            "end",
            "confidence",
            "abstained",
            "threshold",
            "unknown_names",
            "about_the_asker",
            "missing_units",
            "yes_or_no",
        }
        assert line["confidence"] is None and line["abstained"] is False  # no calibration.json: never abstains
        assert line["unknown_names"] == [] and line["about_the_asker"] == [] and line["missing_units"] == []
        assert line["yes_or_no"] is False
        assert line["evidence"] == retriever.block_records[line["block_id"]].decode()
        # the answer as written in the evidence, original case included
        assert line["evidence"][line["start"] : line["end"]] == line["answer"] != ""
        assert 0.0 < line["score"] <= 1.0 and line["rank"] == 1 and line["title"] is None


def test_ask_hides_the_weight_loading_bar(demo_dir, capsys):
    RealmForOpenQA.from_pretrained(demo_dir)  # a plain load shows Transformers' bar ...
    assert "Loading weights" in capsys.readouterr().err
    assert main(["ask", "--model", str(demo_dir), "Who wrote Hamlet?"]) == 0  # ... asking a question does not
    captured = capsys.readouterr()
    assert "Loading weights" not in captured.err and captured.out.startswith("Q: Who wrote Hamlet?")
    RealmForOpenQA.from_pretrained(demo_dir)  # and the bar is back for everything else
    assert "Loading weights" in capsys.readouterr().err


def test_ask_marks_abstained_answers(demo_dir, tmp_path, capsys):
    import shutil

    from realm_hf.evaluation.calibration import Calibration

    directory = tmp_path / "calibrated"
    shutil.copytree(demo_dir, directory)
    # Confidence 0.5 for every answer, threshold 0.6: every answer abstained.
    Calibration(features=["margin"], mean=[0.0], scale=[1.0], weights=[0.0], bias=0.0, threshold=0.6).save(directory)
    assert main(["ask", "--model", str(directory), "--json", "Who wrote Hamlet?"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["abstained"] is True and line["confidence"] == pytest.approx(0.5) and line["answer"] != ""
    assert line["threshold"] == pytest.approx(0.6)
    assert main(["ask", "--model", str(directory), "Who wrote Hamlet?"]) == 0
    out = capsys.readouterr().out  # not sure, and why: the confidence is under the threshold
    assert f"A: (not sure) {line['answer']}  (score" in out and "confidence 0.50, under the 0.60 threshold)" in out
    assert (
        main(["ask", "--model", str(directory), "--json", "--abstention-threshold", "0.4", "Who wrote Hamlet?"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["abstained"] is False
    # A name no document mentions: abstained whatever the confidence, and the text output says why.
    question = "Who is the king of Zanzanryx?"
    assert main(["ask", "--model", str(directory), "--json", "--abstention-threshold", "0.4", question]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["abstained"] is True and line["unknown_names"] == ["Zanzanryx"]
    assert main(["ask", "--model", str(directory), "--abstention-threshold", "0.4", question]) == 0
    assert "A: (not sure) " in (out := capsys.readouterr().out) and "no document mentions 'Zanzanryx'" in out
    assert "threshold" not in out  # its confidence (0.5) is over the threshold: the name is the reason
    # A question about the asker, over documents about no one: abstained, and the text output says why.
    question = "Who is the CEO of my company?"
    assert main(["ask", "--model", str(directory), "--json", "--abstention-threshold", "0.4", question]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["abstained"] is True and line["about_the_asker"] == ["my"] and line["unknown_names"] == []
    assert main(["ask", "--model", str(directory), "--abstention-threshold", "0.4", question]) == 0
    out = capsys.readouterr().out
    assert (
        "A: (not sure) " in out and "the question asks about you ('my'), and these documents are not about you" in out
    )
    with pytest.raises(SystemExit):
        main(["ask", "--model", str(directory), "--abstention-threshold", "1.5", "Who wrote Hamlet?"])
    assert "expected a number between 0 and 1" in capsys.readouterr().err


def test_ask_with_hybrid_and_bm25_searchers(demo_dir, capsys):
    skip_without_bm25s()
    from realm_hf.retrieval.bm25 import BM25Searcher

    question = "What is the capital of Japan?"
    assert main(["ask", "--model", str(demo_dir), "--json", "--searcher", "bm25", question]) == 0
    line = json.loads(capsys.readouterr().out)
    records = RealmRetriever.from_pretrained(demo_dir).block_records
    texts = [records[index].decode() for index in range(len(records))]
    reader_beam_size = RealmForOpenQA.from_pretrained(demo_dir).config.reader_beam_size
    bm25_ids = BM25Searcher.from_documents(texts).search_text([question], reader_beam_size).ids[0].tolist()
    assert line["block_id"] in bm25_ids  # read from BM25's blocks only
    assert main(["ask", "--model", str(demo_dir), "--json", "--searcher", "hybrid", "--bm25-fraction", "0.5",
                 question]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["answer"]
    # a BM25 weight far above the dense scores: the answer comes from BM25's best block
    assert main(["ask", "--model", str(demo_dir), "--json", "--searcher", "hybrid", "--bm25-weight", "1000",
                 question]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["block_id"] == bm25_ids[0]


def test_ask_keeps_the_models_own_searcher_unless_told(demo_dir):
    skip_without_bm25s()
    from realm_hf.cli.arguments import choose_searcher
    from realm_hf.loading import load_open_qa
    from realm_hf.retrieval import ExactSearcher, HybridSearcher
    from realm_hf.retrieval.hybrid import hybrid_searcher_for

    model, _ = load_open_qa(demo_dir)
    own = model.searcher = hybrid_searcher_for(model, bm25_fraction=0.6)  # as a searcher.json would set it
    choose_searcher(model, None, None)
    assert model.searcher is own
    choose_searcher(model, None, 0.2)  # a new share of BM25 slots, the same BM25 index
    assert isinstance(model.searcher, HybridSearcher) and model.searcher.bm25_fraction == 0.2
    assert model.searcher.bm25 is own.bm25
    choose_searcher(model, "bm25", None)
    assert model.searcher.bm25_fraction == 1.0
    choose_searcher(model, "dense", None)
    assert isinstance(model.searcher, ExactSearcher)
    choose_searcher(model, "hybrid", None)  # from dense: the documented default share
    assert model.searcher.bm25_fraction == 0.4
    # --bm25-weight: a weighted hybrid keeps its weight unless told; BM25's candidates alone get none by default
    own = model.searcher = hybrid_searcher_for(model, bm25_fraction=0.6, bm25_weight=3.0)
    choose_searcher(model, None, 0.2)
    assert (model.searcher.bm25_fraction, model.searcher.bm25_weight) == (0.2, 3.0)
    choose_searcher(model, None, None, 0.5)
    assert (model.searcher.bm25_fraction, model.searcher.bm25_weight) == (0.2, 0.5)
    choose_searcher(model, "bm25", None)
    assert model.searcher.bm25_weight == 0.0
    choose_searcher(model, "hybrid", None, 4.0)
    assert model.searcher.bm25_weight == 4.0 and model.searcher.bm25 is own.bm25
    model.searcher = None  # the 4.x layout: no index, block_emb in the model; "dense" leaves it so
    choose_searcher(model, "dense", None)
    assert model.searcher is None


def test_ask_batches_give_the_answers_of_single_questions(demo_dir, capsys):
    questions = ["Who wrote Hamlet?", "What is the capital of Japan?", "Where does the Nile flow?"]
    main(["ask", "--model", str(demo_dir), "--json", "--batch-size", "3", *questions])
    batched = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    main(["ask", "--model", str(demo_dir), "--json", "--batch-size", "1", *questions])
    single = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # Padding a batch changes the float sums in the last bits: scores agree to rounding, everything else exactly.
    assert [line.pop("score") for line in batched] == pytest.approx([line.pop("score") for line in single], rel=1e-5)
    assert batched == single


def test_ask_top_k_prints_ranked_answers(demo_dir, capsys):
    questions = ["Who wrote Hamlet?", "Where is Rome?"]
    assert main(["ask", "--model", str(demo_dir), "--json", "--top-k", "3", *questions]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["question"], line["rank"]) for line in lines] == [
        ("Who wrote Hamlet?", 1), ("Who wrote Hamlet?", 2), ("Who wrote Hamlet?", 3),
        ("Where is Rome?", 1), ("Where is Rome?", 2), ("Where is Rome?", 3),
    ]  # fmt: skip
    for first, second in zip(lines, lines[1:]):
        if first["question"] == second["question"]:
            assert first["score"] >= second["score"]
    assert main(["ask", "--model", str(demo_dir), "--top-k", "2", "Who wrote Hamlet?"]) == 0
    out = capsys.readouterr().out
    assert out.count("Q: ") == 1 and "A: " in out and "A2: " in out and out.count("evidence [block ") == 2


def test_ask_marks_the_answer_in_its_evidence_and_reads_question_rows_from_stdin(demo_dir, capsys, monkeypatch):
    import io
    import sys

    assert main(["ask", "--model", str(demo_dir), "--json", "Who wrote Hamlet?"]) == 0
    answer = json.loads(capsys.readouterr().out)
    evidence, start, end = answer["evidence"], answer["start"], answer["end"]
    assert main(["ask", "--model", str(demo_dir), "Who wrote Hamlet?"]) == 0
    out = capsys.readouterr().out
    assert f"{evidence[:start]}«{evidence[start:end]}»{evidence[end:]}" in out  # the span read, marked in place
    # a question file piped in: its rows' questions are asked (not each row as one long question)
    rows = b'{"question": "Who wrote Hamlet?", "answers": ["Shakespeare"]}\n\nWhere is Rome?\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(rows), encoding="utf-8"))
    assert main(["ask", "--model", str(demo_dir), "--json"]) == 0
    asked = [json.loads(line)["question"] for line in capsys.readouterr().out.splitlines()]
    assert asked == ["Who wrote Hamlet?", "Where is Rome?"]


def test_ask_reads_unquoted_words_as_one_question(demo_dir, capsys):
    # `realm-hf ask Who wrote Hamlet?`: the shell splits the question at its spaces
    assert main(["ask", "--model", str(demo_dir), "--json", "Who", "wrote", "Hamlet?"]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["question"] for line in captured.out.splitlines()] == ["Who wrote Hamlet?"]
    assert "read the 3 words as one question, 'Who wrote Hamlet?'" in captured.err
    # quoted questions stay questions of their own, and so does one word
    assert main(["ask", "--model", str(demo_dir), "--json", "Who wrote Hamlet?", "Where is Rome?"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2 and "words as one question" not in captured.err
    assert main(["ask", "--model", str(demo_dir), "--json", "Hamlet?"]) == 0
    assert "words as one question" not in capsys.readouterr().err


def test_ask_rejects_a_top_k_below_one(demo_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["ask", "--model", str(demo_dir), "--top-k", "0", "q?"])
    assert exit_info.value.code == 2
    assert "expected a positive integer, got '0'" in capsys.readouterr().err


def test_ask_reports_a_bad_model_path(tmp_path, capsys):
    missing = str(tmp_path / "missing")
    assert main(["ask", "--model", missing, "q?"]) == 1
    err = capsys.readouterr().err
    # one cause, said once: not wrapped in the "could not load" message meant for directories that fail to load
    assert f"--model {missing!r}: no such directory" in err and "could not load" not in err
    assert len(err.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    assert main(["ask", "--model", str(tmp_path / "empty"), "q?"]) == 1
    assert "empty' holds no config.json: expected a model directory" in capsys.readouterr().err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "realm"}')  # and no weights
    assert main(["ask", "--model", str(tmp_path / "broken"), "q?"]) == 1
    assert "could not load a REALM open-QA model" in capsys.readouterr().err


def test_help_teaches(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "realm-hf ask" in out and "demo" in out
    assert out.startswith("usage: realm-hf [-h] [--debug] COMMAND ...\n")  # a command is expected
    with pytest.raises(SystemExit):
        main(["ask", "--help"])
    assert capsys.readouterr().out.startswith("usage: realm-hf ask [-h]")  # not prefixed with the line above


def test_help_names_every_index_subcommand():
    import argparse

    from realm_hf.cli.main import DESCRIPTION, build_parser

    index = build_parser()._subparsers._group_actions[0].choices["index"]
    subcommands = next(action for action in index._actions if isinstance(action, argparse._SubParsersAction))
    # "  index  build / add / eval / offload / compress: ..." in `realm-hf --help`
    line = next(line for line in DESCRIPTION.splitlines() if line.startswith("  index "))
    assert line.split(":")[0].split()[1::2] == ["build", "add", "eval", "offload", "compress"]
    assert set(line.split(":")[0].split()[1::2]) == set(subcommands.choices)


def test_device_flag_resolves_auto_and_names_a_missing_gpu(monkeypatch):
    import torch

    from realm_hf.cli.arguments import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"--device cuda:1: torch sees no GPU"):
        resolve_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")  # each torchrun process takes its own GPU
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"--device cuda:2: torch sees 2 GPU\(s\), cuda:0..1"):
        resolve_device("cuda:2")


def test_ask_on_a_missing_gpu_fails_before_loading(demo_dir, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["ask", "--model", str(demo_dir), "--device", "cuda", "Who wrote Hamlet?"]) == 1
    assert "--device cuda: torch sees no GPU" in capsys.readouterr().err


def test_an_interrupt_inside_a_finalizer_is_delivered_again_not_lost():
    """Python drops an exception raised in `__del__` ("Exception ignored in ..."): the CLI's SIGINT handler sends the
    signal again a moment later instead, so Ctrl-C during `import transformers` (whose garbage collection runs
    finalizers) still stops the command."""
    import inspect
    import signal
    import time

    from realm_hf.cli.main import interrupt

    class Finalized:
        def __del__(self):
            interrupt(signal.SIGINT, inspect.currentframe())  # as if the signal arrived right here

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            finalized = Finalized()
            del finalized  # the handler returned inside __del__ ...
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # ... and the signal comes back to ordinary code
                time.sleep(0.01)
        with pytest.raises(KeyboardInterrupt):
            interrupt(signal.SIGINT, inspect.currentframe())  # outside a finalizer: at once
    finally:
        signal.signal(signal.SIGINT, previous)


def test_control_characters_from_documents_print_as_escapes():
    from realm_hf.cli.main import _printable

    assert _printable("bell\x07 nul\x00 del\x7f tab\tline\nend") == "bell\\x07 nul\\x00 del\\x7f tab\tline end"


@pytest.mark.parametrize(
    ("module", "command", "argv", "again"),
    [
        ("evaluate", "cmd_evaluate", ["evaluate", "--data", "questions.jsonl"], "start over"),
        ("train", "cmd_train", ["train", "--model", "m", "--train-file", "t.jsonl", "--output-dir", "o"],
         "resume where it stopped"),
    ],
)  # fmt: skip
def test_an_interrupted_command_says_whether_a_rerun_resumes(monkeypatch, capsys, tmp_path, module, command, argv,
                                                              again):  # fmt: skip
    import importlib

    from realm_hf.cli import main as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)  # the input files exist: a missing one is named before the command runs
    for name in ("questions.jsonl", "t.jsonl"):
        (tmp_path / name).write_text("")
    monkeypatch.setattr(importlib.import_module(f"realm_hf.cli.{module}"), command, interrupted)
    assert cli.main(argv) == 130
    assert f"interrupted; run the same command again to {again}" in capsys.readouterr().err


def test_ask_says_why_it_is_not_sure_of_an_amount_of_money(capsys):
    from realm_hf.cli.main import _print_answers

    result = {"question": "How much did Tovarra pay for Sorrel Glassworks?", "rank": 1, "answer": "twelve glassblowers",
              "score": 0.4, "block_id": 3, "title": "news", "evidence": "Twelve glassblowers joined Tovarra.", "start": 0,
              "end": 19, "confidence": 0.52, "abstained": True, "threshold": 0.4, "unknown_names": [],
              "about_the_asker": [], "missing_units": ["money"]}  # fmt: skip
    _print_answers([result], as_json=False)
    out = capsys.readouterr().out
    assert "A: (not sure) twelve glassblowers  (score 0.400, confidence 0.52)" in out  # over the threshold: not why
    assert "   the question asks for an amount of money, and no passage read holds one" in out
    _print_answers([{**result, "missing_units": ["clock"]}], as_json=False)
    assert "   the question asks for a time of day, and no passage read holds one" in capsys.readouterr().out
    _print_answers([{**result, "missing_units": ["temperature"]}], as_json=False)
    assert "   the question asks for a temperature, and no passage read holds one" in capsys.readouterr().out
    _print_answers([{**result, "missing_units": ["email"]}], as_json=False)
    assert "   the question asks for an email address, and no passage read holds one" in capsys.readouterr().out
    _print_answers([{**result, "missing_units": [], "yes_or_no": True}], as_json=False)
    assert "   the question asks for a yes or a no; answers here are words of the passages: read the evidence" in (
        capsys.readouterr().out
    )

"""`realm-hf evaluate` on the untrained demo model: JSON keys, values in [0, 1], non-decreasing recall@k."""

import json

import pytest
import torch

from realm_hf.cli.main import main
from realm_hf.demo import ensure_demo_model, load_demo_corpus
from realm_hf.evaluation.realm import RealmOpenQASystem


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return ensure_demo_model(tmp_path_factory.mktemp("evaluate-demo"))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    rows = [
        {"question": "What is the capital of France?", "answers": ["Paris"], "relation": "capital"},
        {"question": "What is the capital of Italy?", "answer": ["Rome"], "relation": "capital"},
        {"question": "What is the largest planet in the Solar System?", "answer": "Jupiter", "relation": "planet"},
        {"question": "Who was a pioneer of computer science?", "answers": ["Alan Turing", "Turing"]},
    ]
    path = tmp_path_factory.mktemp("evaluate-data") / "questions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_evaluate_json(demo_dir, data_file, capsys):
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(data_file), "--k", "1,5,16", "--json"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert "Loading weights" not in captured.err
    assert metrics["primary_metric"] == "exact_match"
    assert metrics["num_questions"] == 4
    for key in ("exact_match", "official_exact_match", "f1", "reader_oracle", "recall@1", "recall@5", "recall@16"):
        assert 0.0 <= metrics[key] <= 1.0, key
    assert metrics["recall@1"] <= metrics["recall@5"] <= metrics["recall@16"]
    # Every demo answer is in the 16-passage corpus, so recall over all of it is 1.
    assert metrics["recall@16"] == 1.0
    assert metrics["capital/count"] == 2 and metrics["planet/count"] == 1


def test_evaluate_table_and_limit(demo_dir, data_file, capsys):
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(data_file), "--limit", "2", "--k", "1"]) == 0
    out = capsys.readouterr().out
    assert "exact_match" in out and "recall@1" in out and "num_questions  2" not in out
    assert any(line.split() == ["num_questions", "2"] for line in out.splitlines())


def test_retrieve_goes_past_the_reader_beam_and_starts_with_the_blocks_read(demo_dir):
    system = RealmOpenQASystem.from_pretrained(demo_dir)
    questions = ["What is the capital of France?", "Who wrote Hamlet?"]
    num_blocks = len(load_demo_corpus())
    ids = system.retrieve_ids(questions, 100)
    assert ids.shape == (2, num_blocks) and system.reader_beam_size < num_blocks
    inputs = system.retriever.tokenizer(questions, padding=True, return_tensors="pt")
    with torch.no_grad():
        read = system.model.score_spans(**inputs).retrieved_block_ids
    assert torch.equal(ids[:, : system.reader_beam_size], read[:, : system.reader_beam_size].cpu())
    assert [len(texts) for texts in system.retrieve(questions, 5)] == [5, 5]


def test_evaluate_reports_bad_data(demo_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "no question key"}\n', encoding="utf-8")
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(bad)]) == 1
    assert "expected a 'question'" in capsys.readouterr().err


def test_evaluate_leaves_out_unanswerable_questions_and_checks_regex_answers(demo_dir, tmp_path, capsys):
    data = tmp_path / "mixed.jsonl"
    data.write_text(json.dumps({"question": "What is the capital of France?", "answers": ["Paris"]}) + "\n"
                    + json.dumps({"question": "Who is my neighbour?", "answers": []}) + "\n")  # fmt: skip
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(data), "--k", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert f"note: 1 question(s) of {data} without answers left out" in captured.err
    assert json.loads(captured.out)["num_questions"] == 1
    regex = tmp_path / "regex.jsonl"
    regex.write_text(json.dumps({"question": "What is the capital of France?", "answers": ["Par(is"]}) + "\n")
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(regex), "--regex"]) == 2
    assert "--regex: answer 'Par(is' of" in capsys.readouterr().err

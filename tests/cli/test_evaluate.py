"""`realm-hf evaluate` on the untrained demo model: JSON keys, values in [0, 1], non-decreasing recall@k."""

import json

import pytest
import torch
from conftest import skip_without_bm25s

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
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(data_file), "--json", "--quiet"]) == 0
    quiet = capsys.readouterr()
    assert json.loads(quiet.out)["num_questions"] == 4 and "answering" not in quiet.err
    for key in ("exact_match", "official_exact_match", "f1", "reader_oracle", "recall@1", "recall@5", "recall@16"):
        assert 0.0 <= metrics[key] <= 1.0, key
    assert metrics["recall@1"] <= metrics["recall@5"] <= metrics["recall@16"]
    # Every demo answer is in the 16-passage corpus, so recall over all of it is 1.
    assert metrics["recall@16"] == 1.0
    assert metrics["capital/count"] == 2 and metrics["planet/count"] == 1


def test_evaluate_table_and_limit(demo_dir, data_file, capsys):
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(data_file), "--limit", "2", "--k", "1"]) == 0
    out, err = capsys.readouterr()
    # a progress bar per pass over the questions, on stderr
    assert "answering: 100%" in err and "retrieving: 100%" in err and "2/2" in err
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


def test_evaluate_reads_the_blocks_of_the_searcher_asked_for(demo_dir, data_file, capsys):
    """`--searcher bm25`: recall@k counts BM25's blocks, and the answers are those `ask --searcher bm25` gives (the same reader over BM25's blocks: the baseline the default model's card compares with)."""
    skip_without_bm25s()
    from realm_hf.evaluation.metrics import exact_match, has_answer
    from realm_hf.retrieval.bm25 import BM25Searcher

    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    questions, answers = [row["question"] for row in rows], [row.get("answers", row.get("answer")) for row in rows]
    answers = [[references] if isinstance(references, str) else references for references in answers]
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(data_file), "--k", "1,2", "--json",
                 "--searcher", "bm25"]) == 0  # fmt: skip
    metrics = json.loads(capsys.readouterr().out)
    records = RealmOpenQASystem.from_pretrained(demo_dir).retriever.block_records
    texts = [records[index].decode() for index in range(len(records))]
    found = BM25Searcher.from_documents(texts).search_text(questions, 2).ids.tolist()
    # the deepest cut-off holds BM25's first 2 blocks (in the order the model's relevance gives them, as it reads them)
    hits = [any(has_answer(texts[block], references) for block in ids) for ids, references in zip(found, answers)]
    assert metrics["recall@2"] == pytest.approx(sum(hits) / len(hits))
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(data_file), "--k", "1,2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recall@2"] != metrics["recall@2"]  # dense search finds others
    assert main(["ask", "--model", str(demo_dir), "--json", "--searcher", "bm25", *questions]) == 0
    asked = [json.loads(line)["answer"] for line in capsys.readouterr().out.splitlines()]
    assert metrics["exact_match"] == pytest.approx(
        sum(exact_match(answer, references) for answer, references in zip(asked, answers)) / len(rows)
    )


def test_evaluate_writes_each_questions_answer_with_predictions(demo_dir, data_file, tmp_path, capsys):
    predictions = tmp_path / "predictions.jsonl"
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(data_file), "--json", "--k", "1",
                 "--predictions", str(predictions)]) == 0  # fmt: skip
    metrics = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in predictions.read_text(encoding="utf-8").splitlines()]
    assert [row["question"] for row in rows] == [
        json.loads(line)["question"] for line in data_file.read_text().splitlines()
    ]
    assert rows[2]["answers"] == ["Jupiter"]  # a single "answer" string, as a list
    assert sum(row["exact_match"] for row in rows) / len(rows) == pytest.approx(metrics["exact_match"])
    # the same answers as the pipeline's
    assert main(["ask", "--model", str(demo_dir), "--json", *[row["question"] for row in rows]]) == 0
    assert [json.loads(line)["answer"] for line in capsys.readouterr().out.splitlines()] == [
        row["prediction"] for row in rows
    ]
    assert main(["evaluate", "--model", str(demo_dir), "--data", str(data_file), "--predictions", str(tmp_path)]) == 2
    assert "--predictions expects a file to write in an existing directory" in capsys.readouterr().err


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

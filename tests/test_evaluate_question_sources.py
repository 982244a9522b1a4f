"""`examples/evaluate_question_sources.py` end to end on the tiny demo model: per-source dev results for dense / BM25 /
hybrid candidates, the searcher choice and a fitted calibration, with questions naming what no block holds abstained.

The demo model is untrained, so half of each source's gold answers are the model's own answers: the calibration then
has right and wrong answers to fit, as on a real model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import pipeline

from realm_hf.data.question_sources import SOURCES
from realm_hf.demo import ensure_demo_model, load_demo_corpus
from realm_hf.pipelines.open_qa import answers_with_features

ROOT = Path(__file__).parents[1]


def _questions(open_qa, passages: list[dict] | None = None) -> list[dict]:
    """A question about each demo passage: every other one is answered with the model's own answer (right), the rest
    with an answer no passage holds (wrong). The model's answers as the script reads them (batches of 4): one question
    at a time, the untrained model's near-tied spans may come out in another order."""
    questions = [f"What do we know about {passage['title']}?" for passage in passages or load_demo_corpus()]
    answers = [result["answer"] for result in answers_with_features(open_qa, questions, batch_size=4)]
    return [{"question": question, "answers": [answer if index % 2 == 0 else "nothing at all"]}
            for index, (question, answer) in enumerate(zip(questions, answers, strict=True))]  # fmt: skip


def _document_set(folder: Path, model_dir: Path, passages: list[dict]) -> Path:
    """A set of documents and questions as examples/document_calibration holds them, over `passages` (one file each):
    a question about each, answered with the model's own answer over an index of these documents alone (right) for
    every other one, else with one no document holds (wrong), and one unanswerable question."""
    from realm_hf.cli.main import main as cli

    (folder / "corpus").mkdir(parents=True)
    for number, passage in enumerate(passages):
        (folder / "corpus" / f"note_{number}.txt").write_text(f"{passage['title']}: {passage['text']}\n")
    assert cli(["index", "build", "--model", str(model_dir), "--corpus", str(folder / "corpus"), "--output",
                str(folder.parent / f"{folder.name}-index"), "--quiet"]) == 0  # fmt: skip
    open_qa = pipeline("open-qa", model=str(model_dir), index=str(folder.parent / f"{folder.name}-index"),
                       device="cpu")  # fmt: skip
    rows = _questions(open_qa, passages)
    rows.append({"question": "What did I pay for my ticket?", "answers": []})
    (folder / "questions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_calibration_is_fitted_and_names_no_block_holds_are_abstained(tmp_path):
    model_dir = ensure_demo_model(tmp_path / "model")
    open_qa = pipeline("open-qa", model=str(model_dir), device="cpu")
    rows = _questions(open_qa)
    questions = tmp_path / "questions"
    questions.mkdir()
    unanswerable = [{"question": f"Who is the king of {name}?", "answers": []} for name in ("Zanzanryx", "Oraryxdor")]
    unanswerable += [{"question": "What is the capital of my garden?", "answers": []}]
    for source in SOURCES:
        for split in ("dev", "test"):
            source_rows = unanswerable if source == "unanswerable" else rows
            with open(questions / f"{source}.{split}.jsonl", "w", encoding="utf-8") as file:
                file.writelines(json.dumps({**row, "source": source}) + "\n" for row in source_rows)
    (questions / "counts.json").write_text(json.dumps({source: {"dev": 1} for source in SOURCES}))
    check = tmp_path / "check.jsonl"
    check.write_text("".join(json.dumps(row) + "\n" for row in rows[:4]))
    passages = load_demo_corpus()
    documents = [_document_set(tmp_path / "documents" / name, model_dir, passages[start : start + 6])
                 for name, start in (("leases", 0), ("letters", 5), ("manuals", 10))]  # fmt: skip
    output = tmp_path / "results.json"
    command = [sys.executable, "examples/evaluate_question_sources.py", "--model", str(model_dir), "--questions",
               str(questions), "--output", str(output), "--max-read-per-source", "16", "--max-test-per-source", "8",
               "--batch-size", "4", "--choose-searcher", "--fit-calibration", "--check-questions", str(check),
               "--dev-budget", "0.5", "--max-correct-abstained", "0.5",
               "--document-sets", str(documents[0]), str(documents[1]), "--check-document-sets", str(documents[2])]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads(output.read_text())
    assert set(report["dev"]["factbook"]) == {"dense", "bm25", "hybrid"}
    assert report["dev"]["factbook"]["dense"]["read"] == len(rows)
    # The model's own answers are right, the made-up ones never: EM is the share of the former.
    assert report["dev"]["factbook"]["dense"]["exact_match"] == pytest.approx(0.5)
    assert report["searcher_choice"]["chosen"] in ("dense", "hybrid")
    calibration = json.loads((model_dir / "calibration.json").read_text())
    assert calibration["features"] and 0.0 <= calibration["threshold"] <= 1.0
    # The two questions naming places no block holds, and the one about the asker's garden (the demo corpus speaks
    # to no one), are abstained on, whatever their confidence.
    metadata = calibration["metadata"]
    answerable_sources = len(SOURCES) - 1
    read = f"3 of {answerable_sources * len(rows) + 3} dev questions, 3 of {answerable_sources * 8 + 3} test questions"
    assert read in metadata["unknown_names"], metadata["unknown_names"]
    assert report["calibration"]["test"]["unanswerable_abstained"] >= 2 / 3
    assert set(report["calibration"]["check"]) == {"check", "documents/manuals"}
    # The threshold over a user's documents, chosen on the two sets: at most half of their right answers abstained
    # (--max-correct-abstained), each set also measured at the threshold chosen on the other.
    documents = report["calibration"]["documents"]
    assert documents["fitted_on"] == ["documents/leases", "documents/letters"]
    assert documents["right"] == 6 and documents["unanswerable"] == 2
    assert calibration["documents_threshold"] == documents["threshold"]
    assert documents["rates"]["correct_abstained"] <= 0.5
    assert set(documents["leave_one_set_out"]) == {"documents/leases", "documents/letters"}
    assert metadata["documents"]["fitted_on"] == documents["fitted_on"]
    assert report["calibration"]["check"]["documents/manuals"]["read"] == 7
    # and the pipeline abstains on them too, with the calibration the script wrote
    calibrated = pipeline("open-qa", model=str(model_dir), device="cpu")
    assert calibrated("Who is the king of Zanzanryx?")["abstained"] is True
    assert calibrated("What is the capital of my garden?")["abstained"] is True

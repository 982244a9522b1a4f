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


def _questions(open_qa) -> list[dict]:
    """A question about each demo passage: every other one is answered with the model's own answer (right), the rest
    with an answer no passage holds (wrong). The model's answers as the script reads them (batches of 4): one question
    at a time, the untrained model's near-tied spans may come out in another order."""
    questions = [f"What do we know about {passage['title']}?" for passage in load_demo_corpus()]
    answers = [result["answer"] for result in answers_with_features(open_qa, questions, batch_size=4)]
    return [{"question": question, "answers": [answer if index % 2 == 0 else "nothing at all"]}
            for index, (question, answer) in enumerate(zip(questions, answers, strict=True))]  # fmt: skip


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
    output = tmp_path / "results.json"
    command = [sys.executable, "examples/evaluate_question_sources.py", "--model", str(model_dir), "--questions",
               str(questions), "--output", str(output), "--max-read-per-source", "16", "--max-test-per-source", "8",
               "--batch-size", "4", "--choose-searcher", "--fit-calibration", "--check-questions", str(check),
               "--dev-budget", "0.5", "--max-correct-abstained", "0.5"]  # fmt: skip
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
    assert set(report["calibration"]["check"]) == {"check"}
    # and the pipeline abstains on them too, with the calibration the script wrote
    calibrated = pipeline("open-qa", model=str(model_dir), device="cpu")
    assert calibrated("Who is the king of Zanzanryx?")["abstained"] is True
    assert calibrated("What is the capital of my garden?")["abstained"] is True

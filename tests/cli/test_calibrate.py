"""`realm-hf calibrate`: a model without calibration.json (as `realm-hf train` writes one) gets a fitted confidence and
threshold from a dev file, which `realm-hf ask` then reads. The demo model is untrained, so every other gold answer is
the model's own answer: the fit has right and wrong answers, as on a real model."""

import json

import pytest
from transformers import pipeline

from realm_hf.cli.main import main
from realm_hf.demo import ensure_demo_model, load_demo_corpus
from realm_hf.evaluation.calibration import Calibration
from realm_hf.pipelines.open_qa import answers_with_features


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = ensure_demo_model(tmp_path_factory.mktemp("calibrate") / "model")
    assert not (directory / "calibration.json").exists()
    return directory


def _dev_file(model_dir, path):
    open_qa = pipeline("open-qa", model=str(model_dir), device="cpu")
    questions = [f"What do we know about {passage['title']}?" for passage in load_demo_corpus()]
    # The answers as calibrate reads them (batches of 8): the untrained model's near-tied spans may come out in another
    # order one question at a time.
    answers = [result["answer"] for result in answers_with_features(open_qa, questions, batch_size=8)]
    rows = [{"question": question, "answers": [answer if index % 2 == 0 else "nothing at all"]}
            for index, (question, answer) in enumerate(zip(questions, answers, strict=True))]  # fmt: skip
    rows += [{"question": "What will the weather be tomorrow?", "answers": []},
             {"question": "Who is the king of Zanzanryx?", "answers": []}]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return rows


def test_calibrate_writes_a_calibration_that_ask_reads(model_dir, tmp_path, capsys):
    rows = _dev_file(model_dir, tmp_path / "dev.jsonl")
    assert main(["ask", "--model", str(model_dir), "--json", rows[0]["question"]]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["confidence"] is None  # no calibration yet

    assert main(["calibrate", "--model", str(model_dir), "--data", str(tmp_path / "dev.jsonl"),
                 "--max-correct-abstained", "0.5"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert "answering: 100%" in err and f"{len(rows)}/{len(rows)}" in err  # a progress bar
    right = (len(rows) - 2 + 1) // 2  # the model's own answers
    assert summary["questions"] == len(rows) and summary["answerable"] == len(rows) - 2
    assert summary["correct"] == right and summary["correct_abstained"] <= 0.5
    calibration = Calibration.load(model_dir / "calibration.json")
    assert calibration.features == ["log_kind_span_probability", "kind_margin", "question_coverage"]
    assert calibration.threshold == summary["threshold"] and calibration.metadata["fitted_by"] == "realm-hf calibrate"

    assert (
        main(["ask", "--model", str(model_dir), "--json", rows[0]["question"], "Who is the king of Zanzanryx?"]) == 0
    )
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(0.0 <= answer["confidence"] <= 1.0 for answer in answers)
    assert answers[1]["abstained"] is True  # a name no document mentions

    # A second fit keeps the first as calibration.previous.json.
    first = (model_dir / "calibration.json").read_text()
    assert main(["calibrate", "--model", str(model_dir), "--data", str(tmp_path / "dev.jsonl"), "--quiet"]) == 0
    assert (model_dir / "calibration.previous.json").read_text() == first
    assert "previous calibration is now" in (err := capsys.readouterr().err) and "answering" not in err


def test_calibrate_refuses_the_default_model(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REALM_HF_DEFAULT_MODEL", str(model_dir))
    (tmp_path / "dev.jsonl").write_text('{"question": "q?", "answers": ["a"]}\n', encoding="utf-8")
    assert main(["calibrate", "--model", str(model_dir), "--data", str(tmp_path / "dev.jsonl")]) == 2
    assert "is the default model" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("rows", "argv", "message"),
    [([{"question": "What is the capital of France?", "answers": ["nothing at all"]}] * 3, [],
      "the model answers 0 of 3 questions right; fitting a confidence needs at least 2 right and 2 wrong"),
     ([], ["--max-correct-abstained", "2"], "expected a number between 0 and 1, received '2'"),
     ([{"question": "What is the capital of France?", "answers": ["x"]}] * 3, ["--features", "loudness"],
      "--features: expected names among")],
)  # fmt: skip
def test_calibrate_refuses_what_it_cannot_fit(model_dir, tmp_path, capsys, rows, argv, message):
    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows) or "\n", encoding="utf-8")
    try:
        returned = main(["calibrate", "--model", str(model_dir), "--data", str(data), *argv])
    except SystemExit as exit_info:  # argparse's usage errors
        returned = exit_info.code
    assert returned in (1, 2)
    assert message in capsys.readouterr().err.strip().splitlines()[-1]

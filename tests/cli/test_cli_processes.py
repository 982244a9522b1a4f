"""`realm-hf` as real processes: what needs a fresh interpreter (imports at start-up), real standard input bytes, or
a real signal."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from realm_hf.demo import ensure_demo_model
from realm_hf.retrieval.document_store import DocumentStore
from realm_hf.retrieval.index_files import read_manifest

SOURCE = str(Path(__file__).parents[2] / "src")
ENV = dict(os.environ, PYTHONPATH=SOURCE + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")

_HEAVY_AFTER = """
import sys
import realm_hf_cli
try:
    code = realm_hf_cli.main(sys.argv[1:])
except SystemExit as exit_info:
    code = exit_info.code
heavy = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "transformers", "datasets", "numpy"))
print("HEAVY", heavy, "CODE", code)
"""


@pytest.mark.parametrize(
    ("argv", "code"),
    [(["--help"], 0), (["index", "build", "--help"], 0), (["ask", "--top-k", "0", "q?"], 2), (["index", "build"], 2),
     (["train", "--help"], 0), (["convert", "--help"], 0), (["evaluate"], 2), (["pretrain", "--help"], 0),
     (["train", "--model", "m", "--train-file", "t", "--output-dir", "o", "--batch-size", "0", "--weight_decay", "0"],
      2),
     # inputs that do not exist: named before torch loads (about 6 s), not after
     (["ask", "--index", "no-such-index", "q?"], 1), (["index", "build", "--corpus", "no-such.jsonl", "--output", "o"], 1),
     (["evaluate", "--data", "no-such.jsonl"], 1), (["ask", "--model", "./no-such-model", "q?"], 1)],
)  # fmt: skip
def test_help_usage_errors_and_missing_inputs_come_before_any_heavy_import(argv, code):
    result = subprocess.run([sys.executable, "-c", _HEAVY_AFTER, *argv], capture_output=True, text=True, env=ENV)
    assert result.stdout.strip().splitlines()[-1] == f"HEAVY [] CODE {code}", result.stderr[-2000:]
    if code != 0:
        assert len(result.stderr.strip().splitlines()) == 1 and "error: " in result.stderr
    if code == 1:
        assert "no such" in result.stderr or "does not exist" in result.stderr


def test_a_command_sees_the_package_as_after_import_realm_hf(tmp_path):
    """The entry point defers realm_hf/__init__.py, and runs it before any command: the Auto classes and the
    "open-qa" task are registered as after `import realm_hf`."""
    program = (
        "import sys, realm_hf_cli\n"
        "code = realm_hf_cli.main(['index', 'eval', '--index', sys.argv[1]])\n"
        "import realm_hf\n"
        "from transformers import AutoConfig\n"
        "from transformers.pipelines import PIPELINE_REGISTRY\n"
        "print('CODE', code, 'open-qa' in PIPELINE_REGISTRY.get_supported_tasks(), "
        "type(AutoConfig.for_model('realm')) is realm_hf.RealmConfig)\n"
    )
    # a directory that is no index: an error the command itself finds, after the package's import
    result = subprocess.run([sys.executable, "-c", program, str(tmp_path)], capture_output=True, text=True, env=ENV)
    assert result.stdout.strip().splitlines()[-1] == "CODE 1 True True", result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("realm-hf index eval: error: ")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


def test_stdin_bytes_that_are_not_utf8_name_the_offset(demo_dir):
    result = subprocess.run([sys.executable, "-m", "realm_hf_cli", "ask", "--model", str(demo_dir)],
                            input=b"Where is Paris?\nwho wrote caf\xe9?\n", capture_output=True, env=ENV)  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 1, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        "realm-hf ask: error: standard input line 2: expected UTF-8 text, received byte 0xe9 at byte offset 29"
    )
    assert "Traceback" not in err and result.stdout == b""


def test_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    from realm_hf.cli.main import main
    from realm_hf.errors import MissingFileError

    command = ["index", "build", "--model", str(tmp_path / "nope"), "--corpus", str(tmp_path / "c.jsonl"), "--output",
               str(tmp_path / "out")]  # fmt: skip
    # in a real process, --debug lets the exception out with its traceback on stderr (one process: each costs ~10 s)
    loud = subprocess.run([sys.executable, "-m", "realm_hf_cli", *command, "--debug"], capture_output=True, text=True,
                          env=ENV)  # fmt: skip
    assert loud.returncode == 1 and "Traceback" in loud.stderr and "MissingFileError" in loud.stderr
    # without it one line, and REALM_HF_DEBUG=1 does what --debug does
    monkeypatch.delenv("REALM_HF_DEBUG", raising=False)
    assert main(command) == 1
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr and "does not exist" in stderr and len(stderr.strip().splitlines()) == 1
    monkeypatch.setenv("REALM_HF_DEBUG", "1")
    with pytest.raises(MissingFileError):
        main(command)


@pytest.mark.slow
def test_sigint_to_a_background_build_stops_it_and_the_rerun_resumes(demo_dir, tmp_path):
    """SIGINT sent to the build's process alone, started as a non-interactive shell starts a background job (SIGINT
    ignored): it stops with one line and exit code 130, leaves no index.json, and the same command resumes."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"title": f"Doc {i}", "text": "Paris is the capital of France, a city of "
                                          f"many bridges and museums, number {i}."}) + "\n" for i in range(3000)))  # fmt: skip
    output = tmp_path / "index"
    argv = [sys.executable, "-m", "realm_hf_cli", "index", "build", "--model", str(demo_dir), "--corpus", str(corpus),
            "--output", str(output), "--shard-size", "100", "--batch-size", "16", "--quiet"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    deadline = time.monotonic() + 300
    while not list(output.glob("embeddings-*.safetensors")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, "the build ended before it could be interrupted"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        "realm-hf index build: interrupted; run the same command again to resume where it stopped"
    )
    assert "Traceback" not in err and not (output / "index.json").exists()
    resumed = subprocess.run(argv, capture_output=True, text=True, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "indexed 3000 blocks" in resumed.stdout
    assert f"note: resuming the interrupted build in {output} (--overwrite starts it again)" in resumed.stderr
    assert len(DocumentStore.load(output / "documents")) == read_manifest(output)["num_blocks"] == 3000

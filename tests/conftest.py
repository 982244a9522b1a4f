"""Shared fixtures: tiny configs and vocabularies built in code, and an offline Hub cache. No test touches the network."""

import os
import tempfile

# Before anything imports huggingface_hub: no network, no telemetry, and a private cache per test session.
_SESSION_HOME = tempfile.mkdtemp(prefix="realm_hf_test_home_")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HOME"] = _SESSION_HOME
os.environ["HF_HUB_CACHE"] = os.path.join(_SESSION_HOME, "hub")
os.environ["REALM_HF_HOME"] = os.path.join(_SESSION_HOME, "realm_hf")  # demo model and corpus caches
os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"
# fp32 wherever a command would pick its precision itself ("auto" is bf16 on CPUs with AVX512-BF16/AMX): results then
# do not depend on the machine the suite runs on. The tests of the bf16 paths ask for bf16 or clear this variable.
os.environ.setdefault("REALM_HF_PRECISION", "fp32")

import importlib.util  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from realm_hf import RealmConfig  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"

# The vocabulary of transformers 4.x's REALM retrieval tests: "a" and "longer" are missing and become [UNK].
RETRIEVAL_TEST_VOCAB = [
    "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "test", "question", "this", "is", "the", "first", "second",
    "third", "fourth", "fifth", "record", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",", "low", "lowest",
]  # fmt: skip


def tiny_config(**overrides) -> RealmConfig:
    """A REALM config small enough to build and run every model in milliseconds."""
    fields = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        retriever_proj_size=16,
        num_candidates=3,
        span_hidden_size=16,
        max_span_width=3,
        reader_beam_size=2,
        searcher_beam_size=4,
        num_block_records=6,
        reader_seq_len=32,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    fields.update(overrides)
    return RealmConfig(**fields)


def skip_without_bm25s() -> None:
    """Skips the calling test where `bm25s` is not installed. It does not import `bm25s`: realm_hf imports it with
    JAX hidden (`realm_hf.retrieval.bm25`), and `pytest.importorskip` would start JAX on a GPU machine."""
    if importlib.util.find_spec("bm25s") is None:
        pytest.skip("bm25s is not installed")


def write_vocab(directory: Path, tokens: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "vocab.txt"
    path.write_text("".join(token + "\n" for token in tokens), encoding="utf-8")
    return path


@pytest.fixture
def retrieval_vocab_file(tmp_path) -> Path:
    return write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB)


def seed_hub_cache(repo_id: str, source_dir: Path, revision: str = "0" * 40) -> Path:
    """Places `source_dir`'s files in the Hub cache as `repo_id`'s main revision, so that repo ids resolve offline."""
    cache = Path(os.environ["HF_HUB_CACHE"])
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / revision
    if snapshot.exists():
        shutil.rmtree(snapshot)
    shutil.copytree(source_dir, snapshot)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return snapshot


def torchrun(nproc: int = 2) -> list[str]:
    """The command prefix that runs a script or `-m module` as `nproc` local processes (gloo on CPU), on a free port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
            "127.0.0.1", "--master_port", str(port)]  # fmt: skip

"""Property-based tests (hypothesis) of every reader of user files: a valid file, then truncated, with bytes
flipped, or with bytes inserted, must give either a result or one of the named errors (a `ValueError` or `OSError`;
for the index and corpus readers, the project's own `RealmHfError`), within a few seconds, and the file on disk must
not change."""

import contextlib
import hashlib
import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from realm_hf.checkpoints import describe_damaged_weights
from realm_hf.conversion.tf_reader import TFCheckpointReader, TFRecordFile, write_tfrecords
from realm_hf.errors import RealmHfError
from realm_hf.retrieval.block_records import load_block_records, save_block_records
from realm_hf.retrieval.document_store import DocumentStore
from realm_hf.retrieval.index_builder import write_index
from realm_hf.retrieval.index_files import open_embedding_shard, read_manifest

TF_FIXTURES = Path(__file__).parent / "fixtures" / "tf"
SECONDS_PER_READ = 10
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))

RECORDS = [{"title": f"Doc {i}", "text": f"Paris is the capital of France, number {i}."} for i in range(5)]


@st.composite
def damage(draw, size: int):
    """A function that damages bytes: truncation, flipped bytes, or inserted bytes."""
    kind = draw(st.sampled_from(["truncate", "flip", "insert"]))
    if kind == "truncate":
        end = draw(st.integers(0, max(size - 1, 0)))
        return lambda data: data[:end]
    if kind == "flip":
        flips = draw(
            st.lists(st.tuples(st.integers(0, max(size - 1, 0)), st.integers(1, 255)), min_size=1, max_size=4)
        )

        def flip(data: bytes) -> bytes:
            changed = bytearray(data)
            for position, mask in flips:
                changed[position] ^= mask
            return bytes(changed)

        return flip
    position, extra = draw(st.integers(0, size)), draw(st.binary(min_size=1, max_size=16))
    return lambda data: data[:position] + extra + data[position:]


@contextlib.contextmanager
def time_limit(seconds: int):
    """Raises TimeoutError in the main thread if the block runs longer than `seconds` (a reader that hangs)."""

    def expire(signum, frame):
        raise TimeoutError(f"a reader ran longer than {seconds} s on a damaged file")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_reader(path: Path, original: bytes, damaged: Callable[[bytes], bytes], read: Callable[[Path], object],
                 allowed: tuple[type[BaseException], ...] = (ValueError, OSError)) -> None:  # fmt: skip
    """Writes the damaged bytes to `path`, reads them with `read`, and checks the outcome and that nothing changed."""
    path.write_bytes(damaged(original))
    before = _digest(path)
    try:
        with time_limit(SECONDS_PER_READ):
            read(path)
    except TimeoutError:
        raise
    except allowed as error:
        assert str(error), f"{type(error).__name__} without a message"
    except Exception as error:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{type(error).__name__} is not one of {[kind.__name__ for kind in allowed]}: {error!r:.300}")
    assert _digest(path) == before, "the reader modified its input"


def _consume(value) -> None:
    """Reads every element of what a reader returned, so that lazy readers do their work."""
    if isinstance(value, DocumentStore):
        for start in range(0, len(value), 100):
            value.get(range(start, min(start + 100, len(value))))
    elif hasattr(value, "__len__") and hasattr(value, "__getitem__"):
        for index in range(len(value)):
            value[index]


# --- the user's corpora ------------------------------------------------------------------------------------------


def _corpus_bytes(kind: str, directory: Path) -> bytes:
    if kind == "jsonl":
        return "".join(json.dumps(record) + "\n" for record in RECORDS).encode()
    if kind in ("csv", "tsv"):
        separator = "," if kind == "csv" else "\t"
        return ("title" + separator + "text\n" + "".join(
            f"{record['title']}{separator}\"{record['text']}\"\n" for record in RECORDS)).encode()  # fmt: skip
    path = directory / "sample.parquet"
    pq.write_table(pa.table({"title": [r["title"] for r in RECORDS], "text": [r["text"] for r in RECORDS]}), path)
    return path.read_bytes()


@pytest.mark.parametrize("kind", ["jsonl", "csv", "tsv", "parquet"])
def test_corpus_import_survives_damage(kind, tmp_path):
    original = _corpus_bytes(kind, tmp_path)
    assert len(DocumentStore.from_file(_written(tmp_path / f"good.{kind}", original))) == len(RECORDS)

    @FUZZ
    @given(damaged=damage(len(original)))
    def run(damaged):
        check_reader(tmp_path / f"damaged.{kind}", original, damaged, lambda p: _consume(DocumentStore.from_file(p)),
                     allowed=(RealmHfError,))  # fmt: skip

    run()


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- block records -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".safetensors", ".npy"])
def test_block_records_survive_damage(suffix, tmp_path):
    records = [record["text"].encode() for record in RECORDS]
    good = tmp_path / f"good{suffix}"
    if suffix == ".npy":
        np.save(good, np.array(records, dtype=object), allow_pickle=True)  # the 4.x layout, as on the Hub
    else:
        save_block_records(records, good)
    original = good.read_bytes()
    assert [bytes(record) for record in load_block_records(good)] == records

    @FUZZ
    @given(damaged=damage(len(original)))
    def run(damaged):
        check_reader(tmp_path / f"damaged{suffix}", original, damaged, lambda p: _consume(load_block_records(p)))

    run()


# --- index files -------------------------------------------------------------------------------------------------


def test_index_manifest_and_shards_survive_damage(tmp_path):
    good = tmp_path / "good"
    write_index(torch.randn(7, 4), good, shard_size=4)
    manifest, shard = (good / "index.json").read_bytes(), (good / "embeddings-00000.safetensors").read_bytes()
    damaged_dir = tmp_path / "damaged"
    shutil.copytree(good, damaged_dir)

    @FUZZ
    @given(damaged=damage(len(manifest)))
    def run_manifest(damaged):
        check_reader(damaged_dir / "index.json", manifest, damaged, lambda p: read_manifest(p.parent),
                     allowed=(RealmHfError,))  # fmt: skip

    @FUZZ
    @given(damaged=damage(len(shard)))
    def run_shard(damaged):
        check_reader(damaged_dir / "embeddings-00000.safetensors", shard, damaged,
                     lambda p: float(np.asarray(open_embedding_shard(p), dtype=np.float64).sum()),
                     allowed=(RealmHfError,))  # fmt: skip

    run_manifest()
    run_shard()


# --- TensorFlow files --------------------------------------------------------------------------------------------


def test_tfrecords_survive_damage(tmp_path):
    original = write_tfrecords(tmp_path / "good.tfr", [record["text"].encode() for record in RECORDS]).read_bytes()

    @FUZZ
    @given(damaged=damage(len(original)))
    def run(damaged):
        check_reader(tmp_path / "damaged.tfr", original, damaged, lambda p: (len(TFRecordFile(p)),
                                                                             list(TFRecordFile(p))))  # fmt: skip

    run()


@pytest.mark.parametrize("part", ["index", "data-00000-of-00001"])
def test_tf_tensor_bundles_survive_damage(part, tmp_path):
    directory = tmp_path / "encoded"
    shutil.copytree(TF_FIXTURES / "encoded", directory)
    prefix = directory / "encoded.ckpt"
    target = Path(f"{prefix}.{part}")
    original = target.read_bytes()

    def read_all(path: Path):
        reader = TFCheckpointReader(prefix)
        return [reader.read(name) for name in reader]

    assert read_all(target)

    @FUZZ
    @given(damaged=damage(len(original)))
    def run(damaged):
        check_reader(target, original, damaged, read_all)

    run()


# --- checkpoint diagnosis ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".safetensors", ".bin"])
def test_checkpoint_diagnosis_survives_damage(suffix, tmp_path):
    good = tmp_path / f"model{suffix}"
    tensors = {"a.weight": torch.randn(3, 4), "b.bias": torch.randn(5)}
    if suffix == ".safetensors":
        save_file(tensors, good)
    else:
        torch.save(tensors, good)
    original = good.read_bytes()
    assert describe_damaged_weights(good) is None

    def diagnose(path: Path):
        assert isinstance(describe_damaged_weights(path), str | None)

    @FUZZ
    @given(damaged=damage(len(original)))
    def run(damaged):
        check_reader(tmp_path / f"damaged{suffix}", original, damaged, diagnose)

    run()

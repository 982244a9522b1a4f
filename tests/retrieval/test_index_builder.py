"""The index builder: embeddings equal the model's, resumption after interruption, appending, settings checks."""

import json

import numpy as np
import pytest
import torch
from conftest import tiny_config

from realm_hf import RealmEmbedder, RealmTokenizer
from realm_hf.errors import UsageError
from realm_hf.retrieval.embedding import embed_blocks, encode_blocks
from realm_hf.retrieval.index_builder import BUILD_SETTINGS_NAME, add_to_index, build_index, index_add_command
from realm_hf.retrieval.index_files import open_index_shards, shard_file_name

WORDS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(40)]


@pytest.fixture
def embedder_and_tokenizer():
    torch.manual_seed(0)
    tokenizer = RealmTokenizer(vocab={token: index for index, token in enumerate(WORDS)})
    return RealmEmbedder(tiny_config(vocab_size=len(WORDS))).eval(), tokenizer


def _texts(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{i}" for i in rng.integers(0, 40, size=rng.integers(3, 12))) for _ in range(count)]


def _read(directory) -> np.ndarray:
    return np.concatenate(open_index_shards(directory)[1])


def test_build_equals_embedding_each_block(tmp_path, embedder_and_tokenizer):
    embedder, tokenizer = embedder_and_tokenizer
    texts = _texts(23)
    manifest = build_index(embedder, tokenizer, texts, tmp_path, shard_size=5, batch_size=4, max_length=16,
                           progress=False)  # fmt: skip
    assert manifest["num_blocks"] == 23 and [s["count"] for s in manifest["shards"]] == [5, 5, 5, 5, 3]
    assert not (tmp_path / BUILD_SETTINGS_NAME).exists()
    one_by_one = torch.cat([embed_blocks(embedder, tokenizer, [text], max_length=16) for text in texts]).numpy()
    np.testing.assert_allclose(_read(tmp_path), one_by_one, atol=1e-5)


def test_titles_become_the_first_segment(embedder_and_tokenizer):
    _, tokenizer = embedder_and_tokenizer
    encoded = encode_blocks(tokenizer, ["w1 w2", "w3"], ["w9", ""])
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist()) == ["[CLS]", "w9", "[SEP]", "w1", "w2",
                                                                                "[SEP]"]  # fmt: skip
    assert encoded["token_type_ids"][0].tolist() == [0, 0, 0, 1, 1, 1]
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"][1].tolist())[:3] == ["[CLS]", "w3", "[SEP]"]


class _CrashingDocuments:
    """Texts that raise when shard `crash_at` is requested, like a job killed mid-build."""

    def __init__(self, texts, crash_at_id):
        self._texts, self.crash_at_id = texts, crash_at_id

    def __len__(self):
        return len(self._texts)

    def texts(self, ids):
        if self.crash_at_id in ids:
            raise KeyboardInterrupt("simulated kill")
        return [self._texts[i] for i in ids]

    def titles(self, ids):
        return ["" for _ in ids]


def test_resume_recomputes_only_missing_shards_and_is_byte_identical(tmp_path, embedder_and_tokenizer, capsys):
    embedder, tokenizer = embedder_and_tokenizer
    texts = _texts(30)
    kwargs = dict(shard_size=7, batch_size=4, max_length=16, progress=False)
    build_index(embedder, tokenizer, texts, tmp_path / "full", **kwargs)

    partial = tmp_path / "partial"
    with pytest.raises(KeyboardInterrupt):
        build_index(embedder, tokenizer, _CrashingDocuments(texts, crash_at_id=14), partial, **kwargs)
    assert not (partial / "index.json").exists() and (partial / BUILD_SETTINGS_NAME).exists()
    assert sorted(path.name for path in partial.glob("embeddings-*")) == [shard_file_name(0), shard_file_name(1)]
    (partial / f".{shard_file_name(2)}.abc.tmp").write_bytes(b"half a shard")  # what a kill -9 can leave
    done_before = (partial / shard_file_name(0)).stat().st_mtime_ns

    capsys.readouterr()
    build_index(embedder, tokenizer, texts, partial, **{**kwargs, "progress": True})
    assert "embedding, resumed: 2 of 5 shards already embedded" in capsys.readouterr().err  # the rerun says so
    assert (partial / shard_file_name(0)).stat().st_mtime_ns == done_before  # finished shards are not recomputed
    assert not list(partial.glob("*.tmp"))
    for index in range(5):
        assert (partial / shard_file_name(index)).read_bytes() == (
            tmp_path / "full" / shard_file_name(index)
        ).read_bytes()


def test_resume_with_other_settings_is_refused(tmp_path, embedder_and_tokenizer):
    embedder, tokenizer = embedder_and_tokenizer
    (tmp_path / BUILD_SETTINGS_NAME).write_text('{"num_blocks": 30, "shard_size": 7}')
    with pytest.raises(ValueError, match="shard_size: was 7, now 5"):
        build_index(embedder, tokenizer, _texts(30), tmp_path, shard_size=5, progress=False)


def test_a_finished_index_is_refused_with_the_index_add_command_that_fits_it(tmp_path, embedder_and_tokenizer):
    embedder, tokenizer = embedder_and_tokenizer
    kwargs = dict(shard_size=5, batch_size=4, max_length=16, progress=False)
    build_index(embedder, tokenizer, _texts(6), tmp_path / "bare", **kwargs)  # no provenance: the model is unknown
    with pytest.raises(UsageError, match=r"`realm-hf index add --index \S+/bare \[--model MODEL\] --corpus NEW_DOCS`"):
        build_index(embedder, tokenizer, _texts(6), tmp_path / "bare", **kwargs)
    build_index(embedder, tokenizer, _texts(6), tmp_path / "known", provenance={"model": "my model"}, **kwargs)
    with pytest.raises(UsageError, match=r"--index \S+/known --model 'my model' --corpus NEW_DOCS`"):
        build_index(embedder, tokenizer, _texts(6), tmp_path / "known", **kwargs)
    # Built with the default model, `index add` needs no --model.
    assert index_add_command(tmp_path / "known", default_model="my model") == (
        f"realm-hf index add --index {tmp_path / 'known'} --corpus NEW_DOCS"
    )


def test_add_to_index_appends_with_stable_ids(tmp_path, embedder_and_tokenizer):
    embedder, tokenizer = embedder_and_tokenizer
    texts, new_texts = _texts(12), _texts(9, seed=1)
    build_index(embedder, tokenizer, texts, tmp_path, shard_size=5, batch_size=4, max_length=16, progress=False)
    before = _read(tmp_path)
    new_ids = add_to_index(embedder, tokenizer, new_texts, tmp_path, batch_size=4, progress=False)
    assert new_ids == range(12, 21)
    after = _read(tmp_path)
    np.testing.assert_array_equal(after[:12], before)
    np.testing.assert_allclose(after[12:], embed_blocks(embedder, tokenizer, new_texts, max_length=16).numpy(),
                               atol=1e-5)  # fmt: skip


def test_add_documents_is_one_call_for_embeddings_and_documents(tmp_path, embedder_and_tokenizer):
    from realm_hf.retrieval import DocumentStore, add_documents

    embedder, tokenizer = embedder_and_tokenizer
    store = DocumentStore.from_records([{"title": "", "text": text} for text in _texts(10)])
    store.save(tmp_path / "documents")
    build_index(embedder, tokenizer, store, tmp_path, shard_size=4, batch_size=4, max_length=16, progress=False)
    new_ids = add_documents(embedder, tokenizer, tmp_path, [{"title": "w1", "text": "w2 w3"}], progress=False)
    assert new_ids == range(10, 11)
    reloaded = DocumentStore.load(tmp_path / "documents")
    assert len(reloaded) == 11 and reloaded[10]["title"] == "w1"
    assert _read(tmp_path).shape[0] == 11
    # an index.json written before max_length was recorded (the default model's own index) still takes new blocks
    manifest = json.loads((tmp_path / "index.json").read_text())
    del manifest["max_length"]
    (tmp_path / "index.json").write_text(json.dumps(manifest))
    assert add_documents(embedder, tokenizer, tmp_path, [{"title": "", "text": "w5"}], progress=False) == range(11, 12)
    # an index whose documents and embeddings disagree is refused rather than misaligned
    store.save(tmp_path / "documents")
    with pytest.raises(ValueError, match="10 documents but 12 embedded blocks"):
        add_documents(embedder, tokenizer, tmp_path, [{"title": "", "text": "w4"}], progress=False)

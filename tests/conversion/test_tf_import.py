"""Importing Google's TensorFlow REALM/ORQA checkpoints and corpora, checked against TensorFlow-written files.

tests/fixtures/tf holds tiny checkpoints and TFRecord files written by TensorFlow 2.21 with the original variable
names, and what transformers 4.44.2's own TF loader (`load_tf_weights_in_realm`) made of them: fingerprints of every
weight it loaded and the outputs of each model (see `make_tf_fixtures.py`). No TensorFlow is needed here.
"""

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from realm_hf import RealmConfig, RealmRetriever, RealmTokenizer
from realm_hf.cli.main import main
from realm_hf.conversion import (
    TFCheckpointReader,
    TFRecordFile,
    UnmappedTFVariablesError,
    convert_tf_block_emb,
    convert_tf_blocks,
    convert_tf_checkpoint,
    plan_tf_conversion,
    realm_config_from_tf_checkpoint,
    tf_blocks_to_document_store,
)
from realm_hf.conversion.tf_reader import _numpy_crc32c, _python_crc32c, crc32c, crc32c_many, write_tfrecords
from realm_hf.retrieval import ExactSearcher, load_block_records

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tf"
VOCAB = Path(__file__).parents[1] / "fixtures" / "realm4" / "vocab.txt"
GOLDEN = load_file(FIXTURES / "golden.safetensors")
META = json.loads((FIXTURES / "golden.json").read_text())
ORQA = FIXTURES / "orqa"  # a directory with a `checkpoint` state file naming model.ckpt-300
ENCODED = FIXTURES / "encoded" / "encoded.ckpt"
BLOCKS = FIXTURES / "blocks.tfr"
CHECKPOINTS = {
    "embedder": FIXTURES / "realm_embedder" / "variables",
    "scorer": FIXTURES / "realm_embedder" / "variables.index",
    "encoder": FIXTURES / "realm_encoder" / "model.ckpt",
    "reader": ORQA,
    "openqa": ORQA,
}
ATOL = 1e-5


def tiny_config() -> RealmConfig:
    return RealmConfig(**json.loads((FIXTURES / "config.json").read_text()))


def convert(model_type: str, **kwargs):
    block_emb = ENCODED if model_type == "openqa" else None
    return convert_tf_checkpoint(CHECKPOINTS[model_type], model_type, config=tiny_config(), block_emb=block_emb,
                                 **kwargs)  # fmt: skip


@pytest.fixture(scope="module")
def converted():
    torch.manual_seed(0)
    return {model_type: convert(model_type) for model_type in CHECKPOINTS}


def test_crc32c_matches_the_standard_check_value():
    assert crc32c(b"123456789") == _python_crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"56789", crc32c(b"1234")) == 0xE3069283


def test_vectorised_crc32c_equals_the_byte_at_a_time_one():
    generator = np.random.default_rng(0)
    data = generator.integers(0, 256, 200_003, dtype=np.uint8).tobytes()  # past the numpy threshold, odd tail
    assert _numpy_crc32c(data) == _python_crc32c(data)
    assert _numpy_crc32c(data[70_000:], _numpy_crc32c(data[:70_000])) == _python_crc32c(data)
    buffers = [data[i : i + int(n)] for i, n in enumerate(generator.integers(0, 3000, 300))] + [b""]
    assert crc32c_many(buffers) == [_python_crc32c(buffer) for buffer in buffers]


def test_reader_lists_the_variables_tensorflow_wrote():
    reader = TFCheckpointReader(ORQA)
    assert reader.prefix == ORQA / "model.ckpt-300"
    variables = reader.variables()
    assert variables["reader/dense/kernel"] == (32, 32) and variables["reader/dense_1/kernel"] == (16, 1)
    assert variables["module/module/module/module/bert/encoder/layer_1/output/dense/kernel"] == (37, 32)
    assert int(reader.read("global_step")) == 300 and reader.read("global_step").dtype == np.int64
    assert TFCheckpointReader(FIXTURES / "encoded").variables() == {"block_emb": (8, 16)}
    assert TFCheckpointReader(f"{ENCODED}.data-00000-of-00001").prefix == ENCODED


@pytest.mark.parametrize("model_type", list(CHECKPOINTS))
def test_every_converted_tensor_equals_its_tf_source(converted, model_type):
    model = converted[model_type]
    state = model.state_dict()
    for plan in model.tf_conversion_plans:
        reader = TFCheckpointReader(ENCODED if "block_emb" in plan.mapping else CHECKPOINTS[model_type])
        assert plan.mapping, "nothing was mapped"
        for name, key in plan.mapping.items():
            source = torch.from_numpy(reader.read(name))
            expected = source.T if name.endswith("kernel") else source
            assert (name in plan.transposed) == (name.endswith("kernel") and source.dim() == 2), name
            assert torch.equal(state[key], expected), f"{name} -> {key}"
    # The MLM decoders, which TF ties to the word embeddings and the output bias, carry those values.
    for key in state:
        if key.endswith("cls.predictions.decoder.weight"):
            assert torch.equal(
                state[key], state[key.replace("cls.predictions.decoder", "realm.embeddings.word_embeddings")]
            )
        if key.endswith("cls.predictions.decoder.bias"):
            assert torch.equal(state[key], state[key.replace("decoder.bias", "bias")])


@pytest.mark.parametrize("model_type", list(CHECKPOINTS))
def test_weights_equal_what_the_transformers4_tf_loader_loaded(converted, model_type):
    state = converted[model_type].state_dict()
    fingerprints = META["fingerprints"][model_type]
    assert fingerprints
    for key, (total, squares) in fingerprints.items():
        # 4.x's RealmScorer lists its shared embedder twice, also as `query_embedder.`; realm_hf keeps one name.
        key = key.replace("query_embedder.", "embedder.")
        assert key in state, f"transformers 4.44.2 loaded {key}, which the converted model lacks"
        value = state[key].double()
        assert float(value.sum()) == pytest.approx(total, rel=1e-6, abs=1e-6), key
        assert float(value.pow(2).sum()) == pytest.approx(squares, rel=1e-6), key


def test_nothing_is_left_unmapped_and_only_optimizer_state_is_skipped(converted):
    plan = converted["openqa"].tf_conversion_plans[0]
    assert not plan.unmapped
    assert plan.skipped and set(plan.skipped.values()) == {"optimizer state"}
    assert all(name == "global_step" or name.endswith(("/adam_m", "/adam_v")) for name in plan.skipped)
    reader_plan = converted["reader"].tf_conversion_plans[0]
    assert any(name.startswith("module/") for name in reader_plan.skipped), "the embedder is skipped by a reader"
    assert all(key.startswith(("realm.", "cls.", "qa_outputs.")) for key in reader_plan.mapping.values())


def test_unmapped_names_raise_a_clear_error_listing_them():
    with pytest.raises(UnmappedTFVariablesError) as error:
        convert_tf_checkpoint(FIXTURES / "unmapped", "encoder", config=tiny_config())
    message = str(error.value)
    assert "mystery/scope/kernel: no rule in TF_NAME_PREFIXES covers it" in message
    assert "cls/seq_relationship/output_bias: maps to 'cls.seq_relationship.bias'" in message
    assert "2 TF variable(s)" in message and "adam_m" in message
    plan = plan_tf_conversion(["bert/pooler/dense/kernel", "optimizer/thing", "block_emb"], "embedder")
    assert plan.unmapped == ["optimizer/thing"] and set(plan.skipped) == {"bert/pooler/dense/kernel", "block_emb"}


def test_a_reader_starts_from_realm_bert_as_orqa_does():
    reader = convert_tf_checkpoint(CHECKPOINTS["encoder"], "reader", config=tiny_config(), strict=False)
    source = TFCheckpointReader(CHECKPOINTS["encoder"])
    kernel = torch.from_numpy(source.read("bert/encoder/layer_1/output/dense/kernel"))
    assert torch.equal(reader.realm.encoder.layer[1].output.dense.weight, kernel.T)
    assert torch.equal(reader.cls.predictions.bias, torch.from_numpy(source.read("cls/predictions/output_bias")))


def test_a_checkpoint_that_does_not_fit_the_config_names_both_shapes():
    config = tiny_config()
    config.vocab_size = 96
    with pytest.raises(ValueError, match=r"realm.embeddings.word_embeddings.weight: expected shape \(96, 32\), "
                                         r"received \(95, 32\)"):  # fmt: skip
        convert_tf_checkpoint(CHECKPOINTS["encoder"], "encoder", config=config)


def test_weights_no_checkpoint_covers_raise_unless_lenient():
    with pytest.raises(ValueError, match="without a value.*reader.qa_outputs"):
        convert_tf_checkpoint(CHECKPOINTS["encoder"], "openqa", config=tiny_config())
    model = convert_tf_checkpoint(CHECKPOINTS["encoder"], "openqa", config=tiny_config(), strict=False)
    assert model.config.store_block_emb is False


def test_config_sizes_are_read_from_the_checkpoint():
    config = realm_config_from_tf_checkpoint([ORQA, ENCODED], "openqa", num_attention_heads=4)
    expected = tiny_config()
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "max_position_embeddings",
                 "type_vocab_size", "retriever_proj_size", "span_hidden_size", "num_block_records"):  # fmt: skip
        assert getattr(config, name) == getattr(expected, name), name
    with pytest.raises(ValueError, match="hidden_size 32 .* num_attention_heads 12"):
        realm_config_from_tf_checkpoint(ORQA, "openqa")


def _golden(prefix: str) -> dict:
    return {key[len(prefix) :]: value for key, value in GOLDEN.items() if key.startswith(prefix)}


def test_embedder_scorer_and_encoder_outputs_equal_transformers4(converted):
    with torch.no_grad():
        projected = converted["embedder"](**_golden("embedder.input.")).projected_score
        torch.testing.assert_close(projected, GOLDEN["embedder.projected_score"], atol=ATOL, rtol=0)
        query, candidates = _golden("scorer.input.query."), _golden("scorer.input.candidates.")
        relevance = converted["scorer"](
            **query, **{f"candidate_{k}": v for k, v in candidates.items()}
        ).relevance_score
        torch.testing.assert_close(relevance, GOLDEN["scorer.relevance_score"], atol=ATOL, rtol=0)
        logits = converted["encoder"](**_golden("encoder.input.")).logits
        torch.testing.assert_close(logits, GOLDEN["encoder.logits"], atol=1e-4, rtol=0)


def _tokenizer() -> RealmTokenizer:
    return RealmTokenizer(vocab_file=str(VOCAB))


def _check_open_qa(model, tokenizer):
    for index, question in enumerate(META["questions"]):
        golden = _golden(f"openqa.q{index}.")
        inputs = {key[len("input.") :]: value for key, value in golden.items() if key.startswith("input.")}
        with torch.no_grad():
            result = model(**inputs)
            with_answers = model(**inputs, answer_ids=META["answer_ids"][index])
        assert torch.equal(result.predicted_answer_ids, golden["predicted_answer_ids"]), question
        assert tokenizer.decode(result.predicted_answer_ids) == META["predictions"][index]
        for name in ("block_idx", "candidate", "start_pos", "end_pos"):
            assert torch.equal(getattr(result.reader_output, name), golden[name]), name
        for name in ("loss", "retriever_loss", "reader_loss"):
            torch.testing.assert_close(getattr(with_answers.reader_output, name), golden[f"with_answers.{name}"],
                                       atol=1e-4, rtol=0)  # fmt: skip


def test_open_qa_with_block_emb_in_the_model_answers_like_transformers4(converted, tmp_path):
    model = converted["openqa"]
    records = load_block_records(convert_tf_blocks(BLOCKS, tmp_path / "block_records.safetensors", progress=False))
    model.retriever = RealmRetriever(block_records=records, tokenizer=_tokenizer())
    scores = torch.einsum("BD,QD->QB", model.block_emb, model.embedder(**_golden("openqa.q0.input.")).projected_score)
    torch.testing.assert_close(scores, GOLDEN["openqa.q0.block_scores"], atol=ATOL, rtol=0)
    _check_open_qa(model, model.retriever.tokenizer)


def test_block_emb_becomes_an_index_that_the_searcher_loads(tmp_path):
    manifest = convert_tf_block_emb(ENCODED, tmp_path / "index", shard_size=3, progress=False)
    assert manifest["num_blocks"] == 8 and manifest["dim"] == 16 and len(manifest["shards"]) == 3
    assert manifest["provenance"]["variable"] == "block_emb"
    searcher = ExactSearcher.from_index(tmp_path / "index")
    expected = TFCheckpointReader(ENCODED).read("block_emb")
    assert torch.equal(searcher.embeddings(torch.arange(8)), torch.from_numpy(expected))
    assert searcher.search(torch.from_numpy(expected[5:6]), 1).ids.tolist() == [
        [int(np.argmax(expected @ expected[5]))]
    ]


def test_blocks_tfr_becomes_block_records_and_a_document_store(tmp_path):
    path = convert_tf_blocks(BLOCKS, tmp_path, progress=False)
    assert path.name == "block_records.safetensors"
    assert list(load_block_records(path)) == [record.encode() for record in _fixture_blocks()]
    store = tf_blocks_to_document_store(BLOCKS, tmp_path / "documents", titles=FIXTURES / "titles.tfr", progress=False)
    assert len(store) == 8 and store[3]["text"] == _fixture_blocks()[3] and store[3]["title"] == "alan turing"
    with pytest.raises(ValueError, match="expected one title per block: blocks.tfr has 8 records, titles.tfr has 2"):
        short = write_tfrecords(tmp_path / "titles.tfr", [b"a", b"b"])
        tf_blocks_to_document_store(BLOCKS, tmp_path / "other", titles=short, progress=False)


def _fixture_blocks() -> list[str]:
    return [record.decode() for record in TFRecordFile(BLOCKS)]


def test_our_tfrecord_writer_writes_the_bytes_tensorflow_writes(tmp_path):
    records = list(TFRecordFile(BLOCKS))
    assert len(records) == len(TFRecordFile(BLOCKS)) == 8
    assert write_tfrecords(tmp_path / "copy.tfr", records).read_bytes() == BLOCKS.read_bytes()
    compressed = tmp_path / "blocks.tfr.gz"  # TFRecordDataset(compression_type="GZIP") files
    compressed.write_bytes(gzip.compress(BLOCKS.read_bytes()))
    assert list(TFRecordFile(compressed)) == records and len(TFRecordFile(compressed)) == 8


# ---------------------------------------------------------------------------------------------------------------------
# bad input


def _copy_checkpoint(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES / "encoded", tmp_path / "encoded")
    return tmp_path / "encoded" / "encoded.ckpt"


def test_missing_index_names_the_expected_file(tmp_path):
    prefix = _copy_checkpoint(tmp_path)
    Path(f"{prefix}.index").unlink()
    with pytest.raises(FileNotFoundError, match=r"expected a TensorFlow checkpoint index at .*encoded.ckpt.index .*"
                                                r"found \['encoded.ckpt.data-00000-of-00001'\]"):  # fmt: skip
        TFCheckpointReader(prefix)


def test_truncated_data_file_names_expected_and_received_sizes(tmp_path):
    prefix = _copy_checkpoint(tmp_path)
    data = Path(f"{prefix}.data-00000-of-00001")
    data.write_bytes(data.read_bytes()[:300])
    with pytest.raises(ValueError, match=r"is truncated: variable 'block_emb' needs bytes 0..512, the file has 300"):
        TFCheckpointReader(prefix).read("block_emb")


def test_wrong_tensor_checksum_names_expected_and_received(tmp_path):
    prefix = _copy_checkpoint(tmp_path)
    data = Path(f"{prefix}.data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"corrupt: variable 'block_emb' has crc32c 0x[0-9a-f]{8}, the index expects "
                                         r"0x[0-9a-f]{8}"):  # fmt: skip
        TFCheckpointReader(prefix).read("block_emb")
    with pytest.raises(ValueError, match="corrupt: variable 'block_emb' has crc32c"):
        convert_tf_block_emb(prefix, tmp_path / "index", shard_size=3, progress=False)
    assert not (tmp_path / "index" / "index.json").exists(), "a damaged block_emb must not leave a loadable index"
    assert TFCheckpointReader(prefix, verify_checksums=False).read("block_emb").shape == (8, 16)


def test_damaged_index_file_is_reported(tmp_path):
    prefix = _copy_checkpoint(tmp_path)
    index = Path(f"{prefix}.index")
    index.write_bytes(index.read_bytes()[:-4])
    with pytest.raises(ValueError, match="not a TensorFlow checkpoint index: expected table magic"):
        TFCheckpointReader(prefix)
    index.write_bytes(b"\x00" * 10)
    with pytest.raises(ValueError, match="truncated: expected at least the 48-byte table footer, received 10 bytes"):
        TFCheckpointReader(prefix)


def test_truncated_or_corrupt_tfrecords_are_reported(tmp_path):
    raw = BLOCKS.read_bytes()
    truncated = tmp_path / "truncated.tfr"
    truncated.write_bytes(raw[:-10])
    with pytest.raises(ValueError, match=r"truncated: record 7 at byte \d+ declares \d+ bytes of data plus a 4-byte "
                                         r"crc32c, received \d+ bytes"):  # fmt: skip
        list(TFRecordFile(truncated))
    with pytest.raises(ValueError, match="truncated: record 7"):
        len(TFRecordFile(truncated))
    corrupt = tmp_path / "corrupt.tfr"
    corrupt.write_bytes(raw[:20] + bytes([raw[20] ^ 0xFF]) + raw[21:])
    with pytest.raises(ValueError, match=r"corrupt: record 0 at byte 0 has a data crc32c of 0x[0-9a-f]{8}, expected"):
        list(TFRecordFile(corrupt))
    assert len(list(TFRecordFile(corrupt, verify_checksums=False))) == 8
    not_tfrecord = tmp_path / "notes.txt"
    not_tfrecord.write_text("this is not a TFRecord file at all")
    with pytest.raises(ValueError, match="length crc32c of .* expected .*not a TFRecord file"):
        len(TFRecordFile(not_tfrecord))
    with pytest.raises(FileNotFoundError, match="expected a TFRecord file at"):
        TFRecordFile(tmp_path / "missing.tfr")


# ---------------------------------------------------------------------------------------------------------------------
# command line


def test_cli_converts_an_orqa_release_that_then_answers_like_transformers4(tmp_path):
    from realm_hf.default_model import load_open_qa

    output = tmp_path / "orqa"
    code = main(["convert", "tf", "--checkpoint", str(ORQA), "--config", str(FIXTURES / "config.json"),
                 "--block-emb", str(ENCODED), "--blocks", str(BLOCKS), "--vocab", str(VOCAB), "--output", str(output),
                 "--shard-size", "4", "--quiet"])  # fmt: skip
    assert code == 0
    assert (output / "index" / "index.json").is_file() and (output / "index" / "documents").is_dir()
    model, retriever = load_open_qa(output)
    assert model.config.store_block_emb is False and model.config.num_block_records == 8
    _check_open_qa(model, retriever.tokenizer)


def test_cli_converts_an_embedder_and_blocks_without_an_index(tmp_path, capsys):
    from realm_hf import RealmEmbedder

    code = main(["convert", "tf", "--checkpoint", str(CHECKPOINTS["embedder"]), "--model-type", "embedder",
                 "--config", str(FIXTURES / "config.json"), "--blocks", str(BLOCKS), "--output", str(tmp_path),
                 "--quiet"])  # fmt: skip
    assert code == 0 and "RealmEmbedder (48 variables mapped, 0 skipped)" in capsys.readouterr().out
    embedder = RealmEmbedder.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        projected = embedder(**_golden("embedder.input.")).projected_score
    torch.testing.assert_close(projected, GOLDEN["embedder.projected_score"], atol=ATOL, rtol=0)
    assert len(load_block_records(tmp_path)) == 8


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    code = main(["convert", "tf", "--checkpoint", str(tmp_path / "model.ckpt"), "--output", str(tmp_path / "out")])
    assert code == 1
    assert "realm-hf convert tf: error: expected a TensorFlow checkpoint index at" in capsys.readouterr().err
    assert main(["convert", "tf", "--output", str(tmp_path / "out")]) == 2
    assert "realm-hf convert tf: error: give at least one of --checkpoint" in capsys.readouterr().err


def test_cli_says_what_a_narrower_model_type_leaves_out(tmp_path, capsys):
    # An ORQA checkpoint converted as an embedder: its reader is left out, and the command says so.
    code = main(["convert", "tf", "--checkpoint", str(ORQA), "--model-type", "embedder", "--config",
                 str(FIXTURES / "config.json"), "--output", str(tmp_path / "emb"), "--quiet"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0 and "RealmEmbedder (" in captured.out
    assert "note: --model-type embedder leaves out what the checkpoint also holds (part of the reader" in captured.err
    assert "--model-type openqa converts a whole" in captured.err
    code = main(["convert", "tf", "--checkpoint", str(ORQA), "--config", str(FIXTURES / "config.json"), "--output",
                 str(tmp_path / "whole"), "--quiet"])  # fmt: skip
    assert code == 0 and "leaves out" not in capsys.readouterr().err

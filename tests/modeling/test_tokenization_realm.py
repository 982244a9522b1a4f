"""RealmTokenizer: the 4.x tokenizer tests that still apply, batch_encode_candidates, saving and Auto resolution."""

import json

import pytest
from conftest import write_vocab
from transformers import AutoTokenizer

from realm_hf import RealmTokenizer, RealmTokenizerFast

VOCAB = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",",
         "low", "lowest"]  # fmt: skip


@pytest.fixture
def tokenizer(tmp_path):
    return RealmTokenizer(str(write_vocab(tmp_path / "vocab", VOCAB)))


def test_full_tokenizer(tokenizer):
    tokens = tokenizer.tokenize("UNwant\u00e9d,running")
    assert tokens == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert tokenizer.convert_tokens_to_ids(tokens) == [9, 6, 7, 12, 10, 11]
    assert (
        tokenizer.decode(tokenizer("UNwant\u00e9d,running", add_special_tokens=False).input_ids) == "unwanted, running"
    )


def test_fast_is_the_same_class():
    assert RealmTokenizerFast is RealmTokenizer


def test_chinese_and_clean_text(tmp_path):
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "v", VOCAB + ["ah", "\u535a", "\u63a8", "zz"])))
    assert tokenizer.tokenize("ah\u535a\u63a8zz") == ["ah", "\u535a", "\u63a8", "zz"]
    assert [tokenizer.tokenize(text) for text in ["Test", "\xad", "test"]] == [["[UNK]"], [], ["[UNK]"]]


def test_special_token_layout(tokenizer):
    encoded = tokenizer("want", "low")
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids) == ["[CLS]", "want", "[SEP]", "low", "[SEP]"]
    assert encoded.token_type_ids == [0, 0, 0, 1, 1]


def test_batch_encode_candidates_shapes(tokenizer):
    text = [["want running", "low"], ["lowest", "unwanted, low"]]
    batch = tokenizer.batch_encode_candidates(text, max_length=10, return_tensors="pt")
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert tuple(batch[key].shape) == (2, 2, 10)
    assert tokenizer.convert_ids_to_tokens(batch.input_ids[0, 1].tolist())[:3] == ["[CLS]", "low", "[SEP]"]
    pairs = tokenizer.batch_encode_candidates(text, text_pair=[["low", "low"], ["want", "want"]], max_length=10,
                                              return_tensors="np")  # fmt: skip
    assert pairs["token_type_ids"].shape == (2, 2, 10) and pairs["token_type_ids"][0, 0, 5] == 1
    as_lists = tokenizer.batch_encode_candidates(text, max_length=10)
    assert isinstance(as_lists["input_ids"], list) and len(as_lists["input_ids"][0][0]) == 10


def test_batch_encode_candidates_truncates_by_default(tokenizer):
    # 4.x failed here with "Unable to create tensor" unless truncation=True was passed.
    long_text = " ".join(["want"] * 40)
    batch = tokenizer.batch_encode_candidates([[long_text, "low"]], max_length=8, return_tensors="pt")
    assert tuple(batch.input_ids.shape) == (1, 2, 8)
    assert tokenizer.convert_ids_to_tokens(batch.input_ids[0, 0].tolist())[-1] == "[SEP]"


def test_batch_encode_candidates_errors(tokenizer):
    with pytest.raises(ValueError, match=r"same number of candidates .* got \[1, 2\]"):
        tokenizer.batch_encode_candidates([["low"], ["low", "want"]], max_length=8, return_tensors="pt")
    with pytest.raises(ValueError, match="expected 2, got 1"):
        tokenizer.batch_encode_candidates([["low"], ["want"]], text_pair=[["low"]], max_length=8)


def test_save_writes_vocab_txt_and_loads_through_auto(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "vocab.txt").read_text(encoding="utf-8").split("\n")[:15] == VOCAB
    config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "RealmTokenizer"
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert type(reloaded) is RealmTokenizer
    assert reloaded("unwanted running").input_ids == tokenizer("unwanted running").input_ids


@pytest.mark.parametrize("tokenizer_class", ["RealmTokenizer", "RealmTokenizerFast", None])
def test_hub_style_tokenizer_files_load_through_auto(tmp_path, tokenizer_class):
    # Hub REALM repos hold vocab.txt, special_tokens_map.json and a tokenizer_config.json naming RealmTokenizer.
    write_vocab(tmp_path, VOCAB)
    config = {"do_lower_case": True, "model_max_length": 512, "name_or_path": "bert-base-uncased"}
    if tokenizer_class:
        config["tokenizer_class"] = tokenizer_class
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "realm"}))
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert type(loaded) is RealmTokenizer
    assert loaded.model_max_length == 512
    assert hasattr(loaded, "batch_encode_candidates")

"""Three 4.x behaviours realm_hf once lost (issue 16), checked against facts recorded from transformers 4.44.2
(tests/fixtures/realm4/make_golden_config_flags.py)."""

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from safetensors.torch import load_file

from realm_hf import RealmConfig, RealmEmbedder, RealmForOpenQA, RealmReader, RealmTokenizer

GOLDEN = Path(__file__).parents[1] / "fixtures" / "realm4"
FACTS = json.loads((GOLDEN / "config_flags_io.json").read_text(encoding="utf-8"))


def test_config_output_flags_are_honoured_as_in_4x():
    inputs = load_file(GOLDEN / "embedder_io.safetensors")
    config = RealmConfig.from_pretrained(GOLDEN / "embedder", output_hidden_states=True, output_attentions=True)
    model = RealmEmbedder.from_pretrained(GOLDEN / "embedder", config=config, attn_implementation="eager").eval()
    with torch.no_grad():
        output = model(inputs["input.input_ids"], attention_mask=inputs["input.attention_mask"],
                       token_type_ids=inputs["input.token_type_ids"])  # fmt: skip
    assert type(output.hidden_states).__name__ == FACTS["hidden_states_type"] == "tuple"
    assert len(output.hidden_states) == FACTS["num_hidden_states"]
    sums = [float(hidden.double().sum()) for hidden in output.hidden_states]
    assert sums == pytest.approx(FACTS["hidden_states_sums"], abs=1e-3)
    assert type(output.attentions).__name__ == FACTS["attentions_type"]
    assert len(output.attentions) == FACTS["num_attentions"]
    # An explicit False still wins over the config, and the config default (False) gives None.
    assert model(inputs["input.input_ids"], output_hidden_states=False, output_attentions=False).hidden_states is None
    assert RealmEmbedder(tiny_config()).eval()(torch.tensor([[1, 5, 2]])).hidden_states is None


def test_reader_follows_config_output_hidden_states():
    reader = RealmReader(tiny_config(output_hidden_states=True)).eval()
    ids = torch.tensor([[1, 5, 6, 2, 7, 8, 2]] * 2)
    block_mask = torch.zeros_like(ids, dtype=torch.bool)
    block_mask[:, 4:6] = True
    output = reader(ids, token_type_ids=block_mask.long(), relevance_score=torch.zeros(2), block_mask=block_mask)
    assert isinstance(output.hidden_states, tuple) and len(output.hidden_states) == 3


def test_tokenizer_file_alone_gives_its_vocabulary_as_in_4x():
    tokenizer = RealmTokenizer(tokenizer_file=str(GOLDEN / "config_flags_tokenizer.json"))
    expected = FACTS["tokenizer_file"]
    assert len(tokenizer.get_vocab()) == expected["vocab_size"] == 95
    assert [tokenizer(text).input_ids for text in expected["texts"]] == expected["input_ids"]
    # With a vocabulary as well, the vocabulary is used (as before).
    tokenizer_file = str(GOLDEN / "config_flags_tokenizer.json")
    both = RealmTokenizer(vocab_file=str(GOLDEN / "vocab.txt"), tokenizer_file=tokenizer_file)
    assert len(both.get_vocab()) == 95


@pytest.mark.parametrize("model_class", [RealmEmbedder, RealmReader, RealmForOpenQA])
def test_relative_position_set_after_construction_is_refused_when_the_model_is_built(model_class):
    config = tiny_config()
    config.position_embedding_type = "relative_key"
    with pytest.raises(ValueError, match="position_embedding_type must be one of .*'relative_key'"):
        model_class(config)


def test_token_ids_beyond_the_vocabulary_raise_a_clear_value_error():
    model = RealmEmbedder(tiny_config()).eval()
    with pytest.raises(ValueError, match=r"token id 99, outside this model's vocabulary of 99 ids"):
        model(torch.tensor([[1, 99, 2]]))
    with pytest.raises(ValueError, match=r"token id -1"):
        model(torch.tensor([[1, -1, 2]]))


def test_sequences_longer_than_the_position_embeddings_raise_a_clear_value_error():
    model = RealmEmbedder(tiny_config()).eval()
    with pytest.raises(ValueError, match=r"65 tokens per sequence, more than this model's 64 position embeddings"):
        model(torch.ones(1, 65, dtype=torch.long))

"""Tiny-config tests of every REALM model: shapes, losses, gradients, saving, loading and input errors."""

import json

import pytest
import torch
from conftest import tiny_config
from huggingface_hub.errors import StrictDataclassClassValidationError

from realm_hf import (
    RealmConfig,
    RealmEmbedder,
    RealmForOpenQA,
    RealmKnowledgeAugEncoder,
    RealmReader,
    RealmScorer,
)

BATCH, SEQ, CANDIDATES = 5, 7, 3


@pytest.fixture
def inputs():
    generator = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(5, 99, (BATCH, SEQ), generator=generator),
        "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long),
        "token_type_ids": torch.randint(0, 2, (BATCH, SEQ), generator=generator),
        "candidate_ids": torch.randint(5, 99, (BATCH, CANDIDATES, SEQ), generator=generator),
    }


def test_config_defaults_match_transformers4():
    config = RealmConfig()
    expected = dict(
        vocab_size=30522, hidden_size=768, retriever_proj_size=128, num_hidden_layers=12, num_attention_heads=12,
        num_candidates=8, intermediate_size=3072, hidden_act="gelu_new", hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02,
        layer_norm_eps=1e-12, span_hidden_size=256, max_span_width=10, reader_layer_norm_eps=1e-3, reader_beam_size=5,
        reader_seq_len=320, num_block_records=13353718, searcher_beam_size=5000, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, searcher_seq_len=64,
    )  # fmt: skip
    assert {name: getattr(config, name) for name in expected} == expected


def test_config_keeps_legacy_hub_keys(tmp_path):
    legacy = RealmConfig().to_dict()
    legacy.update({"searcher_seq_len": 64, "use_cache": True, "use_scann": False, "transformers_version": "4.16.0"})
    legacy["architectures"] = ["RealmForOpenQA"]
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    config = RealmConfig.from_pretrained(tmp_path)
    assert config.searcher_seq_len == 64 and config.use_scann is False
    assert config.architectures == ["RealmForOpenQA"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 30, "num_attention_heads": 4}, "hidden_size \\(30\\) must be a multiple"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type must be one of"),
        ({"reader_beam_size": 0}, "reader_beam_size must be a positive integer, got 0"),
    ],
)
def test_config_rejects_bad_values(overrides, message):
    # Transformers 5 configs are strict dataclasses: validation errors arrive wrapped, with our message inside.
    with pytest.raises((ValueError, StrictDataclassClassValidationError), match=message):
        tiny_config(**overrides)


def test_embedder(inputs):
    model = RealmEmbedder(tiny_config()).eval()
    output = model(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
    assert output.projected_score.shape == (BATCH, 16)
    as_tuple = model(inputs["input_ids"], return_dict=False)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 1
    torch.testing.assert_close(as_tuple[0], model(inputs["input_ids"]).projected_score)


def test_embedder_hidden_states_and_attentions(inputs):
    model = RealmEmbedder(tiny_config()).eval()
    with pytest.raises(ValueError, match="output_attentions=True needs eager attention"):
        model(inputs["input_ids"], output_attentions=True)
    model.set_attn_implementation("eager")
    output = model(inputs["input_ids"], output_attentions=True, output_hidden_states=True)
    assert len(output.hidden_states) == 3 and output.hidden_states[0].shape == (BATCH, SEQ, 32)
    assert len(output.attentions) == 2 and output.attentions[0].shape == (BATCH, 4, SEQ, SEQ)
    # eager and sdpa agree
    sdpa = RealmEmbedder(tiny_config()).eval()
    sdpa.load_state_dict(model.state_dict())
    torch.testing.assert_close(sdpa(inputs["input_ids"]).projected_score, output.projected_score)


def test_scorer(inputs):
    model = RealmScorer(tiny_config()).eval()
    output = model(inputs["input_ids"], candidate_input_ids=inputs["candidate_ids"])
    assert output.relevance_score.shape == (BATCH, CANDIDATES)
    assert output.query_score.shape == (BATCH, 16)
    assert output.candidate_score.shape == (BATCH, CANDIDATES, 16)
    expected = torch.einsum("bd,bnd->bn", output.query_score, output.candidate_score)
    torch.testing.assert_close(output.relevance_score, expected)
    # the query encoder is the candidate encoder unless a separate one is passed
    assert model.query_embedder is model.embedder
    flat = model(inputs["input_ids"], candidate_input_ids=inputs["candidate_ids"].view(-1, SEQ))
    torch.testing.assert_close(flat.relevance_score, output.relevance_score)


def test_scorer_with_separate_query_embedder_round_trips(tmp_path, inputs):
    config = tiny_config()
    model = RealmScorer(config, query_embedder=RealmEmbedder(config)).eval()
    assert model.query_embedder is not model.embedder
    model.save_pretrained(tmp_path)
    reloaded = RealmScorer.from_pretrained(tmp_path, query_embedder=RealmEmbedder(config)).eval()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[key], value, msg=key)
    assert any(key.startswith("query_embedder.") for key in reloaded.state_dict())


def test_scorer_rejects_wrong_candidate_count(inputs):
    model = RealmScorer(tiny_config()).eval()
    with pytest.raises(ValueError, match="config.num_candidates=3"):
        model(inputs["input_ids"], candidate_input_ids=inputs["candidate_ids"][:, :2])
    with pytest.raises(ValueError, match="candidate_input_ids or candidate_inputs_embeds"):
        model(inputs["input_ids"])


def test_knowledge_augmented_encoder_loss(inputs):
    model = RealmKnowledgeAugEncoder(tiny_config()).eval()
    relevance = torch.randn(BATCH, CANDIDATES)
    labels = inputs["input_ids"].clone()
    labels[:, :2] = -100
    output = model(inputs["candidate_ids"], relevance_score=relevance, labels=labels)
    assert output.logits.shape == (BATCH * CANDIDATES, SEQ, 99)

    # the marginal likelihood written out by hand
    log_probs = output.logits.log_softmax(-1).view(BATCH, CANDIDATES, SEQ, 99)
    safe_labels = labels.clamp(min=0)
    token_log_probs = log_probs.gather(-1, safe_labels[:, None, :, None].expand(-1, CANDIDATES, -1, 1)).squeeze(-1)
    token_log_probs = token_log_probs.masked_fill((labels == -100)[:, None, :], 0.0)
    marginal = (relevance.log_softmax(-1)[..., None] + token_log_probs).logsumexp(1)
    torch.testing.assert_close(output.loss, -marginal.mean())

    mlm_mask = (labels != -100).long()
    masked = model(inputs["candidate_ids"], relevance_score=relevance, labels=labels, mlm_mask=mlm_mask)
    torch.testing.assert_close(masked.loss, -(marginal * mlm_mask).sum() / mlm_mask.sum())


def test_knowledge_augmented_encoder_errors(inputs):
    model = RealmKnowledgeAugEncoder(tiny_config()).eval()
    with pytest.raises(ValueError, match="You have to specify `relevance_score` when `labels`"):
        model(inputs["candidate_ids"], labels=inputs["input_ids"])
    with pytest.raises(ValueError, match=r"relevance_score must have shape .* got \(5, 2\)"):
        model(inputs["candidate_ids"], relevance_score=torch.zeros(BATCH, 2), labels=inputs["input_ids"])


def test_knowledge_augmented_encoder_ties_decoder_to_embeddings():
    model = RealmKnowledgeAugEncoder(tiny_config())
    assert model.cls.predictions.decoder.weight is model.realm.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    embedder = RealmEmbedder(tiny_config())
    assert embedder.cls.predictions.decoder.weight is not embedder.realm.embeddings.word_embeddings.weight


def _reader_inputs(num_questions: int, num_read: int = 2, beam: int = 4, seq: int = 12, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    token_type_ids = torch.zeros(num_questions, num_read, seq, dtype=torch.long)
    token_type_ids[..., 4:] = 1
    block_mask = token_type_ids.clone()
    block_mask[..., -1] = 0
    start_positions = torch.full((num_questions, beam, 2), -1)
    end_positions = torch.full((num_questions, beam, 2), -1)
    start_positions[:, 0, 0], end_positions[:, 0, 0] = 5, 6
    start_positions[:, 1, 0], end_positions[:, 1, 0] = 8, 8
    has_answers = torch.tensor([True, True, False, False]).expand(num_questions, beam).clone()
    return {
        "input_ids": torch.randint(5, 99, (num_questions, num_read, seq), generator=generator),
        "attention_mask": torch.ones(num_questions, num_read, seq, dtype=torch.long),
        "token_type_ids": token_type_ids,
        "relevance_score": torch.randn(num_questions, beam, generator=generator),
        "block_mask": block_mask.bool(),
        "start_positions": start_positions,
        "end_positions": end_positions,
        "has_answers": has_answers,
    }


def test_reader_single_question_shapes_match_transformers4():
    model = RealmReader(tiny_config()).eval()
    inputs = {key: value[0] for key, value in _reader_inputs(1).items()}
    output = model(**inputs)
    assert output.block_idx.shape == () and output.candidate.shape == ()
    assert output.start_pos.shape == (1,) and output.end_pos.shape == (1,)
    assert output.loss.shape == () and output.retriever_loss.shape == () and output.reader_loss.shape == ()
    assert output.retriever_correct.shape == (4,)
    num_spans = 3 * 12 - 3  # W*L - W(W-1)/2
    assert output.reader_correct.shape == (2, num_spans)
    assert output.reader_correct.sum() == 2
    assert torch.isfinite(output.loss)
    no_labels = model(**{k: v for k, v in inputs.items() if k not in ("start_positions", "end_positions")})
    assert no_labels.loss is None and torch.equal(no_labels.start_pos, output.start_pos)
    assert len(model(**inputs, return_dict=False)) == 9


def test_reader_batch_equals_one_question_at_a_time():
    model = RealmReader(tiny_config()).eval()
    batch = _reader_inputs(3, seed=1)
    batch["has_answers"][1] = False  # one question with no gold block at all
    batched = model(**batch)
    for index in range(3):
        single = model(**{key: value[index] for key, value in batch.items()})
        torch.testing.assert_close(batched.retriever_loss[index], single.retriever_loss)
        torch.testing.assert_close(batched.reader_loss[index], single.reader_loss)
        assert batched.block_idx[index] == single.block_idx
        assert batched.start_pos[index] == single.start_pos[0] and batched.end_pos[index] == single.end_pos[0]
        assert torch.equal(batched.reader_correct[index], single.reader_correct)
    torch.testing.assert_close(batched.loss, (batched.retriever_loss + batched.reader_loss).mean())


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("relevance_score", "You have to specify `relevance_score`"),
        ("block_mask", "You have to specify `block_mask`"),
        ("token_type_ids", "You have to specify `token_type_ids`"),
    ],
)
def test_reader_requires_inputs(drop, message):
    model = RealmReader(tiny_config()).eval()
    inputs = {key: value[0] for key, value in _reader_inputs(1).items() if key != drop}
    with pytest.raises(ValueError, match=message):
        model(**inputs)


def test_reader_rejects_bad_shapes():
    model = RealmReader(tiny_config(max_span_width=20)).eval()
    inputs = {key: value[0] for key, value in _reader_inputs(1).items()}
    with pytest.raises(ValueError, match=r"sequence length \(12\) must be greater than or equal to .*\(20\)"):
        model(**inputs)
    model = RealmReader(tiny_config()).eval()
    inputs["relevance_score"] = inputs["relevance_score"][:1]
    with pytest.raises(ValueError, match=r"K >= 2 blocks read; got \(1, 1\)"):
        model(**inputs)
    with pytest.raises(NotImplementedError, match="head_mask"):
        model(**_reader_inputs(1), head_mask=torch.ones(2, 4))


def test_training_step_reaches_every_trainable_part(inputs):
    model = RealmKnowledgeAugEncoder(tiny_config()).train()
    output = model(inputs["candidate_ids"], relevance_score=torch.randn(BATCH, CANDIDATES), labels=inputs["input_ids"])
    output.loss.backward()
    assert model.realm.embeddings.word_embeddings.weight.grad.abs().sum() > 0

    reader = RealmReader(tiny_config()).train()
    batch = _reader_inputs(2)
    batch["relevance_score"].requires_grad_(True)
    reader(**batch).loss.backward()
    assert batch["relevance_score"].grad.abs().sum() > 0
    assert reader.qa_outputs.dense_output.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "model_class", [RealmEmbedder, RealmScorer, RealmKnowledgeAugEncoder, RealmReader, RealmForOpenQA]
)
def test_every_class_saves_safetensors_and_reloads_identically(tmp_path, model_class):
    model = model_class(tiny_config())
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    reloaded, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not reloaded.training
    original, loaded = model.state_dict(), reloaded.state_dict()
    assert original.keys() == loaded.keys()
    for key in original:
        assert torch.equal(original[key], loaded[key]), key


def test_missing_block_emb_is_zeros_not_garbage(tmp_path):
    config = tiny_config(num_block_records=50)
    RealmReader(config).save_pretrained(tmp_path / "reader")
    model = RealmForOpenQA(config)
    state = {key: value for key, value in model.state_dict().items() if key != "block_emb"}
    model = RealmForOpenQA(config)
    model.load_state_dict(state, strict=False)
    model.save_pretrained(tmp_path / "full")
    # write a checkpoint without block_emb, as a fine-tuned reader + embedder pair would be
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "full" / "model.safetensors")
    tensors.pop("block_emb")
    save_file(tensors, tmp_path / "full" / "model.safetensors", metadata={"format": "pt"})
    reloaded = RealmForOpenQA.from_pretrained(tmp_path / "full")
    assert reloaded.block_emb.shape == (50, 16)
    assert torch.count_nonzero(reloaded.block_emb) == 0


def test_open_qa_searcher_beam_follows_mode():
    model = RealmForOpenQA(tiny_config())
    assert model.training and model.searcher_beam_size == 4
    assert model.eval().searcher_beam_size == 2


def test_block_embedding_to_keeps_a_registered_buffer():
    model = RealmForOpenQA(tiny_config())
    model.block_embedding_to("cpu")
    assert "block_emb" in dict(model.named_buffers())
    assert "block_emb" in model.state_dict()


@pytest.mark.parametrize("damage", ["truncate", "garbage_header"])
def test_damaged_safetensors_file_is_named_with_sizes(tmp_path, damage):
    RealmReader(tiny_config()).save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"garbage" * 10)
    expected = (
        r"truncated: expected \d+ bytes from its header, received \d+"
        if damage == "truncate"
        else r"expected a safetensors header of \d+ bytes"
    )
    with pytest.raises(ValueError, match=f"model.safetensors is .*{expected}"):
        RealmReader.from_pretrained(tmp_path)


def test_truncated_pytorch_bin_is_named(tmp_path):
    model = RealmReader(tiny_config())
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    data = (tmp_path / "pytorch_model.bin").read_bytes()
    (tmp_path / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        ValueError, match=r"pytorch_model.bin is not a complete PyTorch checkpoint: .* found \d+ bytes"
    ):
        RealmReader.from_pretrained(tmp_path)


def test_reader_projection_scores_only_evidence_spans_exactly_as_all_spans():
    """The projection scores the spans inside the evidence only; logits and gradients equal scoring every span and
    masking the others to the most negative float (transformers 4.x's way)."""
    from realm_hf.modeling.modeling_realm import RealmReaderProjection, mask_to_score, span_candidates

    torch.manual_seed(0)
    config = tiny_config(span_hidden_size=16, max_span_width=3)
    projection = RealmReaderProjection(config)
    block_mask = torch.zeros(2, 3, 12, dtype=torch.long)
    block_mask[0, 0, 4:9] = block_mask[0, 2, 3:12] = block_mask[1, 1, 5:6] = 1  # (0, 1) and (1, 0), (1, 2): none
    states = torch.randn(2, 3, 12, config.hidden_size, requires_grad=True)
    logits, starts, ends = projection(states, block_mask)

    reference_states = states.detach().clone().requires_grad_()
    all_starts, all_ends = span_candidates(12, 3)
    start, end = projection.dense_intermediate(reference_states).chunk(2, dim=-1)
    hidden = projection.layer_normalization(projection.relu(start[..., all_starts, :] + end[..., all_ends, :]))
    mask = block_mask[..., all_starts] * block_mask[..., all_ends]
    reference = projection.dense_output(hidden).squeeze(-1) + mask_to_score(mask)

    assert torch.equal(starts, all_starts) and torch.equal(ends, all_ends)
    assert logits.shape == reference.shape == (2, 3, len(all_starts))
    assert torch.equal(logits == torch.finfo(torch.float32).min, mask == 0)
    torch.testing.assert_close(logits, reference)
    weights = torch.randn_like(reference).masked_fill(mask == 0, 0.0)
    (logits.masked_fill(mask == 0, 0.0) * weights).sum().backward()
    (reference.masked_fill(mask == 0, 0.0) * weights).sum().backward()
    torch.testing.assert_close(states.grad, reference_states.grad)

"""RETRO modeling: CCA causality, cache parity, RETRO-fitting identity, Auto round trip, clear input errors."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from retro_helpers import CHUNK, VOCAB, tiny_retro_config
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from realm_hf.retro import RetroCache, RetroConfig, RetroForCausalLM, RetroModel, paper_cca_layers


def _model(seed: int = 0, **overrides) -> RetroForCausalLM:
    torch.manual_seed(seed)
    model = RetroForCausalLM(tiny_retro_config(**overrides)).eval()
    # CCA's output projection starts at zero (a fresh branch adds nothing); give it weights so neighbours matter.
    for layer in model.transformer.h:
        if layer.cca is not None:
            torch.nn.init.normal_(layer.cca.attention.output.weight, std=0.3)
    return model


def _neighbours(batch: int, chunks: int, k: int = 2, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, chunks, k, 2 * CHUNK), generator=generator)


def _retriever(chunk: torch.Tensor) -> torch.Tensor:
    """Deterministic fake retrieval: neighbours depend on the chunk's tokens only."""
    generator = torch.Generator().manual_seed(int((chunk * torch.arange(1, chunk.shape[1] + 1)).sum()))
    return torch.randint(3, VOCAB, (chunk.shape[0], 2, 2 * CHUNK), generator=generator)


def test_paper_cca_layers():
    assert paper_cca_layers(12) == [5, 8, 11]
    assert paper_cca_layers(24) == [8, 11, 14, 17, 20, 23]
    assert RetroConfig().cca_layers == [5, 8, 11]


@pytest.mark.parametrize("chunk", [0, 1, 2])
def test_cca_is_causal(chunk):
    """Neighbours of chunk u reach tokens from chunk u's last token on, never before."""
    model = _model()
    input_ids = torch.randint(3, VOCAB, (2, 3 * CHUNK + 2))
    neighbours = _neighbours(2, 3)
    changed = neighbours.clone()
    changed[:, chunk] = _neighbours(2, 1, seed=7)[:, 0]
    with torch.no_grad():
        before = model(input_ids, neighbour_input_ids=neighbours).logits
        after = model(input_ids, neighbour_input_ids=changed).logits
    first_reader = chunk * CHUNK + CHUNK - 1
    assert torch.equal(before[:, :first_reader], after[:, :first_reader])
    assert not torch.allclose(before[:, first_reader], after[:, first_reader])


def test_first_tokens_see_no_neighbours_and_off_differs():
    model = _model()
    input_ids = torch.randint(3, VOCAB, (2, 3 * CHUNK))
    with torch.no_grad():
        on = model(input_ids, neighbour_input_ids=_neighbours(2, 3)).logits
        off = model(input_ids).logits
    assert torch.equal(on[:, : CHUNK - 1], off[:, : CHUNK - 1])
    assert not torch.allclose(on[:, CHUNK - 1 :], off[:, CHUNK - 1 :])


def test_incremental_cache_matches_full_forward():
    model = _model()
    input_ids = torch.randint(3, VOCAB, (2, 3 * CHUNK + 1))
    neighbours = _neighbours(2, 3)
    with torch.no_grad():
        full = model(input_ids, neighbour_input_ids=neighbours).logits
        cache = RetroCache(model.config)
        pieces = [model(input_ids[:, :6], past_key_values=cache, use_cache=True,
                        neighbour_input_ids=neighbours[:, : 6 // CHUNK]).logits]  # fmt: skip
        for position in range(6, input_ids.shape[1]):
            step = model(input_ids[:, position : position + 1], past_key_values=cache, use_cache=True,
                         neighbour_input_ids=neighbours[:, : (position + 1) // CHUNK])  # fmt: skip
            pieces.append(step.logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.num_encoded_chunks == 3


@pytest.mark.parametrize("retrieval", [True, False])
def test_generate_with_cache_equals_recomputation(retrieval):
    model = _model()
    prompt = torch.randint(3, VOCAB, (2, 3))
    kwargs = {"retriever": _retriever} if retrieval else {}
    cached = model.generate(prompt, 4 * CHUNK + 1, **kwargs)
    reference = model.generate(prompt, 4 * CHUNK + 1, use_cache=False, **kwargs)
    assert cached.shape == (2, 3 + 4 * CHUNK + 1)
    assert torch.equal(cached, reference)
    if retrieval:  # retrieval changed what was generated
        assert not torch.equal(cached, model.generate(prompt, 4 * CHUNK + 1))


def test_generate_without_retriever_past_prompt_neighbours_raises():
    model = _model()
    prompt = torch.randint(3, VOCAB, (1, CHUNK))
    with pytest.raises(ValueError, match="pass a retriever"):
        model.generate(prompt, CHUNK + 1, neighbour_input_ids=_neighbours(1, 1))


def _tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(3)
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64, bos_token_id=1,
                        eos_token_id=2, pad_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def test_retrofit_can_start_the_encoder_embeddings_from_the_base():
    base = _tiny_gpt2()
    model = RetroForCausalLM.from_base_model(base, chunk_size=CHUNK, cca_layers=[1], encoder_hidden_size=32,
                                             encoder_num_heads=2, encoder_num_layers=1,
                                             encoder_embeddings_from_base=True)  # fmt: skip
    encoder_embeddings = model.transformer.encoder.embed_tokens.weight
    assert torch.equal(encoder_embeddings, base.transformer.wte.weight)
    assert (
        encoder_embeddings.requires_grad and encoder_embeddings.data_ptr() != model.transformer.wte.weight.data_ptr()
    )
    with pytest.raises(ValueError, match=r"needs encoder_hidden_size \(16\) equal to the base's n_embd \(32\)"):
        RetroForCausalLM.from_base_model(base, chunk_size=CHUNK, cca_layers=[1], encoder_hidden_size=16,
                                         encoder_num_heads=2, encoder_num_layers=1, encoder_embeddings_from_base=True)  # fmt: skip


def test_retrofit_without_retrieval_is_bit_identical_to_base():
    base = _tiny_gpt2()
    model = RetroForCausalLM.from_base_model(base, chunk_size=CHUNK, cca_layers=[1, 2], encoder_hidden_size=16,
                                             encoder_num_heads=2, encoder_num_layers=1).eval()  # fmt: skip
    input_ids = torch.randint(3, VOCAB, (2, 3 * CHUNK + 2))
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits, base(input_ids).logits)
        # Fresh CCA adds exactly zero, so even retrieval on starts at the base model.
        on = model(input_ids, neighbour_input_ids=_neighbours(2, 3)).logits
    torch.testing.assert_close(on, base(input_ids).logits)
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable and all(RetroForCausalLM.is_retro_parameter(name) for name in trainable)
    assert not any(parameter.requires_grad for parameter in model.transformer.wte.parameters())

    # Train the new weights a little: the base weights do not move and retrieval off stays bit-identical.
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        loss = model(input_ids, neighbour_input_ids=_neighbours(2, 3), labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits, base(input_ids).logits)
        assert not torch.allclose(
            model(input_ids, neighbour_input_ids=_neighbours(2, 3)).logits, base(input_ids).logits
        )


def test_save_and_load_through_auto_classes(tmp_path):
    model = _model()
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "retro"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is RetroForCausalLM
    assert loaded.config.cca_layers == [1, 2]
    input_ids = torch.randint(3, VOCAB, (2, 2 * CHUNK))
    neighbours = _neighbours(2, 2)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids, neighbour_input_ids=neighbours).logits,
                           model(input_ids, neighbour_input_ids=neighbours).logits)  # fmt: skip
    assert type(AutoModelForCausalLM.from_config(tiny_retro_config()).transformer) is RetroModel
    assert not list(tmp_path.glob("*.bin"))


def test_relative_position_buckets():
    from realm_hf.retro.modeling_retro import relative_position_bucket

    offsets = torch.arange(-300, 301)
    buckets = relative_position_bucket(offsets, num_buckets=32, max_distance=128)
    # Short offsets (under a quarter of the buckets) each have their own bucket, each direction its own half.
    assert buckets[300] == 0
    assert buckets[300 - torch.arange(1, 8)].tolist() == list(range(1, 8))
    assert buckets[300 + torch.arange(1, 8)].tolist() == list(range(17, 24))
    # Longer ones share log-spaced buckets, never decreasing with distance, up to the last one of each half.
    backward, forward = buckets[:300].flip(0), buckets[301:]
    assert (backward.diff() >= 0).all() and (forward.diff() >= 0).all()
    assert backward.max() == 15 and forward.max() == 31 and buckets.min() == 0
    assert set(buckets.tolist()) == set(range(32)) - {16}  # offset 0 sits in the backward half only


def test_encoder_relative_position_logits_start_at_zero_and_models_saved_without_them_load_the_same(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    model = _model(encoder_relative_position_buckets=16)
    logits = [layer.relative_positions.weight for layer in model.transformer.encoder.layers]
    assert all(weight.shape == (2, 16) and not weight.any() for weight in logits)
    # With the logits trained they change what the encoder reads.
    input_ids, neighbours = torch.randint(3, VOCAB, (2, 2 * CHUNK)), _neighbours(2, 2)
    with torch.no_grad():
        before = model(input_ids, neighbour_input_ids=neighbours).logits
        logits[0].normal_(std=2.0)
        assert not torch.allclose(model(input_ids, neighbour_input_ids=neighbours).logits, before)
        logits[0].zero_()
    # A model saved before session 16 has neither the logits nor the config fields: it loads with them at zero, the
    # same outputs, and nothing reported missing.
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({key: value for key, value in weights.items() if "relative_positions" not in key},
              tmp_path / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    config = json.loads((tmp_path / "config.json").read_text())
    del config["encoder_relative_position_buckets"], config["encoder_relative_position_max_distance"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded, info = RetroForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    with torch.no_grad():
        assert torch.equal(loaded.eval()(input_ids, neighbour_input_ids=neighbours).logits, before)
    assert (
        RetroForCausalLM(tiny_retro_config(encoder_relative_position_buckets=0))
        .transformer.encoder.layers[0]
        .relative_positions
        is None
    )
    with pytest.raises(StrictDataclassClassValidationError, match="positive even number"):
        tiny_retro_config(encoder_relative_position_buckets=7)


@pytest.mark.parametrize(
    ("neighbours", "message"),
    [
        (torch.zeros(2, 3, 2 * CHUNK, dtype=torch.long), "4-D tensor"),
        (torch.zeros(2, 1, 2, 2 * CHUNK, dtype=torch.long), "complete chunks"),
        (torch.zeros(2, 5, 2, 2 * CHUNK, dtype=torch.long), "complete chunks"),
        (torch.zeros(3, 3, 2, 2 * CHUNK, dtype=torch.long), "batch size 3"),
        (torch.zeros(2, 3, 2, 2 * CHUNK), "token ids"),
    ],
)
def test_bad_neighbours_raise_clear_errors(neighbours, message):
    model = _model()
    with pytest.raises(ValueError, match=message):
        model(torch.randint(3, VOCAB, (2, 3 * CHUNK)), neighbour_input_ids=neighbours)


def test_other_bad_inputs_raise():
    model = _model()
    input_ids = torch.randint(3, VOCAB, (2, 2 * CHUNK))
    with pytest.raises(ValueError, match="neighbour_attention_mask"):
        model(input_ids, neighbour_input_ids=_neighbours(2, 2), neighbour_attention_mask=torch.ones(2, 2, 2, 3))
    cache = RetroCache(model.config)
    model(input_ids, past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="retrieval off"):
        model(input_ids[:, :1], past_key_values=cache, use_cache=True, neighbour_input_ids=_neighbours(2, 2))
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.randint(3, VOCAB, (1, 65)))
    with pytest.raises(StrictDataclassClassValidationError, match="cca_layers"):
        tiny_retro_config(cca_layers=[3])
    with pytest.raises(StrictDataclassClassValidationError, match="encoder_hidden_size"):
        tiny_retro_config(encoder_hidden_size=15)


def test_fully_padded_neighbours_add_nothing():
    model = _model()
    input_ids = torch.randint(3, VOCAB, (1, 2 * CHUNK))
    with torch.no_grad():
        padded = model(input_ids, neighbour_input_ids=torch.zeros(1, 2, 2, 2 * CHUNK, dtype=torch.long)).logits
        off = model(input_ids).logits
    assert torch.isfinite(padded).all()
    torch.testing.assert_close(padded, off)


# ------------------------------------------------------------------------------------------ left padding, batches


def _row_retriever(calls: list | None = None):
    """Fake retrieval chunk by chunk (neighbours depend on each chunk's own tokens, not on the batch), reporting
    made-up database chunk ids; `calls` records the `(rows, chunks)` of every call."""

    def retrieve(chunk: torch.Tensor, rows: torch.Tensor):
        if calls is not None:
            calls.append((rows.tolist(), chunk.tolist()))
        tokens, ids = [], []
        for row in chunk:
            seed = int((row * torch.arange(1, row.shape[0] + 1)).sum())
            tokens.append(torch.randint(3, VOCAB, (2, 2 * CHUNK), generator=torch.Generator().manual_seed(seed)))
            ids.append(torch.tensor([seed, seed + 1]))
        return torch.stack(ids), torch.stack(tokens)

    return retrieve


def _left_pad(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(prompt) for prompt in prompts)
    input_ids = torch.zeros(len(prompts), length, dtype=torch.long)
    attention_mask = torch.zeros(len(prompts), length, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, length - len(prompt) :] = prompt
        attention_mask[row, length - len(prompt) :] = 1
    return input_ids, attention_mask


# Chunks of 4: rows complete their chunks at different steps, some inside the prompt, one exactly at its end.
PROMPT_LENGTHS = (1, 4, 6, 9)


def _prompts(seed: int = 5) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (length,), generator=generator) for length in PROMPT_LENGTHS]


def test_left_padded_forward_equals_each_row_alone():
    model = _model()
    prompts = _prompts()
    input_ids, attention_mask = _left_pad(prompts)
    neighbours = _neighbours(len(prompts), max(PROMPT_LENGTHS) // CHUNK)  # row b's chunk u, counted from its start
    with torch.no_grad():
        batched = model(input_ids, attention_mask=attention_mask, neighbour_input_ids=neighbours).logits
        for row, prompt in enumerate(prompts):
            alone = model(prompt[None], neighbour_input_ids=neighbours[row : row + 1, : len(prompt) // CHUNK]).logits
            torch.testing.assert_close(batched[row, input_ids.shape[1] - len(prompt) :], alone[0], rtol=1e-5,
                                       atol=1e-5)  # fmt: skip


@pytest.mark.parametrize(("retrieval", "use_cache"), [(True, True), (True, False), (False, True)])
def test_batched_left_padded_generate_equals_one_by_one(retrieval, use_cache):
    model = _model()
    prompts = _prompts()
    input_ids, attention_mask = _left_pad(prompts)
    new_tokens = 2 * CHUNK + 2
    kwargs = {"retriever": _row_retriever()} if retrieval else {}
    batched = model.generate(input_ids, new_tokens, attention_mask=attention_mask, use_cache=use_cache, **kwargs)
    assert batched.shape == (len(prompts), input_ids.shape[1] + new_tokens)
    for row, prompt in enumerate(prompts):
        alone = model.generate(prompt[None], new_tokens, use_cache=use_cache, **kwargs)
        assert torch.equal(batched[row, input_ids.shape[1] - len(prompt) :], alone[0]), row
    if retrieval:  # the neighbours changed what was generated
        assert not torch.equal(batched, model.generate(input_ids, new_tokens, attention_mask=attention_mask))
    elif use_cache:  # nothing was read
        output = model.generate(input_ids, new_tokens, attention_mask=attention_mask, return_neighbours=True)
        assert torch.equal(output.sequences, batched) and output.retrieved is None
        assert output.padding.tolist() == [input_ids.shape[1] - len(prompt) for prompt in prompts]


def test_rows_retrieve_at_their_own_chunk_boundaries_once_each():
    model = _model()
    prompts = _prompts()
    input_ids, attention_mask = _left_pad(prompts)
    calls = []
    new_tokens = 2 * CHUNK + 1
    output = model.generate(input_ids, new_tokens, attention_mask=attention_mask, retriever=_row_retriever(calls),
                            return_neighbours=True)  # fmt: skip
    retrieved = [(row, tuple(chunk)) for rows, chunks in calls for row, chunk in zip(rows, chunks)]
    # Every chunk of every row is retrieved once (chunks counted from each row's first real token); the last generated
    # token is never fed, so a chunk it completes is not retrieved.
    fed = [len(prompt) + new_tokens - 1 for prompt in prompts]
    assert output.retrieved.sum(dim=1).tolist() == [length // CHUNK for length in fed]
    assert sorted(retrieved) == sorted(
        (row, tuple(output.sequences[row, pad + u * CHUNK : pad + (u + 1) * CHUNK].tolist()))
        for row, pad in enumerate(output.padding.tolist())
        for u in range(fed[row] // CHUNK)
    )
    # Calls group the rows that reach a boundary at the same step: the prompt's chunks in one call, then fewer rows.
    assert len(calls) < len(retrieved) and any(len(set(rows)) < len(prompts) for rows, _ in calls[1:])
    # What the model read: each retrieved chunk's neighbours and database ids, as the retriever returned them.
    reference = _row_retriever()
    for row in range(len(prompts)):
        for u in range(int(output.retrieved[row].sum())):
            ids, tokens = reference(output.chunk_input_ids[row, u][None], torch.tensor([row]))
            assert torch.equal(output.neighbour_input_ids[row, u], tokens[0])
            assert torch.equal(output.neighbour_chunk_ids[row, u], ids[0])
        assert (output.neighbour_chunk_ids[row][~output.retrieved[row]] == -1).all()
    assert torch.equal(output.sequences, model.generate(input_ids, new_tokens, attention_mask=attention_mask,
                                                        retriever=_row_retriever()))  # fmt: skip


def test_given_prompt_neighbours_then_retrieval_with_padding():
    """Neighbours given for the prompts' chunks are used, later chunks are retrieved; chunk ids unknown there."""
    model = _model()
    prompts = [prompt for prompt in _prompts() if len(prompt) >= CHUNK]
    input_ids, attention_mask = _left_pad(prompts)
    given = torch.stack([_row_retriever()(prompt[None, :CHUNK], torch.tensor([0]))[1][0] for prompt in prompts])
    output = model.generate(input_ids, 2 * CHUNK, attention_mask=attention_mask, neighbour_input_ids=given[:, None],
                            retriever=_row_retriever(), return_neighbours=True)  # fmt: skip
    expected = model.generate(input_ids, 2 * CHUNK, attention_mask=attention_mask, retriever=_row_retriever())
    assert torch.equal(output.sequences, expected)
    assert (output.neighbour_chunk_ids[:, 0] == -1).all() and (output.neighbour_chunk_ids[:, 1] >= 0).all()


def test_generate_rejects_right_padding_and_bad_masks():
    model = _model()
    input_ids = torch.randint(3, VOCAB, (2, 5))
    with pytest.raises(ValueError, match="left-padded"):
        model.generate(input_ids, 2, attention_mask=torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="shape of input_ids"):
        model.generate(input_ids, 2, attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="without any token"):
        model(input_ids, attention_mask=torch.tensor([[0] * 5, [1] * 5]))

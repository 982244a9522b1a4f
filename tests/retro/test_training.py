"""RETRO training helpers: sequences, collator, bits per byte, Trainer with a frozen base."""

import math

import pytest
import torch
from retro_helpers import CHUNK, VOCAB, tiny_retro_config
from transformers import TrainingArguments

from realm_hf.retro import (
    RetroCollator,
    RetroForCausalLM,
    RetroSequences,
    RetroTrainer,
    bits_per_byte,
    chunk_documents,
    evaluate_bits_per_byte,
)


def _data():
    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(3, VOCAB, (length,), generator=generator).tolist() for length in (13, 9, 20, 7)]
    chunks = chunk_documents(documents, CHUNK)
    neighbour_ids = torch.randint(0, len(chunks), (len(chunks), 2), generator=generator)
    return chunks, neighbour_ids


def test_sequences_and_collator():
    chunks, neighbour_ids = _data()
    sequences = RetroSequences(chunks, neighbour_ids, chunks_per_sequence=2)
    # 4 + 3 + 5 + 2 chunks -> windows of at most 2 chunks that never cross a document
    assert [count for _, count in sequences.windows] == [2, 2, 2, 1, 2, 2, 1, 2]
    batch = RetroCollator(chunks)([sequences[3], sequences[0]])
    assert batch["input_ids"].shape == (2, 2 * CHUNK)
    assert batch["neighbour_input_ids"].shape == (2, 2, 2, 2 * CHUNK)
    assert (batch["labels"][0, CHUNK:] == -100).all()  # the short sequence is padded, padding ignored
    assert (batch["neighbour_input_ids"][0, 1] == 0).all()  # its missing chunk has no neighbours
    assert "neighbour_input_ids" not in RetroCollator(chunks, retrieval="off")([sequences[0]])
    shuffled = sequences.with_shuffled_neighbours(seed=1)
    assert sorted(shuffled.neighbour_ids.tolist()) == sorted(neighbour_ids.tolist())


def test_bits_per_byte_and_modes():
    assert math.isclose(bits_per_byte(math.log(2) * 10, 5), 2.0)
    chunks, neighbour_ids = _data()
    torch.manual_seed(0)
    model = RetroForCausalLM(tiny_retro_config())
    sequences = RetroSequences(chunks, neighbour_ids, chunks_per_sequence=3)
    off = evaluate_bits_per_byte(model, sequences, RetroCollator(chunks, retrieval="off"), num_bytes=100)
    on = evaluate_bits_per_byte(model, sequences, RetroCollator(chunks), num_bytes=100)
    # every real token but the first of each window is predicted: 13 + 9 + 20 + 7 tokens in 6 windows
    assert off["tokens"] == on["tokens"] == 49 - len(sequences)
    # A fresh model's CCA output projection is zero: retrieval changes nothing yet.
    assert math.isclose(on["nats"], off["nats"], rel_tol=1e-5)
    assert math.isclose(on["bits_per_byte"], on["nats"] / math.log(2) / 100)


def test_trainer_trains_only_the_new_weights(tmp_path):
    chunks, neighbour_ids = _data()
    torch.manual_seed(0)
    model = RetroForCausalLM(tiny_retro_config())
    model.freeze_base_model()
    frozen = model.transformer.wte.weight.detach().clone()
    cca = model.transformer.h[1].cca.attention.output.weight.detach().clone()
    sequences = RetroSequences(chunks, neighbour_ids, chunks_per_sequence=2)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
                             report_to=[], save_strategy="no", use_cpu=True, logging_steps=1,
                             per_device_eval_batch_size=4)  # fmt: skip
    trainer = RetroTrainer(model=model, args=args, train_dataset=sequences, eval_dataset=sequences,
                           database_chunks=chunks, eval_num_bytes=500)  # fmt: skip
    trainer.train()
    assert torch.equal(model.transformer.wte.weight, frozen)
    assert not torch.equal(model.transformer.h[1].cca.attention.output.weight, cca)
    metrics = trainer.evaluate()
    assert {"eval_on_bits_per_byte", "eval_off_bits_per_byte", "eval_shuffled_bits_per_byte"} <= set(metrics)


def test_retro_learns_to_read_the_next_chunk_from_its_neighbours():
    # Random tokens: a chunk cannot be guessed from what precedes it, only read from the neighbours of the chunk
    # before, whose continuation holds it. Retrieval on must fall far below off, and shuffled neighbours must not help.
    torch.manual_seed(0)
    model = RetroForCausalLM(tiny_retro_config(num_neighbors=1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def batch(size=16, chunks=4):
        ids = torch.randint(3, VOCAB, (size, chunks * CHUNK))
        split = ids.view(size, chunks, CHUNK)
        following = torch.cat([split[:, 1:], torch.zeros(size, 1, CHUNK, dtype=torch.long)], dim=1)
        return ids, torch.cat([split, following], dim=-1)[:, :, None, :]  # (B, L, 1, 2 * CHUNK)

    for _ in range(200):
        ids, neighbours = batch()
        model(ids, neighbour_input_ids=neighbours, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    ids, neighbours = batch(64)
    with torch.no_grad():
        on = model(ids, neighbour_input_ids=neighbours, labels=ids).loss.item()
        off = model(ids, labels=ids).loss.item()
        shuffled = model(ids, neighbour_input_ids=neighbours.roll(1, dims=0), labels=ids).loss.item()
    assert on < off - 2.0 and shuffled > off, (on, off, shuffled)  # off: about ln(37) = 3.6 per token


def _copy_baseline_by_hand(lm, dataset, chunks, num_bytes, weight):
    """The copy baseline token by token, as its docstring says."""
    collator = RetroCollator(chunks)
    nats = 0.0
    for index in range(len(dataset)):
        batch = collator([dataset[index]])
        ids, neighbours = batch["input_ids"][0].tolist(), batch["neighbour_input_ids"][0]
        with torch.no_grad():
            probabilities = lm(input_ids=batch["input_ids"]).logits[0].float().softmax(-1)
        for t in range(len(ids) - 1):
            if batch["labels"][0, t + 1] == -100:  # the padding that ends a document's last chunk
                continue
            target, chunk = ids[t + 1], (t + 1) // CHUNK - 1
            p_copy = 0.0
            if chunk >= 0:
                rows = [[token for token in row.tolist()] for row in neighbours[chunk]]
                bag = [token for row in rows for token in row if token != chunks.pad_token_id]
                following = [row[j + 1] for row in rows for j in range(len(row) - 1)
                             if row[j] == ids[t] and row[j + 1] != chunks.pad_token_id]  # fmt: skip
                if following:
                    p_copy = following.count(target) / len(following)
                elif bag:
                    p_copy = bag.count(target) / len(bag)
            nats -= math.log((1 - weight) * float(probabilities[t, target]) + weight * p_copy)
    return bits_per_byte(nats, num_bytes)


def test_the_copy_baseline_mixes_the_lm_with_what_follows_the_previous_token_in_the_neighbours():
    from transformers import GPT2Config, GPT2LMHeadModel

    from realm_hf.retro import copy_baseline_bits_per_byte

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(3, VOCAB, (length,), generator=generator).tolist() for length in (14, 11, 17)]
    chunks = chunk_documents(documents, CHUNK)
    # half the neighbours are the chunk itself (its continuation: the next chunk), half random
    own = torch.arange(len(chunks))[:, None]
    neighbours = torch.cat((own, torch.randint(0, len(chunks), (len(chunks), 1), generator=generator)), dim=1)
    dataset = RetroSequences(chunks, neighbours, 3)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
    result = copy_baseline_bits_per_byte(lm, dataset, chunks, num_bytes=100, weights=(0.1, 0.5))
    off = evaluate_bits_per_byte(lm, dataset, RetroCollator(chunks, retrieval="off"), num_bytes=100)
    assert set(result) == {"lm", "copy w=0.1", "copy w=0.5"}
    assert math.isclose(result["lm"], off["bits_per_byte"], rel_tol=1e-5)
    for weight in (0.1, 0.5):
        expected = _copy_baseline_by_hand(lm, dataset, chunks, 100, weight)
        assert math.isclose(result[f"copy w={weight:g}"], expected, rel_tol=1e-6)
    # the next chunk is in the neighbours: reading them helps an untrained LM a lot
    assert result["copy w=0.5"] < 0.8 * result["lm"]
    with pytest.raises(ValueError, match=r"weights must each be in \(0, 1\)"):
        copy_baseline_bits_per_byte(lm, dataset, chunks, num_bytes=100, weights=(1.0,))

"""Training speed switches: length-bucketed reading equals padded reading, and the precision switches (flags, default
detection, bf16 autocast where claimed and fp32 when asked, bf16-built index agreeing with the fp32-built one)."""

import argparse

import numpy as np
import pytest
import torch
from conftest import RETRIEVAL_TEST_VOCAB, tiny_config

from realm_hf import RealmEmbedder, RealmForOpenQA, RealmReader, RealmRetriever, RealmTokenizer
from realm_hf.modeling.modeling_realm import length_buckets
from realm_hf.precision import (
    add_precision_argument,
    autocast,
    cpu_has_native_bf16,
    precision_from_args,
    resolve_precision,
)
from realm_hf.retrieval.embedding import embed_blocks
from realm_hf.training import (
    enable_length_buckets,
    ict_training_arguments,
    orqa_training_arguments,
    precision_settings,
)


def _mask(lengths, seq_len):
    mask = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return mask


def test_length_buckets_cover_every_row_once_at_its_group_length():
    lengths = [3, 10, 4, 9, 2, 10, 5]
    groups = length_buckets(_mask(lengths, 10), 3)
    assert len(groups) == 3
    rows = torch.cat([group for group, _ in groups]).tolist()
    assert sorted(rows) == list(range(len(lengths)))
    for group, length in groups:
        assert length == max(lengths[row] for row in group.tolist())
    # The optimal 3-way split of the sorted lengths 2 3 4 5 9 10 10: {2 3} at 3, {4 5} at 5, {9 10 10} at 10
    # (46 tokens; {2 3 4 5} {9} {10 10} would read 49).
    assert sum(len(group) * length for group, length in groups) == 2 * 3 + 2 * 5 + 3 * 10
    assert length_buckets(_mask(lengths, 10), 1) is None
    assert length_buckets(_mask([10, 10], 10), 4) is None  # nothing to save: read as one batch
    assert length_buckets(_mask([6], 10), 4) is None  # one row: nothing to group
    left_padded = _mask(lengths, 10).flip(-1)
    assert length_buckets(left_padded, 3) is None  # not right-padded: read as one batch


def _reader_inputs(seed=0, batch=2, num_read=3, seq_len=24, vocab=99):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, seq_len + 1, (batch, num_read), generator=generator)
    lengths[0, 0] = seq_len
    columns = torch.arange(seq_len)
    attention_mask = (columns < lengths[..., None]).long()  # (B, R, L)
    input_ids = torch.randint(5, vocab, (batch, num_read, seq_len), generator=generator) * attention_mask
    token_type_ids = ((columns >= 4) & (columns < lengths[..., None])).long()
    block_mask = token_type_ids.bool() & (columns < lengths[..., None] - 1)
    relevance_score = torch.randn(batch, 5, generator=generator)
    start_positions = torch.full((batch, 5, 2), -1)
    end_positions = torch.full((batch, 5, 2), -1)
    start_positions[:, 0, 0], end_positions[:, 0, 0] = 5, 6
    start_positions[1, 2, 0], end_positions[1, 2, 0] = 4, 4
    has_answers = start_positions[..., 0] >= 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
            "block_mask": block_mask, "relevance_score": relevance_score, "start_positions": start_positions,
            "end_positions": end_positions, "has_answers": has_answers}  # fmt: skip


def test_bucketed_reader_equals_padded_reader_logits_loss_and_gradients():
    torch.manual_seed(0)
    reader = RealmReader(tiny_config(max_span_width=3)).eval()
    inputs = _reader_inputs()
    padded = reader(**inputs, return_dict=True)
    padded.loss.backward()
    padded_grads = {name: parameter.grad.clone() for name, parameter in reader.named_parameters()
                    if parameter.grad is not None}  # fmt: skip
    reader.zero_grad()
    enable_length_buckets(reader, 4)
    seen = []
    handle = reader.realm.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    bucketed = reader(**inputs, return_dict=True)
    handle.remove()
    assert len(seen) > 1 and all(shape[-1] <= 24 for shape in seen) and min(shape[-1] for shape in seen) < 24
    assert sum(shape[0] for shape in seen) == 6  # every block read once
    torch.testing.assert_close(bucketed.loss, padded.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bucketed.reader_loss, padded.reader_loss, rtol=1e-5, atol=1e-5)
    assert torch.equal(bucketed.block_idx, padded.block_idx) and torch.equal(bucketed.candidate, padded.candidate)
    bucketed.loss.backward()
    for name, parameter in reader.named_parameters():
        if name in padded_grads:
            torch.testing.assert_close(parameter.grad, padded_grads[name], rtol=1e-4, atol=1e-5, msg=name)
    # Span logits on evidence tokens agree; spans outside stay at the most negative float in both.
    logits_padded, *_ = reader._span_logits(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"],
                                            None, None, inputs["relevance_score"], inputs["block_mask"])  # fmt: skip
    reader.max_length_buckets = 1
    logits_plain, *_ = reader._span_logits(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"],
                                           None, None, inputs["relevance_score"], inputs["block_mask"])  # fmt: skip
    valid = logits_plain > -1e30
    assert torch.equal(valid, logits_padded > -1e30)
    torch.testing.assert_close(logits_padded[valid], logits_plain[valid], rtol=1e-5, atol=1e-5)


RECORDS = np.array([b"This is the first record", b"This is the second record, want",
                    b"This is the third record and then some more words to make it longer than the rest",
                    b"This is the fourth record, running low", b"fifth", b"The lowest record is the fifth"],
                   dtype=object)  # fmt: skip


def test_open_qa_with_length_buckets_equals_the_padded_forward(retrieval_vocab_file):
    torch.manual_seed(0)
    tokenizer = RealmTokenizer(str(retrieval_vocab_file))
    config = tiny_config(vocab_size=len(RETRIEVAL_TEST_VOCAB), num_block_records=len(RECORDS), reader_beam_size=3,
                         searcher_beam_size=5)  # fmt: skip
    model = RealmForOpenQA(config, retriever=RealmRetriever(block_records=RECORDS, tokenizer=tokenizer))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
        model.block_emb.normal_()
    model.eval()
    questions = tokenizer(["test question", "this is the lowest question want"], padding=True, return_tensors="pt")
    answers = [tokenizer([answer], add_special_tokens=False).input_ids for answer in ("fifth", "lowest")]
    plain = model(**questions, answer_ids=answers)
    enable_length_buckets(model, 4)
    bucketed = model(**questions, answer_ids=answers)
    torch.testing.assert_close(bucketed.reader_output.loss, plain.reader_output.loss, rtol=1e-5, atol=1e-5)
    for left, right in zip(bucketed.predicted_answer_ids, plain.predicted_answer_ids, strict=True):
        assert torch.equal(left, right)
    with pytest.raises(ValueError, match="max_buckets must be >= 1"):
        enable_length_buckets(model, 0)
    with pytest.raises(ValueError, match="expected a RealmForOpenQA or a RealmReader"):
        enable_length_buckets(torch.nn.Linear(2, 2), 2)


def test_precision_flags_parse_and_contradictions_are_refused():
    parser = argparse.ArgumentParser()
    add_precision_argument(parser)
    assert precision_from_args(parser.parse_args([])) == "auto"
    assert precision_from_args(parser.parse_args(["--fp32"])) == "fp32"
    assert precision_from_args(parser.parse_args(["--precision", "bf16"])) == "bf16"
    assert precision_from_args(parser.parse_args(["--precision", "fp32", "--fp32"])) == "fp32"
    with pytest.raises(ValueError, match="--fp32 and --precision bf16 contradict"):
        precision_from_args(parser.parse_args(["--precision", "bf16", "--fp32"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--precision", "fp16"])
    with pytest.raises(ValueError, match="precision must be one of auto, bf16, fp32; received 'half'"):
        resolve_precision("half")


def test_default_precision_follows_the_cpu_flags(monkeypatch):
    assert cpu_has_native_bf16(frozenset({"avx2", "avx512_bf16"}), "AVX512")
    assert cpu_has_native_bf16(frozenset({"amx_bf16", "amx_tile"}), "AVX512")
    assert cpu_has_native_bf16(frozenset(), "AMX_BF16")
    assert not cpu_has_native_bf16(frozenset({"avx2", "avx512f"}), "AVX2")
    monkeypatch.delenv("REALM_HF_PRECISION", raising=False)
    expected = "bf16" if cpu_has_native_bf16() else "fp32"
    assert resolve_precision("auto", "cpu") == expected and resolve_precision(None, "cpu") == expected
    assert resolve_precision("fp32", "cpu") == "fp32" and resolve_precision("bf16", "cpu") == "bf16"
    monkeypatch.setenv("REALM_HF_PRECISION", "fp32")
    assert resolve_precision("auto", "cpu") == "fp32"
    monkeypatch.setenv("REALM_HF_PRECISION", "bf16")
    assert resolve_precision("auto", "cpu") == "bf16" and resolve_precision("fp32", "cpu") == "fp32"
    monkeypatch.setenv("REALM_HF_PRECISION", "fp8")
    with pytest.raises(ValueError, match="REALM_HF_PRECISION must be bf16 or fp32; received 'fp8'"):
        resolve_precision("auto")


def test_training_arguments_turn_bf16_on_only_when_asked_or_native(tmp_path, monkeypatch):
    monkeypatch.delenv("REALM_HF_PRECISION", raising=False)
    assert precision_settings("fp32", use_cpu=True) == {"bf16": False}
    assert precision_settings("bf16", use_cpu=True) == {"bf16": True, "use_cpu": True}
    args = orqa_training_arguments(str(tmp_path), max_steps=4, precision="bf16", use_cpu=True)
    assert args.bf16 and args.use_cpu
    assert not orqa_training_arguments(str(tmp_path), max_steps=4, precision="fp32", use_cpu=True).bf16
    assert not orqa_training_arguments(str(tmp_path), max_steps=4, precision="bf16", bf16=False, use_cpu=True).bf16
    assert ict_training_arguments(str(tmp_path), max_steps=4, precision="bf16", use_cpu=True).bf16
    auto = orqa_training_arguments(str(tmp_path), max_steps=4, use_cpu=True)
    assert auto.bf16 == (not torch.cuda.is_available() and cpu_has_native_bf16())


def _output_dtypes(embedder):
    dtypes = []
    embedder.realm.encoder.layer[0].attention.self.query.register_forward_hook(
        lambda module, args, output: dtypes.append(output.dtype)
    )
    return dtypes


def _embedder_and_tokenizer():
    words = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(40)]
    torch.manual_seed(0)
    tokenizer = RealmTokenizer(vocab={token: index for index, token in enumerate(words)})
    embedder = RealmEmbedder(tiny_config(vocab_size=len(words), hidden_size=64, intermediate_size=128)).eval()
    with torch.no_grad():
        # Widely spread weights: a fresh random BERT maps every text to nearly the same vector, and retrieval among
        # near-ties would measure float noise rather than the precision.
        for parameter in embedder.parameters():
            parameter.normal_(0.0, 0.2)
    return embedder, tokenizer


def test_index_embedding_runs_in_bf16_when_asked_and_its_retrieval_agrees_with_fp32():
    embedder, tokenizer = _embedder_and_tokenizer()
    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{i}" for i in rng.integers(0, 40, size=rng.integers(3, 20))) for _ in range(300)]
    dtypes = _output_dtypes(embedder)
    fp32 = embed_blocks(embedder, tokenizer, texts, batch_size=64, max_length=24, precision="fp32")
    assert set(dtypes) == {torch.float32}
    dtypes.clear()
    bf16 = embed_blocks(embedder, tokenizer, texts, batch_size=64, max_length=24, precision="bf16")
    assert set(dtypes) == {torch.bfloat16}  # the encoder's matrix products ran in bf16
    assert bf16.dtype == torch.float32 and bf16.shape == fp32.shape  # stored in fp32
    assert not torch.equal(bf16, fp32)
    # Retrieval over each index for queries made from the blocks themselves: the top 10 mostly agree.
    queries = embed_blocks(embedder, tokenizer, texts[:40], max_length=24, precision="fp32")
    top_fp32 = (queries @ fp32.T).topk(10).indices
    top_bf16 = (queries @ bf16.T).topk(10).indices
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(top_fp32.tolist(), top_bf16.tolist())])
    assert overlap >= 0.8  # a 40-word toy vocabulary has many near-ties; the offline corpus: benchmarks/README.md
    relative_error = (bf16 - fp32).norm(dim=1) / fp32.norm(dim=1)
    assert float(relative_error.max()) < 0.05  # bf16's 8-bit mantissa: errors of a few parts in a thousand


def test_autocast_context_and_fp32_losses_under_bf16(retrieval_vocab_file):
    with autocast("fp32"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast("bf16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    torch.manual_seed(0)
    tokenizer = RealmTokenizer(str(retrieval_vocab_file))
    config = tiny_config(vocab_size=len(RETRIEVAL_TEST_VOCAB), num_block_records=len(RECORDS), reader_beam_size=3,
                         searcher_beam_size=5)  # fmt: skip
    model = RealmForOpenQA(config, retriever=RealmRetriever(block_records=RECORDS, tokenizer=tokenizer)).eval()
    with torch.no_grad():
        model.block_emb.normal_()
    questions = tokenizer(["test question", "the lowest want"], padding=True, return_tensors="pt")
    answers = [tokenizer([answer], add_special_tokens=False).input_ids for answer in ("fifth", "lowest")]
    fp32 = model(**questions, answer_ids=answers).reader_output
    with autocast("bf16"):
        bf16 = model(**questions, answer_ids=answers).reader_output
    for name in ("loss", "retriever_loss", "reader_loss"):
        assert getattr(bf16, name).dtype == torch.float32, name
    torch.testing.assert_close(bf16.loss, fp32.loss, rtol=0.05, atol=0.05)

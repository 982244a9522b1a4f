"""ICT warm start: sentence splitting and removal, the collator, the in-batch loss (local and across 2 gloo ranks), the
two-encoder model, its checkpoints and a short Trainer run."""

import json
import os
import random
import subprocess
from pathlib import Path

import datasets
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config, torchrun
from transformers import TrainingArguments

from realm_hf import RealmEmbedder, RealmTokenizer
from realm_hf.retrieval.document_store import DocumentStore
from realm_hf.training import (
    ICTCollator,
    ICTTrainer,
    RealmICTModel,
    ict_loss,
    ict_training_arguments,
    make_ict_example,
    split_sentences,
)

WORKER = Path(__file__).parent / "ict_worker.py"
NOUNS = ["river", "city", "king", "bridge", "forest", "song", "ship", "tower", "lake", "road", "castle", "garden"]
VERBS = ["flows", "stands", "sings", "falls", "grows", "sails", "shines", "waits"]
PLACES = ["north", "south", "east", "west", "home", "here", "there", "away"]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", *NOUNS, *VERBS, *PLACES]


def corpus(num_blocks: int = 12, seed: int = 0) -> list[dict[str, str]]:
    """Blocks of 1-4 distinct sentences ("The river flows north."); every sentence occurs once in the corpus."""
    rng = random.Random(seed)
    sentences = [f"The {n} {v} {p}." for n in NOUNS for v in VERBS for p in PLACES]
    rng.shuffle(sentences)
    rows = []
    for index in range(num_blocks):
        count = 1 + index % 4
        rows.append({"title": NOUNS[index % len(NOUNS)], "text": " ".join(sentences[:count])})
        del sentences[:count]
    return rows


@pytest.fixture
def tokenizer():
    return RealmTokenizer(vocab={token: index for index, token in enumerate(WORDS)})


def tiny_ict_model(**kwargs) -> RealmICTModel:
    torch.manual_seed(0)
    return RealmICTModel(tiny_config(vocab_size=len(WORDS)), **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# examples


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two! Three? 4 four.", ["One.", "Two!", "Three?", "4 four."]),
        ('He said "Go." Then (it rained.) End', ['He said "Go."', "Then (it rained.)", "End"]),
        ("no capital. after the stop", ["no capital. after the stop"]),
        ("  ", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_sentence_is_removed_with_probability_0_9():
    rng = random.Random(0)
    text = "Alpha one. Beta two. Gamma three. Delta four."
    removed = [make_ict_example("T", text, rng)[3] for _ in range(4000)]
    # 4000 draws: the standard deviation of the rate is 0.0047, so +-0.02 is over 4 sigma.
    assert abs(sum(removed) / len(removed) - 0.9) < 0.02
    always = [make_ict_example("T", text, rng, remove_probability=1.0)[3] for _ in range(50)]
    never = [make_ict_example("T", text, rng, remove_probability=0.0)[3] for _ in range(50)]
    assert all(always) and not any(never)


def test_pseudo_query_is_absent_from_the_context_exactly_when_removed():
    rng = random.Random(1)
    seen = {True: 0, False: 0}
    for _ in range(200):
        for row in corpus():
            query, title, context, removed = make_ict_example(row["title"], row["text"], rng)
            assert title == row["title"]
            assert query in split_sentences(row["text"])
            assert (query not in context) == removed
            if removed:
                # Only that sentence went: the rest of the block keeps its order.
                assert split_sentences(context) == [s for s in split_sentences(row["text"]) if s != query]
            else:
                assert context == row["text"]
            seen[removed] += 1
    assert seen[True] > 0 and seen[False] > 0


def test_one_sentence_block_keeps_its_sentence_and_bad_input_raises():
    rng = random.Random(0)
    assert all(make_ict_example("T", "Only one.", rng) == ("Only one.", "T", "Only one.", False) for _ in range(20))
    with pytest.raises(ValueError, match="at least one sentence"):
        make_ict_example("T", "   ", rng)
    with pytest.raises(ValueError, match=r"in \[0, 1\], got 1.5"):
        make_ict_example("T", "A. B.", rng, remove_probability=1.5)
    with pytest.raises(ValueError, match=r"title_query_probability must be in \[0, 1\], got -0.1"):
        make_ict_example("T", "A. B.", rng, title_query_probability=-0.1)


def test_title_as_pseudo_query_keeps_the_whole_block():
    rng = random.Random(0)
    text = "Lome is the capital. It lies on the coast. It is a port."
    examples = [make_ict_example("Togo. Government. Capital", text, rng, title_query_probability=0.5)
                for _ in range(2000)]  # fmt: skip
    by_title = [example for example in examples if example[0] == "Togo. Government. Capital"]
    assert 0.45 < len(by_title) / len(examples) < 0.55
    assert all(example[1:] == ("Togo. Government. Capital", text, False) for example in by_title)
    # Without a title the sentence rule applies, whatever the probability.
    assert all(make_ict_example("", text, rng, title_query_probability=1.0)[0] in split_sentences(text)
               for _ in range(50))  # fmt: skip
    # 0 (the default) draws nothing extra: the random stream is ORQA's.
    assert make_ict_example("T", text, random.Random(3)) == make_ict_example(
        "T", text, random.Random(3), title_query_probability=0.0
    )


# ---------------------------------------------------------------------------------------------------------------------
# collator


def _unpadded(batch: dict, prefix: str, row: int) -> list[int]:
    return batch[f"{prefix}_input_ids"][row][batch[f"{prefix}_attention_mask"][row].bool()].tolist()


def test_collator_shapes_layout_and_determinism(tokenizer):
    rows = corpus(8)
    collator = ICTCollator(tokenizer, max_query_length=8, max_block_length=24, seed=3, return_removed=True)
    batch = collator(rows)
    assert set(batch) == {
        "query_input_ids", "query_attention_mask", "query_token_type_ids",
        "block_input_ids", "block_attention_mask", "block_token_type_ids", "sentence_removed",
    }  # fmt: skip
    assert batch["query_input_ids"].shape[0] == batch["block_input_ids"].shape[0] == 8
    assert batch["query_input_ids"].shape[1] <= 8 and batch["block_input_ids"].shape[1] <= 24
    assert batch["sentence_removed"].dtype == torch.bool
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for row in range(8):
        query = _unpadded(batch, "query", row)
        assert query[0] == cls and query[-1] == sep and query.count(sep) == 1
        block = _unpadded(batch, "block", row)
        # [CLS] title [SEP] context [SEP], the context in segment 1.
        assert block[:3] == [cls, tokenizer.convert_tokens_to_ids(rows[row]["title"]), sep] and block[-1] == sep
        assert batch["block_token_type_ids"][row][3] == 1
    # Same seed: same batch, and each row's example does not depend on its batch-mates or position.
    again = collator(rows)
    assert all(torch.equal(batch[key], again[key]) for key in batch)
    alone = collator(rows[5:6])
    assert _unpadded(alone, "query", 0) == _unpadded(batch, "query", 5)
    assert _unpadded(alone, "block", 0) == _unpadded(batch, "block", 5)
    other_seed = ICTCollator(tokenizer, max_query_length=8, max_block_length=24, seed=4)(rows)
    assert not torch.equal(other_seed["query_input_ids"], batch["query_input_ids"])


def test_collator_reads_block_ids_from_a_document_store(tokenizer, tmp_path):
    rows = corpus(6)
    store = DocumentStore.from_records(rows, cache_dir=tmp_path)
    collator = ICTCollator(tokenizer, max_query_length=8, max_block_length=24, document_store=store)
    from_store = collator([{"id": index} for index in range(6)])
    from_rows = collator([{"id": index, **row} for index, row in enumerate(rows)])
    assert all(torch.equal(from_store[key], from_rows[key]) for key in from_store)
    with pytest.raises(ValueError, match="got keys \\['id'\\]"):
        ICTCollator(tokenizer)([{"id": 0}])


# ---------------------------------------------------------------------------------------------------------------------
# loss


def test_ict_loss_is_in_batch_cross_entropy():
    generator = torch.Generator().manual_seed(0)
    queries, blocks = torch.randn(5, 4, generator=generator), torch.randn(5, 4, generator=generator)
    scores = queries @ blocks.T
    expected = -torch.stack([scores[i].log_softmax(dim=0)[i] for i in range(5)]).mean()
    result = ict_loss(queries, blocks)  # no process group: local in-batch negatives only
    torch.testing.assert_close(result["loss"], expected)
    torch.testing.assert_close(result["loss"], F.cross_entropy(scores, torch.arange(5)))
    assert result["accuracy"] == (scores.argmax(dim=1) == torch.arange(5)).float().mean()


def test_ict_accuracy_counts_queries_whose_own_block_wins():
    blocks = torch.eye(4)
    queries = torch.eye(4)[[0, 1, 3, 2]]  # queries 0 and 1 find their block, 2 and 3 each other's
    assert ict_loss(queries, blocks)["accuracy"].item() == 0.5
    assert ict_loss(torch.eye(4) * 10, blocks)["accuracy"].item() == 1.0
    with pytest.raises(ValueError, match=r"same shape \(B, D\), got \(4, 4\) and \(3, 4\)"):
        ict_loss(torch.eye(4), torch.eye(4)[:3])


def test_two_ranks_gather_the_global_batch(tmp_path):
    command = [*torchrun(2), str(WORKER), str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, report in enumerate(reports):
        assert (report["rank"], report["world_size"]) == (rank, 2)
        for name, case in report["cases"].items():
            message = f"rank {rank}, {name}"
            assert case["loss"] == pytest.approx(case["expected_loss"], rel=1e-5), message
            assert case["accuracy"] == pytest.approx(case["expected_accuracy"]), message
            # The other rank's blocks really were negatives.
            assert case["loss"] > case["local_only_loss"], message
            for key in ("query_grad", "block_grad"):
                torch.testing.assert_close(torch.tensor(case[key]), torch.tensor(case[f"expected_{key}"]), msg=message)
    equal = [report["cases"]["equal"] for report in reports]
    # Equal batches: the mean of the rank losses is the single-process loss over the whole batch.
    generator = torch.Generator().manual_seed(0)
    queries, blocks = torch.randn(8, 8, generator=generator), torch.randn(8, 8, generator=generator)
    blocks[:2] = queries[:2] * 3
    global_loss = ict_loss(queries, blocks, gather_across_ranks=False)["loss"].item()
    assert (equal[0]["loss"] + equal[1]["loss"]) / 2 == pytest.approx(global_loss, rel=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# model


def test_gradients_reach_both_encoders(tokenizer):
    model = tiny_ict_model()
    batch = ICTCollator(tokenizer, max_query_length=8, max_block_length=24)(corpus(6))
    output = model(**batch)
    assert output.loss.ndim == 0 and 0.0 <= output.accuracy.item() <= 1.0
    assert output.query_embeddings.shape == output.block_embeddings.shape == (6, model.config.retriever_proj_size)
    output.loss.backward()
    for tower in (model.query_embedder, model.block_embedder):
        assert tower.realm.embeddings.word_embeddings.weight.grad.abs().sum() > 0
        assert tower.cls.dense.weight.grad.abs().sum() > 0
    assert model.query_embedder is not model.block_embedder


def test_shared_encoders_hold_one_set_of_weights(tokenizer):
    model = tiny_ict_model(share_encoders=True)
    assert model.block_embedder is model.query_embedder
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in model.query_embedder.parameters())
    batch = ICTCollator(tokenizer, max_query_length=8, max_block_length=24)(corpus(4))
    model(**batch).loss.backward()
    assert model.query_embedder.cls.dense.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="share_encoders=True takes one embedder"):
        RealmICTModel(model.config, RealmEmbedder(model.config), RealmEmbedder(model.config), share_encoders=True)


def test_save_pretrained_writes_two_embedder_checkpoints(tmp_path):
    model = tiny_ict_model()
    model.save_pretrained(tmp_path)
    for name in ("query_embedder", "block_embedder"):
        loaded = RealmEmbedder.from_pretrained(tmp_path / name)
        expected = getattr(model, name).state_dict()
        assert all(torch.equal(value, expected[key]) for key, value in loaded.state_dict().items())
    reloaded = RealmICTModel.from_pretrained(tmp_path)
    ids = torch.tensor([[2, 7, 3]])
    with torch.no_grad():
        model.eval(), reloaded.eval()
        torch.testing.assert_close(
            reloaded.block_embedder(ids).projected_score, model.block_embedder(ids).projected_score
        )


def test_three_trainer_steps_run_log_and_save(tokenizer, tmp_path):
    model = tiny_ict_model()
    # The recipe keeps the collator's `title` and `text` columns and expects no labels.
    args = ict_training_arguments(str(tmp_path / "run"), 3, per_device_train_batch_size=4, learning_rate=1e-3,
                                  logging_steps=1, save_strategy="no", use_cpu=True, seed=0)  # fmt: skip
    trainer = ICTTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_list(corpus(12)),
        data_collator=ICTCollator(tokenizer, max_query_length=8, max_block_length=24),
        processing_class=tokenizer,
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 3
    assert all(torch.isfinite(torch.tensor(entry["loss"])) and 0.0 <= entry["accuracy"] <= 1.0 for entry in logged)
    trainer.save_model(str(tmp_path / "final"))
    for name in ("query_embedder", "block_embedder"):
        assert isinstance(RealmEmbedder.from_pretrained(tmp_path / "final" / name), RealmEmbedder)
    assert (tmp_path / "final" / "vocab.txt").exists()
    assert (tmp_path / "final" / "training_args.json").is_file()  # the Trainer's pickled training_args.bin, as JSON
    assert not (tmp_path / "final" / "training_args.bin").exists()


def test_ict_training_arguments_are_orqas_recipe():
    args = ict_training_arguments("out", 20_000)
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm, args.lr_scheduler_type) == (1e-4, 0.01, 1.0,
                                                                                                   "linear")  # fmt: skip
    assert args.warmup_steps == 2000 and args.save_steps == 5000 and args.save_total_limit == 1
    assert args.remove_unused_columns is False and args.label_names == []
    assert ict_training_arguments("out", 50).warmup_steps == 5  # a tenth of a short run too
    assert ict_training_arguments("out", 50, learning_rate=5e-5).learning_rate == 5e-5
    with pytest.raises(ValueError, match="max_steps must be >= 1, received 0"):
        ict_training_arguments("out", 0)


@pytest.mark.parametrize("share_encoders", [False, True])
def test_training_resumes_from_a_checkpoint_with_both_embedders(tokenizer, tmp_path, share_encoders):
    def run(steps: int, resume: bool):
        args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=steps, per_device_train_batch_size=4,
                                 learning_rate=1e-3, save_steps=2, use_cpu=True, report_to="none", seed=0,
                                 remove_unused_columns=False, label_names=[], disable_tqdm=True)  # fmt: skip
        trainer = ICTTrainer(model=tiny_ict_model(share_encoders=share_encoders), args=args,
                             train_dataset=datasets.Dataset.from_list(corpus(12)), processing_class=tokenizer,
                             data_collator=ICTCollator(tokenizer, max_query_length=8, max_block_length=24))  # fmt: skip
        trainer.train(resume_from_checkpoint=True if resume else None)
        return trainer

    trained = run(2, resume=False).model.state_dict()
    loader = ICTTrainer(
        model=tiny_ict_model(share_encoders=share_encoders),
        args=TrainingArguments(output_dir=str(tmp_path / "other"), use_cpu=True, report_to="none"),
    )
    loader._load_from_checkpoint(str(tmp_path / "run" / "checkpoint-2"))
    for (name, a), (_, b) in zip(trained.items(), loader.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert run(4, resume=True).state.global_step == 4  # the Trainer picks up checkpoint-2 and goes on


@pytest.mark.parametrize("share_encoders", [False, True])
def test_from_bert_starts_both_encoders_and_saves_loadable_embedders(tmp_path, share_encoders):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=37, max_position_embeddings=64))  # fmt: skip
    bert.save_pretrained(tmp_path / "bert")
    model = RealmICTModel.from_bert(tmp_path / "bert", share_encoders=share_encoders, retriever_proj_size=16)
    assert model.config.retriever_proj_size == 16
    word_embeddings = bert.embeddings.word_embeddings.weight
    for tower in (model.query_embedder, model.block_embedder):
        assert torch.equal(tower.realm.embeddings.word_embeddings.weight, word_embeddings)
    assert (model.block_embedder is model.query_embedder) == share_encoders
    # The saved embedders hold REALM's own keys, so every encoder weight comes back (not a fresh random encoder).
    model.save_pretrained(tmp_path / "ict")
    for name in ("query_embedder", "block_embedder"):
        loaded = RealmEmbedder.from_pretrained(tmp_path / "ict" / name)
        assert torch.equal(loaded.realm.embeddings.word_embeddings.weight, word_embeddings)
        assert torch.equal(loaded.cls.dense.weight, getattr(model, name).cls.dense.weight)

"""Open-QA fine-tuning with the Trainer: collator, per-question losses, what trains and what stays frozen, the best
dev checkpoint, `realm-hf train`, and a 2-process (gloo) run equal to one process over the same global batch."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import torchrun
from safetensors.torch import load_file

from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer
from realm_hf.demo import ensure_demo_model
from realm_hf.retrieval.pretokenized import PreTokenizedBlocks, PreTokenizedRetriever, tokenize_corpus
from realm_hf.training import (
    OpenQACollator,
    OpenQATrainer,
    answers_of,
    freeze_unused_parameters,
    freeze_word_embeddings,
    num_update_steps,
    orqa_training_arguments,
    orqa_warmup_steps,
)

# Questions about the demo corpus (16 passages); every answer is written in one passage.
TRAIN = [
    {"question": "What is the capital of France?", "answers": ["Paris"]},
    {"question": "What is the capital of Germany?", "answers": ["Berlin"]},
    {"question": "Who wrote Hamlet?", "answer": "William Shakespeare"},
    {"question": "What is the largest planet?", "answers": ["Jupiter", "Jupiter is"]},
]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    """The demo model without dropout (deterministic runs) and with widely spread weights: a fresh random BERT maps
    every text to nearly the same vector, so retrieval scores would tie to 1e-4 and float noise would pick the blocks.
    """
    directory = ensure_demo_model(tmp_path_factory.mktemp("demo"))
    model = RealmForOpenQA.from_pretrained(directory, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
        model.block_emb.normal_()
    model.save_pretrained(directory)
    return directory


def _load(demo_dir: Path, tmp_path: Path) -> tuple[RealmForOpenQA, RealmTokenizer]:
    tokenizer = RealmTokenizer.from_pretrained(demo_dir)
    records = RealmRetriever.from_pretrained(demo_dir).block_records
    blocks = PreTokenizedBlocks.open(tokenize_corpus(tokenizer, records, tmp_path / "blocks.safetensors"))
    retriever = PreTokenizedRetriever(blocks, tokenizer, block_records=records)
    return RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever), tokenizer


def test_collator_pads_answers_with_minus_one_and_reads_both_layouts(demo_dir):
    tokenizer = RealmTokenizer.from_pretrained(demo_dir)
    batch = OpenQACollator(tokenizer)(TRAIN)
    assert batch["input_ids"].shape[0] == 4 and batch["attention_mask"].shape == batch["input_ids"].shape
    answer_ids = batch["answer_ids"]
    assert answer_ids.shape[:2] == (4, 2)  # the most answers of a row
    paris = tokenizer("Paris", add_special_tokens=False).input_ids
    assert answer_ids[0, 0, : len(paris)].tolist() == paris and (answer_ids[0, 1] == -1).all()
    assert (answer_ids[2, 0] >= 0).sum() == len(tokenizer("William Shakespeare", add_special_tokens=False).input_ids)
    assert answers_of({"answer": ["a", "b"]}) == ["a", "b"] and answers_of({"answers": "x"}) == ["x"]
    assert answers_of({"answers": 1999}) == ["1999"]  # whole numbers: the strings they spell
    assert answers_of({"answers": [1999, "MCMXCIX"]}) == ["1999", "MCMXCIX"]
    for answers, message in [
        ({"text": ["Paris"], "answer_start": [0]}, "received a dict with keys ['answer_start', 'text'] (SQuAD's layout"),
        ([1.5], 'received [1.5]: write a number as the documents spell it, as a string ("answers": ["1.50"])'),
        (["a", None], "received ['a', None] (holding null)"),
        (True, "received True (holding bool)"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(f"expected 'answers' to be a list of strings (or one string), "
                                                       f"{message}")):  # fmt: skip
            answers_of({"question": "q?", "answers": answers})
    with pytest.raises(ValueError, match=r"expected a row with 'answers' or 'answer', received keys \['question'\]"):
        OpenQACollator(tokenizer)([{"question": "no answer?"}])
    with pytest.raises(ValueError, match="non-empty 'question' string, received"):
        OpenQACollator(tokenizer)([{"query": "x", "answers": ["y"]}])
    with pytest.raises(ValueError, match="non-empty 'question' string, received 'question': ''"):
        OpenQACollator(tokenizer)([{"question": "", "answers": ["y"]}])
    assert "answer_ids" not in OpenQACollator(tokenizer, with_answers=False)([{"question": "Who?"}])


def test_batch_loss_is_the_mean_of_per_question_losses(demo_dir, tmp_path):
    model, tokenizer = _load(demo_dir, tmp_path)
    model.train()
    collator = OpenQACollator(tokenizer)
    trainer = OpenQATrainer(model=model, args=orqa_training_arguments(str(tmp_path / "out"), max_steps=1),
                            eval_dataset=TRAIN, data_collator=collator)  # fmt: skip
    batched = trainer.compute_loss(model, collator(TRAIN))
    singles = [trainer.compute_loss(model, collator([row])) for row in TRAIN]
    assert torch.allclose(batched, torch.stack(singles).mean(), atol=1e-5)
    assert batched > 0


def test_training_updates_question_encoder_and_reader_only_and_keeps_the_best_checkpoint(demo_dir, tmp_path):
    model, tokenizer = _load(demo_dir, tmp_path)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    args = orqa_training_arguments(str(tmp_path / "out"), max_steps=24, eval_steps=6, learning_rate=3e-3,
                                   per_device_train_batch_size=4, warmup_steps=0, disable_tqdm=True)  # fmt: skip
    trainer = OpenQATrainer(model=model, args=args, train_dataset=TRAIN, eval_dataset=TRAIN,
                            data_collator=OpenQACollator(tokenizer))  # fmt: skip
    initial = trainer.evaluate()
    trainer.train()
    history = [entry for entry in trainer.state.log_history if "eval_exact_match" in entry]
    best = max(entry["eval_exact_match"] for entry in history)
    assert best > initial["eval_exact_match"]  # it learns the training questions
    assert trainer.state.best_model_checkpoint is not None
    assert trainer.evaluate()["eval_exact_match"] == best  # the best checkpoint is the one loaded at the end
    # No pickle among what training writes: the arguments are JSON, in every checkpoint and the saved model.
    trainer.save_model(str(tmp_path / "final"))
    for directory in [*(tmp_path / "out").glob("checkpoint-*"), tmp_path / "final"]:
        assert not (directory / "training_args.bin").exists()
        assert json.loads((directory / "training_args.json").read_text())["max_steps"] == 24

    after = model.state_dict()
    assert torch.equal(after["block_emb"], before["block_emb"])  # block embeddings are frozen
    changed = {name for name in before if not torch.equal(after[name], before[name])}
    assert any(name.startswith("embedder.realm.") for name in changed)  # question encoder trains
    assert (
        any(name.startswith("reader.realm.") for name in changed)
        and "reader.qa_outputs.dense_output.weight" in changed
    )
    assert not any(
        name.startswith(("embedder.cls.predictions.", "reader.cls.", "reader.realm.pooler.")) for name in changed
    )
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logged and all("retriever_loss" in entry and "reader_loss" in entry for entry in logged)


def test_training_reads_the_hybrid_candidates_it_is_served_with(demo_dir, tmp_path):
    """With a `HybridSearcher` (as `realm-hf train --searcher hybrid` sets), the trainer tells it the questions, the
    reader reads the served union (BM25's best block among the first R) and the retriever's loss sees all K."""
    pytest.importorskip("bm25s")
    from realm_hf.retrieval.hybrid import hybrid_searcher_for

    model, tokenizer = _load(demo_dir, tmp_path)
    num_read, num_retrieved = model.config.reader_beam_size, model.config.searcher_beam_size
    model.searcher = hybrid_searcher_for(model, bm25_fraction=0.34, num_read=num_read)  # 1 of the 3 read is BM25's
    args = orqa_training_arguments(str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4,
                                   disable_tqdm=True)  # fmt: skip
    trainer = OpenQATrainer(model=model, args=args, train_dataset=TRAIN, eval_dataset=TRAIN,
                            data_collator=OpenQACollator(tokenizer))  # fmt: skip
    inputs = trainer.data_collator(TRAIN)
    model.train()
    loss, outputs = trainer.compute_loss(model, inputs, return_outputs=True)
    assert torch.isfinite(loss)
    ids = outputs.retrieved_block_ids
    assert ids.shape == (len(TRAIN), num_retrieved)
    questions = [row["question"] for row in TRAIN]
    bm25_best = model.searcher.bm25.search_text(questions, num_read).ids
    dense_ids = model.searcher.dense.search(model.embedder(**{key: inputs[key] for key in ("input_ids",
                                            "attention_mask", "token_type_ids")}).projected_score.detach(),
                                            num_retrieved).ids  # fmt: skip
    for row in range(len(TRAIN)):
        read = ids[row, :num_read].tolist()
        served_dense = dense_ids[row, : num_read - 1].tolist()
        assert set(served_dense) <= set(read)
        assert [block for block in bm25_best[row].tolist() if block not in served_dense][0] in read
        assert set(ids[row].tolist()) <= set(dense_ids[row].tolist()) | set(read)  # the rest are dense
    assert len(trainer.answer(TRAIN)) == len(TRAIN)  # evaluation searches the same way (texts given)


def test_orqa_settings_and_step_arithmetic(tmp_path):
    assert [orqa_warmup_steps(n) for n in (5, 50, 500, 5_000, 200_000)] == [1, 5, 50, 500, 10_000]
    args = orqa_training_arguments(str(tmp_path), max_steps=3000)
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm, args.warmup_steps) == (1e-5, 0.01, 1.0, 300)
    assert args.metric_for_best_model == "exact_match" and args.load_best_model_at_end and args.eval_steps == 300
    assert num_update_steps(100, 8, 2) == 26 and num_update_steps(100, 8, 0.5, world_size=2) == 4
    with pytest.raises(ValueError, match="max_steps must be >= 1, received 0"):
        orqa_training_arguments(str(tmp_path), max_steps=0)


def test_unused_heads_are_frozen_and_nothing_shared_with_used_weights(demo_dir):
    model = RealmForOpenQA.from_pretrained(demo_dir)
    frozen = freeze_unused_parameters(model)
    assert frozen and all(name.startswith(("embedder.cls.predictions.", "reader.cls.", "reader.realm.pooler."))
                          for name in frozen)  # fmt: skip
    assert model.embedder.realm.embeddings.word_embeddings.weight.requires_grad  # tied or not, it still trains


def test_frozen_word_embeddings_stay_put_while_the_rest_trains(demo_dir, tmp_path):
    model, tokenizer = _load(demo_dir, tmp_path)
    assert freeze_word_embeddings(model) == ["embedder.realm.embeddings.word_embeddings.weight",
                                             "reader.realm.embeddings.word_embeddings.weight"]  # fmt: skip
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    args = orqa_training_arguments(str(tmp_path / "out"), max_steps=3, learning_rate=1e-2, warmup_steps=0,
                                   eval_strategy="no", load_best_model_at_end=False, disable_tqdm=True)  # fmt: skip
    OpenQATrainer(model=model, args=args, train_dataset=TRAIN, data_collator=OpenQACollator(tokenizer)).train()
    after = model.state_dict()
    assert torch.equal(after["reader.realm.embeddings.word_embeddings.weight"],
                       before["reader.realm.embeddings.word_embeddings.weight"])  # fmt: skip
    assert not torch.equal(after["reader.realm.embeddings.position_embeddings.weight"],
                           before["reader.realm.embeddings.position_embeddings.weight"])  # fmt: skip


def test_trainer_rejects_a_dataset_without_answers_and_dropped_columns(demo_dir, tmp_path):
    model, tokenizer = _load(demo_dir, tmp_path)
    args = orqa_training_arguments(str(tmp_path / "out"), max_steps=1)
    trainer = OpenQATrainer(model=model, args=args, eval_dataset=TRAIN, processing_class=tokenizer)
    assert isinstance(trainer.data_collator, OpenQACollator)
    with pytest.raises(ValueError, match="need 'answers'"):
        trainer.evaluate([{"question": "Who?"}])
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        OpenQATrainer(model=model, args=orqa_training_arguments(str(tmp_path / "o2"), max_steps=1,
                                                                remove_unused_columns=True),
                      eval_dataset=TRAIN, processing_class=tokenizer)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# realm-hf train, in one and in two processes


def _train_command(demo_dir: Path, data: Path, output: Path, batch_size: int) -> list[str]:
    return ["-m", "realm_hf.cli", "train", "--model", str(demo_dir), "--train-file", str(data), "--dev-file",
            str(data), "--output-dir", str(output), "--max-steps", "2", "--batch-size", str(batch_size),
            "--learning-rate", "0.05", "--optim", "sgd", "--eval-steps", "2", "--quiet", "--seed", "0"]  # fmt: skip


def test_cli_train_two_processes_equal_one_process_over_the_same_global_batch(demo_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in TRAIN))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one = subprocess.run([sys.executable, *_train_command(demo_dir, data, tmp_path / "one", 4)],
                         capture_output=True, text=True, env=env)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([*torchrun(2), *_train_command(demo_dir, data, tmp_path / "two", 2)],
                         capture_output=True, text=True, env=env)  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]

    single, double = (load_file(tmp_path / name / "model.safetensors") for name in ("one", "two"))
    start = load_file(demo_dir / "model.safetensors")
    assert single.keys() == double.keys()
    # Two steps (the first at warm-up lr 0), each over all 4 questions: 4 x 1 process or 2 x 2 processes. Plain SGD:
    # Adam's first steps move every weight by about +-lr whatever its gradient's size, so float noise in a near-zero
    # gradient would flip whole updates; SGD's update is proportional to the gradient that DDP averages.
    assert any(not torch.equal(single[name], start[name]) for name in single)
    for name in single:
        assert torch.allclose(single[name], double[name], atol=1e-6), name
    results = [json.loads((tmp_path / name / "train_results.json").read_text()) for name in ("one", "two")]
    assert results[0]["global_step"] == results[1]["global_step"] == 2
    assert results[0]["dev"]["eval_examples"] == results[1]["dev"]["eval_examples"] == 4  # gathered from both ranks
    assert results[0]["dev"]["eval_exact_match"] == results[1]["dev"]["eval_exact_match"]
    # The output answers questions as it is: model, tokenizer and the model's own block records.
    assert (tmp_path / "one" / "vocab.txt").is_file() and any((tmp_path / "one").glob("block_records*"))
    # A re-run finds the finished run and stops (resuming at max_steps would make the Trainer run one extra step).
    again = subprocess.run([sys.executable, *_train_command(demo_dir, data, tmp_path / "one", 4)],
                           capture_output=True, text=True, env=env)  # fmt: skip
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert json.loads((tmp_path / "one" / "train_results.json").read_text())["global_step"] == 2


def test_cli_train_over_an_index_smaller_than_the_search_beam(demo_dir, tmp_path, capsys):
    # The demo model searches 8 blocks; an index of 5 documents gives all 5 (as `realm-hf ask` does), with a warning.
    from realm_hf.cli.main import main

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"title": f"Doc {i}", "text": f"Paris is the capital of France {i}."}) + "\n"
                              for i in range(5)))  # fmt: skip
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "What is the capital of France?", "answers": ["Paris"]}) + "\n")
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(corpus), "--output",
                 str(tmp_path / "index"), "--quiet"]) == 0  # fmt: skip
    assert main(["train", "--model", str(demo_dir), "--index", str(tmp_path / "index"), "--train-file", str(data),
                 "--output-dir", str(tmp_path / "out"), "--max-steps", "1", "--batch-size", "1"]) == 0  # fmt: skip
    trained = RealmForOpenQA.from_pretrained(tmp_path / "out")
    assert trained.config.searcher_beam_size == 5


def test_cli_train_on_hybrid_candidates(demo_dir, tmp_path, capsys):
    pytest.importorskip("bm25s")
    from realm_hf.cli.main import main

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in TRAIN))
    common = ["train", "--model", str(demo_dir), "--train-file", str(data), "--output-dir", str(tmp_path / "out"),
              "--batch-size", "2", "--searcher", "hybrid", "--bm25-fraction", "0.34"]  # fmt: skip
    assert main([*common, "--max-steps", "1", "--save-steps", "1"]) == 0
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["searcher"] == "hybrid, bm25_fraction 0.34"
    # resuming on dense candidates would change what the run reads: refused, with what changed
    dense = [flag for flag in common if flag not in ("--searcher", "hybrid", "--bm25-fraction", "0.34")]
    assert main([*dense, "--max-steps", "2"]) == 2
    assert "a run on other candidates (searcher changed)" in capsys.readouterr().err
    assert main([*common, "--max-steps", "2"]) == 0
    assert json.loads((tmp_path / "out" / "train_results.json").read_text())["global_step"] == 2

    # A model served hybrid candidates (its searcher.json) is trained on them without being told, and says so
    import shutil

    served = tmp_path / "served"
    shutil.copytree(demo_dir, served)
    (served / "searcher.json").write_text(json.dumps({"searcher": "hybrid", "bm25_fraction": 0.34}))
    capsys.readouterr()
    assert main(["train", "--model", str(served), "--train-file", str(data), "--output-dir", str(tmp_path / "own"),
                 "--batch-size", "2", "--max-steps", "1"]) == 0  # fmt: skip
    assert "training reads hybrid candidates, as" in capsys.readouterr().err
    assert json.loads((tmp_path / "own" / "run.json").read_text())["searcher"] == "hybrid, bm25_fraction 0.34"
    assert json.loads((tmp_path / "own" / "searcher.json").read_text())["searcher"] == "hybrid"  # served alike
    assert main(["train", "--model", str(served), "--train-file", str(data), "--output-dir", str(tmp_path / "dense"),
                 "--batch-size", "2", "--max-steps", "1", "--searcher", "dense"]) == 0  # fmt: skip
    assert "searcher" not in json.loads((tmp_path / "dense" / "run.json").read_text())


def test_cli_train_names_the_missing_documents(demo_dir, tmp_path, capsys):
    import shutil

    from realm_hf.cli.main import main

    model = tmp_path / "model"
    shutil.copytree(demo_dir, model)
    for records in model.glob("block_records.*"):
        records.unlink()
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "What is the capital of France?", "answers": ["Paris"]}) + "\n")
    assert main(["train", "--model", str(model), "--train-file", str(data), "--output-dir", str(tmp_path / "out"),
                 "--max-steps", "1"]) == 1  # fmt: skip
    error = capsys.readouterr().err
    assert "holds no block records" in error and "--index DIR" in error and "--documents FILE" in error


def test_cli_train_handles_what_users_hand_it(demo_dir, tmp_path, capsys):
    """Unanswerable rows left out with a note, unreadable files named, a checkpoint cut short by an interrupt skipped, a
    changed corpus tokenized again, a borrowed calibration set aside, the starting model never overwritten."""
    import shutil

    from realm_hf.cli.main import main

    def build_index(name, city):
        corpus = tmp_path / f"{name}.jsonl"
        corpus.write_text("".join(json.dumps({"title": f"Doc {i}", "text": f"{city} is the capital of France {i}."})
                                  + "\n" for i in range(5)))  # fmt: skip
        assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(corpus), "--output",
                     str(tmp_path / name), "--quiet"]) == 0  # fmt: skip
        return str(tmp_path / name)

    index = build_index("index", "Paris")
    rows = [{"question": "What is the capital of France?", "answers": ["Paris"]},
            {"question": "Who is the CEO of my company?", "answers": []}]  # fmt: skip
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    model = tmp_path / "model"  # the demo model, reading hybrid candidates
    shutil.copytree(demo_dir, model)
    settings = '{"searcher": "hybrid", "bm25_fraction": 0.4, "bm25_weight": 0.0}\n'
    (model / "searcher.json").write_text(settings)
    common = ["--model", str(model), "--index", index, "--train-file", str(data), "--output-dir", str(out),
              "--batch-size", "1", "--save-steps", "1"]  # fmt: skip
    capsys.readouterr()
    assert main(["train", *common, "--dev-file", str(data), "--max-steps", "2", "--eval-steps", "1"]) == 0
    error = capsys.readouterr().err
    assert f"1 question(s) of {data} without answers left out" in error  # train and dev file alike
    assert "dev exact match never rose above its first evaluation" in error  # 2 steps of a tiny model: it did not
    assert (out / "searcher.json").read_text() == settings  # the fine-tuned model reads what its parent read
    assert json.loads((out / "train_results.json").read_text())["global_step"] == 2

    # A longer run resumes from checkpoint-2; a checkpoint the interrupt cut short (no trainer_state.json) is removed
    (out / "checkpoint-7").mkdir()
    (out / "checkpoint-7" / "model.safetensors").write_bytes(b"half")
    (out / "calibration.json").write_text("{}")  # fitted to the model trained here before
    assert main(["train", *common, "--max-steps", "3"]) == 0
    error = capsys.readouterr().err
    assert "checkpoint-7 was not written whole" in error and not (out / "checkpoint-7").exists()
    assert f"note: resuming from {out / 'checkpoint-2'} (step 2 of 3); --no-resume starts afresh" in error
    assert json.loads((out / "train_results.json").read_text())["global_step"] == 3
    assert not (out / "calibration.json").exists() and (out / "calibration.previous.json").read_text() == "{}"

    # The corpus changed (same number of documents): tokenized again, not read from the old blocks
    before = ((out / "blocks.json").read_text(), (out / "blocks.safetensors").read_bytes())
    other = build_index("other", "Lyon")
    assert main(["train", *common[:2], "--index", other, *common[4:], "--max-steps", "4"]) == 0
    after = ((out / "blocks.json").read_text(), (out / "blocks.safetensors").read_bytes())
    assert after[0] != before[0] and after[1] != before[1]

    # Other training questions into the same output: not resumed as if they were the old ones
    other_data = tmp_path / "other.jsonl"
    other_data.write_text(
        json.dumps({"question": "Which city is the capital of France?", "answers": ["Paris"]}) + "\n"
    )
    assert main(["train", *common[:4], "--train-file", str(other_data), *common[6:], "--max-steps", "5"]) == 2
    assert "holds checkpoints of a run on other questions (train_file changed)" in capsys.readouterr().err
    assert main(["train", *common[:4], "--train-file", str(other_data), *common[6:], "--max-steps", "1",
                 "--no-resume"]) == 0  # fmt: skip
    assert json.loads((out / "train_results.json").read_text())["global_step"] == 1

    # Mistakes: the starting model as output, an empty file, a CSV named .jsonl
    assert main(["train", "--model", str(demo_dir), "--index", index, "--train-file", str(data), "--output-dir",
                 str(demo_dir), "--max-steps", "1"]) == 2  # fmt: skip
    assert "is the model you start from" in capsys.readouterr().err
    for name, text, expected in [("empty.jsonl", "", "is empty: expected one question per line"),
                                 ("table.jsonl", "question,answers\nWho?,Paris\n", "could not be read as JSON lines")]:  # fmt: skip
        bad = tmp_path / name
        bad.write_text(text)
        assert (
            main(["train", *common[:4], "--train-file", str(bad), *common[8:], "--output-dir", str(tmp_path / "x")])
            == 1
        )
        error = capsys.readouterr().err
        assert expected in error and str(bad) in error, error

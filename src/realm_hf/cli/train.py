"""`realm-hf train`: ORQA fine-tuning of a RealmForOpenQA model with the Trainer (question encoder + reader)."""

import argparse
import json
import os
import sys
from pathlib import Path

from realm_hf.precision import add_precision_argument, precision_from_args

from .arguments import finished_run, positive_int

HELP = """\
Data: JSON lines (or .json / .csv / .parquet), one question each: {"question": str, "answers": [str, ...]} (NQ-open)
or {"question": str, "answer": str | [str, ...]}; or a Hub dataset with --dataset (needs network).

Retrieval: the model's own block_emb and block records, or --index DIR (an index built with `realm-hf index build`,
whose documents/ are the corpus; the model's block_emb is then never loaded). Retrieved blocks are never re-tokenized:
the corpus is tokenized once into OUTPUT/blocks.safetensors.

  realm-hf train --model ./realm-init --train-file train.jsonl --dev-file dev.jsonl --output-dir out --max-steps 2000
  realm-hf train --model ./realm-init --index my-index --train-file train.jsonl --output-dir out --num-epochs 2
  torchrun --nproc_per_node 2 -m realm_hf.cli train ...   # data-parallel (also: accelerate launch)

The best checkpoint by dev exact match ends up in OUTPUT (with its tokenizer); a re-run resumes from the last
checkpoint in OUTPUT.
"""


def _load_rows(path: str | None, dataset: str | None, split: str):
    import datasets

    if dataset is not None:
        return datasets.load_dataset(dataset, split=split)
    location = Path(path)
    if not location.is_file():
        raise FileNotFoundError(f"question file {path!r} does not exist.")
    kind = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(location.suffix)
    if kind is None:
        raise ValueError(f"expected a .jsonl, .json, .csv or .parquet file of questions, got {path!r}.")
    rows = datasets.load_dataset(kind, data_files=str(location), split="train")
    if "question" not in rows.column_names or not {"answers", "answer"} & set(rows.column_names):
        raise ValueError(f"{path}: expected columns 'question' and 'answers' (or 'answer'), got {rows.column_names}.")
    return rows


def _documents(args):
    """The corpus the block ids point into: --documents, else the index's documents/, else the model's records."""
    from realm_hf.retrieval.index_builder import DOCUMENTS_DIR

    from .index import open_corpus

    if args.documents is not None:
        return open_corpus(args.documents)
    if args.index is not None and (Path(args.index) / DOCUMENTS_DIR).is_dir():
        return open_corpus(args.index)
    from realm_hf import RealmRetriever

    return RealmRetriever.from_pretrained(args.model).block_records


def cmd_train(args) -> int:
    import torch

    from realm_hf import RealmForOpenQA, RealmTokenizer
    from realm_hf.retrieval.pretokenized import PreTokenizedBlocks, PreTokenizedRetriever, tokenize_corpus
    from realm_hf.training import (
        OpenQACollator,
        OpenQATrainer,
        freeze_word_embeddings,
        num_update_steps,
        orqa_training_arguments,
    )

    output = Path(args.output_dir)
    try:
        train_rows = _load_rows(args.train_file, args.dataset, args.train_split)
        dev_rows = None
        if args.dev_file is not None or (args.dataset is not None and args.dev_split):
            dev_rows = _load_rows(args.dev_file, args.dataset if args.dev_file is None else None, args.dev_split)
    except (OSError, ValueError) as error:
        print(f"realm-hf train: could not read the questions: {error}", file=sys.stderr)
        return 1

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    max_steps = args.max_steps or num_update_steps(len(train_rows), args.batch_size, args.num_epochs, world_size)
    if not args.no_resume and finished_run(output / "train_results.json", max_steps):
        return 0
    eval_steps = args.eval_steps or max(1, max_steps // 10)
    overrides = {"per_device_train_batch_size": args.batch_size, "per_device_eval_batch_size": args.eval_batch_size,
                 "learning_rate": args.learning_rate, "seed": args.seed, "save_total_limit": args.save_total_limit,
                 "disable_tqdm": args.quiet, "optim": args.optim, "use_cpu": not torch.cuda.is_available() or args.cpu}  # fmt: skip
    if args.logging_steps:
        overrides["logging_steps"] = args.logging_steps
    if args.warmup_steps is not None:
        overrides["warmup_steps"] = args.warmup_steps
    if dev_rows is None:
        overrides.update({"eval_strategy": "no", "load_best_model_at_end": False, "metric_for_best_model": None})
    try:
        precision = precision_from_args(args)
    except ValueError as error:
        print(f"realm-hf train: {error}", file=sys.stderr)
        return 2
    training_args = orqa_training_arguments(str(output), max_steps, eval_steps=eval_steps, precision=precision,
                                            **overrides)  # fmt: skip

    tokenizer = RealmTokenizer.from_pretrained(args.model)
    documents = _documents(args)
    blocks_path = output / "blocks.safetensors"
    with training_args.main_process_first(desc="tokenizing the corpus"):
        if not blocks_path.is_file():
            output.mkdir(parents=True, exist_ok=True)
            tokenize_corpus(tokenizer, documents, blocks_path, max_block_length=args.max_block_length)
    records = documents.as_block_records() if hasattr(documents, "as_block_records") else documents
    retriever = PreTokenizedRetriever(PreTokenizedBlocks.open(blocks_path), tokenizer, block_records=records)

    searcher = None
    if args.index is not None:
        from realm_hf.retrieval import ExactSearcher

        searcher = ExactSearcher.from_index(args.index)
    config_overrides = {key: value for key, value in (("searcher_beam_size", args.searcher_beam_size),
                                                      ("reader_beam_size", args.reader_beam_size)) if value}  # fmt: skip
    model = RealmForOpenQA.from_pretrained(args.model, retriever=retriever, searcher=searcher, dtype=torch.float32,
                                           **config_overrides)  # fmt: skip
    if args.freeze_word_embeddings:
        freeze_word_embeddings(model)
    trainer = OpenQATrainer(
        model=model, args=training_args, train_dataset=train_rows, eval_dataset=dev_rows, processing_class=tokenizer,
        data_collator=OpenQACollator(tokenizer, max_question_length=args.max_question_length),
    )  # fmt: skip
    resume = any(output.glob("checkpoint-*")) and not args.no_resume
    trainer.train(resume_from_checkpoint=True if resume else None)
    trainer.save_model(str(output))
    metrics = trainer.evaluate() if dev_rows is not None else {}
    if trainer.is_world_process_zero():
        if args.index is None and args.documents is None:
            # The model's own block records (read by `_documents`) travel with it: `realm-hf ask --model OUTPUT` works.
            from realm_hf import RealmRetriever

            RealmRetriever(block_records=documents, tokenizer=tokenizer).save_pretrained(output)
        summary = {"max_steps": max_steps, "global_step": trainer.state.global_step,
                   "best_checkpoint": trainer.state.best_model_checkpoint, "dev": metrics}  # fmt: skip
        (output / "train_results.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(summary, indent=2))
        if searcher is not None:
            print(f"saved to {output}; load it with RealmForOpenQA.from_pretrained({str(output)!r}, "
                  f"searcher=ExactSearcher.from_index({args.index!r}))")  # fmt: skip
    return 0


def add_parser(subparsers) -> None:
    train = subparsers.add_parser("train", help="fine-tune a RealmForOpenQA model on question/answer pairs (ORQA)",
                                  description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    train.add_argument("--model", required=True, help="directory or Hub repo id of the RealmForOpenQA to start from")
    data = train.add_mutually_exclusive_group(required=True)
    data.add_argument("--train-file", help="training questions (.jsonl / .json / .csv / .parquet)")
    data.add_argument("--dataset", help="a Hub dataset name, e.g. nq_open (needs network)")
    train.add_argument(
        "--dev-file", help="dev questions: evaluated every --eval-steps; the best EM checkpoint is kept"
    )
    train.add_argument("--train-split", default="train", help="split of --dataset to train on (default: train)")
    train.add_argument("--dev-split", default=None, help="split of --dataset to evaluate on (e.g. validation)")
    train.add_argument("--output-dir", required=True, help="checkpoints, the tokenized corpus and the final model")
    train.add_argument("--index", help="an index directory to search instead of the model's block_emb")
    train.add_argument("--documents", help="the corpus the block ids point into (default: the index's documents/ "
                                           "or the model's block records)")  # fmt: skip
    length = train.add_mutually_exclusive_group()
    length.add_argument("--max-steps", type=positive_int, help="optimizer steps")
    length.add_argument("--num-epochs", type=float, default=1.0, help="epochs over the training set (default: 1)")
    train.add_argument(
        "--batch-size", type=positive_int, default=8, help="questions per step per process (default: 8)"
    )
    train.add_argument("--eval-batch-size", type=positive_int, default=16, help="questions per evaluation batch")
    train.add_argument("--learning-rate", type=float, default=1e-5, help="peak learning rate (ORQA: 1e-5)")
    train.add_argument("--warmup-steps", type=int, help="linear warm-up steps (default: ORQA's min(10000, max(100, "
                                                        "steps / 10)))")  # fmt: skip
    train.add_argument("--optim", default="adamw_torch_fused", help="a TrainingArguments optimizer name (default: "
                       "adamw_torch_fused: ORQA's AdamW in one fused kernel)")  # fmt: skip
    train.add_argument("--eval-steps", type=positive_int, help="steps between evaluations/checkpoints "
                                                               "(default: a tenth of the run)")  # fmt: skip
    train.add_argument("--logging-steps", type=positive_int, help="steps between logged losses")
    train.add_argument("--searcher-beam-size", type=positive_int, help="blocks retrieved per training question "
                                                                       "(default: the model's, 5000 for Hub models)")  # fmt: skip
    train.add_argument("--reader-beam-size", type=positive_int, help="blocks read per question (default: the model's)")
    train.add_argument("--max-question-length", type=positive_int, default=64, help="wordpieces per question")
    train.add_argument("--max-block-length", type=positive_int, default=288, help="wordpieces kept per block")
    train.add_argument("--save-total-limit", type=positive_int, default=2, help="checkpoints kept (default: 2)")
    train.add_argument("--seed", type=int, default=42, help="random seed (default: 42)")
    train.add_argument(
        "--freeze-word-embeddings",
        action="store_true",
        help="keep both encoders' word embeddings fixed (small training sets; not ORQA's recipe)",
    )
    train.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is available")
    add_precision_argument(train)
    train.add_argument("--no-resume", action="store_true", help="start afresh even if OUTPUT holds checkpoints")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    train.set_defaults(func=cmd_train)

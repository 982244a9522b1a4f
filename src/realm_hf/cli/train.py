"""`realm-hf train`: ORQA fine-tuning of a RealmForOpenQA model with the Trainer (question encoder + reader)."""

import argparse
import json
import os
import sys
from pathlib import Path

from realm_hf.atomic import atomic_write_bytes
from realm_hf.precision import add_precision_argument, precision_from_args

from .arguments import (
    TRAINER_FLAGS_HELP,
    add_trainer_flags,
    check_writable_directory,
    finished_run,
    model_location,
    positive_float,
    positive_int,
    unit_interval,
)

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

EPILOG = (
    TRAINER_FLAGS_HELP.format(prog="realm-hf train")
    + """\
  ORQA's (orqa_training_arguments): --learning-rate 1e-5, --weight-decay 0.01, --lr-scheduler-type linear,
  --warmup-steps max(1, min(10000, steps / 10)), --max-grad-norm 1.0, --eval-steps and --save-steps a tenth of the
  run, --logging-steps min(50, eval steps), --save-total-limit 2, the best dev exact match kept; and --optim
  adamw_torch_fused (ORQA's AdamW in one fused kernel), --seed 42. --max-steps (> 0) excludes --num-epochs.
--output-dir, --batch-size, --eval-batch-size and --num-epochs are this command's own, also spelled the Trainer's
way (--output_dir, --per_device_train_batch_size, --per_device_eval_batch_size, --num_train_epochs); --cpu sets
--use_cpu, --quiet --disable_tqdm, --precision/--fp32 --bf16; --debug is the traceback switch, not
TrainingArguments.debug.
"""
)


def _load_rows(path: str | None, dataset: str | None, split: str):
    import datasets

    if dataset is not None:
        return datasets.load_dataset(dataset, split=split)
    location = Path(path)
    if location.is_dir():
        raise ValueError(f"question file {path!r} is a directory; expected a .jsonl, .json, .csv or .parquet file of "
                         "questions")  # fmt: skip
    if not location.is_file():
        raise FileNotFoundError(f"question file {path!r} does not exist.")
    kind = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(location.suffix)
    if kind is None:
        raise ValueError(f"expected a .jsonl, .json, .csv or .parquet file of questions, got {path!r}.")
    if location.stat().st_size == 0:
        raise ValueError(f"{path} is empty: expected one question per line, e.g. "
                         '{"question": "Who founded Acme?", "answers": ["Margaret Holt"]}')  # fmt: skip
    data = _utf8_bytes(location) if kind != "parquet" else None
    try:
        rows = datasets.load_dataset(kind, data_files=str(location), split="train")
    except Exception as error:  # noqa: BLE001 (datasets and pyarrow raise many kinds for a file that is not the format)
        cause = str(error.__cause__ or error).splitlines()[0][:200]
        raise ValueError(f"{path} could not be read as {_KIND_NAMES[kind]} ({type(error).__name__}: {cause}). "
                         "Check that it is UTF-8 and holds what its extension says.") from error  # fmt: skip
    if "question" not in rows.column_names or not {"answers", "answer"} & set(rows.column_names):
        raise ValueError(f"{path}: expected columns 'question' and 'answers' (or 'answer'), got {rows.column_names}.")
    _check_rows(rows, location, data if location.suffix == ".jsonl" else None)
    return _answerable(rows, path)


def _utf8_bytes(location: Path) -> bytes:
    """The bytes of a question file, checked to be UTF-8: one that is not is named with the line and byte, before
    `datasets` reads it (which names neither the file nor the line)."""
    from realm_hf.errors import not_utf8_error

    data = location.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise not_utf8_error(str(location), data, error.start, path=location) from None
    return data


def _check_rows(rows, location: Path, jsonl: bytes | None = None) -> None:
    """Every row has a non-empty question and answers the training can read (strings, or whole numbers), checked
    before the model loads; the first that has not is named by its line (given the JSON Lines file's bytes, `jsonl`)
    or row."""
    from realm_hf.errors import FileFormatError
    from realm_hf.training.finetune import answers_of, question_of

    lines = []
    if jsonl is not None:
        lines = [number for number, line in enumerate(jsonl.splitlines(), start=1) if line.strip()]

    def where(index: int) -> str:
        return f"line {lines[index]}" if len(lines) == len(rows) else f"row {index + 1}"

    for index, row in enumerate(rows):
        try:
            question_of(row)
        except ValueError as error:
            raise FileFormatError(
                f"{location} {where(index)}: {error}", path=location, location=where(index)
            ) from None
        try:
            answers_of(row)
        except ValueError as error:
            if {"answers", "answer"} & {key for key, value in row.items() if value is not None}:
                raise FileFormatError(f"{location} {where(index)}: {error}", path=location,
                                      location=where(index)) from None  # fmt: skip
            raise FileFormatError(f"{location} {where(index)}: expected 'answers' (a list of strings, [] for an "
                                  "unanswerable question), received null or no 'answers'", path=location,
                                  location=where(index)) from None  # fmt: skip


_KIND_NAMES = {"json": "JSON lines (or a JSON array)", "csv": "CSV", "parquet": "Parquet"}


def _answerable(rows, path: str):
    """The rows with at least one answer; the others (unanswerable questions, which a calibration set holds) are left
    out with a note: there is no span to train or score on."""
    from realm_hf.training.finetune import answers_of

    def has_answers(row) -> bool:
        try:
            return bool(answers_of(row))
        except ValueError:
            return True  # a malformed row is reported where it is read, with its reason

    kept = rows.filter(has_answers, desc=None) if len(rows) else rows
    left_out = len(rows) - len(kept)
    if left_out and not len(kept):
        raise ValueError(f"{path}: every question has 'answers': [] (unanswerable); expected questions with answers "
                         "to train and score on (unanswerable ones belong in `realm-hf calibrate --data`).")  # fmt: skip
    if left_out:
        print(f"note: {left_out} question(s) of {path} without answers left out: there is no answer to train or score "
              "on (they count in `realm-hf calibrate --data`).", file=sys.stderr)  # fmt: skip
    return kept


def _documents(args):
    """The corpus the block ids point into: --documents, else the index's documents/, else the model's records."""
    from realm_hf.retrieval.index_builder import DOCUMENTS_DIR

    from .corpus import open_corpus

    if args.documents is not None:
        return open_corpus(args.documents)
    if args.index is not None and (Path(args.index) / DOCUMENTS_DIR).is_dir():
        return open_corpus(args.index)
    from realm_hf import RealmRetriever
    from realm_hf.errors import MissingFileError

    try:
        return RealmRetriever.from_pretrained(args.model).block_records
    except FileNotFoundError as error:
        # e.g. the default model, whose documents are built from installed packages and do not travel with it
        raise MissingFileError(
            f"{error} Name the documents the training reads: --index DIR (an index from `realm-hf index build`, with "
            "its documents/) or --documents FILE."
        ) from error


def _check_length(args) -> None:
    """`--max-steps` (a Trainer flag) and `--num-epochs` exclude each other: a usage error, before any data is read."""
    from realm_hf.errors import UsageError

    if "max_steps" in args.trainer_flags and args.num_epochs is not None:
        raise UsageError("argument --num-epochs: not allowed with argument --max-steps (see `realm-hf train --help`)")


def training_arguments(args, num_examples: int, evaluate: bool = True, world_size: int = 1):
    """The `TrainingArguments` of a `realm-hf train` run: ORQA's recipe ([`orqa_training_arguments`]) and this
    command's defaults, overridden by its own flags (`--batch-size`, `--num-epochs`, `--precision`, ...), overridden
    by the Trainer flags given (`args.trainer_flags`, from `realm_hf.cli.arguments.parse_trainer_flags`).

    Args:
        args (`argparse.Namespace`): the parsed `realm-hf train` command line, with its Trainer flags.
        num_examples (`int`): training questions, for the steps of `--num-epochs` when no `--max-steps` is given.
        evaluate (`bool`): whether there is a dev set; without one, no evaluation and no best checkpoint.
        world_size (`int`): data-parallel processes, for the steps of `--num-epochs`.
    """
    import torch

    from realm_hf.errors import UsageError
    from realm_hf.training import num_update_steps, orqa_training_arguments

    _check_length(args)
    flags = dict(args.trainer_flags)
    max_steps = flags.pop("max_steps", None) or num_update_steps(num_examples, args.batch_size, args.num_epochs or 1.0,
                                                                 world_size)  # fmt: skip
    try:
        precision = precision_from_args(args)
    except ValueError as error:
        raise UsageError(str(error)) from None
    settings = {"per_device_train_batch_size": args.batch_size, "per_device_eval_batch_size": args.eval_batch_size,
                "optim": "adamw_torch_fused", "seed": 42, "disable_tqdm": args.quiet,
                "use_cpu": args.cpu or not torch.cuda.is_available(), **flags}  # fmt: skip
    if not evaluate:
        settings.update({"eval_strategy": "no", "load_best_model_at_end": False, "metric_for_best_model": None})
    return orqa_training_arguments(str(args.output_dir), max_steps, eval_steps=settings.pop("eval_steps", None),
                                   precision=precision, **settings)  # fmt: skip


def cmd_train(args) -> int:
    import torch

    from realm_hf import RealmForOpenQA, RealmTokenizer
    from realm_hf.loading import fit_beam_sizes
    from realm_hf.retrieval.pretokenized import PreTokenizedBlocks, PreTokenizedRetriever, tokenize_corpus
    from realm_hf.training import OpenQACollator, OpenQATrainer, freeze_word_embeddings

    _check_length(args)
    args.model = model_location(args.model)  # a mistyped --model is named at once, not after minutes of Hub retries
    if args.index is not None:
        from realm_hf.loading import check_index

        args.index = str(check_index(args.index, "--index"))  # a missing, unfinished or damaged index, named at once
    output = Path(args.output_dir)
    _check_output_dir(output, args)
    try:
        train_rows = _load_rows(args.train_file, args.dataset, args.train_split)
        dev_rows = None
        if args.dev_file is not None or (args.dataset is not None and args.dev_split):
            dev_rows = _load_rows(args.dev_file, args.dataset if args.dev_file is None else None, args.dev_split)
    except (OSError, ValueError) as error:
        print(f"realm-hf train: error: could not read the questions: {error}", file=sys.stderr)
        return 1

    _choose_candidates(args)
    run_key = _run_key(args)
    if not args.no_resume and any(output.glob("checkpoint-*")):
        _check_same_run(output, run_key)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    training_args = training_arguments(args, len(train_rows), evaluate=dev_rows is not None,
                                       world_size=world_size)  # fmt: skip
    max_steps = training_args.max_steps
    if not args.no_resume and finished_run(output / "train_results.json", max_steps):
        return 0

    tokenizer = RealmTokenizer.from_pretrained(args.model)
    documents = _documents(args)
    blocks_path = output / "blocks.safetensors"
    corpus_key = _corpus_key(documents, args)
    with training_args.main_process_first(desc="tokenizing the corpus"):
        # tokenized again where the key differs or is missing (written before blocks.json existed, or damaged);
        # --no-resume: tokenized afresh once, by the first process; the others then find it current
        stale = not blocks_path.is_file() or _stored_key(output / BLOCKS_KEY_FILE) != corpus_key
        if stale or (args.no_resume and training_args.process_index == 0):
            output.mkdir(parents=True, exist_ok=True)
            tokenize_corpus(tokenizer, documents, blocks_path, max_block_length=args.max_block_length)
            atomic_write_bytes(output / BLOCKS_KEY_FILE, json.dumps(corpus_key).encode("utf-8"))
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
    fit_beam_sizes(model)  # an index of fewer blocks than searcher_beam_size (5000): all of them, with a warning
    if args.searcher == "hybrid":
        from realm_hf.retrieval.hybrid import hybrid_searcher_for

        # Trained as it is served: the blocks read are the union of dense and BM25 candidates, and the retriever's
        # loss still sees searcher_beam_size blocks (the rest dense).
        model.searcher = hybrid_searcher_for(model, bm25_fraction=args.bm25_fraction, bm25_weight=args.bm25_weight,
                                             num_read=model.config.reader_beam_size)  # fmt: skip
    if args.freeze_word_embeddings:
        freeze_word_embeddings(model)
    trainer = OpenQATrainer(
        model=model, args=training_args, train_dataset=train_rows, eval_dataset=dev_rows, processing_class=tokenizer,
        data_collator=OpenQACollator(tokenizer, max_question_length=args.max_question_length),
    )  # fmt: skip
    checkpoint = None if args.no_resume else _last_whole_checkpoint(output)
    if checkpoint is not None and training_args.process_index == 0:
        print(f"note: resuming from {checkpoint} (step {checkpoint.name.split('-')[-1]} of {max_steps}); "
              "--no-resume starts afresh", file=sys.stderr)  # fmt: skip
    if checkpoint is None and training_args.process_index == 0:
        output.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(output / RUN_KEY_FILE, json.dumps(run_key, indent=2).encode("utf-8"))
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    trainer.save_model(str(output))
    if trainer.is_world_process_zero():
        _set_aside_calibration(output)
        _carry_searcher_settings(args.model, output)
        _note_if_dev_never_improved(trainer.state, output)
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
            print(f"saved to {output}; ask with it: realm-hf ask --model {output} --index {args.index} \"...\" (in "
                  f"Python: load_open_qa({str(output)!r}, index={args.index!r})). Its answers carry no confidence "
                  f"until you fit one: realm-hf calibrate --model {output} --index {args.index} --data DEV.jsonl")  # fmt: skip
    return 0


BLOCKS_KEY_FILE = "blocks.json"
RUN_KEY_FILE = "run.json"


def _check_output_dir(output: Path, args) -> None:
    """`--output-dir` is a directory training may write in: not the model it starts from, not an index (the model's
    files would mix with the index's), not a file nor inside one, and writable. Checked before anything is read."""
    from realm_hf.errors import UsageError
    from realm_hf.loading import INDEX_MANIFEST

    if Path(args.model).is_dir() and output.resolve() == Path(args.model).resolve():
        raise UsageError(f"--output-dir {args.output_dir} is the model you start from (--model): training would "
                         "overwrite it; expected another directory, e.g. --output-dir my-model")  # fmt: skip
    if (output / INDEX_MANIFEST).is_file():
        same = args.index is not None and output.resolve() == Path(args.index).resolve()
        what = "the index you train over (--index)" if same else "an index"
        raise UsageError(f"--output-dir {args.output_dir} is {what} (it holds {INDEX_MANIFEST}): training would write "
                         "the model's files among the index's; expected another directory, e.g. --output-dir "
                         "my-model")  # fmt: skip
    check_writable_directory(args.output_dir, "--output-dir", purpose="write the checkpoints and the trained model "
                             "in (a new one, e.g. --output-dir my-model)")  # fmt: skip


def _run_key(args) -> dict:
    """What a run trains on: the training questions' contents (SHA-256), or the dataset and split. A rerun resumes
    only the run it started (another dev file is fine: it only chooses the checkpoint kept)."""
    import hashlib

    def digest(path: str | None) -> str | None:
        if path is None or not Path(path).is_file():
            return None
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    key = ({"dataset": args.dataset, "train_split": args.train_split} if args.dataset is not None
           else {"train_file": digest(args.train_file)})  # fmt: skip
    if args.searcher == "hybrid":  # (dense runs keep the key they had before --searcher existed)
        key["searcher"] = f"hybrid, bm25_fraction {args.bm25_fraction:g}" + (
            f", bm25_weight {args.bm25_weight:g}" if args.bm25_weight else ""
        )
    return key


def _choose_candidates(args) -> None:
    """Which blocks training reads: `--searcher` / `--bm25-fraction`, else what the model is served with (its
    `searcher.json`, as `realm-hf ask` reads it: hybrid for the default model), else its dense search."""
    from realm_hf.retrieval.hybrid import load_searcher_settings

    settings = load_searcher_settings(args.model) if Path(args.model).is_dir() else None
    own = settings if settings is not None and settings["searcher"] == "hybrid" else None
    chosen_here = args.searcher is not None
    if args.searcher is None:
        args.searcher = "hybrid" if own is not None else "dense"
    args.bm25_weight = own["bm25_weight"] if own is not None else 0.0
    if args.bm25_fraction is None:
        args.bm25_fraction = own["bm25_fraction"] if own is not None else 0.4
    if args.searcher == "hybrid" and not chosen_here:
        print(f"note: training reads hybrid candidates, as {args.model} is served (its searcher.json: BM25 chooses "
              f"{args.bm25_fraction:g} of the blocks read); --searcher dense reads its dense search alone",
              file=sys.stderr)  # fmt: skip


def _check_same_run(output: Path, run_key: dict) -> None:
    """Raises `UsageError` where OUT's checkpoints belong to a run on other questions or candidates (resuming it would
    go on with the old run's data order and optimizer state as if the new questions were the old)."""
    from realm_hf.errors import UsageError

    stored = _stored_key(output / RUN_KEY_FILE)
    if stored is None:
        return  # a run from before run.json was written: nothing to compare with
    if stored != run_key:
        changed = ", ".join(key for key in sorted(set(stored) | set(run_key)) if stored.get(key) != run_key.get(key))
        what = "other candidates" if set(changed.split(", ")) == {"searcher"} else "other questions"
        raise UsageError(f"--output-dir {output} holds checkpoints of a run on {what} ({changed} changed): "
                         "rerun with the same files to resume it, add --no-resume to start afresh there, or choose "
                         "another --output-dir")  # fmt: skip


def _corpus_key(documents, args) -> dict:
    """What `OUTPUT/blocks.safetensors` was tokenized from: the documents' fingerprint where they have one (a
    document store), else the model and the number of blocks, and the block length."""
    fingerprint = getattr(documents, "fingerprint", None)
    source = fingerprint() if callable(fingerprint) else f"records of {args.model} ({len(documents)} blocks)"
    return {"documents": source, "max_block_length": args.max_block_length}


def _stored_key(path: Path) -> dict | None:
    """The key a sidecar (`blocks.json`, `run.json`) holds; `None` where there is none (written before it existed) or
    it is damaged."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _last_whole_checkpoint(output: Path) -> Path | None:
    """The newest `checkpoint-N` with its `trainer_state.json` (the Trainer writes it last). A newer one without it
    (interrupted while saving) cannot be resumed from: it is removed, with a note, so that the rerun goes on."""
    import shutil

    checkpoints = sorted((path for path in output.glob("checkpoint-*") if path.name.split("-")[-1].isdigit()),
                         key=lambda path: int(path.name.split("-")[-1]), reverse=True)  # fmt: skip
    for checkpoint in checkpoints:
        if (checkpoint / "trainer_state.json").is_file():
            return checkpoint
        print(f"note: {checkpoint} was not written whole (interrupted while saving): removed; resuming from the "
              "checkpoint before it", file=sys.stderr)  # fmt: skip
        shutil.rmtree(checkpoint, ignore_errors=True)  # another process of a distributed run may remove it first
    return None


def _set_aside_calibration(output: Path) -> None:
    """A `calibration.json` in OUTPUT was fitted to another model (the one trained there before, or copied in): kept
    as `calibration.previous.json`, so that the new model's answers carry no borrowed confidence."""
    from realm_hf.evaluation.calibration import CALIBRATION_FILE, set_aside_calibration

    kept = set_aside_calibration(output)
    if kept is not None:
        print(f"note: {output / CALIBRATION_FILE} was fitted to the model trained there before: kept as {kept.name}; "
              "fit one for this model with realm-hf calibrate", file=sys.stderr)  # fmt: skip


def _carry_searcher_settings(model: str, output: Path) -> None:
    """The starting model's `searcher.json` (which candidates it reads: dense, or hybrid with BM25) goes with the
    fine-tuned model, which reads the same kind of questions."""
    import shutil

    from realm_hf.retrieval.hybrid import SEARCHER_FILE

    source = Path(model) / SEARCHER_FILE
    if source.is_file() and source.resolve() != (output / SEARCHER_FILE).resolve():
        shutil.copyfile(source, output / SEARCHER_FILE)


def _note_if_dev_never_improved(state, output: Path) -> None:
    """Dev exact match that never rose above its first evaluation makes the first checkpoint "the best" (the earliest
    of equals), which may have trained little or nothing: said, with what to try."""
    scores = [(entry["step"], entry["eval_exact_match"]) for entry in state.log_history if "eval_exact_match" in entry]
    if len(scores) >= 2 and max(score for _, score in scores) <= scores[0][1]:
        step, score = scores[0]
        print(f"note: dev exact match never rose above its first evaluation ({score:.3f} at step {step}), so {output} "
              "holds that early checkpoint; try more or other training questions, a higher --learning-rate, or no "
              "--dev-file to keep the last step", file=sys.stderr)  # fmt: skip


def add_parser(subparsers) -> None:
    train = subparsers.add_parser("train", help="fine-tune a RealmForOpenQA model on question/answer pairs (ORQA)",
                                  description=HELP, epilog=EPILOG,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    train.add_argument("--model", required=True, help="directory or Hub repo id of the RealmForOpenQA to start from")
    data = train.add_mutually_exclusive_group(required=True)
    data.add_argument("--train-file", help="training questions (.jsonl / .json / .csv / .parquet)")
    data.add_argument("--dataset", help="a Hub dataset name, e.g. nq_open (needs network)")
    train.add_argument(
        "--dev-file", help="dev questions: evaluated every --eval-steps; the best EM checkpoint is kept"
    )
    train.add_argument("--train-split", default="train", help="split of --dataset to train on (default: train)")
    train.add_argument("--dev-split", default=None, help="split of --dataset to evaluate on (e.g. validation)")
    train.add_argument("--output-dir", "--output_dir", required=True, metavar="OUTPUT",
                       help="checkpoints, the tokenized corpus and the final model")  # fmt: skip
    train.add_argument("--index", help="an index directory to search instead of the model's block_emb")
    train.add_argument("--documents", help="the corpus the block ids point into (default: the index's documents/ "
                                           "or the model's block records)")  # fmt: skip
    train.add_argument("--num-epochs", "--num_train_epochs", "--num-train-epochs", type=positive_float, metavar="N",
                       help="epochs over the training set, when no --max-steps (default: 1)")  # fmt: skip
    train.add_argument("--batch-size", "--per_device_train_batch_size", "--per-device-train-batch-size",
                       type=positive_int, default=8, metavar="N",
                       help="questions per step per process (default: 8)")  # fmt: skip
    train.add_argument("--eval-batch-size", "--per_device_eval_batch_size", "--per-device-eval-batch-size",
                       type=positive_int, default=16, metavar="N",
                       help="questions per evaluation batch (default: 16)")  # fmt: skip
    train.add_argument("--searcher-beam-size", type=positive_int, help="blocks retrieved per training question "
                                                                       "(default: the model's, 5000 for Hub models)")  # fmt: skip
    train.add_argument("--reader-beam-size", type=positive_int, help="blocks read per question (default: the model's)")
    train.add_argument("--searcher", choices=("dense", "hybrid"), default=None,
                       help="which blocks are read in training: the model's dense search, or (hybrid) the union of "
                            "dense and BM25 candidates, so that the question encoder learns to weigh up the right "
                            "blocks BM25 brings in (default: as the model is served, its searcher.json as `realm-hf "
                            "ask` reads it: hybrid for the default model; dense without one)")  # fmt: skip
    train.add_argument(
        "--bm25-fraction",
        type=unit_interval,
        default=None,
        help="with --searcher hybrid: share of the blocks read that BM25 chooses (default: the model's searcher.json, "
        "else 0.4, 2 of 5)",
    )
    train.add_argument("--max-question-length", type=positive_int, default=64, help="wordpieces per question")
    train.add_argument("--max-block-length", type=positive_int, default=288, help="wordpieces kept per block")
    train.add_argument(
        "--freeze-word-embeddings",
        action="store_true",
        help="keep both encoders' word embeddings fixed (small training sets; not ORQA's recipe)",
    )
    train.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is available")
    add_precision_argument(train)
    train.add_argument("--no-resume", action="store_true", help="start afresh even if OUTPUT holds checkpoints")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    add_trainer_flags(train)
    train.set_defaults(func=cmd_train, resumable=True)

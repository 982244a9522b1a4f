"""`realm-hf pretrain`: REALM pretraining (retrieval-augmented MLM over salient spans) with an index refreshed while it
trains."""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from realm_hf.precision import add_precision_argument, precision_from_args

from .arguments import (
    TRAINER_FLAGS_HELP,
    add_trainer_flags,
    finished_run,
    model_location,
    non_negative_float,
    non_negative_int,
    positive_int,
)

HELP = """\
Starts from an embedder (e.g. the ICT warm start's block_embedder/), optionally a separate question encoder (ICT's
query_embedder/: an ICT block encoder reading questions finds next to nothing) and an encoder (a
RealmKnowledgeAugEncoder or any BERT checkpoint), over a document store (`realm-hf index build` writes one in
INDEX/documents/). The sentences with a salient span (a date, or a corpus title as an entity) are the training
examples, one span masked each.

  realm-hf pretrain --embedder ict/block_embedder --query-embedder ict/query_embedder --encoder bert/ \\
      --documents corpus/ --index ict-index/ --output-dir pretrained --max-steps 300 --refresh async --refresh-every 50
  torchrun --nproc_per_node 2 -m realm_hf.cli pretrain ... --refresh sync   # data-parallel

OUTPUT/checkpoints/ holds Trainer checkpoints (a re-run resumes from the last); OUTPUT/initial_index/ the index
built from --embedder when no --index is given; OUTPUT/refresh/ the refreshed indexes (the newest 3 kept). At the
end: OUTPUT/embedder/ (RealmEmbedder + tokenizer), OUTPUT/query_embedder/ (with --query-embedder), OUTPUT/encoder/
(RealmKnowledgeAugEncoder), OUTPUT/index/ (the corpus embedded with the final embedder) and
OUTPUT/pretrain_results.json (metrics log).
"""

EPILOG = (
    TRAINER_FLAGS_HELP.format(prog="realm-hf pretrain")
    + """\
  REALM's: --max-steps N (required, > 0), --learning-rate 3e-5, --weight-decay 0.01, --max-grad-norm 1.0,
  --warmup-steps max(1, min(10000, steps / 10)), --logging-steps 10, --save-steps 100, --save-total-limit 2,
  --seed 42, --optim adamw_torch_fused.
--output-dir and --batch-size are this command's own, also spelled the Trainer's way (--output_dir,
--per_device_train_batch_size; checkpoints go to OUTPUT/checkpoints/); --cpu sets --use_cpu, --quiet
--disable_tqdm, --precision/--fp32 --bf16; --debug is the traceback switch, not TrainingArguments.debug.
"""
)


def _tagger(documents, args):
    """Dates, the corpus titles as entity names (unless --no-title-entities) and the names in --entities."""
    from realm_hf.training.salient_spans import CombinedTagger, DateTagger, TitleEntityTagger

    taggers = [DateTagger()]
    if not args.no_title_entities:
        taggers.append(TitleEntityTagger(documents.titles(range(len(documents)))))
    if args.entities:
        names = [line.strip() for line in Path(args.entities).read_text(encoding="utf-8").splitlines() if line.strip()]
        taggers.append(TitleEntityTagger(names))
    return CombinedTagger(*taggers)


def _sentences(output: Path, documents, tagger, include_title: bool) -> list[dict]:
    """The salient sentences of the corpus, found once and kept in OUTPUT/sentences.jsonl."""
    from realm_hf.atomic import atomic_path
    from realm_hf.training.pretrain import salient_sentences

    path = output / "sentences.jsonl"
    if not path.is_file():
        rows = salient_sentences(documents, tagger, include_title=include_title)
        with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as file:
            file.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise ValueError("no sentence of the corpus has a salient span (a date or a title); nothing to train on.")
    if ("title" in rows[0]) != include_title:
        raise ValueError(f"{path} was written {'with' if 'title' in rows[0] else 'without'} sentence titles, but this "
                         f"run asks for them {'on' if include_title else 'off'} (--sentence-title); use the first "
                         "run's setting, or another --output-dir.")  # fmt: skip
    return rows


def training_arguments(args):
    """The `TrainingArguments` of a `realm-hf pretrain` run: REALM's recipe (lr 3e-5, weight decay 0.01, clipping at
    1.0, [`pretraining_warmup_steps`]) and this command's defaults, overridden by its own flags (`--batch-size`,
    `--precision`, ...), overridden by the Trainer flags given (`args.trainer_flags`, from
    `realm_hf.cli.arguments.parse_trainer_flags`), of which `--max-steps` is required."""
    import torch
    from transformers import TrainingArguments

    from realm_hf.errors import UsageError
    from realm_hf.training import precision_settings, pretraining_warmup_steps

    flags = args.trainer_flags
    if "max_steps" not in flags:
        raise UsageError("the following arguments are required: --max-steps (see `realm-hf pretrain --help`)")
    try:
        precision = precision_from_args(args)
    except ValueError as error:
        raise UsageError(str(error)) from None
    use_cpu = args.cpu or not torch.cuda.is_available()
    settings = {
        "output_dir": str(Path(args.output_dir) / "checkpoints"), "per_device_train_batch_size": args.batch_size,
        "learning_rate": 3e-5, "weight_decay": 0.01, "max_grad_norm": 1.0,
        "warmup_steps": pretraining_warmup_steps(flags["max_steps"]), "logging_steps": 10, "save_steps": 100,
        "save_total_limit": 2, "seed": 42, "remove_unused_columns": False, "label_names": [], "report_to": [],
        "dataloader_num_workers": 0, "disable_tqdm": args.quiet, "optim": "adamw_torch_fused", "use_cpu": use_cpu,
    }  # fmt: skip
    if "bf16" not in flags:
        settings.update(precision_settings(precision, flags.get("use_cpu", use_cpu)))
    return TrainingArguments(**{**settings, **flags})


def cmd_pretrain(args) -> int:
    import datasets
    import torch

    from realm_hf import RealmTokenizer
    from realm_hf.retrieval import ExactSearcher
    from realm_hf.retrieval.distributed import process_state
    from realm_hf.retrieval.index_builder import build_index
    from realm_hf.training import (
        IndexRefresher,
        PretrainingCandidates,
        RealmForPretraining,
        RealmPretrainer,
        SalientSpanCollator,
        freeze_pretraining_unused_parameters,
    )

    from .index import open_corpus

    for option in ("embedder", "query_embedder", "encoder"):  # a mistyped one is named before any work
        if getattr(args, option) is not None:
            setattr(args, option, model_location(getattr(args, option), f"--{option.replace('_', '-')}"))
    output = Path(args.output_dir)
    state = process_state()
    training_args = training_arguments(args)
    precision = precision_from_args(args)
    if not args.no_resume and finished_run(output / "pretrain_results.json", training_args.max_steps):
        return 0
    try:
        documents = open_corpus(args.documents)
        tokenizer = RealmTokenizer.from_pretrained(args.tokenizer or args.embedder)
        torch.manual_seed(training_args.seed)
        model = RealmForPretraining.from_parts(args.embedder, args.encoder or args.embedder, args.query_embedder)
    except (OSError, ValueError) as error:
        print(f"realm-hf pretrain: {error}", file=sys.stderr)
        return 1
    freeze_pretraining_unused_parameters(model)
    if args.freeze_word_embeddings:
        from realm_hf.training import freeze_word_embeddings

        freeze_word_embeddings(model)

    refresh_dir = output / "refresh"
    # Outside refresh/, whose old indexes are pruned: the warm start's index stays for comparisons.
    initial_index = Path(args.index) if args.index else output / "initial_index"
    with state.main_process_first():
        if state.is_main_process:
            output.mkdir(parents=True, exist_ok=True)
        tagger = _tagger(documents, args)
        try:
            rows = _sentences(output, documents, tagger, args.sentence_title)
        except ValueError as error:
            print(f"realm-hf pretrain: {error}", file=sys.stderr)
            return 1
    if not (initial_index / "index.json").is_file():
        if args.index:
            print(f"realm-hf pretrain: {args.index} is not an index directory (no index.json).", file=sys.stderr)
            return 1
        build_index(model.embedder, tokenizer, documents, initial_index, batch_size=args.embed_batch_size,
                    max_length=args.block_length, provenance={"refreshed_at_step": 0},
                    precision=precision)  # fmt: skip
    candidates = PretrainingCandidates(ExactSearcher.from_index(initial_index), documents, tokenizer,
                                       num_candidates=args.num_candidates, max_block_length=args.block_length)  # fmt: skip
    refresher = None
    if args.refresh != "off":
        documents_dir = Path(args.documents)
        refresher = IndexRefresher(refresh_dir, tokenizer, mode=args.refresh, every=args.refresh_every,
                                   documents_dir=documents_dir, batch_size=args.embed_batch_size,
                                   max_length=args.block_length, threads=args.refresh_threads,
                                   precision=precision)  # fmt: skip

    collator = SalientSpanCollator(tokenizer, tagger, max_length=args.query_length, seed=training_args.seed)
    trainer = RealmPretrainer(model=model, args=training_args, train_dataset=datasets.Dataset.from_list(rows),
                              data_collator=collator, candidates=candidates, refresher=refresher,
                              retriever_learning_rate=args.retriever_learning_rate,
                              retriever_start_step=args.retriever_start_step)  # fmt: skip
    resume = any((output / "checkpoints").glob("checkpoint-*")) and not args.no_resume
    started = time.time()
    trainer.train(resume_from_checkpoint=True if resume else None)
    seconds = time.time() - started
    if trainer.is_world_process_zero():
        model.save_parts(output)
        tokenizer.save_pretrained(output / "embedder")
        if model.query_embedder is not None:
            tokenizer.save_pretrained(output / "query_embedder")
        final = refresh_dir / "indexes" / f"step-{candidates.index_step:08d}"
        if refresher is not None and final.is_dir():
            shutil.rmtree(output / "index", ignore_errors=True)
            shutil.copytree(final, output / "index")
        summary = {"max_steps": training_args.max_steps, "global_step": trainer.state.global_step,
                   "seconds": round(seconds, 1), "sentences": len(rows), "index_step": candidates.index_step,
                   "refresh": args.refresh, "refresh_every": args.refresh_every,
                   "log": trainer.state.log_history}  # fmt: skip
        (output / "pretrain_results.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        last = next((entry for entry in reversed(trainer.state.log_history) if "retrieval_utility" in entry), {})
        print(
            json.dumps({key: value for key, value in summary.items() if key != "log"} | {"last_log": last}, indent=2)
        )
    return 0


def add_parser(subparsers) -> None:
    pretrain = subparsers.add_parser("pretrain", help="REALM pretraining: retrieval-augmented MLM with index refresh",
                                     description=HELP, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    pretrain.add_argument("--embedder", required=True, help="RealmEmbedder checkpoint to start the retriever from "
                                                             "(e.g. ICT's block_embedder); also the tokenizer")  # fmt: skip
    pretrain.add_argument("--query-embedder", help="RealmEmbedder checkpoint of a separate question encoder (e.g. "
                                                   "ICT's query_embedder); default: --embedder embeds both")  # fmt: skip
    pretrain.add_argument("--encoder", help="RealmKnowledgeAugEncoder or BERT checkpoint for the encoder "
                                            "(default: --embedder's BERT, with a fresh MLM head)")  # fmt: skip
    pretrain.add_argument("--tokenizer", help="tokenizer directory (default: --embedder)")
    pretrain.add_argument("--documents", required=True, help="the corpus: a document store directory")
    pretrain.add_argument("--index", help="the index of --documents made with --embedder (default: built first)")
    pretrain.add_argument("--output-dir", "--output_dir", required=True, metavar="OUTPUT",
                          help="checkpoints, refreshed indexes and the final model")  # fmt: skip
    pretrain.add_argument("--batch-size", "--per_device_train_batch_size", "--per-device-train-batch-size",
                          type=positive_int, default=8, metavar="N",
                          help="sentences per step per process (default: 8)")  # fmt: skip
    pretrain.add_argument("--retriever-learning-rate", type=non_negative_float,
                          help="peak learning rate of the embedder (default: --learning-rate)")  # fmt: skip
    pretrain.add_argument("--retriever-start-step", type=non_negative_int, default=0,
                          help="steps before the embedder starts learning (its learning rate is 0 until then, then "
                               "warms up): lets an encoder with a fresh MLM head learn to read blocks first")  # fmt: skip
    pretrain.add_argument("--num-candidates", type=positive_int, default=8, help="null document + retrieved blocks "
                                                                                   "per sentence (REALM: 8)")  # fmt: skip
    pretrain.add_argument("--query-length", type=positive_int, default=96, help="wordpieces per sentence (REALM: 96)")
    pretrain.add_argument("--block-length", type=positive_int, default=288, help="wordpieces per block (REALM: 288)")
    pretrain.add_argument("--refresh", choices=("async", "sync", "off"), default="async",
                          help="index refresh: a background process (async), in the training processes (sync), "
                               "or never (off)")  # fmt: skip
    pretrain.add_argument("--refresh-every", type=positive_int, default=100, help="steps between refreshes")
    pretrain.add_argument("--refresh-threads", type=positive_int, help="CPU threads of the async refresher")
    pretrain.add_argument("--embed-batch-size", type=positive_int, default=64, help="blocks per embedding batch")
    pretrain.add_argument("--no-title-entities", action="store_true", help="do not mask the corpus titles")
    pretrain.add_argument("--sentence-title", action="store_true",
                          help="read each sentence after its block's title (unmasked context): for corpora of titled "
                               "records whose sentences do not name their subject; REALM's sentences have none")  # fmt: skip
    pretrain.add_argument("--entities", help="a text file of entity names to mask, one per line (besides titles)")
    pretrain.add_argument("--freeze-word-embeddings", action="store_true",
                          help="keep the word embeddings (and the tied MLM decoder) fixed: about half the optimizer "
                               "work for MiniLM-sized models on a CPU; not REALM's recipe")  # fmt: skip
    pretrain.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is available")
    add_precision_argument(pretrain)
    pretrain.add_argument("--no-resume", action="store_true", help="start afresh even if OUTPUT holds checkpoints")
    pretrain.add_argument("--quiet", action="store_true", help="no progress bars")
    add_trainer_flags(pretrain, required=("max_steps",))
    pretrain.set_defaults(func=cmd_pretrain, resumable=True)

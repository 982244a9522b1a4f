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
    check_writable_directory,
    finished_run,
    model_location,
    non_negative_float,
    non_negative_int,
    positive_int,
    without_weight_loading_bar,
)

HELP = """\
Starts from an embedder (e.g. the ICT warm start's block_embedder/), optionally a separate question encoder (ICT's
query_embedder/: an ICT block encoder reading questions finds next to nothing) and an encoder (a
RealmKnowledgeAugEncoder or any BERT checkpoint), over a corpus: a document store directory (`realm-hf index build`
writes one in INDEX/documents/; the index directory itself works too), a JSONL / CSV / TSV / Parquet file of rows with
`text` and optional `title`, or a text or Markdown file or folder of them (one document per paragraph). A RealmForOpenQA
checkpoint (e.g. the demo model) works as --embedder: its embedder starts the retriever and its reader's BERT the
encoder, as one line says. The sentences with a salient span (a date, or a corpus title as an entity) are the training
examples, one span masked each.

  realm-hf pretrain --embedder ict/block_embedder --query-embedder ict/query_embedder --encoder bert/ \\
      --documents corpus/ --index ict-index/ --output-dir pretrained --max-steps 300 --refresh async --refresh-every 50
  torchrun --nproc_per_node 2 -m realm_hf.cli pretrain ... --refresh sync   # data-parallel

OUTPUT/checkpoints/ holds Trainer checkpoints (a re-run resumes from the last; --no-resume removes them and the other
files of the earlier run first); OUTPUT/sentences.jsonl the training sentences and OUTPUT/corpus.json the corpus and
settings they come from (a re-run over another corpus, or with other --sentence-title / --entities settings, makes them
again where there is no checkpoint, and is refused where there is one); OUTPUT/initial_index/ the index built from
--embedder when no --index is given; OUTPUT/refresh/ the refreshed indexes (the newest 3 kept; with --refresh async also
refresh/documents/, the corpus as a document store for the refresher, where --documents is not one). At the end:
OUTPUT/embedder/ (RealmEmbedder + tokenizer), OUTPUT/query_embedder/ (with --query-embedder), OUTPUT/encoder/
(RealmKnowledgeAugEncoder), OUTPUT/index/ (the corpus embedded with the final embedder; with --refresh async or sync
only: --refresh off leaves none, and removes an earlier run's) and OUTPUT/pretrain_results.json (metrics log).
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

# What OUTPUT/sentences.jsonl and OUTPUT/initial_index/ were made from (see `_corpus_record`).
CORPUS_RECORD = "corpus.json"
# The files of a run in OUTPUT that a new run must not take for its own: removed by --no-resume, and where they were made
# from another corpus and there is no checkpoint to resume. The final parts (embedder/, encoder/, ...) are replaced
# when the new run ends.
RUN_FILES = ("checkpoints", "refresh", "initial_index", "sentences.jsonl", CORPUS_RECORD, "pretrain_results.json")


def _entity_names(path: str | None) -> list[str] | None:
    """The names of `--entities` (a text file, one per line, blank lines skipped); `UsageError` where it is no file,
    `FileFormatError` where it is not UTF-8."""
    from realm_hf.errors import UsageError, not_utf8_error

    if path is None:
        return None
    location = Path(path)
    expected = "expected a text file of entity names, one per line"
    if not location.exists():
        raise UsageError(f"--entities {path!r}: no such file ({expected})")
    if not location.is_file():
        raise UsageError(f"--entities {path!r} is a directory; {expected}")
    data = location.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise not_utf8_error(f"--entities {path}", data, error.start, path=path) from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _check_embedder_given(value: str) -> None:
    """An ICT output directory (block_embedder/ and query_embedder/, no config.json of its own) given as --embedder:
    says which of its parts to pass, rather than "holds no config.json"."""
    from realm_hf.errors import UsageError

    location = Path(value)
    if not (location / "config.json").is_file() and (location / "block_embedder" / "config.json").is_file():
        raise UsageError(f"--embedder {value!r} is an ICT output (block_embedder/ and query_embedder/), not one model: "
                         f"expected --embedder {location / 'block_embedder'} (and --query-embedder "
                         f"{location / 'query_embedder'})")  # fmt: skip


def _open_documents(path: str):
    """The corpus of --documents (see `realm_hf.cli.corpus.open_corpus`), which must hold a document."""
    import os

    from realm_hf.errors import FileFormatError, MissingFileError

    from .corpus import open_corpus

    if not os.path.exists(path):
        raise MissingFileError(f"--documents {path!r}: no such file or directory (expected a document store directory, "
                               "a JSONL / CSV / TSV / Parquet file of rows, or a text file or folder of them)")  # fmt: skip
    documents = open_corpus(path)
    if len(documents) == 0:
        raise FileFormatError(f"--documents {path!r}: expected at least one document with a text, found none (an empty "
                              "corpus)", path=path)  # fmt: skip
    return documents


def _corpus_record(documents, args, entity_names: list[str] | None) -> dict:
    """What the sentences and the initial index of a run come from: the corpus (its fingerprint: content, not path)
    and the settings that choose the sentences."""
    import hashlib

    names = None if entity_names is None else hashlib.sha256("\n".join(entity_names).encode("utf-8")).hexdigest()
    return {"documents": str(args.documents), "num_documents": len(documents), "fingerprint": documents.fingerprint(),
            "sentence_title": bool(args.sentence_title), "title_entities": not args.no_title_entities,
            "entities": names}  # fmt: skip


def _stored_record(path: Path) -> dict | None:
    """The record `path` holds; None where there is none or it is damaged."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stored if isinstance(stored, dict) else None


def _differences(stored: dict, record: dict) -> list[str]:
    """What differs between the record of an earlier run and this one's, in words (the path alone does not count)."""
    changed = []
    if (stored.get("fingerprint"), stored.get("num_documents")) != (record["fingerprint"], record["num_documents"]):
        changed.append(f"another corpus ({stored.get('documents')!r}: {stored.get('num_documents')} documents, "
                       f"fingerprint {str(stored.get('fingerprint'))[:12]}; --documents {record['documents']!r}: "
                       f"{record['num_documents']} documents, fingerprint {record['fingerprint'][:12]})")  # fmt: skip
    if stored.get("sentence_title") != record["sentence_title"]:
        changed.append(f"sentences written {'with' if stored.get('sentence_title') else 'without'} sentence titles, "
                       f"where this run asks for them {'on' if record['sentence_title'] else 'off'} "
                       "(--sentence-title)")  # fmt: skip
    if stored.get("title_entities") != record["title_entities"]:
        changed.append(f"titles {'masked' if stored.get('title_entities') else 'not masked'} (--no-title-entities)")
    if stored.get("entities") != record["entities"]:
        changed.append("other --entities names" if record["entities"] and stored.get("entities") else
                       f"{'no' if not stored.get('entities') else 'an'} --entities file")  # fmt: skip
    return changed


def _remove_run_files(output: Path, keep: str | None = None) -> list[str]:
    """Removes the `RUN_FILES` of an earlier run from `output`, except `keep` (the --index given, if it is one of
    them); returns the names removed."""
    removed = []
    for name in RUN_FILES:
        path = output / name
        if keep is not None and path.exists() and path.resolve() == Path(keep).resolve():
            continue
        if path.is_dir():
            shutil.rmtree(path)
            removed.append(name + "/")
        elif path.exists():
            path.unlink()
            removed.append(name)
    return removed


def _prepare_output(output: Path, record: dict, args, state) -> bool:
    """Makes OUTPUT ready for this run (main process first); returns whether to resume from its checkpoints.

    --no-resume removes the earlier run's files. Otherwise files made from another corpus or with other sentence
    settings (`_differences`) are removed where there is no checkpoint or finished run to go on with, and refused
    (`UsageError`) where there is: resuming would mix two runs' examples."""
    from realm_hf.errors import UsageError

    checkpoints = any((output / "checkpoints").glob("checkpoint-*"))
    if args.no_resume:
        if state.is_main_process:
            removed = _remove_run_files(output, keep=args.index)
            if removed:
                print(f"note: --no-resume: removed the earlier run's {', '.join(removed)} from {output}",
                      file=sys.stderr)  # fmt: skip
        return False
    stored = _stored_record(output / CORPUS_RECORD)
    finished = (output / "pretrain_results.json").is_file()
    if stored is None:
        if checkpoints or finished or not (output / "sentences.jsonl").is_file():
            return checkpoints  # a run from before corpus.json was written: `_sentences` checks what it can
        changed = ["no record of the corpus they were made from (no corpus.json)"]
    else:
        changed = _differences(stored, record)
        if not changed:
            return checkpoints
        if checkpoints or finished:
            held = "checkpoints" if checkpoints else "a finished run"
            raise UsageError(f"--output-dir {str(output)!r} holds {held} of a run with {'; '.join(changed)}: rerun "
                             "with the same settings to resume it, add --no-resume to start afresh there, or choose "
                             "another --output-dir")  # fmt: skip
    if state.is_main_process:
        removed = _remove_run_files(output, keep=args.index)
        print(f"note: {output} held the files of another run, not resumable (no checkpoint), with "
              f"{'; '.join(changed)}: removed ({', '.join(removed)}); starting afresh", file=sys.stderr)  # fmt: skip
    return False


def _tagger(documents, args, entity_names: list[str] | None):
    """Dates, the corpus titles as entity names (unless --no-title-entities) and the names in --entities."""
    from realm_hf.training.salient_spans import CombinedTagger, DateTagger, TitleEntityTagger

    taggers = [DateTagger()]
    if not args.no_title_entities:
        taggers.append(TitleEntityTagger(documents.titles(range(len(documents)))))
    if entity_names:
        taggers.append(TitleEntityTagger(entity_names))
    return CombinedTagger(*taggers)


def _sentences(output: Path, documents, tagger, args, record: dict, is_main_process: bool) -> list[dict]:
    """The salient sentences of the corpus, found once and kept in OUTPUT/sentences.jsonl with OUTPUT/corpus.json
    saying what they come from; a corpus without any raises `InputError` and writes nothing."""
    from realm_hf.atomic import atomic_path, atomic_write_bytes
    from realm_hf.errors import InputError, UsageError
    from realm_hf.training.pretrain import salient_sentences

    path = output / "sentences.jsonl"
    if path.is_file():  # of this corpus and settings (`_prepare_output`), or of a run from before corpus.json
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if rows and ("title" in rows[0]) != args.sentence_title:
            raise UsageError(f"{path} was written {'with' if 'title' in rows[0] else 'without'} sentence titles, but "
                             f"this run asks for them {'on' if args.sentence_title else 'off'} (--sentence-title); use "
                             "the first run's setting, add --no-resume to start afresh, or choose another "
                             "--output-dir")  # fmt: skip
    else:
        rows = salient_sentences(documents, tagger, include_title=args.sentence_title)
    if not rows:
        kinds = "a date" + ("" if args.no_title_entities else ", a title") + (
            ", an --entities name" if args.entities else "")  # fmt: skip
        raise InputError(f"--documents {args.documents!r}: expected sentences with a salient span ({kinds}) to mask, "
                         f"found none in its {len(documents)} documents; nothing to train on")  # fmt: skip
    if is_main_process and not path.is_file():
        output.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as file:
            file.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        atomic_write_bytes(output / CORPUS_RECORD, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
    return rows


def _store_directory(path: str) -> Path | None:
    """The document store directory --documents names (itself, or an index's documents/), for the async refresher to
    read; None where it is a file or a folder of text files (the refresher then saves a store of its own)."""
    from realm_hf.retrieval.document_store import MANIFEST_NAME

    location = Path(path)
    for directory in (location / "documents", location):
        if (directory / MANIFEST_NAME).is_file():
            return directory
    return None


def _check_index_corpus(index: str, args, record: dict) -> None:
    """`UsageError` where the manifest of --index records another corpus than --documents (its fingerprint)."""
    from realm_hf.errors import UsageError
    from realm_hf.retrieval.index_files import read_manifest

    provenance = read_manifest(Path(index)).get("provenance")
    provenance = provenance if isinstance(provenance, dict) else {}
    built_from = provenance.get("corpus_fingerprint") or provenance.get("documents_fingerprint")
    if built_from and built_from != record["fingerprint"]:
        corpus = f"{provenance['corpus']!r}, " if provenance.get("corpus") else ""
        raise UsageError(f"--index {index!r} was built from another corpus ({corpus}fingerprint {built_from[:12]}) "
                         f"than --documents {args.documents!r} (fingerprint {record['fingerprint'][:12]}): expected "
                         "the index of --documents, made with --embedder (or no --index: it is then built first)")  # fmt: skip


def _initial_index(output: Path, args, record: dict, state) -> Path:
    """The index the run starts with: --index (see `_check_index_corpus`), or OUTPUT/initial_index/, whose provenance
    records the corpus, the embedder and the block length it was made with; one made otherwise is removed (the caller
    builds it again)."""
    from realm_hf.retrieval.index_files import read_manifest

    if args.index:
        return Path(args.index)
    initial_index = output / "initial_index"
    stale = False
    if (initial_index / "index.json").is_file():
        manifest = read_manifest(initial_index)
        provenance = manifest.get("provenance") if isinstance(manifest.get("provenance"), dict) else {}
        stale = (provenance.get("documents_fingerprint", record["fingerprint"]) != record["fingerprint"]
                 or provenance.get("embedder", args.embedder) != args.embedder
                 or manifest.get("max_length", args.block_length) != args.block_length)  # fmt: skip
    state.wait_for_everyone()  # every process has read it before it goes
    if stale and state.is_main_process:
        print(f"note: {initial_index} was built from another corpus, embedder or --block-length: built again",
              file=sys.stderr)  # fmt: skip
        shutil.rmtree(initial_index)
    state.wait_for_everyone()
    return initial_index


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
    from realm_hf.errors import ModelLoadError, RealmHfError, UsageError
    from realm_hf.loading import INDEX_MANIFEST, check_index
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
    from realm_hf.training.index_refresh import IndexRefresherError
    from realm_hf.training.pretrain import pretraining_part_source

    from .main import one_line

    # Everything the command line names is checked before any corpus is read or model loaded, in the order given.
    _check_embedder_given(args.embedder)
    for option in ("embedder", "query_embedder", "encoder"):  # a mistyped one is named before any work
        if getattr(args, option) is not None:
            setattr(args, option, model_location(getattr(args, option), f"--{option.replace('_', '-')}"))
    output = Path(args.output_dir)
    check_writable_directory(args.output_dir, "--output-dir", purpose="write the checkpoints, indexes and pretrained "
                             "parts in (a new one, or one of an earlier run to resume)")  # fmt: skip
    entity_names = _entity_names(args.entities)
    if args.index:
        args.index = str(check_index(args.index, "--index"))
        if not (Path(args.index) / INDEX_MANIFEST).is_file():
            raise UsageError(f"--index {args.index!r}: expected an index directory written by `realm-hf index build` "
                             f"(holding {INDEX_MANIFEST}), received a compressed (faiss) searcher")  # fmt: skip
    encoder_option = "--encoder" if args.encoder is not None else "--embedder"
    parts = {"embedder": ("--embedder", args.embedder), "query_embedder": ("--query-embedder", args.query_embedder),
             "encoder": (encoder_option, args.encoder or args.embedder)}  # fmt: skip
    for part, (option, path) in parts.items():  # a checkpoint of the wrong kind, from its config.json alone
        if path is not None:
            pretraining_part_source(path, part, option)
    state = process_state()
    training_args = training_arguments(args)
    precision = precision_from_args(args)

    documents = _open_documents(args.documents)
    record = _corpus_record(documents, args, entity_names)
    if args.index:
        _check_index_corpus(args.index, args, record)
    with state.main_process_first():
        resume = _prepare_output(output, record, args, state)
    if not args.no_resume and finished_run(output / "pretrain_results.json", training_args.max_steps):
        return 0
    tagger = _tagger(documents, args, entity_names)
    with state.main_process_first():
        rows = _sentences(output, documents, tagger, args, record, state.is_main_process)

    try:
        tokenizer = RealmTokenizer.from_pretrained(args.tokenizer or args.embedder)
        torch.manual_seed(training_args.seed)
        with without_weight_loading_bar():
            model = RealmForPretraining.from_parts(args.embedder, args.encoder or args.embedder, args.query_embedder,
                                                   names={part: option for part, (option, _) in parts.items()})  # fmt: skip
    except RealmHfError:
        raise
    except (OSError, ValueError) as error:
        given = ", ".join(f"{option} {path!r}" for option, path in dict(parts.values()).items() if path is not None)
        raise ModelLoadError(f"could not load the models to pretrain ({given}): {one_line(error)}") from error
    freeze_pretraining_unused_parameters(model)
    if args.freeze_word_embeddings:
        from realm_hf.training import freeze_word_embeddings

        freeze_word_embeddings(model)

    refresh_dir = output / "refresh"
    # Outside refresh/, whose old indexes are pruned: the warm start's index stays for comparisons.
    initial_index = _initial_index(output, args, record, state)
    if not (initial_index / "index.json").is_file():
        build_index(model.embedder, tokenizer, documents, initial_index, batch_size=args.embed_batch_size,
                    max_length=args.block_length, precision=precision,
                    provenance={"refreshed_at_step": 0, "documents_fingerprint": record["fingerprint"],
                                "embedder": args.embedder})  # fmt: skip
    candidates = PretrainingCandidates(ExactSearcher.from_index(initial_index), documents, tokenizer,
                                       num_candidates=args.num_candidates, max_block_length=args.block_length)  # fmt: skip
    refresher = None
    if args.refresh != "off":
        # The async refresher reads --documents where it is a document store of this corpus, else a store it saves.
        refresher = IndexRefresher(refresh_dir, tokenizer, mode=args.refresh, every=args.refresh_every,
                                   documents_dir=_store_directory(args.documents), batch_size=args.embed_batch_size,
                                   max_length=args.block_length, threads=args.refresh_threads,
                                   precision=precision)  # fmt: skip

    collator = SalientSpanCollator(tokenizer, tagger, max_length=args.query_length, seed=training_args.seed)
    trainer = RealmPretrainer(model=model, args=training_args, train_dataset=datasets.Dataset.from_list(rows),
                              data_collator=collator, candidates=candidates, refresher=refresher,
                              retriever_learning_rate=args.retriever_learning_rate,
                              retriever_start_step=args.retriever_start_step)  # fmt: skip
    started = time.time()
    try:
        trainer.train(resume_from_checkpoint=True if resume else None)
    except IndexRefresherError as error:
        raise IndexRefresherError(f"the index refresher process exited with code {error.exitcode} (its traceback is "
                                  "above); run the same command again to resume from the last checkpoint, or pass "
                                  "--refresh sync to refresh the index in the training processes instead",
                                  exitcode=error.exitcode) from error  # fmt: skip
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
        elif (output / "index").is_dir():  # an earlier run's, embedded with another embedder than the one saved now
            shutil.rmtree(output / "index")
            print(f"note: removed {output / 'index'}, an earlier run's index (this run, with --refresh "
                  f"{args.refresh}, makes none): build one with realm-hf index build --model {output / 'embedder'}",
                  file=sys.stderr)  # fmt: skip
        summary = {"max_steps": training_args.max_steps, "global_step": trainer.state.global_step,
                   "seconds": round(seconds, 1), "sentences": len(rows), "index_step": candidates.index_step,
                   "refresh": args.refresh, "refresh_every": args.refresh_every, "documents": record["documents"],
                   "corpus_fingerprint": record["fingerprint"], "log": trainer.state.log_history}  # fmt: skip
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
    pretrain.add_argument("--embedder", required=True,
                          help="RealmEmbedder checkpoint to start the retriever from (e.g. ICT's block_embedder), or a "
                               "RealmForOpenQA / RealmScorer / RealmForPretraining checkpoint, whose embedder is used; "
                               "also the tokenizer")  # fmt: skip
    pretrain.add_argument("--query-embedder", help="RealmEmbedder checkpoint of a separate question encoder (e.g. "
                                                   "ICT's query_embedder); default: --embedder embeds both")  # fmt: skip
    pretrain.add_argument("--encoder", help="RealmKnowledgeAugEncoder or BERT checkpoint for the encoder (default: "
                                            "--embedder's: the reader of a RealmForOpenQA checkpoint, else its BERT, "
                                            "with its MLM head or a fresh one)")  # fmt: skip
    pretrain.add_argument("--tokenizer", help="tokenizer directory (default: --embedder)")
    pretrain.add_argument("--documents", required=True,
                          help="the corpus: a document store directory (or an index directory holding one), a JSONL / "
                               "CSV / TSV / Parquet file of rows (text, optional title), or a text or Markdown file or "
                               "folder of them")  # fmt: skip
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
    pretrain.add_argument("--no-resume", action="store_true",
                          help="start afresh even if OUTPUT holds checkpoints: removes the earlier run's checkpoints, "
                               "refreshed indexes, sentences and initial index there first")  # fmt: skip
    pretrain.add_argument("--quiet", action="store_true", help="no progress bars")
    add_trainer_flags(pretrain, required=("max_steps",))
    pretrain.set_defaults(func=cmd_pretrain, resumable=True)

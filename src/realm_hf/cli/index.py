"""`realm-hf index build | add | eval | offload | compress`: the user's corpus as a block-embedding index."""

import argparse
import itertools
import json
import re
import sys
import time
from pathlib import Path

from realm_hf.precision import add_precision_argument, precision_from_args

from .arguments import (
    add_device_argument,
    check_writable_directory,
    model_location,
    non_negative_float,
    non_negative_int,
    positive_int,
    refuse_to_overwrite,
    resolve_device,
)
from .corpus import DOCUMENTS_DIR, open_corpus
from .corpus import counted as _count

# As `realm_hf.retrieval.passages.DEFAULT_MAX_WORDS` (not imported: it loads torch, and parsers must not).
DEFAULT_MAX_WORDS = 120
HELP = """\
An index directory holds the block embeddings (index.json + safetensors shards) and, under documents/, the corpus
they were computed from. Block ids are stable: adding documents appends ids and never renumbers.

  realm-hf index build --corpus docs.jsonl --output my-index      # the default model's embedder
  realm-hf ask --index my-index "a question about docs.jsonl"    # ... and its reader
  realm-hf index build --model google/realm-orqa-nq-openqa --corpus docs.jsonl --output my-index
  realm-hf index add   --index my-index --model google/realm-orqa-nq-openqa --corpus new-docs.jsonl
  realm-hf index eval  --index my-index                         # recall@k of what `index compress` would build
  realm-hf index offload --model google/realm-orqa-nq-openqa --output nq-index
  realm-hf index compress --model google/realm-orqa-nq-openqa --output nq-light   # bf16 model + IVF-PQ index

Data-parallel embedding: run `build` under `accelerate launch` or `torchrun --nproc_per_node N`; each process embeds
its share of the shards. An interrupted `build` resumes where it stopped when run again with the same arguments.
"""


def _default_model(model: str | None) -> str:
    """`--model`, else the default model (whose embedder `realm-hf ask --index` then pairs with its reader)."""
    if model is not None:
        return model
    from realm_hf.default_model import default_model_dir

    directory = default_model_dir()
    if directory is None:
        raise SystemExit("realm-hf index: no --model given and the default model is not installed "
                         "(models/realm-minilm-factbook or $REALM_HF_DEFAULT_MODEL): pass --model.")  # fmt: skip
    return str(directory)


def _load_embedder(model: str | None, device: str = "cpu"):
    """The block encoder of `model` on `--device` (a GPU that is not there is named before anything loads), and its
    tokenizer."""
    import torch
    from transformers import AutoTokenizer

    from realm_hf import RealmEmbedder

    from .arguments import without_weight_loading_bar

    device = resolve_device(device)
    model = model_location(_default_model(model))
    # fp32 whatever the checkpoint holds (the default model ships fp16): the build's autocast sets the precision, and
    # fp16 weights under CPU autocast fail in LayerNorm ("mixed dtype").
    with without_weight_loading_bar():
        embedder = RealmEmbedder.from_pretrained(model, dtype=torch.float32)
    return embedder.eval().to(device), AutoTokenizer.from_pretrained(model)


def cmd_build(args) -> int:
    from realm_hf.errors import FileFormatError, IndexMismatchError
    from realm_hf.retrieval.distributed import process_state
    from realm_hf.retrieval.document_store import DocumentStore
    from realm_hf.retrieval.index_builder import build_index, default_shard_size

    output = Path(args.output)
    check_writable_directory(args.output, "--output", purpose="write the index into (a new one, or an unfinished build "
                             "to resume)")  # fmt: skip
    # --overwrite builds beside the output and swaps the new index in once complete: until then the old one serves,
    # and an interrupted build leaves it whole (and resumes in the staging directory when run again).
    replace = args.overwrite and output.is_dir() and any(output.iterdir())
    if replace:
        _refuse_to_replace_what_is_no_index(output)
    else:
        _refuse_finished_index(output)
    replaced_blocks = _blocks_of(output) if replace else None
    target = output.resolve().parent / f".{output.resolve().name}.overwrite" if replace else output
    # The corpus before the model: a bad corpus fails at once, and before anything is written under --output.
    read_at = time.time()  # a document changed after this is newer than the index (see `changed_documents_note`)
    store = open_corpus(args.corpus, args.max_words, args.text_column, args.title_column)
    if len(store) == 0:
        raise FileFormatError(f"corpus {args.corpus}: expected at least one document with a text, found none",
                              path=args.corpus)  # fmt: skip
    if args.shard_size is None:
        args.shard_size = default_shard_size(len(store), target)
    state = process_state()
    model_name = _default_model(args.model)
    embedder, tokenizer = _load_embedder(model_name, args.device)
    provenance = {"model": model_name, "corpus": str(args.corpus), "corpus_fingerprint": store.fingerprint(),
                  "corpus_path": str(Path(args.corpus).resolve()), "corpus_read_at": read_at}  # fmt: skip
    if state.is_main_process:
        if replace:
            _note_what_the_new_index_leaves_out(output)
            _discard_unresumable_staging(target, store, embedder, args, provenance)
        stored = target / DOCUMENTS_DIR
        if stored.is_dir():
            # A partial build: resume only over the same corpus (documents/ is saved atomically, before any shard).
            previous = DocumentStore.load(stored)
            if previous.fingerprint() != store.fingerprint():
                raise IndexMismatchError(
                    f"{output} holds a partial build over another corpus ({len(previous)} documents in {stored}, "
                    f"{len(store)} in {args.corpus}): rerun with the corpus it was started with to resume, pass "
                    "--overwrite to replace it, or choose a new --output",
                    path=stored,
                )  # fmt: skip
            print(f"note: resuming the interrupted build in {output} (--overwrite starts it again)", file=sys.stderr)
        else:
            target.mkdir(parents=True, exist_ok=True)
            store.save(stored)
    state.wait_for_everyone()
    manifest = build_index(
        embedder, tokenizer, store, target, shard_size=args.shard_size, batch_size=args.batch_size,
        max_length=args.max_length, progress=not args.quiet, precision=precision_from_args(args),
        provenance=provenance,
    )  # fmt: skip
    if state.is_main_process:
        if replace:
            from realm_hf.atomic import replace_directory

            replace_directory(target, output)
        replaced = ""
        if replace:
            held = f", which held {_count(replaced_blocks, 'block')}" if replaced_blocks is not None else ""
            replaced = f" (replacing the index that was there{held})"
        print(f"indexed {_count(manifest['num_blocks'], 'block')} ({manifest['dim']}-d) in "
              f"{_count(len(manifest['shards']), 'shard')} at {output}{replaced}")  # fmt: skip
    state.wait_for_everyone()
    return 0


def index_note(index: str, own: bool, found: Path) -> str | None:
    """What `ask --index` and `serve --index` say before the model loads about the index `index` (found at `found`):
    that it is the model's own (`own`: an index of the user's documents was likely meant), or that the documents
    changed since it was built (`changed_documents_note`); `None` where there is nothing to say."""
    if own:
        return (f"note: --index {index} is the model's own index, the corpus it answers from without --index; for "
                "your documents, build an index of them with `realm-hf index build --corpus ... --output ...`")  # fmt: skip
    return changed_documents_note(found)


# A folder of documents is looked through up to this many entries for changes (a stat each).
CHANGE_CHECK_MAX_ENTRIES = 20_000


def changed_documents_note(index: str | Path) -> str | None:
    """A note where the documents the index in `index` was built from changed after `index build` read them (their
    path and time are in the manifest's provenance): a file newer, or, in a folder, files added, removed or renamed.
    `None` where nothing changed, the documents are gone (moved away: nothing to compare) or the index predates the
    record. The answers still come from the documents as they were."""
    import shlex

    from realm_hf.default_model import default_model_dir
    from realm_hf.retrieval.index_builder import model_option
    from realm_hf.retrieval.index_files import read_manifest

    try:
        provenance = read_manifest(Path(index)).get("provenance", {})
        corpus, read_at = Path(provenance["corpus_path"]), float(provenance["corpus_read_at"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not corpus.exists():
        return None
    entries = [corpus, *itertools.islice(corpus.rglob("*"), CHANGE_CHECK_MAX_ENTRIES)] if corpus.is_dir() else [corpus]
    changed, moved, itself = [], False, Path(index).resolve()
    for path in entries:
        relative = path.relative_to(corpus) if path != corpus else Path(path.name)
        if path.resolve().is_relative_to(itself) or any(part.startswith(".") for part in relative.parts):
            continue  # the index itself, built inside its documents' folder, or hidden files (a rebuild's staging)
        try:
            newer = path.stat().st_mtime > read_at
        except OSError:
            continue
        if newer and path.is_dir():
            moved = moved or not itself.is_relative_to(path.resolve())  # added, removed, renamed (not the index made)
        elif newer:
            changed.append(str(relative))
    if not changed and not moved:
        return None
    changed.sort()
    what = (f"{', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''} changed" if changed else
            "files were added, removed or renamed")  # fmt: skip
    if changed and moved:
        what += "; files were added, removed or renamed"
    given = str(provenance.get("corpus", corpus))
    named = given if Path(given).resolve() == corpus else str(corpus)  # as given, where it still names them from here
    rebuild = (f"realm-hf index build{model_option(index, default_model_dir())} --corpus {shlex.quote(named)} "
               f"--output {shlex.quote(str(index))} --overwrite")  # fmt: skip
    return (
        f"note: the documents of this index ({corpus}) changed after it was built ({what}): answers come from "
        f"them as they were; rebuild it with {rebuild}"
    )


def _blocks_of(index: Path) -> int | None:
    """How many blocks the index in `index` holds, or `None` where its manifest cannot be read."""
    from realm_hf.retrieval.index_files import read_manifest

    try:
        return int(read_manifest(index)["num_blocks"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _note_what_the_new_index_leaves_out(output: Path) -> None:
    """A note, before anything is embedded, where the index `--overwrite` replaces holds documents that `index add`
    appended: the new index holds `--corpus` alone (the old one stays until the new one is complete, so an interrupt
    loses nothing)."""
    import shlex

    from realm_hf.retrieval.index_files import read_manifest

    try:
        added = read_manifest(output).get("provenance", {}).get("added", [])
    except (OSError, ValueError):
        return
    added = [entry for entry in added if isinstance(entry, dict) and entry.get("blocks")]
    if not added:
        return
    corpora = list(dict.fromkeys(str(entry.get("corpus")) for entry in added))
    blocks = sum(int(entry["blocks"]) for entry in added)
    again = "; ".join(f"realm-hf index add --index {shlex.quote(str(output))} --corpus {shlex.quote(corpus)}"
                      for corpus in corpora[:3])  # fmt: skip
    print(f"note: the index being replaced holds {_count(blocks, 'block')} that `index add` appended (from "
          f"{', '.join(corpora)}); the new one holds --corpus alone. To keep them, add them again once it is built: "
          f"{again}", file=sys.stderr)  # fmt: skip


def _refuse_finished_index(output: Path) -> None:
    """`UsageError` where `output` holds a finished index, naming the ways on: `--overwrite`, `index add`, another
    directory."""
    from realm_hf.default_model import default_model_dir
    from realm_hf.errors import UsageError
    from realm_hf.retrieval.index_builder import index_add_command, is_finished_index

    if is_finished_index(output):
        add = index_add_command(output, default_model_dir())  # `index add` without --model uses the default model
        raise UsageError(f"--output {output} already holds a finished index: pass --overwrite to replace it (the old "
                         f"one stays until the new one is complete), add documents to it with `{add}`, or choose a "
                         "new --output")  # fmt: skip


def _refuse_to_replace_what_is_no_index(output: Path) -> None:
    """`UsageError` unless `output` holds nothing but an index (finished or partial), which --overwrite may replace: a
    directory holding anything else (the user's documents, a model, a note of theirs) is never deleted."""
    from realm_hf.errors import UsageError

    # What `index build` and `index add` write: the manifest, the build's settings, shards (and their temporary
    # files) and the document store.
    index_entry = re.compile(r"index\.json|build\.json|documents|embeddings-\d+\.safetensors|\.embeddings-.*\.tmp")
    foreign = sorted(path.name for path in output.iterdir() if not index_entry.fullmatch(path.name))
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        raise UsageError(f"--overwrite: --output {output} holds files that are no part of an index ({shown}); expected "
                         "a directory of nothing but an index to replace: choose another --output")  # fmt: skip


def _discard_unresumable_staging(staging: Path, store, embedder, args, provenance: dict) -> None:
    """Removes what an earlier --overwrite build left in `staging` unless this build resumes it: its documents are
    this corpus and its settings these (a finished staging directory, never swapped in, is built again)."""
    import shutil

    from realm_hf.retrieval.document_store import DocumentStore
    from realm_hf.retrieval.index_builder import build_settings, resumable_build

    if not staging.exists():
        return
    settings = build_settings(embedder, len(store), shard_size=args.shard_size, batch_size=args.batch_size,
                              max_length=args.max_length, provenance=provenance)  # fmt: skip
    try:
        same_corpus = DocumentStore.load(staging / DOCUMENTS_DIR).fingerprint() == store.fingerprint()
    except (OSError, ValueError):
        same_corpus = False
    if not (same_corpus and resumable_build(staging, settings)):
        shutil.rmtree(staging)


def _without_passage_columns_the_index_lacks(store, index: Path):
    """`store` without the `source_id` / `passage` columns that splitting added, where the index's own documents have
    none (an index built from short documents): the passages keep their titles, and the appended rows fit."""
    from realm_hf.retrieval.document_store import MANIFEST_NAME, DocumentStore

    if not (index / DOCUMENTS_DIR / MANIFEST_NAME).is_file():
        return store  # not an index: add_documents says what is wrong
    existing = DocumentStore.load(index / DOCUMENTS_DIR).column_names
    extra = [name for name in ("source_id", "passage") if name in store.column_names and name not in existing]
    return DocumentStore(store.dataset.remove_columns(extra)) if extra else store


def cmd_add(args) -> int:
    from realm_hf.errors import missing_index_error
    from realm_hf.retrieval.distributed import process_state
    from realm_hf.retrieval.index_builder import add_documents

    if not Path(args.index).is_dir():
        raise missing_index_error("--index", args.index)
    documents = _without_passage_columns_the_index_lacks(
        open_corpus(args.corpus, args.max_words, args.text_column, args.title_column), Path(args.index)
    )
    embedder, tokenizer = _load_embedder(args.model, args.device)
    new_ids = add_documents(embedder, tokenizer, args.index, documents, batch_size=args.batch_size,
                            progress=not args.quiet)  # fmt: skip
    if process_state().is_main_process:
        _record_addition(Path(args.index), str(Path(args.corpus).resolve()), new_ids)
        ids = f"id {new_ids.start}" if len(new_ids) == 1 else f"ids {new_ids.start}..{new_ids.stop - 1}"
        print(f"added {_count(len(new_ids), 'block')} with {ids}; index now holds {_count(new_ids.stop, 'block')}")
    return 0


def _record_addition(index: Path, corpus: str, new_ids: range) -> None:
    """Records in the manifest's provenance what `index add` appended (`"added": [{"corpus", "first_id", "blocks"}]`),
    so that `index build --overwrite` can say what a rebuild over the first corpus leaves out."""
    from realm_hf.retrieval.index_files import read_manifest, write_manifest

    manifest = read_manifest(index)
    provenance = manifest.setdefault("provenance", {})
    provenance.setdefault("added", []).append({"corpus": corpus, "first_id": new_ids.start, "blocks": len(new_ids)})
    write_manifest(index, manifest)


def cmd_offload(args) -> int:
    from realm_hf import RealmForOpenQA, RealmRetriever
    from realm_hf.retrieval.document_store import DocumentStore
    from realm_hf.retrieval.index_builder import offload_block_embeddings

    model_location(args.model)  # a missing directory, a file, an index or an unknown repo id is named before any work
    output = Path(args.output)
    refuse_to_overwrite(output)
    check_writable_directory(output, "--output")
    model = RealmForOpenQA.from_pretrained(args.model)
    offload_block_embeddings(model, output)
    try:
        records = RealmRetriever.from_pretrained(args.model).block_records
    except FileNotFoundError:
        records = None
    if records is not None:
        DocumentStore.from_block_records(records).save(output / DOCUMENTS_DIR)
    print(
        f"wrote {model.searcher.num_blocks} block embeddings to {output}"
        + (" with their block records" if records is not None else " (the checkpoint has no block records)")
    )
    return 0


def cmd_compress(args) -> int:
    from realm_hf.retrieval.serving import DEFAULT_SERVING_RERANK_FACTOR, INDEX_DIR, SERVING_FILE, compress_open_qa

    model_location(args.model)  # a missing directory, a file, an index or an unknown repo id is named before any work
    output = Path(args.output)
    # An unfinished compress has written only index/; a finished one says which model it compressed.
    earlier = output.is_dir() and (
        {path.name for path in output.iterdir()} <= {INDEX_DIR}
        or _compressed_from(output / SERVING_FILE) == str(args.model)
    )  # fmt: skip
    refuse_to_overwrite(output, resumable=earlier)
    check_writable_directory(output, "--output")
    factory = _check_compress_factory(args)
    # What this run writes is removed if it fails (an interruption keeps it: a rerun resumes); what an earlier
    # compress left, which this run went on with, stays.
    created = not output.exists()
    fresh = created or not any(output.iterdir())
    try:
        summary = compress_open_qa(
            args.model, args.output, factory=args.factory, nprobe=args.nprobe, rerank=not args.no_rerank,
            rerank_factor=args.rerank_factor or DEFAULT_SERVING_RERANK_FACTOR, dtype=args.dtype,
            train_size=args.train_size,
        )  # fmt: skip
    except Exception as error:
        if fresh:
            _remove_what_this_run_wrote(output, created)
        reworded = _faiss_training_error(error, factory, f"--model {args.model}")
        if reworded is None:
            raise
        raise reworded from error
    files = summary["files"]
    print(f"wrote {args.output}: {summary['num_blocks']:,} blocks in faiss {summary['factory']!r} (nprobe "
          f"{summary['nprobe']}, {summary['index_bytes'] / 1e9:.2f} GB in RAM once loaded), "
          f"{summary['dtype']} model {files['model'] / 1e9:.2f} GB, block records {files['block_records'] / 1e9:.2f} "
          f"GB" + (f", fp32 re-rank shards {files['rerank_shards'] / 1e9:.2f} GB (read a few rows per question)"
                   if summary["rerank"] else ", no re-rank"))  # fmt: skip
    print(f'ask it: realm-hf ask --model {args.output} "QUESTION"')
    return 0


def _remove_what_this_run_wrote(directory: Path, created: bool) -> None:
    """Removes `directory` where this run `created` it, else empties it (this run found it empty)."""
    import shutil

    if not directory.is_dir():
        return
    if created:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _check_compress_factory(args) -> str | None:
    """The faiss factory `index compress` will build for `--model` (`--factory`, else the default for its size), after
    checking that there are enough block embeddings (or `--train-size`) to train it; `None` where the model's config
    does not tell (the compress itself then says what is wrong)."""
    from realm_hf import RealmConfig
    from realm_hf.retrieval.serving import default_factory

    try:
        config = RealmConfig.from_pretrained(args.model)
    except (OSError, ValueError):
        return args.factory
    if not config.store_block_emb or not config.num_block_records:
        return args.factory  # no block_emb: compress_open_qa says so
    num_blocks, dim = int(config.num_block_records), int(config.retriever_proj_size)
    factory = args.factory or default_factory(num_blocks, dim)
    _check_factory_fits(factory, num_blocks, dim, f"--model {args.model}", args.train_size)
    return factory


# faiss trains k-means with at least one point per centroid, and says so only once it trains (after compress has
# written its shards): "Number of training points (16) should be at least as large as number of clusters (64)".
_TOO_FEW_POINTS = re.compile(r"Number of training points \((\d+)\) should be at least as large as number of clusters "
                             r"\((\d+)\)")  # fmt: skip


def _check_factory_fits(factory: str, num_blocks: int, dim: int, holder: str, train_size: int | None = None) -> None:
    """Raises `UsageError` where faiss could not train the index `factory` makes on the `num_blocks` vectors `holder`
    holds (or the `train_size` of them sampled): k-means needs a training vector per centroid, so IVF needs one per
    list, PQ one per centroid of a codebook (256 for 8-bit codes), OPQ 256, PCA one per output dimension. Names what
    the factory needs and what there is, and the smaller factories that fit; an unknown factory raises
    `make_faiss_index`'s `ValueError`."""
    from realm_hf.errors import UsageError
    from realm_hf.retrieval.faiss_search import import_faiss, make_faiss_index

    faiss = import_faiss()
    index = make_faiss_index(dim, factory)
    if index.is_trained:
        return
    available = num_blocks if train_size is None else min(train_size, num_blocks)
    unmet = [need for need in _training_needs(faiss, index, available) if need[0] > available]
    if not unmet:
        return
    needed = max(count for count, _, _ in unmet)
    reasons = ", ".join(f"{count} for {what}" for count, what, _ in unmet)
    fixes = " and ".join(fix for _, _, fix in unmet)  # each part that needs more vectors than there are changes
    if available < num_blocks:
        there = (
            f"the training sample (--train-size {train_size}) holds {available} of the {num_blocks} blocks of {holder}"
        )
        if needed <= num_blocks:
            fixes += f", a --train-size of at least {needed}"
    else:
        there = f"{holder} holds {_count(num_blocks, 'block')}"
    raise UsageError(f"faiss factory {factory!r} needs at least {needed} training vectors (one per centroid: "
                     f"{reasons}), but {there}: use {fixes}, or Flat (exact search, which `index compress` builds "
                     f"below 1,000 blocks)")  # fmt: skip


def _training_needs(faiss, index, available: int) -> list[tuple[int, str, str]]:
    """`(vectors, what needs them, a change that needs at most available)` for each part of the faiss `index` that
    trains k-means: a PCA or OPQ transform, the IVF lists, PQ codebooks (of the index, its IVF or its HNSW storage)."""
    needs = []
    inner = faiss.downcast_index(index)  # a view, not an owner: `index` (the caller's) keeps it alive
    if isinstance(inner, faiss.IndexPreTransform):
        for position in range(inner.chain.size()):
            transform = faiss.downcast_VectorTransform(inner.chain.at(position))
            if isinstance(transform, faiss.OPQMatrix):
                needs.append((256, "its OPQ rotation", "no OPQ"))
            elif isinstance(transform, faiss.PCAMatrix):
                needs.append((transform.d_out, f"its PCA to {transform.d_out} dims",
                              f"a PCA to at most {available} dims"))  # fmt: skip
        inner = faiss.downcast_index(inner.index)
    ivf = faiss.try_extract_index_ivf(inner)
    if ivf is not None:
        needs.append((int(ivf.nlist), f"its {ivf.nlist} IVF lists", f"at most {available} IVF lists (IVF{available})"))
    storage = getattr(inner, "storage", None)  # HNSW over PQ codes
    holders = [inner, ivf] + ([faiss.downcast_index(storage)] if storage is not None else [])
    for holder in holders:
        pq = getattr(holder, "pq", None)
        if pq is not None and int(pq.ksub) > 1:
            fix = f"4-bit PQ codes (PQ{pq.M}x4fs)" if pq.ksub > 16 and available >= 16 else "no PQ codes"
            needs.append((int(pq.ksub), f"its {pq.nbits}-bit PQ codes", fix))
            break
    return needs


def _faiss_training_error(error: Exception, factory: str | None, holder: str):
    """A `UsageError` in place of faiss's C++ message (`Error in <signature> at <file>:<line>: ...`) where it could not
    train `factory` on the blocks of `holder`: most often fewer training vectors than centroids, in a part
    `_check_factory_fits` does not know (residual quantizers, say); `None` for any other error."""
    from realm_hf.errors import UsageError

    message = str(error).strip()
    found = _TOO_FEW_POINTS.search(message)
    if found is not None:
        points, clusters = found.groups()
        return UsageError(f"faiss factory {factory!r} needs at least {clusters} training vectors for one of its "
                          f"k-means trainings, but {holder} gave it {points}: choose a factory with fewer centroids, "
                          "or Flat (exact search)")  # fmt: skip
    if not (isinstance(error, RuntimeError) and message.startswith("Error in ")):
        return None
    reason = message.splitlines()[-1].rsplit(": ", 1)[-1]
    return UsageError(f"faiss could not train factory {factory!r} on the blocks of {holder} ({reason}): choose another "
                      "factory, or Flat (exact search)")  # fmt: skip


def _compressed_from(summary: Path) -> str | None:
    try:
        return json.loads(summary.read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError):
        return None


def cmd_eval(args) -> int:
    import numpy as np
    import torch

    from realm_hf.errors import UsageError
    from realm_hf.retrieval.evaluation import recall_at_k
    from realm_hf.retrieval.faiss_search import FaissSearcher
    from realm_hf.retrieval.serving import default_factory, default_nprobe
    from realm_hf.retrieval.torch_search import ExactSearcher

    exact = ExactSearcher.from_index(args.index)
    if args.faiss_index:
        approximate = FaissSearcher.load(args.faiss_index)
        if (approximate.num_blocks, approximate.index.d) != (exact.num_blocks, exact.dim):
            raise UsageError(
                f"--faiss-index {args.faiss_index} holds {_count(approximate.num_blocks, 'block')} of "
                f"{approximate.index.d} dims, but --index {args.index} holds {_count(exact.num_blocks, 'block')} of "
                f"{exact.dim} dims: expected a faiss index built from --index (its recall against another index means "
                "nothing)"
            )  # fmt: skip
        args.factory = approximate.factory
    else:
        # By default what `index compress` would build for this index (exact search below 1,000 blocks).
        args.factory = args.factory or default_factory(exact.num_blocks, exact.dim)
        _check_factory_fits(args.factory, exact.num_blocks, exact.dim, f"--index {args.index}")
        try:
            approximate = FaissSearcher.build(exact, factory=args.factory, metric=exact.metric, seed=0)
        except RuntimeError as error:
            reworded = _faiss_training_error(error, args.factory, f"--index {args.index}")
            if reworded is None:
                raise
            raise reworded from error
        if args.nprobe is None:
            args.nprobe = default_nprobe(approximate)  # as `index compress`
    if args.nprobe is not None:
        approximate.nprobe = args.nprobe
    if args.ef_search is not None:
        approximate.ef_search = args.ef_search
    # Queries: stored block embeddings plus noise, as questions land near (not on) their evidence blocks.
    generator = np.random.default_rng(0)
    ids = generator.choice(exact.num_blocks, size=min(args.num_queries, exact.num_blocks), replace=False)
    queries = exact.embeddings(torch.from_numpy(np.sort(ids))).float()
    queries = queries + args.noise * queries.std() * torch.from_numpy(generator.standard_normal(queries.shape)).float()
    # k beyond the index's size would count blocks that do not exist as missed: it is capped, and the note says so
    beyond = [k for k in args.k if k > exact.num_blocks]
    if beyond:
        asked = ", ".join(map(str, beyond))
        print(f"note: --k {asked} is more than the {_count(exact.num_blocks, 'block')} of --index {args.index}: "
              f"reported as recall_at_{exact.num_blocks} (every block)", file=sys.stderr)  # fmt: skip
    ks = sorted({min(k, exact.num_blocks) for k in args.k})
    reference = exact.search(queries, max(ks)).ids
    found = approximate.search(queries, max(ks)).ids
    report = {f"recall_at_{k}": recall_at_k(found[:, :k], reference[:, :k], k) for k in ks}
    report.update({"num_queries": len(ids), "num_blocks": exact.num_blocks, "factory": args.factory, "nprobe": approximate.nprobe,
                   "bytes_per_block": approximate.memory_bytes() / max(exact.num_blocks, 1)})  # fmt: skip
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>16}: {value:.4f}" if isinstance(value, float) else f"{key:>16}: {value}")
    return 0


def cutoffs(value: str) -> list[int]:
    """`--k`: comma-separated positive integers (`"5,100"` -> `[5, 100]`), or an argparse error naming what was
    received."""
    try:
        numbers = [int(part) for part in value.split(",")]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 5,100, got {value!r}")
    return sorted(set(numbers))


def _add_column_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--text-column",
        default="text",
        help="the text column of a file of rows (default: text); "
        "several, comma-separated, write each row's text from them (name,role,phone -> \"name: ...; "
        'role: ...; phone: ...")',
    )
    parser.add_argument("--title-column", default="title", help="its title column, if any (default: title)")


def add_parser(subparsers) -> None:
    index = subparsers.add_parser("index", help="build, extend, offload, compress and evaluate block-embedding indexes",
                                  description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = index.add_subparsers(dest="index_command", metavar="SUBCOMMAND", required=True)

    build = commands.add_parser("build", help="embed a corpus into a new index (resumable, data-parallel)")
    build.add_argument("--model", help="REALM embedder or open-QA checkpoint (directory or repo id); default: the "
                                       "default model")  # fmt: skip
    build.add_argument("--corpus", required=True, help="JSONL/CSV/TSV/Parquet with text[,title], a .txt or Markdown "
                                                        "file or a directory of them (a document per paragraph), "
                                                        "block_records.npy/.safetensors, or a saved document "
                                                        "store")  # fmt: skip
    build.add_argument("--output", required=True, help="index directory (resumes if it holds a partial build)")
    build.add_argument("--overwrite", action="store_true",
                       help="replace the index --output holds: the new one is built beside it and swapped in once "
                            "complete, so the old one stays whole if the build fails or is interrupted (and a rerun "
                            "resumes)")  # fmt: skip
    build.add_argument("--shard-size", type=positive_int, help="blocks per shard, the unit an interrupted build "
                       "resumes from (default: a 64th of the corpus, 256 to 16384)")  # fmt: skip
    build.add_argument("--batch-size", type=positive_int, default=64, help="blocks per forward pass (default: 64)")
    build.add_argument("--max-length", type=positive_int, default=288, help="wordpieces per block (default: 288)")
    build.add_argument("--max-words", type=non_negative_int, default=DEFAULT_MAX_WORDS,
                       help=f"split longer texts into passages of at most this many words, at sentence ends "
                            f"(default: {DEFAULT_MAX_WORDS}; 0: keep every text whole)")  # fmt: skip
    _add_column_arguments(build)
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_argument(build, "embedding", "auto")
    add_precision_argument(build, "embedding")
    build.set_defaults(func=cmd_build, resumable=True)

    add = commands.add_parser("add", help="embed new documents and append them (existing ids never change)")
    add.add_argument("--index", required=True, help="an index directory made by `index build`")
    add.add_argument("--model", help="the model the index was built with (default: the default model)")
    add.add_argument("--corpus", required=True, help="the NEW documents (same formats as build)")
    add.add_argument("--max-words", type=non_negative_int, default=DEFAULT_MAX_WORDS,
                     help=f"as for build (default: {DEFAULT_MAX_WORDS})")  # fmt: skip
    _add_column_arguments(add)
    add.add_argument("--batch-size", type=positive_int, default=64)
    add.add_argument("--quiet", action="store_true")
    add_device_argument(add, "embedding", "auto")
    add.set_defaults(func=cmd_add)

    offload = commands.add_parser("offload", help="move an open-QA checkpoint's block_emb into an index on disk")
    offload.add_argument("--model", required=True, help="RealmForOpenQA checkpoint (directory or repo id)")
    offload.add_argument("--output", required=True, help="index directory to write")
    offload.set_defaults(func=cmd_offload)

    compress = commands.add_parser(
        "compress", help="a light server from an open-QA checkpoint: bf16 model without block_emb + IVF-PQ index"
    )
    compress.add_argument(
        "--model", required=True, help="RealmForOpenQA checkpoint with block_emb (directory or repo id)"
    )
    compress.add_argument("--output", required=True, help="directory to write (model, block records, index/)")
    compress.add_argument("--factory", help="faiss factory string (default: IVF<4 sqrt(N), 64..4096>,PQ<dim/4>x4fs)")
    compress.add_argument("--nprobe", type=positive_int, help="IVF lists probed per question (default: a quarter)")
    compress.add_argument("--rerank-factor", type=positive_int,
                          help="faiss candidates re-scored exactly per retrieved block (default: 100, i.e. 500 "
                               "candidates for 5 blocks read)")  # fmt: skip
    compress.add_argument("--no-rerank", action="store_true",
                          help="no fp32 shards on disk: serve the compressed scores as they are (lower recall)")  # fmt: skip
    compress.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                          help="weights of the saved model (default: bfloat16)")  # fmt: skip
    compress.add_argument("--train-size", type=positive_int, help="faiss training sample (default: 64 per IVF list)")
    compress.set_defaults(func=cmd_compress)

    evaluate = commands.add_parser("eval", help="recall@k of an approximate (faiss) index against exact search")
    evaluate.add_argument("--index", required=True, help="an index directory (the exact reference)")
    evaluate.add_argument("--factory", help="faiss factory string (default: what `index compress` builds for this "
                          "index, IVF<4 sqrt(N)>,PQ<dim/4>x4fs; Flat below 1,000 blocks)")  # fmt: skip
    evaluate.add_argument("--faiss-index", help="evaluate a saved FaissSearcher directory instead of building one")
    evaluate.add_argument("--nprobe", type=positive_int, help="IVF lists probed per query")
    evaluate.add_argument("--ef-search", type=positive_int, help="HNSW search breadth")
    evaluate.add_argument("--k", type=cutoffs, default="5,100", help="comma-separated cut-offs, each capped at the "
                          "index's size (default: 5,100)")  # fmt: skip
    evaluate.add_argument(
        "--num-queries", type=positive_int, default=1000, help="queries sampled from the index (default 1000)"
    )
    evaluate.add_argument("--noise", type=non_negative_float, default=0.3,
                          help="query noise, relative to the embeddings' std (default: 0.3)")  # fmt: skip
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.set_defaults(func=cmd_eval)


__all__ = ["add_parser", "cutoffs", "open_corpus"]

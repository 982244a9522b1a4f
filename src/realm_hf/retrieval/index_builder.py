"""Builds and extends the on-disk block-embedding index: resumable, atomic, data-parallel under accelerate.

The corpus is cut into shards of `shard_size` consecutive blocks. Each shard is embedded in fixed batches and
written atomically, so after an interruption (even `kill -9`) a re-run skips every finished shard and recomputes the
rest: nothing is lost or duplicated, and the result is byte-identical to an uninterrupted run on the same settings.
Under `accelerate launch` / `torchrun`, rank r embeds shards r, r + world_size, ...; the main process writes the
manifest last, so an index directory with an `index.json` is always complete.
"""

import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..atomic import atomic_write_bytes
from ..errors import IndexMismatchError, InputError, UsageError
from .distributed import process_state
from .embedding import embed_blocks
from .index_files import (
    MANIFEST_NAME,
    open_embedding_shard,
    read_manifest,
    shard_file_name,
    write_embedding_shard,
    write_manifest,
)

logger = logging.get_logger(__name__)

BUILD_SETTINGS_NAME = "build.json"


class _Documents:
    """The slice of the document-store API the builder needs: `len`, `titles(ids)` and `texts(ids)`."""

    def __init__(self, texts: Sequence[str], titles: Sequence[str] | None = None):
        self._texts, self._titles = texts, titles

    def __len__(self) -> int:
        return len(self._texts)

    def texts(self, ids) -> list[str]:
        return [self._texts[i] for i in ids]

    def titles(self, ids) -> list[str]:
        return [self._titles[i] if self._titles is not None else "" for i in ids]


def as_documents(documents):
    """Accepts a `DocumentStore` (anything with `texts(ids)` and `titles(ids)`) or a plain list of texts."""
    if hasattr(documents, "texts") and hasattr(documents, "titles"):
        return documents
    if isinstance(documents, Sequence) and all(isinstance(text, str) for text in documents[:10]):
        return _Documents(documents)
    raise TypeError(f"documents must be a DocumentStore or a sequence of str, got {type(documents).__name__}.")


def _shard_is_complete(path: Path, count: int, dim: int) -> bool:
    if not path.is_file():
        return False
    try:
        array = open_embedding_shard(path)
    except ValueError:
        return False
    return array.shape == (count, dim)


def _recorded_settings(directory: Path) -> dict | None:
    """The settings a partial build in `directory` recorded (`build.json`), or `None` where there is none."""
    path = directory / BUILD_SETTINGS_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _settings_differences(directory: Path, settings: dict) -> dict | None:
    """`None` where `directory` holds no partial build's settings, else `{key: (recorded, now)}` for each of
    `settings` that differs from what the partial build recorded (`{}`: it resumes)."""
    previous = _recorded_settings(directory)
    if previous is None:
        return None
    return {key: (previous.get(key), value) for key, value in settings.items() if previous.get(key) != value}


def _check_settings(directory: Path, settings: dict) -> None:
    differences = _settings_differences(directory, settings)
    if differences is None:
        atomic_write_bytes(directory / BUILD_SETTINGS_NAME, json.dumps(settings, indent=2).encode("utf-8"))
    elif differences:
        described = "; ".join(f"{key}: was {old!r}, now {new!r}" for key, (old, new) in differences.items())
        raise ValueError(
            f"{directory} holds a partial index built with other settings ({described}). Resume with the same "
            "settings, or choose a new output directory."
        )


def _embed_shards(embedder, tokenizer, documents, directory: Path, plan: list[dict], state,
                  batch_size: int, max_length: int, progress: bool, precision: str = "fp32") -> None:  # fmt: skip
    dim = embedder.config.retriever_proj_size
    mine = plan[state.process_index :: state.num_processes]
    todo = [shard for shard in mine if not _shard_is_complete(directory / shard["file"], shard["count"], dim)]
    description = f"embedding (rank {state.process_index})" if state.num_processes > 1 else "embedding"
    if len(todo) < len(mine):  # said where the progress shows: a rerun that resumes is seen to
        done = f"{len(mine) - len(todo)} of {len(mine)} shards already embedded"
        logger.info(f"rank {state.process_index}: {done}")
        description = f"{description}, resumed: {done}"
    bar = tqdm(
        total=sum(shard["count"] for shard in todo), unit="block", disable=not progress, desc=description,
        position=state.process_index,
    )  # fmt: skip
    for shard in todo:
        ids = range(shard["start"], shard["start"] + shard["count"])
        embeddings = embed_blocks(embedder, tokenizer, documents.texts(ids), documents.titles(ids),
                                  batch_size=batch_size, max_length=max_length, precision=precision)  # fmt: skip
        write_embedding_shard(directory / shard["file"], embeddings)
        bar.update(shard["count"])
    bar.close()


def is_finished_index(directory: str | Path) -> bool:
    """Whether `directory` holds a finished index: a manifest and no partial build's settings."""
    directory = Path(directory)
    return (directory / MANIFEST_NAME).is_file() and not (directory / BUILD_SETTINGS_NAME).is_file()


def index_add_command(directory: str | Path, default_model: str | Path | None = None) -> str:
    """The `realm-hf index add` command that appends documents to the index `directory`, with the model its manifest
    says it was built with as `--model` ([`model_option`])."""
    import shlex

    option = model_option(directory, default_model)
    return f"realm-hf index add --index {shlex.quote(str(directory))}{option} --corpus NEW_DOCS"


def model_option(directory: str | Path, default_model: str | Path | None = None) -> str:
    """` --model MODEL` for a command over the index `directory`, MODEL the one its manifest says it was built with;
    `""` where that is `default_model` (what the commands use without one), and ` [--model MODEL]` where the manifest
    names no model."""
    import shlex

    try:
        model = read_manifest(Path(directory)).get("provenance", {}).get("model")
    except (OSError, ValueError, AttributeError):
        model = None
    if not isinstance(model, str) or not model:
        return " [--model MODEL]"
    if default_model is not None and Path(model).resolve() == Path(default_model).resolve():
        return ""
    return f" --model {shlex.quote(model)}"


def refuse_finished_index(directory: Path) -> None:
    """Raises `UsageError` if `directory` holds a finished index (a manifest and no partial build's settings)."""
    directory = Path(directory)
    if is_finished_index(directory):
        raise UsageError(
            f"{directory} already holds a finished index: add documents to it with `{index_add_command(directory)}` "
            "(Python: add_documents / add_to_index), or build into a new directory"
        )


def _check_documents(directory: Path, num_blocks: int) -> None:
    """The index's document store, if it has one, holds one document per embedded block."""
    stored = directory / DOCUMENTS_DIR
    if stored.is_dir():
        from .document_store import DocumentStore

        count = len(DocumentStore.load(stored))
        if count != num_blocks:
            raise IndexMismatchError(
                f"{directory} is inconsistent: {count} documents in {stored} but {num_blocks} embedded blocks",
                path=stored,
            )


def verify_index(directory: str | Path) -> dict:
    """Checks that an index directory's parts agree, reading only headers: the manifest (`index.json`), every
    shard's shape and dtype, and the document count under `documents/` when there is one. Returns the manifest;
    raises `FileFormatError` / `IndexMismatchError` naming the file and the disagreement."""
    from .index_files import open_index_shards

    directory = Path(directory)
    manifest, _ = open_index_shards(directory)
    _check_documents(directory, manifest["num_blocks"])
    return manifest


def _clean_temporary_files(directory: Path) -> None:
    for stale in directory.glob(".embeddings-*.tmp"):
        stale.unlink(missing_ok=True)


# Wordpieces a block is embedded with, at most, unless the caller says otherwise.
DEFAULT_MAX_LENGTH = 288


# Provenance that says when a run read its corpus, not what it builds (see `build_settings`).
RUN_PROVENANCE = frozenset({"corpus_read_at"})


def build_settings(embedder, num_blocks: int, *, shard_size: int, batch_size: int, max_length: int,
                   provenance: dict | None = None) -> dict:  # fmt: skip
    """The settings [`build_index`] records in a partial build (`build.json`) and resumes only under."""
    # A block never holds more wordpieces than the model has positions (the demo model has 128, REALM 512).
    max_length = min(max_length, getattr(embedder.config, "max_position_embeddings", max_length))
    # When the corpus was read differs from one run to the next: a resumed build is still the same build.
    provenance = {key: value for key, value in (provenance or {}).items() if key not in RUN_PROVENANCE}
    return {"num_blocks": num_blocks, "dim": embedder.config.retriever_proj_size, "shard_size": shard_size,
            "max_length": max_length, "batch_size": batch_size, "provenance": provenance}  # fmt: skip


def default_shard_size(num_blocks: int, directory: str | Path | None = None) -> int:
    """Blocks per shard where none is chosen (`realm-hf index build`): a partial build's own in `directory` (so that
    it resumes), else about a 64th of the corpus, between 256 and 16,384 blocks. The shard is the unit of resumption:
    an interrupted build of a few thousand documents loses seconds of work, not all of it, while 13M blocks stay in
    ~800 files."""
    if directory is not None:
        try:
            recorded = (_recorded_settings(Path(directory)) or {}).get("shard_size")
        except (OSError, ValueError, AttributeError):
            recorded = None  # unreadable settings: the build reports them itself
        if isinstance(recorded, int) and recorded > 0:
            return recorded
    return min(16384, max(256, math.ceil(num_blocks / 64)))


def resumable_build(directory: str | Path, settings: dict) -> bool:
    """Whether `directory` holds a partial build that [`build_index`] would resume under `settings`."""
    try:
        return _settings_differences(Path(directory), settings) == {}
    except (OSError, ValueError):
        return False


@torch.no_grad()
def build_index(
    embedder,
    tokenizer,
    documents,
    output_dir: str | Path,
    *,
    shard_size: int = 16384,
    batch_size: int = 64,
    max_length: int = DEFAULT_MAX_LENGTH,
    provenance: dict | None = None,
    progress: bool = True,
    precision: str = "fp32",
) -> dict:
    r"""
    Embeds every block of `documents` with `embedder` into an index directory (see `index_files`), resuming if the
    directory holds a partial build with the same settings.

    Args:
        embedder (`RealmEmbedder`): the block encoder.
        tokenizer (`RealmTokenizer`): its tokenizer.
        documents (`DocumentStore` or `Sequence[str]`): the corpus; block ids are positions.
        output_dir (`str` or `Path`): the index directory.
        shard_size (`int`, defaults to 16384): blocks per shard, the unit of resumption and of data parallelism.
        batch_size (`int`, defaults to 64), max_length (`int`, defaults to 288): embedding batches and truncation
            (at most the model's `max_position_embeddings`).
        provenance (`dict`, *optional*): recorded in the manifest (e.g. the model and corpus used).
        progress (`bool`, defaults to `True`): show a progress bar per rank.
        precision (`str`, defaults to "fp32"): "bf16" embeds under bf16 autocast (embeddings stored in fp32);
            "auto" picks bf16 where the device has native bf16 (`realm_hf.precision`; the CLI's default).

    Returns:
        The manifest (`dict`) written to `output_dir/index.json`.
    """
    if shard_size < 1 or batch_size < 1:
        raise ValueError(f"shard_size and batch_size must be positive, got {shard_size} and {batch_size}.")
    documents = as_documents(documents)
    state = process_state()
    directory = Path(output_dir)
    num_blocks = len(documents)
    settings = build_settings(embedder, num_blocks, shard_size=shard_size, batch_size=batch_size,
                              max_length=max_length, provenance=provenance)  # fmt: skip
    dim, max_length = settings["dim"], settings["max_length"]

    if num_blocks == 0:
        raise InputError("build_index: expected at least one document to embed, got none")
    if state.is_main_process:
        refuse_finished_index(directory)
        directory.mkdir(parents=True, exist_ok=True)
        _clean_temporary_files(directory)
        _check_settings(directory, settings)
    state.wait_for_everyone()

    num_shards = math.ceil(num_blocks / shard_size)
    plan = [
        {"file": shard_file_name(index), "start": index * shard_size,
         "count": min(shard_size, num_blocks - index * shard_size)}
        for index in range(num_shards)
    ]  # fmt: skip
    _embed_shards(embedder, tokenizer, documents, directory, plan, state, batch_size, max_length, progress,
                  precision)  # fmt: skip
    state.wait_for_everyone()

    manifest = {"dim": dim, "metric": "ip", "num_blocks": num_blocks, "dtype": "float32", "shard_size": shard_size,
                "max_length": max_length, "shards": plan, "provenance": provenance or {}}  # fmt: skip
    if state.is_main_process:
        for shard in plan:
            if not _shard_is_complete(directory / shard["file"], shard["count"], dim):
                raise RuntimeError(f"shard {shard['file']} is missing or incomplete after the build.")
        _check_documents(directory, num_blocks)
        # Written last: an index.json means documents, embeddings and manifest agree.
        write_manifest(directory, manifest)
        (directory / BUILD_SETTINGS_NAME).unlink(missing_ok=True)
    state.wait_for_everyone()
    written = read_manifest(directory)
    # Every process has read the manifest before any returns: a caller may move the directory at once (the index
    # refresher renames its partial build), and a slower rank would then find nothing to read.
    state.wait_for_everyone()
    return written


@torch.no_grad()
def add_to_index(
    embedder,
    tokenizer,
    documents,
    index_dir: str | Path,
    *,
    batch_size: int = 64,
    progress: bool = True,
) -> range:
    r"""
    Embeds new blocks and appends them to an existing index as new shards; existing ids never change.

    Args:
        documents (`DocumentStore` or `Sequence[str]`): the NEW blocks only.

    Returns:
        The ids the new blocks received.
    """
    documents = as_documents(documents)
    state = process_state()
    directory = Path(index_dir)
    manifest = read_manifest(directory)
    if embedder.config.retriever_proj_size != manifest["dim"]:
        raise IndexMismatchError(
            f"the embedder's retriever_proj_size ({embedder.config.retriever_proj_size}) does not match the index "
            f"dimension ({manifest['dim']})."
        )
    first_id, first_shard = manifest["num_blocks"], len(manifest["shards"])
    shard_size = manifest["shard_size"]
    num_new = len(documents)
    plan = [
        {"file": shard_file_name(first_shard + index), "start": first_id + index * shard_size,
         "count": min(shard_size, num_new - index * shard_size)}
        for index in range(math.ceil(num_new / shard_size))
    ]  # fmt: skip

    class _Shifted:
        """The new documents under their future global ids."""

        def texts(self, ids):
            return documents.texts([i - first_id for i in ids])

        def titles(self, ids):
            return documents.titles([i - first_id for i in ids])

    if state.is_main_process:
        _clean_temporary_files(directory)
    state.wait_for_everyone()
    max_length = manifest.get("max_length")
    if max_length is None:  # an index.json written before the build recorded it (the default model's own index)
        max_length = min(DEFAULT_MAX_LENGTH, getattr(embedder.config, "max_position_embeddings", DEFAULT_MAX_LENGTH))
        logger.warning(
            f"{directory / 'index.json'} names no max_length (the wordpieces each block was embedded with): the new "
            f"blocks are embedded with up to {max_length}, as `realm-hf index build` does"
        )
    _embed_shards(embedder, tokenizer, _Shifted(), directory, plan, state, batch_size, max_length, progress)
    state.wait_for_everyone()
    if state.is_main_process:
        manifest["shards"] = manifest["shards"] + plan
        manifest["num_blocks"] = first_id + num_new
        write_manifest(directory, {key: value for key, value in manifest.items() if key not in ("format", "version")})
    state.wait_for_everyone()
    return range(first_id, first_id + num_new)


DOCUMENTS_DIR = "documents"


def add_documents(embedder, tokenizer, index_dir: str | Path, documents, *, batch_size: int = 64,
                  progress: bool = True) -> range:  # fmt: skip
    r"""
    Adds documents to an index in one call: embeds and appends them (`add_to_index`), then appends them to the
    index's document store (`index_dir/documents`). Existing ids never change.

    Args:
        documents (`DocumentStore` or iterable of `{"text", "title"}` dicts): the NEW documents.

    Returns:
        The ids the new documents received.
    """
    from .document_store import DocumentStore

    directory = Path(index_dir)
    store = DocumentStore.load(directory / DOCUMENTS_DIR)
    num_blocks = read_manifest(directory)["num_blocks"]
    if len(store) != num_blocks:
        raise IndexMismatchError(
            f"{directory} is inconsistent: {len(store)} documents but {num_blocks} embedded blocks", path=directory
        )
    new = documents if isinstance(documents, DocumentStore) else DocumentStore.from_records(documents)
    unknown = sorted(set(new.column_names) - set(store.column_names))
    if unknown:  # checked before anything is embedded: the append at the end would refuse them
        raise InputError(
            f"the new documents have column(s) {unknown} that the index's documents lack; expected columns among "
            f"{store.column_names}: drop those columns, or build a new index over all the documents"
        )
    _warn_about_repeats(store, new)
    new_ids = add_to_index(embedder, tokenizer, new, directory, batch_size=batch_size, progress=progress)
    state = process_state()
    if state.is_main_process:
        # Embeddings first, documents second: a crash in between shows as the inconsistency checked above.
        records = (
            {key: value for key, value in record.items() if key != "id"}
            for start in range(0, len(new), 10_000)
            for record in new.get(range(start, min(start + 10_000, len(new))))
        )
        appended = store.append(records)
        if appended != new_ids:
            raise RuntimeError(f"document ids {appended} do not match the embedded ids {new_ids}.")
        store.save(directory / DOCUMENTS_DIR)
    state.wait_for_everyone()
    return new_ids


# Stores up to this many documents are checked for documents added a second time (reading their texts takes seconds).
REPEAT_CHECK_MAX_DOCUMENTS = 1_000_000


def _warn_about_repeats(store, new) -> None:
    """Warns when documents being added are already in the store (same title and text), e.g. the same corpus added
    twice: they are added again, under new ids, and would be retrieved twice."""
    if len(store) > REPEAT_CHECK_MAX_DOCUMENTS or len(new) == 0:
        return

    def pairs(documents):
        titles = documents.dataset["title"] if "title" in documents.dataset.column_names else [""] * len(documents)
        return zip(titles, documents.dataset["text"])

    known = set(pairs(store))
    repeated = sum(pair in known for pair in pairs(new))
    if repeated:
        logger.warning(f"{repeated} of the {len(new)} documents added are already in the index (same title and "
                       "text): they are added again, under new ids, and will be read twice. Pass only new documents.")  # fmt: skip


def write_index(
    embeddings,
    output_dir: str | Path,
    *,
    shard_size: int = 262144,
    provenance: dict | None = None,
    dtype: str = "float32",
) -> dict:
    """Writes existing block embeddings `(num_blocks, dim)` (a tensor, possibly memory-mapped, or an array) as an
    index directory, one shard-sized slice at a time so that no second full copy is made; `dtype="float16"` halves
    the files (e.g. an index shipped with a model)."""
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    num_blocks, dim = int(embeddings.shape[0]), int(embeddings.shape[1])
    plan = []
    for index, start in enumerate(range(0, num_blocks, shard_size)):
        count = min(shard_size, num_blocks - start)
        shard = {"file": shard_file_name(index), "start": start, "count": count}
        write_embedding_shard(directory / shard["file"], embeddings[start : start + count], dtype=dtype)
        plan.append(shard)
    write_manifest(directory, {"dim": dim, "metric": "ip", "num_blocks": num_blocks, "dtype": dtype,
                               "shard_size": shard_size, "shards": plan, "provenance": provenance or {}})  # fmt: skip
    return read_manifest(directory)


def offload_block_embeddings(model, index_dir: str | Path, *, shard_size: int = 262144, **searcher_kwargs):
    r"""
    Moves a `RealmForOpenQA`'s `block_emb` buffer to an index directory on disk and makes the model search it through
    an `ExactSearcher` (memory-mapped). The model object then holds no block embeddings, and `save_pretrained` writes
    a small checkpoint whose config says `store_block_emb: false`; load it again with
    `RealmForOpenQA.from_pretrained(path, searcher=ExactSearcher.from_index(index_dir))`.

    Returns:
        The `ExactSearcher` now attached as `model.searcher`.
    """
    from .torch_search import ExactSearcher

    if model.block_emb.shape[0] == 0:
        raise ValueError("this model's block_emb is already empty (config.store_block_emb is False); nothing to move.")
    write_index(model.block_emb, index_dir, shard_size=shard_size,
                provenance={"source": "block_emb", "model": model.name_or_path})  # fmt: skip
    searcher = ExactSearcher.from_index(index_dir, **searcher_kwargs)
    # Re-registered as an empty, non-persistent buffer: the model no longer saves (or holds) block embeddings.
    model.register_buffer("block_emb", torch.empty(0, model.config.retriever_proj_size), persistent=False)
    model.config.store_block_emb = False
    model.searcher = searcher
    return searcher


__all__ = [
    "DOCUMENTS_DIR",
    "add_documents",
    "add_to_index",
    "as_documents",
    "build_index",
    "build_settings",
    "index_add_command",
    "is_finished_index",
    "offload_block_embeddings",
    "refuse_finished_index",
    "resumable_build",
    "verify_index",
    "write_index",
]

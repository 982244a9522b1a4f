"""One loader for every open-QA layout realm_hf reads or writes: the model, what it searches and what it reads.

[`load_open_qa`] (also behind `pipeline("open-qa", model=...)`, `realm-hf ask|evaluate --model X [--index DIR]`)
finds, for a directory or Hub repo id:

- **the searcher** (the block embeddings): `searcher=` if given; else the index directory `index=`; else the
  location's `index/` (an `index.json` and its shards), read as its `searcher.json` asks (hybrid BM25 + dense
  candidates, or dense alone without the file); else none, and the model searches its own `block_emb` (the 4.x layout,
  `config.store_block_emb: true`).
- **the documents** (the block texts, by block id): `retriever=` if given; else the `documents/` of the index
  directory `index=`, `index/documents/`, `documents/` (a `DocumentStore`), `corpus.json` (a corpus rebuilt from
  installed packages: the default model), `block_records.safetensors` or the Hub's pickled `block_records.npy`.

See docs/loading.md for the layouts and what writes each one.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging

from .checkpoints import HUB_KWARGS, check_hub_model
from .modeling import RealmConfig, RealmForOpenQA
from .precision import compute_in_float32

logger = logging.get_logger(__name__)

INDEX_DIR = "index"
DOCUMENTS_DIR = "documents"
CORPUS_FILE = "corpus.json"
INDEX_MANIFEST = "index.json"
# Corpus builders a corpus.json may name; nothing else is imported from it.
CORPUS_BUILDERS = {"realm_hf.data.corpora.build_offline_corpus"}


@dataclass
class OpenQARetrieval:
    """What a model searches and reads, as found by [`find_retrieval`].

    Attributes:
        retriever: turns block ids into reader inputs ([`PreTokenizedRetriever`] by default, [`RealmRetriever`] with
            `pretokenized=False`).
        searcher: the index searcher, or `None` when the model searches its own `block_emb`.
        sources (`dict[str, str]`): where the documents and the embeddings came from, for messages.
    """

    retriever: Any
    searcher: Any
    sources: dict


def _hub_kwargs(kwargs: dict) -> dict:
    return {key: kwargs[key] for key in HUB_KWARGS if key in kwargs}


def _local_directory(name_or_path, hub_kwargs: dict) -> Path | None:
    directory = Path(name_or_path) / hub_kwargs.get("subfolder", "")
    return directory if directory.is_dir() else None


def _hub_index(repo_id: str, hub_kwargs: dict) -> Path | None:
    """The `index/` folder of a Hub repo (as `realm-hf push --index` uploads it), downloaded or from the cache."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    subfolder = hub_kwargs.get("subfolder", "")
    prefix = f"{subfolder}/{INDEX_DIR}" if subfolder else INDEX_DIR
    options = {key: value for key, value in hub_kwargs.items() if key != "subfolder"}
    try:
        hf_hub_download(repo_id, INDEX_MANIFEST, subfolder=prefix, **options)
    except (EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError, OSError):
        return None
    allowed = {
        key: value
        for key, value in options.items()
        if key in ("cache_dir", "revision", "token", "local_files_only", "force_download")
    }
    snapshot = snapshot_download(repo_id, allow_patterns=[f"{prefix}/*", f"{prefix}/{DOCUMENTS_DIR}/*"], **allowed)
    return Path(snapshot) / prefix


def _open_documents(location: Path):
    from .retrieval.document_store import DocumentStore

    return DocumentStore.load(location)


def _documents_from_corpus_file(path: Path):
    from .default_model import offline_corpus_store

    spec = json.loads(path.read_text(encoding="utf-8"))
    builder = spec.get("builder")
    if builder not in CORPUS_BUILDERS:
        raise ValueError(f"{path}: expected a builder among {sorted(CORPUS_BUILDERS)}, received {builder!r}.")
    return offline_corpus_store(expected=spec)


def find_block_records(name_or_path, directory: Path | None = None, index_dir: Path | None = None,
                       hub_kwargs: dict | None = None):  # fmt: skip
    """
    The block texts by id that a model's searcher is read with, and where they came from: `(records, source)`.

    Looked for in this order: the index's `documents/` (`index_dir`), the model directory's `index/documents/` and
    `documents/`, its `corpus.json` (an offline corpus rebuilt), then its block records (`block_records.safetensors` or
    the Hub's legacy `block_records.npy`, also from the Hub for a repo id, with `hub_kwargs`).

    Raises:
        ValueError: none of them is there (the message lists what was looked for).
    """
    from .retrieval.retriever import BLOCK_RECORDS_NAME, LEGACY_BLOCK_RECORDS_NAME, _resolve_block_records

    candidates = []
    if index_dir is not None:
        candidates.append(index_dir / DOCUMENTS_DIR)
    if directory is not None:
        candidates += [directory / INDEX_DIR / DOCUMENTS_DIR, directory / DOCUMENTS_DIR]
    for location in candidates:
        if location.is_dir():
            return _open_documents(location).as_block_records(), str(location)
    if directory is not None and (directory / CORPUS_FILE).is_file():
        return _documents_from_corpus_file(directory / CORPUS_FILE).as_block_records(), str(directory / CORPUS_FILE)
    from .retrieval.block_records import load_block_records

    try:
        path = _resolve_block_records(str(name_or_path), hub_kwargs or {})
    except FileNotFoundError as error:
        found = f"has an index ({index_dir}) but no documents" if index_dir is not None else "holds no documents"
        raise ValueError(
            f"{name_or_path} {found}: expected {DOCUMENTS_DIR}/ in the index (a DocumentStore, as `realm-hf index "
            f"build` writes it), or in the model directory {DOCUMENTS_DIR}/, {CORPUS_FILE}, {BLOCK_RECORDS_NAME} or "
            f"{LEGACY_BLOCK_RECORDS_NAME}."
        ) from error
    return load_block_records(path), path


def find_retrieval(
    name_or_path: str | os.PathLike,
    index: str | os.PathLike | None = None,
    *,
    searcher=None,
    tokenizer=None,
    pretokenized: bool = True,
    **kwargs,
) -> OpenQARetrieval:
    r"""
    Finds what a model at `name_or_path` searches and reads (see this module's docstring for the order).

    Args:
        name_or_path (`str` or `os.PathLike`): a model directory or Hub repo id.
        index (`str` or `os.PathLike`, *optional*): an index directory (`realm-hf index build`) to search instead of
            the model's own embeddings; its `documents/` are read when it has them.
        searcher (*optional*): a ready searcher (e.g. a `FaissSearcher`), instead of any index.
        tokenizer (*optional*): the tokenizer; loaded from `name_or_path` when `None`.
        pretokenized (`bool`, defaults to `True`): a [`PreTokenizedRetriever`] that tokenizes each block once, when
            first retrieved, and builds reader inputs from ids; `False` gives transformers 4.x's [`RealmRetriever`].
        kwargs: Hub options (`revision`, `cache_dir`, `token`, `local_files_only`, `subfolder`).
    """
    from .retrieval import PreTokenizedRetriever, RealmRetriever, is_searcher_directory, open_searcher

    hub_kwargs = _hub_kwargs(kwargs)
    directory = _local_directory(name_or_path, hub_kwargs)
    index_dir = index_directory(index) if index is not None else None
    sources = {}
    if searcher is None:
        own_index = None
        if index_dir is None:
            if directory is not None:
                own_index = directory / INDEX_DIR if is_searcher_directory(directory / INDEX_DIR) else None
            else:
                own_index = _hub_index(str(name_or_path), hub_kwargs)
        search_dir = index_dir if index_dir is not None else own_index
        if search_dir is not None:
            searcher = open_searcher(search_dir)  # exact, or faiss for `realm-hf index compress`
            sources["embeddings"] = str(search_dir)
            if index_dir is None:
                index_dir = own_index
    if index is not None and (index_dir / INDEX_MANIFEST).is_file() and not (index_dir / DOCUMENTS_DIR).is_dir():
        # Not the model's documents instead: they would be another corpus, and only a count could tell.
        from .retrieval.index_files import read_manifest

        _check_documents_kept(index_dir, read_manifest(index_dir))
    records, sources["documents"] = find_block_records(name_or_path, directory, index_dir, hub_kwargs)
    if searcher is not None and searcher.num_blocks != len(records):
        own = " (the index has no documents/ of its own)" if index_dir is not None and not (
            index_dir / DOCUMENTS_DIR).is_dir() else ""  # fmt: skip
        raise ValueError(
            f"the index at {sources.get('embeddings', 'searcher=')} holds {searcher.num_blocks} blocks but the "
            f"documents at {sources['documents']}{own} hold {len(records)}: block ids would point at the wrong text. "
            "Pass the index built over these documents (realm-hf index build writes both)."
        )
    if searcher is not None and directory is not None and sources.get("embeddings"):
        # An index (the model's own or `index=`), read as the model directory asks (searcher.json: hybrid candidates,
        # BM25 over that index's documents, or dense): a model is served over your documents as over its own, and
        # `realm-hf train --index` reads what it serves. A `searcher=` is used as given.
        from .retrieval.hybrid import load_searcher_settings, with_searcher_settings

        searcher = with_searcher_settings(searcher, records, load_searcher_settings(directory))
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **hub_kwargs)
    if pretokenized:
        retriever = PreTokenizedRetriever.from_block_records(records, tokenizer)
    else:
        retriever = RealmRetriever(block_records=records, tokenizer=tokenizer)
    return OpenQARetrieval(retriever=retriever, searcher=searcher, sources=sources)


def is_own_index(name_or_path, index: str | os.PathLike | None, searcher=None) -> bool:
    """Whether a model at `name_or_path` searches its own index: no `index` or `searcher` given, or `index` names the
    model directory or its `index/`. Over any other index (a user's documents) a calibration's `documents_threshold`
    applies ([`~realm_hf.evaluation.calibration.Calibration.threshold_for`])."""
    if searcher is not None:
        return False
    if index is None:
        return True
    own = Path(name_or_path) / INDEX_DIR
    try:
        given = index_directory(index)  # a model directory given as the index means its index/
    except (OSError, ValueError):  # no index at all: not the model's
        return False
    return own.is_dir() and own.resolve() == given.resolve()


def check_searcher_fits(model: RealmForOpenQA | RealmConfig, searcher, source: str = "the index") -> None:
    """Raises `IndexMismatchError` (a `ValueError`) unless `searcher` holds embeddings of the model's retriever size
    (`model`: the model, or its config where no weights are loaded, as `realm-hf push` checks an index): the index was
    built with another model's embedder, and the message says so rather than blaming the model."""
    from .errors import IndexMismatchError

    config = model if isinstance(model, RealmConfig) else model.config
    dim = getattr(searcher, "dim", None)
    if dim is not None and dim != config.retriever_proj_size:
        raise IndexMismatchError(
            f"{source} holds {dim}-d block embeddings but the model's embedder makes "
            f"{config.retriever_proj_size}-d ones (config.retriever_proj_size): build the index with this "
            "model's embedder (realm-hf index build --model ...)."
        )


def fit_beam_sizes(model: RealmForOpenQA) -> None:
    """Caps `config.reader_beam_size` / `searcher_beam_size` at the blocks the model can retrieve (logged at info
    level: reading all of a small index is what its user wants): a corpus of 3 documents can still be asked over with
    a model trained to read 5 blocks."""
    num_blocks = model.num_searchable_blocks
    for name in ("reader_beam_size", "searcher_beam_size"):
        value = getattr(model.config, name)
        if 0 < num_blocks < value:
            logger.info(f"{name} {value} is more than the {num_blocks} blocks of the index: using {num_blocks}.")
            setattr(model.config, name, num_blocks)


def index_directory(index: str | os.PathLike, option: str = "--index / index=") -> Path:
    """The searcher directory that `index` (`--index`, `index=`) names: an index or faiss searcher directory, or a
    model directory holding one in `index/`. Errors name it as `option` (the command line passes "--index").

    Raises:
        MissingFileError: `index` does not exist.
        FileFormatError: it holds no index (a `ValueError` too).
    """
    from .errors import FileFormatError, missing_index_error
    from .retrieval import is_searcher_directory

    index_dir = Path(index)
    if is_searcher_directory(index_dir):
        return index_dir
    if is_searcher_directory(index_dir / INDEX_DIR):  # a model directory with an index/ was given as the index
        return index_dir / INDEX_DIR
    if not index_dir.exists():
        raise missing_index_error(option, index_dir)
    if index_dir.is_file():
        if index_dir.name == INDEX_MANIFEST:
            raise FileFormatError(f"{option} {str(index_dir)!r} is a file; expected the index directory "
                                  f"(`realm-hf index build --output`), here {str(index_dir.parent)!r}",
                                  path=index_dir)  # fmt: skip
        raise FileFormatError(f"{option} {str(index_dir)!r} is a file; expected an index directory. If it holds your "
                              "documents, build an index from it first: realm-hf index build --corpus "
                              f"{index_dir} --output my-index, then {option} my-index", path=index_dir)  # fmt: skip
    from .retrieval.index_builder import BUILD_SETTINGS_NAME

    if (index_dir / BUILD_SETTINGS_NAME).is_file() or (index_dir / DOCUMENTS_DIR).is_dir():
        raise FileFormatError(f"{option} {str(index_dir)!r} is an unfinished `realm-hf index build` (it has "
                              f"no {INDEX_MANIFEST} yet): run the same build command again, and it resumes where it "
                              "stopped", path=index_dir)  # fmt: skip
    from .retrieval.document_import import FILE_FORMATS
    from .retrieval.passages import TEXT_SUFFIXES

    # what `realm-hf index build --corpus` reads: a folder of them given as the index is the documents themselves
    # (not .json: a model's or a document store's folder holds config files)
    suffixes = {*TEXT_SUFFIXES, *FILE_FORMATS} - {".json"}
    documents = sorted(path.name for path in index_dir.iterdir() if path.suffix.lower() in suffixes)
    if documents:  # the folder of documents itself, not the index built over it
        shown = ", ".join(documents[:3]) + (", ..." if len(documents) > 3 else "")
        raise FileFormatError(f"{option} {str(index_dir)!r} holds documents ({shown}), not an index; expected an "
                              "index directory holding index.json. Build one over them first: realm-hf index build "
                              f"--corpus {index_dir} --output my-index, then {option} my-index", path=index_dir)  # fmt: skip
    raise FileFormatError(f"{option} expects an index directory holding {INDEX_MANIFEST} (as `realm-hf "
                          f"index build` writes it); {index_dir} has none.", path=index_dir)  # fmt: skip


def check_index(index: str | os.PathLike, option: str = "--index / index=") -> Path:
    """[`index_directory`] of `index`, with its parts checked against each other, reading headers only: the manifest
    (`index.json`), every shard it lists, and `documents/` (one document per block; required of an index `realm-hf
    index build` wrote, which keeps its corpus there). Returns the directory.

    Raises:
        MissingFileError, FileFormatError: as [`index_directory`].
        FileFormatError: a part is missing or damaged; the message names the index as `option` and the part.
    """
    from .errors import FileFormatError
    from .retrieval.index_builder import verify_index

    index_dir = index_directory(index, option)
    if not (index_dir / INDEX_MANIFEST).is_file():
        return index_dir  # a faiss searcher (`realm-hf index compress`), whose loader checks its own files
    try:
        _check_documents_kept(index_dir, verify_index(index_dir))
    except (OSError, ValueError) as error:
        detail = "; ".join(line.strip() for line in str(error).splitlines() if line.strip()).rstrip(".")
        raise FileFormatError(f"{option} {str(index)!r} is damaged: {detail}; expected the manifest, shards and "
                              "documents/ that `realm-hf index build` writes (build it again, with --overwrite)",
                              path=index_dir) from None  # fmt: skip
    return index_dir


def _check_documents_kept(index_dir: Path, manifest: dict) -> None:
    """Raises `FileFormatError` where the index `index_dir`, built by `realm-hf index build` (its manifest records the
    corpus), has lost its `documents/`: the texts its block ids stand for, which no other corpus can stand in for."""
    from .errors import FileFormatError

    provenance = manifest.get("provenance")
    built_from_a_corpus = isinstance(provenance, dict) and "corpus_fingerprint" in provenance
    if built_from_a_corpus and not (index_dir / DOCUMENTS_DIR).is_dir():
        raise FileFormatError(f"{index_dir / DOCUMENTS_DIR} is missing: the texts of the index's "
                              f"{manifest['num_blocks']} blocks, built from {provenance.get('corpus')!r}",
                              path=index_dir / DOCUMENTS_DIR)  # fmt: skip


def load_open_qa(
    name_or_path: str | os.PathLike | None = None,
    index: str | os.PathLike | None = None,
    *,
    searcher=None,
    retriever=None,
    dtype: torch.dtype | None = None,
    pretokenized: bool = True,
    **kwargs,
) -> tuple[RealmForOpenQA, Any]:
    r"""
    Loads a `RealmForOpenQA` with what it searches and reads: `(model, retriever)`, ready for `pipeline("open-qa")`.

    Args:
        name_or_path (`str` or `os.PathLike`, *optional*): a directory in any layout of docs/loading.md or a Hub repo
            id; defaults to the default model (`realm_hf.default_model.default_model_dir()`).
        index (`str` or `os.PathLike`, *optional*): an index directory to search (e.g. from `realm-hf index build`
            over your corpus, with any model whose embedder makes embeddings of the same size).
        searcher (*optional*): a ready searcher instead (`ExactSearcher`, `FaissSearcher`, ...).
        retriever (*optional*): a ready retriever (block texts + tokenizer) instead of the documents found.
        dtype (`torch.dtype`, *optional*): weights are cast to it. By default they keep the checkpoint's dtype (bf16
            for `realm-hf index compress`), except float16, which becomes float32 (the default model ships fp16
            weights; fp16 matrix products are slow on CPUs). With half-precision weights the question encoder still
            computes in fp32 ([`~realm_hf.precision.compute_in_float32`]); the reader computes in the weights' dtype.
        pretokenized (`bool`, defaults to `True`): see [`find_retrieval`].
        kwargs: Hub options (`revision`, `cache_dir`, `token`, `local_files_only`, `subfolder`).
    """
    if name_or_path is None:
        from .default_model import default_model_dir

        name_or_path = default_model_dir()
        if name_or_path is None:
            raise ValueError("no model given and the default model is not installed (models/realm-minilm-factbook, "
                             "or $REALM_HF_DEFAULT_MODEL): pass a model directory or Hub repo id.")  # fmt: skip
    hub_kwargs = _hub_kwargs(kwargs)
    retriever_given, searcher_given = retriever, searcher
    local = _local_directory(name_or_path, hub_kwargs)
    if local is None:
        _check_not_a_path(name_or_path)
        check_hub_model(str(name_or_path), hub_kwargs)
    else:
        _check_model_directory(name_or_path, local)
    if retriever is None:
        found = find_retrieval(name_or_path, index, searcher=searcher, pretokenized=pretokenized, **hub_kwargs)
        retriever, searcher = found.retriever, found.searcher
    elif index is not None and searcher is None:
        from .retrieval import open_searcher

        searcher = open_searcher(index)
    load_dtype = dtype if dtype is not None else "auto"
    if dtype is None and _stored_dtype(name_or_path, hub_kwargs) == "float16":
        load_dtype = torch.float32  # converted while loading: 0.4 s, where loading fp16 then .float() took 1.5 s
    model = RealmForOpenQA.from_pretrained(name_or_path, retriever=retriever, searcher=searcher, dtype=load_dtype,
                                           **hub_kwargs)  # fmt: skip
    if dtype is None and model.dtype == torch.float16:  # a config that names no dtype
        model = model.float()  # fp16 matrix products are many times slower than fp32 on CPUs
    if model.dtype in (torch.bfloat16, torch.float16):
        # The question embedding decides what is retrieved: fp32 arithmetic over the stored half-precision weights.
        compute_in_float32(model.embedder)
    if searcher is not None:
        check_searcher_fits(model, searcher, str(index) if index is not None else "the index")
    fit_beam_sizes(model)
    # which abstention threshold the open-qa pipeline applies: the model's own, or the one for a user's documents
    model.searches_own_index = retriever_given is None and is_own_index(name_or_path, index, searcher_given)
    return model.eval(), retriever


def _check_not_a_path(name_or_path) -> None:
    """A name that is no directory here must be a Hub repo id (`name` or `owner/name`): a file, or a path that does not
    exist, is named as such rather than by the Hub client's "Repo id must use alphanumeric chars"."""
    from .errors import ModelLoadError, missing_model_error

    value = str(name_or_path)
    if os.path.exists(value):
        raise ModelLoadError(f"model {value!r} is a file; expected a model directory or a Hub repo id")
    if (error := missing_model_error("model", value)) is not None:
        raise error


def _check_model_directory(name_or_path, directory: Path) -> None:
    """A local model directory holds a config.json; an index directory given as the model is named as one."""
    from .errors import ModelLoadError
    from .retrieval import is_searcher_directory

    if (directory / "config.json").is_file():
        return
    if is_searcher_directory(directory):
        raise ModelLoadError(f"model {str(name_or_path)!r} is an index, not a model: pass it as index= (and the "
                             "model that built it as the model, or none for the default model)")  # fmt: skip
    raise ModelLoadError(f"model {str(name_or_path)!r} holds no config.json: expected a model directory (written by "
                         "save_pretrained or `realm-hf train`) or a Hub repo id")  # fmt: skip


def _stored_dtype(name_or_path, hub_kwargs: dict) -> str | None:
    """The weights' dtype as the model's config.json names it (`"float16"`, ...), or `None` where it names none."""
    stored = getattr(RealmConfig.from_pretrained(name_or_path, **hub_kwargs), "dtype", None)
    return str(stored).removeprefix("torch.") if stored is not None else None


def save_open_qa(
    model: RealmForOpenQA, retriever, save_directory: str | os.PathLike, tokenizer=None, **kwargs
) -> None:
    """Writes a model with what it searches and reads so that [`load_open_qa`] (and `pipeline("open-qa")`) loads
    it back identically: the model (`kwargs` go to its `save_pretrained`), the tokenizer, the documents
    (`documents/` when they come from a `DocumentStore`, which keeps titles; else `block_records.safetensors`) and,
    when the model searches an index, that index under `index/` (with `searcher.json` for hybrid candidates)."""
    from .retrieval import ExactSearcher
    from .retrieval.block_records import save_block_records
    from .retrieval.retriever import BLOCK_RECORDS_NAME

    save_directory = Path(save_directory)
    model.save_pretrained(save_directory, **kwargs)
    records = retriever.block_records
    store = getattr(records, "store", None)
    if store is not None and getattr(records, "include_title", True):
        store.save(save_directory / DOCUMENTS_DIR)
    else:
        save_block_records(records, save_directory / BLOCK_RECORDS_NAME)
    if model.searcher is not None:
        from .retrieval.hybrid import HybridSearcher, save_searcher_settings

        # A hybrid searcher is saved as its dense index plus searcher.json; BM25 is rebuilt from the documents.
        dense = model.searcher.dense if isinstance(model.searcher, HybridSearcher) else model.searcher
        if not isinstance(dense, ExactSearcher):
            raise TypeError(
                f"the model searches a {type(dense).__name__}, which save_pretrained cannot write as an "
                f"{INDEX_DIR}/: save it yourself (searcher.save(dir)) and load with index= / searcher=."
            )
        dense.save(save_directory / INDEX_DIR)
        save_searcher_settings(model.searcher, save_directory)
    (tokenizer if tokenizer is not None else retriever.tokenizer).save_pretrained(save_directory)


__all__ = [
    "OpenQARetrieval",
    "check_index",
    "check_searcher_fits",
    "find_block_records",
    "find_retrieval",
    "load_open_qa",
    "save_open_qa",
]

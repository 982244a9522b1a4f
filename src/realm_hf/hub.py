"""Uploads to the Hugging Face Hub with realm_hf's model card, each in one commit.

    push_to_hub("my-realm", "me/my-realm", index_dir="my-index")   # what `realm-hf push DIR REPO_ID` runs
    model.push_to_hub("me/my-realm")                                # RealmPreTrainedModel.push_to_hub comes here

`push_to_hub` uploads a saved directory: model (config and weights), tokenizer, retriever files (block records) and,
when given, a block-embedding index, plus a README.md that is generated from `model_card_template.md` unless the
directory has its own. `push_model_to_hub` is Transformers' `PreTrainedModel.push_to_hub` with our card in place of the
generic one Transformers writes. Nothing here runs at import time; the Hub endpoint is huggingface_hub's
(`HF_ENDPOINT`).
"""

import json
import os
import re
import tempfile
import warnings
from pathlib import Path

from huggingface_hub import CommitInfo, CommitOperationAdd, HfApi, ModelCard
from huggingface_hub.errors import EntryNotFoundError
from transformers.utils import logging

from .model_card import ARCHITECTURE_KINDS, make_model_card
from .retrieval.index_files import MANIFEST_NAME, read_manifest

logger = logging.get_logger(__name__)

CONFIG_NAME = "config.json"
README_NAME = "README.md"
WEIGHT_NAMES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_NAMES = ("tokenizer.json", "vocab.txt")
BLOCK_RECORDS_NAMES = ("block_records.safetensors", "block_records.npy")
INDEX_PATH_IN_REPO = "index"
DEFAULT_COMMIT_MESSAGE = "Upload REALM checkpoint with realm_hf"
# Files of an index directory that are not part of the index: the resumable builder's settings (present only while a
# build or an `index add` is unfinished).
_INDEX_BUILD_STATE = "build.json"
# The sentence of Transformers' generic card (transformers.utils.hub.create_and_tag_model_card): such a README was
# written by a plain Transformers push, and is replaced rather than kept.
_GENERIC_CARD_MARK = "This is the model card of a 🤗 transformers model that has been pushed on the Hub."


# What a training run leaves beside the model (`realm-hf train --output-dir`): its resumable checkpoints and the
# Trainer's state, pickled. None of it is the model, and a fine-tune's checkpoints weigh gigabytes.
_TRAINING_LEFTOVERS = re.compile(
    r"checkpoint-\d+|optimizer\.pt|scheduler\.pt|rng_state(_\d+)?\.pth|training_args\.bin"
)


def _visible_files(directory: Path) -> list[Path]:
    """Files under `directory`, sorted, skipping hidden files and folders (`.git`, `.cache`, temporary files) and a
    training run's checkpoints and Trainer state (logged)."""
    found, left_out = [], []
    for root, folders, files in os.walk(directory):
        top = Path(root) == directory
        left_out += [name for name in folders + files if top and _TRAINING_LEFTOVERS.fullmatch(name)]
        folders[:] = sorted(folder for folder in folders if not folder.startswith(".") and folder != "__pycache__"
                            and not (top and _TRAINING_LEFTOVERS.fullmatch(folder)))  # fmt: skip
        found.extend(Path(root) / name for name in sorted(files)
                     if not name.startswith(".") and not (top and _TRAINING_LEFTOVERS.fullmatch(name)))  # fmt: skip
    if left_out:
        logger.info(f"Not uploading what training left in {directory}: {', '.join(sorted(left_out))}")
    return found


def _checkpoint_kind(config: dict) -> str:
    architecture = (config.get("architectures") or ["RealmEmbedder"])[0]
    return ARCHITECTURE_KINDS.get(architecture, "embedder")


def check_checkpoint_dir(directory: str | os.PathLike) -> dict:
    """Checks that `directory` holds a saved REALM checkpoint; returns its `config.json`.

    Required: `config.json` of model_type "realm", the weights (`model.safetensors`, `pytorch_model.bin` or a sharded
    index with all its shards) and the tokenizer (`tokenizer.json` or `vocab.txt`). Block records are optional.
    Raises `FileNotFoundError` / `ValueError` naming everything that is missing.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory: give the folder a model was saved to.")
    if (directory / MANIFEST_NAME).is_file() and not (directory / CONFIG_NAME).is_file():
        raise ValueError(f"{directory} is an index, not a model: push the model directory and add the index with "
                         f"--index {directory} (Python: index_dir=)")  # fmt: skip
    missing = []
    config = None
    if not (directory / CONFIG_NAME).is_file():
        missing.append(f"{CONFIG_NAME} (the model configuration)")
    else:
        try:
            config = json.loads((directory / CONFIG_NAME).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{directory / CONFIG_NAME} is not valid JSON: {error}") from error
        if config.get("model_type") != "realm":
            raise ValueError(
                f"{directory / CONFIG_NAME} has model_type {config.get('model_type')!r}, expected 'realm': "
                "`realm-hf push` uploads REALM checkpoints."
            )
    weights = [name for name in WEIGHT_NAMES if (directory / name).is_file()]
    if not weights:
        missing.append(f"model weights (one of {', '.join(WEIGHT_NAMES)})")
    for name in weights:
        if name.endswith(".index.json"):
            weight_map = json.loads((directory / name).read_text(encoding="utf-8")).get("weight_map", {})
            absent = sorted({shard for shard in weight_map.values() if not (directory / shard).is_file()})
            missing.extend(f"{shard} (a weights shard listed in {name})" for shard in absent)
    if not any((directory / name).is_file() for name in TOKENIZER_NAMES):
        missing.append(
            f"tokenizer files ({' or '.join(TOKENIZER_NAMES)}; save the tokenizer or the retriever to the "
            "same directory)"
        )
    if missing:
        raise FileNotFoundError(
            f"{directory} is not a complete REALM checkpoint; missing: " + "; ".join(missing) + "."
        )
    return config


def _index_files(index_dir: Path) -> list[Path]:
    """The files of a complete index directory: manifest, shards and documents/ (if any), checked to exist."""
    if not index_dir.is_dir():
        raise FileNotFoundError(f"--index {index_dir}: no such directory (expected an index directory written by "
                                "`realm-hf index build`)")  # fmt: skip
    manifest = read_manifest(index_dir)
    if (index_dir / _INDEX_BUILD_STATE).is_file():
        raise ValueError(
            f"{index_dir} holds an unfinished build or `index add` ({_INDEX_BUILD_STATE}); finish it first."
        )
    shards = [index_dir / shard["file"] for shard in manifest["shards"]]
    absent = [shard.name for shard in shards if not shard.is_file()]
    if absent:
        raise FileNotFoundError(
            f"{index_dir} is incomplete: shard file(s) {', '.join(absent)} listed in {MANIFEST_NAME} are missing."
        )
    documents = _visible_files(index_dir / "documents") if (index_dir / "documents").is_dir() else []
    return [index_dir / MANIFEST_NAME, *shards, *documents]


def check_index_dir(index_dir: str | os.PathLike, directory: str | os.PathLike, *, option: str = "index_dir=") -> Path:
    """Checks, before anything is sent, that the index `index_dir` can go up beside the checkpoint in `directory` and
    be searched there; returns the index directory (`index_dir`, or the `index/` of a model directory given as it).

    Reading headers only, as `realm-hf serve|ask --index` do (`realm_hf.loading.check_index`): the manifest, every
    shard and `documents/` (one document per block); then that the build is finished, that the embeddings have the
    model's `config.retriever_proj_size` dimensions, and, for an index without `documents/`, that it holds one block
    per document of the checkpoint (its `documents/`, `corpus.json` or block records: what the uploaded index is read
    with). Errors name the index as `option` ("--index" on the command line).

    Raises:
        MissingFileError: `index_dir` does not exist.
        FileFormatError: it holds no index, an unfinished one or a damaged one.
        IndexMismatchError: its block count is not the checkpoint's document count.
        ValueError: its embedding dimension is not the model's.
    """
    from .errors import FileFormatError, IndexMismatchError
    from .loading import DOCUMENTS_DIR, check_index, check_searcher_fits, find_block_records, index_directory
    from .modeling import RealmConfig
    from .retrieval import open_searcher

    shown = f"{option} {str(index_dir)!r}"
    found = index_directory(index_dir, option)  # missing, a file, not an index, an unfinished first build
    if (found / MANIFEST_NAME).is_file() and (found / _INDEX_BUILD_STATE).is_file():
        raise FileFormatError(f"{shown} holds an unfinished build or `index add` ({_INDEX_BUILD_STATE} is still "
                              "there); expected a finished index: run the same command again to finish it",
                              path=found)  # fmt: skip
    check_index(index_dir, option)  # manifest, shards and documents/ agree
    if not (found / MANIFEST_NAME).is_file():
        raise FileFormatError(f"{shown} is a faiss searcher (`realm-hf index compress`, no {MANIFEST_NAME}); expected "
                              f"an index directory with {MANIFEST_NAME} and its shards (`realm-hf index build`)",
                              path=found)  # fmt: skip
    searcher = open_searcher(found)  # memory-mapped: nothing is read but headers
    check_searcher_fits(RealmConfig.from_pretrained(directory), searcher, shown)
    if not (found / DOCUMENTS_DIR).is_dir():  # the uploaded index is read with the checkpoint's documents
        try:
            records, source = find_block_records(directory, Path(directory))
        except ValueError:
            logger.warning(f"{shown} has no {DOCUMENTS_DIR}/ and {directory} holds no documents either: the uploaded "
                           "index cannot be searched for answers until the repo gets them.")  # fmt: skip
            return found
        if len(records) != searcher.num_blocks:
            raise IndexMismatchError(f"{shown} holds {searcher.num_blocks} blocks and no {DOCUMENTS_DIR}/ of its "
                                     f"own, but the documents it would be read with, {source}, hold {len(records)}: "
                                     "expected an index built over these documents (block ids would point at the "
                                     "wrong text); build it with `realm-hf index build`, which keeps them in "
                                     f"{DOCUMENTS_DIR}/", path=found)  # fmt: skip
    return found


def _find_index(directory: Path) -> str | None:
    """Where in `directory` an index lives ("" for the directory itself, "index", ...), or None."""
    if (directory / MANIFEST_NAME).is_file():
        return ""
    candidates = sorted(
        path.parent for path in directory.glob(f"*/{MANIFEST_NAME}") if not path.parent.name.startswith(".")
    )
    return candidates[0].name if candidates else None


def push_to_hub(
    directory: str | os.PathLike,
    repo_id: str,
    *,
    index_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    base_model: str | None = None,
    license: str | None = None,
    index_option: str = "index_dir=",
) -> CommitInfo:
    r"""
    Uploads a saved REALM checkpoint directory to the Hub in one commit, creating the repo if needed.

    Everything in `directory` is uploaded (model, tokenizer, block records, an index it holds; hidden files skipped),
    plus the block-embedding index `index_dir` under `index/`. The README.md is the directory's own when it has one,
    otherwise a card generated from realm_hf's template for the checkpoint's architecture.

    Args:
        directory (`str` or `os.PathLike`): what `save_pretrained` wrote (model, plus the tokenizer or the retriever).
        repo_id (`str`): "namespace/name" (or "name" for your own namespace).
        index_dir (`str` or `os.PathLike`, *optional*): an index directory made by `realm-hf index build` (index.json,
            shards, documents/), uploaded to `index/` in the repo.
        token (`str` or `bool`, *optional*): Hub token; default: the saved login or `HF_TOKEN`.
        private (`bool`, *optional*): visibility of a new repo (ignored when the repo exists); default: the Hub's.
        revision (`str`, *optional*): the branch to commit to (created if missing); default: main.
        commit_message (`str`): the commit's title.
        base_model, license (`str`, *optional*): metadata for a generated card.
        index_option (`str`, defaults to `"index_dir="`): how errors about `index_dir` name it (the command line
            passes "--index").

    Returns:
        `huggingface_hub.CommitInfo` of the commit (`.oid`, `.commit_url`).
    """
    directory = Path(directory)
    config = check_checkpoint_dir(directory)
    files = _visible_files(directory)
    operations = [
        CommitOperationAdd(path_in_repo=path.relative_to(directory).as_posix(), path_or_fileobj=str(path))
        for path in files
    ]

    index_path = _find_index(directory)
    if index_path is not None:
        _index_files(directory / index_path)  # validates the index the directory holds
    if index_dir is not None:
        if index_path is not None or (directory / INDEX_PATH_IN_REPO).exists():
            raise ValueError(
                f"{directory} already holds an index (or an {INDEX_PATH_IN_REPO}/ folder); remove it or drop --index."
            )
        # checked before anything is sent: complete, finished, of the model's dimension and its documents' count
        index_dir = check_index_dir(index_dir, directory, option=index_option)
        operations += [
            CommitOperationAdd(
                path_in_repo=f"{INDEX_PATH_IN_REPO}/{path.relative_to(index_dir).as_posix()}",
                path_or_fileobj=str(path),
            )
            for path in _index_files(index_dir)
        ]
        index_path = INDEX_PATH_IN_REPO

    kind = _checkpoint_kind(config)
    if kind == "openqa" and index_path is None and not any((directory / n).is_file() for n in BLOCK_RECORDS_NAMES):
        logger.warning(
            f"{directory} has no block records ({' or '.join(BLOCK_RECORDS_NAMES)}): the uploaded model "
            "cannot answer questions until the repo gets them (save the retriever to the directory)."
        )

    api = HfApi()
    repo_id = api.create_repo(repo_id, token=token, private=private, exist_ok=True).repo_id
    if not (directory / README_NAME).is_file():
        card = make_model_card(kind, repo_id=repo_id, base_model=base_model, license=license, index_path=index_path)
        operations.append(CommitOperationAdd(path_in_repo=README_NAME, path_or_fileobj=str(card).encode("utf-8")))
    if revision is not None:
        api.create_branch(repo_id, branch=revision, token=token, exist_ok=True)
    with warnings.catch_warnings():
        # An index's documents/ holds Arrow files, which huggingface_hub flags in a model repo; here they belong.
        warnings.filterwarnings("ignore", message="It seems that you are about to commit a data file")
        return api.create_commit(
            repo_id, operations=operations, commit_message=commit_message, token=token, revision=revision
        )


def _hub_base_model(model, repo_id: str) -> str | None:
    """The Hub repo a model was loaded from, if it was loaded from one (and is not `repo_id` itself)."""
    name = getattr(model.config, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
    if not name or name == repo_id or os.path.exists(name) or not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        return None
    return name


def _card_for_push(model, repo_id: str, token) -> ModelCard:
    """The card on the Hub when the repo has one (unless it is Transformers' generic card), else ours."""
    try:
        card = ModelCard.load(repo_id, token=token)
        if _GENERIC_CARD_MARK not in card.text:
            return card
    except EntryNotFoundError:
        pass
    kind = ARCHITECTURE_KINDS.get(type(model).__name__, "embedder")
    return make_model_card(kind, repo_id=repo_id, base_model=_hub_base_model(model, repo_id))


def push_model_to_hub(
    model,
    repo_id: str,
    *,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: str | bool | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    max_shard_size: int | str | None = "50GB",
    tags: list[str] | str | None = None,
    model_card: ModelCard | None = None,
) -> CommitInfo:
    r"""
    `PreTrainedModel.push_to_hub` with realm_hf's model card: saves `model` and uploads it with a README.md in one
    commit. The README is `model_card` if given, else the repo's existing card (Transformers' generic card excepted),
    else one generated for the model's class, with `library_name: realm_hf`. `tags` (and the model's `model_tags`) are
    added to its tags.

    Arguments are those of Transformers' `push_to_hub`, plus `model_card`. A `RealmForOpenQA`'s retriever (block
    records) is not part of the model: save it to a directory with the model and use `push_to_hub(directory, ...)`.

    Returns:
        `huggingface_hub.CommitInfo`.
    """
    api = HfApi()
    repo_id = api.create_repo(repo_id, private=private, token=token, exist_ok=True).repo_id
    card = model_card if model_card is not None else _card_for_push(model, repo_id, token)
    extra_tags = [tags] if isinstance(tags, str) else list(tags or [])
    for tag in [*(getattr(model, "model_tags", None) or []), *extra_tags]:
        card.data.tags = card.data.tags or []
        if tag not in card.data.tags:
            card.data.tags.append(tag)
    if revision is not None and not revision.startswith("refs/pr"):
        api.create_branch(repo_id, branch=revision, token=token, exist_ok=True)
    with tempfile.TemporaryDirectory() as work_dir:
        model.save_pretrained(work_dir, max_shard_size=max_shard_size)
        card.save(os.path.join(work_dir, README_NAME))
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=work_dir,
            commit_message=commit_message or "Upload model",
            commit_description=commit_description,
            token=token,
            revision=revision,
            create_pr=create_pr,
        )


__all__ = [
    "DEFAULT_COMMIT_MESSAGE",
    "INDEX_PATH_IN_REPO",
    "check_checkpoint_dir",
    "check_index_dir",
    "push_model_to_hub",
    "push_to_hub",
]

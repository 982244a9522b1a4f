"""A sparse BM25 baseline over a corpus (the `bm25s` library), returning the same `SearchResult` as the dense searchers.

It searches by question text, not by embedding, so it is not a [`Searcher`]: use it to compare REALM's retrieval
with a lexical one on the same block ids (`recall_at_k`, the evaluation scripts), or beside a dense index in a
`HybridSearcher`.

An index over a `DocumentStore` can be kept on disk (`from_documents(store, cache_dir=...)`): it is saved under a key
of the store's fingerprint and the BM25 settings, by `bm25s` as numpy arrays and JSON (no pickle), written whole or not
at all, and loaded instead of rebuilt when the same documents come again (0.2 s instead of 3.5 s for the default
model's 43,829 blocks).

    pip install bm25s
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers.utils import logging

from .interfaces import SearchResult

if TYPE_CHECKING:
    from .document_store import DocumentStore

logger = logging.get_logger(__name__)

__all__ = ["BM25Searcher"]

# scikit-learn's pattern keeps words of two or more characters; one-character tokens matter here ("atomic number 8").
TOKEN_PATTERN = r"(?u)\b\w+\b"


def _import_bm25s():
    """Imports `bm25s` without letting it start JAX.

    Where JAX is installed, `bm25s` runs a JAX top-k when it is imported; on a GPU machine JAX then takes 75% of the
    GPU's memory in every process that builds a BM25 index (seen on an H100: eight test processes ran out of memory,
    and torch in the same process is left a quarter of the card). Unless the program imported JAX itself, `bm25s` is
    imported with JAX hidden and takes its numpy path, which is what it does wherever JAX is not installed.
    """
    hide_jax = "jax" not in sys.modules
    if hide_jax:
        sys.modules["jax"] = None  # `import jax.lax` now raises ImportError, which bm25s catches
    try:
        import bm25s
    except ImportError as error:
        raise ImportError("BM25Searcher needs `bm25s`; install it with `pip install bm25s`") from error
    finally:
        if hide_jax and "jax" in sys.modules and sys.modules["jax"] is None:
            del sys.modules["jax"]
    return bm25s


class BM25Searcher:
    r"""
    BM25 (Lucene variant, as `bm25s` computes it) over the block texts of a corpus, with block ids `0 .. num_blocks - 1`
    in corpus order.

    Text is lower-cased, split into `\w+` tokens, stripped of `bm25s`'s English stop words and optionally stemmed; the
    same for blocks and questions. Results follow [`SearchResult`]: scores descending, and among equal scores the
    lower id first, so that a search is deterministic (blocks sharing no word with the question all score 0).

    Build it with [`BM25Searcher.from_documents`].

    Example:

    ```python
    >>> searcher = BM25Searcher.from_documents(["Paris is the capital of France.", "Berlin is in Germany."])
    >>> searcher.search_text(["What is the capital of France?"], k=1).ids
    tensor([[0]])
    ```
    """

    def __init__(self, retriever: Any, num_blocks: int, stemmer: Callable | None = None):
        self.retriever = retriever
        self.stemmer = stemmer
        self._num_blocks = num_blocks

    @classmethod
    def from_documents(
        cls,
        documents: DocumentStore | Sequence[str],
        include_title: bool = True,
        k1: float = 1.5,
        b: float = 0.75,
        stemmer: Callable | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> BM25Searcher:
        """Index every document of a store, or a list of block texts.

        Args:
            documents (`DocumentStore` or sequence of `str`):
                The corpus; block id `i` is document `i`.
            include_title (`bool`, *optional*, defaults to `True`):
                For a store, index `"title: text"` (what REALM reads, see `block_text`) rather than the text alone.
                Ignored for a list of strings.
            k1 (`float`, *optional*, defaults to 1.5):
                BM25 term-frequency saturation.
            b (`float`, *optional*, defaults to 0.75):
                BM25 document-length normalization.
            stemmer (`Callable`, *optional*):
                Applied to tokens as `bm25s.tokenize` does: an object with `stemWords` (PyStemmer) or a callable
                taking and returning a list of words. No stemming by default.
            cache_dir (`str` or `os.PathLike`, *optional*):
                Keep the index of a `DocumentStore` here, under a key of its fingerprint and these settings, and load
                it from there the next time. Not used for a list of texts or with a stemmer (neither has a key).

        Returns:
            `BM25Searcher`: the searcher.
        """
        bm25s = _import_bm25s()
        if isinstance(documents, str):
            raise TypeError("documents must be a DocumentStore or a sequence of block texts, received one str")
        fingerprint = getattr(documents, "fingerprint", None)
        if cache_dir is not None and stemmer is None and callable(fingerprint):
            settings = {"fingerprint": fingerprint(), "blocks": len(documents), "include_title": include_title,
                        "k1": k1, "b": b, "token_pattern": TOKEN_PATTERN, "stopwords": "en",
                        "bm25s": getattr(bm25s, "__version__", "unknown")}  # fmt: skip
            return cls._cached(documents, settings, Path(cache_dir), bm25s)
        if hasattr(documents, "block_texts"):
            ids = list(range(len(documents)))
            texts = documents.block_texts(ids) if include_title else documents.texts(ids)
        else:
            texts = list(documents)
            if not all(isinstance(text, str) for text in texts):
                raise TypeError("documents: expected a DocumentStore or a sequence of str")
        if not texts:
            raise ValueError("documents: expected at least one document, received none")
        tokens = cls._tokenize(bm25s, texts, stemmer, return_ids=True)
        retriever = bm25s.BM25(k1=k1, b=b)
        retriever.index(tokens, show_progress=False)
        logger.info(f"Indexed {len(texts)} blocks for BM25 ({len(tokens.vocab)} distinct tokens)")
        return cls(retriever, num_blocks=len(texts), stemmer=stemmer)

    @classmethod
    def _cached(cls, store, settings: dict, cache_dir: Path, bm25s) -> BM25Searcher:
        from ..home import kept

        key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()[:32]

        def read(directory: Path) -> BM25Searcher:
            if not (directory / "settings.json").is_file():  # written last: an entry without it is not whole
                raise FileNotFoundError(f"no settings.json in {directory}")
            retriever = bm25s.BM25.load(str(directory), mmap=False, allow_pickle=False)
            logger.info(f"Loaded the BM25 index of {settings['blocks']} blocks from {directory}")
            return cls(retriever, num_blocks=settings["blocks"])

        def build() -> BM25Searcher:
            return cls.from_documents(store, include_title=settings["include_title"], k1=settings["k1"],
                                      b=settings["b"])  # fmt: skip

        def write(searcher: BM25Searcher, directory: Path) -> None:
            temporary = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=directory.parent))
            try:
                searcher.retriever.save(str(temporary), allow_pickle=False)
                (temporary / "settings.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
                if directory.exists():
                    shutil.rmtree(directory)
                os.replace(temporary, directory)  # the entry appears whole or not at all
            finally:
                shutil.rmtree(temporary, ignore_errors=True)

        return kept(cache_dir / key, read, build, write, "the BM25 index")

    @staticmethod
    def _tokenize(bm25s, texts: list[str], stemmer: Callable | None, return_ids: bool):
        return bm25s.tokenize(
            texts,
            lower=True,
            token_pattern=TOKEN_PATTERN,
            stopwords="en",
            stemmer=stemmer,
            return_ids=return_ids,
            show_progress=False,
        )

    @property
    def num_blocks(self) -> int:
        """`int`: the number of indexed blocks."""
        return self._num_blocks

    def search_text(self, questions: Sequence[str], k: int) -> SearchResult:
        """The `k` best blocks for each question.

        Args:
            questions (sequence of `str`):
                The questions (at least one).
            k (`int`):
                Blocks per question, `1 <= k <= num_blocks`.

        Returns:
            [`SearchResult`]: `scores` (`torch.FloatTensor` of shape `(num_questions, k)`, BM25 scores, descending) and
            `ids` (`torch.LongTensor` of shape `(num_questions, k)`).
        """
        if isinstance(questions, str):
            raise TypeError("questions must be a sequence of str, received one str; wrap it in a list")
        questions = list(questions)
        if not questions:
            raise ValueError("questions: expected at least one question, received an empty sequence")
        if not 1 <= k <= self.num_blocks:
            raise ValueError(f"k must be between 1 and num_blocks={self.num_blocks}, received {k}")
        bm25s = _import_bm25s()
        tokens = self._tokenize(bm25s, questions, self.stemmer, return_ids=False)
        scores = np.empty((len(questions), k), dtype=np.float32)
        ids = np.empty((len(questions), k), dtype=np.int64)
        for row, query in enumerate(tokens):
            block_scores = np.asarray(
                self.retriever.get_scores_from_ids(self.retriever.get_tokens_ids(query)), dtype=np.float32
            )
            ids[row] = _top_k(block_scores, k)
            scores[row] = block_scores[ids[row]]
        return SearchResult(scores=torch.from_numpy(scores), ids=torch.from_numpy(ids))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_blocks={self.num_blocks})"


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Ids of the `k` highest scores, descending, lower id first among ties (argpartition alone is not stable)."""
    threshold = np.partition(scores, len(scores) - k)[len(scores) - k]
    candidates = np.flatnonzero(scores >= threshold)
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order[:k]]

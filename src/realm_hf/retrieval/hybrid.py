"""Hybrid candidates: BM25 and dense candidates in one union, scored by the model's own relevance.

A [`HybridSearcher`] wraps a dense [`Searcher`] and a [`BM25Searcher`]. For `k` blocks it keeps the best
`k - num_bm25` dense blocks and fills the rest with the best BM25 blocks not already in (then with further dense
blocks if BM25 runs short), and scores every candidate by the model's relevance, the inner product of the question
embedding with the block embedding from the dense index, as an exact search would have scored it. So REALM's
marginalisation over the blocks read is unchanged: only which blocks are read changes, and BM25 can bring in a block
the dense retriever ranks too low (numbers, rare names), while the reader still weighs it by the model's own score.
With `bm25_weight` above 0 (off by default) the relevance also carries BM25's normalised score, and `RealmForOpenQA`
adds that term to its retrieval logits ([`HybridSearcher.search_with_bias`]).

It implements the [`Searcher`] interface (`search(query_embeddings, k)`, `embeddings(ids)`, `num_blocks`, `dim`), so
any `RealmForOpenQA` can use it (`model.searcher = HybridSearcher(model.searcher, bm25)`). BM25 needs the question
text, which an embedding does not carry: the caller names the questions of the next searches with the
[`HybridSearcher.query_texts`] context manager (the "open-qa" pipeline does this by itself, from the question
wordpieces). A search without texts raises a clear error rather than silently searching dense only.

A model directory may say which candidates it reads by default in `searcher.json` (`{"searcher": "hybrid",
"bm25_fraction": 0.4, "bm25_weight": 0.0}`; [`save_searcher_settings`]): the one loader then wraps the model's own index in a
`HybridSearcher`, with BM25 built over its documents at load (about a second for 50k blocks), and `save_open_qa` writes
the file back for a model that searches hybrid candidates.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from transformers.utils import logging

from .block_records import iter_record_texts
from .interfaces import Searcher, SearchResult, as_query_matrix

logger = logging.get_logger(__name__)

__all__ = [
    "SEARCHER_FILE",
    "HybridSearcher",
    "bm25_for_records",
    "hybrid_searcher_for",
    "load_searcher_settings",
    "save_searcher_settings",
    "searching_for",
    "with_searcher_settings",
]

SEARCHER_FILE = "searcher.json"
SEARCHER_KINDS = ("dense", "hybrid")


class HybridSearcher:
    r"""
    The union of dense and BM25 candidates, scored by question . block inner products from the dense index.

    Args:
        dense ([`Searcher`]): the model's searcher over its block embeddings (e.g. `ExactSearcher.from_index`).
        bm25 ([`BM25Searcher`] or any object with `search_text(questions, k) -> SearchResult` and `num_blocks`): over the
            same blocks, same ids.
        bm25_fraction (`float`, *optional*, defaults to 0.4): share of the `k` slots given to BM25 candidates,
            `round(k * bm25_fraction)` (so a single block is the dense one for fractions below 0.5); 0 is the dense
            searcher alone, 1 BM25's candidates alone (still scored by the model).
        bm25_weight (`float`, *optional*, defaults to 0): adds `bm25_weight * s / s_max` to a candidate's relevance
            logit, where `s` is its BM25 score for the question and `s_max` the question's best BM25 score (0 for a
            candidate outside BM25's top `k`). 0 leaves the model's relevance alone; with a weight, a block that BM25
            finds but the dense retriever ranks low is both read and weighed up in REALM's marginal over the blocks
            read. `RealmForOpenQA` adds the same term to its retrieval logits ([`search_with_bias`]).
        num_read (`int`, *optional*): for training as the model is served. `RealmForOpenQA` in training retrieves
            `searcher_beam_size` blocks (e.g. 5000, for the retriever's loss) and reads the first `reader_beam_size`
            (e.g. 5). With `num_read` set and `k > num_read`, the BM25 share is taken of the first `num_read` blocks
            (the union the model reads when it serves with `k = num_read`), which come first, best first, followed by
            the next best dense blocks, best first. Unset (or `k <= num_read`), the BM25 share is of all `k`.

    Example:

    ```python
    >>> hybrid = HybridSearcher(ExactSearcher.from_index("index"), BM25Searcher.from_documents(store))
    >>> with hybrid.query_texts(["what is the atomic number of argon?"]):
    ...     scores, ids = hybrid.search(question_embeddings, k=5)  # 3 dense + 2 BM25 candidates, by q . block
    ```
    """

    def __init__(self, dense: Searcher, bm25, bm25_fraction: float = 0.4, bm25_weight: float = 0.0,
                 num_read: int | None = None):  # fmt: skip
        if num_read is not None and (isinstance(num_read, bool) or not isinstance(num_read, int) or num_read < 1):
            raise ValueError(f"num_read must be a positive number of blocks or None, received {num_read!r}")
        if not 0.0 <= bm25_fraction <= 1.0:
            raise ValueError(f"bm25_fraction must lie in [0, 1], received {bm25_fraction}")
        if not (np.isfinite(bm25_weight) and bm25_weight >= 0.0):
            raise ValueError(f"bm25_weight must be a finite number >= 0, received {bm25_weight}")
        if not hasattr(bm25, "search_text"):
            raise TypeError(f"bm25 must search by text (search_text(questions, k)), received {type(bm25).__name__}")
        if bm25.num_blocks != dense.num_blocks:
            raise ValueError(
                f"the BM25 index holds {bm25.num_blocks} blocks but the dense one {dense.num_blocks}: they must index "
                "the same blocks with the same ids"
            )
        self.dense = dense
        self.bm25 = bm25
        self.bm25_fraction = float(bm25_fraction)
        self.bm25_weight = float(bm25_weight)
        self.num_read = num_read
        self.dim = dense.dim
        self._texts: list[str] | None = None

    @property
    def num_blocks(self) -> int:
        return self.dense.num_blocks

    @contextlib.contextmanager
    def query_texts(self, texts: Sequence[str]) -> Iterator[HybridSearcher]:
        """The question texts of the searches made inside the block, one per query row, in order."""
        if isinstance(texts, str):
            raise TypeError("query_texts expects a sequence of questions, received one str; wrap it in a list")
        previous, self._texts = self._texts, list(texts)
        try:
            yield self
        finally:
            self._texts = previous

    def num_bm25(self, k: int) -> int:
        """BM25 slots among `k`."""
        return min(k, round(k * self.bm25_fraction))

    def search(self, query_embeddings: torch.Tensor | np.ndarray, k: int) -> SearchResult:
        """The `k` candidates per query, best first by relevance: the inner product with the query, plus the BM25
        term where `bm25_weight` is set (see the class docstring).

        Raises:
            ValueError: no question texts were given ([`query_texts`]) or not one per query.
        """
        return self.search_with_bias(query_embeddings, k)[0]

    def search_with_bias(
        self, query_embeddings: torch.Tensor | np.ndarray, k: int
    ) -> tuple[SearchResult, torch.Tensor]:
        """[`search`] and the BM25 term of each candidate's score, `(num_queries, k)` float32 (zeros without a
        `bm25_weight`): the scores are `query . block + bias`. `RealmForOpenQA` adds the bias to the retrieval logits
        it recomputes from the block embeddings."""
        if k < 1:
            raise ValueError(f"k must be a positive number of blocks, got {k}.")
        queries = as_query_matrix(query_embeddings, self.dim).detach().float()
        available = min(k, self.num_blocks)
        # Training as served: the BM25 share is of the blocks read, and the rest of the k are dense.
        read = self.num_read if self.num_read is not None and self.num_read < available else available
        num_bm25 = self.num_bm25(read)
        if num_bm25 == 0 and self.bm25_weight == 0.0:  # the dense search alone (padded to k as it pads)
            result = self.dense.search(queries, k)
            return result, torch.zeros(tuple(result.ids.shape), dtype=torch.float32, device=result.ids.device)
        if self._texts is None or len(self._texts) != queries.shape[0]:
            received = "none" if self._texts is None else f"{len(self._texts)}"
            raise ValueError(
                f"HybridSearcher needs the question text of each of the {queries.shape[0]} queries for BM25, received "
                f"{received}: search inside `with searcher.query_texts(questions):`"
            )
        k = available
        dense_ids = torch.as_tensor(self.dense.search(queries, k).ids).cpu()
        # BM25's best `read` always hold `num_bm25` blocks outside the dense share (at most `read - num_bm25` overlap)
        found = self.bm25.search_text(self._texts, read)
        bm25_ids, bm25_scores = torch.as_tensor(found.ids).cpu(), torch.as_tensor(found.scores).float().cpu()
        ids = torch.empty((queries.shape[0], k), dtype=torch.long)
        bias = torch.zeros((queries.shape[0], k), dtype=torch.float32)
        for row in range(queries.shape[0]):
            dense_row = dense_ids[row].tolist()
            chosen = _union(dense_row, bm25_ids[row].tolist(), read, num_bm25)
            if read < k:
                taken = set(chosen)
                chosen += [block for block in dense_row if block >= 0 and block not in taken][: k - read]
            ids[row] = torch.tensor(chosen)
            if self.bm25_weight:
                bias[row] = _bm25_term(ids[row], bm25_ids[row], bm25_scores[row], self.bm25_weight)
        embeddings = torch.as_tensor(self.dense.embeddings(ids)).float().cpu()  # (Q, k, D)
        scores = torch.einsum("qd,qkd->qk", queries.cpu(), embeddings) + bias
        # Best first (the blocks read first, then the rest); among equal scores the lower id (the SearchResult
        # convention).
        group = torch.zeros_like(ids)
        group[:, read:] = 1
        order = torch.from_numpy(np.lexsort((ids.numpy(), -scores.numpy(), group.numpy()), axis=-1))
        return SearchResult(scores=scores.gather(1, order), ids=ids.gather(1, order)), bias.gather(1, order)

    def embeddings(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        return self.dense.embeddings(ids)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dense={self.dense!r}, bm25={self.bm25!r}, bm25_fraction={self.bm25_fraction}, "
            f"bm25_weight={self.bm25_weight}, num_read={self.num_read})"
        )


def _bm25_term(ids: torch.Tensor, bm25_ids: torch.Tensor, bm25_scores: torch.Tensor, weight: float) -> torch.Tensor:
    """`weight * s / s_max` for each of `ids` (0 where BM25 did not return it or found nothing)."""
    valid = (bm25_ids >= 0) & torch.isfinite(bm25_scores)
    best = float(bm25_scores[valid].max()) if bool(valid.any()) else 0.0
    if best <= 0.0:
        return torch.zeros(len(ids), dtype=torch.float32)
    score_of = {int(block): float(score) for block, score, ok in zip(bm25_ids, bm25_scores, valid) if ok}
    return torch.tensor([weight * max(score_of.get(int(block), 0.0), 0.0) / best for block in ids])


def _union(dense: list[int], bm25: list[int], k: int, num_bm25: int) -> list[int]:
    """The first `k - num_bm25` dense ids, then BM25 ids not yet taken (up to `num_bm25`), then further dense ids."""
    chosen = [block for block in dense[: k - num_bm25] if block >= 0]
    taken = set(chosen)
    added = 0
    for block in bm25:
        if added == num_bm25:
            break
        if block >= 0 and block not in taken:
            chosen.append(block)
            taken.add(block)
            added += 1
    for block in dense[k - num_bm25 :] + bm25:
        if len(chosen) == k:
            break
        if block >= 0 and block not in taken:
            chosen.append(block)
            taken.add(block)
    return chosen


def hybrid_searcher_for(model, bm25_fraction: float = 0.4, bm25=None, bm25_weight: float = 0.0,
                        num_read: int | None = None) -> HybridSearcher:  # fmt: skip
    """A [`HybridSearcher`] for a loaded `RealmForOpenQA`: its searcher (or its in-model `block_emb`) plus BM25 over
    its retriever's block texts (titles included, as the reader sees them). Set it with `model.searcher = ...`.

    Args:
        model: a `RealmForOpenQA` with a retriever.
        bm25_fraction (`float`, *optional*, defaults to 0.4): see [`HybridSearcher`].
        bm25 (*optional*): a ready BM25 searcher over the same blocks; built (seconds for 50k blocks) if not given.
        bm25_weight (`float`, *optional*, defaults to 0): see [`HybridSearcher`].
        num_read (`int`, *optional*): see [`HybridSearcher`]; `model.config.reader_beam_size` to train as served.
    """
    from .torch_search import ExactSearcher

    dense = model.searcher
    if isinstance(dense, HybridSearcher):
        dense = dense.dense
    if dense is None:
        block_emb = getattr(model, "block_emb", None)
        if block_emb is None or block_emb.numel() == 0:
            raise ValueError("the model has neither a searcher nor block embeddings to search")
        dense = ExactSearcher(block_emb.detach().float())
    if bm25 is None:
        bm25 = bm25_for_records(model.retriever.block_records)
    return HybridSearcher(dense, bm25, bm25_fraction=bm25_fraction, bm25_weight=bm25_weight, num_read=num_read)


def searching_for(searcher, tokenizer, input_ids: torch.Tensor):
    """The context in which `searcher` searches for the questions `input_ids` (`(B, L)` wordpieces): a searcher that
    needs the question texts (a [`HybridSearcher`]: BM25 reads them) is told them, decoded from the wordpieces; any
    other searcher (or `None`) needs nothing, and nothing is decoded."""
    if not hasattr(searcher, "query_texts"):
        return contextlib.nullcontext(searcher)
    return searcher.query_texts(tokenizer.batch_decode(input_ids, skip_special_tokens=True))


def bm25_for_records(records):
    """A `BM25Searcher` over block records: a document store's blocks (titles included, as the reader sees them),
    kept on disk under `$REALM_HF_HOME/bm25` by the store's fingerprint (built once, loaded after), or the records'
    texts."""
    from ..home import realm_hf_home
    from .bm25 import BM25Searcher

    store = getattr(records, "store", None)
    if store is not None and hasattr(store, "block_texts"):
        return BM25Searcher.from_documents(store, cache_dir=realm_hf_home() / "bm25")
    return BM25Searcher.from_documents(list(iter_record_texts(records)))


def save_searcher_settings(searcher, directory: str | os.PathLike) -> None:
    """Writes `searcher.json` into `directory` for a [`HybridSearcher`] (its kind, `bm25_fraction` and `bm25_weight`),
    and removes a stale one for any other searcher (dense is the default without the file)."""
    from ..atomic import atomic_path

    path = Path(directory) / SEARCHER_FILE
    if not isinstance(searcher, HybridSearcher):
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temporary:
        Path(temporary).write_text(
            json.dumps(
                {"searcher": "hybrid", "bm25_fraction": searcher.bm25_fraction, "bm25_weight": searcher.bm25_weight},
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )


def load_searcher_settings(directory: str | os.PathLike) -> dict | None:
    """The settings of `directory`'s `searcher.json` (`{"searcher": "dense" | "hybrid", "bm25_fraction": f,
    "bm25_weight": w}`; a file without `bm25_weight` reads as 0), or `None` without one.

    Raises:
        FileFormatError: the file is not such a JSON object (it names the file, what was expected and received).
    """
    from ..errors import FileFormatError

    path = Path(directory) / SEARCHER_FILE
    if not path.is_file():
        return None
    expected = (
        'expected {"searcher": "dense" or "hybrid", "bm25_fraction": a number in [0, 1], "bm25_weight": a number >= 0}'
    )
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FileFormatError(f"{path}: {expected}, received text that is not JSON ({error})") from error
    if not isinstance(settings, dict) or settings.get("searcher") not in SEARCHER_KINDS:
        raise FileFormatError(f"{path}: {expected}, received {settings!r:.100}")
    fraction = settings.get("bm25_fraction", 0.4)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise FileFormatError(f"{path}: {expected}, received bm25_fraction {fraction!r:.40}")
    weight = settings.get("bm25_weight", 0.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight < float("inf"):
        raise FileFormatError(f"{path}: {expected}, received bm25_weight {weight!r:.40}")
    return {"searcher": settings["searcher"], "bm25_fraction": float(fraction), "bm25_weight": float(weight)}


def with_searcher_settings(searcher, records, settings: dict | None):
    """`searcher` as `settings` (from [`load_searcher_settings`]) ask: wrapped in a [`HybridSearcher`] with BM25 over
    `records` for `{"searcher": "hybrid"}`, else unchanged."""
    if searcher is None or settings is None or settings["searcher"] != "hybrid":
        return searcher
    if isinstance(searcher, HybridSearcher):
        searcher = searcher.dense
    return HybridSearcher(
        searcher,
        bm25_for_records(records),
        bm25_fraction=settings["bm25_fraction"],
        bm25_weight=settings.get("bm25_weight", 0.0),
    )

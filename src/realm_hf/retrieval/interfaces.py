"""The small interfaces of retrieval: a maximum-inner-product `Searcher` in faiss's `(scores, ids)` order, a
`Retriever` that turns retrieved block ids into reader inputs, and the `TitledRecords` a pipeline shows titles from."""

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch


class SearchResult(NamedTuple):
    """Top-k results for a batch of queries, best first; unpacks like faiss's `D, I`.

    Attributes:
        scores (`torch.FloatTensor` of shape `(num_queries, k)`): inner products (or negative squared L2 distances for
            an L2 searcher), descending along the last dim; `-inf` where fewer than `k` blocks exist.
        ids (`torch.LongTensor` of shape `(num_queries, k)`): block ids; -1 where fewer than `k` blocks exist. Among
            equal scores the lower id comes first, so that exact searchers (sharded or not) agree id for id.
    """

    scores: torch.Tensor
    ids: torch.Tensor


@runtime_checkable
class Searcher(Protocol):
    """Maximum inner-product search over block embeddings with stable, consecutive ids `0 .. num_blocks - 1`.

    `search` accepts a `torch.Tensor` or `np.ndarray` of shape `(num_queries, dim)` and returns a `SearchResult`.
    `RealmForOpenQA` also needs `embeddings(ids)`, the stored vectors of the retrieved blocks, to recompute the
    retrieval logits with gradients.

    Optional, where the searcher owns its storage: `add(embeddings)` appends blocks (new ids continue after
    `num_blocks`), `save(directory)` writes it without pickle and a `load(directory)` classmethod reads it back.
    """

    dim: int

    @property
    def num_blocks(self) -> int: ...

    def search(self, query_embeddings: torch.Tensor | np.ndarray, k: int) -> SearchResult: ...

    def embeddings(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor: ...


class ReaderInputs(NamedTuple):
    """What a retriever returns: answer labels and the `[CLS] question [SEP] block [SEP]` reader inputs.

    A tuple `(has_answers, start_pos, end_pos, concat_inputs)` in transformers 4.x's order, so 4.x callers unpack it as
    before. From `Retriever.__call__` (one question, `K` blocks) the shapes are 4.x's: `has_answers` `(K,)`, the
    positions `(K, A)` (lists), `concat_inputs` a `BatchEncoding` of `(K, L)`. From `Retriever.retrieve` (a batch)
    every field is a tensor: `has_answers` `(B, K)`, `start_pos`/`end_pos` `(B, R, A)` padded with -1, and
    `concat_inputs` a dict of `(B, R, L)` tensors (`input_ids`, `token_type_ids`, `attention_mask`,
    `special_tokens_mask`) for the `R` blocks read. The three labels are `None` without answers.
    """

    has_answers: Any
    start_pos: Any
    end_pos: Any
    concat_inputs: Any


@runtime_checkable
class Retriever(Protocol):
    """Turns retrieved block ids into reader inputs, a batch of questions at a time ([`RealmRetriever`],
    [`PreTokenizedRetriever`]).

    `retrieve(block_ids, question_input_ids, answer_ids=None, max_length=None, num_read=None)` takes block ids
    `(B, K)`, best first, the tokenized questions `(B, L)` and, optionally, gold answers per question (each a list of
    wordpiece-id lists); it returns a batched [`ReaderInputs`] whose reader inputs cover the first `num_read` blocks
    (all `K` when `None`) and whose `has_answers` covers all `K`. `len(retriever)` is the number of blocks.
    """

    tokenizer: Any
    block_records: Sequence

    def __len__(self) -> int: ...

    def retrieve(
        self,
        block_ids,
        question_input_ids,
        answer_ids: list | None = None,
        max_length: int | None = None,
        num_read: int | None = None,
    ) -> ReaderInputs: ...


@runtime_checkable
class TitledRecords(Protocol):
    """Block records that know their documents' titles (a `DocumentStore`'s)."""

    def titles(self, ids) -> list[str]: ...


@runtime_checkable
class BlockOffsets(Protocol):
    """A retriever that knows where each of a block's wordpieces lies in its text, from the one tokenization that
    built the reader inputs: `block_offsets(block_id) -> (text, offsets)`, `offsets` an `(n, 2)` int array of
    character spans of the block's `n` wordpieces (before truncation)."""

    def block_offsets(self, block_id: int) -> tuple[str, Any]: ...


def as_query_matrix(query_embeddings: torch.Tensor | np.ndarray, dim: int) -> torch.Tensor:
    """Checks and converts queries to a 2-D float tensor `(num_queries, dim)`, naming what was received if wrong."""
    if isinstance(query_embeddings, np.ndarray):
        query_embeddings = torch.from_numpy(query_embeddings)
    if not isinstance(query_embeddings, torch.Tensor):
        raise TypeError(
            f"query embeddings must be a torch.Tensor or np.ndarray, got {type(query_embeddings).__name__}."
        )
    if query_embeddings.dim() == 1:
        query_embeddings = query_embeddings.unsqueeze(0)
    if query_embeddings.dim() != 2 or query_embeddings.shape[1] != dim:
        raise ValueError(
            f"query embeddings must have shape (num_queries, {dim}), got {tuple(query_embeddings.shape)}."
        )
    if not query_embeddings.is_floating_point():
        raise ValueError(f"query embeddings must be floating point, got {query_embeddings.dtype}.")
    return query_embeddings


__all__ = ["BlockOffsets", "ReaderInputs", "Retriever", "SearchResult", "Searcher", "TitledRecords", "as_query_matrix"]

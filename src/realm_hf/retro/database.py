"""RETRO's retrieval database: document-contiguous chunks, frozen-BERT chunk keys, and precomputed neighbours.

Shape legend: N - chunks in the database, m - chunk size, Q - query chunks, k - neighbours, D - key dim.

- [`chunk_documents`] splits tokenized documents into `m`-token chunks that never cross a document boundary (the last
  chunk of a document is padded), and remembers each chunk's document, so a neighbour's continuation is the next
  chunk of *its* document and same-document neighbours can be excluded.
- [`embed_chunks`] computes the keys: a frozen BERT's last hidden states averaged over the chunk's tokens (the paper's
  `BERT(N)`); the decoder and the key encoder share the bert-base-uncased wordpiece vocabulary here, so chunk token
  ids go to BERT as they are, between `[CLS]` and `[SEP]`.
- [`RetroDatabase`] holds chunks + a searcher (`ExactSearcher` by default, `FaissSearcher` or any `Searcher` works)
  with metric `"l2"` (the paper) or `"ip"`; [`compute_neighbours`] retrieves `k` neighbours per query chunk with every
  chunk of the query's own document removed (no leakage of the continuation being predicted).
- [`RetroRetriever`] wraps both for `RetroForCausalLM.generate(retriever=...)`.

Everything is written with safetensors + JSON through `realm_hf.atomic` (no pickle).
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers.utils import logging

from ..atomic import atomic_path, atomic_write_bytes
from ..retrieval import ExactSearcher

logger = logging.get_logger(__name__)

CHUNKS_FILE = "chunks.safetensors"
METADATA_FILE = "database.json"
INDEX_DIR = "index"


@dataclass
class RetroChunks:
    r"""
    Document-contiguous chunks of token ids.

    Attributes:
        tokens (`torch.IntTensor` of shape `(N, m)`): chunk token ids, the last chunk of each document padded.
        document_ids (`torch.LongTensor` of shape `(N,)`): the document of each chunk; chunks of a document are
            consecutive and in order.
        pad_token_id (`int`): the padding id.
    """

    tokens: torch.Tensor
    document_ids: torch.Tensor
    pad_token_id: int = 0

    @property
    def chunk_size(self) -> int:
        return int(self.tokens.shape[1])

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def continuation_ids(self) -> torch.Tensor:
        """`(N,)`: the id of the next chunk of the same document, -1 after a document's last chunk."""
        following = torch.arange(1, len(self) + 1)
        same_document = torch.zeros(len(self), dtype=torch.bool)
        same_document[:-1] = self.document_ids[1:] == self.document_ids[:-1]
        return torch.where(same_document, following, torch.full_like(following, -1))

    def neighbour_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        r"""
        The values RETRO reads for retrieved chunk ids: each chunk followed by its continuation (`[N, F]`, 2m tokens).

        Args:
            ids (`torch.LongTensor` of any shape `(...)`): chunk ids; -1 (nothing retrieved) gives all padding.

        Returns:
            `torch.LongTensor` of shape `(..., 2 * m)`.
        """
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.numel() and (int(ids.max()) >= len(self) or int(ids.min()) < -1):
            raise ValueError(f"chunk ids must be in [-1, {len(self)}), got values in [{int(ids.min())}, "
                             f"{int(ids.max())}].")  # fmt: skip
        padded = torch.cat((self.tokens.long(), torch.full((1, self.chunk_size), self.pad_token_id)))  # row -1 = pad
        continuation = self.continuation_ids()
        continuation = torch.cat((continuation, torch.tensor([-1])))
        flat = ids.reshape(-1)
        values = torch.cat((padded[flat], padded[continuation[flat]]), dim=1)  # (n, 2m)
        return values.view(*ids.shape, 2 * self.chunk_size)

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with atomic_path(directory / CHUNKS_FILE) as temporary:
            save_file({"tokens": self.tokens.contiguous(), "document_ids": self.document_ids.contiguous()}, temporary,
                      metadata={"pad_token_id": str(self.pad_token_id)})  # fmt: skip

    @classmethod
    def load(cls, directory: str | Path) -> "RetroChunks":
        from safetensors import safe_open

        path = Path(directory) / CHUNKS_FILE
        with safe_open(str(path), framework="pt") as reader:
            pad_token_id = int((reader.metadata() or {}).get("pad_token_id", 0))
        tensors = load_file(str(path))
        return cls(tensors["tokens"], tensors["document_ids"], pad_token_id)


def chunk_documents(
    documents: Sequence[Sequence[int]], chunk_size: int, *, pad_token_id: int = 0,
    document_ids: Sequence[int] | None = None,
) -> RetroChunks:  # fmt: skip
    r"""
    Splits tokenized documents into `chunk_size`-token chunks that never cross a document boundary.

    Args:
        documents (`Sequence[Sequence[int]]`): token ids of each document (no special tokens). Empty ones are skipped.
        chunk_size (`int`): tokens per chunk `m`.
        pad_token_id (`int`, defaults to 0): fills the last chunk of each document.
        document_ids (`Sequence[int]`, *optional*): an id per document (defaults to its position), e.g. to keep ids
            distinct between a database and held-out documents.

    Returns:
        [`RetroChunks`].
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}.")
    if document_ids is not None and len(document_ids) != len(documents):
        raise ValueError(f"document_ids must give one id per document: {len(documents)} expected, got "
                         f"{len(document_ids)}.")  # fmt: skip
    rows, owners = [], []
    for position, tokens in enumerate(documents):
        tokens = torch.as_tensor(list(tokens), dtype=torch.int32)
        if tokens.numel() == 0:
            continue
        num_chunks = -(-tokens.numel() // chunk_size)
        padded = torch.full((num_chunks * chunk_size,), pad_token_id, dtype=torch.int32)
        padded[: tokens.numel()] = tokens
        rows.append(padded.view(num_chunks, chunk_size))
        owners.append(torch.full((num_chunks,), document_ids[position] if document_ids is not None else position))
    if not rows:
        return RetroChunks(torch.empty(0, chunk_size, dtype=torch.int32), torch.empty(0, dtype=torch.long),
                           pad_token_id)  # fmt: skip
    return RetroChunks(torch.cat(rows), torch.cat(owners).long(), pad_token_id)


@torch.no_grad()
def embed_chunks(
    bert, tokens: torch.Tensor, *, cls_token_id: int = 101, sep_token_id: int = 102, pad_token_id: int = 0,
    batch_size: int = 256,
) -> torch.Tensor:  # fmt: skip
    r"""
    Chunk keys from a frozen BERT: the mean of the last hidden states over the chunk's (non-padding) tokens.

    Args:
        bert (`BertModel`): the frozen key encoder (e.g. MiniLM-L6, whose vocabulary is bert-base-uncased's).
        tokens (`torch.Tensor` of shape `(N, m)`): chunk token ids in BERT's vocabulary.
        cls_token_id, sep_token_id, pad_token_id (`int`): the special tokens (bert-base-uncased's by default).
        batch_size (`int`, defaults to 256).

    Returns:
        `torch.FloatTensor` of shape `(N, hidden_size)` on the CPU.
    """
    tokens = torch.as_tensor(tokens).long()
    if tokens.dim() != 2:
        raise ValueError(f"tokens must have shape (num_chunks, chunk_size), got {tuple(tokens.shape)}.")
    was_training = bert.training
    bert.eval()
    keys = []
    try:
        for start in range(0, tokens.shape[0], batch_size):
            batch = tokens[start : start + batch_size]
            chunk_mask = batch != pad_token_id  # (b, m)
            lengths = chunk_mask.sum(dim=1)
            # [CLS] chunk [SEP] [PAD]...: the [SEP] goes right after the last real token of each chunk.
            input_ids = torch.full((batch.shape[0], batch.shape[1] + 2), pad_token_id, dtype=torch.long)
            input_ids[:, 0] = cls_token_id
            input_ids[:, 1:-1] = batch
            input_ids[torch.arange(batch.shape[0]), lengths + 1] = sep_token_id
            attention_mask = torch.zeros_like(input_ids)
            attention_mask[:, 0] = 1
            attention_mask[:, 1:-1] = chunk_mask
            attention_mask[torch.arange(batch.shape[0]), lengths + 1] = 1
            device = bert.device
            hidden = bert(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).last_hidden_state
            weights = chunk_mask.to(device, hidden.dtype)  # only the chunk's own tokens are averaged
            summed = (hidden[:, 1:-1] * weights[..., None]).sum(dim=1)
            keys.append((summed / weights.sum(dim=1, keepdim=True).clamp(min=1)).float().cpu())
    finally:
        bert.train(was_training)
    if not keys:
        return torch.empty(0, bert.config.hidden_size)
    return torch.cat(keys)


def compute_neighbours(
    searcher, query_keys: torch.Tensor, query_document_ids: torch.Tensor, database_document_ids: torch.Tensor, k: int,
    *, extra: int = 16,
) -> torch.Tensor:  # fmt: skip
    r"""
    The `k` nearest database chunks of each query chunk, excluding every chunk of the query's own document.

    Searches `k + extra` candidates, drops same-document ones, and searches wider (doubling) for the queries left with
    fewer than `k`, up to the whole database.

    Args:
        searcher (`Searcher`): over the database keys, ids = database chunk ids.
        query_keys (`torch.Tensor` of shape `(Q, D)`), query_document_ids (`torch.LongTensor` of shape `(Q,)`).
        database_document_ids (`torch.LongTensor` of shape `(N,)`).
        k (`int`): neighbours per query.

    Returns:
        `torch.LongTensor` of shape `(Q, k)`: chunk ids, best first; -1 where fewer than `k` exist.
    """
    query_document_ids = torch.as_tensor(query_document_ids).long()
    database_document_ids = torch.as_tensor(database_document_ids).long()
    if query_keys.shape[0] != query_document_ids.shape[0]:
        raise ValueError(f"query_document_ids must give one id per query: {query_keys.shape[0]} expected, got "
                         f"{query_document_ids.shape[0]}.")  # fmt: skip
    result = torch.full((query_keys.shape[0], k), -1, dtype=torch.long)
    pending = torch.arange(query_keys.shape[0])
    width = min(k + extra, searcher.num_blocks)
    while pending.numel() and width > 0:
        ids = searcher.search(query_keys[pending], width).ids.cpu()  # (q, width)
        valid = ids >= 0
        owner = database_document_ids[ids.clamp(min=0)]
        valid &= owner != query_document_ids[pending, None]
        # Stable sort moves valid ids to the front while keeping their rank order.
        order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
        kept = torch.gather(torch.where(valid, ids, torch.full_like(ids, -1)), 1, order)[:, :k]
        enough = valid.sum(dim=1) >= k
        done = enough | (width >= searcher.num_blocks)
        result[pending[done], : kept.shape[1]] = kept[done]
        pending = pending[~done]
        width = min(width * 2, searcher.num_blocks)
    return result


class RetroDatabase:
    r"""
    The retrieval database: chunks (values) and a searcher over their frozen-BERT keys.

    Args:
        chunks ([`RetroChunks`]): the database chunks; chunk `i` is searcher id `i`.
        searcher (`Searcher`): over the chunk keys (`ExactSearcher(keys, metric="l2")` in the paper's setting).
    """

    def __init__(self, chunks: RetroChunks, searcher):
        if searcher.num_blocks != len(chunks):
            raise ValueError(f"the searcher holds {searcher.num_blocks} keys but there are {len(chunks)} chunks.")
        self.chunks = chunks
        self.searcher = searcher

    @classmethod
    def build(cls, chunks: RetroChunks, keys: torch.Tensor, *, metric: str = "l2") -> "RetroDatabase":
        """A database searched exactly (`ExactSearcher`) with `metric` (`"l2"` or `"ip"`)."""
        return cls(chunks, ExactSearcher(keys.float(), metric=metric))

    def neighbours(self, query_keys: torch.Tensor, query_document_ids: torch.Tensor, k: int) -> torch.Tensor:
        """`(Q, k)` neighbour chunk ids without same-document chunks; see [`compute_neighbours`]."""
        return compute_neighbours(self.searcher, query_keys, query_document_ids, self.chunks.document_ids, k)

    def save(self, directory: str | Path) -> None:
        """Writes `chunks.safetensors`, the searcher's index directory `index/` and `database.json` (last)."""
        directory = Path(directory)
        self.chunks.save(directory)
        self.searcher.save(directory / INDEX_DIR)
        metadata = {"format": "realm_hf.retro.database", "version": 1, "num_chunks": len(self.chunks),
                    "chunk_size": self.chunks.chunk_size, "metric": self.searcher.metric}  # fmt: skip
        atomic_write_bytes(directory / METADATA_FILE, json.dumps(metadata, indent=2).encode("utf-8"))

    @classmethod
    def load(cls, directory: str | Path, searcher=None) -> "RetroDatabase":
        """Reads a saved database; the keys are memory-mapped into an `ExactSearcher` unless `searcher` is given
        (e.g. a `FaissSearcher` built over `directory/index`)."""
        directory = Path(directory)
        if not (directory / METADATA_FILE).exists():
            raise FileNotFoundError(f"{directory} is not a RETRO database: {METADATA_FILE} is missing.")
        chunks = RetroChunks.load(directory)
        return cls(chunks, searcher if searcher is not None else ExactSearcher.from_index(directory / INDEX_DIR))


class RetroRetriever:
    r"""
    Retrieval for generation: embeds chunks with the frozen BERT, searches the database and returns the neighbours'
    chunk ids and tokens (`[N, F]`). Callable as `retriever(chunk_ids, rows=rows)` by [`RetroForCausalLM.generate`],
    which then reports the chunk ids with `return_neighbours=True`.

    Args:
        database ([`RetroDatabase`]), bert (`BertModel`): the key encoder the database was built with.
        num_neighbors (`int`, defaults to 2): `k`.
        exclude_document_ids (`torch.LongTensor` of shape `(B,)`, *optional*): a document per batch row whose chunks
            must not be retrieved (evaluating on a database document).
    """

    def __init__(self, database: RetroDatabase, bert, num_neighbors: int = 2,
                 exclude_document_ids: torch.Tensor | None = None, pad_token_id: int = 0):  # fmt: skip
        self.database = database
        self.bert = bert
        self.num_neighbors = num_neighbors
        self.exclude_document_ids = exclude_document_ids
        self.pad_token_id = pad_token_id

    def __call__(self, chunk_ids: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        r"""
        Args:
            chunk_ids (`torch.LongTensor` of shape `(n, m)`): chunks to retrieve for.
            rows (`torch.LongTensor` of shape `(n,)`, *optional*): the batch row of each chunk (what
                `exclude_document_ids` is indexed by); defaults to `0 .. n - 1`.

        Returns:
            `tuple`: neighbour chunk ids `(n, k)` in the database (-1 for none) and their tokens `(n, k, 2m)`.
        """
        keys = embed_chunks(self.bert, chunk_ids.cpu(), pad_token_id=self.pad_token_id)
        exclude = torch.full((chunk_ids.shape[0],), -1, dtype=torch.long)  # no database document has id -1
        if self.exclude_document_ids is not None:
            rows = torch.arange(chunk_ids.shape[0]) if rows is None else torch.as_tensor(rows).cpu().long()
            exclude = torch.as_tensor(self.exclude_document_ids).long()[rows]
        ids = self.database.neighbours(keys, exclude, self.num_neighbors)
        return ids.to(chunk_ids.device), self.database.chunks.neighbour_tokens(ids).to(chunk_ids.device)


__all__ = ["RetroChunks", "RetroDatabase", "RetroRetriever", "chunk_documents", "compute_neighbours", "embed_chunks"]

"""Does RETRO's gain grow with its database? One model evaluated against nested databases of several sizes.

Shape legend: N - database chunks, Q - held-out chunks, D - key dim, k - neighbours.

[`database_scaling`] takes the database chunks and their frozen-BERT keys, keeps nested subsets of whole documents
(e.g. 1/16 ⊂ 1/4 ⊂ all of them, each a prefix of one seeded shuffle of the documents, so a chunk's continuation stays
in its subset), optionally adds extra documents to the full database (e.g. Wikipedia summaries added to the factbook),
retrieves neighbours for the held-out chunks from each (never from the query's own document; held-out documents may
not be in any database) and reports the relative drop in held-out bits per byte against retrieval off:
`gain = (bpb_off - bpb_on) / bpb_off`. [`plot_database_scaling`] draws the result (matplotlib, the `plot` extra).
"""

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers.utils import logging

from ..atomic import atomic_path
from ..retrieval import ExactSearcher
from .database import RetroChunks, compute_neighbours
from .training import RetroCollator, RetroSequences, evaluate_bits_per_byte

logger = logging.get_logger(__name__)

DEFAULT_FRACTIONS = (1 / 16, 1 / 4, 1.0)


def nested_document_subsets(
    document_ids: torch.Tensor, fractions: Sequence[float], seed: int = 0
) -> list[torch.Tensor]:
    r"""
    Nested subsets of whole documents: the first `ceil(fraction * documents)` documents of one seeded shuffle.

    Args:
        document_ids (`torch.LongTensor` of shape `(N,)`): the document of each chunk.
        fractions (`Sequence[float]`): increasing fractions in `(0, 1]`.
        seed (`int`, defaults to 0): the shuffle.

    Returns:
        `list[torch.BoolTensor]`, one `(N,)` chunk mask per fraction; each mask contains the previous one.
    """
    fractions = [float(fraction) for fraction in fractions]
    if not fractions or any(not 0 < fraction <= 1 for fraction in fractions) or fractions != sorted(fractions):
        raise ValueError(f"fractions must be increasing numbers in (0, 1], got {fractions}.")
    documents = torch.as_tensor(document_ids).long().unique()
    order = documents[torch.randperm(documents.numel(), generator=torch.Generator().manual_seed(seed))]
    masks = []
    for fraction in fractions:
        kept = order[: max(1, math.ceil(fraction * documents.numel()))]
        masks.append(torch.isin(torch.as_tensor(document_ids).long(), kept))
    return masks


def _subset(chunks: RetroChunks, mask: torch.Tensor) -> RetroChunks:
    return RetroChunks(chunks.tokens[mask], chunks.document_ids[mask], chunks.pad_token_id)


def _fraction_name(fraction: float) -> str:
    if fraction == 1:
        return "all"
    inverse = 1 / fraction
    return f"1/{round(inverse)}" if abs(inverse - round(inverse)) < 1e-9 else f"{fraction:g}"


def scaling_databases(
    database_chunks: RetroChunks,
    database_keys: torch.Tensor,
    eval_chunks: RetroChunks,
    eval_keys: torch.Tensor,
    *,
    num_neighbors: int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    extra_chunks: RetroChunks | None = None,
    extra_keys: torch.Tensor | None = None,
    extra_name: str = "all + extra",
    metric: str = "l2",
    seed: int = 0,
) -> list[dict]:
    r"""
    The databases of a scaling evaluation and the held-out chunks' neighbours in each: what [`database_scaling`]
    searches before it evaluates. Needs the keys but no model, so it can run once, apart from the evaluation (e.g. on
    the machine that holds the keys, with the evaluation on another).

    Args:
        database_chunks ([`RetroChunks`]), database_keys (`torch.Tensor` of shape `(N, D)`): the full database.
        eval_chunks ([`RetroChunks`]), eval_keys (`torch.Tensor` of shape `(Q, D)`): the held-out chunks; their
            documents may not appear in the database or the extra chunks.
        num_neighbors (`int`): `k`.
        fractions, extra_chunks, extra_keys, extra_name, metric, seed: as in [`database_scaling`].

    Returns:
        `list[dict]`, smallest database first: `{"name", "mask", "neighbours"}`, where `mask` (`torch.BoolTensor` of
        shape `(N,)`, or `(N + N',)` over the database followed by the extra chunks) selects the database's chunks and
        `neighbours` (`torch.LongTensor` of shape `(Q, k)`) are the held-out chunks' neighbour ids among them (-1: none).
    """
    if database_keys.shape[0] != len(database_chunks):
        raise ValueError(f"database_keys must have one row per database chunk: {len(database_chunks)} expected, got "
                         f"{database_keys.shape[0]}.")  # fmt: skip
    if eval_keys.shape[0] != len(eval_chunks):
        raise ValueError(f"eval_keys must have one row per held-out chunk: {len(eval_chunks)} expected, got "
                         f"{eval_keys.shape[0]}.")  # fmt: skip
    leaked = set(eval_chunks.document_ids.tolist()) & set(database_chunks.document_ids.tolist())
    if leaked:
        raise ValueError(f"held-out documents must never be in the database; these are: {sorted(leaked)[:10]}.")
    masks = nested_document_subsets(database_chunks.document_ids, fractions, seed)
    document_ids, keys = database_chunks.document_ids, database_keys
    names = [_fraction_name(fraction) for fraction in fractions]
    if extra_chunks is not None:
        if extra_keys is None or extra_keys.shape[0] != len(extra_chunks):
            raise ValueError(f"extra_keys must have one row per extra chunk: {len(extra_chunks)} expected, got "
                             f"{None if extra_keys is None else extra_keys.shape[0]}.")  # fmt: skip
        if extra_chunks.chunk_size != database_chunks.chunk_size:
            raise ValueError(f"extra chunks have {extra_chunks.chunk_size} tokens, the database's "
                             f"{database_chunks.chunk_size}.")  # fmt: skip
        shared = set(extra_chunks.document_ids.tolist()) & set(database_chunks.document_ids.tolist())
        leaked = set(eval_chunks.document_ids.tolist()) & set(extra_chunks.document_ids.tolist())
        if shared or leaked:
            raise ValueError(f"extra documents need their own document ids, distinct from the database's (shared: "
                             f"{sorted(shared)[:10]}) and the held-out ones (shared: {sorted(leaked)[:10]}).")  # fmt: skip
        document_ids = torch.cat((document_ids, extra_chunks.document_ids))
        keys = torch.cat((database_keys, extra_keys.to(database_keys.dtype)))
        masks = [torch.cat((mask, torch.zeros(len(extra_chunks), dtype=torch.bool))) for mask in masks]
        masks.append(torch.ones(len(document_ids), dtype=torch.bool))
        names.append(extra_name)
    databases = []
    for name, mask in zip(names, masks):
        searcher = ExactSearcher(keys[mask].float(), metric=metric)
        neighbours = compute_neighbours(searcher, eval_keys.float(), eval_chunks.document_ids, document_ids[mask],
                                        num_neighbors)  # fmt: skip
        databases.append({"name": name, "mask": mask, "neighbours": neighbours})
    return databases


def combined_chunks(database_chunks: RetroChunks, extra_chunks: RetroChunks | None = None) -> RetroChunks:
    """The database's chunks followed by the extra ones: what the masks of [`scaling_databases`] select from."""
    if extra_chunks is None:
        return database_chunks
    return RetroChunks(torch.cat((database_chunks.tokens, extra_chunks.tokens.to(database_chunks.tokens.dtype))),
                       torch.cat((database_chunks.document_ids, extra_chunks.document_ids)),
                       database_chunks.pad_token_id)  # fmt: skip


@torch.no_grad()
def evaluate_database_scaling(
    model,
    chunks: RetroChunks,
    eval_chunks: RetroChunks,
    databases: Sequence[dict],
    *,
    chunks_per_sequence: int,
    num_bytes: int | None = None,
    batch_size: int = 8,
) -> list[dict]:
    r"""
    Evaluates one RETRO model against the databases of [`scaling_databases`], each against retrieval off.

    Args:
        model (`RetroForCausalLM`): the model (evaluated as is; retrieval off is the same model without neighbours).
        chunks ([`RetroChunks`]): what the databases' masks select from ([`combined_chunks`]).
        eval_chunks ([`RetroChunks`]): the held-out chunks.
        databases (`Sequence[dict]`): [`scaling_databases`]'s result.
        chunks_per_sequence, num_bytes, batch_size: as in [`database_scaling`].

    Returns:
        As [`database_scaling`].
    """
    for database in databases:
        if database["mask"].shape[0] != len(chunks) or database["neighbours"].shape[0] != len(eval_chunks):
            raise ValueError(f"database {database['name']!r} has a mask over {database['mask'].shape[0]} chunks and "
                             f"neighbours for {database['neighbours'].shape[0]} held-out chunks; expected {len(chunks)} "
                             f"and {len(eval_chunks)}.")  # fmt: skip
    k = databases[0]["neighbours"].shape[1] if databases else model.config.num_neighbors
    no_neighbours = torch.full((len(eval_chunks), k), -1, dtype=torch.long)
    off = evaluate_bits_per_byte(model, RetroSequences(eval_chunks, no_neighbours, chunks_per_sequence),
                                 RetroCollator(chunks, retrieval="off"), num_bytes=num_bytes,
                                 batch_size=batch_size)  # fmt: skip
    results = []
    for database in databases:
        subset = _subset(chunks, database["mask"])
        sequences = RetroSequences(eval_chunks, database["neighbours"], chunks_per_sequence)
        on = evaluate_bits_per_byte(model, sequences, RetroCollator(subset, num_neighbors=k), num_bytes=num_bytes,
                                    batch_size=batch_size)  # fmt: skip
        entry = {
            "name": database["name"],
            "documents": int(subset.document_ids.unique().numel()),
            "chunks": len(subset),
            "gain": (off["loss"] - on["loss"]) / off["loss"],
            "loss_on": on["loss"],
            "loss_off": off["loss"],
        }
        if num_bytes is not None:
            entry["bits_per_byte_on"], entry["bits_per_byte_off"] = on["bits_per_byte"], off["bits_per_byte"]
        logger.info(f"database {entry['name']}: {entry['chunks']:,} chunks, gain {entry['gain']:.4%}")
        results.append(entry)
    return results


def database_scaling(
    model,
    database_chunks: RetroChunks,
    database_keys: torch.Tensor,
    eval_chunks: RetroChunks,
    eval_keys: torch.Tensor,
    *,
    chunks_per_sequence: int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    extra_chunks: RetroChunks | None = None,
    extra_keys: torch.Tensor | None = None,
    extra_name: str = "all + extra",
    num_neighbors: int | None = None,
    num_bytes: int | None = None,
    metric: str = "l2",
    seed: int = 0,
    batch_size: int = 8,
) -> list[dict]:
    r"""
    Evaluates one RETRO model on held-out chunks with databases of several sizes, against retrieval off
    ([`scaling_databases`], then [`evaluate_database_scaling`]).

    Args:
        model (`RetroForCausalLM`): the model (evaluated as is; retrieval off is the same model without neighbours).
        database_chunks ([`RetroChunks`]), database_keys (`torch.Tensor` of shape `(N, D)`): the full database.
        eval_chunks ([`RetroChunks`]), eval_keys (`torch.Tensor` of shape `(Q, D)`): the held-out chunks; their
            documents may not appear in the database or the extra chunks.
        chunks_per_sequence (`int`): evaluation windows of this many chunks (as in [`RetroSequences`]).
        fractions (`Sequence[float]`, defaults to `(1/16, 1/4, 1)`): nested document subsets of the database.
        extra_chunks ([`RetroChunks`], *optional*), extra_keys (`(N', D)`): documents added to the full database
            for one more, larger entry named `extra_name` (their document ids must differ from the database's).
        num_neighbors (`int`, *optional*, defaults to `model.config.num_neighbors`): `k`.
        num_bytes (`int`, *optional*): UTF-8 bytes of the evaluated text, for bits per byte.
        metric (`str`, defaults to `"l2"`): the search metric (`"l2"` or `"ip"`).
        seed (`int`, defaults to 0): the document shuffle of the subsets.

    Returns:
        `list[dict]`, smallest database first: `{"name", "documents", "chunks", "gain", "loss_on", "loss_off"}` plus,
        with `num_bytes`, `"bits_per_byte_on"` and `"bits_per_byte_off"`. `gain = (off - on) / off`, the relative drop
        in held-out loss (equal for nats and bits per byte: the byte count is the same).
    """
    databases = scaling_databases(database_chunks, database_keys, eval_chunks, eval_keys,
                                  num_neighbors=num_neighbors or model.config.num_neighbors, fractions=fractions,
                                  extra_chunks=extra_chunks, extra_keys=extra_keys, extra_name=extra_name,
                                  metric=metric, seed=seed)  # fmt: skip
    return evaluate_database_scaling(model, combined_chunks(database_chunks, extra_chunks), eval_chunks, databases,
                                     chunks_per_sequence=chunks_per_sequence, num_bytes=num_bytes,
                                     batch_size=batch_size)  # fmt: skip


def plot_database_scaling(scaling: Sequence[dict], path: str | Path, *, title: str | None = None) -> Path:
    r"""
    Draws held-out gain (%) against database chunks (log scale) and writes the figure (PNG or SVG by suffix).

    Args:
        scaling (`Sequence[dict]`): [`database_scaling`]'s result (`"chunks"`, `"gain"`, optionally `"name"`).
        path (`str` or `Path`): the image to write (atomically).

    Returns:
        `Path`: the written file.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError as error:
        raise ImportError("plot_database_scaling needs matplotlib: pip install 'realm_hf[plot]'") from error
    if not scaling or any("chunks" not in entry or "gain" not in entry for entry in scaling):
        raise ValueError("scaling must be a non-empty list of {'chunks': N, 'gain': fraction} entries.")
    path = Path(path)
    chunks = [entry["chunks"] for entry in scaling]
    gains = [100 * entry["gain"] for entry in scaling]
    figure, axes = plt.subplots(figsize=(6, 3.6), dpi=120)
    axes.plot(chunks, gains, marker="o")
    for index, (entry, x, y) in enumerate(zip(scaling, chunks, gains)):
        # The last label goes below and left of its point: the longest name ("all + Wikipedia summaries") stays
        # inside the axes and off its neighbour's label.
        last = index == len(scaling) - 1
        axes.annotate(entry.get("name", ""), (x, y), textcoords="offset points", xytext=(-4, -12) if last else (4, 6),
                      ha="right" if last else "left", fontsize=8)  # fmt: skip
    axes.set_xscale("log")
    # Ticks at the measured sizes, written out: labelled minor ticks of a log axis ("2x10^3", ...) overlap.
    axes.set_xticks(chunks, [f"{count:,}" for count in chunks], fontsize=8)
    axes.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axes.margins(x=0.08, y=0.15)
    axes.set_xlabel("database chunks")
    axes.set_ylabel("held-out gain from retrieval (%)")
    axes.axhline(0, color="grey", linewidth=0.8)
    axes.set_title(title or "RETRO: gain vs database size")
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temporary:
        figure.savefig(temporary, format=path.suffix.lstrip(".") or "png")
    plt.close(figure)
    return path


__all__ = [
    "DEFAULT_FRACTIONS",
    "combined_chunks",
    "database_scaling",
    "evaluate_database_scaling",
    "nested_document_subsets",
    "plot_database_scaling",
    "scaling_databases",
]

"""Training and evaluating RETRO with the `Trainer`: sequences with precomputed neighbours, a collator that turns
neighbour chunk ids into neighbour tokens, and bits-per-byte with retrieval on, off or with shuffled neighbours.

Shape legend: B - batch, n - tokens per sequence, L - chunks per sequence (n = L * m), k - neighbours, m - chunk size.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset
from transformers import Trainer
from transformers.utils import logging

from ..training.trainer_files import JsonTrainingArgumentsMixin
from .database import RetroChunks

logger = logging.get_logger(__name__)

RETRIEVAL_MODES = ("on", "off", "shuffled")


class RetroSequences(Dataset):
    r"""
    Training or evaluation sequences: windows of up to `chunks_per_sequence` consecutive chunks of one document, with
    the precomputed neighbours of each chunk.

    Args:
        chunks ([`RetroChunks`]): the chunks the sequences are cut from (the database's own chunks for training, or
            held-out chunks for evaluation).
        neighbour_ids (`torch.LongTensor` of shape `(len(chunks), k)`): neighbour chunk ids in the *database* (-1 for
            none), e.g. from `RetroDatabase.neighbours`, which excludes same-document chunks.
        chunks_per_sequence (`int`): `L`; a sequence has `L * m` tokens (fewer at the end of a document).
        max_sequences_per_document (`int`, *optional*): keep only each document's first windows.
    """

    def __init__(self, chunks: RetroChunks, neighbour_ids: torch.Tensor, chunks_per_sequence: int,
                 max_sequences_per_document: int | None = None):  # fmt: skip
        if neighbour_ids.shape[0] != len(chunks):
            raise ValueError(f"neighbour_ids must have one row per chunk: {len(chunks)} expected, got "
                             f"{neighbour_ids.shape[0]}.")  # fmt: skip
        self.chunks = chunks
        self.neighbour_ids = neighbour_ids.long()
        self.windows: list[tuple[int, int]] = []  # (first chunk, number of chunks)
        starts = torch.nonzero(torch.cat((torch.tensor([True]), chunks.document_ids[1:] != chunks.document_ids[:-1])))
        bounds = starts[:, 0].tolist() + [len(chunks)]
        for first, stop in zip(bounds[:-1], bounds[1:]):
            for number, start in enumerate(range(first, stop, chunks_per_sequence)):
                if max_sequences_per_document is not None and number >= max_sequences_per_document:
                    break
                self.windows.append((start, min(chunks_per_sequence, stop - start)))

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start, count = self.windows[index]
        return {
            "input_ids": self.chunks.tokens[start : start + count].reshape(-1).long(),  # (count * m,)
            "neighbour_ids": self.neighbour_ids[start : start + count],  # (count, k)
        }

    def with_shuffled_neighbours(self, seed: int = 0) -> "RetroSequences":
        """A copy whose chunks get the neighbour lists of other, randomly chosen chunks (a permutation of the rows of
        `neighbour_ids`): same neighbour distribution, no relation to the chunk."""
        shuffled = RetroSequences.__new__(RetroSequences)
        shuffled.chunks, shuffled.windows = self.chunks, self.windows
        generator = torch.Generator().manual_seed(seed)
        shuffled.neighbour_ids = self.neighbour_ids[torch.randperm(self.neighbour_ids.shape[0], generator=generator)]
        return shuffled


@dataclass
class RetroCollator:
    r"""
    Pads sequences and adds their neighbours' tokens (`[N, F]`, 2m tokens each) from the database chunks.

    Args:
        database_chunks ([`RetroChunks`]): the database values the neighbour ids point into.
        retrieval (`str`, defaults to `"on"`): `"on"`, or `"off"` (no `neighbour_input_ids`: plain LM batches, also for
            a base `GPT2LMHeadModel`). Shuffled neighbours come from `RetroSequences.with_shuffled_neighbours`.
        num_neighbors (`int`, *optional*): use only the first `k` precomputed neighbours.
    """

    database_chunks: RetroChunks
    retrieval: str = "on"
    num_neighbors: int | None = None
    pad_token_id: int = 0

    def __post_init__(self):
        if self.retrieval not in ("on", "off"):
            raise ValueError(f"retrieval must be 'on' or 'off' (shuffle the dataset instead), got {self.retrieval!r}.")

    def __call__(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        length = max(feature["input_ids"].shape[0] for feature in features)
        input_ids = torch.full((len(features), length), self.pad_token_id, dtype=torch.long)
        for row, feature in enumerate(features):
            input_ids[row, : feature["input_ids"].shape[0]] = feature["input_ids"]
        labels = input_ids.masked_fill(input_ids == self.pad_token_id, -100)
        batch = {"input_ids": input_ids, "labels": labels}
        if self.retrieval == "on":
            m = self.database_chunks.chunk_size
            num_chunks = -(-length // m)
            k = self.num_neighbors or features[0]["neighbour_ids"].shape[1]
            neighbour_ids = torch.full((len(features), num_chunks, k), -1, dtype=torch.long)
            for row, feature in enumerate(features):
                neighbour_ids[row, : feature["neighbour_ids"].shape[0]] = feature["neighbour_ids"][:, :k]
            batch["neighbour_input_ids"] = self.database_chunks.neighbour_tokens(neighbour_ids)  # (B, L, k, 2m)
        return batch


def bits_per_byte(total_nats: float, num_bytes: int) -> float:
    """Summed next-token negative log-likelihood (nats) -> bits per UTF-8 byte of the evaluated text."""
    return total_nats / (math.log(2) * num_bytes)


def _batches_in_eval_mode(model, dataset: Dataset, collator, batch_size: int):
    """`dataset`'s collated batches in order, with `model` in eval mode until the last (its mode restored after)."""
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(dataset), batch_size):
            yield collator([dataset[index] for index in range(start, min(start + batch_size, len(dataset)))])
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate_bits_per_byte(model, dataset: Dataset, collator: RetroCollator, *, num_bytes: int | None = None,
                           batch_size: int = 8) -> dict[str, float]:  # fmt: skip
    r"""
    Summed next-token loss of `model` over `dataset` (padding ignored), as nats per token, perplexity and, given the
    byte count of the evaluated text, bits per byte.

    Args:
        model: `RetroForCausalLM` (or any causal LM taking `input_ids`, with retrieval `"off"`).
        dataset: e.g. [`RetroSequences`] of held-out documents (use `with_shuffled_neighbours()` for the control).
        collator ([`RetroCollator`]): its `retrieval` decides on/off.
        num_bytes (`int`, *optional*): UTF-8 bytes of the text whose tokens are predicted.

    Returns:
        `dict` with `nats`, `tokens`, `loss` (nats per token), `perplexity` and, with `num_bytes`, `bits_per_byte`.
    """
    total_nats, total_tokens = 0.0, 0
    for batch in _batches_in_eval_mode(model, dataset, collator, batch_size):
        labels = batch.pop("labels")
        logits = model(**{key: value.to(model.device) for key, value in batch.items()}).logits.float()
        targets = labels[:, 1:].to(logits.device)
        nats = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(),
                                                 ignore_index=-100, reduction="sum")  # fmt: skip
        total_nats += float(nats)
        total_tokens += int((targets != -100).sum())
    result = {"nats": total_nats, "tokens": total_tokens, "loss": total_nats / max(total_tokens, 1)}
    result["perplexity"] = math.exp(result["loss"])
    if num_bytes is not None:
        result["bits_per_byte"] = bits_per_byte(total_nats, num_bytes)
    return result


@torch.no_grad()
def copy_baseline_bits_per_byte(lm, dataset: Dataset, database_chunks: RetroChunks, *, num_bytes: int,
                                weights: Sequence[float] = (0.05, 0.1, 0.2, 0.3),
                                batch_size: int = 8) -> dict[str, float]:  # fmt: skip
    r"""
    How much a trivial reader of the neighbours gains: bits per byte of a language model without retrieval mixed with
    a copy distribution over each chunk's neighbours, `(1 - w) p_lm + w p_copy`, for each mixing weight `w`.

    `p_copy` reads the neighbours RETRO reads for a token (those of the chunk before it: a token at position `t`
    predicted from chunk `u = (t + 1) // m - 1`'s neighbours, none in the first chunk) the way an induction head would:
    where the previous token occurs in them, the tokens that follow it there, each occurrence counting once; where it
    does not occur, the neighbours' tokens as a bag. A database that holds the held-out text in other words (a second
    translation, a paraphrase) gives a large gain here whether or not a RETRO model learned to read it: compare it with
    the RETRO model's own gain to tell "the database lacks it" from "the model does not read it".

    Args:
        lm: a causal LM taking `input_ids` (e.g. the base `GPT2LMHeadModel`), evaluated without retrieval.
        dataset ([`RetroSequences`]): the held-out windows with their neighbours.
        database_chunks ([`RetroChunks`]): what the neighbour ids point into.
        num_bytes (`int`): UTF-8 bytes of the text whose tokens are predicted (as for [`evaluate_bits_per_byte`]).
        weights (sequence of `float`): the mixing weights `w`, each in (0, 1).

    Returns:
        `dict`: `"lm"` (the model alone) and one `"copy w=<w>"` entry per weight, in bits per byte.
    """
    if not all(0.0 < weight < 1.0 for weight in weights):
        raise ValueError(f"weights must each be in (0, 1), got {list(weights)}.")
    collator = RetroCollator(database_chunks)
    pad, m = database_chunks.pad_token_id, database_chunks.chunk_size
    nats = torch.zeros(len(weights) + 1, dtype=torch.float64)
    for batch in _batches_in_eval_mode(lm, dataset, collator, batch_size):
        input_ids, labels, neighbours = batch["input_ids"], batch["labels"], batch["neighbour_input_ids"]
        probabilities = lm(input_ids=input_ids.to(lm.device)).logits.float().softmax(-1).cpu()  # (B, T, V)
        length = input_ids.shape[1]
        positions = torch.arange(length - 1)  # position t predicts token t + 1
        chunk = (positions + 1) // m - 1  # (T-1,): whose neighbours; -1 for none
        targets = labels[:, 1:]  # (B, T-1)
        valid = targets != -100
        p_lm = probabilities[:, :-1].gather(-1, targets.clamp(min=0)[..., None])[..., 0]  # (B, T-1)
        read = neighbours[:, chunk.clamp(min=0)].flatten(2, 3)  # (B, T-1, k * 2m): one row per neighbour, joined
        read = read.masked_fill((chunk < 0)[None, :, None], pad)
        current, following = read[..., :-1], read[..., 1:]
        # pairs inside one neighbour only (not the last token of one and the first of the next)
        inside = (torch.arange(read.shape[-1] - 1) % (2 * m)) != (2 * m - 1)
        matches = (current == input_ids[:, :-1, None]) & (following != pad) & inside  # (B, T-1, k*2m - 1)
        hits = (matches & (following == targets[..., None])).sum(-1).double()
        bag = (read != pad).sum(-1).double()
        p_bag = (read == targets[..., None]).sum(-1).double() / bag.clamp(min=1)
        count = matches.sum(-1).double()
        p_copy = torch.where(count > 0, hits / count.clamp(min=1), p_bag)  # (B, T-1)
        nats[0] -= p_lm.double().log()[valid].sum()
        for index, weight in enumerate(weights, start=1):
            mixed = (1 - weight) * p_lm.double() + weight * p_copy
            nats[index] -= mixed.log()[valid].sum()
    names = ["lm"] + [f"copy w={weight:g}" for weight in weights]
    return {name: bits_per_byte(float(value), num_bytes) for name, value in zip(names, nats)}


class RetroTrainer(JsonTrainingArgumentsMixin, Trainer):
    r"""
    `Trainer` for RETRO: batches come from a [`RetroCollator`], and `evaluate()` reports the held-out loss, perplexity
    and bits per byte with retrieval on, off and with shuffled neighbours (`eval_on_loss`, `eval_off_loss`,
    `eval_shuffled_loss`, ...) when the eval dataset is a [`RetroSequences`].

    Args (besides the `Trainer`'s):
        database_chunks ([`RetroChunks`]): what neighbour ids point into.
        eval_num_bytes (`int`, *optional*): UTF-8 bytes of the evaluated text, for bits per byte.
    """

    data_collator_class = RetroCollator

    def __init__(self, *args, database_chunks: RetroChunks, eval_num_bytes: int | None = None, **kwargs):
        kwargs.setdefault("data_collator", RetroCollator(database_chunks))
        super().__init__(*args, **kwargs)
        # Features carry `neighbour_ids`, which no forward takes: the collator needs them, so nothing may drop them.
        self.args.remove_unused_columns = False
        self.database_chunks = database_chunks
        self.eval_num_bytes = eval_num_bytes

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if not isinstance(dataset, RetroSequences):
            return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        metrics = {}
        for mode in RETRIEVAL_MODES:
            collator = RetroCollator(self.database_chunks, retrieval="off" if mode == "off" else "on")
            data = dataset.with_shuffled_neighbours() if mode == "shuffled" else dataset
            result = evaluate_bits_per_byte(self.model, data, collator, num_bytes=self.eval_num_bytes,
                                            batch_size=self.args.per_device_eval_batch_size)  # fmt: skip
            for key in ("loss", "perplexity", "bits_per_byte"):
                if key in result:
                    metrics[f"{metric_key_prefix}_{mode}_{key}"] = result[key]
        self.log(metrics)
        return metrics


__all__ = [
    "RETRIEVAL_MODES",
    "RetroCollator",
    "RetroSequences",
    "RetroTrainer",
    "bits_per_byte",
    "copy_baseline_bits_per_byte",
    "evaluate_bits_per_byte",
]

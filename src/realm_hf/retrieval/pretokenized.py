"""Pre-tokenized evidence blocks and a retriever that builds reader inputs by concatenating integer ids.

`RealmRetriever` decodes the question and re-tokenizes every retrieved block at every step (5,000 blocks per question
in the ORQA recipe), the main cost of fine-tuning in transformers 4.x. Here the corpus is tokenized once:

- [`tokenize_corpus`] writes `token_ids` (int32, every block's wordpieces without special tokens, concatenated) and
  `offsets` (int64, `num_blocks + 1` entries) to a pickle-free safetensors file, streaming and atomically.
- [`PreTokenizedBlocks`] memory-maps such a file: `blocks[i]` is block `i`'s wordpieces as `np.ndarray[int32]`.
- [`PreTokenizedRetriever`] has `RealmRetriever.__call__`'s signature and outputs, built with numpy from ids.

Known differences from `RealmRetriever` (both are equal on everything else; see `tests/retrieval/test_pretokenized.py`):

- The question is `question_input_ids[0]` without `[CLS]`, `[SEP]` and `[PAD]`. `RealmRetriever` decodes it with
  `skip_special_tokens=True` and re-tokenizes, which also drops `[UNK]`/`[MASK]` pieces (and could in principle
  re-split a decoded word differently); here those pieces are kept, as the question encoder saw them.
- Blocks are cut to `max_block_length` wordpieces when the corpus is tokenized. With
  `max_block_length >= reader_seq_len - 3` (or ORQA's blocks of at most 288 wordpieces) this changes nothing.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
from transformers import BatchEncoding
from transformers.utils import logging

from ..safetensors_format import RaggedWriter, read_ragged_header
from .retriever import checked_block_ids

logger = logging.get_logger(__name__)

__all__ = ["PRETOKENIZED_FORMAT", "PreTokenizedBlocks", "PreTokenizedRetriever", "tokenize_corpus"]

PRETOKENIZED_FORMAT = "realm_hf.pretokenized_blocks"
PRETOKENIZED_FORMAT_VERSION = "1"

_VERIFY_CHUNK = 1 << 20
# `max_length=None` means the tokenizer's `model_max_length`, often 1e30 ("no limit"): keep the arithmetic in int64.
_NO_LIMIT = 1 << 40


# ---------------------------------------------------------------------------------------------------------------------
# the file


def _text_batches(texts_or_store: Any, batch_size: int):
    """Yields lists of `str`: from a `DocumentStore` (its `block_texts`) or any sequence of `str`/`bytes`."""
    if hasattr(texts_or_store, "block_texts"):
        for start in range(0, len(texts_or_store), batch_size):
            yield texts_or_store.block_texts(np.arange(start, min(start + batch_size, len(texts_or_store))))
        return
    iterator = iter(texts_or_store)
    while batch := list(itertools.islice(iterator, batch_size)):
        yield [text.decode("utf-8") if isinstance(text, (bytes, bytearray)) else str(text) for text in batch]


def tokenize_corpus(
    tokenizer,
    texts_or_store: Any,
    output_path: str | os.PathLike,
    max_block_length: int = 288,
    batch_size: int = 1024,
) -> Path:
    """Tokenize every evidence block once and write the wordpieces to a pickle-free safetensors file.

    The file holds `offsets` (int64, `num_blocks + 1`, starting at 0) and `token_ids` (int32, block `i` is
    `token_ids[offsets[i]:offsets[i + 1]]`, wordpieces without special tokens), with metadata `format`, `version`,
    `num_blocks`, `max_block_length`, `vocab_size` (`len(tokenizer)`) and `tokenizer_name`. Blocks are tokenized and
    written a batch at a time (with a progress bar) to a temporary file that is renamed into place at the end.

    Args:
        tokenizer (`RealmTokenizer`): the reader's tokenizer.
        texts_or_store (`DocumentStore`, `BlockRecords` or sequence of `str`/`bytes`): the blocks in id order.
        output_path (`str` or `os.PathLike`): the `.safetensors` file to write.
        max_block_length (`int`, *optional*, defaults to 288): wordpieces kept per block (ORQA's block size).
        batch_size (`int`, *optional*, defaults to 1024): blocks tokenized per call.

    Returns:
        `Path`: the path written.
    """
    from tqdm.auto import tqdm

    if max_block_length < 1 or batch_size < 1:
        raise ValueError(f"max_block_length and batch_size must be >= 1, received {max_block_length}, {batch_size}")
    if not hasattr(texts_or_store, "__len__"):
        texts_or_store = list(texts_or_store)
    num_blocks = len(texts_or_store)
    if len(tokenizer) > np.iinfo(np.int32).max:
        raise ValueError(f"token ids are stored as int32; the tokenizer has {len(tokenizer)} tokens")
    metadata = {
        "format": PRETOKENIZED_FORMAT,
        "version": PRETOKENIZED_FORMAT_VERSION,
        "num_blocks": str(num_blocks),
        "max_block_length": str(max_block_length),
        "vocab_size": str(len(tokenizer)),
        "tokenizer_name": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
    }
    output_path = Path(output_path)
    with (
        RaggedWriter(output_path, count=num_blocks, metadata=metadata, data_name="token_ids", data_dtype="I32",
                     description="blocks (len(texts_or_store))") as writer,
        tqdm(total=num_blocks, desc="Tokenizing blocks", unit="block") as progress,
    ):  # fmt: skip
        for texts in _text_batches(texts_or_store, batch_size):
            encoded = tokenizer(
                texts,
                add_special_tokens=False,
                truncation=True,
                max_length=max_block_length,
                return_attention_mask=False,
                return_token_type_ids=False,
            )["input_ids"]
            writer.write(encoded)
            progress.update(len(encoded))
    num_tokens = writer.total
    logger.info(f"Tokenized {num_blocks} blocks ({num_tokens} wordpieces) into {output_path}")
    return output_path


class PreTokenizedBlocks:
    """Read-only, memory-mapped wordpieces of every block, as written by [`tokenize_corpus`].

    `blocks[i]` is block `i`'s wordpieces (`np.ndarray` of int32, no special tokens); `token_ids` and `offsets` are
    the flat arrays, for vectorised gathers.

    Args:
        token_ids (`np.ndarray`): 1-D int32, every block's wordpieces concatenated.
        offsets (`np.ndarray`): 1-D int64, `num_blocks + 1` non-decreasing offsets from 0 to `len(token_ids)`.
        metadata (`dict[str, str]`, *optional*): the file's metadata (`vocab_size`, `tokenizer_name`, ...).
        path (`str` or `os.PathLike`, *optional*): the file the arrays come from; only used in messages.
    """

    def __init__(self, token_ids: np.ndarray, offsets: np.ndarray, metadata: dict | None = None, path=None):
        source = Path(path).name if path is not None else "pre-tokenized blocks"
        if token_ids.dtype != np.int32 or token_ids.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1:
            raise ValueError(
                f"{source}: expected 1-D int32 token_ids and 1-D offsets, received {token_ids.dtype} of shape "
                f"{token_ids.shape} and offsets of shape {offsets.shape}"
            )
        if int(offsets[0]) != 0 or int(offsets[-1]) != len(token_ids):
            raise ValueError(
                f"{source} is corrupt: expected offsets from 0 to {len(token_ids)}, received {int(offsets[0])} to "
                f"{int(offsets[-1])}"
            )
        for start in range(0, len(offsets) - 1, _VERIFY_CHUNK):
            window = np.asarray(offsets[start : start + _VERIFY_CHUNK + 1])
            decreasing = np.flatnonzero(window[1:] < window[:-1])
            if decreasing.size:
                raise ValueError(
                    f"{source} is corrupt: expected non-decreasing offsets, offsets[{start + int(decreasing[0])}] is "
                    "greater than the next one"
                )
        self.token_ids = token_ids
        self.offsets = offsets
        self.metadata = dict(metadata or {})
        self.path = Path(path) if path is not None else None

    @classmethod
    def open(cls, path: str | os.PathLike) -> PreTokenizedBlocks:
        """Memory-map a file written by [`tokenize_corpus`]; raises `ValueError` if it is truncated or corrupt."""
        path = Path(path)
        with open(path, "rb") as reader:
            data_start, header = read_ragged_header(
                reader, path.stat().st_size, path.name, file_format=PRETOKENIZED_FORMAT,
                version=PRETOKENIZED_FORMAT_VERSION, description="pre-tokenized blocks",
                tensors=(("offsets", "I64", 8), ("token_ids", "I32", 4)), count_key="num_blocks",
            )  # fmt: skip
        num_offsets = header["offsets"]["shape"][0]
        num_tokens = header["token_ids"]["shape"][0]
        offsets = np.memmap(
            path, dtype="<i8", mode="r", offset=data_start + header["offsets"]["data_offsets"][0], shape=(num_offsets,)
        )
        if num_tokens:
            start = data_start + header["token_ids"]["data_offsets"][0]
            token_ids = np.memmap(path, dtype="<i4", mode="r", offset=start, shape=(num_tokens,))
        else:
            token_ids = np.empty(0, dtype="<i4")
        return cls(np.asarray(token_ids), np.asarray(offsets), header["__metadata__"], path)

    @property
    def vocab_size(self) -> int | None:
        """`int` or `None`: `len(tokenizer)` of the tokenizer that wrote the file."""
        return int(self.metadata["vocab_size"]) if "vocab_size" in self.metadata else None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        num_blocks = len(self)
        index = int(index)
        if not -num_blocks <= index < num_blocks:
            raise IndexError(f"block index {index} is out of range for {num_blocks} blocks")
        index %= num_blocks
        return np.asarray(self.token_ids[self.offsets[index] : self.offsets[index + 1]])

    def __copy__(self) -> PreTokenizedBlocks:
        return self

    def __deepcopy__(self, memo) -> PreTokenizedBlocks:
        # Read-only and memory-mapped: a copy would only waste memory (RealmForOpenQA.from_pretrained deep-copies).
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_blocks={len(self)}, num_tokens={len(self.token_ids)}, path={self.path})"


# ---------------------------------------------------------------------------------------------------------------------
# the retriever


def _longest_first_lengths(question_length: int, block_lengths: np.ndarray, budget: int) -> tuple[np.ndarray, ...]:
    """The lengths the Rust tokenizer's `longest_first` pair truncation keeps, vectorised over blocks.

    `budget` is `max_length` less the three special tokens. As in `tokenizers`' `truncate_encodings`: if the pair
    fits, nothing is cut; else the shorter side (n1) keeps its length when it fits, the longer side gets the rest but
    never less than n1; if the two still do not fit, the shorter side gets `budget // 2` and the longer the remainder.
    On equal lengths the question counts as the shorter side.
    """
    question = np.full_like(block_lengths, question_length)
    swap = question > block_lengths
    shorter = np.minimum(question, block_lengths)
    longer = np.where(shorter > budget, shorter, np.maximum(shorter, budget - shorter))
    both_cut = shorter + longer > budget
    shorter = np.where(both_cut, budget // 2, shorter)
    longer = np.where(both_cut, budget // 2 + budget % 2, longer)
    fits = question + block_lengths <= budget
    question_kept = np.where(fits, question, np.where(swap, longer, shorter))
    block_kept = np.where(fits, block_lengths, np.where(swap, shorter, longer))
    return np.minimum(question_kept, question), np.minimum(block_kept, block_lengths)


class PreTokenizedRetriever:
    r"""
    `RealmRetriever` without tokenization: reader inputs `[CLS] question [SEP] block [SEP]` are concatenated from the
    question's ids and the blocks' pre-tokenized wordpieces ([`tokenize_corpus`]).

    Same call signature and outputs as `RealmRetriever.__call__` (see this module's docstring for the two documented
    differences), so it can replace it in `RealmForOpenQA(config, retriever=...)`.

    Args:
        blocks ([`PreTokenizedBlocks`]): every block's wordpieces.
        tokenizer (`RealmTokenizer`): gives the `[CLS]`/`[SEP]`/`[PAD]` ids, padding side and `model_max_length`; it
            must be the tokenizer that wrote `blocks` (checked through the vocabulary size).
        block_records (*optional*): the block texts (e.g. `BlockRecords`), for pipelines that show evidence.
    """

    def __init__(self, blocks: PreTokenizedBlocks, tokenizer, block_records=None):
        if blocks.vocab_size is not None and blocks.vocab_size != len(tokenizer):
            raise ValueError(
                f"the blocks were tokenized with a vocabulary of {blocks.vocab_size} tokens "
                f"({blocks.metadata.get('tokenizer_name')!r}); the tokenizer has {len(tokenizer)}"
            )
        if block_records is not None and len(block_records) != len(blocks):
            raise ValueError(f"expected {len(blocks)} block records (one per block), received {len(block_records)}")
        self.blocks = blocks
        self.tokenizer = tokenizer
        self.block_records = block_records

    def __len__(self) -> int:
        return len(self.blocks)

    def _question_ids(self, question_input_ids) -> np.ndarray:
        row = question_input_ids[0]
        if hasattr(row, "detach"):
            row = row.detach().cpu().numpy()
        row = np.asarray(row, dtype=np.int64).reshape(-1)
        special = [self.tokenizer.cls_token_id, self.tokenizer.sep_token_id, self.tokenizer.pad_token_id]
        return row[~np.isin(row, [token for token in special if token is not None])]

    def __call__(
        self,
        retrieved_block_ids,
        question_input_ids,
        answer_ids=None,
        max_length: int | None = None,
        return_tensors: str | None = "pt",
    ):
        r"""
        Args:
            retrieved_block_ids (array-like of shape `(K,)`): block ids, best first.
            question_input_ids (array-like of shape `(1, L)`): the tokenized question, special tokens and padding
                included (they are stripped).
            answer_ids (`list[list[int]]`, *optional*): gold answers as wordpiece ids without special tokens.
            max_length (`int`, *optional*): truncate each pair to this many tokens, `longest_first` as the tokenizer
                does (`config.reader_seq_len`); defaults to the tokenizer's `model_max_length`.
            return_tensors (`str`, defaults to "pt"): tensor type of the returned encoding; `None` gives lists.

        Returns:
            `(has_answers, start_pos, end_pos, concat_inputs)`: the first three are `None` without `answer_ids`;
            `concat_inputs` holds `input_ids`, `token_type_ids`, `attention_mask` and `special_tokens_mask`, `(K, L)`.
        """
        tokenizer = self.tokenizer
        block_ids = checked_block_ids(retrieved_block_ids, len(self.blocks), "pre-tokenized blocks")
        question = self._question_ids(question_input_ids)  # (Q,)
        max_length = tokenizer.model_max_length if max_length is None else max_length
        budget = min(int(max_length), _NO_LIMIT) - 3
        if budget < 0:
            raise ValueError(f"max_length must leave room for [CLS] and two [SEP], received {max_length}")

        block_starts = np.asarray(self.blocks.offsets[block_ids])  # (K,)
        block_lengths = np.asarray(self.blocks.offsets[block_ids + 1]) - block_starts  # (K,)
        question_kept, block_kept = _longest_first_lengths(len(question), block_lengths, budget)  # (K,), (K,)
        row_lengths = question_kept + block_kept + 3  # (K,)
        seq_len = int(row_lengths.max()) if block_ids.size else 0
        # Column of each row's [CLS]: 0 on the right-padding default, the padding width on the left.
        row_start = seq_len - row_lengths if tokenizer.padding_side == "left" else np.zeros_like(row_lengths)

        column = np.arange(seq_len)[None, :] - row_start[:, None]  # (K, L) position within the pair
        first_sep = (question_kept + 1)[:, None]  # (K, 1)
        second_sep = (question_kept + 2 + block_kept)[:, None]  # (K, 1)
        in_row = (column >= 0) & (column <= second_sep)
        in_question = (column >= 1) & (column < first_sep)
        in_block = (column > first_sep) & (column < second_sep)
        is_special = (column == 0) | (column == first_sep) | (column == second_sep)

        input_ids = np.full((len(block_ids), seq_len), tokenizer.pad_token_id, dtype=np.int64)  # (K, L)
        if len(question):
            input_ids[in_question] = question[np.clip(column - 1, 0, len(question) - 1)][in_question]
        if len(self.blocks.token_ids):
            block_index = np.clip(block_starts[:, None] + column - first_sep - 1, 0, len(self.blocks.token_ids) - 1)
            input_ids[in_block] = self.blocks.token_ids[block_index[in_block]]
        input_ids[(column == 0)] = tokenizer.cls_token_id
        input_ids[in_row & ((column == first_sep) | (column == second_sep))] = tokenizer.sep_token_id

        pad_type = getattr(tokenizer, "pad_token_type_id", 0)
        token_type_ids = np.where(in_row, (column > first_sep).astype(np.int64), pad_type)
        encoded = {
            "input_ids": input_ids,
            "token_type_ids": token_type_ids,
            "attention_mask": in_row.astype(np.int64),
            "special_tokens_mask": (is_special | ~in_row).astype(np.int64),
        }
        if return_tensors is None:
            encoded = {key: value.tolist() for key, value in encoded.items()}
        encoded = BatchEncoding(encoded, tensor_type=return_tensors)
        if answer_ids is None:
            return None, None, None, encoded
        first_block_column = row_start + question_kept + 2  # (K,)
        second_sep_column = first_block_column + block_kept  # (K,)
        return (*self._find_answers(input_ids, first_block_column, second_sep_column, answer_ids), encoded)

    @staticmethod
    def _find_answers(input_ids: np.ndarray, block_begin: np.ndarray, block_end: np.ndarray, answer_ids):
        """Every occurrence of every answer starting inside each row's block, ordered as `RealmRetriever` does
        (answer by answer, then by position) and padded with -1; a match may run past the block exactly as there."""
        num_rows, seq_len = input_ids.shape
        rows, answer_index, starts, widths = [], [], [], []
        for index, answer in enumerate(answer_ids):
            answer = np.asarray([int(token) for token in answer], dtype=np.int64)
            width = len(answer)
            if width == 0 or width > seq_len:
                continue
            windows = seq_len - width + 1
            match = input_ids[:, :windows] == answer[0]  # (K, windows)
            for offset in range(1, width):
                match &= input_ids[:, offset : offset + windows] == answer[offset]
            position = np.arange(windows)[None, :]
            match &= (position >= block_begin[:, None]) & (position < block_end[:, None])
            row, start = np.nonzero(match)
            rows.append(row)
            starts.append(start)
            answer_index.append(np.full(len(row), index))
            widths.append(np.full(len(row), width))
        if rows:
            rows, answer_index, starts, widths = map(np.concatenate, (rows, answer_index, starts, widths))
        else:
            rows = answer_index = starts = widths = np.zeros(0, dtype=np.int64)
        order = np.lexsort((starts, answer_index, rows))
        rows, starts, widths = rows[order], starts[order], widths[order]
        counts = np.bincount(rows, minlength=num_rows)
        max_answers = int(counts.max()) if num_rows else 0
        # Rank of each match within its row: its index minus the index of the row's first match.
        rank = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
        start_pos = np.full((num_rows, max_answers), -1, dtype=np.int64)
        end_pos = np.full((num_rows, max_answers), -1, dtype=np.int64)
        start_pos[rows, rank] = starts
        end_pos[rows, rank] = starts + widths - 1
        return (counts > 0).tolist(), start_pos.tolist(), end_pos.tolist()

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
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import BatchEncoding
from transformers.utils import logging

from ..safetensors_format import RaggedWriter, read_ragged_header
from .interfaces import ReaderInputs
from .reader_inputs import find_answer_spans, questions_and_answers
from .retriever import checked_block_ids

logger = logging.get_logger(__name__)

__all__ = [
    "PRETOKENIZED_FORMAT",
    "PreTokenizedBlocks",
    "PreTokenizedRetriever",
    "TokenizedBlockCache",
    "blocks_holding_answer",
    "tokenize_corpus",
]

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

    def ragged(self, block_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The wordpieces of `block_ids` `(K,)` as `(token_ids, starts (K,), lengths (K,))`: block `block_ids[i]` is
        `token_ids[starts[i] : starts[i] + lengths[i]]` (here the whole memory-mapped array, nothing copied)."""
        starts = np.asarray(self.offsets[block_ids])
        return self.token_ids, starts, np.asarray(self.offsets[block_ids + 1]) - starts

    def __copy__(self) -> PreTokenizedBlocks:
        return self

    def __deepcopy__(self, memo) -> PreTokenizedBlocks:
        # Read-only and memory-mapped: a copy would only waste memory (RealmForOpenQA.from_pretrained deep-copies).
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_blocks={len(self)}, num_tokens={len(self.token_ids)}, path={self.path})"


class TokenizedBlockCache:
    """Wordpieces of block records, tokenized when a block is first retrieved and kept (up to `max_blocks`, least
    recently used first out) with their character offsets: the pre-tokenized path without a corpus-wide pass, for
    asking questions over any corpus. One tokenization gives both the reader's wordpieces and, through
    [`TokenizedBlockCache.block_offsets`], where each lies in the text (for the pipeline's answer spans).

    Args:
        block_records (`Sequence[bytes | str]`): the block texts, by block id.
        tokenizer (`RealmTokenizer`): a fast tokenizer (offsets come from its offset mapping).
        max_blocks (`int`, *optional*, defaults to 65536): blocks kept.
    """

    def __init__(self, block_records, tokenizer, max_blocks: int = 65_536):
        self.block_records = block_records
        self.tokenizer = tokenizer
        self.max_blocks = max_blocks
        self._cache: OrderedDict[int, tuple[str, np.ndarray, np.ndarray]] = OrderedDict()
        self.vocab_size = None  # the tokenizer is the one the retriever uses: nothing to check

    def __len__(self) -> int:
        return len(self.block_records)

    def _entries(self, block_ids: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]:
        missing = sorted({int(block_id) for block_id in block_ids} - self._cache.keys())
        if missing:
            if isinstance(self.block_records, (list, tuple)):
                records = [self.block_records[block_id] for block_id in missing]
            else:
                records = list(self.block_records[np.asarray(missing, dtype=np.int64)])
            texts = [_text(record) for record in records]
            encoded = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True,
                                     return_attention_mask=False, return_token_type_ids=False)  # fmt: skip
            for block_id, text, ids, offsets in zip(
                missing, texts, encoded["input_ids"], encoded["offset_mapping"], strict=True
            ):
                self._cache[block_id] = (
                    text,
                    np.asarray(ids, dtype=np.int64),
                    np.asarray(offsets, dtype=np.int64).reshape(-1, 2),
                )
        entries = []
        for block_id in block_ids:
            block_id = int(block_id)
            self._cache.move_to_end(block_id)
            entries.append(self._cache[block_id])
        while len(self._cache) > self.max_blocks:
            self._cache.popitem(last=False)
        return entries

    def ragged(self, block_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As [`PreTokenizedBlocks.ragged`]: `(token_ids, starts (K,), lengths (K,))` of `block_ids` `(K,)`."""
        pieces = [ids for _, ids, _ in self._entries(block_ids)]
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        token_ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        return token_ids, starts, lengths

    def block_offsets(self, block_id: int) -> tuple[str, np.ndarray]:
        """`(text, offsets)`: block `block_id`'s text and the `(start, end)` characters of each of its wordpieces."""
        text, _, offsets = self._entries(np.asarray([block_id]))[0]
        return text, offsets

    def __copy__(self) -> TokenizedBlockCache:
        return self

    def __deepcopy__(self, memo) -> TokenizedBlockCache:
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_blocks={len(self)}, cached={len(self._cache)})"


def _text(record) -> str:
    return record.decode("utf-8") if isinstance(record, (bytes, bytearray)) else str(record)


# ---------------------------------------------------------------------------------------------------------------------
# the retriever


def _longest_first_lengths(
    question_length: np.ndarray, block_lengths: np.ndarray, budget: int
) -> tuple[np.ndarray, ...]:
    """The lengths the Rust tokenizer's `longest_first` pair truncation keeps, vectorised over rows.

    `budget` is `max_length` less the three special tokens. As in `tokenizers`' `truncate_encodings`: if the pair
    fits, nothing is cut; else the shorter side (n1) keeps its length when it fits, the longer side gets the rest but
    never less than n1; if the two still do not fit, the shorter side gets `budget // 2` and the longer the remainder.
    On equal lengths the question counts as the shorter side.
    """
    question = np.broadcast_to(np.asarray(question_length, dtype=np.int64), block_lengths.shape)
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


def blocks_holding_answer(token_ids: np.ndarray, starts: np.ndarray, lengths: np.ndarray, answer_ids) -> np.ndarray:
    """Whether block `i`, `token_ids[starts[i] : starts[i] + lengths[i]]`, holds some gold answer wholly inside it:
    `find_answer_spans`'s `has_answers` for rows built from these blocks, whose matches start inside the block (and
    end there too, unless an answer holds a special token), without building the rows.

    Args:
        token_ids (`np.ndarray`): wordpieces, e.g. the memory-mapped corpus of [`PreTokenizedBlocks`].
        starts, lengths (`np.ndarray` of shape `(K,)`): where each block lies in `token_ids`.
        answer_ids (`list[list[int]]`): the gold answers as wordpiece ids; empty answers are skipped.

    Returns:
        `np.ndarray[bool]` of shape `(K,)`.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    found = np.zeros(len(lengths), dtype=bool)
    # The K blocks side by side in one array: block i at [bounds[i], bounds[i + 1]).
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    total = int(bounds[-1])
    flat = np.asarray(token_ids[np.arange(total) - np.repeat(bounds[:-1] - np.asarray(starts), lengths)], np.int64)
    for answer in answer_ids:
        answer = np.asarray([int(token) for token in answer], dtype=np.int64)
        width = len(answer)
        if width == 0 or width > total:
            continue
        windows = total - width + 1
        match = flat[:windows] == answer[0]
        for offset in range(1, width):
            match &= flat[offset : offset + windows] == answer[offset]
        position = np.flatnonzero(match)
        block = np.searchsorted(bounds, position, side="right") - 1
        found[block[position + width <= bounds[block + 1]]] = True
    return found


class PreTokenizedRetriever:
    r"""
    `RealmRetriever` without tokenization: reader inputs `[CLS] question [SEP] block [SEP]` are concatenated from the
    question's ids and the blocks' wordpieces, a whole batch of questions at once; the question is never decoded.

    Same call signature and outputs as `RealmRetriever.__call__` and `.retrieve` (see this module's docstring for the
    two documented differences), so it can replace it in `RealmForOpenQA(config, retriever=...)`.

    Args:
        blocks ([`PreTokenizedBlocks`] or [`TokenizedBlockCache`]): every block's wordpieces, from a file written by
            [`tokenize_corpus`] or tokenized as blocks are retrieved.
        tokenizer (`RealmTokenizer`): gives the `[CLS]`/`[SEP]`/`[PAD]` ids, padding and truncation sides and
            `model_max_length`; it must be the tokenizer that wrote `blocks` (checked through the vocabulary size).
        block_records (*optional*): the block texts (e.g. `BlockRecords`), for pipelines that show evidence; defaults
            to those of a [`TokenizedBlockCache`].
    """

    def __init__(self, blocks: PreTokenizedBlocks | TokenizedBlockCache, tokenizer, block_records=None):
        if blocks.vocab_size is not None and blocks.vocab_size != len(tokenizer):
            raise ValueError(
                f"the blocks were tokenized with a vocabulary of {blocks.vocab_size} tokens "
                f"({blocks.metadata.get('tokenizer_name')!r}); the tokenizer has {len(tokenizer)}"
            )
        if block_records is None and isinstance(blocks, TokenizedBlockCache):
            block_records = blocks.block_records
        if block_records is not None and len(block_records) != len(blocks):
            raise ValueError(f"expected {len(blocks)} block records (one per block), received {len(block_records)}")
        self.blocks = blocks
        self.tokenizer = tokenizer
        self.block_records = block_records

    @classmethod
    def from_block_records(cls, block_records, tokenizer, max_cached_blocks: int = 65_536) -> PreTokenizedRetriever:
        """A retriever over block texts that tokenizes each block once, when first retrieved ([`TokenizedBlockCache`])."""
        return cls(TokenizedBlockCache(block_records, tokenizer, max_cached_blocks), tokenizer, block_records)

    def __len__(self) -> int:
        return len(self.blocks)

    def block_offsets(self, block_id: int) -> tuple[str, np.ndarray]:
        """`(text, offsets)` of a block from the tokenization that built its reader inputs (the [`BlockOffsets`]
        interface); blocks from a [`tokenize_corpus`] file are tokenized here, as they hold no offsets."""
        if isinstance(self.blocks, TokenizedBlockCache):
            return self.blocks.block_offsets(block_id)
        text = _text(self.block_records[int(block_id)])
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return text, np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)

    def _question_ids(self, question_row) -> np.ndarray:
        if hasattr(question_row, "detach"):
            question_row = question_row.detach().cpu().numpy()
        row = np.asarray(question_row, dtype=np.int64).reshape(-1)
        special = [self.tokenizer.cls_token_id, self.tokenizer.sep_token_id, self.tokenizer.pad_token_id]
        return row[~np.isin(row, [token for token in special if token is not None])]

    def __call__(
        self,
        retrieved_block_ids,
        question_input_ids,
        answer_ids=None,
        max_length: int | None = None,
        return_tensors: str | None = "pt",
    ) -> ReaderInputs:
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
            [`ReaderInputs`] `(has_answers, start_pos, end_pos, concat_inputs)`: the first three are `None` without
            `answer_ids`; `concat_inputs` holds `input_ids`, `token_type_ids`, `attention_mask` and
            `special_tokens_mask`, `(K, L)`.
        """
        block_ids = checked_block_ids(retrieved_block_ids, len(self.blocks), "pre-tokenized blocks")
        rows = self._rows(block_ids, self._question_ids(question_input_ids[0]), max_length)
        encoded = rows["encoding"]
        if return_tensors is None:
            encoded = {key: value.tolist() for key, value in encoded.items()}
        encoded = BatchEncoding(encoded, tensor_type=return_tensors)
        if answer_ids is None:
            return ReaderInputs(None, None, None, encoded)
        spans = find_answer_spans(rows["encoding"]["input_ids"], rows["block_begin"], rows["block_end"], answer_ids)
        return ReaderInputs(*spans, encoded)

    def retrieve(
        self,
        block_ids,
        question_input_ids,
        answer_ids: list | None = None,
        max_length: int | None = None,
        num_read: int | None = None,
    ) -> ReaderInputs:
        r"""
        The batched [`Retriever`] call: block ids `(B, K)` and questions `(B, L)` (special tokens and padding are
        stripped) to reader inputs `(B, R, L)` of the first `num_read` blocks (all `K` when `None`), with
        `has_answers` `(B, K)` and answer positions `(B, R, A)` when `answer_ids` (one list per question) is given.
        Only the `R` blocks read get reader rows; whether the other `K - R` hold an answer is found on their wordpieces
        (the ORQA recipe reads 5 of 5000 blocks, and building 5000 rows per question was most of a training step's
        retrieval time).
        """
        block_ids, questions, answers = questions_and_answers(block_ids, question_input_ids, answer_ids)
        batch_size, num_blocks = block_ids.shape
        flat_ids = checked_block_ids(block_ids.numpy(), len(self.blocks), "pre-tokenized blocks")
        question_rows = [self._question_ids(questions[index]) for index in range(batch_size)]
        with_answers = answers[0] is not None
        # Reader rows of the blocks read only: the K - R others need no row, only whether they hold an answer, found
        # on their wordpieces directly (`_unread_have_answer`). An answer holding a special token could match across
        # a row's [SEP] as in 4.x's `block_has_answer`; then every block gets its row, as there.
        read = num_blocks if num_read is None else min(num_read, num_blocks)
        if with_answers and read < num_blocks and self._answers_hold_special_tokens(answers):
            read = num_blocks
        kept = flat_ids.reshape(batch_size, num_blocks)[:, :read].reshape(-1)
        rows = self._rows(kept, question_rows, max_length, repeat=read)
        encoding = {key: torch.from_numpy(value).view(batch_size, read, -1) for key, value in rows["encoding"].items()}
        num_read = read if num_read is None else min(num_read, read)
        concat_inputs = {key: value[:, :num_read] for key, value in encoding.items()}
        if self.tokenizer.padding_side != "left":
            # The rows were padded to the longest of all K; the R read may need fewer columns.
            used = concat_inputs["attention_mask"].flatten(0, 1).bool().any(0).nonzero()
            seq_len = int(used.max()) + 1 if used.numel() else 0
            concat_inputs = {key: value[..., :seq_len] for key, value in concat_inputs.items()}
        if not with_answers:
            return ReaderInputs(None, None, None, concat_inputs)
        has_answers, start_pos, end_pos = [], [], []
        input_ids = rows["encoding"]["input_ids"].reshape(batch_size, read, -1)
        begin = rows["block_begin"].reshape(batch_size, read)
        end = rows["block_end"].reshape(batch_size, read)
        unread = flat_ids.reshape(batch_size, num_blocks)[:, read:]
        for index in range(batch_size):
            found, starts, ends = find_answer_spans(input_ids[index], begin[index], end[index], answers[index])
            if unread.shape[1]:
                found = found + self._unread_have_answer(unread[index], question_rows[index], answers[index],
                                                         max_length).tolist()  # fmt: skip
            has_answers.append(torch.tensor(found, dtype=torch.bool))
            start_pos.append(torch.tensor(starts, dtype=torch.long).view(read, -1)[:num_read])
            end_pos.append(torch.tensor(ends, dtype=torch.long).view(read, -1)[:num_read])
        max_answers = max(row.shape[-1] for row in start_pos)
        pad = [nn.functional.pad(row, (0, max_answers - row.shape[-1]), value=-1) for row in start_pos]
        pad_end = [nn.functional.pad(row, (0, max_answers - row.shape[-1]), value=-1) for row in end_pos]
        return ReaderInputs(torch.stack(has_answers), torch.stack(pad), torch.stack(pad_end), concat_inputs)

    def _answers_hold_special_tokens(self, answers: list) -> bool:
        special = {self.tokenizer.cls_token_id, self.tokenizer.sep_token_id, self.tokenizer.pad_token_id} - {None}
        return any(int(token) in special for question in answers for answer in question for token in answer)

    def _pair_budget(self, max_length: int | None) -> int:
        """Wordpieces of question + block a row may hold: `max_length` (default: the tokenizer's) less the three
        special tokens."""
        return min(int(self.tokenizer.model_max_length if max_length is None else max_length), _NO_LIMIT) - 3

    def _unread_have_answer(self, block_ids: np.ndarray, question: np.ndarray, answer_ids, max_length) -> np.ndarray:
        """Whether each block `(K,)` holds a gold answer in the part of it that its reader row would keep (the same
        truncation as `_rows`), from the blocks' wordpieces without building the rows."""
        budget = self._pair_budget(max_length)
        token_ids, starts, lengths = self.blocks.ragged(block_ids)
        _, kept = _longest_first_lengths(np.int64(len(question)), lengths, budget)
        if self.tokenizer.truncation_side == "left":
            starts = starts + lengths - kept
        return blocks_holding_answer(token_ids, starts, kept, answer_ids)

    def _rows(self, block_ids: np.ndarray, questions, max_length: int | None, repeat: int | None = None) -> dict:
        """`[CLS] question [SEP] block [SEP]` rows for `block_ids` `(N,)`: one question for all (`questions` an
        array), or `questions[i]` for rows `i * repeat .. (i + 1) * repeat - 1` (a list of arrays). Returns the
        encoding (numpy, `(N, L)`) and each row's block columns `[block_begin, block_end)`."""
        tokenizer = self.tokenizer
        budget = self._pair_budget(max_length)
        if budget < 0:
            raise ValueError(f"max_length must leave room for [CLS] and two [SEP], received {budget + 3}")
        if repeat is None:
            questions = [questions]
            repeat = len(block_ids)
        question_lengths = np.repeat(np.fromiter(map(len, questions), dtype=np.int64, count=len(questions)), repeat)
        question_tokens = np.concatenate([np.asarray(question, dtype=np.int64) for question in questions] or [[]])
        question_starts = np.repeat(np.concatenate([[0], np.cumsum(question_lengths[::repeat])[:-1]]), repeat)
        question_starts = question_starts.astype(np.int64)
        left_truncation = tokenizer.truncation_side == "left"

        block_tokens, block_starts, block_lengths = self.blocks.ragged(block_ids)  # (T,), (N,), (N,)
        question_kept, block_kept = _longest_first_lengths(question_lengths, block_lengths, budget)  # (N,), (N,)
        if left_truncation:  # the tokenizer keeps the last wordpieces of each side
            question_starts = question_starts + question_lengths - question_kept
            block_starts = block_starts + block_lengths - block_kept
        row_lengths = question_kept + block_kept + 3  # (N,)
        seq_len = int(row_lengths.max()) if len(block_ids) else 0
        # Column of each row's [CLS]: 0 on the right-padding default, the padding width on the left.
        row_start = seq_len - row_lengths if tokenizer.padding_side == "left" else np.zeros_like(row_lengths)

        column = np.arange(seq_len)[None, :] - row_start[:, None]  # (N, L) position within the pair
        first_sep = (question_kept + 1)[:, None]  # (N, 1)
        second_sep = (question_kept + 2 + block_kept)[:, None]  # (N, 1)
        in_row = (column >= 0) & (column <= second_sep)
        in_question = (column >= 1) & (column < first_sep)
        in_block = (column > first_sep) & (column < second_sep)
        is_special = (column == 0) | (column == first_sep) | (column == second_sep)

        input_ids = np.full((len(block_ids), seq_len), tokenizer.pad_token_id, dtype=np.int64)  # (N, L)
        if len(question_tokens):
            question_index = np.clip(question_starts[:, None] + column - 1, 0, len(question_tokens) - 1)
            input_ids[in_question] = question_tokens[question_index[in_question]]
        if len(block_tokens):
            block_index = np.clip(block_starts[:, None] + column - first_sep - 1, 0, len(block_tokens) - 1)
            input_ids[in_block] = block_tokens[block_index[in_block]]
        input_ids[(column == 0)] = tokenizer.cls_token_id
        input_ids[in_row & ((column == first_sep) | (column == second_sep))] = tokenizer.sep_token_id

        pad_type = getattr(tokenizer, "pad_token_type_id", 0)
        token_type_ids = np.where(in_row, (column > first_sep).astype(np.int64), pad_type)
        first_block_column = row_start + question_kept + 2  # (N,)
        return {
            "encoding": {
                "input_ids": input_ids,
                "token_type_ids": token_type_ids,
                "attention_mask": in_row.astype(np.int64),
                "special_tokens_mask": (is_special | ~in_row).astype(np.int64),
            },
            "block_begin": first_block_column,
            "block_end": first_block_column + block_kept,
        }

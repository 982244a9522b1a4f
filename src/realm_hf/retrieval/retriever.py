"""RealmRetriever: turns retrieved block ids into reader inputs (question + block pairs) and answer-span labels."""

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
from transformers import AutoTokenizer, BatchEncoding
from transformers.utils import logging

from ..checkpoints import HUB_KWARGS
from .block_records import load_block_records, save_block_records
from .interfaces import ReaderInputs
from .reader_inputs import find_answer_spans, questions_and_answers, stack_reader_inputs

logger = logging.get_logger(__name__)

BLOCK_RECORDS_NAME = "block_records.safetensors"
LEGACY_BLOCK_RECORDS_NAME = "block_records.npy"


def checked_block_ids(retrieved_block_ids, num_blocks: int, source: str) -> np.ndarray:
    """The retrieved ids as a 1-D int64 array, after checking that they lie in `[0, num_blocks)` (the range of the
    `source`, e.g. "block records"); shared by the retrievers that turn ids into reader inputs."""
    block_ids = np.atleast_1d(np.asarray(retrieved_block_ids, dtype=np.int64)).reshape(-1)
    if block_ids.size and (block_ids.min() < 0 or block_ids.max() >= num_blocks):
        raise ValueError(
            f"retrieved block ids must lie in [0, {num_blocks}), the {source}' range; got ids from {block_ids.min()} "
            f"to {block_ids.max()}. Does the model's num_block_records match the {source}?"
        )
    return block_ids


class RealmRetriever:
    r"""
    Pairs a question with each retrieved block and finds where the gold answers occur, for `RealmForOpenQA`.

    Args:
        block_records (`Sequence[bytes | str]`): the text of every block, indexed by block id (a numpy object array,
            a `BlockRecords` memory map, or a list).
        tokenizer (`RealmTokenizer`): tokenizes `[CLS] question [SEP] block [SEP]`.
    """

    def __init__(self, block_records: Sequence, tokenizer):
        self.block_records = block_records
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.block_records)

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
            question_input_ids (array-like of shape `(1, L)`): the tokenized question; it is decoded and re-tokenized
                with each block, as in transformers 4.x.
            answer_ids (`list[list[int]]`, *optional*): gold answers as wordpiece ids without special tokens.
            max_length (`int`, *optional*): truncate each pair to this many tokens (`config.reader_seq_len`).
            return_tensors (`str`, defaults to "pt"): tensor type of the returned encoding.

        Returns:
            [`ReaderInputs`] `(has_answers, start_pos, end_pos, concat_inputs)`: the first three are `None` without
            `answer_ids`; `concat_inputs` holds `input_ids`, `token_type_ids`, `attention_mask` and
            `special_tokens_mask`, `(K, L)`.
        """
        block_ids = checked_block_ids(retrieved_block_ids, len(self.block_records), "block records")
        if isinstance(self.block_records, (list, tuple)):
            blocks = [self.block_records[int(block_id)] for block_id in block_ids]
        else:
            # numpy arrays, BlockRecords and document stores take all ids at once (one read instead of K).
            blocks = list(self.block_records[block_ids])
        question_row = question_input_ids[0]
        question_row = question_row.tolist() if hasattr(question_row, "tolist") else list(question_row)
        question = self.tokenizer.decode(question_row, skip_special_tokens=True)
        texts = [block.decode() if isinstance(block, bytes) else str(block) for block in blocks]

        concat_inputs = self.tokenizer(
            [question] * len(texts),
            texts,
            padding=True,
            truncation=True,
            return_special_tokens_mask=True,
            max_length=max_length,
        )
        encoded = BatchEncoding(dict(concat_inputs), tensor_type=return_tensors)
        if answer_ids is None:
            return ReaderInputs(None, None, None, encoded)
        return ReaderInputs(*self.block_has_answer(concat_inputs, answer_ids), encoded)

    def retrieve(
        self,
        block_ids,
        question_input_ids,
        answer_ids: list | None = None,
        max_length: int | None = None,
        num_read: int | None = None,
    ) -> ReaderInputs:
        r"""
        The batched [`Retriever`] call: block ids `(B, K)` and questions `(B, L)` to reader inputs `(B, R, L)`
        (the first `num_read` blocks; all when `None`), with `has_answers` `(B, K)` and answer positions `(B, R, A)`
        when `answer_ids` (one list of answers per question) is given. Each question goes through `__call__`, so
        the reader inputs are exactly transformers 4.x's.
        """
        block_ids, questions, answers = questions_and_answers(block_ids, question_input_ids, answer_ids)
        per_question = [
            self(block_ids[index], questions[index : index + 1], answers[index], max_length=max_length)
            for index in range(block_ids.shape[0])
        ]
        return stack_reader_inputs(per_question, num_read)

    def block_has_answer(self, concat_inputs, answer_ids) -> tuple[list[bool], list[list[int]], list[list[int]]]:
        """Finds every occurrence of every answer starting inside each row's block (between its two `[SEP]`s).

        Returns `(has_answers, start_pos, end_pos)` as Python lists; positions are padded with -1 to the largest
        number of matches in any row.
        """
        input_ids = np.asarray(concat_inputs["input_ids"], dtype=np.int64).reshape(len(concat_inputs["input_ids"]), -1)
        is_sep = input_ids == self.tokenizer.sep_token_id  # (K, L)
        first_sep = is_sep.argmax(axis=1)
        after_first = np.arange(input_ids.shape[1])[None, :] > first_sep[:, None]
        second_sep = (is_sep & after_first).argmax(axis=1)
        return find_answer_spans(input_ids, first_sep + 1, second_sep, answer_ids)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *init_inputs, **kwargs):
        r"""
        Loads the block records and the tokenizer from a local directory or a Hub repo id.

        Reads our pickle-free `block_records.safetensors` when present, else the Hub's pickled `block_records.npy`
        through a restricted loader that accepts only arrays of bytes or str and executes nothing else.

        Args:
            pretrained_model_name_or_path (`str` or `os.PathLike`): a directory or a repo id such as
                "google/realm-orqa-nq-openqa".
            tokenizer (*optional*): a tokenizer to use instead of loading one from the same place.
            **kwargs: Hub options (`revision`, `cache_dir`, `token`, ...) and tokenizer options.
        """
        tokenizer = kwargs.pop("tokenizer", None)
        hub_kwargs = {key: kwargs[key] for key in HUB_KWARGS if key in kwargs}
        records_path = _resolve_block_records(str(pretrained_model_name_or_path), hub_kwargs)
        block_records = load_block_records(records_path)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(pretrained_model_name_or_path, *init_inputs, **kwargs)
        return cls(block_records=block_records, tokenizer=tokenizer)

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Writes `block_records.safetensors` (no pickle) and the tokenizer files to `save_directory`."""
        save_directory = Path(save_directory)
        save_directory.mkdir(parents=True, exist_ok=True)
        save_block_records(self.block_records, save_directory / BLOCK_RECORDS_NAME)
        self.tokenizer.save_pretrained(save_directory)


def _resolve_block_records(name_or_path: str, hub_kwargs: dict) -> str:
    if os.path.isdir(name_or_path):
        directory = Path(name_or_path) / hub_kwargs.get("subfolder", "")
        for filename in (BLOCK_RECORDS_NAME, LEGACY_BLOCK_RECORDS_NAME):
            if (directory / filename).is_file():
                return str(directory / filename)
        raise FileNotFoundError(
            f"{directory} holds no block records: expected {BLOCK_RECORDS_NAME} or {LEGACY_BLOCK_RECORDS_NAME}."
        )
    errors = []
    for filename in (BLOCK_RECORDS_NAME, LEGACY_BLOCK_RECORDS_NAME):
        try:
            return hf_hub_download(repo_id=name_or_path, filename=filename, **hub_kwargs)
        except (EntryNotFoundError, LocalEntryNotFoundError) as error:
            errors.append(f"{filename}: {type(error).__name__}")
    raise FileNotFoundError(
        f"{name_or_path!r} has no block records ({'; '.join(errors)}). Checkpoints such as "
        "google/realm-cc-news-pretrained-openqa ship none: build records for your own corpus and pass "
        "RealmRetriever(block_records, tokenizer)."
    )


__all__ = ["BLOCK_RECORDS_NAME", "LEGACY_BLOCK_RECORDS_NAME", "RealmRetriever"]

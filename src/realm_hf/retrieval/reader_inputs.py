"""What both retrievers share: finding the gold answers in reader inputs, and stacking per-question reader inputs into
one batch.

Dimension names: B questions, K blocks retrieved per question, R blocks read (the first R of K), L tokens, A matches.
"""

import numpy as np
import torch
from torch import nn

from .interfaces import ReaderInputs

# Pad values of the reader-input keys: a padded row is all padding, marked special.
READER_INPUT_PAD = {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0, "special_tokens_mask": 1}


def find_answer_spans(
    input_ids: np.ndarray, block_begin: np.ndarray, block_end: np.ndarray, answer_ids
) -> tuple[list[bool], list[list[int]], list[list[int]]]:
    """Every occurrence of every gold answer that starts inside each row's block, as transformers 4.x's
    `block_has_answer` finds them: answer by answer, then by position, padded with -1 to the most matches of any row.
    A match may run past the block (into its `[SEP]`), exactly as there.

    Args:
        input_ids (`np.ndarray` of shape `(K, L)`): the reader inputs.
        block_begin, block_end (`np.ndarray` of shape `(K,)`): each row's block tokens are `[begin, end)`.
        answer_ids (`list[list[int]]`): the gold answers as wordpiece ids; empty answers are skipped.

    Returns:
        `(has_answers (K,), start_pos (K, A), end_pos (K, A))` as Python lists; end positions are inclusive.
    """
    input_ids = np.asarray(input_ids, dtype=np.int64)
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


def questions_and_answers(block_ids, question_input_ids, answer_ids) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Checks a batched retriever call: block ids `(B, K)`, questions `(B, L)`, answers `None` or one list per
    question. Returns them as CPU tensors and a list of `B` answer lists (`None` each without answers)."""
    block_ids = torch.as_tensor(block_ids, dtype=torch.long).cpu()
    questions = torch.as_tensor(question_input_ids).cpu()
    if block_ids.dim() != 2 or questions.dim() != 2 or block_ids.shape[0] != questions.shape[0]:
        raise ValueError(
            f"a batched retriever call takes block ids (B, K) and questions (B, L) with the same B, received block ids "
            f"of shape {tuple(block_ids.shape)} and questions of shape {tuple(questions.shape)}."
        )
    if answer_ids is None:
        return block_ids, questions, [None] * block_ids.shape[0]
    answers = list(answer_ids)
    if len(answers) != block_ids.shape[0]:
        raise ValueError(f"expected one list of answers per question ({block_ids.shape[0]}), received {len(answers)}.")
    return block_ids, questions, answers


def stack_reader_inputs(per_question: list[ReaderInputs], num_read: int | None = None) -> ReaderInputs:
    """Stacks per-question [`ReaderInputs`] (each `(K, L_i)`) into one batch: reader inputs `(B, R, L)` of the first
    `num_read` blocks (all when `None`), padded to the longest used length; `has_answers` `(B, K)` for every block;
    answer positions `(B, R, A)` padded with -1. Labels stay `None` when the questions had no answers.

    Only the blocks the reader reads are stacked: in training K is `searcher_beam_size` (5000), and padding 5000 rows
    per question to one length would move hundreds of MB per step for nothing."""
    rows_kept = slice(None) if num_read is None else slice(0, num_read)
    encodings = [
        {key: torch.as_tensor(result.concat_inputs[key])[rows_kept] for key in READER_INPUT_PAD}
        for result in per_question
    ]
    seq_len = max(_used_length(encoding["attention_mask"]) for encoding in encodings)
    concat_inputs = {
        key: torch.stack([fit_length(encoding[key], seq_len, pad_value) for encoding in encodings])
        for key, pad_value in READER_INPUT_PAD.items()
    }
    if per_question[0].has_answers is None:
        return ReaderInputs(None, None, None, concat_inputs)
    has_answers = torch.stack([torch.as_tensor(result.has_answers, dtype=torch.bool) for result in per_question])
    positions = []
    for field in ("start_pos", "end_pos"):
        rows = [torch.as_tensor(getattr(result, field), dtype=torch.long)[rows_kept] for result in per_question]
        rows = [row if row.dim() == 2 else row.view(row.shape[0], 0) for row in rows]
        max_answers = max(row.shape[-1] for row in rows)
        positions.append(
            torch.stack([nn.functional.pad(row, (0, max_answers - row.shape[-1]), value=-1) for row in rows])
        )  # (B, R, A)
    return ReaderInputs(has_answers, *positions, concat_inputs)


def _used_length(attention_mask: torch.Tensor) -> int:
    """Columns up to the last one any row attends to (with left padding: all of them)."""
    used = attention_mask.bool().any(0).nonzero()
    return int(used.max()) + 1 if used.numel() else 0


def fit_length(rows: torch.Tensor, length: int, pad_value: int) -> torch.Tensor:
    """`(..., L0)` rows padded, or cut where only padding columns are cut, to `(..., length)`."""
    if rows.shape[-1] >= length:
        return rows[..., :length]
    return nn.functional.pad(rows, (0, length - rows.shape[-1]), value=pad_value)


__all__ = ["READER_INPUT_PAD", "find_answer_spans", "fit_length", "questions_and_answers", "stack_reader_inputs"]

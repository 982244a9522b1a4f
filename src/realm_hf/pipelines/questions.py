"""Question checks shared by the "open-qa" pipeline and `realm-hf ask`: one place says what a question must be."""

from transformers.utils import logging

from ..errors import InputError

logger = logging.get_logger(__name__)


def question_problem(question) -> str | None:
    """Why `question` cannot be asked (one line, naming what was expected and what was received), or `None`."""
    if not isinstance(question, str):
        return f"expected a question as str, received {type(question).__name__}: {question!r:.80}"
    if not question.strip():
        return (
            f"expected a question, received {'an empty string' if not question else f'only whitespace {question!r}'}"
        )
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as error:
        # A lone surrogate: what Python makes of bytes that are not UTF-8 in a command-line argument or a file read
        # with errors="surrogateescape".
        return (
            f"expected Unicode text, received a lone surrogate {question[error.start]!r} at character {error.start} "
            f"of {question!r:.80} (bytes that are not UTF-8?)"
        )
    if not any(character.isalnum() for character in question):
        return f"expected a question in words, received only punctuation or symbols: {question!r:.80}"
    return None


def check_question(question, name: str = "the question") -> str:
    """`question` if it can be asked; else `TypeError` (not a str) or `InputError` (a `ValueError`) naming `name`."""
    problem = question_problem(question)
    if problem is None:
        return question
    if not isinstance(question, str):
        raise TypeError(f"{name}: {problem}")
    raise InputError(f"{name}: {problem}")


def encode_question(tokenizer, question: str, max_length: int, return_tensors: str | None = "pt"):
    """Tokenizes `question` truncated to `max_length` tokens, with a warning when it was longer (the end is dropped)."""
    encoded = tokenizer(question, truncation=True, max_length=max_length, return_tensors=return_tensors)
    kept = encoded["input_ids"].shape[-1] if return_tensors else len(encoded["input_ids"])
    if kept >= max_length:  # only then can it have been cut: count the full length once
        full = len(tokenizer(question, truncation=False, verbose=False)["input_ids"])
        if full > max_length:
            logger.warning(
                f"question of {full} tokens truncated to {max_length} (the model's question length): {question!r:.60}"
            )
    return encoded


__all__ = ["check_question", "encode_question", "question_problem"]

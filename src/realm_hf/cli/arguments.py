"""Helpers shared by the `realm-hf` subcommands: argparse types and the finished-run check."""

import argparse
import json
from pathlib import Path


def _int_at_least(value: str, minimum: int, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
    return number


def positive_int(value: str) -> int:
    """An integer >= 1, or an argparse error that names what was received."""
    return _int_at_least(value, 1, "a positive integer")


def non_negative_int(value: str) -> int:
    """An integer >= 0, or an argparse error that names what was received."""
    return _int_at_least(value, 0, "an integer >= 0")


def non_negative_float(value: str) -> float:
    """A finite number >= 0, or an argparse error that names what was received."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}")
    return number


def finished_run(results_path: Path, max_steps: int) -> bool:
    """Whether `results_path` (the summary a finished `realm-hf train`/`pretrain` run writes) reports `max_steps`
    steps or more. Resuming a Trainer from a checkpoint already at `max_steps` would run one more step (transformers
    5.23), so the commands stop early instead, saying so."""
    if not results_path.is_file():
        return False
    done = json.loads(results_path.read_text(encoding="utf-8")).get("global_step", 0) >= max_steps
    if done:
        print(f"{results_path.parent} already holds a finished run of {max_steps} steps ({results_path.name}); nothing "
              "to do (--no-resume starts afresh).")  # fmt: skip
    return done

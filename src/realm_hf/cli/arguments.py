"""Helpers shared by the `realm-hf` subcommands: argparse types and the finished-run check."""

import argparse
import json
import math
from pathlib import Path


def _number_at_least(value: str, parse, minimum: int, what: str):
    """`parse(value)` if it is a finite number >= `minimum`, else an argparse error that names what was received."""
    try:
        number = parse(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
    if not minimum <= number < math.inf:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
    return number


def positive_int(value: str) -> int:
    """An integer >= 1, or an argparse error that names what was received."""
    return _number_at_least(value, int, 1, "a positive integer")


def non_negative_int(value: str) -> int:
    """An integer >= 0, or an argparse error that names what was received."""
    return _number_at_least(value, int, 0, "an integer >= 0")


def non_negative_float(value: str) -> float:
    """A finite number >= 0, or an argparse error that names what was received."""
    return _number_at_least(value, float, 0, "a number >= 0")


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

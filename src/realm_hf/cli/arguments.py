"""Helpers shared by the `realm-hf` subcommands: argparse types and the finished-run check."""

import argparse
import json
from pathlib import Path


def positive_int(value: str) -> int:
    """An integer >= 1, or an argparse error that names what was received."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
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

"""Helpers shared by the `realm-hf` subcommands: the parser class, argparse types and the finished-run check. Imports
nothing heavy: every parser is declared, and `--help` answered, before torch or Transformers load."""

import argparse
import json
import math
import os
from pathlib import Path


class RealmHfArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line usage error (`PROG: error: MESSAGE (see `PROG --help`)`, exit code 2) and a
    `--debug` option on every (sub)command: show the traceback of a failure instead of one line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # SUPPRESS: a subcommand that is not given --debug leaves the top-level value alone.
        self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help="on failure, show the full traceback (also: REALM_HF_DEBUG=1)")  # fmt: skip

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def model_location(value: str) -> str:
    """`value` if it can name a model: an existing directory, or something shaped like a Hub repo id (`name` or
    `owner/name`). A path that does not exist raises `MissingFileError` naming it, rather than the Hub client's
    "Repo id must be in the form ..."."""
    from realm_hf.errors import MissingFileError

    if os.path.exists(value):
        if not os.path.isdir(value):
            raise MissingFileError(f"--model {value!r} is a file; expected a model directory or a Hub repo id")
        return value
    # A Hub repo id is `name` or `owner/name`; anything else that does not exist was meant as a directory.
    looks_like_path = os.path.isabs(value) or value.startswith((".", "~")) or value.count("/") > 1 or "\\" in value
    if looks_like_path:
        raise MissingFileError(f"--model {value!r}: no such directory (expected a model directory or a Hub repo id)")
    return value


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

"""The code of another git revision, for benchmarks that time today's code against it in the same run."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def baseline_tree(rev: str, paths: tuple[str, ...] = ("src",)) -> Iterator[Path]:
    """`paths` of revision `rev` (`git archive`) in a temporary directory, removed afterwards. Run the baseline there
    in a subprocess with `PYTHONPATH=<tree>/src`, so that it imports its own `realm_hf`."""
    with tempfile.TemporaryDirectory(prefix="realm-baseline-") as tree:
        archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", rev, *paths], check=True,
                                 capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        yield Path(tree)

"""How long `realm-hf --help` (and a usage error) take: the old entry point against the new one, in the same run.

The old console script named `realm_hf.cli.main:main`, so Python ran `realm_hf/__init__.py` (torch, Transformers,
registration) before argparse saw the command line; `python -m realm_hf.cli` still takes that path. The new console
script names `realm_hf_cli:main`, which parses first and imports the package only when a command runs.

    python benchmarks/cli_startup.py [--repeats 5]

Prints the median wall time of each over `--repeats` fresh interpreters, and the ratio.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SOURCE = str(Path(__file__).resolve().parents[1] / "src")

CASES = [
    ("--help", "old: python -m realm_hf.cli --help", [sys.executable, "-m", "realm_hf.cli", "--help"]),
    ("--help", "new: python -m realm_hf_cli --help", [sys.executable, "-m", "realm_hf_cli", "--help"]),
    ("usage error", "old: realm_hf.cli ask --top-k 0 q", [sys.executable, "-m", "realm_hf.cli", "ask", "--top-k", "0", "q"]),
    ("usage error", "new: realm_hf_cli ask --top-k 0 q", [sys.executable, "-m", "realm_hf_cli", "ask", "--top-k", "0", "q"]),
]  # fmt: skip


def wall_time(command: list[str]) -> float:
    environment = dict(os.environ, PYTHONPATH=SOURCE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    # Interleaved, so that a change in machine load hits old and new alike.
    times = {label: [] for _, label, _ in CASES}
    for _ in range(repeats):
        for _, label, command in CASES:
            times[label].append(wall_time(command))
    print(f"median of {repeats} fresh interpreters, {sys.executable}\n")
    print(f"| {'command':<36} | {'median s':>8} | {'min s':>6} | {'new / old':>9} |")
    print(f"|{'-' * 38}|{'-' * 10}|{'-' * 8}|{'-' * 11}|")
    for index in range(0, len(CASES), 2):
        old, new = CASES[index][1], CASES[index + 1][1]
        old_median, new_median = statistics.median(times[old]), statistics.median(times[new])
        print(f"| {old:<36} | {old_median:8.2f} | {min(times[old]):6.2f} | {'':>9} |")
        print(f"| {new:<36} | {new_median:8.2f} | {min(times[new]):6.2f} | {new_median / old_median:9.3f} |")


if __name__ == "__main__":
    main()

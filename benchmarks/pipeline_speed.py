#!/usr/bin/env python3
"""Questions per second of the "open-qa" pipeline against the bare model forward, and against today's pipeline.

Three measurements on the default model (models/realm-minilm-factbook, float32), the same questions in the same
batches, each retrieving and reading the same blocks (the model's own search):

1. **bare forward**: tokenize a batch of questions and run `model.score_spans(**batch)` (embed, search the index,
   build reader inputs, read every span), nothing else: the floor any pipeline pays.
2. **pipeline (this tree)**: `pipeline("open-qa", model=default model)(questions, batch_size=B)`: the same, plus
   picking the best spans and turning them into text with character offsets (answers, titles, evidence).
3. **pipeline (baseline tree)**: the same call on the code of another git revision (default: `main`), extracted
   with `git archive` into a temporary directory and run in a subprocess. Its pipeline could not load the default
   model's directory, so it is built the way its `realm-hf ask` built it: `default_model.load_open_qa(dir)` then
   `pipeline("open-qa", model=model, retriever=retriever)`.

Each is warmed up on one batch, then timed `--repeats` times over all questions; the best time counts. A table with
questions/s and the ratios goes to stdout.

On a CPU the default model's forward (5 blocks of up to 160 wordpieces through a 6-layer MiniLM reader per question)
takes over a second per question, so what the pipeline adds around it vanishes in the noise; on a GPU the forward
takes milliseconds and the pipeline's own work decides. `--model demo` measures that regime on a CPU: the built-in
demo model (2 layers, hidden size 32, built in seconds) whose forward costs little, so the table shows the
pipeline's overhead.

    PYTHONPATH=src .venv/bin/python benchmarks/pipeline_speed.py                 # 64 questions, batches of 16
    PYTHONPATH=src .venv/bin/python benchmarks/pipeline_speed.py --model demo --num-questions 512
    PYTHONPATH=src .venv/bin/python benchmarks/pipeline_speed.py --baseline-rev 2d16fad --num-questions 32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "@@PIPELINE_SPEED@@ "
COUNTRIES = [
    "Kenya", "Japan", "Nepal", "Ghana", "Peru", "France", "Chile", "Norway", "Egypt", "India", "Brazil", "Canada",
    "Spain", "Italy", "Mexico", "Poland", "Greece", "Turkey", "Vietnam", "Morocco", "Sweden", "Finland", "Iran",
    "Iraq", "Cuba", "Mali", "Niger", "Chad", "Sudan", "Oman", "Yemen", "Laos",
]  # fmt: skip
TEMPLATES = ["What is the capital of {}?", "What is the currency of {}?", "What is the highest point in {}?",
             "When did {} become independent?"]  # fmt: skip


def make_questions(count: int) -> list[str]:
    questions = [template.format(country) for country in COUNTRIES for template in TEMPLATES]
    return (questions * (count // len(questions) + 1))[:count]


def best_time(run, batches, repeats: int) -> float:
    run(batches[0])  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            run(batch)
        times.append(time.perf_counter() - start)
    return min(times)


def time_bare_and_pipeline(open_qa, questions: list[str], batch_size: int, repeats: int) -> dict:
    """Best-of-`repeats` seconds for the bare model forward (`score_spans` on the tokenized questions) and for the
    pipeline, over the same batches of questions."""
    model, tokenizer = open_qa.model, open_qa.tokenizer
    max_length = model.config.searcher_seq_len
    batches = [questions[i : i + batch_size] for i in range(0, len(questions), batch_size)]

    def bare(batch):
        inputs = tokenizer(batch, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        model.score_spans(**{key: inputs[key] for key in ("input_ids", "attention_mask", "token_type_ids")})

    def pipe(batch):
        open_qa(batch, batch_size=batch_size)

    return {
        "bare": best_time(bare, batches, repeats),
        "pipeline": best_time(pipe, batches, repeats),
        "dtype": str(model.dtype),
        "retriever": type(open_qa.retriever).__name__,
    }


def measure_current(model_dir: str, questions: list[str], batch_size: int, repeats: int) -> dict:
    import torch
    from transformers import pipeline

    import realm_hf  # noqa: F401  (registers the task)

    torch.set_grad_enabled(False)
    open_qa = pipeline("open-qa", model=model_dir, device="cpu")
    if hasattr(open_qa.model.searcher, "dense"):
        # The default model reads hybrid candidates (its searcher.json); the bare forward and the baseline tree search
        # dense, so this tree does too: the same blocks everywhere.
        open_qa.model.searcher = open_qa.model.searcher.dense
    return time_bare_and_pipeline(open_qa, questions, batch_size, repeats)


def measure_baseline(model_dir: str, questions: list[str], batch_size: int, repeats: int) -> dict:
    """Runs inside the baseline tree (its `src` first on the path)."""
    import torch
    from transformers import pipeline

    import realm_hf
    from realm_hf.default_model import load_open_qa

    torch.set_grad_enabled(False)
    model, retriever = load_open_qa(model_dir)
    open_qa = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever, device="cpu")
    return {**time_bare_and_pipeline(open_qa, questions, batch_size, repeats), "realm_hf": realm_hf.__file__}


def run_baseline(rev: str, args, questions: list[str]) -> dict:
    from baseline_tree import baseline_tree

    with baseline_tree(rev) as tree:
        env = {**os.environ, "PYTHONPATH": os.path.join(tree, "src")}
        command = [sys.executable, __file__, "--_baseline-worker", "--model", args.model, "--batch-size",
                   str(args.batch_size), "--repeats", str(args.repeats), "--num-questions", str(len(questions))]  # fmt: skip
        result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree)
        lines = [line for line in result.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
        if result.returncode != 0 or not lines:
            raise RuntimeError(f"the baseline run failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return json.loads(lines[-1][len(RESULT_PREFIX) :])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default=str(REPO_ROOT / "models" / "realm-minilm-factbook"),
        help="a model directory, or 'demo' for the built-in tiny demo model (default: the default model)",
    )
    parser.add_argument("--num-questions", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--baseline-rev",
        default="2d16fad",
        help="git revision of the pipeline before issue 15 (default: 2d16fad; main now holds the new one)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--_baseline-worker", dest="baseline_worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    questions = make_questions(args.num_questions)
    if args.model == "demo" and not args.baseline_worker:
        from realm_hf.demo import ensure_demo_model

        args.model = str(ensure_demo_model(Path(tempfile.mkdtemp(prefix="realm-pipeline-demo-"))))
    if args.baseline_worker:
        print(RESULT_PREFIX + json.dumps(measure_baseline(args.model, questions, args.batch_size, args.repeats)))
        return 0

    current = measure_current(args.model, questions, args.batch_size, args.repeats)
    baseline = run_baseline(args.baseline_rev, args, questions)
    n = len(questions)
    rows = [
        ("bare forward (score_spans), this tree", current["bare"], current["retriever"], None),
        ("pipeline, this tree", current["pipeline"], current["retriever"], current["pipeline"] - current["bare"]),
        (f"bare forward (score_spans), {args.baseline_rev}", baseline["bare"], baseline["retriever"], None),
        (f"pipeline, {args.baseline_rev}", baseline["pipeline"], baseline["retriever"],
         baseline["pipeline"] - baseline["bare"]),
    ]  # fmt: skip
    print(f"\n{args.model}: {n} questions, batch size {args.batch_size}, best of {args.repeats}, {current['dtype']}, "
          f"torch threads {__import__('torch').get_num_threads()}\n")  # fmt: skip
    print("| path | retriever | seconds | questions/s | pipeline overhead ms/question |")
    print("|---|---|---:|---:|---:|")
    for name, seconds, retriever, overhead in rows:
        extra = f"{1000 * overhead / n:.1f}" if overhead is not None else ""
        print(f"| {name} | {retriever} | {seconds:.2f} | {n / seconds:.2f} | {extra} |")
    print(f"\npipeline / bare forward (this tree): {current['bare'] / current['pipeline']:.2f} (goal >= 0.80)")
    print(f"pipeline / {args.baseline_rev} pipeline: {baseline['pipeline'] / current['pipeline']:.2f}x (goal >= 3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

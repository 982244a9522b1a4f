"""Two open-QA models on the same questions, as `realm-hf ask` serves them: paired exact match and the answers that
changed.

    python examples/compare_models.py --old build/round5_shipped --new models/realm-minilm-factbook \
        --questions build/round6/question_sources --split test --per-file 100 \
        --also examples/trivia_questions.jsonl examples/everyday_questions.jsonl

The same model with a pipeline rule off and on (--new defaults to --old; --old-options / --new-options are the
pipeline's call arguments as JSON):

    python examples/compare_models.py --old models/realm-minilm-factbook --old-options '{"prefer_typed_answers": false}' \
        --questions build/default_model/question_sources --split dev --per-file 100

Each model is loaded as the one loader loads it (its own `searcher.json`: hybrid candidates for the default model)
and reads the same questions: the first --per-file of each `<source>.<split>.jsonl` in --questions after a seeded
shuffle (unanswerable rows left out), and every question of each --also file. Prints, per file, EM old -> new, the
questions only one of them gets right and the two-sided sign test over those, then the answers that changed (+ gained,
- lost); --output writes every answer as JSON.
"""

import argparse
import json
import random
from pathlib import Path

from realm_hf.evaluation.metrics import paired_exact_match, sign_test


def question_files(args) -> dict[str, list[dict]]:
    files = {}
    if args.questions is not None:
        for path in sorted(args.questions.glob(f"*.{args.split}.jsonl")):
            rows = [row for row in read_jsonl(path) if row.get("answers")]
            if rows:  # (the unanswerable source has no answers to compare)
                random.Random(args.seed).shuffle(rows)
                files[path.name.split(".")[0]] = rows[: args.per_file]
    for path in args.also:
        rows = [row for row in read_jsonl(path) if row.get("answers")]
        if not rows:
            raise SystemExit(f"--also {path}: expected rows with 'answers', found none")
        files[path.stem] = rows
    if not files:
        raise SystemExit(f"no questions: expected --questions DIR with *.{args.split}.jsonl files, or --also FILE")
    return files


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def open_qa_of(model_dir: Path):
    from transformers import pipeline

    from realm_hf.default_model import load_open_qa

    model, retriever = load_open_qa(model_dir)
    return pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever, device="cpu")


def answers_of(open_qa, files: dict[str, list[dict]], batch_size: int, options: dict) -> dict[str, list[dict]]:
    return {name: open_qa([row["question"] for row in rows], batch_size=batch_size, **options)
            for name, rows in files.items()}  # fmt: skip


def pipeline_options(text: str) -> dict:
    """`--old-options` / `--new-options`: a JSON object of the open-qa pipeline's call arguments."""
    try:
        options = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON object, received {text!r} ({error})") from None
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, received {text!r}")
    return options


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="the open-QA model directory to compare against")
    parser.add_argument("--new", type=Path, help="the open-QA model directory compared (default: --old)")
    parser.add_argument(
        "--old-options",
        type=pipeline_options,
        default={},
        help="pipeline call arguments of the old answers, as JSON: '{\"prefer_typed_answers\": false}'",
    )
    parser.add_argument(
        "--new-options", type=pipeline_options, default={}, help="pipeline call arguments of the new answers, as JSON"
    )
    parser.add_argument("--questions", type=Path, help="a question-sources directory (<source>.<split>.jsonl files)")
    parser.add_argument("--split", default="dev", help="which split of --questions (default: dev)")
    parser.add_argument("--per-file", type=int, default=100, help="questions per --questions file (default: 100)")
    parser.add_argument("--also", type=Path, nargs="*", default=[], help="more question files, read whole")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--output", type=Path, help="write every answer of both models here (JSON)")
    args = parser.parse_args(argv)

    from realm_hf.evaluation.metrics import exact_match

    files = question_files(args)
    old_qa = open_qa_of(args.old)
    new_qa = old_qa if args.new is None or args.new == args.old else open_qa_of(args.new)  # one model, loaded once
    old = answers_of(old_qa, files, args.batch_size, args.old_options)
    new = answers_of(new_qa, files, args.batch_size, args.new_options)
    total_wins = total_losses = 0
    report = {}
    for name, rows in files.items():
        right_old = [exact_match(answer["answer"], row["answers"]) == 1.0 for row, answer in zip(rows, old[name])]
        right_new = [exact_match(answer["answer"], row["answers"]) == 1.0 for row, answer in zip(rows, new[name])]
        paired = paired_exact_match(right_new, right_old)
        total_wins, total_losses = total_wins + paired["wins"], total_losses + paired["losses"]
        print(f"{name} ({len(rows)}): EM {paired['old_em']:.3f} -> {paired['new_em']:.3f}, gained {paired['wins']}, "
              f"lost {paired['losses']}, sign test p = {paired['sign_test_p']:.2g}")  # fmt: skip
        report[name] = []
        for row, a, b, was, now in zip(rows, old[name], new[name], right_old, right_new):
            report[name].append({"question": row["question"], "answers": row["answers"], "old": a["answer"],
                                 "new": b["answer"], "old_abstained": a.get("abstained"),
                                 "new_abstained": b.get("abstained")})  # fmt: skip
            if a["answer"] != b["answer"]:
                mark = "+" if now and not was else "-" if was and not now else " "
                print(f"  {mark} {row['question']} | {a['answer']} -> {b['answer']} | {row['answers'][0]}")
    print(f"all: gained {total_wins}, lost {total_losses}, sign test p = {sign_test(total_wins, total_losses):.2g}")
    if args.output is not None:
        args.output.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

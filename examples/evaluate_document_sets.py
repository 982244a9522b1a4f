"""Exact match of an open-QA model over people's documents and questions, read as a user's would be: each set of
documents (a folder with `corpus/` and `questions.jsonl`, as `examples/own_documents`) indexed alone with the model,
every question asked through `pipeline("open-qa", model=..., index=...)`; and, with --questions, JSONL files of
questions read over the model's own corpus. Writes each question's result (1 right, 0 wrong, null unanswerable) to
--output; with --compare, pairs them with an earlier --output (the questions only one gets right, sign test).

    python examples/evaluate_document_sets.py --model models/realm-minilm-factbook --output twelve.json \
        --compare eight.json --questions examples/everyday_questions.jsonl examples/trivia_questions.jsonl

Session 27 read the shipped model before and after its documents stage trained on twelve sets this way
(docs/default-model.md, "Four more sets of training documents").
"""

import argparse
import json
from pathlib import Path

EXAMPLES = Path(__file__).parent
DEFAULT_SETS = [EXAMPLES / "own_documents", EXAMPLES / "town_documents",
                *sorted(path for path in (EXAMPLES / "document_calibration").iterdir() if path.is_dir())]  # fmt: skip


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--sets", type=Path, nargs="*", default=DEFAULT_SETS, help="folders of documents + questions")
    parser.add_argument(
        "--questions", type=Path, nargs="*", default=[], help="JSONL files asked over the model's corpus"
    )
    parser.add_argument("--compare", type=Path, help="an earlier --output to pair with")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)

    from evaluate_question_sources import read_document_sets
    from transformers import pipeline

    import realm_hf  # noqa: F401  (registers the "open-qa" task)
    from realm_hf.evaluation.metrics import exact_match, paired_exact_match

    marks = {}
    for name, (rows, answers) in read_document_sets(args.model, args.sets, args.batch_size).items():
        marks[name] = [int(exact_match(answer["answer"], row["answers"])) if row["answers"] else None
                       for answer, row in zip(answers, rows, strict=True)]  # fmt: skip
    if args.questions:
        open_qa = pipeline("open-qa", model=str(args.model), device="cpu")
        for path in args.questions:
            rows = [row for row in read_jsonl(path) if row["answers"]]
            answers = open_qa([row["question"] for row in rows], batch_size=args.batch_size)
            marks[path.name] = [int(exact_match(answer["answer"], row["answers"]))
                                for answer, row in zip(answers, rows, strict=True)]  # fmt: skip
    args.output.write_text(json.dumps(marks, indent=1) + "\n", encoding="utf-8")
    earlier = json.loads(args.compare.read_text(encoding="utf-8")) if args.compare else {}
    for name, new in marks.items():
        right = sum(mark for mark in new if mark is not None)
        line = f"{name}: {right} of {sum(mark is not None for mark in new)}"
        if name in earlier:
            pairs = [(old, mark) for old, mark in zip(earlier[name], new, strict=True) if mark is not None]
            paired = paired_exact_match([mark for _, mark in pairs], [old for old, _ in pairs])
            line += (f" (was {sum(old for old, _ in pairs)}; {paired['wins']} gained, {paired['losses']} lost, "
                     f"p = {paired['sign_test_p']:.2g})")  # fmt: skip
        print(line)


if __name__ == "__main__":
    main()

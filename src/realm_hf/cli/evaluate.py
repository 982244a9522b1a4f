"""`realm-hf evaluate`: exact match, official EM, F1, reader oracle and answer recall@k of a model on a JSONL set."""

import argparse
import json
import sys
from pathlib import Path

from .arguments import (
    add_searcher_arguments,
    choose_searcher,
    loading_model,
    model_location,
    positive_int,
    without_weight_loading_bar,
)

HELP = """\
Data: JSON lines, one question each: {"question": str, "answers": [str, ...]} (NQ-open) or {"question": str,
"answer": [str, ...] | str} (ORQA resplit / WebQuestions), with an optional "relation" for a per-relation breakdown.

  realm-hf evaluate --model google/realm-orqa-nq-openqa --data nq-test.jsonl --k 1,5,20,100
  realm-hf evaluate --model ./my-realm --data dev.jsonl --json --limit 200
  realm-hf evaluate --data dev.jsonl --searcher bm25      # the same reader over BM25's blocks: a baseline
"""


def read_questions(
    path: str | Path, limit: int | None = None, unanswerable: bool = False
) -> tuple[list[str], list[list[str]], list | None]:
    """Reads `(questions, answers, relations)` from a JSONL file; `relations` is `None` when no row has one. Questions
    with `"answers": []` are kept with `unanswerable`, else left out with a note. A row that cannot be read (not JSON,
    not UTF-8, no question, answers that are not strings) raises a `ValueError` naming its line."""
    from realm_hf.errors import FileFormatError, MissingFileError, not_utf8_error
    from realm_hf.training.finetune import answers_of, question_of

    location = Path(path)
    if location.suffix.lower() in (".csv", ".tsv", ".parquet", ".txt"):
        raise ValueError(f"expected a JSON Lines file of {{\"question\": ..., \"answers\": [...]}} rows, one per line; "
                         f"got a {location.suffix} file")  # fmt: skip
    if location.is_dir():
        raise ValueError(f"{path} is a directory; expected a JSON Lines file of questions")
    if not location.exists():
        raise MissingFileError(f"no such file (expected a JSON Lines file of {EXAMPLE_ROW} rows, one per line)")
    data = location.read_bytes()
    if not data.strip():
        raise FileFormatError(f"{path} is empty: expected one question per line, e.g. {EXAMPLE_ROW}", path=path)
    questions, answers, relations = [], [], []
    left_out = 0
    offset = 0
    for line_number, raw in enumerate(data.splitlines(keepends=True), start=1):
        start, offset = offset, offset + len(raw)
        try:
            line = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")  # a byte order mark (Notepad) is dropped
        except UnicodeDecodeError as error:
            raise not_utf8_error(None, raw, error.start, offset=start, line=line_number, path=path) from None
        if not line.strip():
            continue
        if limit is not None and len(questions) >= limit:
            break
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"line {line_number}: expected JSON Lines (one JSON object per line): {error}") from None
        references = row.get("answers", row.get("answer")) if isinstance(row, dict) else None
        if not isinstance(row, dict) or "question" not in row or references is None:
            found = f"keys {sorted(row)}" if isinstance(row, dict) else _json_kind(row)
            raise ValueError(f"line {line_number}: expected a 'question' string and 'answers' (or 'answer'), got "
                             f"{found}.")  # fmt: skip
        try:
            question_of(row)
            references = answers_of(row)
        except ValueError as error:
            raise FileFormatError(f"line {line_number}: {error}", path=path, location=f"line {line_number}") from None
        if not references and not unanswerable:  # "answers": [], an unanswerable question: no answer to match
            left_out += 1
            continue
        questions.append(row["question"])
        answers.append(references)
        relations.append(row.get("relation"))
    if left_out:
        print(f"note: {left_out} question(s) of {path} without answers left out: exact match needs an answer "
              "(`realm-hf calibrate --data` counts them)", file=sys.stderr)  # fmt: skip
    if not questions:
        raise ValueError(f"{path} holds no questions with answers.")
    return questions, answers, relations if any(relation is not None for relation in relations) else None


EXAMPLE_ROW = '{"question": "Who founded Acme?", "answers": ["Margaret Holt"]}'


def _json_kind(value) -> str:
    """How a JSON value that is not an object is named in a message."""
    if isinstance(value, list):
        return "a JSON array; write one JSON object per line (JSON Lines), not a list"
    return type(value).__name__


def _parse_ks(value: str) -> list[int]:
    try:
        ks = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers such as 1,5,20,100, got {value!r}"
        )
    return ks


def format_table(metrics: dict) -> str:
    """The metrics as a two-column text table (the per-relation rows last)."""
    rows = [(key, value) for key, value in metrics.items() if key != "primary_metric"]
    width = max(len(key) for key, _ in rows)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  ------"]
    for key, value in sorted(rows, key=lambda row: "/" in row[0]):
        lines.append(f"{key:<{width}}  {value:.4f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    return "\n".join(lines)


def _write_predictions(path: Path, evaluator) -> None:
    """One JSON line per question: its question, reference answers, the model's answer and whether it matched."""
    from realm_hf.atomic import atomic_path

    rows = [{"question": question, "answers": answers, "prediction": prediction,
             "exact_match": bool(evaluator.exact_match_of(prediction, answers))}
            for question, answers, prediction in zip(evaluator.questions, evaluator.answers, evaluator.predictions,
                                                     strict=True)]  # fmt: skip
    with atomic_path(path) as temporary:
        Path(temporary).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), "utf-8")


def cmd_evaluate(args) -> int:
    from realm_hf.errors import UsageError
    from realm_hf.evaluation import OpenQAEvaluator
    from realm_hf.evaluation.realm import RealmOpenQASystem

    if args.model is not None:
        args.model = model_location(args.model)
    if args.index is not None:  # a missing or damaged index is named as such, not as a model that failed to load
        from realm_hf.loading import check_index

        check_index(args.index, "--index")
    if args.predictions is not None and (args.predictions.is_dir() or not args.predictions.parent.is_dir()):
        raise UsageError(f"--predictions expects a file to write in an existing directory, got {args.predictions}")
    try:
        questions, answers, relations = read_questions(args.data, limit=args.limit)
    except (OSError, ValueError) as error:
        print(f"realm-hf evaluate: error: could not read {args.data!r}: {error}", file=sys.stderr)
        return 1
    with loading_model(args.model or "the default model"), without_weight_loading_bar():
        system = RealmOpenQASystem.from_pretrained(args.model, batch_size=args.batch_size, index=args.index)
    choose_searcher(system.model, args.searcher, args.bm25_fraction, args.bm25_weight)
    if args.regex:
        import re

        for reference in {answer for references in answers for answer in references}:
            try:
                re.compile(reference)
            except re.error as error:
                raise UsageError(f"--regex: answer {reference!r} of {args.data} is not a regular expression ({error}); "
                                 "expected patterns (CuratedTrec), or drop --regex for exact match") from None  # fmt: skip
    evaluator = OpenQAEvaluator(questions, answers, relations=relations, ks=args.k, is_regex=args.regex,
                                batch_size=args.batch_size, progress=not args.quiet)  # fmt: skip
    metrics = evaluator(system)
    if args.predictions is not None:
        _write_predictions(args.predictions, evaluator)
    if args.json:
        print(json.dumps(metrics, ensure_ascii=False, indent=2))
    else:
        print(format_table(metrics))
    return 0


def add_parser(subparsers) -> None:
    evaluate = subparsers.add_parser(
        "evaluate", help="exact match, F1, reader oracle and recall@k on a JSONL question set", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    evaluate.add_argument("--model", help="directory or Hub repo id of a RealmForOpenQA model with its documents and "
                                          "tokenizer (default: the default model)")  # fmt: skip
    evaluate.add_argument("--index", help="an index directory (realm-hf index build) to search and read instead of "
                                          "the model's own")  # fmt: skip
    evaluate.add_argument("--data", required=True, help="JSONL file of questions with answers")
    evaluate.add_argument("--k", type=_parse_ks, default=[1, 5, 20, 100],
                          help="recall@k cut-offs, comma-separated (default: 1,5,20,100)")  # fmt: skip
    evaluate.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    evaluate.add_argument("--limit", type=positive_int, default=None, help="evaluate only the first N questions")
    evaluate.add_argument("--batch-size", type=positive_int, default=8, help="questions per forward pass (default: 8)")
    evaluate.add_argument("--regex", action="store_true",
                          help="answers are regular expressions (CuratedTrec): regex match instead of exact match")  # fmt: skip
    evaluate.add_argument("--predictions", type=Path, default=None, metavar="FILE",
                          help="also write each question's answer to FILE (JSON lines: question, answers, prediction, "
                               "exact_match), to see which ones missed")  # fmt: skip
    evaluate.add_argument("--quiet", action="store_true", help="no progress bars")
    add_searcher_arguments(evaluate)
    evaluate.set_defaults(func=cmd_evaluate)

"""Paired exact match over `realm-hf evaluate --predictions` files: the same questions answered in several ways.

    realm-hf evaluate --data title.dev.jsonl --bm25-weight 0 --predictions p/title_w0.jsonl
    realm-hf evaluate --data title.dev.jsonl --bm25-weight 1 --predictions p/title_w1.jsonl
    realm-hf evaluate --data title.dev.jsonl --searcher bm25 --predictions p/title_bm25.jsonl
    python examples/compare_predictions.py --labels "weight 0, weight 1, BM25 + the same reader" \
        title=p/title_w0.jsonl,p/title_w1.jsonl,p/title_bm25.jsonl wh=p/wh_w0.jsonl,p/wh_w1.jsonl \
        --output examples/results/bm25_weight_whole_dev.json

Each SET=FILE,FILE[,...] names one question set and its prediction files, one per --labels entry in that order (a set
may leave out any but the first two: `wh=a.jsonl,b.jsonl,,d.jsonl`). The second file is the one compared: against each other file of its set, the questions
only one of them gets right and the two-sided sign test over those. Prints a table; --output writes it as JSON (the
default model's card reads `examples/results/bm25_weight_whole_dev.json`).
"""

import argparse
import json
from pathlib import Path

from realm_hf.evaluation.metrics import paired_exact_match


def read_predictions(path: Path) -> list[dict]:
    expected = f"{path}: expected `realm-hf evaluate --predictions` rows with 'question' and 'exact_match'"
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SystemExit(f"{expected}, received {error}") from None
    if not rows or not all(isinstance(row, dict) and "question" in row and "exact_match" in row for row in rows):
        raise SystemExit(expected)
    return rows


def compare(files: dict[str, Path]) -> dict:
    """`files`: label -> prediction file, the compared one second."""
    predictions = {label: read_predictions(path) for label, path in files.items()}
    first, compared = list(files)[:2]
    questions = [row["question"] for row in predictions[first]]
    for label, rows in predictions.items():
        if [row["question"] for row in rows] != questions:
            raise SystemExit(f"{files[label]}: expected the questions of {files[first]} in the same order")
    matches = {label: [bool(row["exact_match"]) for row in rows] for label, rows in predictions.items()}
    result = {"questions": len(questions),
              "exact_match": {label: sum(match) / len(match) for label, match in matches.items()},
              "compared": compared, "paired": {}}  # fmt: skip
    for label, match in matches.items():
        if label != compared:
            pair = paired_exact_match(matches[compared], match)
            result["paired"][label] = {key: pair[key] for key in ("wins", "losses", "sign_test_p")}
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sets", nargs="+", metavar="SET=FILE,FILE[,...]")
    parser.add_argument("--labels", required=True, type=lambda text: [label.strip() for label in text.split(",")],
                        help="comma-separated, one name per prediction file of a set, in order")  # fmt: skip
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--note", default=None, help="what was compared and how, kept in --output as 'note' (the "
                        "default model's card prints it above the table)")  # fmt: skip
    args = parser.parse_args(argv)
    if len(args.labels) < 2 or len(set(args.labels)) < len(args.labels) or not all(args.labels):
        raise SystemExit(
            f"--labels: expected at least two distinct names (the second is the one compared), received {args.labels}"
        )
    report = {**({"note": args.note} if args.note else {}), "labels": args.labels, "sets": {}}
    for item in args.sets:
        name, _, paths = item.partition("=")
        paths = paths.split(",")
        if not name or len(paths) < 2 or not all(paths[:2]) or len(paths) > len(args.labels):
            raise SystemExit(f"expected SET=FILE,FILE[,...] with 2 to {len(args.labels)} files, received {item!r}")
        report["sets"][name] = compare({label: Path(path) for label, path in zip(args.labels, paths) if path})
    compared = args.labels[1]
    others = [label for label in args.labels if label != compared]
    print(
        " | ".join(
            ["set", "questions", *args.labels, *(f"{compared} vs {label}: wins / losses (p)" for label in others)]
        )
    )
    for name, result in report["sets"].items():
        cells = [f"{100 * result['exact_match'][label]:.1f}" if label in result["exact_match"] else "-"
                 for label in args.labels]  # fmt: skip
        pairs = [f"{pair['wins']} / {pair['losses']} ({pair['sign_test_p']:.2g})" if (pair := result["paired"].get(label))
                 else "-" for label in others]  # fmt: skip
        print(" | ".join([name, str(result["questions"]), *cells, *pairs]))
    if args.output is not None:
        from realm_hf.atomic import atomic_path

        args.output.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(args.output) as temporary:
            Path(temporary).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

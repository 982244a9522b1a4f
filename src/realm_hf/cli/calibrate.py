"""`realm-hf calibrate`: fits a model's confidence on the user's own dev questions and writes its calibration.json."""

import argparse
import json
import sys
from pathlib import Path

from .arguments import model_location, positive_int, unit_interval, without_weight_loading_bar

HELP = """\
Gives a model (typically one you fine-tuned with `realm-hf train`, which has none) a calibrated confidence and an
abstention threshold, fitted on your dev questions: each is answered as `realm-hf ask` would, its answer's features
(span probability, margin, how much of the question its passage covers) are paired with whether the answer is right
(exact match), a logistic model maps them to the chance of being right, and the threshold is the highest that
abstains on at most --max-correct-abstained of the right answers. Rows with `"answers": []` are unanswerable
questions (personal, future, not in your documents): include some, as the threshold is worth what they teach it.
The result is written to MODEL/calibration.json, which `realm-hf ask`, `serve` and the pipeline then read: answers
carry `confidence` and print as `(not sure) ...` below the threshold.
"""

EPILOG = """\
examples:
  realm-hf calibrate --model out --index my-index --data dev.jsonl
  realm-hf ask --model out --index my-index "What does the warranty cover?"   # now with a confidence
"""

# The features of the default model's calibration (chosen there by leave-one-source-out): probability and margin among
# the spans of the kind asked for, and question coverage, need nothing beyond the blocks read.
DEFAULT_FEATURES = ("log_kind_span_probability", "kind_margin", "question_coverage")
FEW_QUESTIONS = 100  # below this many dev questions the fit is a rough one, and the command says so


def cmd_calibrate(args) -> int:
    import torch
    from transformers import pipeline

    from realm_hf.errors import InputError, UsageError
    from realm_hf.evaluation.calibration import CALIBRATION_FEATURES, choose_threshold, fit_calibration
    from realm_hf.evaluation.metrics import exact_match
    from realm_hf.loading import load_open_qa
    from realm_hf.pipelines.open_qa import abstains_whatever_the_confidence, answers_with_features

    from .evaluate import read_questions

    unknown_features = [name for name in args.features if name not in CALIBRATION_FEATURES]
    if unknown_features:
        raise UsageError(f"--features: expected names among {list(CALIBRATION_FEATURES)}, received "
                         f"{unknown_features}")  # fmt: skip
    model_dir = Path(model_location(args.model))
    if not model_dir.is_dir():
        raise UsageError(f"--model {args.model!r}: expected a local model directory to write calibration.json into")
    from realm_hf.default_model import default_model_dir

    default = default_model_dir()
    if default is not None and model_dir.resolve() == Path(default).resolve():
        raise UsageError(f"--model {args.model!r} is the default model, whose calibration every `realm-hf ask` "
                         f"without --model reads: copy it first (cp -r {args.model} my-model) and calibrate the "
                         "copy (--model my-model)")  # fmt: skip
    try:
        questions, answers, _ = read_questions(args.data, unanswerable=True)
    except (OSError, ValueError) as error:
        raise InputError(f"could not read {args.data!r}: {error}") from None
    if not any(answers):
        raise InputError(f"{args.data}: all {len(questions)} questions have \"answers\": [] (unanswerable); expected "
                         "questions with answers among them too: the confidence is fitted on right and wrong answers, "
                         "the unanswerable ones set how far to abstain")  # fmt: skip
    with without_weight_loading_bar():
        model, retriever = load_open_qa(model_dir, args.index)
    open_qa = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever, device="cpu")
    open_qa._cached_calibration = None  # features, not confidences: whatever calibration.json the model has
    results = answers_with_features(open_qa, questions, args.batch_size, progress=not args.quiet)
    features = torch.tensor([result["features"] for result in results])
    answerable = torch.tensor([bool(references) for references in answers])
    correct = torch.tensor([bool(references) and bool(exact_match(result["answer"], references))
                            for result, references in zip(results, answers, strict=True)])  # fmt: skip
    if int(correct.sum()) < 2 or int((~correct).sum()) < 2:
        raise InputError(f"{args.data}: the model answers {int(correct.sum())} of {len(questions)} questions right; "
                         "fitting a confidence needs at least 2 right and 2 wrong (or unanswerable) ones")  # fmt: skip
    calibration = fit_calibration(features, correct, args.features)
    # abstained whatever the confidence: names no block holds, questions about the asker the corpus cannot answer,
    # amounts of money asked for where none was read, yes-or-no questions
    unknown = torch.tensor([abstains_whatever_the_confidence(result) for result in results])
    confidences = calibration.confidence(features).masked_fill(unknown, 0.0)
    calibration.threshold, rates = choose_threshold(confidences, correct, answerable, args.max_correct_abstained)
    calibration.metadata.update({
        "fitted_by": "realm-hf calibrate", "data": str(args.data), "index": args.index, "questions": len(questions),
        "answerable": int(answerable.sum()), "max_correct_abstained": args.max_correct_abstained, **rates,
    })  # fmt: skip
    from realm_hf.evaluation.calibration import set_aside_calibration

    kept = set_aside_calibration(model_dir)  # kept, not lost: the previous fit may have been the better one
    if kept is not None:
        print(f"note: the model's previous calibration is now {kept}", file=sys.stderr)
    path = calibration.save(model_dir)
    summary = {"calibration": str(path), "questions": len(questions), "answerable": int(answerable.sum()),
               "correct": int(correct.sum()), "threshold": calibration.threshold, **rates}  # fmt: skip
    print(json.dumps(summary, indent=2))
    if int((~answerable).sum()) == 0:
        print("note: no unanswerable rows (\"answers\": []): the threshold only knows wrong answers",
              file=sys.stderr)  # fmt: skip
    if len(questions) < FEW_QUESTIONS:
        print(f"note: fitted on {len(questions)} questions; a few hundred give a threshold to rely on",
              file=sys.stderr)  # fmt: skip
    return 0


def add_parser(subparsers) -> None:
    calibrate = subparsers.add_parser("calibrate", help="fit a model's confidence on your dev questions",
                                      description=HELP, epilog=EPILOG,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    calibrate.add_argument("--model", required=True, help="the model directory (calibration.json is written there)")
    calibrate.add_argument("--index", help="the index it searches (realm-hf index build), if not its own")
    calibrate.add_argument("--data", required=True, help='JSONL of {"question", "answers"} rows; "answers": [] for '
                                                         "unanswerable questions")  # fmt: skip
    calibrate.add_argument("--max-correct-abstained", type=unit_interval, default=0.25,
                           help="the share of right answers the threshold may abstain on (default: 0.25)")  # fmt: skip
    calibrate.add_argument("--features", nargs="+", default=list(DEFAULT_FEATURES),
                           help="answer features of the logistic model, among those of "
                                "realm_hf.evaluation.calibration.CALIBRATION_FEATURES (default: "
                                f"{' '.join(DEFAULT_FEATURES)})")  # fmt: skip
    calibrate.add_argument("--batch-size", type=positive_int, default=8, help="questions per forward pass")
    calibrate.add_argument("--quiet", action="store_true", help="no progress bar")
    calibrate.set_defaults(func=cmd_calibrate)

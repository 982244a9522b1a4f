"""`realm-hf`: one entry point, one subcommand per job. Run `realm-hf COMMAND --help` for each."""

import argparse
import json
import sys
from pathlib import Path

from .arguments import positive_int

DESCRIPTION = """\
REALM / ORQA retrieval-augmented question answering on Transformers 5.

commands:
  demo   answer sample questions with evidence, with the default model (realm-minilm-factbook) when present
  ask    answer questions with a REALM open-QA model (a directory or a Hub repo id; default: the default model)
  index  build / add / offload / eval: your corpus as a block-embedding index (see `realm-hf index --help`)
  evaluate  exact match, official EM, F1, reader oracle and recall@k on a JSONL question set
  train  fine-tune a RealmForOpenQA model on question/answer pairs with the Trainer (ORQA recipe)
  push   upload a model directory (model, tokenizer, block records, index, model card) to the Hub in one commit
  pretrain  REALM pretraining: retrieval-augmented MLM over salient spans, index refreshed while training
  convert   import Google's TensorFlow REALM/ORQA checkpoints, block_emb and blocks.tfr (no TensorFlow)
  serve  a local web page and JSON endpoint: answers highlighted in their evidence (extra: realm_hf[serve])

examples:
  realm-hf demo
  realm-hf ask "What is the capital of France?"
  realm-hf ask --model google/realm-orqa-nq-openqa --json "who wrote hamlet?"
  realm-hf ask --top-k 3 "Who was a pioneer of computer science?"
  echo "who wrote hamlet?" | realm-hf ask --model ./my-realm
  realm-hf index build --corpus my.jsonl --output my-index && realm-hf ask --index my-index "..."
"""


def _load(model_path: str, index: str | None = None):
    from realm_hf.loading import load_open_qa

    return load_open_qa(model_path, index)


def answer_questions(
    model, retriever, questions: list[str], batch_size: int = 8, top_k: int = 1,
    abstention_threshold: float | None = None,
) -> list[dict]:  # fmt: skip
    """Answers `questions` with the "open-qa" pipeline, `batch_size` questions per forward pass.

    Returns one dict per answer, `top_k` per question (fewer if the blocks read hold fewer spans), best first:
    `question`, `rank` (1 = best), `answer` (as written in the evidence), `score` (its probability among the spans of
    the blocks read), `block_id`, `title` (`None` unless the corpus has titles), `evidence` (the block text),
    `start`/`end`, the answer's character offsets in the evidence, `confidence` (calibrated, `None` for a model without
    `calibration.json`) and `abstained` (the model does not know; `answer` is still its best guess).
    """
    from transformers import pipeline

    questions = list(questions)
    if not questions:
        return []
    open_qa = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever, device=model.device)
    results = []
    options = {} if abstention_threshold is None else {"abstention_threshold": abstention_threshold}
    for question, answers in zip(questions, open_qa(questions, batch_size=batch_size, top_k=top_k, **options),
                                 strict=True):  # fmt: skip
        for rank, answer in enumerate([answers] if isinstance(answers, dict) else answers, start=1):
            results.append(
                {
                    "question": question,
                    "rank": rank,
                    "answer": answer["answer"],
                    "score": answer["score"],
                    "block_id": answer["block_id"],
                    "title": answer["title"],
                    "evidence": answer["evidence"],
                    "start": answer["start"],
                    "end": answer["end"],
                    "confidence": answer.get("confidence"),
                    "abstained": bool(answer.get("abstained", False)),
                }
            )
    return results


def _print_answers(results: list[dict], as_json: bool) -> None:
    for result in results:
        if as_json:
            print(json.dumps(result, ensure_ascii=False))
            continue
        if result["rank"] == 1:
            print(f"Q: {result['question']}")
        title = f", {result['title']!r}" if result["title"] else ""
        confidence = result.get("confidence")
        score = f"score {result['score']:.3f}" + (f", confidence {confidence:.2f}" if confidence is not None else "")
        unsure = "(not sure) " if result.get("abstained") else ""
        print(f"A{result['rank'] if result['rank'] > 1 else ''}: {unsure}{result['answer']}  ({score})\n"
              f"   evidence [block {result['block_id']}{title}]: {result['evidence']}\n")  # fmt: skip


def _ensure_demo_model(directory: Path | None, rebuild: bool = False) -> Path:
    from realm_hf.demo import default_demo_dir, ensure_demo_model

    directory = directory or default_demo_dir()
    if rebuild or not (directory / "model.safetensors").is_file():
        print(f"building the demo model in {directory} ...", file=sys.stderr)
    return ensure_demo_model(directory, rebuild=rebuild)


def cmd_demo(args) -> int:
    """Answers sample questions with the default model (trained, real corpus) when it is present, else with the
    untrained built-in demo model."""
    from realm_hf.default_model import DEFAULT_QUESTIONS, default_model_dir

    if not args.untrained:
        directory = default_model_dir()
        if directory is not None:
            print(f"realm-minilm-factbook ({directory}): a REALM/ORQA model trained by this project over 43,829 "
                  "Wikipedia and CIA World Factbook passages, all offline.\n", file=sys.stderr)  # fmt: skip
            model, retriever = _load(str(directory))
            _print_answers(answer_questions(model, retriever, args.questions or DEFAULT_QUESTIONS), as_json=False)
            print(f'try: realm-hf ask "What is the capital of Peru?"   (model: {directory})')
            return 0
        print("(the default model is not in this installation; using the untrained demo model)\n", file=sys.stderr)
    from realm_hf.demo import DEMO_QUESTIONS

    directory = _ensure_demo_model(Path(args.output) if args.output else None, rebuild=True)
    print(
        "NOTE: the demo model's weights are UNTRAINED (random). It runs the whole REALM path (embed the corpus, retrieve "
        "by inner product, read, extract a span) on a built-in corpus of 16 passages; its answers are not meant to be "
        "right.\n"
    )
    model, retriever = _load(str(directory))
    _print_answers(answer_questions(model, retriever, args.questions or DEMO_QUESTIONS), as_json=False)
    print(f"model, tokenizer and retriever saved in {directory}; try: realm-hf ask --model {directory} \"...\"")
    return 0


def cmd_ask(args) -> int:
    questions = list(args.questions)
    if not questions:
        if sys.stdin.isatty():
            print("realm-hf ask: give questions as arguments or on standard input, one per line.", file=sys.stderr)
            return 2
        questions = [line.strip() for line in sys.stdin if line.strip()]
    model_path = args.model
    if model_path is None:
        from realm_hf.default_model import default_model_dir

        default = default_model_dir()
        if default is not None:
            model_path = str(default)
        else:
            model_path = str(_ensure_demo_model(None))
            print(f"(no --model given and no default model installed: using the untrained demo model in {model_path})",
                  file=sys.stderr)  # fmt: skip
    try:
        model, retriever = _load(model_path, args.index)
    except (OSError, ValueError) as error:
        print(f"realm-hf ask: could not load a REALM open-QA model from {model_path!r}: {error}\n"
              "Pass --model with a directory holding config.json, model weights, block records and tokenizer files "
              "(as written by save_pretrained), or a Hub repo id such as google/realm-orqa-nq-openqa.",
              file=sys.stderr)  # fmt: skip
        return 1
    if args.searcher != "dense":
        from realm_hf.retrieval.hybrid import hybrid_searcher_for

        model.searcher = hybrid_searcher_for(model, bm25_fraction=1.0 if args.searcher == "bm25" else args.bm25_fraction)
    results = answer_questions(model, retriever, questions, batch_size=args.batch_size, top_k=args.top_k,
                               abstention_threshold=args.abstention_threshold)  # fmt: skip
    _print_answers(results, as_json=args.json)
    return 0


def _unit_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, received {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="realm-hf", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = subparsers.add_parser("demo", help="build the untrained demo model and answer sample questions",
                                 description=cmd_demo.__doc__ or "Build the demo model and answer sample questions.")  # fmt: skip
    demo.add_argument("questions", nargs="*", help="questions to ask instead of the sample ones")
    demo.add_argument("--untrained", action="store_true", help="use the untrained 16-passage demo model even when "
                                                               "the default model is present")  # fmt: skip
    demo.add_argument("--output", help="where to save the untrained demo model (default: $REALM_HF_HOME/demo or "
                                       "~/.cache/realm_hf/demo)")
    demo.set_defaults(func=cmd_demo)

    ask = subparsers.add_parser("ask", help="answer questions with evidence",
                                description="Answer questions with a REALM open-QA model, printing the evidence block.")  # fmt: skip
    ask.add_argument("questions", nargs="*", help="questions; read from standard input, one per line, when omitted")
    ask.add_argument("--model", help="directory or Hub repo id of a RealmForOpenQA model with its retriever files "
                                     "(default: the default model, else the demo model)")  # fmt: skip
    ask.add_argument("--index", help="an index directory (realm-hf index build) to search and read instead of the "
                                     "model's own; any model whose embedder size matches it")  # fmt: skip
    ask.add_argument(
        "--batch-size", type=positive_int, default=8, help="questions answered per forward pass (default: 8)"
    )
    ask.add_argument("--top-k", type=positive_int, default=1, help="answers per question, best first (default: 1)")
    ask.add_argument("--json", action="store_true", help="print one JSON object per answer")
    ask.add_argument("--searcher", choices=("dense", "hybrid", "bm25"), default="dense",
                     help="which blocks are read: the model's dense search (default), the union of dense and BM25 "
                          "candidates (hybrid), or BM25's alone; all scored by the model's own relevance")  # fmt: skip
    ask.add_argument("--bm25-fraction", type=_unit_interval, default=0.4, metavar="F",
                     help="with --searcher hybrid, the share of the blocks read that BM25 chooses (default: 0.4)")
    ask.add_argument("--abstention-threshold", type=_unit_interval, default=None, metavar="P",
                     help="mark answers whose calibrated confidence is below P as abstained (default: the model's "
                          "calibration.json threshold; 0 never abstains; models without calibration never abstain)")  # fmt: skip
    ask.set_defaults(func=cmd_ask)

    from .convert import add_parser as add_convert_parser
    from .evaluate import add_parser as add_evaluate_parser
    from .index import add_parser as add_index_parser
    from .pretrain import add_parser as add_pretrain_parser
    from .push import add_parser as add_push_parser
    from .serve import add_parser as add_serve_parser
    from .train import add_parser as add_train_parser

    add_index_parser(subparsers)
    add_convert_parser(subparsers)
    add_evaluate_parser(subparsers)
    add_push_parser(subparsers)
    add_train_parser(subparsers)
    add_pretrain_parser(subparsers)
    add_serve_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    finally:
        _close_process_group()


def _close_process_group() -> None:
    """Under torchrun, destroy the process group a command set up: left to the interpreter's exit, gloo's threads can
    abort the process ("terminate called without an active exception") after the work is done."""
    import sys

    if "torch" not in sys.modules:
        return
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        import gc

        # The Trainer's DDP wrapper sits in reference cycles and holds the group: free it while the interpreter is whole.
        gc.collect()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())

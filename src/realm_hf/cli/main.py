"""`realm-hf`: one entry point, one subcommand per job. Run `realm-hf COMMAND --help` for each."""

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from .arguments import (
    RealmHfArgumentParser,
    add_device_argument,
    add_searcher_arguments,
    check_inputs_exist,
    check_writable_directory,
    choose_searcher,
    did_you_mean,
    loading_model,
    model_location,
    positive_int,
    resolve_device,
    unit_interval,
    without_weight_loading_bar,
)

DESCRIPTION = """\
REALM / ORQA retrieval-augmented question answering on Transformers 5.

commands:
  demo   answer sample questions with evidence, with the default model (realm-minilm-factbook) when present
  ask    answer questions with a REALM open-QA model (a directory or a Hub repo id; default: the default model)
  index  build / add / eval / offload / compress: your corpus as a block-embedding index (`realm-hf index --help`)
  evaluate  exact match, official EM, F1, reader oracle and recall@k on a JSONL question set
  train  fine-tune a RealmForOpenQA model on question/answer pairs with the Trainer (ORQA recipe)
  calibrate  fit a model's confidence and abstention threshold on your dev questions (after train)
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

    with without_weight_loading_bar():
        return load_open_qa(model_location(model_path), index)


def answer_questions(
    model, retriever, questions: list[str], batch_size: int = 8, top_k: int = 1,
    abstention_threshold: float | None = None,
) -> list[dict]:  # fmt: skip
    """Answers `questions` with the "open-qa" pipeline, `batch_size` questions per forward pass.

    Returns one dict per answer, `top_k` per question (fewer if the blocks read hold fewer spans), best first:
    `question`, `rank` (1 = best), `answer` (as written in the evidence), `score` (its probability among the spans of
    the blocks read), `block_id`, `title` (`None` unless the corpus has titles), `evidence` (the block text),
    `start`/`end`, the answer's character offsets in the evidence, `confidence` (calibrated, `None` for a model without
    `calibration.json`), `abstained` (the model does not know; `answer` is still its best guess), `unknown_names`
    (the question's names that no document mentions), `about_the_asker` (its words asking about the asker, "my",
    where the documents never speak to or as a person), `missing_units` (`["money"]` where it asks for an amount of
    money and no passage read holds one; `"clock"`, `"temperature"`, `"email"` likewise for a time of day, a
    temperature, an email address) and `yes_or_no` (the question asks for a yes or a no, which no passage's words
    are): each alone makes a calibrated model abstain. A question that cannot be asked (empty, blank, not text) gets
    one dict `{"question", "error"}` in its place instead, and the others are answered.
    """
    from transformers import pipeline

    from realm_hf.pipelines.questions import question_problem

    questions = list(questions)
    problems = [question_problem(question) for question in questions]
    askable = [question for question, problem in zip(questions, problems) if problem is None]
    answers_of = iter([])
    if askable:
        open_qa = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever,
                           device=model.device)  # fmt: skip
        options = {} if abstention_threshold is None else {"abstention_threshold": abstention_threshold}
        answers_of = iter(open_qa(askable, batch_size=batch_size, top_k=top_k, **options))
    results = []
    for question, problem in zip(questions, problems):
        if problem is not None:
            results.append({"question": question if isinstance(question, str) else repr(question), "error": problem})
            continue
        answers = next(answers_of)
        for rank, answer in enumerate([answers] if isinstance(answers, dict) else answers, start=1):
            results.append(
                {
                    "question": question,
                    "rank": rank,
                    "answer": answer["answer"],
                    "score": answer["score"],
                    "block_id": answer["block_id"],
                    "title": answer["title"],
                    "source": answer.get("source"),
                    "evidence": answer["evidence"],
                    "start": answer["start"],
                    "end": answer["end"],
                    "confidence": answer.get("confidence"),
                    "abstained": bool(answer.get("abstained", False)),
                    "threshold": answer.get("threshold"),
                    "unknown_names": list(answer.get("unknown_names", [])),
                    "about_the_asker": list(answer.get("about_the_asker", [])),
                    "missing_units": list(answer.get("missing_units", [])),
                    "yes_or_no": bool(answer.get("yes_or_no", False)),
                }
            )
    return results


# C0 control characters and DEL, which a terminal would act on (a bell, a cleared line) instead of show; a tab stays,
# a newline becomes a space (an answer and its evidence print on one line each).
_CONTROL = {code: f"\\x{code:02x}" for code in [*range(0, 9), *range(11, 32), 127]} | {10: " "}  # one line


def _printable(text: str) -> str:
    """Text as the terminal should show it: control characters from the documents written as escapes."""
    return text.translate(_CONTROL)


def _print_answers(results: list[dict], as_json: bool) -> None:
    for result in results:
        if as_json:
            # A lone surrogate (bytes that were not UTF-8) cannot be written as UTF-8: escape it.
            print(json.dumps(result, ensure_ascii=False).encode("utf-8", "backslashreplace").decode("utf-8"))
            continue
        if "error" in result:
            print(f"Q: {result['question']!r}\n   error: {result['error']}\n")
            continue
        if result["rank"] == 1:
            print(f"Q: {result['question']}")
        title = f", {result['title']!r}" if result["title"] else ""
        title += f" in {result['source']}" if result.get("source") else ""  # the file it came from
        confidence = result.get("confidence")
        score = f"score {result['score']:.3f}" + (f", confidence {confidence:.2f}" if confidence is not None else "")
        threshold = result.get("threshold")
        if result.get("abstained") and confidence is not None and threshold is not None and confidence < threshold:
            score += f", under the {threshold:.2f} threshold"  # the reason it is not sure
        unsure = "(not sure) " if result.get("abstained") else ""
        unknown = result.get("unknown_names")
        unknown = f"   no document mentions {', '.join(repr(name) for name in unknown)}\n" if unknown else ""
        if result.get("about_the_asker"):
            words = ", ".join(repr(word) for word in result["about_the_asker"])
            unknown += f"   the question asks about you ({words}), and these documents are not about you\n"
        for unit in result.get("missing_units", []):
            unknown += (
                f"   the question asks for {MISSING_UNIT_WORDS.get(unit, unit)}, and no passage read holds one\n"
            )
        if result.get("yes_or_no"):
            unknown += (
                "   the question asks for a yes or a no; answers here are words of the passages: read the evidence\n"
            )
        print(f"A{result['rank'] if result['rank'] > 1 else ''}: {unsure}{_printable(result['answer'])}  ({score})\n"
              f"{unknown}   evidence [block {result['block_id']}{_printable(title)}]: "
              f"{_marked_evidence(result)}\n")  # fmt: skip


# What `ask` calls each unit of `missing_units` (realm_hf.pipelines.open_qa.UNITS_NEVER_GUESSED).
MISSING_UNIT_WORDS = {
    "money": "an amount of money",
    "clock": "a time of day",
    "temperature": "a temperature",
    "email": "an email address",
}


def _marked_evidence(result: dict) -> str:
    """The evidence with the answer marked where it was read, «like this»: in a long passage the span is easy to miss
    ("850 pounds" beside "895 pounds")."""
    evidence, start, end = result["evidence"], result.get("start"), result.get("end")
    if not isinstance(start, int) or not isinstance(end, int) or not 0 <= start < end <= len(evidence):
        return _printable(evidence)
    return f"{_printable(evidence[:start])}«{_printable(evidence[start:end])}»{_printable(evidence[end:])}"


def _ensure_demo_model(directory: Path | None, rebuild: bool = False) -> Path:
    from realm_hf.demo import default_demo_dir, ensure_demo_model

    directory = directory or default_demo_dir()
    if rebuild or not (directory / "model.safetensors").is_file():
        print(f"building the demo model in {directory} ...", file=sys.stderr)
    return ensure_demo_model(directory, rebuild=rebuild)


# What `realm_hf.demo.build_demo_model` saves (model, tokenizer, retriever), and what a tokenizer may add to it.
DEMO_MODEL_FILES = {"block_records.safetensors", "config.json", "model.safetensors", "tokenizer.json",
                    "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "added_tokens.json"}  # fmt: skip


def _check_demo_output(output: Path) -> None:
    """Raises `UsageError` unless `demo --untrained --output` may (re)build the demo model in `output`: a new or empty
    directory, or a demo model saved there before. A file, an index, another model or anything else is named, and
    left alone (the demo model's files would be written among them)."""
    from realm_hf.errors import UsageError

    held = sorted(path.name for path in output.iterdir()) if output.is_dir() else []
    if held and not _is_demo_model(output, held):
        if "index.json" in held:
            what = "an index"
        elif "config.json" in held:
            what = "a model that is not the demo model"
        else:
            what = "files that are no demo model"
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise UsageError(f"--output {output} already holds {what} ({shown}): expected a new or empty directory, or a "
                         "demo model saved there before (it is rebuilt); save the demo model somewhere "
                         "else")  # fmt: skip
    check_writable_directory(output, "--output", purpose="save the demo model in (a new one, or a demo model saved "
                             "before)")  # fmt: skip


def _is_demo_model(directory: Path, held: list[str]) -> bool:
    """Whether `directory` (holding the files `held`) holds the demo model, whole or as a build left it: nothing but
    its files, with the demo corpus as its block records (or, before they were saved, the demo model's size)."""
    from realm_hf.demo import load_demo_corpus

    if not set(held) <= DEMO_MODEL_FILES:
        return False
    blocks = [f"{passage['title']} {passage['text']}".encode() for passage in load_demo_corpus()]
    try:
        if "block_records.safetensors" in held:
            from realm_hf.retrieval import load_block_records

            records = load_block_records(directory / "block_records.safetensors")
            return len(records) == len(blocks) and [bytes(records[i]) for i in range(len(blocks))] == blocks
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("num_block_records") == len(blocks)


def cmd_demo(args) -> int:
    """Answers sample questions with the default model (trained, real corpus) when it is present, else with the
    untrained built-in demo model."""
    from realm_hf.default_model import DEFAULT_QUESTIONS, default_model_dir

    asked = questions_from_arguments(args.questions)
    default = None if args.untrained else default_model_dir()
    if default is None and args.output is not None:  # the untrained demo model is saved there: checked first
        _check_demo_output(Path(args.output))
    if not args.untrained:
        directory = default
        if directory is not None:
            if args.output is not None:
                print(f"note: --output {args.output} is used only with --untrained (where to save the untrained demo "
                      "model); the default model answers here, and nothing is saved", file=sys.stderr)  # fmt: skip
            print(f"realm-minilm-factbook ({directory}): a REALM/ORQA model trained by this project over 43,829 "
                  "Wikipedia and CIA World Factbook passages, all offline.\n", file=sys.stderr)  # fmt: skip
            model, retriever = _load(str(directory))
            _print_answers(answer_questions(model, retriever, asked or DEFAULT_QUESTIONS), as_json=False)
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
    _print_answers(answer_questions(model, retriever, asked or DEMO_QUESTIONS), as_json=False)
    print(f'model, tokenizer and retriever saved in {directory}; try: realm-hf ask --model {directory} "..."')
    return 0


def read_questions(stream) -> list[str]:
    """Questions from a text stream (standard input), one per line, blank lines skipped. Bytes that are not UTF-8
    raise `FileFormatError` naming the byte offset; a stream without a question raises `UsageError` saying whether
    it was empty or blank."""
    from realm_hf.errors import UsageError, not_utf8_error

    data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read().encode("utf-8", "surrogateescape")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise not_utf8_error("standard input", data, error.start, path="<stdin>", hint="") from None
    questions = [_question_of_line(line.strip(), number) for number, line in enumerate(text.splitlines(), start=1)
                 if line.strip()]  # fmt: skip
    if not questions:
        received = "only blank lines" if text else "nothing (empty input)"
        raise UsageError(f"expected questions on standard input (one per line), received {received}")
    return questions


def _question_of_line(line: str, number: int) -> str:
    """A line of standard input as a question: the line itself, or the "question" of a JSON row (a question file,
    `{"question": ..., "answers": [...]}`, piped in: asked, not read as one long question)."""
    from realm_hf.errors import UsageError

    if not (line.startswith("{") and line.endswith("}")):
        return line
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return line
    if isinstance(row, dict) and isinstance(row.get("question"), str):
        return row["question"]
    raise UsageError(f"standard input line {number}: expected a question, or a JSON row with a \"question\" (as "
                     f"question files have), received a JSON object with keys {sorted(row)[:10]} (to score answers "
                     "against a file of questions and answers: realm-hf evaluate --data FILE)")  # fmt: skip


def questions_from_arguments(arguments: list[str]) -> list[str]:
    """The questions given as arguments (`ask`, `demo`). Several arguments of one word each are one question the shell
    split at its spaces (`realm-hf ask Who wrote Hamlet?`): they are asked as one, with a note on stderr. Arguments
    with spaces in them are one question each. Arguments that are all empty or blank raise `UsageError` (exit code 2);
    a blank one among real questions is flagged when it is asked, and the others answered."""
    from realm_hf.errors import UsageError

    if arguments and all(not argument.strip() for argument in arguments):
        raise UsageError(f"expected a question, received only blank ones: {arguments!r:.100}")
    words = [argument.strip() for argument in arguments]
    if len(words) > 1 and all(word and not any(character.isspace() for character in word) for word in words):
        question = " ".join(words)
        print(f"(read the {len(words)} words as one question, {question!r}; to ask several, quote each one)",
              file=sys.stderr)  # fmt: skip
        return [question]
    return list(arguments)


def cmd_ask(args) -> int:
    from realm_hf.errors import UsageError

    questions = questions_from_arguments(args.questions)
    if not questions:
        if sys.stdin.isatty():
            raise UsageError("expected questions as arguments or on standard input (one per line), received none")
        questions = read_questions(sys.stdin)
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
    model_path = model_location(model_path)  # a missing directory says so in its own words, not wrapped below
    if args.index is not None:  # a missing or damaged --index says so in its own words too, before the model loads
        from realm_hf.loading import check_index, is_own_index

        from .index import index_note

        found = check_index(args.index, "--index")
        note = index_note(args.index, is_own_index(model_path, found), found)
        if note:
            print(note, file=sys.stderr)
    device = resolve_device(args.device)  # before loading: a GPU that is not there is named at once
    with loading_model(model_path):
        model, retriever = _load(model_path, args.index)
    choose_searcher(model, args.searcher, args.bm25_fraction, args.bm25_weight)
    model.to(device)  # the index stays where it is: the searcher moves each question's embedding to it
    results = answer_questions(model, retriever, questions, batch_size=args.batch_size, top_k=args.top_k,
                               abstention_threshold=args.abstention_threshold)  # fmt: skip
    _print_answers(results, as_json=args.json)
    failed = [result for result in results if "error" in result]
    if failed:
        print(f"realm-hf ask: error: {len(failed)} of {len(questions)} questions could not be asked (first: "
              f"{failed[0]['error']})", file=sys.stderr)  # fmt: skip
        return EXIT_FAILURE
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = RealmHfArgumentParser(prog="realm-hf", description=DESCRIPTION,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    # The description lists the commands (in the order a newcomer meets them): argparse's own list would repeat it.
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS)
    # A suppressed argument is left out of the usage line too, which then showed no COMMAND. Set after
    # add_subparsers, which prefixes each subcommand's usage with this parser's.
    parser.usage = "%(prog)s [-h] [--debug] COMMAND ..."

    demo = subparsers.add_parser("demo", help="answer sample questions with evidence, with the default model",
                                 description=cmd_demo.__doc__ or "Build the demo model and answer sample questions.")  # fmt: skip
    demo.add_argument("questions", nargs="*", help="questions to ask instead of the sample ones")
    demo.add_argument("--untrained", action="store_true", help="use the untrained 16-passage demo model even when "
                                                               "the default model is present")  # fmt: skip
    demo.add_argument(
        "--output",
        help="where to save the untrained demo model (default: $REALM_HF_HOME/demo or ~/.cache/realm_hf/demo)",
    )
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
    add_searcher_arguments(ask)
    add_device_argument(ask, "the model", "cpu")
    ask.add_argument("--abstention-threshold", type=unit_interval, default=None, metavar="P",
                     help="mark answers whose calibrated confidence is below P as abstained (default: the model's "
                          "calibration.json threshold; 0 never abstains; models without calibration never abstain)")  # fmt: skip
    ask.set_defaults(func=cmd_ask)

    from .calibrate import add_parser as add_calibrate_parser
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
    add_calibrate_parser(subparsers)
    add_pretrain_parser(subparsers)
    add_serve_parser(subparsers)
    return parser


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, except that a command taking Trainer flags (`train`, `pretrain`: see
    `realm_hf.cli.arguments.add_trainer_flags`) gets the words it does not define itself as `args.trainer_argv`, for
    `HfArgumentParser` once Transformers loads ([`main`]). Any other command refuses them at once, as `parse_args`
    does. Imports nothing heavy."""
    RealmHfArgumentParser.argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if not hasattr(args, "trainer_argv"):
            command = _command_parser(parser, args)
            command.error(f"unrecognized arguments: {' '.join(unknown)}{did_you_mean(command, unknown)}")
        args.trainer_argv = unknown
    return args


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command parser `args` were parsed by: `realm-hf index build`'s for `index build ...`."""
    for action in parser._actions:  # argparse keeps its subcommands nowhere public
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
            return _command_parser(action.choices[getattr(args, action.dest)], args)
    return parser


EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def exit_code(error: BaseException) -> int:
    """The exit code for an exception a command raised: 2 for usage errors, 130 for an interrupt, 1 otherwise."""
    from realm_hf.errors import UsageError

    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_USAGE if isinstance(error, UsageError) else EXIT_FAILURE


def one_line(error: BaseException) -> str:
    """`error`'s message on one line. Errors of ours and the built-in ValueError/OSError speak for themselves; anything
    else is probably a bug, and says so with its type."""
    from realm_hf.errors import RealmHfError

    message = "; ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
    if isinstance(error, RealmHfError | ValueError | OSError):
        return message
    return f"{type(error).__name__}: {message} (unexpected: rerun with --debug for the traceback, and report it)"


def _debugging(args) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("REALM_HF_DEBUG", "") not in ("", "0")


def main(argv: list[str] | None = None) -> int:
    """Parses `argv` (before any heavy import: `--help` and usage errors answer at once), then runs the command.

    A failure ends with one line on stderr, `realm-hf COMMAND: error: ...`, and exit code 2 (usage) or 1 (anything
    else); Ctrl-C or SIGINT ends with one line saying whether a rerun resumes (train, pretrain, index build) or starts
    over, and exit code 130. `--debug` or `REALM_HF_DEBUG=1` lets the exception through with its traceback instead.
    """
    parser = build_parser()
    args = parse_command_line(parser, argv)
    if args.command is None:
        parser.print_help()
        return 0
    subcommands = [getattr(args, name, None) for name in ("index_command", "convert_command")]
    prog = " ".join(["realm-hf", args.command, *filter(None, subcommands)])
    # A process started in the background by a non-interactive shell inherits SIGINT as *ignored*, and Python then
    # never raises KeyboardInterrupt: `kill -INT <pid>` (process managers, `timeout -s INT`) did nothing to a build.
    previous_handler = None
    if threading.current_thread() is threading.main_thread():
        previous_handler = signal.signal(signal.SIGINT, interrupt)
    try:
        if hasattr(args, "trainer_argv"):  # `train`, `pretrain`: the Trainer flags, before the package's own imports
            from .arguments import parse_trainer_flags

            args.trainer_flags = parse_trainer_flags(args.trainer_argv, prog, args.required_trainer_flags)
        # a mistyped path named at once, not after torch and Transformers load (usage errors, above, come first)
        check_inputs_exist(args)
        _finish_package_import()
        return args.func(args)
    except KeyboardInterrupt:
        if _debugging(args):
            raise
        # train, pretrain and index build pick up where they stopped; the others start over
        again = "resume where it stopped" if getattr(args, "resumable", False) else "start over"
        print(f"{prog}: interrupted; run the same command again to {again}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        if _debugging(args):
            raise
        print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
        return exit_code(error)
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
        _close_process_group()


def interrupt(signum, frame) -> None:
    """The SIGINT handler of every command: raises `KeyboardInterrupt`, as Python's own does, except inside a
    finalizer (`__del__`), where Python would print "Exception ignored in ..." and drop it (the garbage collector runs
    finalizers during `import transformers`: about one Ctrl-C in seven in a build's first two seconds was lost, and the
    build ran to the end). There the signal is sent again 10 ms later, to land in ordinary code."""
    caller = frame
    while caller is not None:
        if caller.f_code.co_name == "__del__":
            timer = threading.Timer(0.01, os.kill, (os.getpid(), signum))
            timer.daemon = True
            timer.start()
            return
        caller = caller.f_back
    raise KeyboardInterrupt


def _finish_package_import() -> None:
    """Runs `realm_hf/__init__.py` if the `realm-hf` entry point (`realm_hf_cli`) deferred it to parse the command
    line quickly: a command then sees the package exactly as after `import realm_hf` (Auto classes registered)."""
    package = sys.modules.get("realm_hf")
    if package is not None and package.__dict__.pop("__realm_hf_deferred_init__", False):
        package.__spec__.loader.exec_module(package)


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

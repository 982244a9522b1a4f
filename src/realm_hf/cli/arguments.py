"""Helpers shared by the `realm-hf` subcommands: the parser class, argparse types, the Trainer flags of `train` and
`pretrain`, the finished-run check, and quiet model loading. Imports nothing heavy: every parser is declared, and
`--help` answered, before torch or Transformers load (the Trainer flags' parser is built only when a command runs or
`--help-trainer` asks)."""

import argparse
import contextlib
import json
import math
import os
from pathlib import Path


class RealmHfArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line usage error (`PROG: error: MESSAGE (see `PROG --help`)`, exit code 2) and a
    `--debug` option on every (sub)command: show the traceback of a failure instead of one line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # SUPPRESS: a subcommand that is not given --debug leaves the top-level value alone.
        self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help="on failure, show the full traceback (also: REALM_HF_DEBUG=1)")  # fmt: skip

    # The words being parsed, set by `realm_hf.cli.main.parse_command_line`: a missing required option may be there
    # misspelt ("--ouput"), which argparse reports only as missing.
    argv: list[str] = []

    def error(self, message: str):
        if message.startswith("the following arguments are required"):
            known = {option for action in self._actions for option in action.option_strings}
            close = closest_option(self, [word for word in self.argv if word.split("=", 1)[0] not in known])
            if close:
                message += f" ({close[0]}: did you mean {close[1]}?)"
        message += closest_subcommand(self, message)
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def closest_option(parser: argparse.ArgumentParser, unknown: list[str]) -> tuple[str, str] | None:
    """`(word, option)` for the first unknown `--word` close to one of `parser`'s options, else `None`."""
    import difflib

    options = [option for action in parser._actions for option in action.option_strings]
    for word in unknown:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], options, n=1, cutoff=0.7)
            if close:
                return word.split("=", 1)[0], close[0]
    return None


def closest_subcommand(parser: argparse.ArgumentParser, message: str) -> str:
    """`"; did you mean 'ask'?"` when `message` is argparse's "invalid choice: 'aks'" for `parser`'s subcommands and
    one is close, else `""` (argparse suggests options, as `did_you_mean` does, but not subcommands)."""
    import difflib
    import re

    found = re.search(r"invalid choice: '([^']*)'", message)
    commands = [name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
                for name in action.choices]  # fmt: skip
    if not found or not commands:
        return ""
    close = difflib.get_close_matches(found.group(1), commands, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def did_you_mean(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """`"; did you mean --top-k?"` for the first unknown option close to one of `parser`'s, else `""`."""
    close = closest_option(parser, unknown)
    return f"; did you mean {close[1]}?" if close else ""


def model_location(value: str, option: str = "--model") -> str:
    """`value` if it can name a model: a directory holding config.json, or something shaped like a Hub repo id (`name`
    or `owner/name`) that the Hub cache has or the Hub can give. Otherwise the error names `option` and says what is
    wrong: a path that does not exist (`MissingFileError`, rather than the Hub client's "Repo id must be in the form
    ..."), a file, a directory without config.json (an index given as the model is named as one), a repo id neither in
    the Hub cache nor on a reachable Hub (`ModelLoadError`)."""
    from realm_hf.errors import MissingFileError, ModelLoadError, missing_model_error

    if os.path.exists(value):
        if not os.path.isdir(value):
            raise MissingFileError(f"{option} {value!r} is a file; expected a model directory or a Hub repo id")
        if not os.path.isfile(os.path.join(value, "config.json")):
            from realm_hf.retrieval import is_searcher_directory

            if is_searcher_directory(value):
                raise ModelLoadError(f"{option} {value!r} is an index, not a model: pass it as --index {value} (and "
                                     f"the model that built it as {option}, or none for the default model)")  # fmt: skip
            raise ModelLoadError(f"{option} {value!r} holds no config.json: expected a model directory (written by "
                                 "save_pretrained or `realm-hf train`) or a Hub repo id")  # fmt: skip
        return value
    if (error := missing_model_error(option, value)) is not None:
        raise error
    from realm_hf.checkpoints import check_hub_model

    try:
        check_hub_model(value)  # says at once when the Hub cannot have it, before any file is read
    except ModelLoadError as error:
        raise ModelLoadError(f"{option} {error}") from None
    return value


# The other inputs `check_inputs_exist` names, by their argparse dest, with what they should be.
INPUT_FILES = {
    "data": 'a JSON Lines file of {"question": ..., "answers": [...]} rows',
    "train_file": "a file of training questions: .jsonl, .json, .csv or .parquet",
    "documents": "a document store directory, a JSONL / CSV / TSV / Parquet file of rows, or a text file or folder of them",
}


def check_inputs_exist(args: argparse.Namespace) -> None:
    """Names a command's input that does not exist before the package's heavy imports (torch and Transformers take
    about 6 s), so that a mistyped path answers at once, with the message the command would give later: `--index`,
    `--corpus`, a `--model` that is a path, `--data`, `--train-file` and `--documents`."""
    from realm_hf.errors import MissingFileError, missing_index_error, missing_model_error

    from .corpus import missing_corpus_error

    def given(name: str) -> str | None:
        value = getattr(args, name, None)
        return value if isinstance(value, str) and value and not os.path.exists(value) else None

    if (index := given("index")) is not None:
        raise missing_index_error("--index", index)
    if (corpus := given("corpus")) is not None:
        raise missing_corpus_error(corpus)
    if (model := given("model")) is not None and (error := missing_model_error("--model", model)) is not None:
        raise error
    for name, expected in INPUT_FILES.items():
        if (path := given(name)) is not None:
            option = "--" + name.replace("_", "-")
            raise MissingFileError(f"{option} {path!r}: no such file or directory (expected {expected})")


def device_name(value: str) -> str:
    """`auto`, `cpu`, `cuda` or `cuda:N`, or an argparse error that names what was received (checked against the
    machine later, by `resolve_device`)."""
    if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {value!r}")


def resolve_device(value: str):
    """The `torch.device` that `--device` names: `auto` is this process's GPU (`cuda:LOCAL_RANK`, so each process of
    a `torchrun` launch takes its own) where torch sees one, else the CPU. A GPU that is not there raises
    `ValueError` naming what was asked for and what torch sees."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if value == "auto":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % count) if count else torch.device("cpu")
    device = torch.device(value)
    if device.type == "cuda" and (count == 0 or (device.index or 0) >= count):
        sees = "no GPU (torch.cuda.is_available() is False)" if count == 0 else f"{count} GPU(s), cuda:0..{count - 1}"
        raise ValueError(f"--device {value}: torch sees {sees}; use --device cpu or auto")
    return device


def add_device_argument(parser: argparse.ArgumentParser, what: str, default: str) -> None:
    parser.add_argument("--device", type=device_name, default=default,
                        help=f"where {what} runs: auto (this process's GPU where torch sees one, else the CPU), cpu, "
                             f"cuda or cuda:N (default: {default})")  # fmt: skip


def add_searcher_arguments(parser: argparse.ArgumentParser) -> None:
    """`--searcher`, `--bm25-fraction`, `--bm25-weight`: which blocks a model reads (`ask`, `evaluate`); see
    [`choose_searcher`]."""
    parser.add_argument("--searcher", choices=("dense", "hybrid", "bm25"), default=None,
                        help="which blocks are read: the model's dense search, the union of dense and BM25 candidates "
                             "(hybrid), or BM25's alone; all scored by the model's own relevance (default: the "
                             "model's own choice, its searcher.json, else dense)")  # fmt: skip
    parser.add_argument("--bm25-fraction", type=unit_interval, default=None, metavar="F",
                        help="with hybrid candidates, the share of the blocks read that BM25 chooses (default: the "
                             "model's searcher.json, else 0.4)")  # fmt: skip
    parser.add_argument("--bm25-weight", type=non_negative_float, default=None, metavar="W",
                        help="with hybrid or BM25 candidates, add W x (BM25 score / the question's best) to each "
                             "block's relevance (default: the model's searcher.json, else 0)")  # fmt: skip


def choose_searcher(
    model, searcher: str | None, bm25_fraction: float | None, bm25_weight: float | None = None
) -> None:
    """Sets which blocks `model` reads for `--searcher` / `--bm25-fraction` / `--bm25-weight`; `None` keeps the model's
    own choice (its `searcher.json`: hybrid candidates, else dense)."""
    from realm_hf.retrieval.hybrid import HybridSearcher, hybrid_searcher_for

    own = model.searcher
    if searcher is None:
        if (bm25_fraction is None and bm25_weight is None) or not isinstance(own, HybridSearcher):
            return
        searcher = "hybrid"
    if searcher == "dense":
        if isinstance(own, HybridSearcher):
            model.searcher = own.dense
        return
    if searcher == "bm25":
        bm25_fraction = 1.0
    elif bm25_fraction is None:
        bm25_fraction = own.bm25_fraction if isinstance(own, HybridSearcher) else 0.4
    if bm25_weight is None:  # the model's own weight goes with its hybrid candidates; BM25's alone are scored as is
        bm25_weight = own.bm25_weight if isinstance(own, HybridSearcher) and searcher == "hybrid" else 0.0
    bm25 = own.bm25 if isinstance(own, HybridSearcher) else None
    model.searcher = hybrid_searcher_for(model, bm25_fraction=bm25_fraction, bm25=bm25, bm25_weight=bm25_weight)


def _number_at_least(value: str, parse, minimum: int, what: str):
    """`parse(value)` if it is a finite number >= `minimum`, else an argparse error that names what was received."""
    try:
        number = parse(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
    if not minimum <= number < math.inf:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
    return number


def unit_interval(text: str) -> float:
    """A number in [0, 1] (a fraction, a probability), or an argparse error naming what was received."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, received {text!r}")
    return value


def positive_int(value: str) -> int:
    """An integer >= 1, or an argparse error that names what was received."""
    return _number_at_least(value, int, 1, "a positive integer")


def non_negative_int(value: str) -> int:
    """An integer >= 0, or an argparse error that names what was received."""
    return _number_at_least(value, int, 0, "an integer >= 0")


def positive_float(value: str) -> float:
    """A finite number > 0, or an argparse error that names what was received."""
    number = _number_at_least(value, float, 0, "a number > 0")
    if number == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value!r}")
    return number


def non_negative_float(value: str) -> float:
    """A finite number >= 0, or an argparse error that names what was received."""
    return _number_at_least(value, float, 0, "a number >= 0")


TRAINER_FLAGS_HELP = """\
Trainer flags: every transformers.TrainingArguments field is a flag of this command too, as --name or
--name-with-dashes (--gradient_accumulation_steps 4, --weight-decay 0, --lr_scheduler_type cosine, --report_to
tensorboard, ...), parsed by transformers.HfArgumentParser; `{prog} --help-trainer` lists them all (it loads
Transformers: seconds). A Trainer flag not given keeps this command's recipe, not the TrainingArguments default:
"""


def add_trainer_flags(parser: argparse.ArgumentParser, required: tuple[str, ...] = ()) -> None:
    """Lets `parser` (`realm-hf train` / `pretrain`) take every `TrainingArguments` field as a flag. The words it does
    not define itself go to `args.trainer_argv` (`realm_hf.cli.main.parse_command_line`); `realm_hf.cli.main.main`
    turns them into `args.trainer_flags` with [`parse_trainer_flags`], which loads Transformers, before the command
    runs. `required`: fields that must be given (`("max_steps",)`). `--help-trainer` lists the flags."""
    parser.add_argument("--help-trainer", action=TrainerHelpAction, help="list the Trainer flags (every "
                        "TrainingArguments field) and exit; loads Transformers")  # fmt: skip
    parser.set_defaults(trainer_argv=[], trainer_flags={}, required_trainer_flags=tuple(required))


class TrainerHelpAction(argparse.Action):
    """`--help-trainer`: prints the help of the Trainer flags' parser and exits, before required options are checked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        trainer_flag_parser(parser.prog).print_help()
        parser.exit()


def trainer_flag_parser(prog: str):
    """A `transformers.HfArgumentParser` of `TrainingArguments` (`--name` and `--name-with-dashes` for each field),
    whose flags have no defaults: only the flags given reach the namespace, so the command's recipe fills in the rest.
    A usage error raises `UsageError` (one line, exit code 2 from `realm_hf.cli.main`)."""
    from transformers import HfArgumentParser, TrainingArguments

    from realm_hf.errors import UsageError

    class TrainerFlagParser(HfArgumentParser):
        def add_argument(self, *names, **kwargs):
            return super().add_argument(*names, **{**kwargs, "default": argparse.SUPPRESS})

        def error(self, message: str):
            raise UsageError(f"{message} (see `{self.prog} --help` and `{self.prog} --help-trainer`)")

    return TrainerFlagParser(
        TrainingArguments, prog=prog, add_help=False,
        description=f"The Trainer flags of `{prog}`: every transformers.TrainingArguments field, as --name or "
        f"--name-with-dashes. A flag not given keeps the command's recipe (`{prog} --help`), not the TrainingArguments "
        "default. The command's own spellings (--output-dir, --batch-size, ...) take precedence over the same "
        "fields here.",
    )  # fmt: skip


def parse_trainer_flags(words: list[str], prog: str, required: tuple[str, ...] = ()) -> dict:
    """The `TrainingArguments` fields set by `words` (the command-line words `prog` does not define itself), e.g.
    `["--weight_decay", "0.1", "--lr-scheduler-type", "constant"]` -> `{"weight_decay": 0.1, "lr_scheduler_type":
    "constant"}`; fields not given are absent. A word that is not a Trainer flag, a bad value, a missing `required`
    field or a step count (`--max-steps`, `--eval-steps`, `--save-steps`, `--logging-steps`) not above 0 raises
    `UsageError`."""
    from realm_hf.errors import UsageError

    flags = vars(trainer_flag_parser(prog).parse_args(list(words)))
    missing = [f"--{name.replace('_', '-')}" for name in required if name not in flags]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (see `{prog} --help`)")
    for name, bound, allowed in _TRAINER_FLAG_RANGES:
        if name in flags and not allowed(flags[name]):
            raise UsageError(f"argument --{name.replace('_', '-')}: expected a number {bound}, got {flags[name]} (see "
                             f"`{prog} --help`)")  # fmt: skip
    report_to = flags.get("report_to") or []
    missing = [name for name in ([report_to] if isinstance(report_to, str) else report_to) if name not in ("none", "all")
               and name not in _available_integrations()]  # fmt: skip
    if missing:
        raise UsageError(f"argument --report-to: {missing[0]} is not installed (pip install {missing[0]}), or pass "
                         "--report-to none")  # fmt: skip
    return flags


# Trainer flags whose values the Trainer accepts and then fails on (ZeroDivisionError), or silently misuses.
_TRAINER_FLAG_RANGES = (
    *((name, "> 0", lambda value: value > 0) for name in ("max_steps", "eval_steps", "save_steps", "logging_steps",
                                                          "learning_rate", "gradient_accumulation_steps",
                                                          "num_train_epochs", "per_device_train_batch_size",
                                                          "per_device_eval_batch_size")),
    *((name, ">= 0", lambda value: value >= 0) for name in ("weight_decay", "warmup_steps", "max_grad_norm")),
)  # fmt: skip


def _available_integrations() -> list[str]:
    """The reporting integrations the Trainer can use here (their packages installed): Transformers' own list."""
    from transformers.integrations import get_available_reporting_integrations

    return get_available_reporting_integrations()


def refuse_to_overwrite(output: Path, option: str = "--output", resumable: bool = False) -> None:
    """Raises `UsageError` where `output` already holds files: a command that writes a model or an index there would
    mix its files with, or replace, what is there (a fine-tuned model, another index). `resumable`: the directory is
    an unfinished or earlier run of the same command, which it may go on with."""
    from realm_hf.errors import UsageError

    if resumable or not output.is_dir():
        return
    held = sorted(path.name for path in output.iterdir())
    if held:
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise UsageError(f"{option} {output} already holds files ({shown}): expected a new or empty directory; "
                         "remove it, or write somewhere else")  # fmt: skip


def check_writable_directory(path: str | Path, option: str = "--output", purpose: str = "write in") -> None:
    """Raises `UsageError` unless `path` is, or can be made, a directory to write in: not a file, not inside one, and
    its nearest existing ancestor takes a new entry (tried with an empty directory, removed at once). A command checks
    its output so before it reads or loads anything, and names the cause, not a bare `[Errno 2]` after minutes.

    The message names `option`, `path` as received, and what was expected: "a directory to `purpose`", e.g.
    `--output-dir 'x' is a file; expected a directory to write the trained model in (a new one)` for
    `purpose="write the trained model in (a new one)"`."""
    import tempfile

    from realm_hf.errors import UsageError

    received = str(path)
    path = Path(path)
    ancestor = path.absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        where = "is a file" if ancestor == path.absolute() else f"is inside {ancestor}, which is a file"
        raise UsageError(f"{option} {received!r} {where}; expected a directory to {purpose}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".realm-hf-write-check-", dir=ancestor))
    except OSError as error:
        where = "it" if ancestor == path.absolute() else f"its parent {ancestor}"
        raise UsageError(f"{option} {received!r}: expected a directory to {purpose}, but {where} takes no new files "
                         f"({error.strerror or error})") from None  # fmt: skip


def finished_run(results_path: Path, max_steps: int) -> bool:
    """Whether `results_path` (the summary a finished `realm-hf train`/`pretrain` run writes) reports `max_steps`
    steps or more. Resuming a Trainer from a checkpoint already at `max_steps` would run one more step (transformers
    5.23), so the commands stop early instead, saying so."""
    if not results_path.is_file():
        return False
    done = json.loads(results_path.read_text(encoding="utf-8")).get("global_step", 0) >= max_steps
    if done:
        print(f"{results_path.parent} already holds a finished run of {max_steps} steps ({results_path.name}); nothing "
              "to do (--no-resume starts afresh).")  # fmt: skip
    return done


@contextlib.contextmanager
def without_weight_loading_bar():
    """Hides Transformers' per-tensor "Loading weights" bar, which tells someone asking a question nothing (the load
    takes a second); download bars and every other bar stay."""
    from transformers.utils import logging as hf_logging

    def hook(factory, args, kwargs):
        if kwargs.get("desc") == "Loading weights":
            kwargs = {**kwargs, "disable": True}
        return previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)

    previous = hf_logging.set_tqdm_hook(hook)
    try:
        yield
    finally:
        hf_logging.set_tqdm_hook(previous)


@contextlib.contextmanager
def loading_model(source: str):
    """Turns an error loading the model `source` into one line that names it and what `--model` takes (a
    `ModelLoadError`); an index that does not fit the model (`IndexMismatchError`) is let through: its message names
    the index, and --model advice would mislead. The one wording of `ask`, `serve` and `evaluate`."""
    from realm_hf.errors import IndexMismatchError, ModelLoadError

    from .main import one_line

    try:
        yield
    except IndexMismatchError:
        raise
    except (OSError, ValueError) as error:
        raise ModelLoadError(
            f"could not load a REALM open-QA model from {source!r}: {one_line(error)} (--model takes a directory "
            "written by save_pretrained or a Hub repo id such as google/realm-orqa-nq-openqa)"
        ) from error

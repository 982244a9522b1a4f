"""`realm-hf train` / `pretrain` take every `TrainingArguments` field as a flag (HfArgumentParser), on top of the
project's recipe defaults; the project's own flags keep their spelling, default and meaning. The TrainingArguments each
command builds are checked directly (`training_arguments`), without training."""

import dataclasses

import pytest
from transformers import TrainingArguments

from realm_hf.cli import pretrain, train
from realm_hf.cli.arguments import parse_trainer_flags
from realm_hf.cli.main import build_parser, main, parse_command_line
from realm_hf.errors import UsageError
from realm_hf.training import num_update_steps, orqa_warmup_steps


def _args(argv: list[str]):
    """The namespace `main` hands to the command: the project's flags, and the Trainer flags parsed."""
    args = parse_command_line(build_parser(), argv)
    args.trainer_flags = parse_trainer_flags(
        args.trainer_argv, f"realm-hf {args.command}", args.required_trainer_flags
    )
    return args


def _train(tmp_path, *flags: str, num_examples: int = 100, evaluate: bool = True) -> TrainingArguments:
    args = _args(["train", "--model", "m", "--train-file", "t.jsonl", "--output-dir", str(tmp_path), "--fp32", *flags])
    return train.training_arguments(args, num_examples, evaluate=evaluate)


def _pretrain(tmp_path, *flags: str) -> TrainingArguments:
    args = _args(["pretrain", "--embedder", "e", "--documents", "d", "--output-dir", str(tmp_path), "--fp32", *flags])
    return pretrain.training_arguments(args)


TRAINER_ONLY = ["--weight_decay", "0.2", "--gradient_accumulation_steps", "2", "--lr_scheduler_type", "constant",
                "--adam-beta2", "0.98", "--max-grad-norm", "0.5", "--report_to", "none",
                "--dataloader_drop_last"]  # fmt: skip


@pytest.mark.parametrize("build", [_train, _pretrain])
def test_trainer_flags_the_project_does_not_list_reach_the_training_arguments(build, tmp_path):
    extra = ["--max-steps", "10"] if build is _pretrain else []
    training_args = build(tmp_path, *TRAINER_ONLY, *extra)
    assert training_args.weight_decay == 0.2
    assert training_args.gradient_accumulation_steps == 2
    assert training_args.lr_scheduler_type == "constant"
    assert training_args.adam_beta2 == 0.98 and training_args.max_grad_norm == 0.5
    assert training_args.report_to == [] and training_args.dataloader_drop_last is True


def test_train_recipe_defaults_apply_when_no_flag_is_given(tmp_path):
    args = _train(tmp_path, num_examples=100)
    max_steps = num_update_steps(100, 8, 1.0)
    assert args.max_steps == max_steps == 13
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm) == (1e-5, 0.01, 1.0)
    assert args.lr_scheduler_type == "linear"
    assert args.warmup_steps == orqa_warmup_steps(max_steps)
    assert args.eval_steps == args.save_steps == 1 and args.logging_steps == 1  # a tenth of the run
    assert (args.per_device_train_batch_size, args.per_device_eval_batch_size) == (8, 16)
    assert (args.save_total_limit, args.seed, args.optim, args.report_to) == (2, 42, "adamw_torch_fused", [])
    assert args.load_best_model_at_end and args.metric_for_best_model == "exact_match"
    assert args.remove_unused_columns is False and args.label_names == ["answer_ids"]
    assert args.output_dir == str(tmp_path) and not args.bf16
    without_dev = _train(tmp_path, evaluate=False)
    assert without_dev.eval_strategy == "no" and not without_dev.load_best_model_at_end


def test_train_flags_of_before_keep_their_meaning(tmp_path):
    """The flags examples/build_default_model.py passes, in the project's spelling."""
    args = _train(tmp_path, "--batch-size", "4", "--learning-rate", "1e-4", "--eval-steps", "49", "--seed", "3",
                  "--logging-steps", "10", "--warmup-steps", "20", "--max-steps", "490", "--save-total-limit", "3",
                  "--optim", "sgd", "--eval-batch-size", "5", "--quiet", "--cpu")  # fmt: skip
    assert (args.per_device_train_batch_size, args.per_device_eval_batch_size, args.learning_rate) == (4, 5, 1e-4)
    assert (args.max_steps, args.eval_steps, args.save_steps, args.logging_steps) == (490, 49, 49, 10)
    assert (args.warmup_steps, args.seed, args.save_total_limit, args.optim) == (20, 3, 3, "sgd")
    assert args.disable_tqdm and args.use_cpu
    # --num-epochs counts steps over the training set, at --batch-size per step.
    assert _train(tmp_path, "--num-epochs", "2", "--batch-size", "4", num_examples=10).max_steps == 6


@pytest.mark.parametrize(
    ("project", "trainer"),
    [
        (["--learning-rate", "3e-4"], ["--learning_rate", "3e-4"]),
        (["--eval-steps", "7"], ["--eval_steps", "7"]),
        (["--warmup-steps", "3"], ["--warmup_steps", "3"]),
        (["--batch-size", "4"], ["--per_device_train_batch_size", "4"]),
        (["--batch-size", "4"], ["--per-device-train-batch-size", "4"]),
        (["--num-epochs", "2"], ["--num_train_epochs", "2"]),
        (["--output-dir", "o"], ["--output_dir", "o"]),
    ],
)
def test_a_flag_named_both_ways_means_the_same(project, trainer, tmp_path):
    fields = ("learning_rate", "per_device_train_batch_size", "max_steps", "eval_steps", "warmup_steps", "output_dir")
    default, one, other = (_train(tmp_path, *words, num_examples=40) for words in ([], project, trainer))
    assert [getattr(one, name) for name in fields] == [getattr(other, name) for name in fields]
    assert [getattr(one, name) for name in fields] != [getattr(default, name) for name in fields]


def test_an_explicit_flag_overrides_the_recipe_even_at_the_trainer_default(tmp_path):
    # 5e-5 and 0.0 are TrainingArguments' own defaults: given explicitly, they still replace ORQA's 1e-5 and 0.01.
    args = _train(tmp_path, "--learning_rate", "5e-5", "--weight-decay", "0")
    assert (args.learning_rate, args.weight_decay) == (5e-5, 0.0)


def test_pretrain_recipe_defaults_and_flags_of_before(tmp_path):
    args = _pretrain(tmp_path, "--max-steps", "300")
    assert args.output_dir == str(tmp_path / "checkpoints") and args.max_steps == 300
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm, args.warmup_steps) == (3e-5, 0.01, 1.0, 30)
    assert (args.logging_steps, args.save_steps, args.save_total_limit, args.seed) == (10, 100, 2, 42)
    assert (args.per_device_train_batch_size, args.optim, args.report_to, args.label_names) == (8, "adamw_torch_fused",
                                                                                                [], [])  # fmt: skip
    assert args.remove_unused_columns is False and args.dataloader_num_workers == 0
    # The flags examples/pretrain_factbook.py passes, in the project's spelling.
    args = _pretrain(tmp_path, "--max-steps", "240", "--batch-size", "4", "--learning-rate", "1e-4", "--warmup-steps",
                     "24", "--logging-steps", "5", "--save-steps", "40", "--seed", "0", "--optim", "sgd")  # fmt: skip
    assert (args.max_steps, args.per_device_train_batch_size, args.learning_rate, args.warmup_steps) == (
        240,
        4,
        1e-4,
        24,
    )
    assert (args.logging_steps, args.save_steps, args.seed, args.optim) == (5, 40, 0, "sgd")


@pytest.mark.parametrize("command", ["train", "pretrain"])
def test_every_trainer_flag_passes_the_project_parser_untouched(command):
    """argparse abbreviations would let a project flag swallow a Trainer flag that is a prefix of it: none is, and
    only the fields the command owns under its own name are taken."""
    own = {"output_dir", "per_device_train_batch_size", "debug"}
    own |= {"per_device_eval_batch_size", "num_train_epochs"} if command == "train" else set()
    required = {"train": ["--model", "m", "--train-file", "t"], "pretrain": ["--embedder", "e", "--documents", "d"]}
    parser = build_parser()
    for field in dataclasses.fields(TrainingArguments):
        if not field.init or field.name in own:
            continue
        for flag in {f"--{field.name}", f"--{field.name.replace('_', '-')}"}:
            args = parse_command_line(parser, [command, *required[command], "--output-dir", "o", flag, "1"])
            assert args.trainer_argv == [flag, "1"], flag


def _one_line_usage_error(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_an_unknown_flag_is_a_one_line_usage_error(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text("")  # it exists: a missing --train-file is named before the command checks
    base = ["--model", "m", "--train-file", str(tmp_path / "t.jsonl"), "--output-dir", str(tmp_path / "o")]
    assert _one_line_usage_error(["train", *base, "--no-such-flag", "1"], capsys) == (
        "realm-hf train: error: unrecognized arguments: --no-such-flag 1 (see `realm-hf train --help` and "
        "`realm-hf train --help-trainer`)"
    )
    line = _one_line_usage_error(["train", *base, "--learning_rate", "fast"], capsys)
    assert line.startswith("realm-hf train: error: argument --learning_rate/--learning-rate: invalid float value")
    line = _one_line_usage_error(["train", *base, "--max-steps", "0"], capsys)
    assert line.startswith("realm-hf train: error: argument --max-steps: expected a number > 0, got 0")
    for flag, value, bound in [("--learning-rate", "-1", "> 0"), ("--gradient_accumulation_steps", "0", "> 0"),
                               ("--weight-decay", "-3", ">= 0"), ("--warmup-steps", "-1", ">= 0")]:  # fmt: skip
        line = _one_line_usage_error(["train", *base, flag, value], capsys)
        assert (
            f"expected a number {bound}, got {float(value) if '.' in value or 'rate' in flag or 'decay' in flag else int(value)}"
            in line
        ), line
    with pytest.raises(SystemExit) as exit_info:  # the command's own flag: argparse answers before anything loads
        main(["train", *base, "--num-epochs", "0"])
    assert exit_info.value.code == 2 and "--num-epochs" in capsys.readouterr().err
    line = _one_line_usage_error(["train", *base, "--report_to", "surely_not_installed_tracker"], capsys)
    assert "surely_not_installed_tracker is not installed" in line and "--report-to none" in line
    line = _one_line_usage_error(["train", *base, "--max-steps", "5", "--num-epochs", "2"], capsys)
    assert line.startswith("realm-hf train: error: argument --num-epochs: not allowed with argument --max-steps")
    pretrain_base = ["--embedder", "e", "--documents", "d", "--output-dir", str(tmp_path / "o")]
    assert _one_line_usage_error(["pretrain", *pretrain_base], capsys) == (
        "realm-hf pretrain: error: the following arguments are required: --max-steps (see `realm-hf pretrain --help`)"
    )
    # A command without Trainer flags refuses an unknown flag while parsing, as before.
    with pytest.raises(SystemExit) as exit_info:
        main(["ask", "--weight_decay", "0.1", "Who?"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("realm-hf ask: error: unrecognized arguments:")
    with pytest.raises(UsageError, match="unrecognized arguments: --bogus"):
        parse_trainer_flags(["--bogus"], "realm-hf train")


def test_help_trainer_lists_every_trainer_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--help-trainer"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: realm-hf train")
    for flag in ("--gradient_accumulation_steps", "--weight-decay", "--lr_scheduler_type", "--report_to"):
        assert flag in out

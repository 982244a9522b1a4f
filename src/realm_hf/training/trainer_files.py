"""What a realm_hf `Trainer` writes beside its checkpoints and saved models, without pickle.

`Trainer._save` stores the run's `TrainingArguments` as `training_args.bin`, a pickle (`torch.save`). realm_hf writes
no pickle, so its trainers store them as `training_args.json` (`TrainingArguments.to_json_string()`, readable by any
tool) instead. Nothing reads either file back: resuming from a checkpoint uses the arguments of the new run.
"""

from pathlib import Path

from ..atomic import atomic_path

TRAINING_ARGS_FILE = "training_args.json"
PICKLED_TRAINING_ARGS_FILE = "training_args.bin"  # the Trainer's name (transformers.trainer.TRAINING_ARGS_NAME)


class JsonTrainingArgumentsMixin:
    """Mixed into a `Trainer` subclass (first among its bases): each save writes `training_args.json` where the
    Trainer wrote the pickled `training_args.bin`, which is removed."""

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        super()._save(output_dir, state_dict=state_dict)
        if not self.args.should_save:
            return
        directory = Path(output_dir if output_dir is not None else self.args.output_dir)
        (directory / PICKLED_TRAINING_ARGS_FILE).unlink(missing_ok=True)
        with atomic_path(directory / TRAINING_ARGS_FILE) as temporary:
            Path(temporary).write_text(self.args.to_json_string(), encoding="utf-8")


__all__ = ["PICKLED_TRAINING_ARGS_FILE", "TRAINING_ARGS_FILE", "JsonTrainingArgumentsMixin"]

"""Open-QA fine-tuning of `RealmForOpenQA` with the HF `Trainer`: the ORQA recipe, several questions per step.

ORQA (Lee et al. 2019) and REALM fine-tuning train the question encoder and the reader on (question, answers) pairs:
retrieve `searcher_beam_size` blocks (5000) by maximum inner product against frozen block embeddings, read the best
`reader_beam_size` (5), and minimise the retriever's marginal log-loss over blocks that contain an answer plus the
reader's marginal log-loss over spans that equal one. transformers 4.x could compute that loss for one question per
call and re-tokenized every retrieved block each step; here a step holds a batch of questions (the loss is the mean of
their per-question losses), retrieval goes through the retrieval layer (`model.searcher`, or `block_emb`), and answer
supervision comes from a corpus tokenized once (`PreTokenizedRetriever`).

    from realm_hf.training import OpenQACollator, OpenQATrainer, orqa_training_arguments

    model = RealmForOpenQA.from_pretrained(path, retriever=pretokenized_retriever, searcher=searcher)
    args = orqa_training_arguments("out", max_steps=2000, per_device_train_batch_size=8, eval_steps=200)
    trainer = OpenQATrainer(model=model, args=args, train_dataset=train, eval_dataset=dev,
                            data_collator=OpenQACollator(tokenizer))
    trainer.train()          # keeps the checkpoint with the best dev exact match

Rows are `{"question": str, "answers": list[str]}` (NQ-open layout) or `{"question": str, "answer": str | list[str]}`
(WebQuestions-style); other columns are ignored.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import Trainer, TrainingArguments
from transformers.utils import logging

from ..evaluation.metrics import exact_match, f1_score
from ..precision import resolve_precision
from ..retrieval.hybrid import searching_for
from .trainer_files import JsonTrainingArgumentsMixin

logger = logging.get_logger(__name__)

# Modules of RealmForOpenQA that no forward pass uses: the embedder's and reader's unused language-model heads (kept
# for checkpoint compatibility with 4.x) and the reader's pooler. Frozen so that the optimizer holds no state for them
# and DDP finds no unused parameters.
UNUSED_MODULES = ("embedder.cls.predictions", "reader.cls", "reader.realm.pooler")


def question_of(row: Mapping[str, Any]) -> str:
    """The question of a row, a non-empty string; else a `ValueError` saying what was received."""
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"expected a non-empty 'question' string, received {question!r}")
    return question


def answers_of(row: Mapping[str, Any]) -> list[str]:
    """The gold answers of a row: `row["answers"]` (a list, or one string) or `row["answer"]`. Whole numbers
    (`"answers": [1999]`) are read as the strings they spell; anything else that is not a string (a dict, a decimal
    number, `null` in the list) raises a `ValueError` saying what was expected and what was received."""
    for key in ("answers", "answer"):
        # A table with both columns (datasets fills the missing one with None) holds the answers in either.
        if row.get(key) is not None:
            value = row[key]
            answers = list(value) if isinstance(value, list | tuple) else [value]
            if isinstance(value, Mapping) or not all(_is_answer(answer) for answer in answers):
                raise ValueError(_not_answers_message(key, value))
            return [answer if isinstance(answer, str) else str(answer) for answer in answers]
    raise ValueError(f"expected a row with 'answers' or 'answer', received keys {sorted(row)}.")


def _is_answer(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _not_answers_message(key: str, value: Any) -> str:
    expected = f"expected {key!r} to be a list of strings (or one string)"
    if isinstance(value, Mapping):
        hint = (" (SQuAD's layout: give the answer texts themselves, \"answers\": [\"...\"])" if "text" in value
                else "")  # fmt: skip
        return f"{expected}, received a dict with keys {sorted(value)}{hint}."
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    items = value if isinstance(value, list | tuple) else [value]
    if any(isinstance(item, float) for item in items):
        return (f"{expected}, received {shown}: write a number as the documents spell it, as a string "
                '("answers": ["1.50"]).')  # fmt: skip
    kinds = sorted({"null" if item is None else type(item).__name__ for item in items if not _is_answer(item)})
    return f"{expected}, received {shown} (holding {', '.join(kinds)})."


@dataclass
class OpenQACollator:
    r"""
    Turns `{"question", "answers"}` rows into `RealmForOpenQA` training inputs.

    Returns `input_ids`, `attention_mask`, `token_type_ids` of shape `(B, L)` (`[CLS] question [SEP]`, padded to the
    longest question) and `answer_ids` of shape `(B, A, T)`: each answer's wordpieces without special tokens, padded
    with -1 (A = most answers of a row, T = longest answer). Rows without answers (e.g. for prediction) are allowed
    when `with_answers=False`.
    """

    tokenizer: Any = field(metadata={"help": "The model's tokenizer."})
    max_question_length: int = field(
        default=64, metadata={"help": "Wordpieces per question, special tokens included."}
    )
    with_answers: bool = field(default=True, metadata={"help": "Also return `answer_ids` (needed for the loss)."})

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not rows:
            raise ValueError("expected a non-empty list of rows, received an empty one.")
        questions = []
        for row in rows:
            question = row.get("question") if isinstance(row, Mapping) else None
            if not isinstance(question, str) or not question.strip():
                if isinstance(row, Mapping) and "question" in row:
                    received = f"'question': {question!r}"
                else:
                    received = f"keys {sorted(row)}" if isinstance(row, Mapping) else type(row).__name__
                raise ValueError(f"expected rows with a non-empty 'question' string, received {received}.")
            questions.append(question)
        batch = dict(self.tokenizer(questions, truncation=True, max_length=self.max_question_length, padding=True,
                                    return_tensors="pt"))  # fmt: skip
        if self.with_answers:
            per_row = [self.tokenizer(answers_of(row), add_special_tokens=False).input_ids for row in rows]
            num_answers = max(len(answers) for answers in per_row)
            length = max((len(answer) for answers in per_row for answer in answers), default=1)
            answer_ids = torch.full((len(rows), max(num_answers, 1), max(length, 1)), -1, dtype=torch.long)
            for row_index, answers in enumerate(per_row):
                for answer_index, answer in enumerate(answers):
                    answer_ids[row_index, answer_index, : len(answer)] = torch.tensor(answer, dtype=torch.long)
            batch["answer_ids"] = answer_ids
        return batch


def freeze_unused_parameters(model, prefixes: Sequence[str] = UNUSED_MODULES) -> list[str]:
    """Sets `requires_grad=False` on the parameters under `prefixes` (default: `RealmForOpenQA`'s `UNUSED_MODULES`)
    that no used module shares; returns their names. Block embeddings are a buffer (or live in the searcher) and never train."""
    used = {
        parameter.data_ptr()
        for name, parameter in model.named_parameters()
        if not any(name.startswith(prefix + ".") for prefix in prefixes)
    }
    frozen = []
    for name, parameter in model.named_parameters():
        if any(name.startswith(prefix + ".") for prefix in prefixes) and parameter.data_ptr() not in used:
            parameter.requires_grad_(False)
            frozen.append(name)
    return frozen


def freeze_word_embeddings(model) -> list[str]:
    """Sets `requires_grad=False` on the word-embedding matrices of the question encoder and the reader; returns their
    names. Not part of ORQA's recipe: an option for small training sets (a few thousand questions), where updating
    2 x vocab x hidden weights from few words overfits and dominates the optimizer step on a CPU."""
    frozen = []
    for name, parameter in model.named_parameters():
        if name.endswith("embeddings.word_embeddings.weight"):
            parameter.requires_grad_(False)
            frozen.append(name)
    return frozen


def precision_settings(precision: str | None = "auto", use_cpu: bool | None = None) -> dict[str, bool]:
    """`TrainingArguments` fields for `precision` ("auto", "bf16" or "fp32", see `realm_hf.precision`): `bf16=True`
    (mixed precision: fp32 master weights, bf16 autocast) when it resolves to bf16 on the device the Trainer will use
    (the CPU when `use_cpu` or no GPU), plus `use_cpu=True` for bf16 on a CPU (the Trainer asks for it)."""
    on_cpu = bool(use_cpu) or not torch.cuda.is_available()
    resolved = resolve_precision(precision, "cpu" if on_cpu else "cuda")
    settings = {"bf16": resolved == "bf16"}
    if resolved == "bf16" and on_cpu:
        settings["use_cpu"] = True
    return settings


def enable_length_buckets(model, max_buckets: int = 4) -> None:
    """Has `model`'s reader (a `RealmForOpenQA` or a `RealmReader`) read its blocks in up to `max_buckets` groups of
    similar length, each padded to its own longest row, instead of padding every block to the batch's longest (see
    `realm_hf.modeling.modeling_realm.length_buckets`); 1 turns it off. Outputs equal the padded ones to rounding."""
    if max_buckets < 1:
        raise ValueError(f"max_buckets must be >= 1, received {max_buckets}.")
    reader = getattr(model, "reader", model)
    if not hasattr(reader, "max_length_buckets"):
        raise ValueError(f"expected a RealmForOpenQA or a RealmReader, received {type(model).__name__}.")
    reader.max_length_buckets = max_buckets


def orqa_warmup_steps(num_training_steps: int) -> int:
    """ORQA's warm-up: a tenth of the steps, at most 10,000 (`max(1, min(10000, num_training_steps // 10))`). ORQA
    also warms up for at least 100 steps; under 1,000 steps that floor took most or all of a run (a 75-step fine-tune
    never reached its learning rate), so it is left out."""
    return max(1, min(10_000, num_training_steps // 10))


def orqa_training_arguments(
    output_dir: str, max_steps: int, eval_steps: int | None = None, precision: str | None = "auto", **overrides
) -> TrainingArguments:
    r"""
    `TrainingArguments` with ORQA's fine-tuning settings (reference: orqa-realm-training §2): AdamW at lr 1e-5,
    weight decay 0.01 (not on biases and LayerNorm, the Trainer's default split), linear warm-up of
    [`orqa_warmup_steps`] then linear decay, gradient clipping at 1.0; evaluation and checkpoints every `eval_steps`,
    keeping the checkpoint with the best dev exact match (`load_best_model_at_end`). ORQA used one question per step;
    the batch size is yours (`per_device_train_batch_size`, default 8). BERT's optimizer skipped Adam's bias
    correction; torch's AdamW applies it, which only changes the first few hundred steps.

    Args:
        output_dir (`str`): where checkpoints go.
        max_steps (`int`): optimizer steps.
        eval_steps (`int`, *optional*): steps between dev evaluations and checkpoints (default `max_steps // 10`).
        precision (`str`, defaults to "auto"): "bf16" (mixed precision), "fp32", or "auto": bf16 where the device
            computes it natively ([`precision_settings`]). An explicit `bf16=` override wins.
        overrides: any other `TrainingArguments` field.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, received {max_steps}.")
    eval_steps = eval_steps or max(1, max_steps // 10)
    settings = {
        "output_dir": output_dir, "max_steps": max_steps, "learning_rate": 1e-5, "weight_decay": 0.01,
        "warmup_steps": orqa_warmup_steps(max_steps), "lr_scheduler_type": "linear", "max_grad_norm": 1.0,
        "per_device_train_batch_size": 8, "per_device_eval_batch_size": 16,
        "eval_strategy": "steps", "eval_steps": eval_steps, "save_strategy": "steps", "save_steps": eval_steps,
        "save_total_limit": 2, "load_best_model_at_end": True, "metric_for_best_model": "exact_match",
        "greater_is_better": True, "logging_steps": max(1, min(50, eval_steps)), "remove_unused_columns": False,
        "label_names": ["answer_ids"], "report_to": [], "dataloader_num_workers": 0,
    }  # fmt: skip
    if "bf16" not in overrides:
        settings.update(precision_settings(precision, overrides.get("use_cpu")))
    settings.update(overrides)
    return TrainingArguments(**settings)


class OpenQATrainer(JsonTrainingArgumentsMixin, Trainer):
    r"""
    `Trainer` for [`RealmForOpenQA`] open-QA fine-tuning.

    - The loss is `reader_output.loss`: the mean over the batch's questions of retriever + reader marginal log-loss.
      `retriever_loss` and `reader_loss` are logged too (means since the last log).
    - `evaluate()` answers the evaluation questions (in eval mode: `reader_beam_size` blocks read) and reports
      `exact_match` (ORQA normalisation), `f1`, `retrieval_recall` (a read block contains an answer) and `loss`;
      under DDP each rank answers a slice and the results are gathered. With `metric_for_best_model="exact_match"`
      and `load_best_model_at_end=True` ([`orqa_training_arguments`]) the best dev checkpoint is kept.
    - Unused heads are frozen ([`freeze_unused_parameters`]); block embeddings never train.
    - The reader reads its blocks in up to `max_length_buckets` (4) groups of similar length
      ([`enable_length_buckets`]), so short blocks do not cost the longest block's length.

    The data collator must be an [`OpenQACollator`] (the default when none is given and `processing_class` is the
    tokenizer). Datasets keep their columns (`remove_unused_columns=False`).
    """

    # The loss is a mean over the batch's questions, not normalised by `num_items_in_batch`: the Trainer divides it by
    # the gradient-accumulation steps.
    loss_is_scaled_for_ga = False
    max_length_buckets = 4

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        enable_length_buckets(self.model, self.max_length_buckets)
        if not isinstance(self.data_collator, OpenQACollator):
            if self.processing_class is None:
                raise ValueError(
                    "OpenQATrainer needs data_collator=OpenQACollator(tokenizer) (or processing_class=tokenizer); "
                    f"received data_collator={type(self.data_collator).__name__}."
                )
            self.data_collator = OpenQACollator(self.processing_class)
        if self.args.remove_unused_columns:
            raise ValueError(
                "OpenQATrainer reads 'question' and 'answers', which are not forward() arguments: set "
                "remove_unused_columns=False in TrainingArguments (orqa_training_arguments does)."
            )
        frozen = freeze_unused_parameters(self.model)
        logger.info("froze %d parameters of unused heads", len(frozen))
        self._running: dict[str, list[float]] = {"retriever_loss": [], "reader_loss": []}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "answer_ids" not in inputs:
            raise ValueError("training needs answers: the batch holds no 'answer_ids' (use OpenQACollator).")
        with self._searching(inputs["input_ids"]):
            outputs = model(**inputs, return_dict=True)
        reader_output = outputs.reader_output
        if model.training:
            self._running["retriever_loss"].append(float(reader_output.retriever_loss.detach().float().mean()))
            self._running["reader_loss"].append(float(reader_output.reader_loss.detach().float().mean()))
        return (reader_output.loss, outputs) if return_outputs else reader_output.loss

    def _searching(self, input_ids: torch.Tensor):
        """The context of a forward pass on `input_ids`: a searcher that reads question texts (a `HybridSearcher`,
        for BM25) is told them, as the pipeline does when it serves."""
        searcher = getattr(self.accelerator.unwrap_model(self.model), "searcher", None)
        return searching_for(searcher, self.data_collator.tokenizer, input_ids)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            for key, values in self._running.items():
                if values:
                    logs[key] = sum(values) / len(values)
                    values.clear()
        super().log(logs, *args, **kwargs)

    @torch.no_grad()
    def answer(self, rows: Sequence[Mapping[str, Any]], batch_size: int | None = None) -> list[dict[str, Any]]:
        """Answers `rows` (this process only): per row the predicted answer string and, when the row has answers,
        `exact_match`, `f1`, `retrieval_recall` and the `loss`."""
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        tokenizer = self.data_collator.tokenizer
        batch_size = batch_size or self.args.per_device_eval_batch_size
        results = []
        try:
            for start in range(0, len(rows), batch_size):
                chunk = [rows[index] for index in range(start, min(start + batch_size, len(rows)))]
                with_answers = all(row.get("answers") is not None or row.get("answer") is not None for row in chunk)
                collator = OpenQACollator(tokenizer, self.data_collator.max_question_length, with_answers)
                inputs = {key: value.to(model.device) for key, value in collator(chunk).items()}
                with self._searching(inputs["input_ids"]):
                    outputs = model(**inputs, return_dict=True)
                predicted = outputs.predicted_answer_ids
                predicted = [predicted] if isinstance(predicted, torch.Tensor) else predicted
                reader_output = outputs.reader_output
                for index, (row, answer_ids) in enumerate(zip(chunk, predicted, strict=True)):
                    prediction = tokenizer.decode(answer_ids.tolist(), skip_special_tokens=True)
                    result = {"prediction": prediction}
                    if with_answers:
                        golds = answers_of(row)
                        correct = reader_output.retriever_correct
                        correct = correct if correct.dim() == 2 else correct.unsqueeze(0)  # (B, K)
                        loss = reader_output.retriever_loss + reader_output.reader_loss
                        loss = loss.reshape(-1)
                        result.update({
                            "exact_match": exact_match(prediction, golds), "f1": f1_score(prediction, golds),
                            "retrieval_recall": float(correct[index].any()), "loss": float(loss[index]),
                        })  # fmt: skip
                    results.append(result)
        finally:
            model.train(was_training)
        return results

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        from accelerate.utils import gather_object

        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs an eval_dataset of {'question', 'answers'} rows; received none.")
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        state = self.accelerator.state
        mine = range(state.process_index, len(dataset), state.num_processes)
        rows = [dataset[index] for index in mine]
        missing = [row.get("question") for row in rows if row.get("answers") is None and row.get("answer") is None]
        if missing:
            raise ValueError(
                f"evaluation rows need 'answers' (or 'answer'); {len(missing)} have none, e.g. {missing[0]!r}."
            )
        results = gather_object(self.answer(rows)) if state.num_processes > 1 else self.answer(rows)
        if not results:
            raise ValueError("the evaluation dataset is empty.")
        metrics = {
            f"{metric_key_prefix}_{key}": sum(result[key] for result in results) / len(results)
            for key in ("exact_match", "f1", "retrieval_recall", "loss")
        }
        metrics[f"{metric_key_prefix}_examples"] = len(results)
        if self.state.epoch is not None:
            metrics["epoch"] = self.state.epoch
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


def num_update_steps(num_examples: int, batch_size: int, num_epochs: float, world_size: int = 1) -> int:
    """Optimizer steps for `num_epochs` over `num_examples` at `batch_size` per process on `world_size` processes."""
    if num_examples < 1 or batch_size < 1 or world_size < 1 or num_epochs <= 0:
        raise ValueError(
            f"expected positive num_examples, batch_size, num_epochs and world_size, received {num_examples}, "
            f"{batch_size}, {num_epochs} and {world_size}."
        )
    return max(1, math.ceil(math.ceil(num_examples / (batch_size * world_size)) * num_epochs))


__all__ = [
    "OpenQACollator",
    "OpenQATrainer",
    "answers_of",
    "freeze_unused_parameters",
    "freeze_word_embeddings",
    "num_update_steps",
    "orqa_training_arguments",
    "orqa_warmup_steps",
    "question_of",
]

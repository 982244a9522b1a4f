"""Training recipes for REALM/ORQA models: the ICT warm start of the retriever (`ict`) and open-QA fine-tuning with
the `Trainer` (`finetune`)."""

from .finetune import (
    OpenQACollator,
    OpenQATrainer,
    answers_of,
    freeze_unused_parameters,
    freeze_word_embeddings,
    num_update_steps,
    orqa_training_arguments,
    orqa_warmup_steps,
)
from .ict import (
    ICTCollator,
    ICTTrainer,
    RealmICTModel,
    RealmICTOutput,
    ict_loss,
    make_ict_example,
    split_sentences,
)

__all__ = [
    "ICTCollator",
    "ICTTrainer",
    "OpenQACollator",
    "OpenQATrainer",
    "RealmICTModel",
    "RealmICTOutput",
    "answers_of",
    "freeze_unused_parameters",
    "freeze_word_embeddings",
    "ict_loss",
    "make_ict_example",
    "num_update_steps",
    "orqa_training_arguments",
    "orqa_warmup_steps",
    "split_sentences",
]

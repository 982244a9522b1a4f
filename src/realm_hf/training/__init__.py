"""Training recipes for REALM/ORQA models: the ICT warm start of the retriever (`ict`), open-QA fine-tuning with the
`Trainer` (`finetune`), and salient-span masking for REALM pretraining (`salient_spans`)."""

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
from .salient_spans import (
    CombinedTagger,
    DateTagger,
    SalientSpanCollator,
    TitleEntityTagger,
    mask_salient_span,
)

__all__ = [
    "CombinedTagger",
    "DateTagger",
    "ICTCollator",
    "ICTTrainer",
    "OpenQACollator",
    "OpenQATrainer",
    "RealmICTModel",
    "RealmICTOutput",
    "SalientSpanCollator",
    "TitleEntityTagger",
    "answers_of",
    "freeze_unused_parameters",
    "freeze_word_embeddings",
    "ict_loss",
    "make_ict_example",
    "mask_salient_span",
    "num_update_steps",
    "orqa_training_arguments",
    "orqa_warmup_steps",
    "split_sentences",
]

"""Training recipes for REALM/ORQA models: the ICT warm start of the retriever (`ict`), open-QA fine-tuning with the
`Trainer` (`finetune`), and REALM pretraining (`pretrain`: the retrieval-augmented MLM over salient spans from
`salient_spans`, with the index kept fresh by `index_refresh`)."""

from .finetune import (
    OpenQACollator,
    OpenQATrainer,
    answers_of,
    enable_length_buckets,
    freeze_unused_parameters,
    freeze_word_embeddings,
    num_update_steps,
    orqa_training_arguments,
    orqa_warmup_steps,
    precision_settings,
)
from .ict import (
    ICTCollator,
    ICTTrainer,
    RealmICTModel,
    RealmICTOutput,
    ict_loss,
    ict_training_arguments,
    make_ict_example,
    split_sentences,
)
from .index_refresh import IndexRefresher
from .pretrain import (
    PretrainingCandidates,
    RealmForPretraining,
    RealmPretrainer,
    RealmPretrainingOutput,
    delayed_linear_schedule,
    freeze_pretraining_unused_parameters,
    pretraining_warmup_steps,
    realm_pretraining_loss,
    salient_sentences,
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
    "IndexRefresher",
    "OpenQACollator",
    "OpenQATrainer",
    "PretrainingCandidates",
    "RealmForPretraining",
    "RealmICTModel",
    "RealmICTOutput",
    "RealmPretrainer",
    "RealmPretrainingOutput",
    "SalientSpanCollator",
    "TitleEntityTagger",
    "answers_of",
    "delayed_linear_schedule",
    "enable_length_buckets",
    "freeze_pretraining_unused_parameters",
    "freeze_unused_parameters",
    "freeze_word_embeddings",
    "ict_loss",
    "ict_training_arguments",
    "make_ict_example",
    "mask_salient_span",
    "num_update_steps",
    "orqa_training_arguments",
    "orqa_warmup_steps",
    "precision_settings",
    "pretraining_warmup_steps",
    "realm_pretraining_loss",
    "salient_sentences",
    "split_sentences",
]

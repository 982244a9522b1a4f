"""ICT warm start: pretrain REALM/ORQA embedders with the Inverse Cloze Task (Lee et al. 2019, ORQA).

A random sentence of a block is the pseudo-query; the block is its positive context. With probability 0.9 the
sentence is removed from the block, so that the encoders must learn more than word overlap; the other 10% keep it, so
that they still learn that overlap is evidence. Every other block of the (global) batch is a negative.

    B   - local batch (examples on this rank)     G - global batch (all ranks)     D - retriever_proj_size
    Lq  - query length (<= max_query_length)      Lb - block length (<= max_block_length)

ORQA settings (reference: orqa-realm-training §2.2): query `[CLS] sentence [SEP]` of 64 wordpieces, block
`[CLS] title [SEP] rest [SEP]` of 288, batch 4096, lr 1e-4, 100k steps, warmup 10k, one BERT shared by both sides.
"""

import os
import random
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments
from transformers.utils import ModelOutput, logging

from ..modeling import RealmConfig, RealmEmbedder, RealmPreTrainedModel
from ..modeling.modeling_realm import fp32_einsum
from ..retrieval.embedding import encode_blocks
from .finetune import orqa_warmup_steps, precision_settings
from .trainer_files import JsonTrainingArgumentsMixin

logger = logging.get_logger(__name__)

# ---------------------------------------------------------------------------------------------------------------------
# examples

# A sentence ends at `.`, `!` or `?` (plus any closing quotes/brackets) followed by whitespace and then an upper-case
# letter, a digit or an opening quote/bracket. Deliberately simple: "Dr. Smith" and "U.S. Army" are split wrongly and
# lower-case starts are not split at all. ICT only needs plausible pseudo-queries, not linguistically exact sentences,
# and this keeps the package free of an NLP dependency.
_SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Splits `text` into sentences with the simple rule above; returns stripped, non-empty sentences in order."""
    sentences = []
    start = 0
    for boundary in _SENTENCE_BOUNDARY.finditer(text):
        # Closing quotes/brackets matched before the whitespace belong to the sentence that ends here.
        closing = boundary.group(0).rstrip()
        sentences.append(text[start : boundary.start()] + closing)
        start = boundary.end()
    sentences.append(text[start:])
    return [sentence.strip() for sentence in sentences if sentence.strip()]


def make_ict_example(
    title: str, text: str, rng: random.Random, remove_probability: float = 0.9, title_query_probability: float = 0.0
) -> tuple[str, str, str, bool]:
    r"""
    Makes one ICT example from a block: a random sentence as the pseudo-query and the block as its context.

    Args:
        title (`str`): the block's title (`""` for none); it stays in the context.
        text (`str`): the block's text, split with [`split_sentences`].
        rng (`random.Random`): the source of randomness (the sentence, then whether it is removed).
        remove_probability (`float`, defaults to 0.9): probability that the sentence is removed from the context.
        title_query_probability (`float`, defaults to 0.0): probability that the pseudo-query is the block's title
            instead of a sentence (the context then keeps title and text whole). 0 is ORQA's ICT. Structured records
            (a factbook field such as "Togo. Government. Capital" whose text is one value) have one sentence, which
            would be its own context's text; asking for the block by its title teaches the block encoder to keep what
            the record is about, which is what questions name. Blocks without a title never use it.

    Returns:
        `(pseudo_query, context_title, context_text, removed)`. When `removed` is False the context text is `text`
        unchanged. A block of a single sentence always keeps it (`removed` False): removing it would leave an empty
        context. ORQA drops such masked examples instead, which would make batch sizes vary; with real corpora
        (100-word blocks) they are rare.
    """
    for name, probability in (("remove_probability", remove_probability),
                              ("title_query_probability", title_query_probability)):  # fmt: skip
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {probability}.")
    if title_query_probability > 0.0 and title.strip() and rng.random() < title_query_probability:
        return title.strip(), title, text, False
    sentences = split_sentences(text)
    if not sentences:
        raise ValueError(f"expected a block with at least one sentence, got text {text!r} (title {title!r}).")
    index = rng.randrange(len(sentences))
    # Draw the coin even for one-sentence blocks so that the random stream does not depend on the block's length.
    remove = rng.random() < remove_probability and len(sentences) > 1
    if not remove:
        return sentences[index], title, text, False
    return sentences[index], title, " ".join(sentences[:index] + sentences[index + 1 :]), True


@dataclass
class ICTCollator:
    r"""
    Turns blocks into ICT batches: `query_*` (`[CLS] sentence [SEP]`) and `block_*` (`[CLS] title [SEP] rest [SEP]`,
    via `encode_blocks`) tensors of shape `(B, Lq)` and `(B, Lb)`, padded to the longest of the batch.

    Rows are mappings with `title` and `text`, or with `id` (a block id) when `document_store` is given. The example
    made from a row depends only on `seed` and the row's key (its `id` when present, else its title and text), not on
    the batch or process it lands in; use another `seed` per epoch for fresh pseudo-queries.
    """

    tokenizer: Any = field(metadata={"help": "The embedders' tokenizer (a `RealmTokenizer` or any BERT tokenizer)."})
    max_query_length: int = field(default=64, metadata={"help": "Wordpieces per pseudo-query (ORQA: 64)."})
    max_block_length: int = field(default=288, metadata={"help": "Wordpieces per context block (ORQA: 288)."})
    remove_probability: float = field(
        default=0.9, metadata={"help": "Probability that the pseudo-query sentence is removed from its block."}
    )
    title_query_probability: float = field(
        default=0.0, metadata={"help": "Probability that the pseudo-query is the block's title (0: ORQA's ICT)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the per-row sentence choice and removal."})
    document_store: Any = field(
        default=None, metadata={"help": "A `DocumentStore` to look up rows given as `{'id': block_id}`."}
    )
    return_removed: bool = field(
        default=False, metadata={"help": "Also return `sentence_removed` (bool, (B,)); not a model input."}
    )

    def _title_and_text(self, rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
        if all("text" in row for row in rows):
            return [row.get("title") or "" for row in rows], [row["text"] for row in rows]
        if self.document_store is None:
            keys = sorted({key for row in rows for key in row})
            raise ValueError(
                f"expected rows with 'text' (and 'title'), or 'id' with a document_store; got keys {keys}."
            )
        ids = [int(row["id"]) for row in rows]
        return self.document_store.titles(ids), self.document_store.texts(ids)

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not rows:
            raise ValueError("expected a non-empty list of rows, got an empty one.")
        titles, texts = self._title_and_text(rows)
        queries, context_titles, context_texts, removed = [], [], [], []
        for row, title, text in zip(rows, titles, texts, strict=True):
            # A string seed is hashed with SHA-512 by `random.Random`: stable across processes, unlike `hash()`.
            key = f"id={row['id']}" if "id" in row else f"title={title}\ntext={text}"
            rng = random.Random(f"{self.seed}\n{key}")
            query, context_title, context_text, was_removed = make_ict_example(
                title, text, rng, self.remove_probability, self.title_query_probability
            )
            queries.append(query)
            context_titles.append(context_title)
            context_texts.append(context_text)
            removed.append(was_removed)
        query = self.tokenizer(queries, truncation=True, max_length=self.max_query_length, padding=True,
                               return_tensors="pt")  # fmt: skip
        block = encode_blocks(self.tokenizer, context_texts, context_titles, max_length=self.max_block_length)
        batch = {f"query_{key}": value for key, value in query.items()}
        batch.update({f"block_{key}": value for key, value in block.items()})
        if self.return_removed:
            batch["sentence_removed"] = torch.tensor(removed)
        return batch


# ---------------------------------------------------------------------------------------------------------------------
# loss


def _gather_blocks(block_embeddings: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All ranks' block embeddings, `(G, D)`, and the global row of this rank's first block.

    `torch.distributed.nn.functional.all_gather` is differentiable: its backward sums every rank's gradient for this
    rank's blocks, so with DDP's gradient averaging the update is that of the mean loss over the global batch. Ranks
    may hold different batch sizes (e.g. a last partial batch): the sizes are gathered first and the padding rows are
    dropped after the gather.
    """
    from torch.distributed.nn.functional import all_gather

    world_size, rank = dist.get_world_size(), dist.get_rank()
    size = torch.tensor([block_embeddings.shape[0]], device=block_embeddings.device)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    sizes = [int(s.item()) for s in sizes]
    padded = F.pad(block_embeddings, (0, 0, 0, max(sizes) - block_embeddings.shape[0]))  # (max B, D)
    with warnings.catch_warnings():
        # torch 2.13 deprecates this in favour of the private `_functional_collectives`, whose autograd support for
        # gloo is not documented; the public function still gives the gradient we need (tested on 2 gloo ranks).
        warnings.filterwarnings(
            "ignore", message=r".*nn\.functional\.all_gather is deprecated", category=FutureWarning
        )
        gathered = all_gather(padded)
    return torch.cat([chunk[:n] for chunk, n in zip(gathered, sizes, strict=True)]), sum(sizes[:rank])


def ict_loss(
    query_embeddings: torch.Tensor, block_embeddings: torch.Tensor, gather_across_ranks: bool = True
) -> dict[str, torch.Tensor]:
    r"""
    The ICT in-batch softmax loss: query `i` must pick its own block among all blocks of the global batch.

    Args:
        query_embeddings (`torch.FloatTensor` of shape `(B, D)`): this rank's pseudo-query embeddings.
        block_embeddings (`torch.FloatTensor` of shape `(B, D)`): their context blocks, in the same order.
        gather_across_ranks (`bool`, defaults to True): when a `torch.distributed` process group is initialised, score
            against every rank's blocks (more negatives, as ORQA on TPU); otherwise only this rank's.

    Returns:
        `dict` with `loss` (mean cross-entropy over this rank's queries) and `accuracy` (fraction whose top-scoring
        block is their own), both scalars; `accuracy` carries no gradient.
    """
    if query_embeddings.dim() != 2 or query_embeddings.shape != block_embeddings.shape:
        raise ValueError(
            "expected query and block embeddings of the same shape (B, D), got "
            f"{tuple(query_embeddings.shape)} and {tuple(block_embeddings.shape)}."
        )
    offset = 0
    if gather_across_ranks and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        block_embeddings, offset = _gather_blocks(block_embeddings)  # (G, D)
    scores = fp32_einsum("bd,gd->bg", query_embeddings, block_embeddings)  # (B, G), fp32 under autocast too
    targets = offset + torch.arange(query_embeddings.shape[0], device=scores.device)  # (B,)
    loss = F.cross_entropy(scores.float(), targets)
    accuracy = (scores.detach().argmax(dim=1) == targets).float().mean()
    return {"loss": loss, "accuracy": accuracy}


# ---------------------------------------------------------------------------------------------------------------------
# model


@dataclass
class RealmICTOutput(ModelOutput):
    r"""
    Args:
        loss (`torch.FloatTensor` of shape `()`): the ICT loss ([`ict_loss`]).
        accuracy (`torch.FloatTensor` of shape `()`): in-batch retrieval accuracy.
        query_embeddings (`torch.FloatTensor` of shape `(B, D)`): pseudo-query embeddings.
        block_embeddings (`torch.FloatTensor` of shape `(B, D)`): this rank's block embeddings.
    """

    loss: torch.FloatTensor | None = None
    accuracy: torch.FloatTensor | None = None
    query_embeddings: torch.FloatTensor | None = None
    block_embeddings: torch.FloatTensor | None = None


class RealmICTModel(RealmPreTrainedModel):
    r"""
    A question encoder and a block encoder (two `RealmEmbedder`s) trained together with the ICT loss.

    `save_pretrained(directory)` writes `directory/query_embedder/` and `directory/block_embedder/`, each a plain
    `RealmEmbedder` checkpoint (`RealmEmbedder.from_pretrained(directory / "block_embedder")`), ready to embed a
    corpus and to start REALM or ORQA. [`RealmICTModel.from_pretrained`] reads them back.

    Args:
        config (`RealmConfig`): the embedders' configuration.
        query_embedder, block_embedder (`RealmEmbedder`, *optional*): encoders to start from (e.g. made with
            `realm_model_from_bert`); new ones from `config` by default.
        share_encoders (`bool`, defaults to False): one encoder for both sides, as ORQA did.
        gather_across_ranks (`bool`, defaults to True): see [`ict_loss`].
    """

    def __init__(
        self,
        config: RealmConfig,
        query_embedder: RealmEmbedder | None = None,
        block_embedder: RealmEmbedder | None = None,
        share_encoders: bool = False,
        gather_across_ranks: bool = True,
    ):
        super().__init__(config)
        if share_encoders and block_embedder is not None and block_embedder is not query_embedder:
            raise ValueError("share_encoders=True takes one embedder (query_embedder), got a separate block_embedder.")
        self.query_embedder = query_embedder if query_embedder is not None else RealmEmbedder(config)
        if not share_encoders:
            self.block_embedder = block_embedder if block_embedder is not None else RealmEmbedder(config)
        self.share_encoders = share_encoders
        self.gather_across_ranks = gather_across_ranks
        self.post_init()

    def __getattr__(self, name: str):
        # A registered module only when separate (as `RealmScorer.query_embedder`), so shared weights are held once.
        if name == "block_embedder" and "block_embedder" not in self._modules:
            return self._modules["query_embedder"]
        return super().__getattr__(name)

    @classmethod
    def from_bert(
        cls,
        bert_name_or_path: str | os.PathLike,
        share_encoders: bool = False,
        retriever_proj_size: int = 128,
        **kwargs,
    ) -> "RealmICTModel":
        """Both encoders start from one BERT-family checkpoint (e.g. MiniLM); the projections start random."""
        from ..conversion.bert import realm_model_from_bert

        query_embedder = realm_model_from_bert(
            RealmEmbedder, bert_name_or_path, retriever_proj_size=retriever_proj_size
        )
        block_embedder = None
        if not share_encoders:
            # Both towers start identical, as ORQA's shared encoder, and diverge in training.
            block_embedder = RealmEmbedder(query_embedder.config)
            block_embedder.load_state_dict(query_embedder.state_dict())
        return cls(query_embedder.config, query_embedder, block_embedder, share_encoders=share_encoders, **kwargs)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, share_encoders: bool = False, **kwargs) -> "RealmICTModel":
        """Reads the `query_embedder/` and `block_embedder/` subfolders that `save_pretrained` wrote."""
        query_embedder = RealmEmbedder.from_pretrained(os.path.join(directory, "query_embedder"))
        block_embedder = None
        if not share_encoders:
            block_embedder = RealmEmbedder.from_pretrained(os.path.join(directory, "block_embedder"))
        return cls(query_embedder.config, query_embedder, block_embedder, share_encoders=share_encoders, **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, is_main_process: bool = True, **kwargs) -> None:
        """Writes both embedders as `RealmEmbedder` checkpoints in `save_directory/{query,block}_embedder/`.

        The Trainer passes `state_dict=`; it is ignored, since the live modules hold the same weights (no sharding).
        """
        if not is_main_process:
            return
        kwargs.pop("state_dict", None)
        os.makedirs(save_directory, exist_ok=True)
        self.query_embedder.save_pretrained(os.path.join(save_directory, "query_embedder"), **kwargs)
        self.block_embedder.save_pretrained(os.path.join(save_directory, "block_embedder"), **kwargs)

    def forward(
        self,
        query_input_ids: torch.LongTensor,
        block_input_ids: torch.LongTensor,
        query_attention_mask: torch.LongTensor | None = None,
        query_token_type_ids: torch.LongTensor | None = None,
        block_attention_mask: torch.LongTensor | None = None,
        block_token_type_ids: torch.LongTensor | None = None,
        return_dict: bool | None = None,
    ) -> RealmICTOutput | tuple:
        r"""
        Args:
            query_input_ids (`torch.LongTensor` of shape `(B, Lq)`): `[CLS] sentence [SEP]` ([`ICTCollator`]).
            block_input_ids (`torch.LongTensor` of shape `(B, Lb)`): `[CLS] title [SEP] context [SEP]`.
            query_attention_mask, query_token_type_ids, block_attention_mask, block_token_type_ids (*optional*).
        """
        if query_input_ids.shape[0] != block_input_ids.shape[0]:
            raise ValueError(
                f"expected one block per query, got {query_input_ids.shape[0]} queries and "
                f"{block_input_ids.shape[0]} blocks."
            )
        query_embeddings = self.query_embedder(
            query_input_ids, attention_mask=query_attention_mask, token_type_ids=query_token_type_ids, return_dict=True
        ).projected_score  # (B, D)
        block_embeddings = self.block_embedder(
            block_input_ids, attention_mask=block_attention_mask, token_type_ids=block_token_type_ids, return_dict=True
        ).projected_score  # (B, D)
        losses = ict_loss(query_embeddings, block_embeddings, gather_across_ranks=self.gather_across_ranks)
        output = RealmICTOutput(
            loss=losses["loss"],
            accuracy=losses["accuracy"],
            query_embeddings=query_embeddings,
            block_embeddings=block_embeddings,
        )
        return self._return(output, return_dict)


# ---------------------------------------------------------------------------------------------------------------------
# trainer


def ict_training_arguments(
    output_dir: str, max_steps: int, precision: str | None = "auto", **overrides
) -> TrainingArguments:
    r"""
    `TrainingArguments` with ORQA's ICT settings (reference: orqa-realm-training §2.2): AdamW at lr 1e-4, weight
    decay 0.01 (not on biases and LayerNorm), linear warm-up of [`orqa_warmup_steps`] then linear decay, gradient
    clipping at 1.0; checkpoints every quarter of the run (the last kept), so an interrupted run resumes; the columns
    [`ICTCollator`] reads are kept (`remove_unused_columns=False`) and no labels are expected (`label_names=[]`).
    ORQA's batch was 4096 blocks (the in-batch negatives); the batch size is yours (`per_device_train_batch_size`).

    Args:
        output_dir (`str`): where checkpoints go.
        max_steps (`int`): optimizer steps.
        precision (`str`, defaults to "auto"): "bf16" (mixed precision), "fp32", or "auto": bf16 where the device
            computes it natively ([`precision_settings`]). An explicit `bf16=` override wins.
        overrides: any other `TrainingArguments` field.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, received {max_steps}.")
    settings = {
        "output_dir": output_dir, "max_steps": max_steps, "learning_rate": 1e-4, "weight_decay": 0.01,
        "warmup_steps": orqa_warmup_steps(max_steps), "lr_scheduler_type": "linear", "max_grad_norm": 1.0,
        "logging_steps": 10, "save_steps": max(1, max_steps // 4), "save_total_limit": 1,
        "remove_unused_columns": False, "label_names": [], "report_to": [], "dataloader_num_workers": 0,
    }  # fmt: skip
    if "bf16" not in overrides:
        settings.update(precision_settings(precision, overrides.get("use_cpu")))
    settings.update(overrides)
    return TrainingArguments(**settings)


class ICTTrainer(JsonTrainingArgumentsMixin, Trainer):
    r"""
    `Trainer` for [`RealmICTModel`] that also logs the in-batch `accuracy` (mean since the last log).

    Training arguments it needs: `remove_unused_columns=False` (the collator reads `title`/`text`, which are not
    `forward` arguments) and `label_names=[]` (the loss needs no labels). ORQA used lr 1e-4, warmup 10k steps.
    """

    model_class = RealmICTModel
    data_collator_class = ICTCollator
    # `ict_loss` is a mean over the batch, not normalised by `num_items_in_batch`: the Trainer divides by the
    # gradient-accumulation steps.
    loss_is_scaled_for_ga = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._accuracies: list[float] = []

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        # A checkpoint holds the embedders in subfolders (`RealmICTModel.save_pretrained`), which the Trainer's own
        # loader does not look for ("Can't find a valid checkpoint"): load them here so that training resumes.
        directory = Path(resume_from_checkpoint)
        if not (directory / "query_embedder").is_dir():
            return super()._load_from_checkpoint(resume_from_checkpoint, model=model)
        target = self.accelerator.unwrap_model(model if model is not None else self.model)
        names = ("query_embedder",) if target.share_encoders else ("query_embedder", "block_embedder")
        for name in names:
            saved = RealmEmbedder.from_pretrained(directory / name)
            getattr(target, name).load_state_dict(saved.state_dict())

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, return_dict=True)
        if model.training:
            self._accuracies.append(float(outputs.accuracy))
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs and self._accuracies:
            logs["accuracy"] = sum(self._accuracies) / len(self._accuracies)
            self._accuracies.clear()
        super().log(logs, *args, **kwargs)


__all__ = [
    "ICTCollator",
    "ICTTrainer",
    "RealmICTModel",
    "RealmICTOutput",
    "ict_loss",
    "ict_training_arguments",
    "make_ict_example",
    "split_sentences",
]

"""REALM pretraining (Guu et al. 2020): a masked language model that retrieves, and whose retriever learns from the
masked-language-model signal alone.

One step, for a batch of sentences with one salient span masked each ([`SalientSpanCollator`]):

1. the embedder embeds the masked sentences and maximum-inner-product search over the (possibly stale) index
   returns their top blocks;
2. each sentence's own source block is dropped (no trivial retrieval) and the null document is put first: C
   candidates, null + C - 1 retrieved blocks;
3. the candidates are re-embedded WITH gradients (the index only chose them): `log p(z | x) = log_softmax_z(q . d_z)`;
4. the knowledge-augmented encoder reads `[CLS] masked sentence [SEP] title: text [SEP]` per candidate and predicts
   the masked wordpieces, `log p(y_j | z, x)`;
5. loss = -mean_j log sum_z p(z | x) p(y_j | z, x): a per-token marginal, as in REALM's code.

Metrics: `mlm_loss`; `retrieval_utility` = mean_j [log marginal_j - log p(y_j | null, x)], positive when the retrieved
blocks help more than no block; `null_probability` = mean p(null | x); `index_staleness` = trainer steps since the
weights that embedded the index ([`IndexRefresher`] keeps it bounded).

Differences from REALM's TensorFlow code, all deliberate: the encoder's input keeps the block title (`title: text`,
the layout this project's reader uses; REALM dropped it); the MLM head runs on the masked positions only. Query and
candidates share one embedder, as REALM's `share_embedders=True`, unless a separate question encoder is given
(`query_embedder`): an ORQA/ICT warm start trains a question encoder and a block encoder apart, and its block encoder
reading questions finds next to nothing (answer recall@5 0.9% on the default model's dev questions, against 81.9% for
its question encoder).

    B - sentences     C - candidates (null + C-1 blocks)     Lq - query length     Lc - candidate (embedder) length
    Lj - joint (encoder) length     M - masked wordpieces per sentence (padded)     D - retriever_proj_size
    H - hidden size     V - vocabulary
"""

import functools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from transformers import Trainer, TrainerCallback
from transformers.utils import ModelOutput, logging

from ..modeling import RealmConfig, RealmEmbedder, RealmKnowledgeAugEncoder, RealmPreTrainedModel
from ..modeling.modeling_realm import fp32_einsum, marginal_token_log_likelihood
from ..retrieval.document_store import block_text
from ..retrieval.embedding import encode_blocks
from .finetune import freeze_unused_parameters, orqa_warmup_steps
from .ict import split_sentences
from .salient_spans import IGNORE_INDEX
from .trainer_files import JsonTrainingArgumentsMixin

logger = logging.get_logger(__name__)

# Parameters the pretraining loss never reaches: the embedder's unused MLM head and the encoder's pooler. Frozen so
# that DistributedDataParallel needs no `find_unused_parameters`.
PRETRAINING_UNUSED_MODULES = ("embedder.cls.predictions", "query_embedder.cls.predictions", "encoder.realm.pooler")

# ---------------------------------------------------------------------------------------------------------------------
# data


def salient_sentences(documents, tagger: Callable[[str], list], block_ids: Iterable[int] | None = None,
                      include_title: bool = False) -> list[dict]:  # fmt: skip
    r"""
    The pretraining examples of a corpus: every sentence ([`split_sentences`]) of every block in which `tagger` finds
    a salient span, as `{"text": sentence, "block_id": id}` rows for [`SalientSpanCollator`].

    Args:
        documents (`DocumentStore` or anything with `texts(ids)`, `titles(ids)` and `__len__`): the corpus.
        tagger (`SalientSpanTagger`): e.g. `CombinedTagger(DateTagger(), TitleEntityTagger(titles))`.
        block_ids (`Iterable[int]`, *optional*): the blocks to read (default: all).
        include_title (`bool`, defaults to `False`): add the block's `title` to each row, which the collator reads
            before the sentence as unmasked context. REALM's Wikipedia sentences stand alone; the sentences of titled
            records often do not name their subject (a factbook "Independence" field says "3 October 1932", the
            title says which country), and then only the title lets retrieval help.
    """
    ids = list(range(len(documents))) if block_ids is None else [int(i) for i in block_ids]
    rows = []
    for start in range(0, len(ids), 4096):
        batch = ids[start : start + 4096]
        titles = documents.titles(batch) if include_title else [None] * len(batch)
        for block_id, title, text in zip(batch, titles, documents.texts(batch), strict=True):
            for sentence in split_sentences(text):
                if tagger(sentence):
                    rows.append({"text": sentence, "block_id": block_id} | ({"title": title} if include_title else {}))
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# candidates


class PretrainingCandidates:
    r"""
    Turns masked sentences into REALM pretraining candidates: MIPS over the current index, the source block dropped,
    the null document first. [`IndexRefresher`] swaps the searcher for a fresher one between steps ([`swap`]).

    Args:
        searcher (`Searcher`): the index over `documents` (e.g. `ExactSearcher.from_index(directory)`).
        documents (`DocumentStore`, or anything with `texts(ids)`, `titles(ids)` and `__len__`): the corpus.
        tokenizer (`RealmTokenizer`): the model's tokenizer.
        num_candidates (`int`, defaults to 8): C, the null document included (REALM: 8).
        max_block_length (`int`, defaults to 288): wordpieces of a candidate as the embedder reads it
            (`[CLS] title [SEP] text [SEP]`, the index layout) and of its `title: text` in the encoder's input.
        index_step (`int`, defaults to 0): the trainer step whose weights embedded the index.
    """

    def __init__(self, searcher, documents, tokenizer, num_candidates: int = 8, max_block_length: int = 288,
                 index_step: int = 0):  # fmt: skip
        if num_candidates < 2:
            raise ValueError(f"num_candidates counts the null document and at least one block: expected >= 2, got "
                             f"{num_candidates}.")  # fmt: skip
        if searcher.num_blocks != len(documents):
            raise ValueError(f"the index holds {searcher.num_blocks} blocks but the corpus {len(documents)}; build the "
                             "index over the same corpus.")  # fmt: skip
        if len(documents) < num_candidates:
            raise ValueError(f"num_candidates={num_candidates} needs a corpus of at least that many blocks (one may be "
                             f"the source, one slot is the null document), got {len(documents)}.")  # fmt: skip
        self.searcher = searcher
        self.documents = documents
        self.tokenizer = tokenizer
        self.num_candidates = num_candidates
        self.max_block_length = max_block_length
        self.index_step = index_step

    def swap(self, searcher, index_step: int) -> None:
        """Uses `searcher` from now on (same corpus); `index_step` is the step of the weights that built it."""
        if searcher.num_blocks != len(self.documents):
            raise ValueError(f"the new index holds {searcher.num_blocks} blocks, the corpus {len(self.documents)}.")
        self.searcher, self.index_step = searcher, index_step

    def retrieve(self, query_embeddings: torch.Tensor, source_block_ids: torch.Tensor | None) -> torch.Tensor:
        """Candidate block ids `(B, C)`: -1 (the null document) first, then the best C - 1 blocks that are not the
        sentence's source block."""
        wanted = self.num_candidates - 1
        # One more than needed: dropping the source block (at most one row entry) still leaves `wanted`.
        found = self.searcher.search(query_embeddings.detach().float().cpu(), wanted + 1).ids.cpu()  # (B, C)
        sources = [None] * len(found) if source_block_ids is None else source_block_ids.cpu().tolist()
        rows = []
        for row, source in zip(found.tolist(), sources, strict=True):
            kept = [block for block in row if block >= 0 and block != source][:wanted]
            if len(kept) < wanted:
                raise RuntimeError(f"the searcher returned {len(kept)} usable blocks for a query, expected {wanted}.")
            rows.append([-1, *kept])
        return torch.tensor(rows, dtype=torch.long)

    def __call__(self, query_embeddings: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 source_block_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
        r"""
        Args:
            query_embeddings (`torch.FloatTensor` of shape `(B, D)`): the masked sentences' embeddings (no gradient
                needed; they only choose the candidates).
            input_ids, attention_mask (`torch.LongTensor` of shape `(B, Lq)`): the masked sentences.
            source_block_ids (`torch.LongTensor` of shape `(B,)`, *optional*): each sentence's own block.

        Returns:
            `dict` of `candidate_ids` `(B, C)` (-1: null), `candidate_input_ids` / `candidate_attention_mask` /
            `candidate_token_type_ids` `(B, C, Lc)` and `joint_input_ids` / `joint_attention_mask` /
            `joint_token_type_ids` `(B, C, Lj)`, on `input_ids.device`.
        """
        candidate_ids = self.retrieve(query_embeddings, source_block_ids)  # (B, C)
        batch_size, num_candidates = candidate_ids.shape
        unique = sorted({block for block in candidate_ids.flatten().tolist() if block >= 0})
        titles = dict(zip(unique, self.documents.titles(unique), strict=True))
        texts = dict(zip(unique, self.documents.texts(unique), strict=True))
        flat = candidate_ids.flatten().tolist()
        # The null document is an empty block: `[CLS] [SEP]` for the embedder, nothing after the query for the encoder.
        flat_titles = [titles.get(block, "") for block in flat]
        flat_texts = [texts.get(block, "") for block in flat]
        candidates = encode_blocks(self.tokenizer, flat_texts, flat_titles, max_length=self.max_block_length)
        pieces = self.tokenizer([block_text(title, text) for title, text in zip(flat_titles, flat_texts, strict=True)],
                                add_special_tokens=False, truncation=True, max_length=self.max_block_length - 1,
                                return_attention_mask=False, return_token_type_ids=False)["input_ids"]  # fmt: skip
        joint = _joint_inputs(input_ids.cpu(), attention_mask.cpu(), pieces, num_candidates, self.tokenizer)
        device = input_ids.device
        out = {"candidate_ids": candidate_ids.to(device)}
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            out[f"candidate_{key}"] = candidates[key].view(batch_size, num_candidates, -1).to(device)
            out[f"joint_{key}"] = joint[key].to(device)
        return out


def _joint_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, pieces: list[list[int]], num_candidates: int,
                  tokenizer) -> dict[str, torch.Tensor]:  # fmt: skip
    """`[CLS] masked sentence [SEP] block [SEP]` (segments 0 / 1) per (sentence, candidate), `(B, C, Lj)`; an empty
    block gives `[CLS] sentence [SEP]`. The sentence keeps its positions, so its labels apply unchanged."""
    batch_size = input_ids.shape[0]
    lengths = attention_mask.sum(-1).tolist()
    rows = []
    for index, block in enumerate(pieces):
        sentence = input_ids[index // num_candidates, : lengths[index // num_candidates]].tolist()
        rows.append((sentence, [*block, tokenizer.sep_token_id] if block else []))
    length = max(len(sentence) + len(block) for sentence, block in rows)
    ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    types = torch.zeros((len(rows), length), dtype=torch.long)
    for row, (sentence, block) in enumerate(rows):
        ids[row, : len(sentence) + len(block)] = torch.tensor(sentence + block, dtype=torch.long)
        mask[row, : len(sentence) + len(block)] = 1
        types[row, len(sentence) : len(sentence) + len(block)] = 1
    shape = (batch_size, num_candidates, length)
    return {"input_ids": ids.view(shape), "attention_mask": mask.view(shape), "token_type_ids": types.view(shape)}


# ---------------------------------------------------------------------------------------------------------------------
# loss


def realm_pretraining_loss(relevance_score: torch.Tensor, token_log_probs: torch.Tensor, mask: torch.Tensor,
                           null_index: int = 0, num_items_in_batch: int | torch.Tensor | None = None,
                           ) -> dict[str, torch.Tensor]:  # fmt: skip
    r"""
    REALM's marginal MLM loss and its retrieval metrics.

    Args:
        relevance_score (`torch.FloatTensor` of shape `(B, C)`): retrieval logits `q . d_z`.
        token_log_probs (`torch.FloatTensor` of shape `(B, C, M)`): `log p(y_j | z, x)` of each masked wordpiece.
        mask (`torch.BoolTensor` of shape `(B, M)`): which of the M slots are real masked wordpieces.
        null_index (`int`, defaults to 0): the null document's candidate slot.
        num_items_in_batch (`int`, *optional*): divide the summed loss by this count instead of this batch's masked
            wordpieces (the Trainer's count over gradient-accumulation steps and processes; see [`RealmPretrainer`]).

    Returns:
        `dict` with `loss` (`-log sum_z p(z | x) p(y_j | z, x)` summed over masked wordpieces and divided by their
        number, or by `num_items_in_batch`), and, without gradient, `mlm_loss` (the mean over this batch's masked
        wordpieces), `retrieval_utility` (mean of marginal minus null-document log-likelihood) and
        `null_probability`.
    """
    if token_log_probs.shape[:2] != relevance_score.shape or token_log_probs.shape[::2] != mask.shape:
        raise ValueError(f"expected relevance_score (B, C), token_log_probs (B, C, M) and mask (B, M), got "
                         f"{tuple(relevance_score.shape)}, {tuple(token_log_probs.shape)}, {tuple(mask.shape)}.")  # fmt: skip
    mask = mask.to(token_log_probs.dtype)
    count = mask.sum()
    if count == 0:
        raise ValueError("the batch has no masked wordpiece (labels are all -100).")
    marginal = marginal_token_log_likelihood(relevance_score.float(), token_log_probs.float())  # (B, M)
    total = -(marginal * mask).sum()
    loss = total / (count if num_items_in_batch is None else num_items_in_batch)
    with torch.no_grad():
        mlm_loss = total / count
        utility = ((marginal - token_log_probs[:, null_index].float()) * mask).sum() / count
        null_probability = relevance_score.float().softmax(-1)[:, null_index].mean()
    return {"loss": loss, "mlm_loss": mlm_loss, "retrieval_utility": utility, "null_probability": null_probability}


# ---------------------------------------------------------------------------------------------------------------------
# model


@dataclass
class RealmPretrainingOutput(ModelOutput):
    r"""
    Args:
        loss (`torch.FloatTensor` of shape `()`): the marginal MLM loss ([`realm_pretraining_loss`]).
        mlm_loss (`torch.FloatTensor` of shape `()`): the same, averaged over this batch's masked wordpieces.
        retrieval_utility (`torch.FloatTensor` of shape `()`): marginal minus null-document log-likelihood per token.
        null_probability (`torch.FloatTensor` of shape `()`): mean retrieval probability of the null document.
        relevance_score (`torch.FloatTensor` of shape `(B, C)`): retrieval logits of the candidates.
        token_log_probs (`torch.FloatTensor` of shape `(B, C, M)`): `log p(y_j | z, x)` at the masked positions.
    """

    loss: torch.FloatTensor | None = None
    mlm_loss: torch.FloatTensor | None = None
    retrieval_utility: torch.FloatTensor | None = None
    null_probability: torch.FloatTensor | None = None
    relevance_score: torch.FloatTensor | None = None
    token_log_probs: torch.FloatTensor | None = None


def _masked_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions `(B, M)`, targets `(B, M)` and mask `(B, M)` of the labelled (!= -100) tokens, left-aligned."""
    labelled = labels != IGNORE_INDEX  # (B, Lq)
    width = max(int(labelled.sum(-1).max()), 1)
    # Stable sort puts labelled positions first, in order.
    positions = torch.sort((~labelled).to(torch.int8), dim=-1, stable=True).indices[:, :width]  # (B, M)
    mask = labelled.gather(1, positions)
    targets = labels.gather(1, positions).masked_fill(~mask, 0)
    return positions, targets, mask


# ---------------------------------------------------------------------------------------------------------------------
# the parts to start from

# Where each part of `RealmForPretraining` lies in a checkpoint, by the checkpoint's architecture: `(prefix, what)`, the
# prefix of its weights ("" at the top) and what is taken, in words; `what` is None for a checkpoint of the part itself.
# The encoder takes the BERT and the MLM head of a model that is no encoder (the head starts fresh where there is none).
_PART_SOURCES = {
    "embedder": {"RealmEmbedder": ("", None), "RealmForOpenQA": ("embedder", "its embedder"),
                 "RealmScorer": ("embedder", "its embedder"), "RealmForPretraining": ("embedder", "its embedder")},
    "query_embedder": {"RealmEmbedder": ("", None), "RealmForOpenQA": ("embedder", "its (question) embedder"),
                       "RealmScorer": ("embedder", "its embedder"),
                       "RealmForPretraining": ("query_embedder", "its question encoder")},
    "encoder": {"RealmKnowledgeAugEncoder": ("", None), "RealmForPretraining": ("encoder", "its encoder"),
                "RealmForOpenQA": ("reader", "its reader's BERT"), "RealmReader": ("", "its BERT"),
                "RealmEmbedder": ("", "its BERT"), "RealmScorer": ("embedder", "its embedder's BERT")},
}  # fmt: skip
_PART_EXPECTED = {
    "embedder": "a RealmEmbedder checkpoint (e.g. ICT's block_embedder/), or a RealmForOpenQA, RealmScorer or "
                "RealmForPretraining checkpoint, whose embedder is used",
    "query_embedder": "a RealmEmbedder checkpoint (e.g. ICT's query_embedder/), or a RealmForOpenQA, RealmScorer or "
                      "RealmForPretraining checkpoint, whose question encoder is used",
    "encoder": "a RealmKnowledgeAugEncoder or BERT checkpoint, or a RealmForPretraining, RealmForOpenQA, RealmReader, "
               "RealmEmbedder or RealmScorer checkpoint, whose encoder, reader or BERT is used",
}  # fmt: skip


def pretraining_part_source(
    path: str | os.PathLike, part: str, name: str | None = None
) -> tuple[str | None, str | None]:
    r"""
    Where the `part` (`"embedder"`, `"query_embedder"` or `"encoder"`) of [`RealmForPretraining`] lies in the checkpoint
    `path`, from its `config.json` alone (no weights are read): `(prefix, what)`, the prefix of the part's weights (""
    at the top) and what is taken, in words (None for a checkpoint of the part itself). A BERT-family checkpoint (not
    REALM) as the encoder gives `(None, "its BERT")`.

    Raises:
        ModelLoadError: the checkpoint holds no such part (a `RealmReader` as the embedder, a BERT checkpoint as the
            embedder, ...); the message names it as `name` (default: `path`), what was expected and what it is.
    """
    from ..errors import ModelLoadError

    config, _ = RealmConfig.get_config_dict(path)
    label = f"{name} {str(path)!r}" if name else repr(str(path))
    if config.get("model_type") != "realm":
        if part == "encoder":
            return None, "its BERT"
        received = f"a {config.get('model_type')!r} checkpoint" if config.get("model_type") else "no model type"
        raise ModelLoadError(f"{label}: expected {_PART_EXPECTED[part]}; received {received} (its config.json), whose "
                             "retriever would start from random weights")  # fmt: skip
    architecture = (config.get("architectures") or [None])[0]
    if architecture is None:
        return "", None  # an older or hand-written config: read as the part itself (`_load_part` checks the weights)
    if architecture not in _PART_SOURCES[part]:
        raise ModelLoadError(f"{label}: expected {_PART_EXPECTED[part]}; received a {architecture} checkpoint")
    return _PART_SOURCES[part][architecture]


def _load_part(part_class, path: str | os.PathLike, part: str, notes: list, name: str | None = None):
    """The `part` of `RealmForPretraining` (a `part_class`) from the checkpoint `path`, in fp32 (see
    [`pretraining_part_source`]). Where it comes from a larger model, `notes` gets `(the checkpoint, what was taken)`
    in words."""
    from ..conversion.bert import realm_model_from_bert
    from ..errors import ModelLoadError

    prefix, what = pretraining_part_source(path, part, name)
    label = f"{name} {str(path)!r}" if name else repr(str(path))
    if prefix is None:  # a BERT checkpoint: `realm_model_from_bert` checks that every encoder weight lands
        return realm_model_from_bert(part_class, path).float()
    kwargs = {}
    if what is not None:
        outer = f"{prefix}\\." if prefix else ""
        if part_class is RealmKnowledgeAugEncoder:
            # The BERT and the MLM head; the decoder is tied to the word embeddings as in BERT (another model's unused
            # decoder matrix would be a second, untrained vocabulary).
            kept = rf"{outer}(?:realm\.|cls\.predictions\.(?!decoder\.weight$))"
        else:
            kept = outer
        kwargs["key_mapping"] = {rf"^(?!{kept})": "ignored."} | ({rf"^{outer}": ""} if outer else {})
    model, info = part_class.from_pretrained(path, dtype=torch.float32, output_loading_info=True, **kwargs)
    tied = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")  # tied to weights that did load
    missing = [key for key in info["missing_keys"] if key.startswith(("realm.", "cls.")) and key not in tied]
    body = [key for key in missing if key.startswith("realm.") or part_class is RealmEmbedder]
    if body:
        source = f"{what} of " if what else ""
        raise ModelLoadError(f"{label}: expected {_PART_EXPECTED[part]}; the {source}checkpoint lacks {len(body)} of "
                             f"the weights it needs ({', '.join(body[:3])}, ...): they would start random")  # fmt: skip
    if what is None:
        return model
    # Transformers remembers `key_mapping` and reverses it on save (writing `reader.realm...` names that no
    # RealmKnowledgeAugEncoder reads back): a model built from the config holding the same weights saves plain names.
    plain = part_class(model.config)
    plain.load_state_dict(model.state_dict())
    plain.train(model.training)
    if part_class is RealmKnowledgeAugEncoder and prefix != "encoder":
        what += " with a fresh MLM head" if missing else " and MLM head"
    architecture = (model.config.architectures or ["REALM"])[0]
    notes.append((f"{label} is a {architecture} checkpoint", f"the {part.replace('_', ' ')} starts from {what}"))
    return plain


class RealmForPretraining(RealmPreTrainedModel):
    r"""
    REALM's pretraining model: one `RealmEmbedder` for sentences and candidate blocks (REALM's shared embedder) and a
    `RealmKnowledgeAugEncoder`; or, with `query_embedder`, a question encoder of its own beside the block encoder
    (`embedder`, which embeds the candidates and the index). The forward takes the candidates as tensors
    ([`PretrainingCandidates`] makes them); it does no retrieval and no I/O.

    A Trainer checkpoint is one `model.safetensors` (`embedder.*`, `encoder.*`, and `query_embedder.*` when there is
    one), so training resumes as usual; [`save_parts`] writes the parts as plain checkpoints: `embedder/` (a
    `RealmEmbedder`: the block encoder, and the question encoder too when shared), `query_embedder/` (when separate)
    and `encoder/` (a `RealmKnowledgeAugEncoder`, REALM's reader initialisation).
    """

    def __init__(self, config: RealmConfig, embedder: RealmEmbedder | None = None,
                 encoder: RealmKnowledgeAugEncoder | None = None,
                 query_embedder: RealmEmbedder | None = None):  # fmt: skip
        super().__init__(config)
        self.embedder = embedder if embedder is not None else RealmEmbedder(config)
        self.encoder = encoder if encoder is not None else RealmKnowledgeAugEncoder(config)
        self.query_embedder = query_embedder
        self.post_init()

    @classmethod
    def from_parts(cls, embedder_path: str | os.PathLike, encoder_path: str | os.PathLike,
                   query_embedder_path: str | os.PathLike | None = None, *,
                   names: dict[str, str] | None = None) -> "RealmForPretraining":  # fmt: skip
        """An embedder checkpoint (e.g. the ICT warm start's `block_embedder/`), an encoder (a
        `RealmKnowledgeAugEncoder` checkpoint, or any BERT-family checkpoint: its MLM head starts fresh if absent) and,
        optionally, a separate question encoder (e.g. ICT's `query_embedder/`). Every part loads in fp32, whatever its
        checkpoint holds (the default model ships fp16): training keeps fp32 weights, and bf16 is autocast.

        A checkpoint holding the part inside a larger model works too (see [`pretraining_part_source`]): the embedder
        of a `RealmForOpenQA`, `RealmScorer` or `RealmForPretraining` checkpoint, and as the encoder the reader's BERT
        (and MLM head) of a `RealmForOpenQA` one, the `encoder` of a `RealmForPretraining` one. Where a part comes from
        such a checkpoint, one line is logged (a warning) saying which part was taken. A checkpoint holding no such
        part raises `ModelLoadError` naming what was expected and received (not a model of random weights). `names`
        names the checkpoints in these messages by part (`{"embedder": "--embedder", ...}`: the command line's
        options); by default they are named by their paths alone."""
        notes, names = [], names or {}
        embedder = _load_part(RealmEmbedder, embedder_path, "embedder", notes, names.get("embedder"))
        query_embedder = None
        if query_embedder_path is not None:
            query_embedder = _load_part(RealmEmbedder, query_embedder_path, "query_embedder", notes,
                                        names.get("query_embedder"))  # fmt: skip
            mine, theirs = embedder.config, query_embedder.config
            if (mine.vocab_size, mine.retriever_proj_size) != (theirs.vocab_size, theirs.retriever_proj_size):
                raise ValueError(f"the question encoder must share the block encoder's vocabulary and projection, got "
                                 f"{theirs.vocab_size} tokens / {theirs.retriever_proj_size} dimensions against "
                                 f"{mine.vocab_size} / {mine.retriever_proj_size}.")  # fmt: skip
        encoder = _load_part(RealmKnowledgeAugEncoder, encoder_path, "encoder", notes, names.get("encoder"))
        if encoder.config.vocab_size != embedder.config.vocab_size:
            raise ValueError(f"the embedder and the encoder must share a vocabulary, got {embedder.config.vocab_size} "
                             f"and {encoder.config.vocab_size} tokens.")  # fmt: skip
        for source in dict.fromkeys(source for source, _ in notes):  # one line: "'demo' is a ...: the embedder ..."
            logger.warning(f"{source}: {', '.join(taken for other, taken in notes if other == source)}")
        return cls(embedder.config, embedder, encoder, query_embedder)

    def save_parts(self, directory: str | os.PathLike, **kwargs) -> None:
        """Writes `directory/embedder/` (`RealmEmbedder`), `directory/encoder/` (`RealmKnowledgeAugEncoder`) and, with a
        separate question encoder, `directory/query_embedder/`."""
        self.embedder.save_pretrained(os.path.join(directory, "embedder"), **kwargs)
        self.encoder.save_pretrained(os.path.join(directory, "encoder"), **kwargs)
        if self.query_embedder is not None:
            self.query_embedder.save_pretrained(os.path.join(directory, "query_embedder"), **kwargs)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              token_type_ids: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Block (candidate) embeddings `(N, D)` of `(N, L)` inputs."""
        return self.embedder(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                             return_dict=True).projected_score  # fmt: skip

    def embed_query(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    token_type_ids: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Question (masked sentence) embeddings `(N, D)`: the question encoder's when there is one, else `embed`."""
        encoder = self.embedder if self.query_embedder is None else self.query_embedder
        return encoder(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                       return_dict=True).projected_score  # fmt: skip

    def forward(
        self,
        input_ids: torch.LongTensor,
        labels: torch.LongTensor,
        candidate_input_ids: torch.LongTensor,
        joint_input_ids: torch.LongTensor,
        attention_mask: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        candidate_attention_mask: torch.LongTensor | None = None,
        candidate_token_type_ids: torch.LongTensor | None = None,
        joint_attention_mask: torch.LongTensor | None = None,
        joint_token_type_ids: torch.LongTensor | None = None,
        candidate_ids: torch.LongTensor | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        return_dict: bool | None = None,
    ) -> RealmPretrainingOutput | tuple:
        r"""
        Args:
            input_ids, attention_mask, token_type_ids (`torch.LongTensor` of shape `(B, Lq)`): masked sentences.
            labels (`torch.LongTensor` of shape `(B, Lq)`): original ids at masked positions, -100 elsewhere.
            candidate_input_ids, candidate_attention_mask, candidate_token_type_ids (`(B, C, Lc)`): the candidates as
                the embedder reads them; slot 0 is the null document.
            joint_input_ids, joint_attention_mask, joint_token_type_ids (`(B, C, Lj)`): `[CLS] sentence [SEP] block
                [SEP]`; the sentence at the same positions as in `input_ids`.
            candidate_ids (`(B, C)`, *optional*): the candidates' block ids; not used by the loss.
            num_items_in_batch (*optional*): the loss's divisor, see [`realm_pretraining_loss`].
        """
        batch_size, num_candidates = candidate_input_ids.shape[:2]
        if candidate_input_ids.dim() != 3 or joint_input_ids.shape[:2] != (batch_size, num_candidates):
            raise ValueError(f"expected candidate_input_ids (B, C, Lc) and joint_input_ids (B, C, Lj) with the same B "
                             f"and C, got {tuple(candidate_input_ids.shape)} and {tuple(joint_input_ids.shape)}.")  # fmt: skip
        if labels.shape != input_ids.shape or labels.shape[0] != batch_size:
            raise ValueError(f"expected labels of the shape of input_ids (B, Lq) with B={batch_size}, got "
                             f"{tuple(labels.shape)} and {tuple(input_ids.shape)}.")  # fmt: skip
        if labels.shape[1] > joint_input_ids.shape[2]:
            raise ValueError(f"the joint inputs ({joint_input_ids.shape[2]} tokens) must begin with the sentence "
                             f"({labels.shape[1]} tokens).")  # fmt: skip

        def flat(tensor):
            return None if tensor is None else tensor.reshape(batch_size * num_candidates, -1)

        query = self.embed_query(input_ids, attention_mask, token_type_ids)  # (B, D)
        candidates = self.embed(
            flat(candidate_input_ids), flat(candidate_attention_mask), flat(candidate_token_type_ids)
        ).view(batch_size, num_candidates, -1)  # (B, C, D)
        relevance_score = fp32_einsum("bd,bcd->bc", query, candidates)  # (B, C), fp32 under autocast too

        positions, targets, mask = _masked_positions(labels)  # (B, M)
        hidden = self.encoder.realm(
            flat(joint_input_ids),
            attention_mask=flat(joint_attention_mask),
            token_type_ids=flat(joint_token_type_ids),
            return_dict=True,
        ).last_hidden_state
        hidden = hidden.view(batch_size, num_candidates, *hidden.shape[1:])  # (B, C, Lj, H)
        width = positions.shape[1]
        index = positions[:, None, :, None].expand(batch_size, num_candidates, width, hidden.shape[-1])
        logits = self.encoder.cls(hidden.gather(2, index))  # (B, C, M, V): the MLM head on masked positions only
        token_log_probs = (
            logits.float()
            .log_softmax(-1)
            .gather(-1, targets[:, None, :, None].expand(batch_size, num_candidates, width, 1))
            .squeeze(-1)
        )  # (B, C, M)
        losses = realm_pretraining_loss(relevance_score, token_log_probs, mask, num_items_in_batch=num_items_in_batch)
        output = RealmPretrainingOutput(
            loss=losses["loss"],
            mlm_loss=losses["mlm_loss"],
            retrieval_utility=losses["retrieval_utility"],
            null_probability=losses["null_probability"],
            relevance_score=relevance_score,
            token_log_probs=token_log_probs,
        )
        return self._return(output, return_dict)


def freeze_pretraining_unused_parameters(model: RealmForPretraining) -> list[str]:
    """Sets `requires_grad=False` on [`PRETRAINING_UNUSED_MODULES`]; returns the names frozen."""
    return freeze_unused_parameters(model, PRETRAINING_UNUSED_MODULES)


# ---------------------------------------------------------------------------------------------------------------------
# trainer


class RealmPretrainer(JsonTrainingArgumentsMixin, Trainer):
    r"""
    `Trainer` for [`RealmForPretraining`]: retrieves the candidates of every batch with `candidates`
    ([`PretrainingCandidates`]), logs `mlm_loss`, `retrieval_utility`, `null_probability` and `index_staleness`
    (means since the last log), and, given a `refresher` ([`IndexRefresher`]), refreshes the index while it trains.

    Training arguments it needs: `remove_unused_columns=False` and `label_names=[]` (the collator's `labels` and
    `source_block_ids` are consumed here). The loss is a mean over the masked wordpieces of the whole optimizer
    step: the Trainer counts them (`num_items_in_batch`, over gradient-accumulation steps and, with
    `average_tokens_across_devices`, over processes), so N processes train as one process over the same global batch.

    The retriever (the embedder) can learn on its own schedule: `retriever_learning_rate` (default: the Trainer's
    `learning_rate`) and `retriever_start_step`: before it, the embedder's learning rate is 0 (it still chooses and
    weighs the candidates) while the encoder learns to read blocks; from it, the embedder's rate warms up over
    `warmup_steps` and decays linearly to 0 at the last step. An encoder with a fresh MLM head predicts the masked
    span no better with one block than another at first, so the retriever's gradient is noise then, and Adam turns
    noise into full-size updates; REALM started from BERT's trained MLM head and had no such phase.

    Args:
        candidates ([`PretrainingCandidates`]): chooses every batch's candidates.
        refresher ([`IndexRefresher`], *optional*): refreshes the index while training.
        retriever_learning_rate (`float`, *optional*): peak learning rate of the embedder.
        retriever_start_step (`int`, defaults to 0): optimizer steps before the embedder starts learning.
    """

    model_class = RealmForPretraining

    def __init__(self, *args, candidates: PretrainingCandidates, refresher=None,
                 retriever_learning_rate: float | None = None, retriever_start_step: int = 0, **kwargs):  # fmt: skip
        super().__init__(*args, **kwargs)
        if retriever_start_step < 0 or (retriever_learning_rate is not None and retriever_learning_rate < 0):
            raise ValueError(f"expected retriever_start_step >= 0 and retriever_learning_rate >= 0, got "
                             f"{retriever_start_step} and {retriever_learning_rate}.")  # fmt: skip
        if retriever_start_step and self.args.lr_scheduler_type != "linear":
            raise ValueError(f"retriever_start_step needs lr_scheduler_type='linear' (REALM's), got "
                             f"{self.args.lr_scheduler_type!r}.")  # fmt: skip
        # The Trainer then counts the masked wordpieces of each step and passes them to `compute_loss`.
        self.model_accepts_loss_kwargs = True
        self.candidates = candidates
        self.refresher = refresher
        self.retriever_learning_rate = retriever_learning_rate
        self.retriever_start_step = retriever_start_step
        self._metrics: dict[str, list[float]] = {}
        self._retriever_rate: float | None = None
        if refresher is not None:
            self.add_callback(IndexRefreshCallback(refresher, candidates, self))

    def create_optimizer(self, model=None):
        """The Trainer's optimizer with the embedder's parameters in groups of their own (`part="retriever"`), last, so
        that the logged `learning_rate` stays the encoder's."""
        if self.optimizer is not None:
            return self.optimizer
        model = self.model if model is None else model
        decay = set(self.get_decay_parameter_names(model))
        groups = []
        for part in ("encoder", "retriever"):
            for with_decay in (True, False):
                params = [parameter for name, parameter in model.named_parameters()
                          if parameter.requires_grad and (name in decay) == with_decay
                          and (_is_retriever_parameter(name) == (part == "retriever"))]  # fmt: skip
                if params:
                    group = {"params": params, "weight_decay": self.args.weight_decay if with_decay else 0.0,
                             "part": part}  # fmt: skip
                    if part == "retriever" and self.retriever_learning_rate is not None:
                        group["lr"] = self.retriever_learning_rate
                    groups.append(group)
        optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, model)
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """The Trainer's scheduler, or, with `retriever_start_step`, REALM's linear warm-up and decay per group, the
        embedder's starting at `retriever_start_step`."""
        if self.lr_scheduler is not None or not self.retriever_start_step:
            return super().create_scheduler(num_training_steps, optimizer)
        optimizer = self.optimizer if optimizer is None else optimizer
        warmup = self.args.get_warmup_steps(num_training_steps)
        starts = [self.retriever_start_step if group.get("part") == "retriever" else 0
                  for group in optimizer.param_groups]  # fmt: skip
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, [functools.partial(delayed_linear_schedule, start=start, warmup_steps=warmup,
                                          total_steps=num_training_steps) for start in starts]
        )  # fmt: skip
        return self.lr_scheduler

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        source_block_ids = inputs.pop("source_block_ids", None)
        unwrapped = self.accelerator.unwrap_model(model)
        with torch.no_grad():
            query = unwrapped.embed_query(inputs["input_ids"], inputs.get("attention_mask"),
                                          inputs.get("token_type_ids"))  # fmt: skip
        batch = self.candidates(query, inputs["input_ids"], inputs["attention_mask"], source_block_ids)
        outputs = model(**inputs, **batch, num_items_in_batch=num_items_in_batch, return_dict=True)
        loss = outputs.loss
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # DDP averages the gradients of a global-count loss
        if model.training:
            for name in ("mlm_loss", "retrieval_utility", "null_probability"):
                self._metrics.setdefault(name, []).append(float(getattr(outputs, name)))
            self._metrics.setdefault("index_staleness", []).append(self.state.global_step - self.candidates.index_step)
            # The rate this step uses (the scheduler moves on after the optimizer step), as the Trainer's
            # `learning_rate` is.
            rates = [group["lr"] for group in self.optimizer.param_groups if group.get("part") == "retriever"]
            self._retriever_rate = rates[0] if rates else None
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            for name, values in self._metrics.items():
                if values:
                    logs[name] = sum(values) / len(values)
            self._metrics = {}
            logs["index_step"] = self.candidates.index_step
            if self._retriever_rate is not None:
                logs["retriever_learning_rate"] = self._retriever_rate
        super().log(logs, *args, **kwargs)


class IndexRefreshCallback(TrainerCallback):
    """Hands the embedder to the refresher every step (it acts every `refresher.every` steps) and swaps in the fresh
    index it returns; closes the refresher when training ends."""

    def __init__(self, refresher, candidates: PretrainingCandidates, trainer: Trainer):
        self.refresher = refresher
        self.candidates = candidates
        self.trainer = trainer

    def _embedder(self):
        return self.trainer.accelerator.unwrap_model(self.trainer.model).embedder

    def on_train_begin(self, args, state, control, **kwargs):
        fresh = self.refresher.start(self.candidates.documents, resume_step=state.global_step)
        if fresh is not None:
            self.candidates.swap(*fresh)

    def on_step_end(self, args, state, control, **kwargs):
        fresh = self.refresher.step(self._embedder(), state.global_step, current_step=self.candidates.index_step)
        if fresh is not None:
            self.candidates.swap(*fresh)

    def on_train_end(self, args, state, control, **kwargs):
        fresh = self.refresher.close(self._embedder(), state.global_step)
        if fresh is not None:
            self.candidates.swap(*fresh)


def _is_retriever_parameter(name: str) -> bool:
    """The retriever's parameters: the block encoder's (`embedder.`) and the question encoder's (`query_embedder.`)."""
    return any(name.startswith(part) or f".{part}" in name for part in ("embedder.", "query_embedder."))


def delayed_linear_schedule(step: int, start: int, warmup_steps: int, total_steps: int) -> float:
    """Learning-rate multiplier at optimizer `step`: 0 before `start`, then linear warm-up over `warmup_steps` and
    linear decay to 0 at `total_steps` (the Trainer's "linear" schedule, shifted by `start`)."""
    step -= start
    if step < 0:
        return 0.0
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    return max(0.0, (total_steps - start - step) / max(1, total_steps - start - warmup_steps))


def pretraining_warmup_steps(max_steps: int) -> int:
    """REALM's warm-up, ORQA's formula ([`orqa_warmup_steps`]): a tenth of the steps, at most 10,000."""
    return orqa_warmup_steps(max_steps)


__all__ = [
    "PRETRAINING_UNUSED_MODULES",
    "IndexRefreshCallback",
    "PretrainingCandidates",
    "RealmForPretraining",
    "RealmPretrainer",
    "RealmPretrainingOutput",
    "delayed_linear_schedule",
    "freeze_pretraining_unused_parameters",
    "pretraining_warmup_steps",
    "realm_pretraining_loss",
    "salient_sentences",
]

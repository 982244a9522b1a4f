"""REALM (Guu et al. 2020) and ORQA (Lee et al. 2019) on Transformers 5, composed from Transformers' BERT blocks.

Module names, state-dict keys, forward signatures and numerics are those of transformers 4.44.2, so every Hub REALM
checkpoint loads unchanged. What changed: everything saves as safetensors, missing `block_emb` rows are zeros rather
than uninitialised memory, and `RealmReader` / `RealmForOpenQA` accept a batch of questions.

Dimension names used in shape comments:
    B - batch of questions            C - candidates per question (`num_candidates`)
    K - retrieved blocks (`searcher_beam_size`)   R - blocks read (`reader_beam_size`)
    L - sequence length               H - hidden size          D - retriever projection size
    N - span candidates               S - span hidden size     V - vocabulary size
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions, MaskedLMOutput
from transformers.models.bert.modeling_bert import (
    BertEmbeddings,
    BertLayer,
    BertLMPredictionHead,
    BertModel,
    BertOnlyMLMHead,
    BertSelfAttention,
)
from transformers.utils import ModelOutput, logging

from .configuration_realm import RealmConfig

logger = logging.get_logger(__name__)

# The `from_pretrained` keyword arguments that say where files come from on the Hub.
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")


# ---------------------------------------------------------------------------------------------------------------------
# building blocks


class RealmBertModel(BertModel):
    """The BERT encoder REALM uses everywhere: Transformers 5's `BertModel`, keyed under `realm.` in checkpoints."""

    config_class = RealmConfig
    base_model_prefix = "realm"

    def __init__(self, config: RealmConfig, *args, **kwargs):
        # The config validates itself when constructed, but a field set afterwards (say position_embedding_type =
        # "relative_key") would otherwise build a different model silently.
        config.validate_architecture()
        super().__init__(config, *args, **kwargs)

    def forward(self, input_ids=None, *args, output_attentions=None, output_hidden_states=None, **kwargs):
        # Transformers 5's BertModel reads an explicit None as False; REALM's models, as in 4.x, use the config's.
        _check_input_ids(input_ids, self.config, kwargs.get("position_ids"))
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        return super().forward(
            input_ids, *args, output_attentions=output_attentions, output_hidden_states=output_hidden_states, **kwargs
        )


def _check_input_ids(input_ids: torch.Tensor | None, config: RealmConfig, position_ids=None) -> None:
    """A clear ValueError for ids the embeddings cannot look up (an IndexError deep in torch otherwise) and for
    sequences longer than the position embeddings (a tensor size mismatch otherwise)."""
    if input_ids is None or input_ids.numel() == 0:
        return
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= config.vocab_size:
        bad = low if low < 0 else high
        raise ValueError(
            f"input_ids hold token id {bad}, outside this model's vocabulary of {config.vocab_size} ids (expected ids "
            f"in 0..{config.vocab_size - 1}); was the input made with another model's tokenizer?"
        )
    if position_ids is None and input_ids.shape[-1] > config.max_position_embeddings:
        raise ValueError(
            f"input_ids hold {input_ids.shape[-1]} tokens per sequence, more than this model's "
            f"{config.max_position_embeddings} position embeddings (config.max_position_embeddings); truncate them, "
            f"e.g. tokenizer(..., truncation=True, max_length={config.max_position_embeddings})."
        )


class RealmScorerProjection(nn.Module):
    """Projects the pooled `[CLS]` state to the retrieval space: dense -> LayerNorm (D = retriever_proj_size).

    `predictions` is an MLM head that REALM never calls; it exists so that checkpoints keep their `cls.predictions.*`
    keys.
    """

    def __init__(self, config: RealmConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.dense = nn.Linear(config.hidden_size, config.retriever_proj_size)
        self.LayerNorm = nn.LayerNorm(config.retriever_proj_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(hidden_states))


class RealmReaderProjection(nn.Module):
    """Scores every span up to `max_span_width` wordpieces from its start and end token states."""

    def __init__(self, config: RealmConfig):
        super().__init__()
        self.config = config
        self.dense_intermediate = nn.Linear(config.hidden_size, config.span_hidden_size * 2)
        self.dense_output = nn.Linear(config.span_hidden_size, 1)
        self.layer_normalization = nn.LayerNorm(config.span_hidden_size, eps=config.reader_layer_norm_eps)
        self.relu = nn.ReLU()

    def forward(self, hidden_states: torch.Tensor, block_mask: torch.Tensor):
        """
        Args:
            hidden_states (`torch.Tensor` of shape `(B, R, L, H)`): reader token states.
            block_mask (`torch.Tensor` of shape `(B, R, L)`): 1 on evidence tokens, where answers may start and end.

        Returns:
            `(reader_logits (B, R, N), candidate_starts (N,), candidate_ends (N,))`; spans are ordered by width, then
            by start, as in transformers 4.x.
        """
        seq_len = hidden_states.shape[-2]
        candidate_starts, candidate_ends = span_candidates(seq_len, self.config.max_span_width, hidden_states.device)
        candidate_mask = (block_mask[..., candidate_starts] * block_mask[..., candidate_ends]).bool()  # (B, R, N)

        start_projection, end_projection = self.dense_intermediate(hidden_states).chunk(2, dim=-1)  # (B, R, L, S)
        # Only the spans inside the evidence are scored (V of the B * R * N): the others get the most negative float
        # anyway, and the (B, R, N, S) states of all spans were most of the projection's time. Gathered as rows of the
        # flattened (B * R * L, S) projections: `index_select` and its backward are several times faster than
        # indexing with three index tensors.
        block, row, candidate = candidate_mask.nonzero(as_tuple=True)  # (V,) each
        first_token = (block * candidate_mask.shape[1] + row) * seq_len  # (V,): the row's offset in the flat tokens
        span_size = start_projection.shape[-1]
        span_hidden = self.relu(
            start_projection.reshape(-1, span_size).index_select(0, first_token + candidate_starts[candidate])
            + end_projection.reshape(-1, span_size).index_select(0, first_token + candidate_ends[candidate])
        )
        span_hidden = self.layer_normalization(span_hidden)  # (V, S)
        logits = self.dense_output(span_hidden).squeeze(-1).float()  # (V,), fp32 under autocast too
        reader_logits = torch.full(candidate_mask.shape, torch.finfo(logits.dtype).min, dtype=logits.dtype,
                                   device=logits.device).index_put((block, row, candidate), logits)  # fmt: skip
        return reader_logits, candidate_starts, candidate_ends


def span_candidates(seq_len: int, max_span_width: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """All spans of width 1..max_span_width inside `seq_len` tokens, width-major: `(starts (N,), ends (N,))`."""
    starts, ends = [], []
    for width in range(1, max_span_width + 1):
        starts.append(torch.arange(0, seq_len - width + 1, device=device))
        ends.append(torch.arange(width - 1, seq_len, device=device))
    return torch.cat(starts), torch.cat(ends)


def mask_to_score(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """0 where `mask` is 1 and the most negative finite value where it is 0, to be added to logits."""
    return (1.0 - mask.type(dtype)) * torch.finfo(dtype).min


def fp32_einsum(equation: str, *operands: torch.Tensor) -> torch.Tensor:
    """`torch.einsum` in fp32 even under bf16 autocast: retrieval logits are few but feed softmaxes over thousands of
    blocks, where bf16's 8-bit mantissa would blur them."""
    device_type = operands[0].device.type
    with torch.autocast(device_type, enabled=False):
        return torch.einsum(equation, *(operand.float() for operand in operands))


def marginal_log_loss(logits: torch.Tensor, is_correct: torch.Tensor) -> torch.Tensor:
    """-log of the probability mass on the correct entries of the last dim: `logsumexp(all) - logsumexp(correct)`."""
    return torch.logsumexp(logits, dim=-1) - torch.logsumexp(logits + mask_to_score(is_correct, logits.dtype), dim=-1)


def marginal_token_log_likelihood(relevance_score: torch.Tensor, token_log_probs: torch.Tensor) -> torch.Tensor:
    """REALM's per-token marginal over retrieved candidates, `log sum_c p(c | x) p(y_t | x, c)`.

    `relevance_score` `(B, C)` are retrieval logits, `token_log_probs` `(B, C, T)` are `log p(y_t | x, c)`; returns
    `(B, T)`. Used by `RealmKnowledgeAugEncoder` and by REALM pretraining (`realm_hf.training.pretrain`)."""
    return (relevance_score.log_softmax(-1).unsqueeze(-1) + token_log_probs).logsumexp(1)


def length_buckets(attention_mask: torch.Tensor, max_buckets: int) -> list[tuple[torch.Tensor, int]] | None:
    """Groups right-padded rows `(N, L)` into at most `max_buckets` groups of similar length, chosen to read the
    fewest padded tokens (rows sorted by length, optimal contiguous split). Returns `[(row indices, length), ...]`, or
    `None` when grouping would not save anything or a row is not right-padded (attends after a padding column)."""
    mask = attention_mask.bool()
    num_rows, seq_len = mask.shape
    if num_rows < 2 or max_buckets < 2:
        return None
    lengths = mask.sum(-1)
    # Right padding: each row attends to a prefix of its columns.
    if not bool((mask.int().diff(dim=-1) <= 0).all()):
        return None
    sorted_lengths, order = torch.sort(lengths.clamp(min=1), stable=True)
    values = sorted_lengths.tolist()
    # best[k][j]: fewest tokens to read the first j rows in k groups; a group of rows i..j-1 costs (j - i) * l[j-1].
    infinity = float("inf")
    best = [[0.0] + [infinity] * num_rows]
    cut = [[0] * (num_rows + 1)]
    for _ in range(1, max_buckets + 1):
        row, row_cut = [0.0] + [infinity] * num_rows, [0] * (num_rows + 1)
        for end in range(1, num_rows + 1):
            for start in range(end):
                cost = best[-1][start] + (end - start) * values[end - 1]
                if cost < row[end]:
                    row[end], row_cut[end] = cost, start
        best.append(row)
        cut.append(row_cut)
    num_groups = min(range(1, max_buckets + 1), key=lambda k: (best[k][num_rows], k))
    if num_groups == 1 and values[-1] >= seq_len:
        return None  # one group at the full length: the plain batch
    groups, end = [], num_rows
    for k in range(num_groups, 0, -1):
        start = cut[k][end]
        groups.append((order[start:end], int(values[end - 1])))
        end = start
    return groups[::-1]


def _flatten_candidates(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """`(..., L)` -> `(-1, L)` for every tensor with more than two dims; `None` stays `None`."""
    return [t.reshape(-1, t.shape[-1]) if t is not None and t.dim() > 2 else t for t in tensors]


def _check_output_attentions(model: PreTrainedModel, output_attentions: bool | None) -> None:
    requested = output_attentions if output_attentions is not None else model.config.output_attentions
    implementation = model.config._attn_implementation
    if requested and implementation not in (None, "eager"):
        raise ValueError(
            f"output_attentions=True needs eager attention, but this model runs {implementation!r}, which returns no "
            "attention weights. Load it with from_pretrained(..., attn_implementation='eager') or call "
            "model.set_attn_implementation('eager')."
        )


def _check_head_mask(head_mask: torch.Tensor | None) -> None:
    if head_mask is not None:
        raise NotImplementedError(
            "head_mask is not supported: Transformers 5's BERT attention removed head masking. Pass head_mask=None."
        )


def _tensor_shape(value) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


# ---------------------------------------------------------------------------------------------------------------------
# pretrained base


class RealmPreTrainedModel(PreTrainedModel):
    """Weight initialisation and loading rules shared by every REALM model."""

    config_class = RealmConfig
    base_model_prefix = "realm"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": BertLayer, "attentions": BertSelfAttention}
    # REALM losses are means over questions; the Trainer must not rescale them by a token count.
    accepts_loss_kwargs = False
    # Weights of a composite checkpoint that a sub-model does not use (see `_prefix_in_checkpoints_of`).
    _keys_to_ignore_on_load_unexpected = [r"^ignored\."]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, BertLMPredictionHead):
            init.zeros_(module.bias)
        elif isinstance(module, BertEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)
        elif isinstance(module, RealmForOpenQA):
            # 4.x left block_emb as uninitialised memory when a checkpoint lacked it; zeros make that state explicit.
            init.zeros_(module.block_emb)

    # What needs file or Hub I/O, which modeling/ does not do (it also runs as Hub remote code without realm_hf):
    # `realm_hf.register()` fills these. "explain_load_failure": `(name_or_path, subfolder, revision) -> str | None`
    # names a damaged weights file; "push_to_hub": `(model, repo_id, **kwargs)` uploads with realm_hf's model card.
    _realm_hf_hooks: dict = {}

    # Architectures whose checkpoints hold this model under a prefix, e.g. the embedder of a RealmForOpenQA checkpoint.
    _prefix_in_checkpoints_of: dict[str, str] = {}

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, plus: a sub-model loads from a composite checkpoint (e.g.
        `RealmReader.from_pretrained` of a `RealmForOpenQA` checkpoint, which failed in 4.x), and a damaged weights
        file is named with what was expected and found."""
        if cls._prefix_in_checkpoints_of and pretrained_model_name_or_path is not None and "key_mapping" not in kwargs:
            config = kwargs.get("config")
            if not isinstance(config, PreTrainedConfig):
                hub_kwargs = {key: kwargs[key] for key in _HUB_KWARGS if key in kwargs}
                config = RealmConfig.from_pretrained(pretrained_model_name_or_path, **hub_kwargs)
            architecture = (config.architectures or [None])[0]
            prefix = cls._prefix_in_checkpoints_of.get(architecture)
            if prefix is not None:
                # Keys outside the prefix are renamed under "ignored." first, then the prefix is stripped.
                kwargs["key_mapping"] = {rf"^(?!{prefix}\.)": "ignored.", rf"^{prefix}\.": ""}
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        except Exception as error:
            explain = RealmPreTrainedModel._realm_hf_hooks.get("explain_load_failure")
            if pretrained_model_name_or_path is None or explain is None:
                raise
            problem = explain(pretrained_model_name_or_path, kwargs.get("subfolder", ""), kwargs.get("revision"))
            if problem is not None:
                raise ValueError(problem) from error
            raise

    def push_to_hub(self, repo_id: str, **kwargs):
        """`PreTrainedModel.push_to_hub` (same arguments, plus `model_card=`), uploading realm_hf's model card
        (`library_name: realm_hf`, usage for this class) instead of the generic card Transformers writes; a card
        already in the repo is kept. See `realm_hf.hub.push_model_to_hub` (set by `realm_hf.register()`; without
        realm_hf, e.g. as Hub remote code, Transformers' own push)."""
        push = RealmPreTrainedModel._realm_hf_hooks.get("push_to_hub")
        if push is None:
            return super().push_to_hub(repo_id, **kwargs)
        return push(self, repo_id, **kwargs)

    def _return(self, output: ModelOutput, return_dict: bool | None):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        return output if return_dict else output.to_tuple()


# ---------------------------------------------------------------------------------------------------------------------
# outputs


@dataclass
class RealmEmbedderOutput(ModelOutput):
    r"""
    Output of [`RealmEmbedder`].

    Args:
        projected_score (`torch.FloatTensor` of shape `(batch_size, config.retriever_proj_size)`):
            Retrieval embedding of each input.
        hidden_states (`tuple(torch.FloatTensor)`, *optional*): per-layer states, each `(batch_size, L, H)`.
        attentions (`tuple(torch.FloatTensor)`, *optional*): per-layer attention weights (eager attention only).
    """

    projected_score: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor] | None = None
    attentions: tuple[torch.FloatTensor] | None = None


@dataclass
class RealmScorerOutput(ModelOutput):
    r"""
    Output of [`RealmScorer`].

    Args:
        relevance_score (`torch.FloatTensor` of shape `(batch_size, config.num_candidates)`):
            Inner product of each query with each of its candidates (before softmax).
        query_score (`torch.FloatTensor` of shape `(batch_size, config.retriever_proj_size)`): query embeddings.
        candidate_score (`torch.FloatTensor` of shape `(batch_size, config.num_candidates, config.retriever_proj_size)`):
            candidate embeddings.
    """

    relevance_score: torch.FloatTensor | None = None
    query_score: torch.FloatTensor | None = None
    candidate_score: torch.FloatTensor | None = None


@dataclass
class RealmReaderOutput(ModelOutput):
    r"""
    Output of [`RealmReader`]. For 2-D inputs (one question, as in transformers 4.x) the scalar fields are 0-d and
    `start_pos`/`end_pos` have shape `(1,)`; for 3-D inputs `(B, R, L)` every field gains a leading batch dim `B`.

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*): `mean(retriever_loss + reader_loss)`.
        retriever_loss (`torch.FloatTensor` of shape `()` or `(B,)`, *optional*): marginal log-loss of the retrieval
            distribution over all `searcher_beam_size` blocks.
        reader_loss (`torch.FloatTensor` of shape `()` or `(B,)`, *optional*): marginal log-loss over gold spans.
        retriever_correct (`torch.BoolTensor` of shape `(K,)` or `(B, K)`, *optional*): whether each block has an answer.
        reader_correct (`torch.BoolTensor` of shape `(R, N)` or `(B, R, N)`, *optional*): whether each span is gold.
        block_idx (`torch.LongTensor` of shape `()` or `(B,)`): index of the block holding the predicted answer.
        candidate (`torch.LongTensor` of shape `()` or `(B,)`): index of the predicted span candidate.
        start_pos (`torch.LongTensor` of shape `(1,)` or `(B,)`): start token of the predicted answer in its block.
        end_pos (`torch.LongTensor` of shape `(1,)` or `(B,)`): end token (inclusive) of the predicted answer.
        hidden_states, attentions: as in [`RealmEmbedderOutput`].
    """

    loss: torch.FloatTensor | None = None
    retriever_loss: torch.FloatTensor | None = None
    reader_loss: torch.FloatTensor | None = None
    retriever_correct: torch.BoolTensor | None = None
    reader_correct: torch.BoolTensor | None = None
    block_idx: torch.LongTensor | None = None
    candidate: torch.LongTensor | None = None
    start_pos: torch.LongTensor | None = None
    end_pos: torch.LongTensor | None = None
    hidden_states: tuple[torch.FloatTensor] | None = None
    attentions: tuple[torch.FloatTensor] | None = None


@dataclass
class RealmForOpenQAOutput(ModelOutput):
    r"""
    Output of [`RealmForOpenQA`].

    Args:
        reader_output (`RealmReaderOutput`): the reader's output on the retrieved blocks.
        predicted_answer_ids (`torch.LongTensor` of shape `(answer_len,)`, or a list of `B` such tensors when the
            batch holds more than one question): wordpieces of the predicted answer.
        retrieved_block_ids (`torch.LongTensor` of shape `(B, K)`): corpus ids of the retrieved blocks, best first;
            `reader_output.block_idx` indexes the last dim.
    """

    reader_output: RealmReaderOutput | None = None
    predicted_answer_ids: torch.LongTensor | list[torch.LongTensor] | None = None
    retrieved_block_ids: torch.LongTensor | None = None


@dataclass
class RealmForOpenQASpanScores(ModelOutput):
    r"""
    Output of [`RealmForOpenQA.score_spans`]: a score for every candidate answer span of every block read. Always
    batched, also for one question.

    Args:
        span_logits (`torch.FloatTensor` of shape `(B, R, N)`): the logit of "the answer is span `n` of block `r`":
            the reader's span logit plus the block's retrieval logit, what `forward` takes its argmaxes over and the
            reader loss marginalises. Spans that do not lie inside the block text hold the most negative float.
        span_mask (`torch.BoolTensor` of shape `(B, R, N)`): whether each span lies inside the block text.
        candidate_starts, candidate_ends (`torch.LongTensor` of shape `(N,)`): first and last (inclusive) token of
            each span candidate in the reader input; spans are ordered by width, then by start.
        retrieved_block_ids (`torch.LongTensor` of shape `(B, K)`): corpus ids of the retrieved blocks, best first;
            the first `R` were read.
        retrieved_logits (`torch.FloatTensor` of shape `(B, K)`): their retrieval logits (question . block).
        reader_input_ids (`torch.LongTensor` of shape `(B, R, L)`): the `[CLS] question [SEP] block [SEP]` inputs read.
        block_mask (`torch.BoolTensor` of shape `(B, R, L)`): which of those tokens belong to the block.
    """

    span_logits: torch.FloatTensor | None = None
    span_mask: torch.BoolTensor | None = None
    candidate_starts: torch.LongTensor | None = None
    candidate_ends: torch.LongTensor | None = None
    retrieved_block_ids: torch.LongTensor | None = None
    retrieved_logits: torch.FloatTensor | None = None
    reader_input_ids: torch.LongTensor | None = None
    block_mask: torch.BoolTensor | None = None


# ---------------------------------------------------------------------------------------------------------------------
# models


class RealmEmbedder(RealmPreTrainedModel):
    """Embeds questions or blocks into the retrieval space: BERT -> pooler -> dense -> LayerNorm.

    Loads from embedder checkpoints and also from the `embedder.` part of `RealmForOpenQA` / `RealmScorer` ones.
    """

    _prefix_in_checkpoints_of = {"RealmForOpenQA": "embedder", "RealmScorer": "embedder"}
    # The MLM head REALM never calls (see RealmScorerProjection): open-QA checkpoints and the default model drop it, and
    # loading their embedder (as `realm-hf index build` does) is not worth a "MISSING ... consider training" report.
    _keys_to_ignore_on_load_missing = [r"^cls\.predictions\."]

    _tied_weights_keys = {"cls.predictions.decoder.bias": "cls.predictions.bias"}

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.realm = RealmBertModel(config)
        self.cls = RealmScorerProjection(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.realm.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.realm.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        head_mask: torch.FloatTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> RealmEmbedderOutput | tuple:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, L)`): wordpiece ids, `[CLS] text [SEP]` or
                `[CLS] title [SEP] text [SEP]`.
            attention_mask, token_type_ids, position_ids (`torch.LongTensor` of shape `(batch_size, L)`, *optional*).
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, L, H)`, *optional*): instead of `input_ids`.

        Example:

        ```python
        >>> from realm_hf import RealmEmbedder, RealmTokenizer
        >>> tokenizer = RealmTokenizer.from_pretrained("google/realm-cc-news-pretrained-embedder")
        >>> model = RealmEmbedder.from_pretrained("google/realm-cc-news-pretrained-embedder")
        >>> projected_score = model(**tokenizer("Hello, my dog is cute", return_tensors="pt")).projected_score
        ```
        """
        _check_head_mask(head_mask)
        _check_output_attentions(self, output_attentions)
        realm_outputs = self.realm(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        projected_score = self.cls(realm_outputs.pooler_output)  # (batch, D)
        output = RealmEmbedderOutput(
            projected_score=projected_score,
            hidden_states=realm_outputs.hidden_states,
            attentions=realm_outputs.attentions,
        )
        return self._return(output, return_dict)


class RealmScorer(RealmPreTrainedModel):
    r"""
    Scores each query against its candidates: `relevance_score = query_embedding . candidate_embedding`.

    Args:
        config (`RealmConfig`): the model configuration.
        query_embedder (`RealmEmbedder`, *optional*): a separate question encoder; by default the candidates'
            `embedder` encodes the queries too.

    Checkpoints from transformers 4.x hold the shared embedder under both `embedder.` and `query_embedder.`; with no
    separate `query_embedder` the duplicate keys are dropped on load and not written on save.
    """

    _keys_to_ignore_on_load_unexpected = [r"^ignored\.", r"^query_embedder\."]

    def __init__(self, config: RealmConfig, query_embedder: RealmEmbedder | None = None):
        super().__init__(config)
        self.embedder = RealmEmbedder(config)
        if query_embedder is not None:
            self.query_embedder = query_embedder
        self.post_init()

    @property
    def query_embedder(self) -> RealmEmbedder:
        # A registered module only when it is separate, so that shared weights are saved once.
        return self._modules.get("query_embedder", self.embedder)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        candidate_input_ids: torch.LongTensor | None = None,
        candidate_attention_mask: torch.FloatTensor | None = None,
        candidate_token_type_ids: torch.LongTensor | None = None,
        candidate_inputs_embeds: torch.FloatTensor | None = None,
        head_mask: torch.FloatTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> RealmScorerOutput | tuple:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, L)`): the queries.
            candidate_input_ids (`torch.LongTensor` of shape `(batch_size, num_candidates, L)` or
                `(batch_size * num_candidates, L)`): the candidates, e.g. from `tokenizer.batch_encode_candidates`.
            candidate_attention_mask, candidate_token_type_ids: same shape as `candidate_input_ids`.
            candidate_inputs_embeds (`torch.FloatTensor` of shape `(batch_size * num_candidates, L, H)`, *optional*).
        """
        if input_ids is None and inputs_embeds is None:
            raise ValueError("You have to specify either input_ids or inputs_embeds.")
        if candidate_input_ids is None and candidate_inputs_embeds is None:
            raise ValueError("You have to specify either candidate_input_ids or candidate_inputs_embeds.")
        _check_head_mask(head_mask)
        _check_output_attentions(self, output_attentions)

        query_outputs = self.query_embedder(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        flat_ids, flat_mask, flat_token_types = _flatten_candidates(
            candidate_input_ids, candidate_attention_mask, candidate_token_type_ids
        )
        candidate_outputs = self.embedder(
            flat_ids,
            attention_mask=flat_mask,
            token_type_ids=flat_token_types,
            position_ids=position_ids,
            inputs_embeds=candidate_inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        query_score = query_outputs.projected_score  # (B, D)
        flat_candidate_score = candidate_outputs.projected_score  # (B * C, D)
        num_candidates = self.config.num_candidates
        if flat_candidate_score.shape[0] != query_score.shape[0] * num_candidates:
            raise ValueError(
                f"expected {query_score.shape[0]} x config.num_candidates={num_candidates} candidates for "
                f"{query_score.shape[0]} queries, got {flat_candidate_score.shape[0]} (candidate input shape "
                f"{_tensor_shape(candidate_input_ids if candidate_input_ids is not None else candidate_inputs_embeds)})."
            )
        candidate_score = flat_candidate_score.view(-1, num_candidates, self.config.retriever_proj_size)  # (B, C, D)
        relevance_score = torch.einsum("bd,bnd->bn", query_score, candidate_score)  # (B, C)
        output = RealmScorerOutput(
            relevance_score=relevance_score, query_score=query_score, candidate_score=candidate_score
        )
        return self._return(output, return_dict)


class RealmKnowledgeAugEncoder(RealmPreTrainedModel):
    """REALM's knowledge-augmented encoder: an MLM over (query, retrieved block) pairs, marginalised over blocks."""

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "realm.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.realm = RealmBertModel(config)
        self.cls = BertOnlyMLMHead(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.realm.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.realm.embeddings.word_embeddings = value

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        head_mask: torch.FloatTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        relevance_score: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        mlm_mask: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> MaskedLMOutput | tuple:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, C, L)` or `(B * C, L)`): each query paired with each of its
                `config.num_candidates` retrieved blocks.
            relevance_score (`torch.FloatTensor` of shape `(B, C)`): retrieval logits, required with `labels`.
            labels (`torch.LongTensor` of shape `(B, L)`, *optional*): MLM targets for the query tokens; -100 scores 0.
            mlm_mask (`torch.LongTensor` of shape `(B, L)`, *optional*): which positions count in the mean loss
                (default: all, -100 positions included, as in transformers 4.x).

        Returns:
            `MaskedLMOutput` with `logits` of shape `(B * C, L, V)` and, given `labels`, the loss
            `-mean_t log sum_c p(c | x) p(y_t | x, c)`.
        """
        if labels is not None and relevance_score is None:
            raise ValueError(
                "You have to specify `relevance_score` when `labels` is specified in order to compute loss."
            )
        _check_head_mask(head_mask)
        _check_output_attentions(self, output_attentions)
        flat_ids, flat_mask, flat_token_types = _flatten_candidates(input_ids, attention_mask, token_type_ids)
        realm_outputs = self.realm(
            flat_ids,
            attention_mask=flat_mask,
            token_type_ids=flat_token_types,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        prediction_scores = self.cls(realm_outputs.last_hidden_state)  # (B * C, L, V)

        masked_lm_loss = None
        if labels is not None:
            batch_size, seq_length = labels.shape
            num_candidates = self.config.num_candidates
            if tuple(relevance_score.shape) != (batch_size, num_candidates):
                raise ValueError(
                    f"relevance_score must have shape (batch_size, config.num_candidates) = "
                    f"({batch_size}, {num_candidates}), got {_tensor_shape(relevance_score)}."
                )
            if prediction_scores.shape[0] != batch_size * num_candidates:
                raise ValueError(
                    f"expected {batch_size} x {num_candidates} candidate rows for labels of shape "
                    f"{tuple(labels.shape)}, got {prediction_scores.shape[0]}."
                )
            mlm_mask = (
                torch.ones_like(labels, dtype=torch.float32) if mlm_mask is None else mlm_mask.type(torch.float32)
            )
            # -log p(y_t | x, c) for every candidate c: (B, C, L)
            token_log_probs = -nn.functional.cross_entropy(
                prediction_scores.view(-1, self.config.vocab_size),
                labels.tile(1, num_candidates).view(-1),
                reduction="none",
            ).view(batch_size, num_candidates, seq_length)
            marginal_log_probs = marginal_token_log_likelihood(relevance_score, token_log_probs)  # (B, L)
            masked_lm_loss = -torch.nansum(torch.sum(marginal_log_probs * mlm_mask) / torch.sum(mlm_mask))

        output = MaskedLMOutput(
            loss=masked_lm_loss,
            logits=prediction_scores,
            hidden_states=realm_outputs.hidden_states,
            attentions=realm_outputs.attentions,
        )
        return self._return(output, return_dict)


class RealmReader(RealmPreTrainedModel):
    """Extracts the answer span from retrieved blocks; its loss trains both the reader and the retriever logits.

    Loads from reader checkpoints and also from the `reader.` part of `RealmForOpenQA` ones.
    """

    _prefix_in_checkpoints_of = {"RealmForOpenQA": "reader"}

    _tied_weights_keys = {"cls.predictions.decoder.bias": "cls.predictions.bias"}

    def __init__(self, config: RealmConfig):
        super().__init__(config)
        self.num_labels = getattr(config, "num_labels", 2)
        self.realm = RealmBertModel(config)
        # Never called: kept so that 4.x checkpoints load with no unexpected keys.
        self.cls = BertOnlyMLMHead(config)
        self.qa_outputs = RealmReaderProjection(config)
        # Read the (B x R) blocks in up to this many groups of similar length, each padded to its own longest row
        # (see `length_buckets`); 1 reads them as one batch padded to the longest block. Training sets it
        # (`realm_hf.training.enable_length_buckets`); outputs equal the one-batch ones to rounding.
        self.max_length_buckets = 1
        self.post_init()

    def get_input_embeddings(self):
        return self.realm.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.realm.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        head_mask: torch.FloatTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        relevance_score: torch.FloatTensor | None = None,
        block_mask: torch.BoolTensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        has_answers: torch.BoolTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> RealmReaderOutput | tuple:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(R, L)` for one question, or `(B, R, L)` for a batch): the
                `[CLS] question [SEP] block [SEP]` inputs of the first `reader_beam_size` retrieved blocks.
            token_type_ids (`torch.LongTensor`, same shape): required, as in 4.x.
            relevance_score (`torch.FloatTensor` of shape `(K,)` or `(B, K)`): retrieval logits of all
                `searcher_beam_size` blocks; the first `R` are added to the span logits.
            block_mask (`torch.BoolTensor`, same shape as `input_ids`): evidence tokens, where answers may lie.
            start_positions, end_positions (`torch.LongTensor` of shape `(K, A)` or `(B, K, A)`, *optional*): gold
                answer spans per block, padded with -1.
            has_answers (`torch.BoolTensor` of shape `(K,)` or `(B, K)`, *optional*): whether each block holds a gold
                answer. The loss is computed when all three label tensors are given.
        """
        if relevance_score is None:
            raise ValueError("You have to specify `relevance_score` to calculate logits and loss.")
        if block_mask is None:
            raise ValueError("You have to specify `block_mask` to separate question block and evidence block.")
        if token_type_ids is None:
            raise ValueError("You have to specify `token_type_ids` (0 on the question, 1 on the block).")
        if token_type_ids.size(-1) < self.config.max_span_width:
            raise ValueError(
                f"The input sequence length ({token_type_ids.size(-1)}) must be greater than or equal to "
                f"config.max_span_width ({self.config.max_span_width})."
            )
        _check_head_mask(head_mask)
        _check_output_attentions(self, output_attentions)

        reference = input_ids if input_ids is not None else inputs_embeds[..., 0]
        batched = reference.dim() == 3
        if not batched and reference.dim() != 2:
            raise ValueError(f"input_ids must have shape (R, L) or (B, R, L), got {_tensor_shape(reference)}.")
        if not batched:
            # One question, as in transformers 4.x: add the question dim and take it away at the end.
            relevance_score = relevance_score.unsqueeze(0)
            block_mask = block_mask.unsqueeze(0)
            if has_answers is not None:
                has_answers = has_answers.unsqueeze(0)
            if start_positions is not None:
                start_positions = start_positions.unsqueeze(0)
            if end_positions is not None:
                end_positions = end_positions.unsqueeze(0)
        batch_size, num_read, seq_len = block_mask.shape[0], reference.shape[-2], reference.shape[-1]
        if relevance_score.dim() != 2 or relevance_score.shape[0] != batch_size or relevance_score.shape[1] < num_read:
            raise ValueError(
                f"relevance_score must have shape (K,) for one question or (B, K) for B questions, with "
                f"K >= {num_read} blocks read; got {_tensor_shape(relevance_score)} for input shape "
                f"{_tensor_shape(reference)}."
            )
        if block_mask.dim() != 3 or block_mask.shape[-1] != seq_len or block_mask.shape[-2] < num_read:
            raise ValueError(
                f"block_mask must cover the blocks of input_ids {_tensor_shape(reference)} (at least {num_read} rows "
                f"of length {seq_len}), got {tuple(block_mask.shape[1:]) if not batched else tuple(block_mask.shape)}."
            )

        reader_logits, candidate_starts, candidate_ends, realm_outputs = self._span_logits(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            relevance_score=relevance_score,
            block_mask=block_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )  # (B, R, N)

        # Block and span are chosen by two independent argmaxes, as in transformers 4.x.
        predicted_block_index = torch.argmax(torch.max(reader_logits, dim=2).values, dim=1)  # (B,)
        predicted_candidate = torch.argmax(torch.max(reader_logits, dim=1).values, dim=1)  # (B,)
        predicted_start = torch.index_select(candidate_starts, dim=0, index=predicted_candidate)  # (B,)
        predicted_end = torch.index_select(candidate_ends, dim=0, index=predicted_candidate)  # (B,)

        total_loss = retriever_loss = reader_loss = retriever_correct = reader_correct = None
        if start_positions is not None and end_positions is not None and has_answers is not None:
            # Gold positions beyond the sequence (truncated answers) can match no span.
            start_positions = start_positions.clamp(-1, seq_len)
            end_positions = end_positions.clamp(-1, seq_len)
            # (B, R, A, 1) vs (N,) -> any over answers -> (B, R, N); the -1 padding matches nothing.
            reader_correct = torch.any(
                torch.logical_and(
                    torch.eq(candidate_starts, start_positions[:, :num_read, :, None]),
                    torch.eq(candidate_ends, end_positions[:, :num_read, :, None]),
                ),
                dim=2,
            )
            retriever_correct = has_answers
            retriever_loss = marginal_log_loss(relevance_score, retriever_correct)  # (B,)
            retriever_loss = retriever_loss * torch.any(retriever_correct, dim=-1).type(retriever_loss.dtype)
            reader_loss = marginal_log_loss(reader_logits.view(batch_size, -1), reader_correct.view(batch_size, -1))
            reader_loss = reader_loss * torch.any(reader_correct.view(batch_size, -1), dim=-1).type(reader_loss.dtype)
            total_loss = (retriever_loss + reader_loss).mean()

        if not batched:
            predicted_block_index, predicted_candidate = predicted_block_index[0], predicted_candidate[0]
            if total_loss is not None:
                retriever_loss, reader_loss = retriever_loss[0], reader_loss[0]
                retriever_correct, reader_correct = retriever_correct[0], reader_correct[0]
        output = RealmReaderOutput(
            loss=total_loss,
            retriever_loss=retriever_loss,
            reader_loss=reader_loss,
            retriever_correct=retriever_correct,
            reader_correct=reader_correct,
            block_idx=predicted_block_index,
            candidate=predicted_candidate,
            start_pos=predicted_start,
            end_pos=predicted_end,
            hidden_states=realm_outputs.hidden_states,
            attentions=realm_outputs.attentions,
        )
        return self._return(output, return_dict)

    def _span_logits(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.FloatTensor | None,
        token_type_ids: torch.LongTensor,
        position_ids: torch.LongTensor | None,
        inputs_embeds: torch.FloatTensor | None,
        relevance_score: torch.FloatTensor,
        block_mask: torch.BoolTensor,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ):
        """The logit of every span candidate of every block read, from checked `(B, R, L)` inputs.

        Returns `(reader_logits (B, R, N), candidate_starts (N,), candidate_ends (N,), encoder outputs)`. A span's
        logit is its reader logit plus its block's retrieval logit, and spans outside the evidence hold the most
        negative float.
        """
        reference = input_ids if input_ids is not None else inputs_embeds[..., 0]
        batch_size, num_read, seq_len = block_mask.shape[0], reference.shape[-2], reference.shape[-1]
        flat_ids, flat_mask, flat_token_types, flat_position_ids = _flatten_candidates(
            input_ids, attention_mask, token_type_ids, position_ids
        )
        flat_embeds = inputs_embeds.reshape(-1, *inputs_embeds.shape[-2:]) if inputs_embeds is not None else None
        buckets = None
        if self.max_length_buckets > 1 and flat_embeds is None and flat_position_ids is None and flat_mask is not None:
            if not output_attentions and not output_hidden_states:
                buckets = length_buckets(flat_mask, self.max_length_buckets)
        if buckets is not None:
            # Each bucket of rows is read at its own longest length; padding tokens are masked out of attention, so
            # a row's states equal the padded batch's to rounding. Padding columns come back as zeros (their spans
            # are masked out of the logits either way).
            pieces, order = [], []
            for rows, length in buckets:
                states = self.realm(
                    flat_ids[rows, :length],
                    attention_mask=flat_mask[rows, :length],
                    token_type_ids=flat_token_types[rows, :length],
                    return_dict=True,
                ).last_hidden_state  # (rows, length, H)
                pieces.append(nn.functional.pad(states, (0, 0, 0, seq_len - length)))
                order.append(rows)
            order = torch.cat(order)
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(len(order), device=order.device)
            last_hidden_state = torch.cat(pieces)[inverse]
            realm_outputs = BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=last_hidden_state)
        else:
            realm_outputs = self._encode(
                flat_ids,
                flat_mask,
                flat_token_types,
                flat_position_ids,
                flat_embeds,
                output_attentions,
                output_hidden_states,
            )
        sequence_output = realm_outputs.last_hidden_state.view(batch_size, num_read, seq_len, -1)  # (B, R, L, H)

        reader_logits, candidate_starts, candidate_ends = self.qa_outputs(
            sequence_output, block_mask[:, :num_read]
        )  # (B, R, N)
        # The retriever's logit joins each block's span logits: p(span, block) ~ p(block) p(span | block). In fp32
        # (under bf16 autocast the projection's output is bf16): the losses and argmaxes read these logits.
        if reader_logits.dtype != relevance_score.dtype:
            reader_logits = reader_logits.float()
            relevance_score = relevance_score.float()
        reader_logits = reader_logits + relevance_score[:, :num_read].unsqueeze(-1)
        return reader_logits, candidate_starts, candidate_ends, realm_outputs

    def _encode(self, flat_ids, flat_mask, flat_token_types, flat_position_ids, flat_embeds, output_attentions,
                output_hidden_states):  # fmt: skip
        return self.realm(
            flat_ids,
            attention_mask=flat_mask,
            token_type_ids=flat_token_types,
            position_ids=flat_position_ids,
            inputs_embeds=flat_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )


class RealmForOpenQA(RealmPreTrainedModel):
    r"""
    End-to-end open-domain QA: embed the question, retrieve blocks by maximum inner product against `block_emb`,
    read the best `reader_beam_size` of them, and return the predicted answer span.

    Args:
        config (`RealmConfig`): the model configuration.
        retriever (`RealmRetriever`, *optional*): turns retrieved block ids into reader inputs and answer labels. It is
            not part of the checkpoint; pass it as `from_pretrained(path, retriever=...)`.
        searcher (*optional*): searches the block embeddings instead of `block_emb`: any object with
            `search(query_embeddings, k) -> (scores, ids)`, `embeddings(ids) -> (..., D)` and `num_blocks`, such as
            `realm_hf.retrieval.ExactSearcher` or `FaissSearcher`.

    `block_emb` is a persistent fp32 buffer of shape `(num_block_records, retriever_proj_size)`: the pre-computed
    block embeddings. It never receives gradients; only the question embedder and the reader train.
    """

    # With store_block_emb=False a checkpoint's block_emb is not loaded (not even read from disk).
    _keys_to_ignore_on_load_unexpected = [r"^ignored\.", r"^block_emb$"]
    # Heads kept for 4.x key compatibility that no forward pass uses (see `unused_head_keys`): a checkpoint may leave
    # them out, e.g. to ship the model smaller.
    _keys_to_ignore_on_load_missing = [r"^embedder\.cls\.predictions\.", r"^reader\.cls\."]
    # Tied to `cls.predictions.bias`, so a save leaves them out already; naming them lets the Trainer re-tie them when
    # it loads the best checkpoint instead of warning "There were missing keys in the checkpoint model loaded".
    _keys_to_ignore_on_save = ["embedder.cls.predictions.decoder.bias", "reader.cls.predictions.decoder.bias"]

    def __init__(self, config: RealmConfig, retriever=None, searcher=None):
        super().__init__(config)
        self.embedder = RealmEmbedder(config)
        self.reader = RealmReader(config)
        if config.store_block_emb:
            self.register_buffer(
                "block_emb",
                torch.empty(config.num_block_records, config.retriever_proj_size, dtype=torch.float32, device="cpu"),
            )
        else:
            # The embeddings live in `searcher`; an empty, unsaved buffer keeps `block_emb` meaning "in the model".
            self.register_buffer("block_emb", torch.empty(0, config.retriever_proj_size), persistent=False)
        self.retriever = retriever
        self.searcher = searcher
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, retriever=None, searcher=None, **kwargs):
        r"""
        `PreTrainedModel.from_pretrained`, plus:

        Args:
            retriever (`RealmRetriever`, *optional*): attached after loading (Transformers deep-copies keyword
                arguments, which would copy a whole corpus).
            searcher (*optional*): an external maximum-inner-product searcher over the block embeddings, e.g.
                `realm_hf.retrieval.ExactSearcher.from_index(dir)`. The checkpoint's `block_emb` is then skipped
                (never read from disk) and the model stays small.
        """
        if searcher is not None:
            kwargs["store_block_emb"] = False
        model = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        loaded = model[0] if isinstance(model, tuple) else model
        loaded.retriever = retriever
        loaded.searcher = searcher
        return model

    def unused_head_keys(self) -> list[str]:
        """State-dict keys of the language-model heads that `RealmForOpenQA` never uses (`embedder.cls.predictions.*`,
        `reader.cls.*`; about 23M parameters with a BERT vocabulary). `save_pretrained(dir, state_dict={k: v for k, v
        in model.state_dict().items() if k not in model.unused_head_keys()})` writes a smaller checkpoint that loads
        without warnings (the heads are then freshly initialised). The heads' output biases (tied, one vocabulary-sized
        vector each) stay, so that Transformers finds the source of that tie."""
        return [
            key
            for key in self.state_dict()
            if key.startswith(("embedder.cls.predictions.", "reader.cls."))
            and not key.endswith(("cls.predictions.bias", "cls.predictions.decoder.bias"))
        ]

    @torch.no_grad()
    def _search(self, question_embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Top `searcher_beam_size` blocks per question: `(block ids (B, K), block embeddings (B, K, D), bias)`. The
        bias `(B, K)` is what a searcher with `search_with_bias` (a `HybridSearcher` with a BM25 weight) adds to the
        relevance of each block; `None` for every other searcher."""
        if self.searcher is not None:
            query = question_embedding.detach().float()
            bias = None
            if hasattr(self.searcher, "search_with_bias"):
                result, bias = self.searcher.search_with_bias(query, self.searcher_beam_size)
                bias = torch.as_tensor(bias, dtype=torch.float32).cpu()
            else:
                result = self.searcher.search(query, self.searcher_beam_size)
            retrieved_block_ids = result.ids.to(torch.long).cpu()
            retrieved_block_emb = torch.as_tensor(self.searcher.embeddings(retrieved_block_ids))
            return retrieved_block_ids, retrieved_block_emb, bias
        # Exact maximum inner-product search over every block, on the device that holds block_emb (as in 4.x). Only
        # the order is needed, so no graph is kept for the (B, num_block_records) score matrix.
        batch_scores = torch.einsum(
            "BD,QD->QB", self.block_emb, question_embedding.to(self.block_emb.device, self.block_emb.dtype)
        )  # (B, num_block_records)
        _, retrieved_block_ids = torch.topk(batch_scores, k=self.searcher_beam_size, dim=-1)  # (B, K)
        return retrieved_block_ids, self.block_emb[retrieved_block_ids], None

    @torch.no_grad()
    def _given_blocks(self, block_ids, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Checks caller-chosen block ids `(B, K)` and looks up their embeddings (for the retrieval logits)."""
        block_ids = torch.as_tensor(block_ids, dtype=torch.long).cpu()
        num_blocks = self.num_searchable_blocks
        if (
            block_ids.dim() != 2
            or block_ids.shape[0] != batch_size
            or block_ids.shape[1] < self.config.reader_beam_size
        ):
            raise ValueError(
                f"retrieved_block_ids must have shape (batch_size={batch_size}, K >= reader_beam_size="
                f"{self.config.reader_beam_size}), got {tuple(block_ids.shape)}."
            )
        if block_ids.min() < 0 or block_ids.max() >= num_blocks:
            raise ValueError(
                f"retrieved_block_ids must lie in [0, {num_blocks}), got {block_ids.min()}..{block_ids.max()}."
            )
        if self.searcher is not None:
            return block_ids, torch.as_tensor(self.searcher.embeddings(block_ids)).float()
        return block_ids, self.block_emb[block_ids.to(self.block_emb.device)]

    @property
    def num_searchable_blocks(self) -> int:
        """Blocks retrieval can return: the searcher's, else the rows of `block_emb`."""
        return self.searcher.num_blocks if self.searcher is not None else self.block_emb.shape[0]

    @property
    def searcher_beam_size(self) -> int:
        """Blocks retrieved per question: `config.searcher_beam_size` in training, `config.reader_beam_size` in eval."""
        return self.config.searcher_beam_size if self.training else self.config.reader_beam_size

    def block_embedding_to(self, device: str | torch.device) -> None:
        """Moves `block_emb` alone, e.g. keep the 6.8 GB buffer on CPU while the encoders run on a GPU."""
        self.block_emb = self.block_emb.to(device)

    def _check_can_answer(self, input_ids) -> None:
        """Raises a clear error unless there are questions `(B, L)`, a retriever and matching block embeddings."""
        if self.retriever is None:
            raise ValueError(
                "RealmForOpenQA needs a retriever to turn block ids into reader inputs: load it with "
                "RealmForOpenQA.from_pretrained(path, retriever=RealmRetriever.from_pretrained(path)) or set "
                "model.retriever."
            )
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be a LongTensor of shape (batch_size, L), got {_tensor_shape(input_ids)}."
            )
        num_blocks = self.num_searchable_blocks
        if num_blocks == 0:
            raise ValueError(
                "this model has no block embeddings: config.store_block_emb is False, so pass the index it searches, "
                "e.g. RealmForOpenQA.from_pretrained(path, searcher=ExactSearcher.from_index(index_dir)), or set "
                "model.searcher."
            )
        if not callable(getattr(self.retriever, "retrieve", None)):
            raise TypeError(
                f"the retriever ({type(self.retriever).__name__}) must turn a batch of block ids into reader inputs: "
                "expected a `retrieve(block_ids, question_input_ids, answer_ids, max_length, num_read)` method (the "
                "realm_hf.retrieval.Retriever protocol), as RealmRetriever and PreTokenizedRetriever have."
            )
        if hasattr(self.retriever, "__len__") and len(self.retriever) != num_blocks:
            source = "the searcher indexes" if self.searcher is not None else "block_emb has"
            raise ValueError(
                f"the retriever holds {len(self.retriever)} block records but {source} {num_blocks} blocks: block ids "
                "would point at the wrong text. Use the records that belong to these embeddings."
            )
        searcher_dim = getattr(self.searcher, "dim", None)
        if searcher_dim is not None and searcher_dim != self.config.retriever_proj_size:
            raise ValueError(
                f"the index holds {searcher_dim}-d block embeddings but this model embeds questions in "
                f"{self.config.retriever_proj_size}-d (config.retriever_proj_size): use the model the index was built with."
            )
        if self.searcher_beam_size > num_blocks:
            raise ValueError(
                f"searcher_beam_size ({self.searcher_beam_size}) exceeds the {num_blocks} blocks that can be retrieved."
            )

    def _retrieve_and_pair(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.FloatTensor | None,
        token_type_ids: torch.LongTensor | None,
        answers_per_question: list,
        min_seq_len: int = 0,
        retrieved_block_ids: torch.LongTensor | None = None,
    ):
        """Embeds the questions, retrieves `K` blocks each and pairs them into reader inputs.

        Returns `(retrieved_block_ids (B, K), retrieved_logits (B, K), reader_inputs, block_mask (B, R, L), labels)`:
        `reader_inputs` holds `input_ids`, `attention_mask`, `token_type_ids` and `special_tokens_mask` `(B, R, L)` of
        `[CLS] question [SEP] block [SEP]` for the R blocks read, on the reader's device, padded to at least
        `min_seq_len` tokens; `block_mask` marks the block's tokens; `labels` is `None` without answers. The retriever
        builds the reader inputs of the whole batch in one call (`retriever.retrieve`, see
        `realm_hf.retrieval.Retriever`).
        """
        batch_size = input_ids.shape[0]
        question_embedding = self.embedder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).projected_score  # (B, D)

        bias = None
        if retrieved_block_ids is None:
            retrieved_block_ids, retrieved_block_emb, bias = self._search(question_embedding)  # (B, K), (B, K, D)
        else:
            retrieved_block_ids, retrieved_block_emb = self._given_blocks(retrieved_block_ids, batch_size)

        reader_device = self.reader.device
        with_answers = answers_per_question[0] is not None
        has_answers, start_positions, end_positions, reader_inputs = self.retriever.retrieve(
            retrieved_block_ids.cpu(),
            input_ids.cpu(),
            answers_per_question if with_answers else None,
            max_length=self.config.reader_seq_len,
            num_read=self.config.reader_beam_size,
        )  # labels (B, K), (B, R, A), (B, R, A); reader inputs (B, R, L)
        pad_values = {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0, "special_tokens_mask": 1}
        reader_inputs = {
            key: _fit_length(
                torch.as_tensor(reader_inputs[key]), max(min_seq_len, reader_inputs[key].shape[-1]), pad
            ).to(reader_device)
            for key, pad in pad_values.items()
        }
        labels = None
        if with_answers:
            labels = {"has_answers": has_answers, "start_positions": start_positions, "end_positions": end_positions}
        block_mask = reader_inputs["special_tokens_mask"].bool().logical_not() & reader_inputs["token_type_ids"].bool()

        # The retrieval logits again, now with gradients to the question embedder (block embeddings stay frozen).
        retrieved_logits = fp32_einsum(
            "bd,bkd->bk", question_embedding, retrieved_block_emb.to(reader_device)
        )  # (B, K), fp32 under autocast too
        if bias is not None:  # the searcher's own evidence (BM25), without gradient
            retrieved_logits = retrieved_logits + bias.to(reader_device)
        return retrieved_block_ids, retrieved_logits, reader_inputs, block_mask, labels

    def forward(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        answer_ids: list | None = None,
        return_dict: bool | None = None,
        retrieved_block_ids: torch.LongTensor | None = None,
    ) -> RealmForOpenQAOutput | tuple:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, L)`): tokenized questions (`[CLS] question [SEP]`), padded.
            attention_mask, token_type_ids (`torch.LongTensor` of shape `(B, L)`, *optional*): for the question encoder.
            answer_ids (*optional*): gold answers as wordpiece ids without special tokens. For one question, a list of
                answers (`list[list[int]]`, as in 4.x); for B questions, a list of B such lists, or a `(B, A, T)`
                LongTensor padded with -1. With answers the output carries the losses.
            retrieved_block_ids (`torch.LongTensor` of shape `(B, K)`, *optional*): read these blocks (best first, K >=
                `reader_beam_size`) instead of searching, e.g. the top blocks of another retriever such as BM25. The
                reader still adds the question-block inner product of the model's own embeddings to span scores.

        Returns:
            `RealmForOpenQAOutput`, or `(reader_output, predicted_answer_ids)` with `return_dict=False`.

        Example:

        ```python
        >>> import realm_hf
        >>> from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer
        >>> retriever = RealmRetriever.from_pretrained("google/realm-orqa-nq-openqa")
        >>> tokenizer = RealmTokenizer.from_pretrained("google/realm-orqa-nq-openqa")
        >>> model = RealmForOpenQA.from_pretrained("google/realm-orqa-nq-openqa", retriever=retriever)
        >>> questions = tokenizer(["Who is the pioneer in modern computer science?"], return_tensors="pt")
        >>> tokenizer.decode(model(**questions).predicted_answer_ids)
        'alan mathison turing'
        ```
        """
        self._check_can_answer(input_ids)
        batch_size = input_ids.shape[0]
        answers_per_question = _answers_per_question(answer_ids, batch_size)
        retrieved_block_ids, retrieved_logits, reader_inputs, block_mask, labels = self._retrieve_and_pair(
            input_ids, attention_mask, token_type_ids, answers_per_question, retrieved_block_ids=retrieved_block_ids
        )
        reader_device = self.reader.device
        num_read = self.config.reader_beam_size
        reader_kwargs = {
            "input_ids": reader_inputs["input_ids"][:, :num_read],
            "attention_mask": reader_inputs["attention_mask"][:, :num_read],
            "token_type_ids": reader_inputs["token_type_ids"][:, :num_read],
            "relevance_score": retrieved_logits,
            "block_mask": block_mask,
        }
        if labels is not None:
            reader_kwargs.update({key: value.to(reader_device) for key, value in labels.items()})
        if batch_size == 1:
            # One question: the exact 2-D call and output shapes of transformers 4.x.
            reader_kwargs = {key: value[0] for key, value in reader_kwargs.items()}
        reader_output = self.reader(**reader_kwargs, return_dict=True)

        block_ids = reader_inputs["input_ids"]
        if batch_size == 1:
            predicted_answer_ids = block_ids[0, reader_output.block_idx][
                reader_output.start_pos[0] : reader_output.end_pos[0] + 1
            ]
        else:
            predicted_answer_ids = [
                block_ids[index, reader_output.block_idx[index]][
                    reader_output.start_pos[index] : reader_output.end_pos[index] + 1
                ]
                for index in range(batch_size)
            ]

        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if not return_dict:
            return reader_output, predicted_answer_ids
        return RealmForOpenQAOutput(
            reader_output=reader_output,
            predicted_answer_ids=predicted_answer_ids,
            retrieved_block_ids=retrieved_block_ids,
        )

    def score_spans(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
    ) -> RealmForOpenQASpanScores:
        r"""
        Scores every candidate answer span of every block read, for callers that need more than `forward`'s single
        answer: the `k` best answers, their probabilities, or where they lie in the block text (the "open-qa"
        pipeline). Retrieval and reading are those of `forward`, without labels.

        Args:
            input_ids (`torch.LongTensor` of shape `(B, L)`): tokenized questions (`[CLS] question [SEP]`), padded.
            attention_mask, token_type_ids (`torch.LongTensor` of shape `(B, L)`, *optional*): for the question encoder.

        Returns:
            `RealmForOpenQASpanScores`, always batched (`B >= 1`). The span with the largest `span_logits` is the
            answer `forward` predicts (its two argmaxes, over blocks and over spans, agree unless two different spans
            tie exactly). `softmax(span_logits.view(B, -1))` is the reader's distribution over (block, span) pairs.

        Example:

        ```python
        >>> scores = model.score_spans(**tokenizer(["who wrote hamlet?"], return_tensors="pt"))
        >>> best = scores.span_logits[0].argmax()  # over (R, N), flattened
        >>> block, span = divmod(int(best), scores.span_logits.shape[-1])
        >>> scores.reader_input_ids[0, block, scores.candidate_starts[span] : scores.candidate_ends[span] + 1]
        ```
        """
        self._check_can_answer(input_ids)
        num_read = self.config.reader_beam_size
        # Short questions and blocks can make a reader input shorter than the widest span; padding costs nothing.
        retrieved_block_ids, retrieved_logits, reader_inputs, block_mask, _ = self._retrieve_and_pair(
            input_ids,
            attention_mask,
            token_type_ids,
            [None] * input_ids.shape[0],
            min_seq_len=self.config.max_span_width,
        )
        block_mask = block_mask[:, :num_read]  # (B, R, L)
        span_logits, candidate_starts, candidate_ends, _ = self.reader._span_logits(
            reader_inputs["input_ids"][:, :num_read],
            attention_mask=reader_inputs["attention_mask"][:, :num_read],
            token_type_ids=reader_inputs["token_type_ids"][:, :num_read],
            position_ids=None,
            inputs_embeds=None,
            relevance_score=retrieved_logits,
            block_mask=block_mask,
        )  # (B, R, N)
        return RealmForOpenQASpanScores(
            span_logits=span_logits,
            span_mask=block_mask[..., candidate_starts] & block_mask[..., candidate_ends],
            candidate_starts=candidate_starts,
            candidate_ends=candidate_ends,
            retrieved_block_ids=retrieved_block_ids,
            retrieved_logits=retrieved_logits,
            reader_input_ids=reader_inputs["input_ids"][:, :num_read],
            block_mask=block_mask,
        )


def _answers_per_question(answer_ids, batch_size: int) -> list:
    """Normalises `answer_ids` to one list of answers (each a list of ids) per question, or `[None] * batch_size`."""
    if answer_ids is None:
        return [None] * batch_size
    if isinstance(answer_ids, torch.Tensor) and answer_ids.dim() == 3:
        if answer_ids.shape[0] != batch_size:
            raise ValueError(
                f"answer_ids of shape {tuple(answer_ids.shape)} holds answers for {answer_ids.shape[0]} questions; "
                f"expected {batch_size} (one row per question, padded with -1)."
            )
        # (B, A, T) padded with -1 (as `OpenQACollator` makes them): drop the padding and the all-padding answers.
        return [
            [[token for token in answer if token >= 0] for answer in answers if any(token >= 0 for token in answer)]
            for answers in answer_ids.tolist()
        ]
    if isinstance(answer_ids, torch.Tensor):
        answer_ids = answer_ids.tolist()
    answer_ids = list(answer_ids)

    def depth(value) -> int:
        level = 0
        while isinstance(value, (list, tuple)):
            if len(value) == 0:
                return level + 1
            value = value[0]
            level += 1
        return level

    nesting = depth(answer_ids)
    if nesting == 2 and batch_size == 1:
        return [answer_ids]
    if nesting == 3 and len(answer_ids) == batch_size:
        return [list(answers) for answers in answer_ids]
    raise ValueError(
        f"answer_ids must be a list of answers (each a list of token ids) for one question, or one such list per "
        f"question for a batch of {batch_size}; got {nesting}-level nesting with {len(answer_ids)} entries."
    )


def _fit_length(rows: torch.Tensor, length: int, pad_value: int) -> torch.Tensor:
    """`(..., L0)` rows padded on the right to `(..., length)` (or cut, where only padding columns are cut)."""
    if rows.shape[-1] >= length:
        return rows[..., :length]
    return nn.functional.pad(rows, (0, length - rows.shape[-1]), value=pad_value)


__all__ = [
    "RealmEmbedder",
    "RealmEmbedderOutput",
    "RealmForOpenQA",
    "RealmForOpenQAOutput",
    "RealmForOpenQASpanScores",
    "RealmKnowledgeAugEncoder",
    "RealmPreTrainedModel",
    "RealmReader",
    "RealmReaderOutput",
    "RealmScorer",
    "RealmScorerOutput",
]

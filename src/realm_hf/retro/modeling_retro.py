"""RETRO (Borgeaud et al. 2022): a GPT-2 decoder that reads retrieved neighbours through chunked cross-attention.

Shape legend: B - batch, T - tokens in this call, N - tokens so far (cache included), m - chunk size, L - chunks with
neighbours, k - neighbours per chunk, r - tokens per neighbour (neighbour + continuation, 2m in the paper), D - decoder
width, E - encoder width, H - heads.

How it maps onto the paper:

- The decoder is Transformers' GPT-2 (`GPT2Block`s, learned absolute positions), so a trained `GPT2LMHeadModel` is
  RETRO-fitted by loading its weights unchanged (`RetroForCausalLM.from_base_model`). Layers listed in
  `config.cca_layers` run `FFW(CCA(ATTN(H), E))`; the others run GPT-2's block as is.
- Chunked cross-attention (CCA) is a residual branch, `h + CCA(LN(h), E)`. Without neighbours it is skipped, so a
  RETRO-fitted model with retrieval off computes exactly what its base model computes (bit for bit).
- Causal alignment (paper Listing 1): token `p` attends to the neighbours of chunk `u = (p - (m - 1)) // m`, i.e. the
  last token of chunk `u` and the first `m - 1` tokens of chunk `u + 1` read `RET(C_u)`; tokens `0 .. m - 2` read
  nothing. `RET(C_u)` depends only on chunk `u`, which is complete at its last token, so the model stays
  autoregressive.
- The neighbour encoder is bidirectional over each neighbour's `r` tokens and cross-attends to the decoder states of
  the chunk that retrieved it (the inputs of the first CCA layer, `H_u` in Algorithm 1), in every encoder layer.
- Relative positions: rotary position encodings inside CCA and the encoder. In CCA the query at offset `i` of an
  attending chunk sits at position `m - 1 + i` and neighbour token `j` at position `j`, so the rotary phase depends on
  `i - j + m - 1`, the paper's CCA distance `d(i, i')`; the encoder's cross-attention gets `i' - i`, the paper's
  `d_enc`. The encoder's self-attention adds the paper's learned relative-position logits too (bucketed, one per head
  and bucket, zero at first): with rotary alone a small model learned to read neighbours shifted against their chunk
  in one of four runs, with them in three (docs/retro.md).
- Generation keeps a `RetroCache`: GPT-2's self-attention KV cache, the encoded neighbours of every finished chunk, and
  the first-CCA-layer states of the unfinished chunk (needed to encode its neighbours once it is complete).
- Left padding (an `attention_mask` with leading zeros): each row's chunks and positions count from its first real
  token, so CCA aligns every row on its own chunk boundaries, the encoder reads each row's own chunk states and the
  cache keeps per-row neighbours; `generate()` retrieves for the rows that complete a chunk at each step.
"""

import dataclasses
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config
from transformers import initialization as init
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.models.gpt2.modeling_gpt2 import GPT2Block, GPT2PreTrainedModel
from transformers.utils import ModelOutput, logging

from .configuration_retro import RetroConfig

# transformers 5.24 renamed `past_key_values` to `cache`: in attention and mask signatures (the old keyword warns until
# 5.40) and in model outputs (a `past_key_values=` keyword is rewritten to `cache=`). The cache keyword passed to
# transformers' code is the installed version's; RETRO's outputs name the field `cache` on every version.
CACHE_KWARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"

logger = logging.get_logger(__name__)


# ------------------------------------------------------------------------------------------------------ building blocks


def apply_rotary(states: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotates `states` `(..., T, head_dim)` by the angles of `positions` `(T,)` (rotary position encoding, the
    rotate-half layout): the dot product of a rotated query and key then depends on their position difference only."""
    head_dim = states.shape[-1]
    inverse_frequency = base ** (-torch.arange(0, head_dim, 2, device=states.device, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inverse_frequency[None, :]  # (T, head_dim / 2)
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(states.dtype), angles.sin().to(states.dtype)
    first, second = states.chunk(2, dim=-1)
    return states * cos + torch.cat((-second, first), dim=-1) * sin


class _ZeroInitLinear(nn.Linear):
    """A linear layer initialised to zero (CCA's output projection: a fresh CCA branch adds nothing at first)."""


class RetroAttention(nn.Module):
    """Multi-head attention with rotary relative positions for CCA and the neighbour encoder. Queries and keys may
    have different widths (decoder vs encoder); the output has the queries' width."""

    def __init__(self, query_size: int, key_value_size: int, num_heads: int, rotary_base: float, dropout: float,
                 zero_init_output: bool = False):  # fmt: skip
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = query_size // num_heads
        self.rotary_base = rotary_base
        self.dropout = dropout
        self.query = nn.Linear(query_size, query_size)
        self.key = nn.Linear(key_value_size, query_size)
        self.value = nn.Linear(key_value_size, query_size)
        self.output = (_ZeroInitLinear if zero_init_output else nn.Linear)(query_size, query_size)

    def _heads(self, states: torch.Tensor) -> torch.Tensor:
        return states.view(*states.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)  # (batch, H, T, hd)

    def forward(
        self,
        queries: torch.Tensor,
        keys_values: torch.Tensor,
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        position_logits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        r"""
        Args:
            queries (`torch.Tensor` of shape `(batch, Tq, query_size)`), keys_values (`(batch, Tk, key_value_size)`).
            query_positions (`torch.LongTensor` of shape `(Tq,)`), key_positions (`(Tk,)`): rotary positions.
            key_mask (`torch.BoolTensor` of shape `(batch, Tk)`, *optional*): `True` for keys that may be attended.
                Queries with no attendable key get a zero output instead of a softmax over nothing.
            position_logits (`torch.Tensor` of shape `(num_heads, Tq, Tk)`, *optional*): added to the scores.

        Returns:
            `torch.Tensor` of shape `(batch, Tq, query_size)`.
        """
        query = apply_rotary(self._heads(self.query(queries)), query_positions, self.rotary_base)
        key = apply_rotary(self._heads(self.key(keys_values)), key_positions, self.rotary_base)
        value = self._heads(self.value(keys_values))
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_dim)  # (batch, H, Tq, Tk)
        if position_logits is not None:
            scores = scores + position_logits.to(scores.dtype)
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        probabilities = F.dropout(scores.softmax(dim=-1), p=self.dropout, training=self.training)
        attended = torch.matmul(probabilities, value)  # (batch, H, Tq, hd)
        if key_mask is not None:
            # A fully padded neighbour set (e.g. no neighbour found) must read as "nothing retrieved", not as an
            # average of padding.
            attended = attended * key_mask.any(dim=-1).to(attended.dtype)[:, None, None, None]
        attended = attended.transpose(1, 2).reshape(*queries.shape[:-1], -1)
        return self.output(attended)


def relative_position_bucket(offsets: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bucket of each key-minus-query offset: half the buckets for each direction; within a direction, offsets under
    a quarter of the buckets get one bucket each, longer ones log-spaced buckets up to `max_distance` (and beyond it
    the last one)."""
    half = num_buckets // 2
    direction = (offsets > 0).long() * half
    distance = offsets.abs()
    exact = max(1, half // 2)
    spread = math.log(max(max_distance, exact + 1) / exact)
    far = exact + (torch.log(distance.clamp(min=1).float() / exact) / spread * (half - exact)).long()
    bucket = torch.where(distance < exact, distance, far.clamp(max=half - 1))
    return direction + bucket


class RelativePositionLogits(nn.Module):
    """Learned logits per head and relative-position bucket (the paper's relative encoding), zero at first."""

    def __init__(self, num_heads: int, num_buckets: int, max_distance: int):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.weight = nn.Parameter(torch.zeros(num_heads, num_buckets))

    def forward(self, length: int) -> torch.Tensor:
        """`(num_heads, length, length)` logits for queries and keys at positions `0 .. length - 1`."""
        positions = torch.arange(length, device=self.weight.device)
        buckets = relative_position_bucket(
            positions[None, :] - positions[:, None], self.num_buckets, self.max_distance
        )
        return self.weight[:, buckets]


class RetroFeedForward(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, dropout: float):
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)
        self.down = nn.Linear(intermediate_size, hidden_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(F.gelu(self.up(hidden_states))))


class RetroEncoderLayer(nn.Module):
    """Pre-norm encoder layer: bidirectional self-attention over one neighbour, cross-attention to the states of the
    chunk that retrieved it (query conditioning), feed-forward."""

    def __init__(self, config: RetroConfig):
        super().__init__()
        width, dropout = config.encoder_hidden_size, config.attn_pdrop
        self.self_attention_norm = nn.LayerNorm(width, eps=config.layer_norm_epsilon)
        self.self_attention = RetroAttention(width, width, config.encoder_num_heads, config.rotary_base, dropout)
        self.relative_positions = (
            RelativePositionLogits(
                config.encoder_num_heads,
                config.encoder_relative_position_buckets,
                config.encoder_relative_position_max_distance,
            )
            if config.encoder_relative_position_buckets
            else None
        )
        self.cross_attention_norm = nn.LayerNorm(width, eps=config.layer_norm_epsilon)
        self.cross_attention = RetroAttention(width, config.n_embd, config.encoder_num_heads, config.rotary_base,
                                              dropout)  # fmt: skip
        self.feed_forward_norm = nn.LayerNorm(width, eps=config.layer_norm_epsilon)
        self.feed_forward = RetroFeedForward(width, config.encoder_ffn_size, config.resid_pdrop)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states, neighbour_mask, chunk_states):
        # hidden_states (n, r, E); neighbour_mask (n, r) bool; chunk_states (n, m, D), with n = B * L * k
        neighbour_positions = torch.arange(hidden_states.shape[1], device=hidden_states.device)
        chunk_positions = torch.arange(chunk_states.shape[1], device=hidden_states.device)
        position_logits = (
            self.relative_positions(hidden_states.shape[1]) if self.relative_positions is not None else None
        )
        normed = self.self_attention_norm(hidden_states)
        hidden_states = hidden_states + self.dropout(
            self.self_attention(
                normed, normed, neighbour_positions, neighbour_positions, neighbour_mask, position_logits
            )
        )
        normed = self.cross_attention_norm(hidden_states)
        hidden_states = hidden_states + self.dropout(
            self.cross_attention(normed, chunk_states, neighbour_positions, chunk_positions)
        )
        return hidden_states + self.feed_forward(self.feed_forward_norm(hidden_states))


class RetroEncoder(nn.Module):
    """Encodes every neighbour `RET(C_u)^j` conditioned on chunk `u`'s decoder states: `E_u^j = Encoder(RET(C_u)^j,
    H_u)`. It has its own token embedding (the paper's default: encoder and decoder widths differ)."""

    def __init__(self, config: RetroConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.encoder_hidden_size)
        self.dropout = nn.Dropout(config.embd_pdrop)
        self.layers = nn.ModuleList([RetroEncoderLayer(config) for _ in range(config.encoder_num_layers)])
        self.final_norm = nn.LayerNorm(config.encoder_hidden_size, eps=config.layer_norm_epsilon)

    def forward(self, neighbour_input_ids, neighbour_mask, chunk_states):
        r"""
        Args:
            neighbour_input_ids (`torch.LongTensor` of shape `(B, L, k, r)`), neighbour_mask (`(B, L, k, r)` bool).
            chunk_states (`torch.Tensor` of shape `(B, L, m, D)`): decoder states of the chunks that retrieved them.

        Returns:
            `torch.Tensor` of shape `(B, L, k, r, E)`.
        """
        batch, num_chunks, num_neighbours, neighbour_length = neighbour_input_ids.shape
        flat_ids = neighbour_input_ids.reshape(-1, neighbour_length)  # (B * L * k, r)
        flat_mask = neighbour_mask.reshape(-1, neighbour_length)
        # Every neighbour of a chunk is conditioned on the same chunk states.
        flat_chunk_states = chunk_states[:, :, None].expand(-1, -1, num_neighbours, -1, -1)
        flat_chunk_states = flat_chunk_states.reshape(-1, *chunk_states.shape[2:])  # (B * L * k, m, D)
        hidden_states = self.dropout(self.embed_tokens(flat_ids))  # (B * L * k, r, E)
        for layer in self.layers:
            hidden_states = layer(hidden_states, flat_mask, flat_chunk_states)
        hidden_states = self.final_norm(hidden_states)
        return hidden_states.view(batch, num_chunks, num_neighbours, neighbour_length, -1)


class RetroChunkedCrossAttention(nn.Module):
    """Chunked cross-attention with the paper's causal alignment (shift of `m - 1` tokens), for any number of tokens
    already seen and any left padding, per row, so that the full forward, cached generation and batches of prompts of
    different lengths use the same code."""

    def __init__(self, config: RetroConfig):
        super().__init__()
        self.chunk_size = config.chunk_size
        self.layer_norm = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attention = RetroAttention(config.n_embd, config.encoder_hidden_size, config.num_cca_heads,
                                        config.rotary_base, config.attn_pdrop, zero_init_output=True)  # fmt: skip
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states, encoded_neighbours, neighbour_mask, first_positions: torch.Tensor):
        r"""
        Args:
            hidden_states (`torch.Tensor` of shape `(B, T, D)`): decoder states; in row `b` they sit at positions
                `first_positions[b] .. first_positions[b] + T - 1` counted from the row's first real token (negative
                positions are left padding).
            encoded_neighbours (`torch.Tensor` of shape `(B, L, k, r, E)`), neighbour_mask (`(B, L, k, r)` bool):
                encoded neighbours of each row's chunks `0 .. L - 1` (chunks counted from the row's first real token);
                `L` covers every chunk some position here attends to.
            first_positions (`torch.LongTensor` of shape `(B,)`).

        Returns:
            `torch.Tensor` of shape `(B, T, D)`: the residual update, zero for positions before `m - 1` (and padding).
        """
        m = self.chunk_size
        batch, length, width = hidden_states.shape
        device = hidden_states.device
        output = hidden_states.new_zeros(batch, length, width)
        # Shifted position s = p - (m - 1): token p reads chunk s // m, at offset s % m of that chunk's attending span.
        shifted = first_positions.to(device)[:, None] + torch.arange(length, device=device) - (m - 1)  # (B, T)
        attending = shifted >= 0
        if not bool(attending.any()):
            return output
        chunk = torch.div(shifted, m, rounding_mode="floor")
        first_chunk = torch.where(attending, chunk, torch.full_like(chunk, torch.iinfo(chunk.dtype).max)).amin(dim=1)
        last_chunk = torch.where(attending, chunk, torch.full_like(chunk, -1)).amax(dim=1)
        # Rows that read nothing here get chunk 0 (their slots stay unused).
        first_chunk = torch.where(last_chunk >= 0, first_chunk, torch.zeros_like(first_chunk))
        num_chunks = int((last_chunk - first_chunk).amax()) + 1
        if int(last_chunk.amax()) >= encoded_neighbours.shape[1]:
            raise ValueError(
                f"a position needs the neighbours of chunk {int(last_chunk.amax())}, but only "
                f"{encoded_neighbours.shape[1]} chunks have encoded neighbours."
            )
        # Lay each row's attending tokens out as whole attending chunks starting at its own first chunk (the slots of
        # other tokens stay zero; queries are independent, so those slots change nothing).
        slot = (chunk - first_chunk[:, None]) * m + shifted.remainder(m)  # (B, T)
        rows, columns = attending.nonzero(as_tuple=True)
        normed = self.layer_norm(hidden_states[rows, columns])  # (attending tokens, D)
        padded = hidden_states.new_zeros(batch, num_chunks * m, width)
        padded[rows, slot[rows, columns]] = normed
        padded = padded.view(batch * num_chunks, m, width)  # (B * chunks, m, D)
        chunk_index = (first_chunk[:, None] + torch.arange(num_chunks, device=device)).clamp(
            max=encoded_neighbours.shape[1] - 1
        )  # (B, chunks); indices past a row's last attended chunk only feed unused slots
        row_index = torch.arange(batch, device=device)[:, None]
        keys = encoded_neighbours[row_index, chunk_index]  # (B, chunks, k, r, E)
        num_neighbours, neighbour_length = keys.shape[2], keys.shape[3]
        keys = keys.reshape(batch * num_chunks, num_neighbours * neighbour_length, -1)  # (B * chunks, k * r, E)
        key_mask = neighbour_mask[row_index, chunk_index].reshape(batch * num_chunks, -1)
        query_positions = torch.arange(m, device=device) + (m - 1)
        key_positions = torch.arange(neighbour_length, device=device).repeat(num_neighbours)
        attended = self.attention(padded, keys, query_positions, key_positions, key_mask)
        attended = self.dropout(attended).view(batch, num_chunks * m, width)
        output[rows, columns] = attended[rows, slot[rows, columns]]
        return output


class RetroDecoderLayer(GPT2Block):
    """GPT-2's block, with chunked cross-attention between self-attention and the MLP in the layers of
    `config.cca_layers`. Without neighbours it is exactly `GPT2Block.forward`."""

    def __init__(self, config: RetroConfig, layer_idx: int):
        super().__init__(config, layer_idx=layer_idx)
        self.cca = RetroChunkedCrossAttention(config) if layer_idx in config.cca_layers else None

    def forward(self, hidden_states, past_key_values=None, attention_mask=None, use_cache=False,
                encoded_neighbours=None, neighbour_mask=None, first_positions=None, **kwargs):  # fmt: skip
        if self.cca is None or encoded_neighbours is None:
            return super().forward(hidden_states, past_key_values, attention_mask, use_cache=use_cache, **kwargs)
        residual = hidden_states
        attention_output, _ = self.attn(self.ln_1(hidden_states), attention_mask=attention_mask, use_cache=use_cache,
                                        **{CACHE_KWARG: past_key_values}, **kwargs)  # fmt: skip
        hidden_states = attention_output + residual
        hidden_states = hidden_states + self.cca(hidden_states, encoded_neighbours, neighbour_mask, first_positions)
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class RetroCache:
    """What cached generation reuses: GPT-2's self-attention KV cache, the encoded neighbours of every chunk retrieved
    so far (per row: with left padding, rows complete their chunks at different steps), and the first-CCA-layer states
    from the first position whose chunk some row has not encoded yet.

    A cache is bound to retrieval on or off by its first forward; mixing the two raises.
    """

    def __init__(self, config: RetroConfig):
        self.self_attention_cache = DynamicCache(config=config)
        self.encoded_neighbours: torch.Tensor | None = None  # (B, L, k, r, E), L = the most chunks of a row
        self.neighbour_mask: torch.Tensor | None = None  # (B, L, k, r) bool; False past a row's encoded chunks
        self.encoded_chunks: torch.Tensor | None = None  # (B,) chunks encoded per row
        self.pending_chunk_states: torch.Tensor | None = None  # (B, N - pending_start, D)
        self.pending_start: int = 0  # padded position of pending_chunk_states[:, 0]
        self.retrieval: bool | None = None

    def get_seq_length(self) -> int:
        return self.self_attention_cache.get_seq_length()

    @property
    def num_encoded_chunks(self) -> int:
        """The most chunks any row has encoded neighbours for."""
        return 0 if self.encoded_chunks is None or self.encoded_chunks.numel() == 0 else int(self.encoded_chunks.max())


# ------------------------------------------------------------------------------------------------- pretrained model


class RetroPreTrainedModel(GPT2PreTrainedModel):
    """Loads and initialises RETRO models; GPT-2's initialisation for the decoder, zero output projections for CCA."""

    config_class = RetroConfig
    config: RetroConfig
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = False
    _no_split_modules = ["RetroDecoderLayer", "RetroEncoderLayer"]
    _can_record_outputs = {}
    _can_compile_fullgraph = False
    # Models saved before the encoder had relative-position logits load with them at zero: the same outputs.
    _keys_to_ignore_on_load_missing = [r"relative_positions\.weight"]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, _ZeroInitLinear):
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, RelativePositionLogits):
            init.zeros_(module.weight)


# -------------------------------------------------------------------------------------------------------- outputs


@dataclass
class RetroModelOutput(ModelOutput):
    r"""
    Args:
        last_hidden_state (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`): decoder output.
        cache (`RetroCache`, *optional*): returned with `use_cache=True`; also readable as `past_key_values`.
    """

    last_hidden_state: torch.FloatTensor | None = None
    cache: RetroCache | None = None

    @property
    def past_key_values(self) -> RetroCache | None:
        """The cache under its name before transformers 5.24."""
        return self.cache


@dataclass
class RetroCausalLMOutput(ModelOutput):
    r"""
    Args:
        loss (`torch.FloatTensor` of shape `(1,)`, *optional*): mean next-token cross-entropy, with `labels`.
        logits (`torch.FloatTensor` of shape `(batch_size, sequence_length, vocab_size)`): next-token logits.
        cache (`RetroCache`, *optional*): returned with `use_cache=True`; also readable as `past_key_values`.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    cache: RetroCache | None = None

    @property
    def past_key_values(self) -> RetroCache | None:
        """The cache under its name before transformers 5.24."""
        return self.cache


# ---------------------------------------------------------------------------------------------------- public models


def _leading_padding(attention_mask: torch.Tensor, batch: int, total_length: int) -> torch.Tensor:
    """`(B,)`: the zeros before each row's first 1 in `attention_mask` (left padding), which shift its chunks."""
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, total_length):
        raise ValueError(
            f"attention_mask must have shape (batch_size, past + new tokens) = {(batch, total_length)}, got "
            f"{tuple(attention_mask.shape)}."
        )
    real = attention_mask.bool()
    if not bool(real.any(dim=1).all()):
        raise ValueError("attention_mask has a row without any token (all zeros); every sequence needs a token.")
    return real.int().argmax(dim=1).long()


def _check_neighbours(neighbour_input_ids, neighbour_attention_mask, batch: int, lengths: torch.Tensor,
                      chunk_size: int):  # fmt: skip
    """Raises a `ValueError` naming the expected and received shapes when neighbours do not fit the sequences (of
    `lengths` real tokens per row)."""
    if not isinstance(neighbour_input_ids, torch.Tensor) or neighbour_input_ids.dim() != 4:
        shape = tuple(neighbour_input_ids.shape) if isinstance(neighbour_input_ids, torch.Tensor) else None
        raise ValueError(
            "neighbour_input_ids must be a 4-D tensor (batch, num_chunks, num_neighbours, neighbour_length), got "
            f"{shape if shape is not None else type(neighbour_input_ids).__name__}."
        )
    if neighbour_input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"neighbour_input_ids must hold token ids (int64 or int32), got {neighbour_input_ids.dtype}.")
    num_batch, num_chunks, num_neighbours, neighbour_length = neighbour_input_ids.shape
    total_length = int(lengths.max())
    complete_chunks, all_chunks = total_length // chunk_size, math.ceil(total_length / chunk_size)
    if num_batch != batch:
        raise ValueError(f"neighbour_input_ids has batch size {num_batch}, but input_ids has batch size {batch}.")
    if not complete_chunks <= num_chunks <= all_chunks:
        raise ValueError(
            f"neighbour_input_ids must give neighbours for the {complete_chunks} complete chunks of chunk_size "
            f"{chunk_size} in {total_length} tokens (the longest row; or for all {all_chunks} chunks), got {num_chunks} "
            "chunks "
            f"(shape {tuple(neighbour_input_ids.shape)})."
        )
    if num_chunks and (num_neighbours < 1 or neighbour_length < 1):
        raise ValueError(f"neighbour_input_ids needs at least one neighbour of at least one token, got shape "
                         f"{tuple(neighbour_input_ids.shape)}.")  # fmt: skip
    if neighbour_attention_mask is not None and neighbour_attention_mask.shape != neighbour_input_ids.shape:
        raise ValueError(
            f"neighbour_attention_mask must have the shape of neighbour_input_ids {tuple(neighbour_input_ids.shape)}, "
            f"got {tuple(neighbour_attention_mask.shape)}."
        )


class RetroModel(RetroPreTrainedModel):
    """The RETRO decoder with its neighbour encoder; state-dict keys of the decoder are `GPT2Model`'s."""

    def __init__(self, config: RetroConfig):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([RetroDecoderLayer(config, layer_idx=index) for index in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.encoder = RetroEncoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.wte

    def set_input_embeddings(self, new_embeddings):
        self.wte = new_embeddings

    def _encode_neighbours(self, chunk_states, neighbour_input_ids, neighbour_mask, cache, past_length, padding):
        """Encodes the neighbours of each row's chunks completed so far that are not encoded yet; returns the encoded
        neighbours `(B, L, k, r, E)` and mask `(B, L, k, r)` of every row's complete chunks (`L` = the most complete
        chunks of a row; a row's missing chunks are masked). Row `b`'s chunk `u` covers padded positions
        `padding[b] + u * m ..`."""
        m = self.config.chunk_size
        batch, length, width = chunk_states.shape
        device = chunk_states.device
        complete = torch.div(past_length + length - padding, m, rounding_mode="floor")  # (B,) complete chunks per row
        encoded_before = torch.zeros_like(complete)
        states_start = past_length
        if cache is not None:
            if cache.encoded_chunks is not None:
                encoded_before = cache.encoded_chunks
            if cache.pending_chunk_states is not None:
                chunk_states = torch.cat((cache.pending_chunk_states, chunk_states), dim=1)
                states_start = cache.pending_start
        # (row, chunk) pairs to encode, row-major: the encoder sees them as one batch of chunks.
        new = complete - encoded_before
        most_new = int(new.max())
        rows, offsets = (torch.arange(max(most_new, 0), device=device)[None, :] < new[:, None]).nonzero(as_tuple=True)
        chunks = encoded_before[rows] + offsets
        num_neighbours, neighbour_length = neighbour_input_ids.shape[2:]
        encoded_new = None
        if rows.numel():
            token_index = (padding[rows] + chunks * m - states_start)[:, None] + torch.arange(m, device=device)
            states_of_new_chunks = chunk_states[rows[:, None], token_index]  # (n, m, D)
            new_ids, new_mask = neighbour_input_ids[rows, chunks], neighbour_mask[rows, chunks]  # (n, k, r)
            encoded_new = self.encoder(new_ids[None], new_mask[None], states_of_new_chunks[None])[0]  # (n, k, r, E)
        num_chunks = int(complete.max())
        if cache is None or cache.encoded_neighbours is None:
            encoded = chunk_states.new_zeros(batch, num_chunks, num_neighbours, neighbour_length,
                                             self.config.encoder_hidden_size)  # fmt: skip
            mask = torch.zeros(batch, num_chunks, num_neighbours, neighbour_length, dtype=torch.bool, device=device)
        else:
            encoded, mask = cache.encoded_neighbours, cache.neighbour_mask
            if rows.numel() and encoded.shape[2:4] != (num_neighbours, neighbour_length):
                raise ValueError(
                    f"neighbours of new chunks have (k, r) = {(num_neighbours, neighbour_length)}, but the cache "
                    f"holds {tuple(encoded.shape[2:4])}."
                )
            if num_chunks > encoded.shape[1]:
                grow = num_chunks - encoded.shape[1]
                encoded = torch.cat((encoded, encoded.new_zeros(batch, grow, *encoded.shape[2:])), dim=1)
                mask = torch.cat((mask, mask.new_zeros(batch, grow, *mask.shape[2:])), dim=1)
        if encoded_new is not None:
            encoded[rows, chunks] = encoded_new.to(encoded.dtype)
            mask[rows, chunks] = new_mask
        if cache is not None:
            cache.encoded_neighbours, cache.neighbour_mask, cache.encoded_chunks = encoded, mask, complete
            # Keep the states from the first position whose chunk is still incomplete in some row.
            keep_from = int((padding + complete * m).min())
            cache.pending_chunk_states = chunk_states[:, keep_from - states_start :]
            cache.pending_start = keep_from
        return encoded, mask

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values: RetroCache | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        neighbour_input_ids: torch.LongTensor | None = None,
        neighbour_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> RetroModelOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, T)`): tokens; with a cache, only the new ones.
            past_key_values (`RetroCache`, *optional*): from a previous call with `use_cache=True`.
            attention_mask (`torch.Tensor` of shape `(B, N)`, *optional*): 1 for tokens, 0 for padding. Left padding
                shifts a row's chunks: they are counted from its first real token, and so are its positions (when
                `position_ids` is not given).
            neighbour_input_ids (`torch.LongTensor` of shape `(B, L, k, r)`, *optional*): `neighbour_input_ids[:, u]`
                holds the `k` neighbours of chunk `u` (each a retrieved chunk followed by its continuation); `L` is the
                number of complete chunks in the `N` tokens so far (or all chunks, the last one's then unused), of the
                row with the most real tokens (rows with fewer chunks pad theirs, which are never read). `None`
                switches retrieval off: no CCA runs at all.
            neighbour_attention_mask (`torch.Tensor` of shape `(B, L, k, r)`, *optional*): 1 for neighbour tokens, 0
                for padding; defaults to `neighbour_input_ids != config.pad_token_id`.
            use_cache (`bool`, *optional*, defaults to `False`): return a `RetroCache` for incremental decoding.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds.")
        if input_ids is not None and input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch_size, sequence_length), got {tuple(input_ids.shape)}.")
        inputs_embeds = self.wte(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = inputs_embeds.shape[:2]
        if past_key_values is not None and not isinstance(past_key_values, RetroCache):
            raise ValueError(f"past_key_values must be a RetroCache, got {type(past_key_values).__name__}.")
        if use_cache and past_key_values is None:
            past_key_values = RetroCache(self.config)
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        if past_length + length > self.config.n_positions:
            raise ValueError(f"{past_length + length} tokens exceed n_positions ({self.config.n_positions}).")

        total_length = past_length + length
        if attention_mask is not None:
            attention_mask = attention_mask.to(inputs_embeds.device)
            padding = _leading_padding(attention_mask, batch, total_length)
        else:
            padding = torch.zeros(batch, dtype=torch.long, device=inputs_embeds.device)
        retrieval = neighbour_input_ids is not None
        if past_key_values is not None:
            if past_key_values.retrieval is not None and past_key_values.retrieval != retrieval:
                raise ValueError(
                    f"this RetroCache was built with retrieval {'on' if past_key_values.retrieval else 'off'}; pass "
                    f"neighbour_input_ids {'for every call' if past_key_values.retrieval else 'never'}."
                )
            past_key_values.retrieval = retrieval
        if retrieval:
            _check_neighbours(neighbour_input_ids, neighbour_attention_mask, batch, total_length - padding,
                              self.config.chunk_size)  # fmt: skip
            if neighbour_attention_mask is None:
                neighbour_mask = neighbour_input_ids != self.config.pad_token_id
            else:
                neighbour_mask = neighbour_attention_mask.bool()

        if position_ids is None and attention_mask is not None:
            position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)[:, past_length:]
        elif position_ids is None:
            position_ids = (torch.arange(length, device=inputs_embeds.device) + past_length).unsqueeze(0)
        hidden_states = inputs_embeds + self.wpe(position_ids).to(inputs_embeds.device)
        self_attention_cache = past_key_values.self_attention_cache if past_key_values is not None else None
        causal_mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                         position_ids=position_ids, **{CACHE_KWARG: self_attention_cache})  # fmt: skip
        hidden_states = self.drop(hidden_states)

        encoded_neighbours = encoded_mask = None
        for index, layer in enumerate(self.h):
            if retrieval and index == self.config.cca_layers[0]:
                # The encoder is conditioned on the inputs of the first CCA layer (H at layer min(P), Algorithm 1).
                encoded_neighbours, encoded_mask = self._encode_neighbours(
                    hidden_states, neighbour_input_ids, neighbour_mask, past_key_values, past_length, padding
                )
            hidden_states = layer(hidden_states, self_attention_cache, causal_mask, use_cache=use_cache,
                                  encoded_neighbours=encoded_neighbours, neighbour_mask=encoded_mask,
                                  first_positions=past_length - padding, position_ids=position_ids,
                                  **kwargs)  # fmt: skip
        hidden_states = self.ln_f(hidden_states)
        return RetroModelOutput(last_hidden_state=hidden_states, cache=past_key_values if use_cache else None)


class RetroForCausalLM(RetroPreTrainedModel):
    """RETRO with GPT-2's language-modelling head (tied to the token embeddings by default)."""

    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: RetroConfig):
        super().__init__(config)
        self.transformer = RetroModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    # ------------------------------------------------------------------------------------------------ RETRO-fitting

    @classmethod
    def from_base_model(
        cls, base_model, *, encoder_embeddings_from_base: bool = False, **retro_config
    ) -> "RetroForCausalLM":
        r"""
        RETRO-fits a trained `GPT2LMHeadModel`: copies its config and weights, adds freshly initialised CCA layers and
        neighbour encoder, and freezes every base weight (`freeze_base_model`). With retrieval off the result computes
        exactly what `base_model` computes.

        Args:
            base_model (`GPT2LMHeadModel`): the base decoder (its config may not use cross-attention).
            encoder_embeddings_from_base (`bool`, *optional*, defaults to `False`): start the neighbour encoder's token
                embeddings as a copy of the base's (trained, and tied to its output layer) instead of at random, so
                that a neighbour's tokens enter the encoder as the vectors the decoder predicts with (they stay
                trainable). Needs `encoder_hidden_size == n_embd`.
            retro_config: `RetroConfig` fields to set (`chunk_size`, `cca_layers`, `encoder_hidden_size`, ...).
        """
        gpt2_fields = {field.name for field in dataclasses.fields(GPT2Config)}
        base_fields = {key: value for key, value in base_model.config.to_dict().items() if key in gpt2_fields}
        config = RetroConfig(**{**base_fields, **retro_config})
        config._attn_implementation = base_model.config._attn_implementation
        model = cls(config).to(dtype=base_model.dtype, device=base_model.device)
        missing, unexpected = model.load_state_dict(base_model.state_dict(), strict=False)
        unexpected = [key for key in unexpected if not key.endswith("attn.bias")]
        not_retro = [key for key in missing if not model.is_retro_parameter(key)]
        if unexpected or not_retro:
            raise ValueError(f"base model weights do not fit a RETRO decoder: unexpected {unexpected}, "
                             f"missing {not_retro}.")  # fmt: skip
        if encoder_embeddings_from_base:
            if config.encoder_hidden_size != config.n_embd:
                raise ValueError(f"encoder_embeddings_from_base needs encoder_hidden_size ({config.encoder_hidden_size}) "
                                 f"equal to the base's n_embd ({config.n_embd}).")  # fmt: skip
            with torch.no_grad():
                model.transformer.encoder.embed_tokens.weight.copy_(model.transformer.wte.weight)
        model.freeze_base_model()
        return model

    @staticmethod
    def is_retro_parameter(name: str) -> bool:
        """Whether a parameter belongs to what RETRO adds to a decoder (the neighbour encoder and CCA layers)."""
        return name.startswith("transformer.encoder.") or ".cca." in name

    def freeze_base_model(self) -> int:
        """Freezes everything except the neighbour encoder and CCA layers; returns the number of trainable
        parameters left."""
        for name, parameter in self.named_parameters():
            parameter.requires_grad_(self.is_retro_parameter(name))
        return sum(parameter.numel() for parameter in self.parameters() if parameter.requires_grad)

    # ------------------------------------------------------------------------------------------------------ forward

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values: RetroCache | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        neighbour_input_ids: torch.LongTensor | None = None,
        neighbour_attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> RetroCausalLMOutput:
        r"""
        Args: as [`RetroModel.forward`], plus
            labels (`torch.LongTensor` of shape `(B, T)`, *optional*): usually `input_ids`; shifted inside the model;
                -100 is ignored.
        """
        kwargs.pop("return_dict", None)
        kwargs.pop("num_items_in_batch", None)
        outputs = self.transformer(input_ids, past_key_values=past_key_values, attention_mask=attention_mask,
                                   position_ids=position_ids, inputs_embeds=inputs_embeds,
                                   neighbour_input_ids=neighbour_input_ids,
                                   neighbour_attention_mask=neighbour_attention_mask, use_cache=use_cache,
                                   **kwargs)  # fmt: skip
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)  # fmt: skip
        return RetroCausalLMOutput(loss=loss, logits=logits, cache=outputs.cache)

    # ----------------------------------------------------------------------------------------------------- generate

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.LongTensor,
        max_new_tokens: int,
        *,
        attention_mask: torch.Tensor | None = None,
        retriever: Callable | None = None,
        neighbour_input_ids: torch.LongTensor | None = None,
        use_cache: bool = True,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        eos_token_id: int | None = None,
        generator: torch.Generator | None = None,
        return_neighbours: bool = False,
    ) -> "torch.LongTensor | RetroGenerateOutput":
        r"""
        Generates with retrieval at chunk boundaries: once a chunk of a row is complete, `retriever` fetches its
        neighbours and they are encoded once (and cached with `use_cache=True`) before the chunk's last token is fed.

        Prompts of different lengths go in one batch with left padding (`attention_mask`). Chunks and positions are
        counted from each row's first real token, so rows reach chunk boundaries at different steps: at every step the
        rows that reach one are retrieved for together (one `retriever` call), and each row keeps its own neighbours.
        Under greedy decoding a row generates what it generates alone (up to float rounding in near-ties).

        Args:
            input_ids (`torch.LongTensor` of shape `(B, T)`): prompts, left-padded to a common length.
            max_new_tokens (`int`): tokens to add.
            attention_mask (`torch.Tensor` of shape `(B, T)`, *optional*): 1 for prompt tokens, 0 for the left
                padding (e.g. a tokenizer's with `padding_side="left"`). Right or inner padding raises.
            retriever (`Callable`, *optional*): `retriever(chunk_ids)` or, if it has a `rows` parameter,
                `retriever(chunk_ids, rows=rows)`, with `chunk_ids` `(n, m)` the chunks just completed (each row's
                chunk `u` counted from its first real token) and `rows` `(n,)` their batch rows. Returns neighbour token
                ids `(n, k, r)`, or a tuple `(neighbour_chunk_ids (n, k), neighbour_input_ids (n, k, r))` to have the
                database chunk ids reported (`realm_hf.retro.RetroRetriever` does). Needed to go past a chunk boundary
                with retrieval on.
            neighbour_input_ids (`torch.LongTensor` of shape `(B, L, k, r)`, *optional*): neighbours of each row's
                chunks `0 .. L - 1` (counted from its first real token), instead of retrieving them; later chunks are
                retrieved. Neither this nor `retriever`: retrieval off.
            use_cache (`bool`, defaults to `True`): `False` re-runs the full sequence each step (the reference).
            do_sample (`bool`, defaults to `False`): greedy decoding, or sampling with `temperature` and `top_k`.
            eos_token_id (`int`, *optional*): a row stops once it has produced it (later tokens are padding, and it
                retrieves nothing more); generation stops once every row has.
            return_neighbours (`bool`, defaults to `False`): return a [`RetroGenerateOutput`] with what the model read.

        Returns:
            `torch.LongTensor` of shape `(B, T + new_tokens)`: prompts (padding included) followed by the generated
            tokens; with `return_neighbours=True`, a [`RetroGenerateOutput`] holding them as `sequences`.
        """
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids must have shape (batch_size, prompt_length >= 1), got {tuple(input_ids.shape)}."
            )
        batch, prompt_length = input_ids.shape
        device = input_ids.device
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        elif tuple(attention_mask.shape) != (batch, prompt_length):
            raise ValueError(f"attention_mask must have the shape of input_ids {(batch, prompt_length)}, got "
                             f"{tuple(attention_mask.shape)}.")  # fmt: skip
        attention_mask = attention_mask.to(device=device, dtype=torch.long)
        if not bool((attention_mask[:, 1:] >= attention_mask[:, :-1]).all() and attention_mask[:, -1].all()):
            raise ValueError(
                "generate() takes left-padded prompts: each attention_mask row must be zeros then ones, ending with a "
                f"token; got {attention_mask.tolist() if attention_mask.numel() <= 64 else 'other padding'}."
            )
        padding = prompt_length - attention_mask.sum(dim=1)  # (B,)
        retrieval = retriever is not None or neighbour_input_ids is not None
        state = _GenerationNeighbours(self.config, batch, device, neighbour_input_ids) if retrieval else None
        sequence = input_ids
        cache = RetroCache(self.config) if use_cache else None
        next_input = sequence
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                neighbours = neighbour_mask = None
                if retrieval:
                    complete = torch.div(sequence.shape[1] - padding, self.config.chunk_size, rounding_mode="floor")
                    state.retrieve_up_to(complete, sequence, padding, retriever, skip=finished)
                    neighbours, neighbour_mask = state.tensors(int(complete.max()))
                outputs = self(next_input if use_cache else sequence, past_key_values=cache,
                               attention_mask=attention_mask, neighbour_input_ids=neighbours,
                               neighbour_attention_mask=neighbour_mask, use_cache=use_cache)  # fmt: skip
                logits = outputs.logits[:, -1].float()  # (B, vocab)
                if do_sample:
                    logits = logits / temperature
                    if top_k is not None:
                        threshold = logits.topk(top_k, dim=-1).values[:, -1:]
                        logits = logits.masked_fill(logits < threshold, float("-inf"))
                    next_token = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]
                else:
                    next_token = logits.argmax(dim=-1)
                if eos_token_id is not None:
                    next_token = next_token.masked_fill(finished, self.config.pad_token_id or 0)
                    finished |= next_token == eos_token_id
                sequence = torch.cat((sequence, next_token[:, None]), dim=1)
                attention_mask = torch.cat((attention_mask, attention_mask.new_ones(batch, 1)), dim=1)
                next_input = next_token[:, None]
                if eos_token_id is not None and bool(finished.all()):
                    break
        finally:
            self.train(was_training)
        if not return_neighbours:
            return sequence
        if state is None:
            return RetroGenerateOutput(sequences=sequence, padding=padding)
        return state.output(sequence, padding)


class _GenerationNeighbours:
    """Per-row neighbours during `generate()`: row `b`'s chunk `u` (counted from its first real token) gets its
    neighbours when it completes, whatever the other rows are doing. Holds `(B, L, k, r)` tokens, a filled mask and
    `(B, L, k)` database chunk ids (-1 where unknown)."""

    def __init__(self, config: RetroConfig, batch: int, device, given: torch.Tensor | None):
        self.chunk_size = config.chunk_size
        self.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
        self.device = device
        if given is not None:
            if given.dim() != 4 or given.shape[0] != batch:
                raise ValueError(f"neighbour_input_ids must have shape ({batch}, num_chunks, k, r), got "
                                 f"{tuple(given.shape)}.")  # fmt: skip
            given = given.to(device, torch.long)
            self.tokens = given
            self.filled = torch.ones(given.shape[:2], dtype=torch.bool, device=device)
            self.chunk_ids = torch.full(given.shape[:3], -1, dtype=torch.long, device=device)
        else:
            self.tokens = torch.zeros(batch, 0, config.num_neighbors, 2 * config.chunk_size, dtype=torch.long,
                                      device=device)  # fmt: skip
            self.filled = torch.zeros(batch, 0, dtype=torch.bool, device=device)
            self.chunk_ids = torch.zeros(batch, 0, config.num_neighbors, dtype=torch.long, device=device)
        self.known = self.tokens.shape[1] > 0  # whether k and r are fixed by neighbours seen so far
        self.counts = torch.full((batch,), self.tokens.shape[1], dtype=torch.long, device=device)

    def _grow(self, num_chunks: int) -> None:
        grow = num_chunks - self.tokens.shape[1]
        if grow > 0:
            batch, _, k, r = self.tokens.shape
            self.tokens = torch.cat((self.tokens, self.tokens.new_full((batch, grow, k, r), self.pad_token_id)), 1)
            self.filled = torch.cat((self.filled, self.filled.new_zeros(batch, grow)), dim=1)
            self.chunk_ids = torch.cat((self.chunk_ids, self.chunk_ids.new_full((batch, grow, k), -1)), dim=1)

    def retrieve_up_to(self, complete: torch.Tensor, sequence, padding, retriever, skip: torch.Tensor) -> None:
        """Retrieves, in one call, every chunk some row completed since (rows in `skip` are left empty)."""
        missing = (complete - self.counts).clamp(min=0).masked_fill(skip, 0)
        if not bool(missing.any()):
            self.counts = torch.maximum(self.counts, complete)
            return
        if retriever is None:
            row = int(missing.nonzero()[0, 0])
            raise ValueError(
                f"generation reached chunk {int(complete[row]) - 1} of row {row} but neighbour_input_ids covers "
                f"{int(self.counts[row])} chunks; pass a retriever to retrieve at chunk boundaries."
            )
        m = self.chunk_size
        rows, offsets = (torch.arange(int(missing.max()), device=self.device)[None] < missing[:, None]).nonzero(
            as_tuple=True
        )
        chunks = self.counts[rows] + offsets
        token_index = (padding[rows] + chunks * m)[:, None] + torch.arange(m, device=self.device)
        chunk_ids = sequence[rows[:, None], token_index]  # (n, m)
        if "rows" in inspect.signature(retriever).parameters:
            retrieved = retriever(chunk_ids, rows=rows)
        else:
            retrieved = retriever(chunk_ids)
        database_ids = None
        if isinstance(retrieved, tuple):
            database_ids, retrieved = retrieved
        if not isinstance(retrieved, torch.Tensor) or retrieved.dim() != 3 or retrieved.shape[0] != rows.numel():
            shape = tuple(retrieved.shape) if isinstance(retrieved, torch.Tensor) else type(retrieved).__name__
            raise ValueError(f"the retriever must return neighbour token ids of shape ({rows.numel()}, k, r) for "
                             f"{rows.numel()} chunks, got {shape}.")  # fmt: skip
        if not self.known:
            batch = self.tokens.shape[0]
            self.tokens = self.tokens.new_full((batch, self.tokens.shape[1], *retrieved.shape[1:]), self.pad_token_id)
            self.chunk_ids = self.chunk_ids.new_full((batch, self.tokens.shape[1], retrieved.shape[1]), -1)
            self.known = True
        elif tuple(retrieved.shape[1:]) != tuple(self.tokens.shape[2:]):
            raise ValueError(f"the retriever returned neighbours of shape (k, r) = {tuple(retrieved.shape[1:])}, but "
                             f"earlier neighbours have {tuple(self.tokens.shape[2:])}.")  # fmt: skip
        self._grow(int(complete.max()))
        self.tokens[rows, chunks] = retrieved.to(self.device, torch.long)
        self.filled[rows, chunks] = True
        if database_ids is not None:
            if tuple(database_ids.shape) != tuple(retrieved.shape[:2]):
                raise ValueError(f"the retriever's neighbour chunk ids must have shape {tuple(retrieved.shape[:2])}, "
                                 f"got {tuple(database_ids.shape)}.")  # fmt: skip
            self.chunk_ids[rows, chunks] = database_ids.to(self.device, torch.long)
        self.counts = torch.maximum(self.counts, complete)

    def tensors(self, num_chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Neighbours `(B, num_chunks, k, r)` and their mask for the model."""
        self._grow(num_chunks)
        tokens = self.tokens[:, :num_chunks]
        mask = self.filled[:, :num_chunks, None, None] & (tokens != self.pad_token_id)
        return tokens, mask

    def output(self, sequence: torch.Tensor, padding: torch.Tensor) -> "RetroGenerateOutput":
        m = self.chunk_size
        num_chunks = self.tokens.shape[1]
        positions = (padding[:, None] + torch.arange(num_chunks, device=self.device) * m)[..., None]
        positions = (positions + torch.arange(m, device=self.device)).clamp(max=sequence.shape[1] - 1)
        chunk_input_ids = torch.gather(sequence, 1, positions.view(sequence.shape[0], -1)).view(*positions.shape)
        return RetroGenerateOutput(
            sequences=sequence,
            padding=padding,
            retrieved=self.filled.clone(),
            chunk_input_ids=chunk_input_ids.masked_fill(~self.filled[..., None], self.pad_token_id),
            neighbour_input_ids=self.tokens.masked_fill(~self.filled[..., None, None], self.pad_token_id),
            neighbour_chunk_ids=self.chunk_ids.masked_fill(~self.filled[..., None], -1),
        )


@dataclass
class RetroGenerateOutput(ModelOutput):
    r"""
    What [`RetroForCausalLM.generate`] produced and what the model read (`return_neighbours=True`). Chunk `u` of row
    `b` covers `sequences[b, padding[b] + u * m : padding[b] + (u + 1) * m]`; its neighbours were read by the tokens
    from its last one to the one before the last of chunk `u + 1` (the paper's causal alignment).

    Args:
        sequences (`torch.LongTensor` of shape `(B, T + new_tokens)`): prompts (padding included) and generated tokens.
        padding (`torch.LongTensor` of shape `(B,)`): left padding of each row.
        retrieved (`torch.BoolTensor` of shape `(B, L)`): whether row `b`'s chunk `u` has neighbours (retrieved or
            given); `False` for chunks a row never completed (or completed after its end-of-sequence token).
        chunk_input_ids (`torch.LongTensor` of shape `(B, L, m)`): the chunks that retrieved them.
        neighbour_input_ids (`torch.LongTensor` of shape `(B, L, k, r)`): the neighbours the model read (each a
            retrieved chunk followed by its continuation), padding where `retrieved` is `False`.
        neighbour_chunk_ids (`torch.LongTensor` of shape `(B, L, k)`): the neighbours' database chunk ids when the
            retriever reported them (`RetroRetriever` does), -1 otherwise.
    """

    sequences: torch.LongTensor | None = None
    padding: torch.LongTensor | None = None
    retrieved: torch.BoolTensor | None = None
    chunk_input_ids: torch.LongTensor | None = None
    neighbour_input_ids: torch.LongTensor | None = None
    neighbour_chunk_ids: torch.LongTensor | None = None


__all__ = [
    "RetroCache",
    "RetroCausalLMOutput",
    "RetroForCausalLM",
    "RetroGenerateOutput",
    "RetroModel",
    "RetroModelOutput",
    "RetroPreTrainedModel",
]

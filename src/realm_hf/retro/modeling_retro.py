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
- Relative positions: rotary position encodings inside CCA and the encoder, instead of the paper's learned
  relative-position logits. In CCA the query at offset `i` of an attending chunk sits at position `m - 1 + i` and
  neighbour token `j` at position `j`, so the rotary phase depends on `i - j + m - 1`, the paper's CCA distance
  `d(i, i')`; the encoder's cross-attention gets `i' - i`, the paper's `d_enc`.
- Generation keeps a `RetroCache`: GPT-2's self-attention KV cache, the encoded neighbours of every finished chunk, and
  the first-CCA-layer states of the unfinished chunk (needed to encode its neighbours once it is complete).
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
    ) -> torch.Tensor:
        r"""
        Args:
            queries (`torch.Tensor` of shape `(batch, Tq, query_size)`), keys_values (`(batch, Tk, key_value_size)`).
            query_positions (`torch.LongTensor` of shape `(Tq,)`), key_positions (`(Tk,)`): rotary positions.
            key_mask (`torch.BoolTensor` of shape `(batch, Tk)`, *optional*): `True` for keys that may be attended.
                Queries with no attendable key get a zero output instead of a softmax over nothing.

        Returns:
            `torch.Tensor` of shape `(batch, Tq, query_size)`.
        """
        query = apply_rotary(self._heads(self.query(queries)), query_positions, self.rotary_base)
        key = apply_rotary(self._heads(self.key(keys_values)), key_positions, self.rotary_base)
        value = self._heads(self.value(keys_values))
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_dim)  # (batch, H, Tq, Tk)
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
        normed = self.self_attention_norm(hidden_states)
        hidden_states = hidden_states + self.dropout(
            self.self_attention(normed, normed, neighbour_positions, neighbour_positions, neighbour_mask)
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
    """Chunked cross-attention with the paper's causal alignment (shift of `m - 1` tokens), for any `past_length`, so
    that the full forward and cached generation use the same code."""

    def __init__(self, config: RetroConfig):
        super().__init__()
        self.chunk_size = config.chunk_size
        self.layer_norm = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attention = RetroAttention(config.n_embd, config.encoder_hidden_size, config.num_cca_heads,
                                        config.rotary_base, config.attn_pdrop, zero_init_output=True)  # fmt: skip
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states, encoded_neighbours, neighbour_mask, past_length: int = 0):
        r"""
        Args:
            hidden_states (`torch.Tensor` of shape `(B, T, D)`): decoder states at positions `past_length ..
                past_length + T - 1`.
            encoded_neighbours (`torch.Tensor` of shape `(B, L, k, r, E)`), neighbour_mask (`(B, L, k, r)` bool):
                encoded neighbours of chunks `0 .. L - 1`; `L` covers every chunk some position here attends to.

        Returns:
            `torch.Tensor` of shape `(B, T, D)`: the residual update, zero for positions before `m - 1`.
        """
        m = self.chunk_size
        batch, length, width = hidden_states.shape
        # Rows before the first chunk's last token see no neighbours (RET(C_1) is empty in the paper's 1-based terms).
        skipped = min(length, max(0, m - 1 - past_length))
        output = hidden_states.new_zeros(batch, length, width)
        if skipped == length:
            return output
        shifted_start = past_length + skipped - (m - 1)  # shifted position of the first attending row, >= 0
        first_chunk, offset = divmod(shifted_start, m)
        attending = self.layer_norm(hidden_states[:, skipped:])
        attending_length = attending.shape[1]
        num_chunks = math.ceil((offset + attending_length) / m)
        # Lay the rows out as whole attending chunks (rows of other chunks are zero padding; queries are independent).
        padded = F.pad(attending, (0, 0, offset, num_chunks * m - offset - attending_length))
        padded = padded.view(batch * num_chunks, m, width)  # (B * chunks, m, D)
        keys = encoded_neighbours[:, first_chunk : first_chunk + num_chunks]  # (B, chunks, k, r, E)
        if keys.shape[1] != num_chunks:
            raise ValueError(
                f"positions up to {past_length + length - 1} need the neighbours of chunk {first_chunk + num_chunks - 1}, "
                f"but only {encoded_neighbours.shape[1]} chunks have encoded neighbours."
            )
        num_neighbours, neighbour_length = keys.shape[2], keys.shape[3]
        keys = keys.reshape(batch * num_chunks, num_neighbours * neighbour_length, -1)  # (B * chunks, k * r, E)
        key_mask = neighbour_mask[:, first_chunk : first_chunk + num_chunks].reshape(batch * num_chunks, -1)
        device = hidden_states.device
        query_positions = torch.arange(m, device=device) + (m - 1)
        key_positions = torch.arange(neighbour_length, device=device).repeat(num_neighbours)
        attended = self.attention(padded, keys, query_positions, key_positions, key_mask)
        attended = self.dropout(attended).view(batch, num_chunks * m, width)[:, offset : offset + attending_length]
        output[:, skipped:] = attended
        return output


class RetroDecoderLayer(GPT2Block):
    """GPT-2's block, with chunked cross-attention between self-attention and the MLP in the layers of
    `config.cca_layers`. Without neighbours it is exactly `GPT2Block.forward`."""

    def __init__(self, config: RetroConfig, layer_idx: int):
        super().__init__(config, layer_idx=layer_idx)
        self.cca = RetroChunkedCrossAttention(config) if layer_idx in config.cca_layers else None

    def forward(self, hidden_states, past_key_values=None, attention_mask=None, use_cache=False,
                encoded_neighbours=None, neighbour_mask=None, past_length: int = 0, **kwargs):  # fmt: skip
        if self.cca is None or encoded_neighbours is None:
            return super().forward(hidden_states, past_key_values, attention_mask, use_cache=use_cache, **kwargs)
        residual = hidden_states
        attention_output, _ = self.attn(self.ln_1(hidden_states), attention_mask=attention_mask, use_cache=use_cache,
                                        **{CACHE_KWARG: past_key_values}, **kwargs)  # fmt: skip
        hidden_states = attention_output + residual
        hidden_states = hidden_states + self.cca(hidden_states, encoded_neighbours, neighbour_mask, past_length)
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class RetroCache:
    """What cached generation reuses: GPT-2's self-attention KV cache, the encoded neighbours of every chunk retrieved
    so far, and the first-CCA-layer states of tokens whose chunk has not been encoded yet.

    A cache is bound to retrieval on or off by its first forward; mixing the two raises.
    """

    def __init__(self, config: RetroConfig):
        self.self_attention_cache = DynamicCache(config=config)
        self.encoded_neighbours: torch.Tensor | None = None  # (B, L, k, r, E)
        self.neighbour_mask: torch.Tensor | None = None  # (B, L, k, r) bool
        self.pending_chunk_states: torch.Tensor | None = None  # (B, N - L * m, D)
        self.retrieval: bool | None = None

    def get_seq_length(self) -> int:
        return self.self_attention_cache.get_seq_length()

    @property
    def num_encoded_chunks(self) -> int:
        return 0 if self.encoded_neighbours is None else self.encoded_neighbours.shape[1]


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

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, _ZeroInitLinear):
            init.zeros_(module.weight)
            init.zeros_(module.bias)


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


def _check_neighbours(neighbour_input_ids, neighbour_attention_mask, batch: int, total_length: int, chunk_size: int):
    """Raises a `ValueError` naming the expected and received shapes when neighbours do not fit the sequence."""
    if not isinstance(neighbour_input_ids, torch.Tensor) or neighbour_input_ids.dim() != 4:
        shape = tuple(neighbour_input_ids.shape) if isinstance(neighbour_input_ids, torch.Tensor) else None
        raise ValueError(
            "neighbour_input_ids must be a 4-D tensor (batch, num_chunks, num_neighbours, neighbour_length), got "
            f"{shape if shape is not None else type(neighbour_input_ids).__name__}."
        )
    if neighbour_input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"neighbour_input_ids must hold token ids (int64 or int32), got {neighbour_input_ids.dtype}.")
    num_batch, num_chunks, num_neighbours, neighbour_length = neighbour_input_ids.shape
    complete_chunks, all_chunks = total_length // chunk_size, math.ceil(total_length / chunk_size)
    if num_batch != batch:
        raise ValueError(f"neighbour_input_ids has batch size {num_batch}, but input_ids has batch size {batch}.")
    if not complete_chunks <= num_chunks <= all_chunks:
        raise ValueError(
            f"neighbour_input_ids must give neighbours for the {complete_chunks} complete chunks of chunk_size "
            f"{chunk_size} in {total_length} tokens (or for all {all_chunks} chunks), got {num_chunks} chunks "
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

    def _encode_neighbours(self, chunk_states, neighbour_input_ids, neighbour_mask, cache, past_length):
        """Encodes the neighbours of the chunks completed so far that are not encoded yet; returns the encoded
        neighbours `(B, L, k, r, E)` and mask `(B, L, k, r)` of all complete chunks."""
        m = self.config.chunk_size
        batch, length, width = chunk_states.shape
        complete_chunks = (past_length + length) // m
        encoded_chunks = 0
        if cache is not None:
            encoded_chunks = cache.num_encoded_chunks
            if cache.pending_chunk_states is not None:
                chunk_states = torch.cat((cache.pending_chunk_states, chunk_states), dim=1)
        # chunk_states now starts at position encoded_chunks * m
        new_chunks = complete_chunks - encoded_chunks
        new_ids = neighbour_input_ids[:, encoded_chunks:complete_chunks]
        new_mask = neighbour_mask[:, encoded_chunks:complete_chunks]
        states_of_new_chunks = chunk_states[:, : new_chunks * m].reshape(batch, new_chunks, m, width)
        if new_chunks > 0:
            encoded = self.encoder(new_ids, new_mask, states_of_new_chunks)  # (B, new, k, r, E)
        else:
            encoded = chunk_states.new_zeros(batch, 0, *new_ids.shape[2:], self.config.encoder_hidden_size)
        if cache is None:
            return encoded, new_mask
        cache.pending_chunk_states = chunk_states[:, new_chunks * m :]
        if cache.encoded_neighbours is None or cache.num_encoded_chunks == 0:
            cache.encoded_neighbours, cache.neighbour_mask = encoded, new_mask
        elif new_chunks > 0:
            if encoded.shape[2:4] != cache.encoded_neighbours.shape[2:4]:
                raise ValueError(
                    f"neighbours of new chunks have (k, r) = {tuple(encoded.shape[2:4])}, but the cache holds "
                    f"{tuple(cache.encoded_neighbours.shape[2:4])}."
                )
            cache.encoded_neighbours = torch.cat((cache.encoded_neighbours, encoded), dim=1)
            cache.neighbour_mask = torch.cat((cache.neighbour_mask, new_mask), dim=1)
        return cache.encoded_neighbours, cache.neighbour_mask

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
            attention_mask (`torch.Tensor` of shape `(B, N)`, *optional*): 1 for tokens, 0 for padding.
            neighbour_input_ids (`torch.LongTensor` of shape `(B, L, k, r)`, *optional*): `neighbour_input_ids[:, u]`
                holds the `k` neighbours of chunk `u` (each a retrieved chunk followed by its continuation); `L` is the
                number of complete chunks in the `N` tokens so far (or all chunks, the last one's then unused). `None`
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

        retrieval = neighbour_input_ids is not None
        if past_key_values is not None:
            if past_key_values.retrieval is not None and past_key_values.retrieval != retrieval:
                raise ValueError(
                    f"this RetroCache was built with retrieval {'on' if past_key_values.retrieval else 'off'}; pass "
                    f"neighbour_input_ids {'for every call' if past_key_values.retrieval else 'never'}."
                )
            past_key_values.retrieval = retrieval
        if retrieval:
            _check_neighbours(neighbour_input_ids, neighbour_attention_mask, batch, past_length + length,
                              self.config.chunk_size)  # fmt: skip
            if neighbour_attention_mask is None:
                neighbour_mask = neighbour_input_ids != self.config.pad_token_id
            else:
                neighbour_mask = neighbour_attention_mask.bool()

        if position_ids is None:
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
                    hidden_states, neighbour_input_ids, neighbour_mask, past_key_values, past_length
                )
            hidden_states = layer(hidden_states, self_attention_cache, causal_mask, use_cache=use_cache,
                                  encoded_neighbours=encoded_neighbours, neighbour_mask=encoded_mask,
                                  past_length=past_length, position_ids=position_ids, **kwargs)  # fmt: skip
        hidden_states = self.ln_f(hidden_states)
        return RetroModelOutput(
            last_hidden_state=hidden_states, cache=past_key_values if use_cache else None
        )


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
    def from_base_model(cls, base_model, **retro_config) -> "RetroForCausalLM":
        r"""
        RETRO-fits a trained `GPT2LMHeadModel`: copies its config and weights, adds freshly initialised CCA layers and
        neighbour encoder, and freezes every base weight (`freeze_base_model`). With retrieval off the result computes
        exactly what `base_model` computes.

        Args:
            base_model (`GPT2LMHeadModel`): the base decoder (its config may not use cross-attention).
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
        retriever: Callable[[torch.LongTensor], torch.LongTensor] | None = None,
        neighbour_input_ids: torch.LongTensor | None = None,
        use_cache: bool = True,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        eos_token_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.LongTensor:
        r"""
        Generates with retrieval at chunk boundaries: once a chunk is complete, `retriever` fetches its neighbours and
        they are encoded once (and cached with `use_cache=True`) before the chunk's last token is fed.

        Args:
            input_ids (`torch.LongTensor` of shape `(B, T)`): prompts of equal length (no padding).
            max_new_tokens (`int`): tokens to add.
            retriever (`Callable`, *optional*): maps one chunk `(B, m)` of token ids to its neighbours `(B, k, r)`
                (e.g. `realm_hf.retro.RetroRetriever`). Needed to go past a chunk boundary with retrieval on.
            neighbour_input_ids (`torch.LongTensor` of shape `(B, L, k, r)`, *optional*): neighbours of the prompt's
                complete chunks, instead of retrieving them. Neither this nor `retriever`: retrieval off.
            use_cache (`bool`, defaults to `True`): `False` re-runs the full sequence each step (the reference).
            do_sample (`bool`, defaults to `False`): greedy decoding, or sampling with `temperature` and `top_k`.
            eos_token_id (`int`, *optional*): stop once every sequence has produced it (later tokens are padding).

        Returns:
            `torch.LongTensor` of shape `(B, T + new_tokens)`: prompts followed by the generated tokens.
        """
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids must have shape (batch_size, prompt_length >= 1), got {tuple(input_ids.shape)}."
            )
        m = self.config.chunk_size
        retrieval = retriever is not None or neighbour_input_ids is not None
        neighbours = neighbour_input_ids
        sequence = input_ids
        cache = RetroCache(self.config) if use_cache else None
        next_input = sequence
        finished = torch.zeros(sequence.shape[0], dtype=torch.bool, device=sequence.device)
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                if retrieval:
                    neighbours = self._neighbours_up_to(sequence, neighbours, retriever, m)
                outputs = self(next_input if use_cache else sequence, past_key_values=cache,
                               neighbour_input_ids=neighbours, use_cache=use_cache)  # fmt: skip
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
                next_input = next_token[:, None]
                if eos_token_id is not None and bool(finished.all()):
                    break
        finally:
            self.train(was_training)
        return sequence

    def _neighbours_up_to(self, sequence, neighbours, retriever, m):
        """Neighbours `(B, L, k, r)` for every complete chunk of `sequence`, retrieving the missing ones."""
        complete_chunks = sequence.shape[1] // m
        have = 0 if neighbours is None else neighbours.shape[1]
        if have >= complete_chunks:
            if neighbours is None:  # retrieval is on but no chunk is complete yet
                neighbours = sequence.new_zeros(sequence.shape[0], 0, self.config.num_neighbors, 2 * m)
            return neighbours
        if retriever is None:
            raise ValueError(
                f"generation reached chunk {complete_chunks - 1} but neighbour_input_ids covers {have} chunks; pass a "
                "retriever to retrieve at chunk boundaries."
            )
        new = [retriever(sequence[:, chunk * m : (chunk + 1) * m]) for chunk in range(have, complete_chunks)]
        new = torch.stack([neighbour.to(sequence.device, torch.long) for neighbour in new], dim=1)  # (B, new, k, r)
        return new if have == 0 else torch.cat((neighbours, new), dim=1)


__all__ = [
    "RetroCache",
    "RetroCausalLMOutput",
    "RetroForCausalLM",
    "RetroModel",
    "RetroModelOutput",
    "RetroPreTrainedModel",
]

"""RETRO configuration: a GPT-2 decoder plus the fields of chunked cross-attention, the neighbour encoder and retrieval.

The decoder fields are `GPT2Config`'s (same names, same meaning), so a trained `GPT2LMHeadModel` can be RETRO-fitted
by copying its config and weights (`RetroForCausalLM.from_base_model`).
"""

from huggingface_hub.dataclasses import strict
from transformers import GPT2Config

RETRIEVAL_METRICS = ("l2", "ip")


def paper_cca_layers(num_hidden_layers: int) -> list[int]:
    """The paper's chunked cross-attention layers as 0-based indices: every 3rd layer from layer 6 (1-based) for up to
    15 layers, from layer 9 beyond (Borgeaud et al. 2022, Table 10), e.g. `[5, 8, 11]` for 12 layers. Decoders too
    shallow for that rule (fewer than 6 layers) get CCA in their last layer."""
    start = 6 if num_hidden_layers <= 15 else 9
    layers = list(range(start - 1, num_hidden_layers, 3))
    return layers or [num_hidden_layers - 1]


@strict
class RetroConfig(GPT2Config):
    r"""
    Configuration of [`RetroModel`] and [`RetroForCausalLM`] (Borgeaud et al. 2022, "Improving language models by
    retrieving from trillions of tokens").

    The decoder is GPT-2 (`vocab_size`, `n_embd`, `n_layer`, `n_head`, `n_positions`, dropouts, ... as in
    `GPT2Config`; `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `max_position_embeddings` are aliases).
    Defaults differ from GPT-2's where RETRO's setup differs: the bert-base-uncased wordpiece vocabulary (30522, the
    tokenizer of the frozen BERT that keys the retrieval database), 2048 positions and `[PAD]` = 0.

    Args:
        chunk_size (`int`, defaults to 64): tokens per chunk `m`; the sequence is split into chunks, and each chunk's
            neighbours are seen from its last token on.
        cca_layers (`list[int]`, *optional*): 0-based indices of the decoder layers with chunked cross-attention. `None`
            means the paper's rule (see `paper_cca_layers`: `[5, 8, 11]` for 12 layers).
        num_neighbors (`int`, defaults to 2): neighbours per chunk `k` used in training (evaluation may use more; the
            model accepts any `k`).
        encoder_hidden_size (`int`, defaults to 896): width `d'` of the bidirectional neighbour encoder.
        encoder_num_layers (`int`, defaults to 2), encoder_num_heads (`int`, defaults to 14),
        encoder_intermediate_size (`int`, *optional*, defaults to `4 * encoder_hidden_size`): the neighbour encoder.
        cca_num_heads (`int`, *optional*, defaults to `n_head`): heads of chunked cross-attention.
        rotary_base (`float`, defaults to 10000.0): base of the rotary position encoding used for the relative
            positions inside CCA and the encoder.
        encoder_relative_position_buckets (`int`, defaults to 32): buckets of the learned relative-position logits
            added to the neighbour encoder's self-attention (one per head and bucket; offsets under a quarter of the
            buckets each have their own, longer ones share log-spaced buckets up to
            `encoder_relative_position_max_distance`, defaults to 128). They start at zero, so a model saved without them
            loads with the same outputs. `0` leaves rotary positions alone.
        retrieval_metric (`str`, defaults to `"l2"`): `"l2"` (the paper's squared L2 between frozen-BERT chunk keys) or
            `"ip"` (inner product); what the retrieval database is indexed with.

    Example:

    ```python
    >>> from realm_hf import RetroConfig, RetroForCausalLM
    >>> config = RetroConfig(n_embd=32, n_layer=2, n_head=4, chunk_size=4, cca_layers=[1], encoder_hidden_size=32,
    ...                      encoder_num_heads=4, encoder_num_layers=1)
    >>> model = RetroForCausalLM(config)
    ```
    """

    model_type = "retro"

    vocab_size: int = 30522
    n_positions: int = 2048
    pad_token_id: int | None = 0
    bos_token_id: int | None = 101
    eos_token_id: int | list[int] | None = 102
    chunk_size: int = 64
    cca_layers: list[int] | None = None
    num_neighbors: int = 2
    encoder_hidden_size: int = 896
    encoder_num_layers: int = 2
    encoder_num_heads: int = 14
    encoder_intermediate_size: int | None = None
    cca_num_heads: int | None = None
    rotary_base: float | int = 10000.0
    encoder_relative_position_buckets: int = 32
    encoder_relative_position_max_distance: int = 128
    retrieval_metric: str = "l2"

    def __post_init__(self, **kwargs):
        if self.cca_layers is None:
            self.cca_layers = paper_cca_layers(self.n_layer)
        self.cca_layers = sorted(int(layer) for layer in self.cca_layers)
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        """Checks the shapes the modeling code relies on; raises `ValueError` naming the value received."""
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head}).")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive number of tokens, got {self.chunk_size}.")
        if not self.cca_layers:
            raise ValueError("cca_layers must name at least one decoder layer, got an empty list.")
        if len(set(self.cca_layers)) != len(self.cca_layers) or not all(
            0 <= layer < self.n_layer for layer in self.cca_layers
        ):
            raise ValueError(
                f"cca_layers must be distinct 0-based layer indices in [0, {self.n_layer}), got {self.cca_layers}."
            )
        if self.encoder_hidden_size % self.encoder_num_heads != 0:
            raise ValueError(
                f"encoder_hidden_size ({self.encoder_hidden_size}) must be a multiple of encoder_num_heads "
                f"({self.encoder_num_heads})."
            )
        if self.encoder_relative_position_buckets < 0 or self.encoder_relative_position_buckets % 2:
            raise ValueError(
                "encoder_relative_position_buckets must be 0 (none) or a positive even number (half for each "
                f"direction), got {self.encoder_relative_position_buckets}."
            )
        if self.encoder_relative_position_buckets and self.encoder_relative_position_max_distance < 1:
            raise ValueError(
                "encoder_relative_position_max_distance must be a positive number of tokens, got "
                f"{self.encoder_relative_position_max_distance}."
            )
        if self.n_embd % self.num_cca_heads != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of cca_num_heads ({self.num_cca_heads}).")
        if self.retrieval_metric not in RETRIEVAL_METRICS:
            raise ValueError(f"retrieval_metric must be one of {RETRIEVAL_METRICS}, got {self.retrieval_metric!r}.")
        if self.add_cross_attention:
            raise ValueError(
                "RETRO reads neighbours through chunked cross-attention; add_cross_attention must be False."
            )

    @property
    def num_cca_heads(self) -> int:
        return self.cca_num_heads if self.cca_num_heads is not None else self.n_head

    @property
    def encoder_ffn_size(self) -> int:
        return self.encoder_intermediate_size or 4 * self.encoder_hidden_size


__all__ = ["RETRIEVAL_METRICS", "RetroConfig", "paper_cca_layers"]

"""Tiny RETRO configs built in code (no network)."""

from realm_hf.retro import RetroConfig

VOCAB = 40
CHUNK = 4


def tiny_retro_config(**overrides) -> RetroConfig:
    fields = dict(
        vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64, chunk_size=CHUNK, cca_layers=[1, 2],
        encoder_hidden_size=16, encoder_num_heads=2, encoder_num_layers=2, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    fields.update(overrides)
    return RetroConfig(**fields)

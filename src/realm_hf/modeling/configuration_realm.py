"""REALM configuration: one config for the embedder, scorer, knowledge-augmented encoder, reader and open-QA model.

Field names and defaults are those of transformers 4.x `RealmConfig`, so every `config.json` on the Hub loads unchanged.
"""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

_POSITION_EMBEDDING_TYPES = ("absolute",)


@strict
class RealmConfig(PreTrainedConfig):
    r"""
    Configuration of the REALM family (Guu et al. 2020) and of ORQA (Lee et al. 2019), which shares its architecture.

    The first block of fields describes the BERT encoders; the second block the retriever projection, the reader's
    span scorer and the retrieval beams.

    Args:
        vocab_size (`int`, defaults to 30522): size of the wordpiece vocabulary.
        hidden_size (`int`, defaults to 768): width of the BERT encoders.
        retriever_proj_size (`int`, defaults to 128): width of the retrieval embeddings (questions and blocks).
        num_hidden_layers (`int`, defaults to 12), num_attention_heads (`int`, defaults to 12),
        intermediate_size (`int`, defaults to 3072), hidden_act (`str`, defaults to "gelu_new"),
        hidden_dropout_prob, attention_probs_dropout_prob (`float`, defaults to 0.1),
        max_position_embeddings (`int`, defaults to 512), type_vocab_size (`int`, defaults to 2),
        initializer_range (`float`, defaults to 0.02), layer_norm_eps (`float`, defaults to 1e-12): the BERT encoders.
        num_candidates (`int`, defaults to 8): candidates per query in `RealmScorer` and `RealmKnowledgeAugEncoder`.
        span_hidden_size (`int`, defaults to 256): hidden width of the reader's span scorer.
        max_span_width (`int`, defaults to 10): longest answer span, in wordpieces.
        reader_layer_norm_eps (`float`, defaults to 1e-3): epsilon of the reader's span-scorer layer norm.
        reader_beam_size (`int`, defaults to 5): retrieved blocks the reader reads (also the search beam in eval mode).
        reader_seq_len (`int`, defaults to 320): maximum length of a question + block reader input.
        num_block_records (`int`, defaults to 13353718): rows of `RealmForOpenQA.block_emb`.
        searcher_beam_size (`int`, defaults to 5000): blocks retrieved per question in training mode.
        searcher_seq_len (`int`, defaults to 64): maximum question length; kept from early 4.x configs on the Hub.
        store_block_emb (`bool`, defaults to `True`): whether `RealmForOpenQA` keeps the block embeddings in its
            `block_emb` buffer (as in 4.x). `False` when they live in an external searcher (an index on disk).
        position_embedding_type (`str`, defaults to "absolute"): only absolute position embeddings are supported.

    Example:

    ```python
    >>> from realm_hf import RealmConfig, RealmEmbedder
    >>> config = RealmConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    >>> embedder = RealmEmbedder(config)
    ```
    """

    model_type = "realm"

    vocab_size: int = 30522
    hidden_size: int = 768
    retriever_proj_size: int = 128
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_candidates: int = 8
    intermediate_size: int = 3072
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float | int = 0.02
    layer_norm_eps: float | int = 1e-12
    span_hidden_size: int = 256
    max_span_width: int = 10
    reader_layer_norm_eps: float | int = 1e-3
    reader_beam_size: int = 5
    reader_seq_len: int = 320
    num_block_records: int = 13353718
    searcher_beam_size: int = 5000
    searcher_seq_len: int = 64
    store_block_emb: bool = True
    position_embedding_type: str = "absolute"
    # 4.x REALM passed pad_token_id=1 ([unused0] in the BERT vocab) as the embedding padding row; kept for parity.
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | None = 2
    # Read by the BERT layers that REALM composes; REALM is never a decoder.
    is_decoder: bool = False
    add_cross_attention: bool = False
    use_cache: bool = False
    # Not a base field in Transformers 5: without it nothing is tied (the MLM decoder biases included).
    tie_word_embeddings: bool = True

    def validate_architecture(self):
        """Checks the shapes that the modeling code relies on; raises `ValueError` naming the value received."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})."
            )
        if self.position_embedding_type not in _POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"position_embedding_type must be one of {_POSITION_EMBEDDING_TYPES}, got "
                f"{self.position_embedding_type!r}. Relative position embeddings were removed from BERT in "
                "Transformers 5 and no REALM checkpoint uses them."
            )
        for name in (
            "reader_beam_size",
            "searcher_beam_size",
            "max_span_width",
            "num_candidates",
            "num_block_records",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}.")


__all__ = ["RealmConfig"]

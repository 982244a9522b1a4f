"""RETRO (Borgeaud et al. 2022): a retrieval-enhanced causal LM with chunked cross-attention, its retrieval database
(frozen-BERT chunk keys searched with the project's searchers) and Trainer helpers.

`database`, `training` and `scaling` import `datasets`/`Trainer` machinery only when used; the model classes load eagerly.
"""

import importlib

from .configuration_retro import RetroConfig, paper_cca_layers
from .modeling_retro import (
    RetroCache,
    RetroCausalLMOutput,
    RetroForCausalLM,
    RetroGenerateOutput,
    RetroModel,
    RetroModelOutput,
    RetroPreTrainedModel,
)

_LAZY = {
    "RetroChunks": "database",
    "RetroDatabase": "database",
    "RetroRetriever": "database",
    "chunk_documents": "database",
    "compute_neighbours": "database",
    "embed_chunks": "database",
    "RetroCollator": "training",
    "RetroSequences": "training",
    "RetroTrainer": "training",
    "bits_per_byte": "training",
    "copy_baseline_bits_per_byte": "training",
    "evaluate_bits_per_byte": "training",
    "combined_chunks": "scaling",
    "database_scaling": "scaling",
    "evaluate_database_scaling": "scaling",
    "nested_document_subsets": "scaling",
    "plot_database_scaling": "scaling",
    "scaling_databases": "scaling",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RetroCache",
    "RetroCausalLMOutput",
    "RetroChunks",
    "RetroCollator",
    "RetroConfig",
    "RetroDatabase",
    "RetroForCausalLM",
    "RetroGenerateOutput",
    "RetroModel",
    "RetroModelOutput",
    "RetroPreTrainedModel",
    "RetroRetriever",
    "RetroSequences",
    "RetroTrainer",
    "bits_per_byte",
    "chunk_documents",
    "combined_chunks",
    "compute_neighbours",
    "copy_baseline_bits_per_byte",
    "database_scaling",
    "embed_chunks",
    "evaluate_bits_per_byte",
    "evaluate_database_scaling",
    "nested_document_subsets",
    "paper_cca_layers",
    "plot_database_scaling",
    "scaling_databases",
]

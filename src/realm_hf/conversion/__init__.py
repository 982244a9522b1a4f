"""Conversions into realm_hf checkpoints: from BERT-family checkpoints (warm starts) and from Google's original
TensorFlow REALM/ORQA checkpoints and corpora (read without TensorFlow)."""

from .bert import realm_config_from_bert, realm_model_from_bert
from .tf_checkpoint import (
    TFConversionPlan,
    UnmappedTFVariablesError,
    convert_tf_block_emb,
    convert_tf_blocks,
    convert_tf_checkpoint,
    load_tf_checkpoint,
    plan_tf_conversion,
    realm_config_from_tf_checkpoint,
    tf_blocks_to_document_store,
)
from .tf_reader import TFCheckpointReader, TFRecordFile

__all__ = [
    "TFCheckpointReader",
    "TFConversionPlan",
    "TFRecordFile",
    "UnmappedTFVariablesError",
    "convert_tf_block_emb",
    "convert_tf_blocks",
    "convert_tf_checkpoint",
    "load_tf_checkpoint",
    "plan_tf_conversion",
    "realm_config_from_bert",
    "realm_config_from_tf_checkpoint",
    "realm_model_from_bert",
    "tf_blocks_to_document_store",
]

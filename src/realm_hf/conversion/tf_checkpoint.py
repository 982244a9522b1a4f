"""Import Google's original TensorFlow REALM and ORQA checkpoints and corpora, without TensorFlow.

What Google released (`gs://realm-data`, `gs://orqa-data`) and where each piece goes:

| TF files | realm_hf |
|---|---|
| `cc_news_pretrained/embedder/variables/variables` (pretrained retriever) | `RealmEmbedder` / `RealmScorer` |
| `cc_news_pretrained/bert/variables/variables` (knowledge-augmented encoder) | `RealmKnowledgeAugEncoder` |
| `orqa_*_model_from_realm/export/best_default/checkpoint/model.ckpt-N` (fine-tuned) | `RealmForOpenQA`, `RealmReader` |
| `cc_news_pretrained/embedder/encoded/encoded.ckpt` (one variable, `block_emb [13353718, 128]`) | an index directory |
| `enwiki-20181220/blocks.tfr` (one UTF-8 block per record) | `block_records.safetensors` or a `DocumentStore` |

Variable names are translated by the two tables below: `TF_NAME_PREFIXES` says which part of the REALM system a
TF name belongs to and where it lands in that part, `PART_PREFIXES` where each part sits in each model class; then
`kernel`/`gamma` -> `weight` (a 2-D `kernel` is transposed), `beta`/`output_bias` -> `bias`, `*_embeddings` ->
`*_embeddings.weight` and `layer_N` -> `layer.N`. Optimizer state (`TF_SKIPPED_SEGMENTS`) is skipped; any other name
that no rule covers raises, listing every such name. The result equals what transformers 4.x's
`load_tf_weights_in_realm` loads (tests/fixtures/tf has the golden files), except that the unused MLM decoders
get their tied values (word embeddings, output bias) instead of staying random, and `RealmReader` also takes a plain
REALM BERT (`bert/...`, what ORQA starts its reader from), which 4.x silently ignored.
"""

from __future__ import annotations

import copy
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..modeling import (
    RealmConfig,
    RealmEmbedder,
    RealmForOpenQA,
    RealmKnowledgeAugEncoder,
    RealmReader,
    RealmScorer,
)
from .tf_reader import ChecksummedRows, TFCheckpointReader, TFRecordFile

logger = logging.get_logger(__name__)

# (TF name prefix, part of the REALM system, key prefix inside that part). The longest matching prefix wins.
TF_NAME_PREFIXES: tuple[tuple[str, str, str], ...] = (
    # REALM's pretrained BERT + MLM head (`cc_news_pretrained/bert`); ORQA initialises its reader from it.
    ("bert/", "bert", "realm."),
    ("cls/", "bert", "cls."),
    # ORQA's fine-tuned reader: BERT, MLM head, span scorer (Keras dense -> dense_1, layer_normalization eps 1e-3).
    ("reader/module/bert/", "reader", "realm."),
    ("reader/module/cls/", "reader", "cls."),
    ("reader/dense/", "reader", "qa_outputs.dense_intermediate."),
    ("reader/dense_1/", "reader", "qa_outputs.dense_output."),
    ("reader/layer_normalization/", "reader", "qa_outputs.layer_normalization."),
    # ORQA's fine-tuned question embedder: the TF Hub module nests one `module/` deeper than the pretrained one.
    ("module/module/module/module/bert/", "embedder", "realm."),
    ("module/module/module/module/cls/predictions/", "embedder", "cls.predictions."),
    ("module/module/module/LayerNorm/", "embedder", "cls.LayerNorm."),
    ("module/module/module/dense/", "embedder", "cls.dense."),
    # REALM's pretrained embedder (`cc_news_pretrained/embedder`): BERT, MLM head, 128-d projection.
    ("module/module/module/bert/", "embedder", "realm."),
    ("module/module/module/cls/predictions/", "embedder", "cls.predictions."),
    ("module/module/LayerNorm/", "embedder", "cls.LayerNorm."),
    ("module/module/dense/", "embedder", "cls.dense."),
)
# Whole TF names (not prefixes): the pre-computed block embeddings (`encoded/encoded.ckpt`).
TF_EXACT_NAMES: dict[str, tuple[str, str]] = {"block_emb": ("block_emb", "block_emb")}

# model type -> {part: prefix of that part's keys in the model}. Parts a model lacks are skipped, not errors.
PART_PREFIXES: dict[str, dict[str, str]] = {
    "openqa": {"embedder": "embedder.", "reader": "reader.", "bert": "reader.", "block_emb": ""},
    "reader": {"reader": "", "bert": ""},
    "embedder": {"embedder": ""},
    "scorer": {"embedder": "embedder."},
    "encoder": {"bert": ""},
}
MODEL_CLASSES = {
    "openqa": RealmForOpenQA,
    "reader": RealmReader,
    "embedder": RealmEmbedder,
    "scorer": RealmScorer,
    "encoder": RealmKnowledgeAugEncoder,
}

# Per path segment, after the prefix.
TF_SEGMENT_RENAMES = {"kernel": "weight", "gamma": "weight", "beta": "bias", "output_bias": "bias"}
# A TF name with any of these segments is training state, not a weight: skipped.
TF_SKIPPED_SEGMENTS = frozenset({
    "adam_m", "adam_v",  # BERT's AdamWeightDecayOptimizer slots
    "AdamWeightDecayOptimizer", "AdamWeightDecayOptimizer_1",
    "global_step", "beta1_power", "beta2_power",  # tf.train.AdamOptimizer
    "_CHECKPOINTABLE_OBJECT_GRAPH",  # object-based checkpoints' metadata
})  # fmt: skip

# Weights no TF variable holds: the MLM decoders, which TF ties to the word embeddings and the output bias.
_DERIVED_KEYS = {
    "cls.predictions.decoder.weight": "realm.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


class UnmappedTFVariablesError(ValueError):
    """Raised when a checkpoint holds variables that no rule of the mapping tables covers (they are all listed)."""


@dataclass
class TFConversionPlan:
    r"""
    Which TF variables go where, for one checkpoint and one model type.

    Attributes:
        model_type (`str`): one of `MODEL_CLASSES`.
        mapping (`dict[str, str]`): TF name -> realm_hf state-dict key.
        transposed (`set[str]`): TF names whose (2-D `kernel`) value is transposed.
        skipped (`dict[str, str]`): TF name -> why it is not loaded (optimizer state, or a part this model lacks).
        unmapped (`list[str]`): TF names no rule covers.
    """

    model_type: str
    mapping: dict[str, str] = field(default_factory=dict)
    transposed: set[str] = field(default_factory=set)
    skipped: dict[str, str] = field(default_factory=dict)
    unmapped: list[str] = field(default_factory=list)


def _check_model_type(model_type: str) -> None:
    if model_type not in MODEL_CLASSES:
        raise ValueError(f"expected a model type among {sorted(MODEL_CLASSES)}, received {model_type!r}")


def tf_path_to_key(path: str) -> str:
    """`encoder/layer_3/attention/self/query/kernel` -> `encoder.layer.3.attention.self.query.weight`."""
    segments = []
    for segment in path.split("/"):
        if match := re.fullmatch(r"layer_(\d+)", segment):
            segments += ["layer", match.group(1)]
        elif segment in TF_SEGMENT_RENAMES:
            segments.append(TF_SEGMENT_RENAMES[segment])
        elif segment.endswith("_embeddings"):
            segments += [segment, "weight"]
        else:
            segments.append(segment)
    return ".".join(segments)


def plan_tf_conversion(variables: dict[str, tuple[int, ...]] | Iterable[str], model_type: str) -> TFConversionPlan:
    """Maps TF variable names to the state-dict keys of `model_type` (see the module docstring); no data is read."""
    _check_model_type(model_type)
    plan = TFConversionPlan(model_type)
    parts = PART_PREFIXES[model_type]
    for name in variables:
        if TF_SKIPPED_SEGMENTS.intersection(name.split("/")):
            plan.skipped[name] = "optimizer state"
            continue
        if name in TF_EXACT_NAMES:
            part, key = TF_EXACT_NAMES[name]
            rest = None
        else:
            rules = [rule for rule in TF_NAME_PREFIXES if name.startswith(rule[0])]
            if not rules:
                plan.unmapped.append(name)
                continue
            prefix, part, key_prefix = max(rules, key=lambda rule: len(rule[0]))
            rest = name[len(prefix) :]
            key = key_prefix + tf_path_to_key(rest)
        if part not in parts:
            plan.skipped[name] = f"part of the {part}, which a {MODEL_CLASSES[model_type].__name__} does not have"
            continue
        plan.mapping[name] = parts[part] + key
        if rest is not None and rest.split("/")[-1] == "kernel":
            plan.transposed.add(name)
    return plan


def _as_reader(checkpoint, verify_checksums: bool) -> TFCheckpointReader:
    if isinstance(checkpoint, TFCheckpointReader):
        return checkpoint
    return TFCheckpointReader(checkpoint, verify_checksums=verify_checksums)


def _model_type_of(model) -> str:
    for model_type, model_class in MODEL_CLASSES.items():
        if type(model) is model_class:
            return model_type
    raise TypeError(f"expected one of {[c.__name__ for c in MODEL_CLASSES.values()]}, received {type(model).__name__}")


def _raise_unmapped(plan: TFConversionPlan, checkpoint: TFCheckpointReader, problems: list[str]) -> None:
    lines = [f"  {name}: no rule in TF_NAME_PREFIXES covers it" for name in plan.unmapped] + problems
    raise UnmappedTFVariablesError(
        f"{checkpoint.prefix}: {len(lines)} TF variable(s) cannot be loaded into a "
        f"{MODEL_CLASSES[plan.model_type].__name__} (optimizer slots {sorted(TF_SKIPPED_SEGMENTS)} are skipped; "
        "anything else must map to a weight):\n" + "\n".join(lines)
    )


def load_tf_checkpoint(model, checkpoint, *, verify_checksums: bool = True) -> TFConversionPlan:
    r"""
    Copies the weights of a TensorFlow REALM/ORQA checkpoint into `model` (a realm_hf model), name by name.

    Call it once per checkpoint, e.g. the ORQA checkpoint and then `encoded.ckpt` for `block_emb`.

    Args:
        model: a `RealmForOpenQA`, `RealmReader`, `RealmEmbedder`, `RealmScorer` or `RealmKnowledgeAugEncoder`.
        checkpoint (`str`, `os.PathLike` or [`TFCheckpointReader`]): the checkpoint prefix, `.index` or directory.
        verify_checksums (`bool`, defaults to `True`): check each tensor's crc32c.

    Returns:
        [`TFConversionPlan`]: what was loaded where, and what was skipped. `plan.mapping.values()` are the keys
        loaded; the MLM decoders tied to a loaded key are filled too.

    Raises:
        UnmappedTFVariablesError: a variable maps to no weight of `model` (all such variables are listed).
        ValueError: a variable's shape differs from its weight's (both named), or a file is damaged.
    """
    reader = _as_reader(checkpoint, verify_checksums)
    plan = plan_tf_conversion(reader.variables(), _model_type_of(model))
    state = model.state_dict()
    if "block_emb" in plan.mapping and "block_emb" not in state:
        del plan.mapping["block_emb"]
        plan.skipped["block_emb"] = "block embeddings, which this model keeps in a searcher (convert_tf_block_emb)"
    problems, sources = [], {}
    for name, key in plan.mapping.items():
        if key not in state:
            problems.append(f"  {name}: maps to {key!r}, which the model has no weight for")
        elif key in sources:
            problems.append(f"  {name}: maps to {key!r}, which {sources[key]!r} already fills")
        else:
            sources[key] = name
    if plan.unmapped or problems:
        _raise_unmapped(plan, reader, problems)

    shape_errors = []
    for name, key in plan.mapping.items():
        shape = reader.shape(name)
        shape = shape[::-1] if name in plan.transposed else shape
        if tuple(state[key].shape) != tuple(shape):
            shape_errors.append(f"  {key}: expected shape {tuple(state[key].shape)}, received {shape} from {name!r}")
    if shape_errors:
        raise ValueError(
            f"{reader.prefix}: the checkpoint does not fit the {type(model).__name__}'s config (check hidden_size, "
            f"vocab_size, num_block_records, ...):\n" + "\n".join(shape_errors)
        )
    with torch.no_grad():
        for name, key in plan.mapping.items():
            value = reader.read(name)
            state[key].copy_(torch.from_numpy(np.ascontiguousarray(value.T if name in plan.transposed else value)))
        loaded = set(plan.mapping.values())
        for key, tensor in state.items():
            for suffix, source_suffix in _DERIVED_KEYS.items():
                source = key[: -len(suffix)] + source_suffix
                if key.endswith(suffix) and key not in loaded and source in loaded:
                    tensor.copy_(state[source])
    logger.info(f"Loaded {len(plan.mapping)} variables from {reader.prefix} ({len(plan.skipped)} skipped)")
    return plan


def _tied_to(key: str, loaded: set[str]) -> bool:
    return any(
        key.endswith(suffix) and key[: -len(suffix)] + source in loaded for suffix, source in _DERIVED_KEYS.items()
    )


def realm_config_from_tf_checkpoint(checkpoints, model_type: str = "openqa", **overrides) -> RealmConfig:
    r"""
    A `RealmConfig` whose sizes are read from the variables' shapes: `vocab_size`, `hidden_size`,
    `num_hidden_layers`, `intermediate_size`, `max_position_embeddings`, `type_vocab_size`, `retriever_proj_size`,
    `span_hidden_size` and `num_block_records` (from `block_emb`). Other fields keep RealmConfig's defaults, which
    are Google's (e.g. 12 attention heads, `gelu_new`); `overrides` set any field.

    Args:
        checkpoints: one checkpoint (path or [`TFCheckpointReader`]) or a list of them (e.g. ORQA + `encoded.ckpt`).
    """
    if isinstance(checkpoints, (str, os.PathLike, TFCheckpointReader)):
        checkpoints = [checkpoints]
    shapes = {}
    for checkpoint in checkpoints:
        reader = _as_reader(checkpoint, verify_checksums=False)
        plan = plan_tf_conversion(reader.variables(), model_type)
        for name, key in plan.mapping.items():
            shape = reader.shape(name)
            shapes[key] = shape[::-1] if name in plan.transposed else shape

    def find(suffix: str, axis: int) -> int | None:
        return next((shape[axis] for key, shape in shapes.items() if key.endswith(suffix)), None)

    layers = {int(m.group(1)) for key in shapes if (m := re.search(r"realm\.encoder\.layer\.(\d+)\.", key))}
    fields = {
        "vocab_size": find("realm.embeddings.word_embeddings.weight", 0),
        "hidden_size": find("realm.embeddings.word_embeddings.weight", 1),
        "max_position_embeddings": find("realm.embeddings.position_embeddings.weight", 0),
        "type_vocab_size": find("realm.embeddings.token_type_embeddings.weight", 0),
        "num_hidden_layers": max(layers) + 1 if layers else None,
        "intermediate_size": find("realm.encoder.layer.0.intermediate.dense.weight", 0),
        "retriever_proj_size": find("cls.dense.weight", 0) or find("block_emb", 1),
        "span_hidden_size": find("qa_outputs.dense_output.weight", 1),
        "num_block_records": find("block_emb", 0),
    }
    fields = {name: value for name, value in fields.items() if value is not None}
    fields.update(overrides)
    hidden_size = fields.get("hidden_size", RealmConfig.hidden_size)
    num_heads = fields.get("num_attention_heads", RealmConfig.num_attention_heads)
    if hidden_size % num_heads:
        raise ValueError(
            f"hidden_size {hidden_size} (read from the checkpoint) is not a multiple of num_attention_heads "
            f"{num_heads}; pass num_attention_heads (or a config) for this checkpoint"
        )
    return RealmConfig(**fields)


def convert_tf_checkpoint(
    checkpoint,
    model_type: str = "openqa",
    *,
    config: RealmConfig | None = None,
    block_emb=None,
    strict: bool = True,
    verify_checksums: bool = True,
):
    r"""
    Builds a realm_hf model from a TensorFlow REALM/ORQA checkpoint, in memory.

    Args:
        checkpoint (`str`, `os.PathLike` or [`TFCheckpointReader`]): the checkpoint (prefix, `.index` or directory).
        model_type (`str`, defaults to `"openqa"`): `"openqa"`, `"reader"`, `"embedder"`, `"scorer"` or `"encoder"`.
        config (`RealmConfig`, *optional*): defaults to [`realm_config_from_tf_checkpoint`] (sizes from the shapes,
            everything else Google's defaults).
        block_emb (*optional*): for `"openqa"`, the checkpoint holding `block_emb` (`encoded/encoded.ckpt`), unless
            `checkpoint` holds it itself; it is read into the model's `block_emb` buffer (6.8 GB for the full corpus: for that, write an index with
            [`convert_tf_block_emb`] and load the model with `searcher=`). Without it the model has
            `store_block_emb=False` and needs a searcher.
        strict (`bool`, defaults to `True`): raise if a weight of the model gets no value from the checkpoint(s).
        verify_checksums (`bool`, defaults to `True`): check each tensor's crc32c.

    Returns:
        The model, in eval mode. Its `tf_conversion_plans` attribute lists the [`TFConversionPlan`] of each file.

    Example:

    ```python
    >>> from realm_hf.conversion import convert_tf_checkpoint
    >>> model = convert_tf_checkpoint("orqa_nq_model_from_realm/export/best_default/checkpoint", "openqa",
    ...                               block_emb="cc_news_pretrained/embedder/encoded/encoded.ckpt")
    >>> model.save_pretrained("realm-orqa-nq")
    ```
    """
    _check_model_type(model_type)
    if block_emb is not None and model_type != "openqa":
        raise ValueError(f"block_emb is only loaded into an 'openqa' model, received model_type {model_type!r}")
    readers = [_as_reader(checkpoint, verify_checksums)]
    if block_emb is not None:
        readers.append(_as_reader(block_emb, verify_checksums))
    config = realm_config_from_tf_checkpoint(readers, model_type) if config is None else copy.deepcopy(config)
    if model_type == "openqa":
        holder = next((reader for reader in readers if "block_emb" in reader), None)
        config.store_block_emb = holder is not None
        if holder is not None:
            config.num_block_records = holder.shape("block_emb")[0]
    model = MODEL_CLASSES[model_type](config)
    plans = [load_tf_checkpoint(model, reader, verify_checksums=verify_checksums) for reader in readers]
    loaded = {key for plan in plans for key in plan.mapping.values()}
    missing = [key for key in model.state_dict() if key not in loaded and not _tied_to(key, loaded)]
    if missing and strict:
        sources = ", ".join(str(reader.prefix) for reader in readers)
        modules = Counter(".".join(key.split(".")[:2]) for key in missing)
        raise ValueError(
            f"{sources} leave {len(missing)} weight(s) of the {type(model).__name__} without a value (wrong "
            f"model_type, or a checkpoint missing?); per module: {dict(modules)}; first: {missing[:5]}. Pass "
            "strict=False to keep their random initialisation."
        )
    if missing:
        logger.warning(f"{len(missing)} weight(s) keep their random initialisation: {missing[:10]}")
    model.tf_conversion_plans = plans
    return model.eval()


def convert_tf_block_emb(
    checkpoint,
    output_dir: str | os.PathLike,
    *,
    variable: str = "block_emb",
    shard_size: int = 262144,
    dtype: str = "float32",
    verify_checksums: bool = True,
    progress: bool = True,
) -> dict:
    r"""
    Writes the `block_emb` variable of a TF checkpoint (`encoded/encoded.ckpt`, `[num_blocks, 128]`) as a realm_hf
    index directory (see `realm_hf.retrieval.write_index`), streaming: the tensor is memory-mapped and copied one
    shard at a time, its crc32c checked on the way; the manifest is written last, so a failure leaves no loadable
    index. Open it with `realm_hf.retrieval.ExactSearcher.from_index(output_dir)`.

    Returns:
        `dict`: the index manifest.
    """
    from ..retrieval.index_builder import write_index

    reader = _as_reader(checkpoint, verify_checksums)
    if variable not in reader:
        raise KeyError(f"expected a variable {variable!r} in {reader.prefix}, found {sorted(reader)[:10]}")
    shape = reader.shape(variable)
    if len(shape) != 2:
        raise ValueError(f"{reader.prefix}: expected {variable!r} of shape (num_blocks, dim), received {shape}")
    with tqdm(total=shape[0], unit="block", desc="block_emb", disable=not progress) as bar:
        rows = ChecksummedRows(reader, variable, on_rows=bar.update)
        provenance = {"source": "tensorflow", "checkpoint": str(reader.prefix), "variable": variable}
        return write_index(rows, output_dir, shard_size=shard_size, provenance=provenance, dtype=dtype)


class _CountedRecords:
    """A TFRecord stream with a length, so that `save_block_records` streams it instead of listing it."""

    def __init__(self, records: TFRecordFile, bar):
        self._records, self._bar = records, bar

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[bytes]:
        for record in self._records:
            self._bar.update(1)
            yield record


def convert_tf_blocks(
    blocks: str | os.PathLike, output: str | os.PathLike, *, verify_checksums: bool = True, progress: bool = True
) -> Path:
    r"""
    Writes ORQA's `blocks.tfr` (a TFRecord of UTF-8 block texts) as `block_records.safetensors` (pickle-free,
    memory-mapped by `realm_hf.retrieval.load_block_records` and `RealmRetriever.from_pretrained`), streaming and
    atomically. `output` is a file or an existing directory. Returns the path written.
    """
    from ..retrieval.block_records import save_block_records

    records = TFRecordFile(blocks, verify_checksums=verify_checksums)
    with tqdm(total=len(records), unit="block", desc=Path(blocks).name, disable=not progress) as bar:
        return save_block_records(_CountedRecords(records, bar), output)


def tf_blocks_to_document_store(
    blocks: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    titles: str | os.PathLike | None = None,
    verify_checksums: bool = True,
    progress: bool = True,
):
    r"""
    Writes ORQA's `blocks.tfr` (and, optionally, the aligned `titles.tfr`) as a saved `DocumentStore`, streaming.

    Without `titles` the blocks are untitled, as ORQA's reader saw them. With titles, the store keeps them, and the
    block text realm_hf embeds and reads becomes `"title: text"` (`realm_hf.retrieval.block_text`), which differs
    from the inputs ORQA was trained on.

    Returns:
        `DocumentStore`: the saved store.
    """
    from ..retrieval.document_store import DocumentStore

    block_file = TFRecordFile(blocks, verify_checksums=verify_checksums)
    title_file = TFRecordFile(titles, verify_checksums=verify_checksums) if titles is not None else None
    if title_file is not None and len(title_file) != len(block_file):
        raise ValueError(f"expected one title per block: {block_file.path.name} has {len(block_file)} records, "
                         f"{title_file.path.name} has {len(title_file)}")  # fmt: skip

    def rows() -> Iterator[dict]:
        title_records = iter(title_file) if title_file is not None else None
        for index, record in enumerate(tqdm(block_file, total=len(block_file), unit="block", disable=not progress)):
            title = next(title_records) if title_records is not None else b""
            try:
                yield {"title": title.decode("utf-8"), "text": record.decode("utf-8")}
            except UnicodeDecodeError as error:
                raise ValueError(f"{block_file.path.name}: record {index} is not valid UTF-8 ({error})") from error

    store = DocumentStore.from_records(rows())
    store.save(output_dir)
    return store


__all__ = [
    "MODEL_CLASSES",
    "PART_PREFIXES",
    "TF_EXACT_NAMES",
    "TF_NAME_PREFIXES",
    "TF_SEGMENT_RENAMES",
    "TF_SKIPPED_SEGMENTS",
    "TFConversionPlan",
    "UnmappedTFVariablesError",
    "convert_tf_block_emb",
    "convert_tf_blocks",
    "convert_tf_checkpoint",
    "load_tf_checkpoint",
    "plan_tf_conversion",
    "realm_config_from_tf_checkpoint",
    "tf_blocks_to_document_store",
    "tf_path_to_key",
]

"""`realm-hf convert tf`: Google's original TensorFlow REALM/ORQA checkpoints and corpora as a realm_hf directory."""

import argparse
import json
import sys
from pathlib import Path

from .arguments import refuse_to_overwrite

HELP = """\
Reads TensorFlow checkpoints (tensor bundles: PREFIX.index + PREFIX.data-*) and TFRecord files directly: TensorFlow
is not needed. Every variable is mapped by the table in realm_hf.conversion.tf_checkpoint; optimizer slots and
global_step are skipped, any other unknown name is an error that lists it.

  # ORQA fine-tuned on NQ, with the pretrained block embeddings and the Wikipedia blocks
  realm-hf convert tf --checkpoint orqa_nq_model_from_realm/export/best_default/checkpoint \\
      --block-emb cc_news_pretrained/embedder/encoded/encoded.ckpt --blocks enwiki-20181220/blocks.tfr \\
      --vocab vocab.txt --output realm-orqa-nq
  realm-hf ask --model realm-orqa-nq "who wrote hamlet?"

  # REALM's pretrained retriever, or its knowledge-augmented encoder
  realm-hf convert tf --checkpoint cc_news_pretrained/embedder/variables/variables --model-type embedder --output emb
  realm-hf convert tf --checkpoint cc_news_pretrained/bert/variables/variables --model-type encoder --output enc

Output (in --output): config.json + model.safetensors; with --block-emb an index under index/ (the model then has
store_block_emb false and searches the index); with --blocks the corpus: index/documents/ (a DocumentStore) when an
index is written, else block_records.safetensors; with --vocab the tokenizer files. Sizes are read from the shapes;
other settings are Google's defaults (12 attention heads, gelu_new) unless --config gives a config.
"""


def _load_config(path: str):
    from realm_hf import RealmConfig

    location = Path(path)
    if location.is_dir():
        return RealmConfig.from_pretrained(location)
    try:
        return RealmConfig(**json.loads(location.read_text(encoding="utf-8")))
    except json.JSONDecodeError as error:
        raise ValueError(f"--config {path}: expected a REALM config.json (one JSON object), got invalid JSON: "
                         f"{error}") from None  # fmt: skip


def cmd_tf(args) -> int:
    from realm_hf.errors import FileFormatError, UsageError

    # Errors reach `realm-hf`'s one handler: one `realm-hf convert tf: error: ...` line, exit 2 for usage, else 1.
    if not (args.checkpoint or args.block_emb or args.blocks):
        raise UsageError("give at least one of --checkpoint, --block-emb, --blocks")
    if args.titles and not (args.blocks and args.block_emb):
        raise UsageError("--titles needs --blocks and --block-emb (titles live in the document store)")
    try:
        return _convert_tf(args)
    except KeyError as error:  # a variable the mapping expects is not in the checkpoint: the message says which
        raise FileFormatError(str(error).strip("'\"")) from error


def _convert_tf(args) -> int:
    from realm_hf.conversion.tf_checkpoint import (
        convert_tf_block_emb,
        convert_tf_blocks,
        convert_tf_checkpoint,
        realm_config_from_tf_checkpoint,
        tf_blocks_to_document_store,
    )
    from realm_hf.conversion.tf_reader import TFCheckpointReader
    from realm_hf.retrieval.index_builder import DOCUMENTS_DIR

    output = Path(args.output)
    refuse_to_overwrite(output)
    output.mkdir(parents=True, exist_ok=True)
    verify = not args.no_verify
    progress = not args.quiet
    written = []
    if args.checkpoint:
        with_index = args.block_emb is not None and args.model_type == "openqa"
        sources = [args.checkpoint] + ([args.block_emb] if with_index else [])
        config = (
            _load_config(args.config) if args.config else realm_config_from_tf_checkpoint(sources, args.model_type)
        )
        if with_index:  # the model searches the index written below: its size is the index's
            config.num_block_records = TFCheckpointReader(args.block_emb, verify_checksums=False).shape("block_emb")[0]
        model = convert_tf_checkpoint(args.checkpoint, args.model_type, config=config, strict=not args.lenient,
                                      verify_checksums=verify)  # fmt: skip
        model.save_pretrained(output)
        plan = model.tf_conversion_plans[0]
        written.append(f"{type(model).__name__} ({len(plan.mapping)} variables mapped, {len(plan.skipped)} skipped)")
        left = sorted({why.split(",")[0] for why in plan.skipped.values() if why.startswith("part of the ")})
        # weights the checkpoint holds and this model type has no place for: say so, with the way to keep them
        if left:
            print(f"note: --model-type {args.model_type} leaves out what the checkpoint also holds ({'; '.join(left)}); "
                  "--model-type openqa converts a whole ORQA/REALM open-QA checkpoint", file=sys.stderr)  # fmt: skip
    if args.block_emb:
        manifest = convert_tf_block_emb(args.block_emb, output / "index", shard_size=args.shard_size, dtype=args.dtype,
                                        verify_checksums=verify, progress=progress)  # fmt: skip
        written.append(f"index/ ({manifest['num_blocks']} x {manifest['dim']} block embeddings)")
    if args.blocks:
        if args.block_emb:
            store = tf_blocks_to_document_store(args.blocks, output / "index" / DOCUMENTS_DIR, titles=args.titles,
                                                verify_checksums=verify, progress=progress)  # fmt: skip
            written.append(f"index/{DOCUMENTS_DIR}/ ({len(store)} blocks)")
        else:
            path = convert_tf_blocks(args.blocks, output / "block_records.safetensors", verify_checksums=verify,
                                     progress=progress)  # fmt: skip
            written.append(path.name)
    if args.vocab:
        from realm_hf import RealmTokenizer

        RealmTokenizer(vocab_file=args.vocab, do_lower_case=not args.cased).save_pretrained(output)
        written.append("tokenizer")
    print(f"wrote {', '.join(written)} to {output}")
    return 0


def add_parser(subparsers) -> None:
    convert = subparsers.add_parser("convert", help="import checkpoints from other formats (TensorFlow REALM/ORQA)",
                                    description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = convert.add_subparsers(dest="convert_command", metavar="SUBCOMMAND", required=True)

    tf = commands.add_parser("tf", help="Google's TensorFlow REALM/ORQA checkpoints, block_emb and blocks.tfr",
                             description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    tf.add_argument("--checkpoint", help="TF checkpoint: prefix (model.ckpt-300000), .index file or directory")
    tf.add_argument("--model-type", default="openqa", choices=["openqa", "reader", "embedder", "scorer", "encoder"],
                    help="realm_hf class to build (default: openqa)")  # fmt: skip
    tf.add_argument("--config", help="RealmConfig JSON file or checkpoint directory (default: sizes read from the "
                                     "checkpoint, the rest Google's defaults)")  # fmt: skip
    tf.add_argument("--block-emb", help="TF checkpoint holding block_emb (encoded/encoded.ckpt): written as index/")
    tf.add_argument("--blocks", help="blocks.tfr: one UTF-8 block per TFRecord")
    tf.add_argument("--titles", help="titles.tfr aligned with --blocks (stored as document titles)")
    tf.add_argument("--vocab", help="WordPiece vocab.txt to save a RealmTokenizer with the model")
    tf.add_argument("--cased", action="store_true", help="the vocabulary is cased (default: uncased, as Google's)")
    tf.add_argument("--output", required=True, help="directory to write")
    tf.add_argument("--shard-size", type=int, default=262144, help="blocks per index shard (default: 262144)")
    tf.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="index dtype (default float32)")
    tf.add_argument("--no-verify", action="store_true", help="skip crc32c checks (fast without google-crc32c)")
    tf.add_argument("--lenient", action="store_true", help="keep random weights the checkpoint does not cover")
    tf.add_argument("--quiet", action="store_true", help="no progress bars")
    tf.set_defaults(func=cmd_tf)


__all__ = ["add_parser"]

"""`realm-hf convert tf`: Google's original TensorFlow REALM/ORQA checkpoints and corpora as a realm_hf directory."""

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from .arguments import check_writable_directory, positive_int, refuse_to_overwrite

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
    from realm_hf.errors import FileFormatError, MissingFileError, not_utf8_error

    location = Path(path)
    if location.is_dir():
        if not (location / "config.json").is_file():
            raise MissingFileError(f"--config {path}: the directory holds no config.json; expected a REALM config.json "
                                   "file or a directory holding one")  # fmt: skip
        return RealmConfig.from_pretrained(location)
    if not location.exists():
        raise MissingFileError(f"--config {path}: no such file (expected a REALM config.json file or a directory "
                               "holding one)")  # fmt: skip
    data = location.read_bytes()
    try:
        fields = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise not_utf8_error(f"--config {path}", data, error.start, path=location) from None
    except json.JSONDecodeError as error:
        raise FileFormatError(f"--config {path}: expected a REALM config.json (one JSON object), got invalid JSON: "
                              f"{error}", path=location) from None  # fmt: skip
    if not isinstance(fields, dict):
        raise FileFormatError(f"--config {path}: expected a REALM config.json (one JSON object), got a JSON "
                              f"{type(fields).__name__}", path=location)  # fmt: skip
    return RealmConfig(**fields)


def _check_file(path: str | None, option: str, expected: str) -> None:
    """Raises `MissingFileError` naming `option` unless `path` (when given) is a file."""
    from realm_hf.errors import MissingFileError

    if path is None or Path(path).is_file():
        return
    received = "is a directory" if Path(path).is_dir() else "no such file"
    raise MissingFileError(f"{option} {path!r}: {received} (expected {expected})")


def _check_inputs(args):
    """Checks what `convert tf` reads before anything is written, and returns `(config, tokenizer)`: `--output` can be
    written (a new or empty directory), `--config` and `--vocab` load, `--blocks` and `--titles` are files, and
    `--checkpoint` and `--block-emb` are checkpoints (their index files read, not their data)."""
    from realm_hf.conversion.tf_reader import TFCheckpointReader
    from realm_hf.errors import InputError

    output = Path(args.output)
    refuse_to_overwrite(output)
    check_writable_directory(args.output, "--output", purpose="write the converted model in (a new or empty one)")
    config = _load_config(args.config) if args.config else None
    tokenizer = None
    if args.vocab:
        _check_file(args.vocab, "--vocab", "a WordPiece vocab.txt, one token per line")
        from realm_hf import RealmTokenizer

        try:
            tokenizer = RealmTokenizer(vocab_file=args.vocab, do_lower_case=not args.cased)
        except Exception as error:  # the tokenizers library raises a bare Exception
            raise InputError(f"--vocab {args.vocab}: expected a WordPiece vocab.txt, one token per line; it could not "
                             f"be read ({str(error).strip() or type(error).__name__})") from None  # fmt: skip
    _check_file(args.blocks, "--blocks", "blocks.tfr, a TFRecord file of one UTF-8 block per record")
    _check_file(args.titles, "--titles", "titles.tfr, a TFRecord file of one title per block")
    for path in (args.checkpoint, args.block_emb):
        if path:
            TFCheckpointReader(path, verify_checksums=False)  # a missing or broken checkpoint says so, with its files
    return config, tokenizer


def cmd_tf(args) -> int:
    from realm_hf.errors import FileFormatError, InputError, UsageError

    # Errors reach `realm-hf`'s one handler: one `realm-hf convert tf: error: ...` line, exit 2 for usage, else 1.
    if not (args.checkpoint or args.block_emb or args.blocks):
        raise UsageError("give at least one of --checkpoint, --block-emb, --blocks")
    if args.titles and not (args.blocks and args.block_emb):
        raise UsageError("--titles needs --blocks and --block-emb (titles live in the document store)")
    config, tokenizer = _check_inputs(args)
    # Everything is written in a hidden sibling, renamed to --output once complete: a failed or interrupted convert
    # leaves no partial --output to refuse the corrected rerun (the sibling is removed, and one a killed run left is
    # cleared by the next).
    output = Path(args.output)
    staging = output.absolute().parent / f".{output.absolute().name}.converting"
    if output.is_dir():  # an empty --output was checked itself; the staging directory goes beside it
        check_writable_directory(staging.parent, "--output's parent")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        written = _convert_tf(args, staging, config, tokenizer)
        if output.is_dir():  # empty (refuse_to_overwrite let nothing else through), and perhaps the working directory
            for entry in staging.iterdir():
                entry.rename(output / entry.name)
        else:
            staging.rename(output)
    except KeyError as error:  # a variable the mapping expects is not in the checkpoint: the message says which
        raise FileFormatError(str(error).strip("'\"")) from error
    except ValueError as error:
        reworded = _in_command_line_terms(str(error))
        if reworded == str(error):
            raise
        raise InputError(reworded) from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"wrote {', '.join(written)} to {output}")
    return 0


# The library's messages name its Python arguments; from the command line, the flags that set them.
_COMMAND_LINE_TERMS = (
    ("pass num_attention_heads (or a config) for this checkpoint",
     "pass --config with a config.json that sets num_attention_heads (and the sizes) for this checkpoint"),
    ("Pass strict=False to keep their random initialisation", "Pass --lenient to keep their random initialisation"),
    ("(wrong model_type, or a checkpoint missing?)", "(wrong --model-type, or a checkpoint missing?)"),
)  # fmt: skip


def _in_command_line_terms(message: str) -> str:
    """`message` with the Python arguments it names replaced by the command-line flags, and "1 weight(s)" by "1
    weight" (or "2 weights")."""
    for python, flags in _COMMAND_LINE_TERMS:
        message = message.replace(python, flags)
    return re.sub(r"\b(\d+) weight\(s\)", lambda found: f"{found[1]} weight" + ("" if found[1] == "1" else "s"),
                  message)  # fmt: skip


def _convert_tf(args, output: Path, config, tokenizer) -> list[str]:
    """Converts what `args` name into `output` (created); returns what it wrote, for the summary line."""
    from realm_hf.conversion.tf_checkpoint import (
        convert_tf_block_emb,
        convert_tf_blocks,
        convert_tf_checkpoint,
        realm_config_from_tf_checkpoint,
        tf_blocks_to_document_store,
    )
    from realm_hf.conversion.tf_reader import TFCheckpointReader
    from realm_hf.retrieval.index_builder import DOCUMENTS_DIR

    output.mkdir(parents=True)
    verify = not args.no_verify
    progress = not args.quiet
    written = []
    if args.checkpoint:
        with_index = args.block_emb is not None and args.model_type == "openqa"
        sources = [args.checkpoint] + ([args.block_emb] if with_index else [])
        config = config or realm_config_from_tf_checkpoint(sources, args.model_type)
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
    if tokenizer is not None:
        tokenizer.save_pretrained(output)
        written.append("tokenizer")
    return written


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
    tf.add_argument("--shard-size", type=positive_int, default=262144, help="blocks per index shard (default: 262144)")
    tf.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="index dtype (default float32)")
    tf.add_argument("--no-verify", action="store_true", help="skip crc32c checks (fast without google-crc32c)")
    tf.add_argument("--lenient", action="store_true", help="keep random weights the checkpoint does not cover")
    tf.add_argument("--quiet", action="store_true", help="no progress bars")
    tf.set_defaults(func=cmd_tf)


__all__ = ["add_parser"]

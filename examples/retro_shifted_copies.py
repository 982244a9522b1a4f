"""Can a small RETRO learn to read a neighbour that is not aligned with the text it continues? (issue 18)

Random tokens, so the next chunk cannot be guessed from what precedes it: only read from the neighbours of the
chunk before, whose continuation holds it. With `--shift S` each neighbour starts with up to S random tokens (so
the text it shares with the sequence sits S positions later than where CCA's positions put it), and with
`--indel P` tokens are dropped or inserted along the way with probability P (a paraphrase's drift). Copying by
position then fails; the model has to find by content where in the neighbour it is.

Trains the same small RETRO with and without the encoder's learned relative-position logits
(`encoder_relative_position_buckets`) and prints held-out loss per token with retrieval on, off and with shuffled
neighbours:

    python examples/retro_shifted_copies.py --steps 1000              # about 5 minutes on 2 CPU cores
    python examples/retro_shifted_copies.py --steps 3000 --indel 0.2

docs/retro.md ("Session 16") gives what it printed.
"""

from __future__ import annotations

import argparse
import time

import torch

from realm_hf.retro import RetroConfig, RetroForCausalLM


def make_batch(size: int, chunks: int, chunk_size: int, vocab: int, shift: int, indel: float,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """`(input_ids (size, chunks * m), neighbour_input_ids (size, chunks, 1, 2 m))`: chunk `u`'s neighbour is
    chunks `u` and `u + 1` of the sequence, after up to `shift` random tokens, with drops and insertions."""

    def random_tokens(count: int) -> torch.Tensor:
        return torch.randint(3, vocab, (count,), generator=generator)

    ids = random_tokens(size * (chunks + 2) * chunk_size).view(size, -1)
    rows = []
    for row in ids:
        neighbours = []
        for u in range(chunks):
            text = row[u * chunk_size : (u + 2) * chunk_size].tolist()
            offset = int(torch.randint(0, shift + 1, (1,), generator=generator))
            read = random_tokens(offset).tolist()
            for token in text:
                draw = float(torch.rand(1, generator=generator))
                if draw < indel / 2:
                    continue  # dropped
                if draw < indel:
                    read.append(int(random_tokens(1)))  # inserted before it
                read.append(token)
            read = read[: 2 * chunk_size]
            neighbours.append(read + [0] * (2 * chunk_size - len(read)))
        rows.append(neighbours)
    return ids[:, : chunks * chunk_size], torch.tensor(rows)[:, :, None, :]


def train_and_measure(args, buckets: int) -> dict:
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    config = RetroConfig(
        vocab_size=args.vocab, n_embd=64, n_layer=3, n_head=4, n_positions=64, chunk_size=args.chunk_size,
        cca_layers=[1, 2], num_neighbors=1, encoder_hidden_size=64, encoder_num_heads=4, encoder_num_layers=2,
        encoder_relative_position_buckets=buckets, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1,
        eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    model = RetroForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    started = time.time()
    for _ in range(args.steps):
        ids, neighbours = make_batch(16, 4, args.chunk_size, args.vocab, args.shift, args.indel, generator)
        model(ids, neighbour_input_ids=neighbours, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    held_out = torch.Generator().manual_seed(args.seed + 1)
    ids, neighbours = make_batch(64, 4, args.chunk_size, args.vocab, args.shift, args.indel, held_out)
    with torch.no_grad():
        return {
            "on": model(ids, neighbour_input_ids=neighbours, labels=ids).loss.item(),
            "off": model(ids, labels=ids).loss.item(),
            "shuffled": model(ids, neighbour_input_ids=neighbours.roll(1, dims=0), labels=ids).loss.item(),
            "seconds": time.time() - started,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--shift", type=int, default=4)
    parser.add_argument("--indel", type=float, default=0.0)
    parser.add_argument("--vocab", type=int, default=200)
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.steps} steps, shift <= {args.shift}, indel {args.indel}, vocabulary {args.vocab} "
          f"(retrieval off can do no better than ln({args.vocab - 3}) = {torch.tensor(args.vocab - 3.0).log():.2f})")  # fmt: skip
    print("| encoder positions | retrieval on | off | shuffled | training |")
    print("|---|---:|---:|---:|---:|")
    for name, buckets in (("rotary + learned relative logits (32 buckets)", 32), ("rotary only", 0)):
        result = train_and_measure(args, buckets)
        print(f"| {name} | {result['on']:.2f} | {result['off']:.2f} | {result['shuffled']:.2f} | "
              f"{result['seconds']:.0f} s |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()

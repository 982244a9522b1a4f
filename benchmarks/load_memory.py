#!/usr/bin/env python3
"""Load time and memory of a full-size REALM OpenQA checkpoint: realm_hf against transformers 4.44.2.

The script

1. writes a synthetic Hub-style checkpoint as transformers 4.16 wrote `google/realm-orqa-*-openqa`: `config.json`
   (every RealmConfig field, `"architectures": ["RealmForOpenQA"]`, `"searcher_seq_len": 64`, `"use_cache": true`),
   `pytorch_model.bin` (a zip-format `torch.save` of a state dict with random weights, `embeddings.position_ids`
   included as 4.16 saved it; `block_emb` is `num_block_records x 128` fp32, 6.8 GB at full size, ~7.7 GB in all)
   and a tokenizer (`vocab.txt` of 30522 tokens + `tokenizer_config.json`);
2. for each library, in a fresh subprocess (never two at once): builds a fixed-width bytes array of
   `num_block_records` block texts and a `RealmRetriever` over it, takes the RSS baseline, then times
   `RealmForOpenQA.from_pretrained(dir, retriever=retriever)`, one question and a second question, recording current
   RSS and peak RSS (`getrusage().ru_maxrss`) after each step;
3. prints a markdown table (transformers 4.44.2 | realm_hf | ratio) and whether both libraries retrieved the same
   blocks and predicted the same answer ids.

Usage (from the repository root; the parent process needs only the standard library):

    .venv/bin/python benchmarks/load_memory.py                           # full size: ~8 GB of disk, several minutes
    .venv/bin/python benchmarks/load_memory.py --num-block-records 200000  # smoke test
    .venv/bin/python benchmarks/load_memory.py --workdir /tmp/realm-bench --json results.json

The baseline runs with `~/.venvs/hf4/bin/python` (transformers 4.44.2, which still ships REALM); it is skipped with a
note when that interpreter is missing. The checkpoint is written in a temporary directory and deleted at the end,
unless `--workdir` is given (then it is kept and reused on the next run).

By default the checkpoint file is read once before each subprocess so that both start with it in the page cache
(`--cold-cache` instead asks the kernel to drop it, `posix_fadvise(DONTNEED)`, so that both read it from disk).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REALM_HF_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
DEFAULT_HF4_PYTHON = Path.home() / ".venvs" / "hf4" / "bin" / "python"
FULL_NUM_BLOCK_RECORDS = 13_353_718
MARKER_NAME = ".realm_bench_complete"
CHECKPOINT_FORMAT = 3  # bump when the written checkpoint changes, so that old --workdir checkpoints are rewritten
LIGHT_FORMAT = 2  # bump when the compressed directory's arguments change
RESULT_PREFIX = "@@REALM_BENCH_RESULT@@ "
NEAR_BLOCKS_PER_QUESTION = 32  # blocks planted near each question's embedding (plant_relevant_blocks)
DEFAULT_NUM_QUESTIONS = 64
SPECIAL_TOKENS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# A few real words so that the questions and block texts are not all [UNK]; the rest of the vocabulary is w0, w1, ...
WORDS = ["who", "wrote", "where", "is", "block", "?"]
VOCAB_SIZE = 30522
LIBRARIES = {
    "hf4": "transformers 4.44.2",
    "realm_hf": "realm_hf",
    "realm_hf_compressed": "realm_hf compressed (bf16)",
    "realm_hf_compressed_fp32": "realm_hf compressed, fp32 weights",
}
BASELINE, EXACT, COMPRESSED, COMPRESSED_FP32 = LIBRARIES
# `realm-hf index compress` arguments of the benchmark's light directory (its defaults, written out)
COMPRESS_ARGS = ["--dtype", "bfloat16"]


def make_questions(count: int) -> list[str]:
    """`count` questions over the synthetic vocabulary (the first two are those of earlier versions of this script)."""
    questions = ["who wrote w12 w13 ?", "where is w99 w100 ?"]
    for index in range(2, count):
        template = ("who wrote", "where is", "who is", "where is block")[index % 4]
        questions.append(f"{template} w{(index * 7919) % 30000} w{(index * 104729 + 17) % 30000} ?")
    return questions[:count]


CHUNK_ROWS = 1 << 20


# ---------------------------------------------------------------------------------------------------------------------
# the checkpoint


def hub_config(num_block_records: int) -> dict:
    """config.json as transformers 4.16 saved it for RealmForOpenQA (RealmConfig defaults, every field written)."""
    return {
        "architectures": ["RealmForOpenQA"],
        "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "hidden_act": "gelu_new",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 768,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "max_span_width": 10,
        "model_type": "realm",
        "num_attention_heads": 12,
        "num_block_records": num_block_records,
        "num_candidates": 8,
        "num_hidden_layers": 12,
        "pad_token_id": 1,
        "reader_beam_size": 5,
        "reader_layer_norm_eps": 0.001,
        "reader_seq_len": 320,
        "retriever_proj_size": 128,
        "searcher_beam_size": 5000,
        "searcher_seq_len": 64,
        "span_hidden_size": 256,
        "torch_dtype": "float32",
        "transformers_version": "4.16.0.dev0",
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": VOCAB_SIZE,
    }


def checkpoint_params(num_block_records: int, num_questions: int = DEFAULT_NUM_QUESTIONS) -> dict:
    return {"format": CHECKPOINT_FORMAT, "num_block_records": num_block_records, "num_questions": num_questions,
            "near_blocks_per_question": NEAR_BLOCKS_PER_QUESTION}  # fmt: skip


def light_params(num_block_records: int, num_questions: int = DEFAULT_NUM_QUESTIONS) -> dict:
    return {"format": LIGHT_FORMAT, "checkpoint": checkpoint_params(num_block_records, num_questions),
            "args": COMPRESS_ARGS}  # fmt: skip


def checkpoint_is_complete(directory: Path, num_block_records: int, params: dict | None = None) -> bool:
    marker = directory / MARKER_NAME
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()) == (params or checkpoint_params(num_block_records))
    except (OSError, ValueError):
        return False


def clustered_block_emb(num_block_records: int, dim: int, seed: int):
    """`benchmarks/search.py`'s synthetic embeddings, as a torch tensor: Gaussian clusters with log-normal sizes,
    through a LayerNorm with a fixed gamma and beta (REALM's projected_score is a LayerNorm output; i.i.d. noise
    would make every approximate index look bad)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from search import DIM, clustered_chunks, synthetic_parameters

    if dim != DIM:
        raise ValueError(f"search.py's generator makes {DIM}-d embeddings, the checkpoint needs {dim}")
    parameters = synthetic_parameters(num_block_records, seed)
    block_emb = torch.empty(num_block_records, dim, dtype=torch.float32)
    for start, points in clustered_chunks(parameters, num_block_records, seed):
        block_emb[start : start + len(points)] = torch.from_numpy(points)
    return block_emb


def plant_relevant_blocks(block_emb, queries, per_question: int, seed: int):
    """Puts `per_question` blocks near each question's embedding, as a trained retriever puts a question's relevant
    blocks: block = the generator's LayerNorm of (q / std(q) + s * noise), `s` uniform in [0.5, 1.5] per block (cosine
    to the question about 0.55-0.9), at block ids spread over the corpus. The questions of a random model land nowhere
    near the clustered data otherwise, and the top 5 of 13M unrelated points are separated by less than any compressed
    index resolves, which is not what a question and its evidence look like. Returns the planted ids `(Q, n)`."""
    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from search import layer_norm, synthetic_parameters

    parameters = synthetic_parameters(block_emb.shape[0], seed)
    generator = torch.Generator().manual_seed(seed + 2)
    count = min(per_question, block_emb.shape[0] // max(1, len(queries)))
    ids = torch.randperm(block_emb.shape[0], generator=generator)[: len(queries) * count].view(len(queries), count)
    for query, rows in zip(queries, ids, strict=True):
        scale = torch.empty(count, 1).uniform_(0.5, 1.5, generator=generator)
        points = query / query.std() + scale * torch.randn(count, query.numel(), generator=generator)
        block_emb[rows] = torch.from_numpy(layer_norm(points.numpy().astype(np.float32), parameters["gamma"],
                                                      parameters["beta"]))  # fmt: skip
    return ids


def write_hub_block_records(path: Path, num_block_records: int) -> None:
    """`block_records.npy` as the Hub ships it: a pickled numpy object array of bytes (read by realm_hf's restricted
    loader; the measuring subprocesses of the exact configurations build the same texts in memory instead)."""
    import numpy as np

    records = make_block_records(num_block_records).astype(object)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as handle:
        np.save(handle, records, allow_pickle=True)
    os.replace(partial, path)


def write_checkpoint(directory: str, num_block_records: int, seed: int = 0,
                     num_questions: int = DEFAULT_NUM_QUESTIONS) -> None:  # fmt: skip
    """Runs in a subprocess with realm_hf's interpreter. Peak memory: block_emb (6.8 GB at full size) + ~0.9 GB."""
    import torch

    import realm_hf

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER_NAME).unlink(missing_ok=True)
    config_dict = hub_config(num_block_records)

    # Build the encoders with a one-row block_emb: RealmForOpenQA(config) at full size would allocate (and zero) the
    # 6.8 GB buffer only for it to be replaced.
    torch.manual_seed(seed)
    fields = {
        key: value
        for key, value in config_dict.items()
        if key not in ("architectures", "transformers_version", "torch_dtype", "use_cache")
    }
    small = realm_hf.RealmConfig(**{**fields, "num_block_records": 1})
    model = realm_hf.RealmForOpenQA(small)
    state_dict = model.state_dict()
    # transformers 4.16 registered BertEmbeddings.position_ids as a persistent buffer, so Hub checkpoints carry it.
    for prefix in ("embedder", "reader"):
        state_dict[f"{prefix}.realm.embeddings.position_ids"] = torch.arange(
            config_dict["max_position_embeddings"]
        ).expand((1, -1))

    # Before block_emb exists: the 13M Python bytes objects of the pickled records cost about 1 GB while written.
    write_hub_block_records(directory / "block_records.npy", num_block_records)
    state_dict["block_emb"] = block_emb = clustered_block_emb(
        num_block_records, config_dict["retriever_proj_size"], seed
    )
    write_tokenizer(directory)
    tokenizer = realm_hf.RealmTokenizerFast.from_pretrained(directory)
    with torch.no_grad():
        model.eval()
        queries = [model.embedder(**tokenizer([question], return_tensors="pt")).projected_score[0]
                   for question in make_questions(num_questions)]  # fmt: skip
    plant_relevant_blocks(block_emb, queries, NEAR_BLOCKS_PER_QUESTION, seed)
    del model

    weights_path = directory / "pytorch_model.bin"
    partial = directory / "pytorch_model.bin.partial"
    torch.save(state_dict, partial)
    os.replace(partial, weights_path)
    del state_dict, block_emb

    (directory / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    (directory / MARKER_NAME).write_text(json.dumps(checkpoint_params(num_block_records, num_questions)))


def write_tokenizer(directory: Path) -> None:
    vocab = SPECIAL_TOKENS + WORDS
    vocab += [f"w{index}" for index in range(VOCAB_SIZE - len(vocab))]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer_config = {"tokenizer_class": "RealmTokenizer", "model_max_length": 512, "do_lower_case": True}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    special_tokens_map = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                          "mask_token": "[MASK]"}  # fmt: skip
    (directory / "special_tokens_map.json").write_text(json.dumps(special_tokens_map, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------------------------------
# the measuring subprocess (runs under either interpreter: standard library, numpy, torch and the library only)


def _mapped_rss(path_part: str) -> int:
    """Resident bytes of this process's mappings of files whose path contains `path_part` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as handle:
        for line in handle:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
                inside = len(fields) >= 6 and path_part in fields[5]
            elif inside and fields and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def _memory(rerank_dir: str | None = None) -> dict:
    """Current and peak RSS in bytes. `rss` is what psutil reports (VmRSS); `peak` is getrusage's ru_maxrss.
    With `rerank_dir`, `rerank_rss` is the resident part of the memory-mapped fp32 re-rank shards in it."""
    import resource

    status = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                status[key] = int(value.split()[0]) * 1024
    memory = {
        "rss": status["VmRSS"],
        "rss_anon": status.get("RssAnon"),
        "rss_file": status.get("RssFile"),
        "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_vmhwm": status["VmHWM"],
    }
    try:
        import psutil

        memory["rss_psutil"] = psutil.Process().memory_info().rss
    except ImportError:
        pass
    if rerank_dir is not None:
        memory["rerank_rss"] = _mapped_rss(os.path.join(rerank_dir, "embeddings-"))
    return memory


def make_block_records(num_block_records: int):
    """`b"block w<i>"` for every block id, as one fixed-width bytes array, built in chunks (no 3x temporary peak)."""
    import numpy as np

    digits = len(str(max(num_block_records - 1, 0)))
    records = np.empty(num_block_records, dtype=f"S{len('block w') + digits}")
    for start in range(0, num_block_records, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, num_block_records)
        records[start:stop] = np.char.add(b"block w", np.arange(start, stop).astype(f"S{digits}"))
    return records


def measure(
    library: str,
    directory: str,
    num_block_records: int,
    threads: int | None,
    num_questions: int,
    light: str | None = None,
) -> dict:
    """One configuration, in this (fresh) process: load, then ask `num_questions` questions one at a time.

    `hf4` / `realm_hf`: `RealmForOpenQA.from_pretrained(checkpoint, retriever=...)` over an in-memory block records
    array, exact search over `block_emb`. `realm_hf_compressed`: `load_open_qa(light)` on the directory `realm-hf index
    compress` wrote (bf16 weights without block_emb, memory-mapped block records, IVF-PQ index re-ranked from the
    memory-mapped fp32 shards). `realm_hf_compressed_fp32`: the checkpoint's own fp32 weights (block_emb skipped)
    searching the same compressed index, to separate the index's effect from the weights' dtype.
    """
    import gc

    import numpy as np
    import torch

    compressed = library in (COMPRESSED, COMPRESSED_FP32)
    if library == BASELINE:
        import transformers
        from transformers import RealmForOpenQA, RealmRetriever, RealmTokenizerFast

        versions = {"transformers": transformers.__version__}
    else:
        import transformers

        import realm_hf
        from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizerFast

        versions = {"realm_hf": realm_hf.__version__, "transformers": transformers.__version__}
    versions["torch"] = torch.__version__
    versions["numpy"] = np.__version__

    if threads:
        torch.set_num_threads(threads)

    class RecordingRetriever(RealmRetriever):
        """The library's retriever, remembering the block ids it is asked for (4.44.2 does not return them)."""

        def __call__(self, retrieved_block_ids, *args, **kwargs):
            self.calls.append([int(block_id) for block_id in np.asarray(retrieved_block_ids).reshape(-1)])
            return super().__call__(retrieved_block_ids, *args, **kwargs)

    question_texts = make_questions(num_questions)
    result = {"library": library, "versions": versions, "threads": torch.get_num_threads()}
    rerank_dir = os.path.join(light, "index") if compressed else None
    if compressed:
        from realm_hf.default_model import load_open_qa
        from realm_hf.retrieval import open_searcher

        tokenizer = RealmTokenizerFast.from_pretrained(light)
        result.update({"records_bytes": 0, "records_dtype": "block_records.safetensors, memory-mapped"})
    else:
        records = make_block_records(num_block_records)
        tokenizer = RealmTokenizerFast.from_pretrained(directory)
        retriever = RecordingRetriever(block_records=records, tokenizer=tokenizer)
        retriever.calls = []
        result.update({"records_bytes": int(records.nbytes), "records_dtype": str(records.dtype)})
    questions = [tokenizer([question], return_tensors="pt") for question in question_texts]
    gc.collect()
    result["before_load"] = _memory(rerank_dir)

    start = time.perf_counter()
    if library == COMPRESSED:
        model, retriever = load_open_qa(light)
        loading_info = {}
    elif library == COMPRESSED_FP32:
        retriever = RealmRetriever.from_pretrained(light)
        model, loading_info = RealmForOpenQA.from_pretrained(
            directory,
            retriever=retriever,
            searcher=open_searcher(rerank_dir),
            dtype=torch.float32,
            output_loading_info=True,
        )
    else:
        loaded = RealmForOpenQA.from_pretrained(directory, retriever=retriever, output_loading_info=True)
        model, loading_info = loaded if isinstance(loaded, tuple) else (loaded, {})
    result["load_s"] = time.perf_counter() - start
    result["after_load"] = _memory(rerank_dir)
    result["loading_info"] = {key: sorted(map(str, value)) for key, value in dict(loading_info).items() if value}
    model.eval()
    result["block_emb"] = {"dtype": str(model.block_emb.dtype), "shape": list(model.block_emb.shape)}
    result["weights_dtype"] = str(model.embedder.cls.dense.weight.dtype)
    searcher = getattr(model, "searcher", None)
    if searcher is not None:
        result["searcher"] = repr(searcher)
        result["searcher_memory_bytes"] = int(searcher.memory_bytes())

    result["questions"] = []
    for index, inputs in enumerate(questions):
        with torch.no_grad():
            start = time.perf_counter()
            output = model(**inputs, return_dict=True)
            elapsed = time.perf_counter() - start
        answer_ids = [int(token) for token in output.predicted_answer_ids.reshape(-1)]
        if compressed:
            retrieved = [int(block_id) for block_id in output.retrieved_block_ids.reshape(-1)]
        else:
            retrieved = retriever.calls[-1]
        result["questions"].append(
            {
                "question": question_texts[index],
                "time_s": elapsed,
                "memory": _memory(rerank_dir),
                "predicted_answer_ids": answer_ids,
                "predicted_answer": tokenizer.decode(answer_ids),
                "retrieved_block_ids": retrieved,
                "block_idx": int(output.reader_output.block_idx.reshape(-1)[0]),
                "start_pos": int(output.reader_output.start_pos.reshape(-1)[0]),
                "end_pos": int(output.reader_output.end_pos.reshape(-1)[0]),
            }
        )
    return result


# ---------------------------------------------------------------------------------------------------------------------
# the parent


def prepare_page_cache(path: Path, cold: bool) -> None:
    """Warm: read the file once so that it sits in the page cache. Cold: ask the kernel to drop its cached pages."""
    if not path.is_file():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if cold:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        else:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while os.read(fd, 64 << 20):
                pass
    finally:
        os.close(fd)


def child_env() -> dict:
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "DISABLE_SAFETENSORS_CONVERSION": "1",
            "TRUST_REMOTE_CODE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def run_child(python: Path, args: list[str], label: str) -> dict:
    command = [str(python), str(Path(__file__).resolve()), *args]
    print(f"[load_memory] {label}: {' '.join(command)}", file=sys.stderr, flush=True)
    completed = subprocess.run(command, env=child_env(), cwd=str(REPO_ROOT), capture_output=True, text=True)
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    sys.stderr.write(completed.stdout[-5000:])
    sys.stderr.write(completed.stderr[-10000:])
    raise RuntimeError(f"{label} failed (exit status {completed.returncode}); its output is above")


def gb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e9:.2f}"


def seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def ratio(new: float | None, old: float | None) -> str:
    if new is None or old is None or old == 0:
        return "n/a"
    return f"{new / old:.2f}x"


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def table_rows(result: dict | None) -> dict:
    if result is None:
        return {}
    first, last = result["questions"][0], result["questions"][-1]
    rest = [question["time_s"] for question in result["questions"][1:]]
    rows = {
        "RSS before load (GB)": (result["before_load"]["rss"], gb),
        "load time (s)": (result["load_s"], seconds),
        "RSS after load (GB)": (result["after_load"]["rss"], gb),
        "peak RSS after load (GB)": (result["after_load"]["peak"], gb),
        "first-question time (s)": (first["time_s"], seconds),
        "RSS after first question (GB)": (first["memory"]["rss"], gb),
        f"mean time of questions 2-{len(result['questions'])} (s)": (mean(rest), seconds),
        f"RSS after question {len(result['questions'])} (GB)": (last["memory"]["rss"], gb),
        "peak RSS after the questions (GB)": (last["memory"]["peak"], gb),
        "  of which anonymous / file-backed (GB)": (
            (last["memory"]["rss_anon"], last["memory"]["rss_file"]),
            lambda pair: f"{gb(pair[0])} / {gb(pair[1])}",
        ),
        "  of which fp32 re-rank shards (GB)": (last["memory"].get("rerank_rss"), gb3),
    }
    return rows


def gb3(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e9:.3f}"


def render_table(results: dict) -> str:
    names = [name for name in LIBRARIES if name in results]
    columns = {name: table_rows(results[name]) for name in names}
    baseline = columns.get(BASELINE, {})
    others = [name for name in names if name != BASELINE]
    header = "| | " + " | ".join(LIBRARIES[name] for name in names)
    header += "".join(f" | {LIBRARIES[name]} / 4.44.2" for name in others if baseline) + " |"
    lines = [header, "|---|" + "---:|" * (len(names) + (len(others) if baseline else 0))]
    row_names = list(next(iter(columns.values())))
    for row in row_names:
        cells, numeric = [], True
        for name in names:
            value, formatter = columns[name].get(row, (None, gb))
            numeric = numeric and not isinstance(value, tuple)
            cells.append("n/a" if value is None else formatter(value))
        if baseline:
            old_value = baseline.get(row, (None, None))[0]
            for name in others:
                new_value = columns[name].get(row, (None, None))[0]
                cells.append(ratio(new_value, old_value) if numeric and not isinstance(new_value, tuple) else "")
        label = row if not row.startswith("  ") else row.replace("  ", "&nbsp;&nbsp;")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def overlap(found: dict, reference: dict) -> dict:
    """Per question: the fraction of `reference`'s retrieved blocks that `found` retrieved too, and equal answers."""
    pairs = list(zip(found["questions"], reference["questions"], strict=True))
    recalls = [len(set(a["retrieved_block_ids"]) & set(b["retrieved_block_ids"])) / len(b["retrieved_block_ids"])
               for a, b in pairs]  # fmt: skip
    same_blocks = [a["retrieved_block_ids"] == b["retrieved_block_ids"] for a, b in pairs]
    same_answers = [a["predicted_answer_ids"] == b["predicted_answer_ids"] for a, b in pairs]
    return {
        "questions": len(pairs),
        "recall_at_5": mean(recalls),
        "identical_top5": sum(same_blocks),
        "same_answers": sum(same_answers),
    }


def agreement(results: dict) -> dict:
    """Every configuration against realm_hf's exact search (and the bf16 against the fp32 compressed path)."""
    reference = results.get(EXACT)
    comparisons = {}
    if reference is not None:
        for name in (BASELINE, COMPRESSED, COMPRESSED_FP32):
            if name in results:
                comparisons[f"{name}_vs_{EXACT}"] = overlap(results[name], reference)
    if COMPRESSED in results and COMPRESSED_FP32 in results:
        comparisons[f"{COMPRESSED}_vs_{COMPRESSED_FP32}"] = overlap(results[COMPRESSED], results[COMPRESSED_FP32])
    return comparisons


def goals(results: dict, agree: dict) -> dict:
    """The issue's goals: resident memory after the questions with the compressed index <= 1.5 GB and <= 0.2x
    transformers 4.44.2's; the compressed path retrieves >= 95% of the exact path's top-5 blocks."""
    checks = {}
    light, old = results.get(COMPRESSED), results.get(BASELINE)
    if light is not None:
        rss = light["questions"][-1]["memory"]["rss"]
        checks["compressed_rss_le_1_5_gb"] = {"value_gb": rss / 1e9, "met": rss <= 1.5e9}
        if old is not None:
            value = rss / old["questions"][-1]["memory"]["rss"]
            checks["compressed_rss_le_0_2x_hf4"] = {"value": value, "met": value <= 0.2}
    for name in (COMPRESSED, COMPRESSED_FP32):
        key = f"{name}_vs_{EXACT}"
        if key in agree:
            value = agree[key]["recall_at_5"]
            checks[f"{name}_recall_at_5_ge_0_95"] = {"value": value, "met": value >= 0.95}
    return checks


def compress(python: Path, checkpoint: Path, light: Path, num_block_records: int, num_questions: int) -> dict:
    """Runs `realm-hf index compress` on the checkpoint (kept and reused with --workdir), timing it."""
    if checkpoint_is_complete(light, num_block_records, light_params(num_block_records, num_questions)):
        print(f"[load_memory] reusing the compressed directory {light}", file=sys.stderr, flush=True)
        return json.loads((light / "realm_hf_serving.json").read_text()) | {"reused": True}
    command = [str(python), "-m", "realm_hf.cli", "index", "compress", "--model", str(checkpoint), "--output",
               str(light), *COMPRESS_ARGS]  # fmt: skip
    print(f"[load_memory] compressing: {' '.join(command)}", file=sys.stderr, flush=True)
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT / "src"), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    completed = subprocess.run(command, env=env, cwd=str(REPO_ROOT), capture_output=True, text=True)
    if completed.returncode != 0:
        sys.stderr.write(completed.stdout[-5000:] + completed.stderr[-10000:])
        raise RuntimeError(f"realm-hf index compress failed (exit status {completed.returncode}); its output is above")
    print(completed.stdout, file=sys.stderr, flush=True)
    summary = json.loads((light / "realm_hf_serving.json").read_text())
    summary["command_s"] = time.perf_counter() - started
    (light / MARKER_NAME).write_text(json.dumps(light_params(num_block_records, num_questions)))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="keep (and reuse) the checkpoint here instead of a temp dir")
    parser.add_argument(
        "--num-block-records",
        type=int,
        default=FULL_NUM_BLOCK_RECORDS,
        help=f"rows of block_emb and of the records (default {FULL_NUM_BLOCK_RECORDS}, the real size)",
    )
    parser.add_argument(
        "--num-questions",
        type=int,
        default=DEFAULT_NUM_QUESTIONS,
        help=f"questions asked in every configuration, one at a time (default {DEFAULT_NUM_QUESTIONS})",
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(LIBRARIES),
        default=list(LIBRARIES),
        help="configurations to measure (default: all)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in all (default: torch's)")
    parser.add_argument("--json", type=Path, dest="json_out", help="also write every measurement to this JSON file")
    parser.add_argument(
        "--cold-cache",
        action="store_true",
        help="drop the checkpoint from the page cache before each run (default: read it in first)",
    )
    parser.add_argument("--realm-hf-python", type=Path, default=DEFAULT_REALM_HF_PYTHON)
    parser.add_argument("--hf4-python", type=Path, default=DEFAULT_HF4_PYTHON)
    # internal: the subprocesses
    parser.add_argument("--_write", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--_measure", choices=sorted(LIBRARIES), help=argparse.SUPPRESS)
    parser.add_argument("--_dir", help=argparse.SUPPRESS)
    parser.add_argument("--_light", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._write:
        start = time.perf_counter()
        write_checkpoint(args._write, args.num_block_records, num_questions=args.num_questions)
        written = {"written": args._write, "time_s": time.perf_counter() - start, "peak_rss": _memory()["peak"]}
        print(RESULT_PREFIX + json.dumps(written), flush=True)
        return 0
    if args._measure:
        result = measure(args._measure, args._dir, args.num_block_records, args.threads, args.num_questions,
                         args._light)  # fmt: skip
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0

    if not args.realm_hf_python.exists():
        parser.error(f"{args.realm_hf_python} does not exist (create it with `make install`)")
    temporary = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="realm_load_memory_")) if temporary else args.workdir.resolve()
    checkpoint = workdir / f"realm-openqa-{args.num_block_records}"
    light = workdir / f"realm-openqa-{args.num_block_records}-light"
    common = ["--num-block-records", str(args.num_block_records), "--num-questions", str(args.num_questions)]
    try:
        if checkpoint_is_complete(checkpoint, args.num_block_records,
                                  checkpoint_params(args.num_block_records, args.num_questions)):  # fmt: skip
            print(f"[load_memory] reusing the checkpoint in {checkpoint}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(light, ignore_errors=True)  # made from an older checkpoint
            written = run_child(args.realm_hf_python, ["--_write", str(checkpoint), *common], "writing the checkpoint")
            print(f"[load_memory] wrote {checkpoint} in {written['time_s']:.0f} s, writer peak RSS "
                  f"{written['peak_rss'] / 1e9:.2f} GB", file=sys.stderr, flush=True)  # fmt: skip
        weights = checkpoint / "pytorch_model.bin"
        checkpoint_bytes = sum(path.stat().st_size for path in checkpoint.iterdir() if path.is_file())

        results: dict = {}
        notes = []
        compressed_summary = None
        pythons = {BASELINE: args.hf4_python}
        for library in [name for name in LIBRARIES if name in args.configs]:
            python = pythons.get(library, args.realm_hf_python)
            if not python.exists():
                notes.append(f"{LIBRARIES[library]} skipped: {python} does not exist.")
                print(f"[load_memory] {notes[-1]}", file=sys.stderr, flush=True)
                continue
            child_args = ["--_measure", library, "--_dir", str(checkpoint), *common]
            if library in (COMPRESSED, COMPRESSED_FP32):
                if compressed_summary is None:
                    compressed_summary = compress(args.realm_hf_python, checkpoint, light, args.num_block_records,
                                                  args.num_questions)  # fmt: skip
                child_args += ["--_light", str(light)]
                for path in sorted(light.rglob("*")):  # the model, records and faiss index; the shards are read in
                    if path.is_file() and not path.name.startswith("embeddings-"):  # a few rows at a time
                        prepare_page_cache(path, cold=args.cold_cache)
                if library == COMPRESSED_FP32:
                    prepare_page_cache(weights, cold=args.cold_cache)
            else:
                prepare_page_cache(weights, cold=args.cold_cache)
            if args.threads:
                child_args += ["--threads", str(args.threads)]
            results[library] = run_child(python, child_args, LIBRARIES[library])  # one at a time: 24 GB machines
            if not temporary:  # a later failure keeps what was measured
                (workdir / "results-partial.json").write_text(json.dumps(results))

        any_result = next(iter(results.values()))
        threads = {LIBRARIES[name]: result["threads"] for name, result in results.items()}
        print(f"REALM OpenQA, {args.num_block_records:,} block records, {args.num_questions} questions one at a "
              f"time; checkpoint {checkpoint_bytes / 1e9:.2f} GB on disk (pytorch_model.bin "
              f"{weights.stat().st_size / 1e9:.2f} GB); exact configurations hold a block records array of "
              f"{results.get(EXACT, any_result)['records_bytes'] / 1e9:.3f} GB (built before the RSS baseline, so "
              f"included in every RSS figure), the compressed ones memory-map block_records.safetensors; page cache: "
              f"{'cold' if args.cold_cache else 'warm'}; torch threads: {threads}.")  # fmt: skip
        if compressed_summary is not None:
            files = compressed_summary["files"]
            print(
                f"`realm-hf index compress {' '.join(COMPRESS_ARGS)}`: faiss {compressed_summary['factory']!r}, "
                f"nprobe {compressed_summary['nprobe']}, re-rank factor {compressed_summary['rerank_factor']}; "
                f"{compressed_summary.get('command_s', float('nan')):.0f} s; on disk: model "
                f"{files['model'] / 1e9:.2f} GB, block records {files['block_records'] / 1e9:.2f} GB, faiss index "
                f"{files['faiss_index'] / 1e9:.2f} GB, fp32 re-rank shards {files['rerank_shards'] / 1e9:.2f} GB."
            )
        print()
        print(render_table(results))
        print()
        agree = agreement(results)
        for key, value in agree.items():
            print(f"- {key}: recall@5 {value['recall_at_5']:.3f} over {value['questions']} questions, identical top-5 "
                  f"for {value['identical_top5']}, same answer for {value['same_answers']}")  # fmt: skip
        checks = goals(results, agree)
        for key, value in checks.items():
            shown = value.get("value_gb", value.get("value"))
            print(f"- goal {key}: {shown:.3f} -> {'met' if value['met'] else 'NOT met'}")
        for name, result in results.items():
            answers = "; ".join(f"{q['question']!r} -> {q['predicted_answer']!r} (blocks {q['retrieved_block_ids']})"
                                for q in result["questions"][:2])  # fmt: skip
            print(
                f"- {LIBRARIES[name]} ({', '.join(f'{k} {v}' for k, v in result['versions'].items())}): {answers} ..."
            )
            if result["loading_info"]:
                print(f"  loading info: {json.dumps(result['loading_info'])}")
        for note in notes:
            print(f"- {note}")

        if args.json_out:
            payload = {
                "num_block_records": args.num_block_records,
                "num_questions": args.num_questions,
                "checkpoint_bytes": checkpoint_bytes,
                "weights_bytes": weights.stat().st_size,
                "page_cache": "cold" if args.cold_cache else "warm",
                "compressed": compressed_summary,
                "results": results,
                "agree": agree,
                "goals": checks,
                "table": render_table(results),
                "notes": notes,
            }
            args.json_out.write_text(json.dumps(payload, indent=2) + "\n")
    finally:
        if temporary:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

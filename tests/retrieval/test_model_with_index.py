"""RealmForOpenQA over an external index: same answers as the in-model buffer, a small model object, and the
`realm-hf index` commands end to end."""

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from realm_hf import RealmForOpenQA, RealmRetriever
from realm_hf.cli.main import main
from realm_hf.demo import DEMO_QUESTIONS, ensure_demo_model
from realm_hf.retrieval import DocumentStore, ExactSearcher, offload_block_embeddings
from realm_hf.retrieval.index_files import open_index_shards


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


def _answers(model, tokenizer, questions):
    batch = tokenizer(questions, padding=True, return_tensors="pt")
    with torch.no_grad():
        output = model(**batch)
    return output.retrieved_block_ids, [ids.tolist() for ids in output.predicted_answer_ids]


def test_offloaded_model_answers_like_the_buffer(tmp_path, demo_dir):
    retriever = RealmRetriever.from_pretrained(demo_dir)
    model = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever)
    expected = _answers(model, retriever.tokenizer, DEMO_QUESTIONS)
    block_emb = model.block_emb.clone()

    searcher = offload_block_embeddings(model, tmp_path / "index")
    assert model.block_emb.numel() == 0 and model.searcher is searcher and not model.config.store_block_emb
    np.testing.assert_array_equal(np.concatenate(open_index_shards(tmp_path / "index")[1]), block_emb.numpy())
    offloaded = _answers(model, retriever.tokenizer, DEMO_QUESTIONS)
    assert torch.equal(offloaded[0], expected[0]) and offloaded[1] == expected[1]

    # the saved model is small and reloads against the index
    model.save_pretrained(tmp_path / "small")
    reloaded = RealmForOpenQA.from_pretrained(tmp_path / "small", retriever=retriever,
                                              searcher=ExactSearcher.from_index(tmp_path / "index"))  # fmt: skip
    assert reloaded.block_emb.numel() == 0
    again = _answers(reloaded, retriever.tokenizer, DEMO_QUESTIONS)
    assert torch.equal(again[0], expected[0]) and again[1] == expected[1]
    with pytest.raises(ValueError, match="has no block embeddings"):
        without = RealmForOpenQA.from_pretrained(tmp_path / "small", retriever=retriever)
        _answers(without, retriever.tokenizer, DEMO_QUESTIONS[:1])


def test_index_build_embeds_with_a_model_saved_in_fp16(tmp_path, demo_dir, capsys):
    # The default model ships fp16 weights, which transformers 5 loads as fp16; the build embeds in fp32 (or under its
    # autocast) all the same, where fp16 weights once failed in LayerNorm ("mixed dtype").
    import shutil

    half = tmp_path / "half"
    shutil.copytree(demo_dir, half)
    RealmForOpenQA.from_pretrained(demo_dir).half().save_pretrained(half)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Paris is the capital of France {i}."}) + "\n" for i in range(6)))
    for model, output in ((half, tmp_path / "from_half"), (demo_dir, tmp_path / "from_full")):
        # bf16 autocast, as a CPU with AVX512-BF16 picks by itself (the tests otherwise force fp32)
        assert main(["index", "build", "--model", str(model), "--corpus", str(corpus), "--output", str(output),
                     "--precision", "bf16", "--quiet"]) == 0  # fmt: skip
    assert "indexed 6 blocks" in capsys.readouterr().out
    ids = torch.arange(6)
    from_half = ExactSearcher.from_index(tmp_path / "from_half").embeddings(ids).float()
    from_full = ExactSearcher.from_index(tmp_path / "from_full").embeddings(ids).float()
    # the same embeddings but for the weights' fp16 rounding
    assert torch.nn.functional.cosine_similarity(from_half, from_full).min() > 0.99


def test_hub_checkpoint_with_a_searcher_never_loads_block_emb(demo_dir):
    retriever = RealmRetriever.from_pretrained(demo_dir)
    full = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever)
    searcher = ExactSearcher(full.block_emb.clone())
    model, info = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever, searcher=searcher,
                                                 output_loading_info=True)  # fmt: skip
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.block_emb.numel() == 0
    expected = _answers(full, retriever.tokenizer, DEMO_QUESTIONS)
    got = _answers(model, retriever.tokenizer, DEMO_QUESTIONS)
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]


def test_train_mode_gradients_flow_through_the_searcher(demo_dir):
    retriever = RealmRetriever.from_pretrained(demo_dir)
    full = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever).train()
    searcher = ExactSearcher(full.block_emb.clone())
    model = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever, searcher=searcher).train()
    tokenizer = retriever.tokenizer
    inputs = tokenizer(["What is the capital of France?"], return_tensors="pt")
    answers = tokenizer(["paris"], add_special_tokens=False).input_ids
    for candidate in (full, model):
        candidate.zero_grad()
        torch.manual_seed(0)  # the same dropout masks in both
        candidate(**inputs, answer_ids=answers).reader_output.loss.backward()
    torch.testing.assert_close(model.embedder.cls.dense.weight.grad, full.embedder.cls.dense.weight.grad)


def test_index_commands_build_add_eval_offload(tmp_path, demo_dir, capsys, caplog):
    corpus = tmp_path / "docs.jsonl"
    rows = [{"title": f"Doc {i}", "text": f"Paris is the capital of France number {i}."} for i in range(30)]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    index = tmp_path / "index"
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(corpus), "--output", str(index),
                 "--shard-size", "8", "--quiet"]) == 0  # fmt: skip
    assert "indexed 30 blocks" in capsys.readouterr().out
    assert len(DocumentStore.load(index / "documents")) == 30

    new = tmp_path / "new.jsonl"
    new.write_text("".join(json.dumps({"title": "New", "text": f"Rome is old {i}."}) + "\n" for i in range(5)))
    assert main(["index", "add", "--index", str(index), "--model", str(demo_dir), "--corpus", str(new),
                 "--quiet"]) == 0  # fmt: skip
    assert "ids 30..34" in capsys.readouterr().out
    store = DocumentStore.load(index / "documents")
    assert len(store) == 35 and store[32]["text"] == "Rome is old 2."
    assert "already in the index" not in caplog.text
    added = json.loads((index / "index.json").read_text())["provenance"]["added"]
    assert added == [{"corpus": str(new), "first_id": 30, "blocks": 5}]  # what a rebuild would leave out
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(index, rebuilt)
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(corpus), "--output", str(rebuilt),
                 "--overwrite", "--quiet"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    assert (f"note: the index being replaced holds 5 blocks that `index add` appended (from {new}); the new one holds "
            f"--corpus alone. To keep them, add them again once it is built: realm-hf index add --index {rebuilt} "
            f"--corpus {new}") in err  # fmt: skip
    assert (
        "indexed 30 blocks (128-d) in 1 shard" not in out
        and "(replacing the index that was there, which held 35 blocks)" in out
    )
    assert "added" not in json.loads((rebuilt / "index.json").read_text())["provenance"]
    repeated = tmp_path / "repeated"
    shutil.copytree(index, repeated)
    assert main(["index", "add", "--index", str(repeated), "--model", str(demo_dir), "--corpus", str(new),
                 "--quiet"]) == 0  # fmt: skip
    assert "5 of the 5 documents added are already in the index (same title and text)" in caplog.text
    assert ExactSearcher.from_index(index).num_blocks == 35

    # The untrained demo model scores every block within rounding of every other (all about 32.0000), so a Flat faiss
    # index and torch break those ties differently: evaluate on well-separated embeddings, where Flat must be exact.
    separated = tmp_path / "separated"
    ExactSearcher(torch.randn(35, 16, generator=torch.Generator().manual_seed(0))).save(separated)
    assert main(["index", "eval", "--index", str(separated), "--factory", "Flat", "--k", "1,5", "--num-queries", "10",
                 "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["recall_at_5"] == 1.0 and report["num_blocks"] == 35
    # no --factory: what `index compress` would build, exact for so few blocks; k beyond the index is capped
    assert main(["index", "eval", "--index", str(separated), "--num-queries", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["factory"] == "Flat" and report["recall_at_35"] == 1.0 and "recall_at_100" not in report
    assert main(["index", "eval", "--index", str(index), "--factory", "Flat", "--k", "5", "--num-queries", "10",
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["num_blocks"] == 35

    assert main(["index", "offload", "--model", str(demo_dir), "--output", str(tmp_path / "offloaded")]) == 0
    assert "with their block records" in capsys.readouterr().out
    assert (
        len(DocumentStore.load(tmp_path / "offloaded" / "documents"))
        == ExactSearcher.from_index(tmp_path / "offloaded").num_blocks
    )


def _rows(path, texts):
    path.write_text("".join(json.dumps({"title": f"Doc {i}", "text": text}) + "\n" for i, text in enumerate(texts)))
    return path


def _files(directory):
    return {path.relative_to(directory).as_posix(): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}  # fmt: skip


def test_index_build_overwrite_swaps_the_new_index_in_only_once_complete(tmp_path, demo_dir, capsys):
    index = tmp_path / "index"
    build = ["index", "build", "--model", str(demo_dir), "--output", str(index), "--quiet"]
    assert main([*build, "--corpus", str(_rows(tmp_path / "old.jsonl", ["Paris is in France."] * 3))]) == 0
    old_files = _files(index)
    new = _rows(tmp_path / "new.jsonl", [f"Rome is old {i}." for i in range(100)])
    # Without --overwrite: refused, naming it, and `index add` with the model the index was built with.
    assert main([*build, "--corpus", str(new)]) == 2
    err = capsys.readouterr().err
    assert "already holds a finished index: pass --overwrite to replace it" in err
    assert f"`realm-hf index add --index {index} --model {demo_dir} --corpus NEW_DOCS`" in err

    # Interrupted by a real SIGINT once the new index's first shard is written: the old index is untouched.
    staging = tmp_path / ".index.overwrite"

    def interrupt_after_the_first_shard():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if list(staging.glob("embeddings-*.safetensors")):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.005)

    overwrite = [*build, "--corpus", str(new), "--overwrite", "--shard-size", "10", "--batch-size", "10"]
    watcher = threading.Thread(target=interrupt_after_the_first_shard)
    watcher.start()
    assert main(overwrite) == 130
    watcher.join()
    assert _files(index) == old_files and not (staging / "index.json").exists()
    first_shard = (staging / "embeddings-00000.safetensors").stat().st_ino

    # The same command again resumes (the shard written before the interrupt is kept) and swaps the index in.
    assert main(overwrite) == 0
    assert capsys.readouterr().out.strip() == (
        f"indexed 100 blocks (32-d) in 10 shards at {index} (replacing the index that was there, which held 3 blocks)"
    )
    assert (index / "embeddings-00000.safetensors").stat().st_ino == first_shard
    assert len(DocumentStore.load(index / "documents")) == ExactSearcher.from_index(index).num_blocks == 100
    assert sorted(path.name for path in tmp_path.iterdir()) == ["index", "new.jsonl", "old.jsonl"]  # nothing left

    # What a build this one cannot resume left there (here a finished index never swapped in) is built afresh.
    shutil.copytree(index, staging)
    assert main([*build, "--corpus", str(tmp_path / "old.jsonl"), "--overwrite"]) == 0

    def embeddings(files):  # the shards, and the manifest but for when the corpus was read
        manifest = json.loads(files["index.json"])
        del manifest["provenance"]["corpus_read_at"]
        return manifest, {name: data for name, data in files.items() if name.startswith("embeddings-")}

    assert embeddings(_files(index)) == embeddings(old_files)
    assert len(DocumentStore.load(index / "documents")) == 3 and not staging.exists()


def test_index_build_and_add_count_one_block_in_the_singular(tmp_path, demo_dir, capsys, monkeypatch):
    monkeypatch.setenv("REALM_HF_DEFAULT_MODEL", str(demo_dir))  # no --model: the default model's embedder
    index = tmp_path / "index"
    corpus = _rows(tmp_path / "one.jsonl", ["Paris is the capital of France."])
    assert main(["index", "build", "--corpus", str(corpus), "--output", str(index), "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == f"indexed 1 block (32-d) in 1 shard at {index}"
    # built with the default model, `index add` needs no --model, and the hint gives none
    assert main(["index", "build", "--corpus", str(corpus), "--output", str(index), "--quiet"]) == 2
    assert f"`realm-hf index add --index {index} --corpus NEW_DOCS`" in capsys.readouterr().err
    more = _rows(tmp_path / "more.jsonl", ["Rome is the capital of Italy."])
    assert main(["index", "add", "--index", str(index), "--corpus", str(more), "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == "added 1 block with id 1; index now holds 2 blocks"


def test_index_build_resumes_a_small_corpus_from_its_last_shard(tmp_path, demo_dir, capsys, monkeypatch):
    """Without --shard-size a build cuts a small corpus into shards of 256 blocks (a 64th of it, at least 256), so an
    interruption loses one shard's work, not the whole build; a rerun resumes with the partial build's own shard size,
    whatever the default would be now."""
    from realm_hf.retrieval import index_builder

    corpus = _rows(tmp_path / "docs.jsonl", [f"Paris is the capital of France, number {i}." for i in range(600)])
    index = tmp_path / "index"
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(corpus), "--output", str(index),
                 "--quiet"]) == 0  # fmt: skip
    manifest = json.loads((index / "index.json").read_text())
    assert manifest["shard_size"] == 256 and [shard["count"] for shard in manifest["shards"]] == [256, 256, 88]
    assert index_builder.default_shard_size(43_829) == 685 and index_builder.default_shard_size(13_353_718) == 16384

    # a build started with 100 blocks a shard, stopped after its first two
    written = []
    original = index_builder.write_embedding_shard

    def write_two_then_stop(path, embeddings):
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(path)
        original(path, embeddings)

    monkeypatch.setattr(index_builder, "write_embedding_shard", write_two_then_stop)
    partial = tmp_path / "partial"
    build = ["index", "build", "--model", str(demo_dir), "--corpus", str(corpus), "--output", str(partial), "--quiet"]
    assert main([*build, "--shard-size", "100"]) == 130 and not (partial / "index.json").exists()
    monkeypatch.setattr(index_builder, "write_embedding_shard", original)
    kept = {path: Path(path).stat().st_mtime_ns for path in written}
    capsys.readouterr()
    assert main(build) == 0  # no --shard-size: the partial build's 100, and its two shards kept
    assert json.loads((partial / "index.json").read_text())["shard_size"] == 100
    assert {path: Path(path).stat().st_mtime_ns for path in written} == kept
    assert "indexed 600 blocks (32-d) in 6 shards" in capsys.readouterr().out


def test_ask_notes_when_the_documents_changed_after_the_index_was_built(tmp_path, demo_dir, capsys, monkeypatch):
    """`index build` records where and when it read the documents; `ask --index` says when they changed since (a
    walkthrough edited the rent, and the index answered the old one without a word), and how to rebuild."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "lease.txt").write_text("The rent is 850 pounds a month.\n", encoding="utf-8")
    (folder / "rules.md").write_text("# Pets\n\nCats are allowed.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    build = ["index", "build", "--model", str(demo_dir), "--corpus", "mine", "--output", "idx", "--quiet"]
    assert main(build) == 0
    ask = ["ask", "--model", str(demo_dir), "--index", "idx", "What is the rent?"]

    def note() -> str:
        assert main(ask) == 0
        return "\n".join(line for line in capsys.readouterr().err.splitlines() if line.startswith("note: the doc"))

    capsys.readouterr()
    assert note() == ""
    later = time.time() + 5
    os.utime(folder / "lease.txt", (later, later))  # edited after the build
    rebuild = f"rebuild it with realm-hf index build --model {demo_dir} --corpus mine --output idx --overwrite"
    assert note() == (f"note: the documents of this index ({folder}) changed after it was built (lease.txt changed): "
                      f"answers come from them as they were; {rebuild}")  # fmt: skip
    (folder / "new.txt").write_text("Bins go out on Mondays.\n", encoding="utf-8")
    os.utime(folder, (later, later))
    assert "(lease.txt, new.txt changed; files were added, removed or renamed)" in note()
    earlier = time.time() - 100
    for path in [folder, *folder.iterdir()]:  # the edits above, made before the rebuild reads them
        os.utime(path, (earlier, earlier))
    assert main([*build, "--overwrite"]) == 0
    capsys.readouterr()
    assert note() == ""  # rebuilt: nothing changed since
    # an index built inside its documents' folder is no change to them
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", "mine", "--output", "mine/idx",
                 "--quiet"]) == 0  # fmt: skip
    assert main(["ask", "--model", str(demo_dir), "--index", "mine/idx", "What is the rent?"]) == 0
    assert "note: the documents" not in capsys.readouterr().err


def test_several_text_columns_write_each_row_as_its_fields(tmp_path, demo_dir, capsys):
    """A file of rows with no text column (a list of contacts): `--text-column name,role,phone` writes each row's text
    from those fields; a column the file lacks is named with the columns found."""
    contacts = tmp_path / "contacts.csv"
    contacts.write_text("name,role,phone,email\nDev Patel,Baker,07700 900789,dev@example.com\n"
                        "Sana Malik,Shop manager,,sana@example.com\n", encoding="utf-8")  # fmt: skip
    index = tmp_path / "index"
    build = ["index", "build", "--model", str(demo_dir), "--corpus", str(contacts), "--output", str(index), "--quiet"]
    assert main(build) == 1
    assert "--text-column name,role,phone writes each row as" in capsys.readouterr().err
    assert main([*build, "--text-column", "name,role,phone"]) == 0
    store = DocumentStore.load(index / "documents")
    assert [store[i]["text"] for i in range(2)] == ["name: Dev Patel; role: Baker; phone: 07700 900789",
                                                   "name: Sana Malik; role: Shop manager"]  # fmt: skip
    assert store[0]["email"] == "dev@example.com"  # the other columns are kept
    assert main([*build, "--overwrite", "--text-column", "name, mobile"]) == 1
    assert (
        "--text-column names ['mobile'], which the file lacks; found columns ['name', 'role', 'phone', 'email']"
        in (capsys.readouterr().err)
    )


def test_answers_over_text_files_name_the_file_they_came_from(tmp_path, demo_dir, capsys, monkeypatch):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "lease.txt").write_text("The rent is 850 pounds a month.\n", encoding="utf-8")
    (folder / "rules.md").write_text("# Pets\n\nCats are allowed in the flat.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", "mine", "--output", "idx", "--quiet"]) == 0
    ask = ["ask", "--model", str(demo_dir), "--index", "idx", "--top-k", "2", "What is the rent?"]
    capsys.readouterr()
    assert main([*ask, "--json"]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    sources = {"lease": "mine/lease.txt", "rules: Pets": "mine/rules.md"}  # as index build read them
    assert answers and all(answer["source"] == sources[answer["title"]] for answer in answers)
    assert main(ask) == 0
    first = answers[0]
    assert (
        f"evidence [block {first['block_id']}, {first['title']!r} in {first['source']}]: " in capsys.readouterr().out
    )
    # rows with no source column know no file
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"title": "Lease", "text": "The rent is 850 pounds a month."}) + "\n", encoding="utf-8")
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(rows), "--output", "rows-idx",
                 "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["ask", "--model", str(demo_dir), "--index", "rows-idx", "--json", "What is the rent?"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] is None

"""DocumentStore: imports (records, JSONL/CSV/TSV/Parquet, block records), memory-mapped save/load, append, adapters."""

import csv
import gc
import gzip
import json
import os
import pickle
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from realm_hf import RealmRetriever, RealmTokenizer
from realm_hf.errors import FileFormatError, MissingColumnError
from realm_hf.retrieval.block_records import UnsafeBlockRecordsError, load_block_records, save_block_records
from realm_hf.retrieval.document_store import (
    MANIFEST_NAME,
    DocumentStore,
    DocumentStoreBlockRecords,
    block_text,
)

CORPUS = [
    {"title": "Paris", "text": "Paris is the capital of France.", "source": "wiki:Paris"},
    {"title": "", "text": "An untitled block.", "source": "misc"},
    {"title": "Japan. Geography. Elevation", "text": "highest point: Mount Fuji 3,776 m", "source": "factbook:ja"},
    {"title": "Caf\u00e9", "text": '\u6f22\u5b57 na\u00efve \U0001f600, "quoted"\nsecond line', "source": "wiki:Cafe"},
    {"title": "Argon", "text": "Argon is a chemical element; it has symbol Ar and atomic number 18.", "source": None},
]


def corpus_store(**kwargs) -> DocumentStore:
    return DocumentStore.from_records(CORPUS, **kwargs)


def documents(store: DocumentStore) -> list[tuple[str, str]]:
    return [(document["title"], document["text"]) for document in store]


EXPECTED = [(record["title"], record["text"]) for record in CORPUS]


# ---------------------------------------------------------------------------------------------------------------------
# records


def test_from_records_ids_access_and_extra_columns():
    store = corpus_store()
    assert len(store) == 5
    assert store.column_names == ["id", "title", "text", "source"]
    assert store[0] == {"id": 0, "title": "Paris", "text": "Paris is the capital of France.", "source": "wiki:Paris"}
    assert store[-1]["id"] == 4 and store[4]["source"] is None
    assert [document["id"] for document in store] == [0, 1, 2, 3, 4]
    assert documents(store) == EXPECTED
    got = store.get(np.array([3, 0, 3]))
    assert [document["id"] for document in got] == [3, 0, 3]
    assert got[0]["text"] == CORPUS[3]["text"]
    assert store.get(torch.tensor([[1], [2]])) == store.get([1, 2])
    assert store.get([]) == []
    assert store.texts([2, 0]) == [CORPUS[2]["text"], CORPUS[0]["text"]]
    assert store.titles([1, 4]) == ["", "Argon"]
    assert store.block_texts([0, 1]) == ["Paris: Paris is the capital of France.", "An untitled block."]
    with pytest.raises(IndexError, match="out of range for 5 documents"):
        store[5]
    with pytest.raises(IndexError, match="document id 7 is out of range"):
        store.get([0, 7])
    with pytest.raises(TypeError, match="use get"):
        store["0"]


def test_from_records_streams_a_generator_across_batches():
    records = ({"text": f"text {i}", "title": None if i % 2 else f"title {i}"} for i in range(23))
    store = DocumentStore.from_records(records, batch_size=4)
    assert len(store) == 23
    assert store[22] == {"id": 22, "title": "title 22", "text": "text 22"}
    assert store[21]["title"] == ""
    assert store.dataset["id"][:] == list(range(23))


def test_from_records_renamed_columns_and_empty():
    store = DocumentStore.from_records([{"body": "b", "heading": "h"}], text_column="body", title_column="heading")
    assert store[0] == {"id": 0, "title": "h", "text": "b"}
    empty = DocumentStore.from_records([])
    assert len(empty) == 0 and empty.column_names == ["id", "title", "text"]
    assert list(empty.iter_batches(3)) == []


@pytest.mark.parametrize(
    "records, match",
    [
        ([{"title": "no text"}], r"record 0 has no text; expected a 'text' field, found fields \['title'\]"),
        ([{"text": 3}], "record 0 field 'text': expected str, received int"),
        ([{"text": "a", "title": 1.5}], "field 'title': expected str or None, received float"),
        ([{"text": "a"}, {"text": "b", "extra": 1}], r"record 1 has field\(s\) \['extra'\] that the first record"),
        ([{"text": "a", "id": 7}], r"\['id'\] would clash with the store's own columns"),
        (["just a string"], "expected record 0 to be a dict, received str"),
        ([{"text": "a", "n": 1}, {"text": "b", "n": "two"}], "column 'n' expected values of one type"),
    ],
)
def test_from_records_errors_name_expected_and_received(records, match):
    with pytest.raises(ValueError, match=match):
        DocumentStore.from_records(records)


def test_from_records_later_batches_keep_the_first_batch_types():
    with pytest.raises(ValueError, match="column 'n' expected values of type int64, received values that do not"):
        DocumentStore.from_records([{"text": "a", "n": 1}, {"text": "b", "n": "two"}], batch_size=1)


def test_from_records_id_column_checked_then_dropped_or_kept():
    in_order = DocumentStore.from_records([{"id": i, "text": str(i)} for i in range(5)], id_column="id", batch_size=2)
    assert in_order.column_names == ["id", "title", "text"]
    shuffled = DocumentStore.from_records([{"id": i, "text": str(i)} for i in (10, 3, 7)], id_column="id")
    assert shuffled.column_names == ["id", "title", "text", "source_id"]
    assert [document["source_id"] for document in shuffled] == [10, 3, 7]
    assert [document["id"] for document in shuffled] == [0, 1, 2]
    named = DocumentStore.from_records([{"doc": "a", "text": "x"}, {"doc": "b", "text": "y"}], id_column="doc")
    assert named.get([0, 1])[1]["source_id"] == "b"


# ---------------------------------------------------------------------------------------------------------------------
# files


def write_jsonl(path: Path, rows: list[dict], opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def write_csv(path: Path, rows: list[dict], delimiter: str = ",") -> Path:
    with open(path, "w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)
    return path


WRITERS = {
    "corpus.jsonl": write_jsonl,
    "corpus.jsonl.gz": lambda path, rows: write_jsonl(path, rows, opener=gzip.open),
    "corpus.csv": write_csv,
    "corpus.tsv": lambda path, rows: write_csv(path, rows, delimiter="\t"),
    "corpus.parquet": write_parquet,
}


@pytest.mark.parametrize("filename", sorted(WRITERS))
def test_from_file_formats(tmp_path, filename):
    path = WRITERS[filename](tmp_path / filename, CORPUS)
    store = DocumentStore.from_file(path, batch_size=2)
    assert len(store) == 5
    assert documents(store) == EXPECTED
    assert store.column_names == ["id", "title", "text", "source"]
    assert store[2]["source"] == "factbook:ja"
    assert store.fingerprint() == corpus_store().fingerprint()


@pytest.mark.parametrize("filename", ["corpus.jsonl", "corpus.csv", "corpus.parquet"])
def test_from_file_id_column(tmp_path, filename):
    in_order = [{"doc_id": i, **record} for i, record in enumerate(CORPUS)]
    store = DocumentStore.from_file(WRITERS[filename](tmp_path / filename, in_order), id_column="doc_id")
    assert "source_id" not in store.column_names and store[4]["id"] == 4

    remapped = [{"doc_id": 100 - i, **record} for i, record in enumerate(CORPUS)]
    store = DocumentStore.from_file(WRITERS[filename](tmp_path / filename, remapped), id_column="doc_id")
    assert [document["source_id"] for document in store] == [100, 99, 98, 97, 96]
    assert [document["id"] for document in store] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("filename", ["corpus.jsonl", "corpus.csv", "corpus.parquet"])
def test_from_file_missing_columns_name_expected_and_found(tmp_path, filename):
    rows = [{"heading": record["title"], "body": record["text"]} for record in CORPUS]
    path = WRITERS[filename](tmp_path / filename, rows)
    with pytest.raises(
        MissingColumnError, match=r"expected a text column 'text', found columns \['heading', 'body'\]$"
    ) as missing:
        DocumentStore.from_file(path)
    # The command line adds its --text-column hint; the Python API names no option it does not have.
    assert (missing.value.column, missing.value.found) == ("text", ["heading", "body"])
    assert isinstance(missing.value, FileFormatError)
    with pytest.raises(ValueError, match=r"expected an id column 'key', found columns \['heading', 'body'\]"):
        DocumentStore.from_file(path, text_column="body", title_column="heading", id_column="key")
    untitled = DocumentStore.from_file(path, text_column="body", title_column="title")  # no such column: titles ""
    assert untitled.titles([0, 1]) == ["", ""] and untitled.column_names == ["id", "title", "text", "heading"]
    titled = DocumentStore.from_file(path, text_column="body", title_column="heading")
    assert documents(titled) == EXPECTED


def test_from_file_rejects_unknown_formats_and_bad_rows(tmp_path):
    (tmp_path / "corpus.xml").write_text("<corpus/>")
    with pytest.raises(ValueError, match="expected a file ending in one of .* pass file_format='jsonl'"):
        DocumentStore.from_file(tmp_path / "corpus.xml")  # the Python API's own argument, which the CLI lacks
    with pytest.raises(FileNotFoundError, match="expected a jsonl file"):
        DocumentStore.from_file(tmp_path / "missing.jsonl")
    (tmp_path / "array.json").write_text('[{"text": "a"}]')  # a .json array is read as records
    assert DocumentStore.from_file(tmp_path / "array.json")[0]["text"] == "a"
    (tmp_path / "array.jsonl").write_text('[{"text": "a"}]')  # but JSON Lines must be lines of objects
    with pytest.raises(ValueError, match="expected JSON Lines"):
        DocumentStore.from_file(tmp_path / "array.jsonl")
    write_parquet(tmp_path / "null.parquet", [{"text": "a"}, {"text": None}, {"text": "c"}])
    with pytest.raises(ValueError, match="row 1 has no text"):
        DocumentStore.from_file(tmp_path / "null.parquet")
    write_parquet(tmp_path / "ints.parquet", [{"text": 1}])
    with pytest.raises(ValueError, match="expected the text column 'text' to hold strings, received type int64"):
        DocumentStore.from_file(tmp_path / "ints.parquet")


# ---------------------------------------------------------------------------------------------------------------------
# block records


def pickled_object_array(path: Path, records: list) -> Path:
    array = np.empty(len(records), dtype=object)
    array[:] = records
    np.save(path, array, allow_pickle=True)
    return path


HUB_RECORDS = [b"This is the first record", "caf\u00e9 \u6f22\u5b57".encode(), b"", b"last record"]


@pytest.mark.parametrize("kind", ["pickled_npy", "safetensors", "directory", "array", "bytes_list", "fixed_width"])
def test_from_block_records(tmp_path, kind):
    if kind == "pickled_npy":
        source = pickled_object_array(tmp_path / "block_records.npy", HUB_RECORDS)
    elif kind == "safetensors":
        source = save_block_records(HUB_RECORDS, tmp_path / "block_records.safetensors")
    elif kind == "directory":
        save_block_records(HUB_RECORDS, tmp_path)
        source = tmp_path
    elif kind == "array":
        source = load_block_records(pickled_object_array(tmp_path / "block_records.npy", HUB_RECORDS))
    elif kind == "bytes_list":
        source = list(HUB_RECORDS)
    else:
        source = np.array(HUB_RECORDS, dtype="S")
    store = DocumentStore.from_block_records(source, batch_size=3)
    assert len(store) == 4
    assert store.titles(range(4)) == ["", "", "", ""]
    assert store.texts(range(4)) == [record.decode() for record in HUB_RECORDS]
    # Untitled blocks give back exactly the original records.
    assert list(store.as_block_records()) == HUB_RECORDS


def test_from_block_records_never_runs_pickle(tmp_path):
    class Exploit:
        def __reduce__(self):
            return (print, ("owned",))

    path = tmp_path / "block_records.npy"
    with open(path, "wb") as file:
        np.lib.format.write_array_header_1_0(file, {"descr": "|O", "fortran_order": False, "shape": (1,)})
        pickle.dump(Exploit(), file)
    with pytest.raises(UnsafeBlockRecordsError, match="builtins.print"):
        DocumentStore.from_block_records(path)


def test_from_block_records_invalid_utf8():
    with pytest.raises(ValueError, match=r"block record 1 is not valid UTF-8.*errors='replace'"):
        DocumentStore.from_block_records([b"ok", b"\xff\xfe"])
    assert DocumentStore.from_block_records([b"ok", b"\xffx"], errors="replace")[1]["text"] == "\ufffdx"
    with pytest.raises(ValueError, match="bytes or str, received int at index 0"):
        DocumentStore.from_block_records([3])


# ---------------------------------------------------------------------------------------------------------------------
# save / load / append


def test_save_load_round_trip_is_memory_mapped(tmp_path):
    store = corpus_store()
    scratch_files = [Path(cache_file["filename"]) for cache_file in store.dataset.cache_files]
    assert scratch_files and all(path.is_file() for path in scratch_files)
    fingerprint = store.fingerprint()

    directory = store.save(tmp_path / "store")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    assert manifest["format"] == "realm_hf.document_store" and manifest["num_documents"] == 5
    assert manifest["fingerprint"] == fingerprint
    assert not any(path.name.endswith(".pkl") for path in directory.iterdir())
    umask = os.umask(0)
    os.umask(umask)
    assert directory.stat().st_mode & 0o777 == 0o777 & ~umask  # a directory's usual mode, not mkdtemp's 0700
    # The saved store now backs this one, and the scratch files are gone.
    assert all(Path(cache_file["filename"]).parent == directory for cache_file in store.dataset.cache_files)
    assert not any(path.exists() for path in scratch_files)

    loaded = DocumentStore.load(directory)
    assert documents(loaded) == EXPECTED and loaded[3]["source"] == "wiki:Cafe"
    assert loaded.fingerprint() == fingerprint
    assert isinstance(loaded.dataset.data, datasets.table.MemoryMappedTable)
    cache_files = [Path(cache_file["filename"]) for cache_file in loaded.dataset.cache_files]
    assert cache_files and all(path.parent == directory and path.suffix == ".arrow" for path in cache_files)


def test_load_does_not_read_the_corpus_into_memory(tmp_path):
    psutil = pytest.importorskip("psutil")
    text = "lorem ipsum dolor sit amet " * 150  # 4 KB per block, 40 MB in all
    store = DocumentStore.from_records({"title": f"t{i}", "text": f"{text}{i}"} for i in range(10_000))
    store.save(tmp_path / "store")
    del store
    gc.collect()
    process = psutil.Process()
    rss_before = process.memory_info().rss
    loaded = DocumentStore.load(tmp_path / "store")
    assert len(loaded) == 10_000 and loaded[5_000]["text"].endswith("5000")
    assert loaded.texts([9_999])[0].endswith("9999")
    assert process.memory_info().rss - rss_before < 10_000_000


def test_save_is_atomic_and_refuses_foreign_directories(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not a document store"):
        corpus_store().save(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    corpus_store().save(empty)
    assert len(DocumentStore.load(empty)) == 5
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty", "foreign"]  # no leftover temp dirs


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected a document store manifest"):
        DocumentStore.load(tmp_path)
    directory = corpus_store().save(tmp_path / "store")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    (directory / MANIFEST_NAME).write_text(json.dumps({**manifest, "version": "99"}))
    with pytest.raises(ValueError, match="expected version '1', received '99'"):
        DocumentStore.load(directory)
    (directory / MANIFEST_NAME).write_text(json.dumps({**manifest, "num_documents": 6}))
    with pytest.raises(ValueError, match="expected 6 documents, the Arrow files hold 5"):
        DocumentStore.load(directory)


def test_append_keeps_ids_and_is_persisted_by_save(tmp_path):
    directory = corpus_store().save(tmp_path / "store")
    store = DocumentStore.load(directory)
    fingerprint = store.fingerprint()
    new_ids = store.append([{"text": "Tokyo is the capital of Japan.", "title": "Tokyo"}, {"text": "more"}])
    assert new_ids == range(5, 7)
    assert store[5] == {"id": 5, "title": "Tokyo", "text": "Tokyo is the capital of Japan.", "source": None}
    assert documents(store)[:5] == EXPECTED
    assert store.fingerprint() != fingerprint
    assert store.append([]) == range(7, 7)
    assert len(DocumentStore.load(directory)) == 5  # unsaved: the directory is untouched

    store.save(directory)  # replaces the store it was loaded from
    reloaded = DocumentStore.load(directory)
    assert len(reloaded) == 7 and reloaded[6]["id"] == 6 and reloaded[6]["text"] == "more"
    assert reloaded.fingerprint() == store.fingerprint()
    assert reloaded.dataset["id"][:] == list(range(7))
    with pytest.raises(ValueError, match=r"record 0 has field\(s\) \['topic'\]"):
        reloaded.append([{"text": "x", "topic": "y"}])


def test_fingerprint_is_content_only():
    assert corpus_store().fingerprint() == corpus_store(batch_size=1).fingerprint()
    assert len(corpus_store().fingerprint()) == 64
    without_source = DocumentStore.from_records([{"title": r["title"], "text": r["text"]} for r in CORPUS])
    assert without_source.fingerprint() == corpus_store().fingerprint()
    # Moving a character between title and text changes the content, and the fingerprint.
    first = DocumentStore.from_records([{"title": "ab", "text": "c"}]).fingerprint()
    second = DocumentStore.from_records([{"title": "a", "text": "bc"}]).fingerprint()
    assert first != second


def test_iter_batches():
    store = corpus_store()
    batches = list(store.iter_batches(2))
    assert [start for start, _, _ in batches] == [0, 2, 4]
    assert [title for _, titles, _ in batches for title in titles] == [record["title"] for record in CORPUS]
    assert list(store.iter_batches(10, start=1, stop=3)) == [
        (1, ["", CORPUS[2]["title"]], [CORPUS[1]["text"], CORPUS[2]["text"]])
    ]
    with pytest.raises(ValueError, match="expected 0 <= start <= stop <= 5"):
        list(store.iter_batches(2, start=3, stop=9))
    with pytest.raises(ValueError, match="batch_size must be at least 1, received 0"):
        list(store.iter_batches(0))


def test_wraps_a_dataset():
    dataset = datasets.Dataset.from_dict({"id": [0, 1, 2], "title": ["a", "b", "c"], "text": ["x", "y", "z"]})
    store = DocumentStore(dataset.select([2, 0, 1]).map(lambda row, i: {"id": i}, with_indices=True))
    assert store.texts([0, 1, 2]) == ["z", "x", "y"]
    with pytest.raises(ValueError, match=r"missing \['title'\], found columns \['id', 'text'\]"):
        DocumentStore(dataset.remove_columns("title"))


# ---------------------------------------------------------------------------------------------------------------------
# block records adapter


def test_as_block_records_stands_in_for_block_records(tmp_path):
    store = corpus_store()
    records = store.as_block_records()
    assert isinstance(records, DocumentStoreBlockRecords) and len(records) == 5
    assert records[0] == b"Paris: Paris is the capital of France."
    assert records[1] == b"An untitled block."
    assert records[-1] == block_text(CORPUS[4]["title"], CORPUS[4]["text"]).encode()
    gathered = records[np.array([[3, 0], [1, 1]])]
    assert gathered.dtype == object and gathered.shape == (2, 2) and gathered[0, 0] == records[3]
    assert list(records[1:3]) == [records[1], records[2]]
    assert records.texts(0) == ["Paris: Paris is the capital of France."]
    assert store.as_block_records(include_title=False)[0] == b"Paris is the capital of France."
    with pytest.raises(IndexError):
        records[5]
    # It can be written to the pickle-free block records file the retriever saves.
    saved = load_block_records(save_block_records(records, tmp_path / "block_records.safetensors"))
    assert list(saved) == list(records)
    # Live view: appended documents appear.
    store.append([{"text": "appended"}])
    assert len(records) == 6 and records[5] == b"appended"


def test_retriever_reads_a_document_store(retrieval_vocab_file):
    store = DocumentStore.from_records([{"title": "", "text": "This is the first record"},
                                        {"title": "second", "text": "is the fourth record"}])  # fmt: skip
    retriever = RealmRetriever(store.as_block_records(), RealmTokenizer(str(retrieval_vocab_file)))
    tokenizer = retriever.tokenizer
    answer_ids = tokenizer(["the fourth"], add_special_tokens=False).input_ids
    has_answers, start_pos, _, concat = retriever(
        np.array([0, 1]), tokenizer(["Test question"]).input_ids, answer_ids=answer_ids, max_length=32,
        return_tensors="np",
    )  # fmt: skip
    assert tokenizer.convert_ids_to_tokens(concat["input_ids"][1])[:8] == [
        "[CLS]", "test", "question", "[SEP]", "second", "[UNK]", "is", "the"
    ]  # fmt: skip
    assert list(has_answers) == [False, True]

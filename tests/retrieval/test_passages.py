"""A user's documents as passages: long texts split at sentence ends, .txt and Markdown files read, and the command
line building an index from them (nothing past the reader's window is lost)."""

import json

import pytest

from realm_hf.cli import index as cli_index
from realm_hf.cli.main import main
from realm_hf.demo import ensure_demo_model
from realm_hf.errors import FileFormatError
from realm_hf.retrieval import passages
from realm_hf.retrieval.document_store import DocumentStore


def test_split_text_packs_whole_sentences_and_cuts_only_overlong_ones():
    assert passages.split_text("One two. Three four five. Six.", 4) == ["One two.", "Three four five. Six."]
    short = "  Short text,\n kept   as written. "
    assert passages.split_text(short, 10) == [short]
    # A sentence longer than the limit is cut into even parts; paragraphs end sentences too.
    words = " ".join(f"w{index}" for index in range(10))
    assert passages.split_text(f"{words}.\n\nnext paragraph here", 4) == [
        "w0 w1 w2", "w3 w4 w5 w6", "w7 w8 w9.", "next paragraph here"]  # fmt: skip
    assert passages.split_text('He said "Stop." Then he left. 3 cats came.', 6) == [
        'He said "Stop." Then he left.', "3 cats came."]  # fmt: skip
    with pytest.raises(ValueError, match="max_words must be at least 1, received 0"):
        passages.split_text("a b", 0)


def test_long_documents_become_passages_that_lead_back_to_their_document(tmp_path):
    sentences = [f"Sentence number {index} is here." for index in range(30)]  # 4 words each
    store = DocumentStore.from_records(
        [{"title": "Short", "text": "Nothing to split.", "url": "a"},
         {"title": "Long", "text": " ".join(sentences), "url": "b"}],
        cache_dir=tmp_path,
    )  # fmt: skip
    assert passages.split_long_documents(store, max_words=200) is store  # nothing longer: the same store
    split = passages.split_long_documents(store, max_words=10)
    rows = list(split)
    assert [row["id"] for row in rows] == list(range(len(rows)))  # blocks are numbered by position
    assert rows[0] == {"id": 0, "title": "Short", "text": "Nothing to split.", "url": "a", "source_id": 0,
                       "passage": 0}  # fmt: skip
    long = rows[1:]
    assert {row["title"] for row in long} == {"Long"} and {row["url"] for row in long} == {"b"}
    assert {row["source_id"] for row in long} == {1} and [row["passage"] for row in long] == list(range(15))
    assert " ".join(row["text"] for row in long) == " ".join(sentences)  # every word kept, in order
    assert all(len(row["text"].split()) <= 10 for row in long)


def test_text_and_markdown_files_become_titled_paragraphs(tmp_path):
    (tmp_path / "warranty_terms.txt").write_text("The warranty lasts\nthree years.\n\n\nIt covers the heater.\n")
    (tmp_path / "manual.md").write_text(
        "Intro text.\n# K-300\n\nA kettle.\n\n## Descaling ##\nEvery 4 weeks.\n\n### \n", encoding="utf-8"
    )
    documents = passages.read_text_files([tmp_path / "warranty_terms.txt", tmp_path / "manual.md"])
    assert [(d["title"], d["text"]) for d in documents] == [
        ("warranty terms", "The warranty lasts three years."),
        ("warranty terms", "It covers the heater."),
        ("manual", "Intro text."),
        ("manual: K-300", "A kettle."),
        ("manual: Descaling", "Every 4 weeks."),
    ]
    assert documents[0]["source"] == str(tmp_path / "warranty_terms.txt")


def test_text_files_saved_with_a_byte_order_mark_read_alike_and_bad_bytes_are_named(tmp_path):
    (tmp_path / "notepad.md").write_bytes(b"\xef\xbb\xbf# Opening hours\n\nOpen from 9:00.\n")
    assert [(d["title"], d["text"]) for d in passages.read_text_files([tmp_path / "notepad.md"])] == [
        ("notepad: Opening hours", "Open from 9:00.")
    ]
    (tmp_path / "latin1.txt").write_bytes(b"Open daily.\n\nCaf\xe9 closed.\n")
    with pytest.raises(FileFormatError, match=r"latin1.txt line 3: expected UTF-8 text, received byte 0xe9 at byte "
                                              r"offset 16 \(save the file as UTF-8\)") as raised:  # fmt: skip
        passages.read_text_files([tmp_path / "latin1.txt"])
    assert raised.value.location == "line 3" and raised.value.path == str(tmp_path / "latin1.txt")

    # With a fallback encoding the file is read with it, and the caller hears which file was.
    fell_back = []
    documents = passages.read_text_files([tmp_path / "notepad.md", tmp_path / "latin1.txt"],
                                         fallback_encoding="cp1252", on_fallback=fell_back.append)  # fmt: skip
    assert [d["text"] for d in documents] == ["Open from 9:00.", "Open daily.", "Café closed."]
    assert fell_back == [tmp_path / "latin1.txt"]
    # Notepad's "Unicode" (UTF-16 with a byte order mark) is read as such, with no fallback
    (tmp_path / "unicode.txt").write_bytes("Überweisung bis Freitag.\n\nDanke.\n".encode("utf-16"))
    assert [d["text"] for d in passages.read_text_files([tmp_path / "unicode.txt"])] == [
        "Überweisung bis Freitag.",
        "Danke.",
    ]
    # bytes that neither encoding reads are named as before
    (tmp_path / "binary.txt").write_bytes(b"ok\n\x81\x8d\n")
    with pytest.raises(FileFormatError, match=r"binary.txt line 2: expected UTF-8 text, received byte 0x81"):
        passages.read_text_files([tmp_path / "binary.txt"], fallback_encoding="cp1252")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


def test_index_build_reads_a_folder_of_notes_and_splits_a_long_row(demo_dir, tmp_path, capsys):
    assert cli_index.DEFAULT_MAX_WORDS == passages.DEFAULT_MAX_WORDS  # the parser's copy of the default
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "france.md").write_text("# France\n\nParis is the capital of France.\n", encoding="utf-8")
    (notes / "japan.txt").write_text("Tokyo is the capital of Japan.\n", encoding="utf-8")
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(notes), "--output",
                 str(tmp_path / "notes-index"), "--quiet"]) == 0  # fmt: skip
    store = DocumentStore.load(tmp_path / "notes-index" / "documents")
    assert [(row["title"], row["text"]) for row in store] == [("france: France", "Paris is the capital of France."),
                                                              ("japan", "Tokyo is the capital of Japan.")]  # fmt: skip

    # One file saved as Windows-1252 among UTF-8 ones is read, and named
    (notes / "oslo.txt").write_bytes("Oslo is the capital of Norway; its café opens at 9.\n".encode("cp1252"))
    capsys.readouterr()
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(notes), "--output",
                 str(tmp_path / "legacy-index"), "--quiet"]) == 0  # fmt: skip
    assert (
        "note: read 1 file as Windows-1252 because it is not UTF-8: oslo.txt (if accented letters look wrong in "
        "answers, save the file as UTF-8 and build again)"
    ) in capsys.readouterr().err
    store = DocumentStore.load(tmp_path / "legacy-index" / "documents")
    assert store[2]["text"] == "Oslo is the capital of Norway; its café opens at 9."

    # A row with a title and no text is indexed as its title; one with neither is left out (an empty block, whose
    # "answer" was empty), and the note names its line.
    blank = tmp_path / "blank.jsonl"
    blank.write_text(
        "".join(json.dumps({"title": t, "text": x}) + "\n" for t, x in [("A", "a"), ("B", " "), ("", ""), ("C", "")])
        + '\n{"text": " "}\n'
    )
    capsys.readouterr()
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(blank), "--output",
                 str(tmp_path / "blank-index"), "--quiet"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "note: left out 2 rows with neither text nor title (lines 3, 6); 3 documents remain" in err
    assert "note: 2 documents have no text (ids 1, 2): they are indexed as their title alone" in err
    store = DocumentStore.load(tmp_path / "blank-index" / "documents")
    assert [(row["id"], row["title"], row["text"]) for row in store] == [(0, "A", "a"), (1, "B", " "), (2, "C", "")]
    table = tmp_path / "blank.csv"
    table.write_text("text,title\n,T\n,\nOslo is the capital of Norway.,Oslo\n")
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(table), "--output",
                 str(tmp_path / "csv-index"), "--quiet"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "note: left out 1 row with neither text nor title (row 1); 2 documents remain" in err
    assert "note: 1 document has no text (id 0): it is indexed as its title alone" in err

    filler = " ".join(f"Belt {index} was checked." for index in range(100))
    rows = tmp_path / "handbook.jsonl"
    rows.write_text(json.dumps({"title": "Handbook", "text": f"{filler} The fire marshal is Henrik Berg."}) + "\n")
    capsys.readouterr()
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(rows), "--output",
                 str(tmp_path / "handbook-index"), "--quiet"]) == 0  # fmt: skip
    assert "note: 1 document -> 4 passages" in capsys.readouterr().err
    store = DocumentStore.load(tmp_path / "handbook-index" / "documents")
    assert store[-1]["text"].endswith("The fire marshal is Henrik Berg.")  # the end of the row is in a block
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(rows), "--output",
                 str(tmp_path / "whole-index"), "--quiet", "--max-words", "0"]) == 0  # fmt: skip
    assert len(DocumentStore.load(tmp_path / "whole-index" / "documents")) == 1


def test_a_json_array_and_other_column_names_are_read(demo_dir, tmp_path):
    faq = tmp_path / "faq.json"
    faq.write_text(json.dumps([{"question": "How long is the warranty?", "answer": "3 years"},
                               {"question": "What does E1 mean?", "answer": "Switched on empty"}], indent=1))  # fmt: skip
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(faq), "--text-column", "answer",
                 "--title-column", "question", "--output", str(tmp_path / "faq-index"), "--quiet"]) == 0  # fmt: skip
    store = DocumentStore.load(tmp_path / "faq-index" / "documents")
    assert [(row["title"], row["text"]) for row in store] == [("How long is the warranty?", "3 years"),
                                                              ("What does E1 mean?", "Switched on empty")]  # fmt: skip


def test_adding_long_documents_to_an_index_of_short_ones(demo_dir, tmp_path, capsys):
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"title": "Kenya", "text": "Nairobi is the capital of Kenya."}) + "\n")
    index = tmp_path / "index"
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(short), "--output", str(index),
                 "--quiet"]) == 0  # fmt: skip
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"title": "Peru", "text": " ".join(["Lima is the capital of Peru."] * 40)}) + "\n")
    # The passages lose the columns the index's documents lack, and keep their title.
    assert main(["index", "add", "--index", str(index), "--model", str(demo_dir), "--corpus", str(long),
                 "--quiet"]) == 0  # fmt: skip
    store = DocumentStore.load(index / "documents")
    assert store.column_names == ["id", "title", "text"] and len(store) == 1 + 2  # 240 words
    assert {row["title"] for row in list(store)[1:]} == {"Peru"}
    # Through the API, a column the index lacks is refused before anything is embedded: the index stays whole.
    from transformers import AutoTokenizer

    import realm_hf.retrieval.index_builder as builder
    from realm_hf import RealmEmbedder
    from realm_hf.errors import InputError
    from realm_hf.retrieval.index_files import read_manifest

    embedder, tokenizer = RealmEmbedder.from_pretrained(demo_dir), AutoTokenizer.from_pretrained(demo_dir)
    with pytest.raises(InputError, match=r"column\(s\) \['url'\] that the index's documents lack"):
        builder.add_documents(embedder, tokenizer, index, [{"title": "x", "text": "y", "url": "z"}], progress=False)
    assert read_manifest(index)["num_blocks"] == len(DocumentStore.load(index / "documents")) == 3


def test_over_section_headings_no_heading_is_an_answer(demo_dir, tmp_path):
    from transformers import pipeline

    from realm_hf import load_open_qa

    rows = [{"title": f"Kettle manual: {section}", "text": text} for section, text in [
        ("warranty", "The warranty lasts three years and covers the heater."),
        ("app", "Pair the kettle with the app using the code 4417."),
        ("cleaning", "Descale the kettle every four weeks with citric acid."),
    ]]  # fmt: skip
    corpus = tmp_path / "manual.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(corpus), "--output",
                 str(tmp_path / "index"), "--quiet"]) == 0  # fmt: skip
    model, retriever = load_open_qa(demo_dir, index=tmp_path / "index")
    open_qa = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever, device="cpu")
    assert open_qa._titles_are_headings()
    question = "How long does the kettle warranty last?"
    answers = open_qa(question, top_k=50)
    assert answers and all(answer["start"] >= len(answer["title"]) + 2 for answer in answers)  # after "title: "
    batched = open_qa([question, "Which code pairs the app?"], top_k=50, batch_size=2)  # collated inputs too
    assert batched[0] == answers or [a["answer"] for a in batched[0]] == [a["answer"] for a in answers]
    kept = open_qa(question, top_k=50, exclude_title_spans=False)
    assert any(answer["start"] < len(answer["title"]) for answer in kept)  # the untrained reader ranks them too


def test_drop_empty_documents_renumbers_the_others_and_keeps_their_columns():
    store = DocumentStore.from_records([{"title": "A", "text": "a", "source": "x"},
                                        {"title": " ", "text": "\n", "source": "y"},
                                        {"title": "", "text": "c", "source": "z"}])  # fmt: skip
    kept, dropped = passages.drop_empty_documents(store)
    assert dropped == [1] and [(row["id"], row["text"], row["source"]) for row in kept] == [(0, "a", "x"),
                                                                                            (1, "c", "z")]  # fmt: skip
    again, none = passages.drop_empty_documents(kept)
    assert again is kept and none == []

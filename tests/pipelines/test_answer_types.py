"""Answer types read from the corpus: the kind a question names, what a title's first sentence says it is, where a
block mentions titles, and the tiers the pipeline's typed-answer rule ranks spans by."""

import pytest

from realm_hf.pipelines.answer_types import (
    OTHER,
    PERSON,
    TYPED,
    AnswerTypes,
    answer_type_tiers,
    asked_type,
    opening_subject,
    stored_answer_types,
    title_types,
)


@pytest.mark.parametrize(
    "question, kind",
    [
        ("In which country is Machu Picchu?", "country"),
        ("Which planet is closest to the Sun?", "planet"),
        ("which sea separates Europe and Africa", "sea"),
        ("What is the largest desert in the world?", "desert"),
        ("What is the capital of Kenya?", "capital"),
        ("In which countries is French spoken?", "country"),
        ("Who founded Microsoft?", PERSON),
        ("Which scientist formulated the laws of motion?", PERSON),
        ("Which composers wrote operas?", PERSON),
        # no kind named: a number, a year, a verb after "what", an open question
        ("In what year did World War II end?", None),
        ("What is 2 + 2?", None),
        ("What did Marie Curie win?", None),
        ("Whose portrait is on the dollar?", None),
        ("How many moons does Mars have?", None),
        ("Where does the Nile flow?", None),
    ],
)
def test_asked_type(question, kind):
    assert asked_type(question) == kind


def test_title_types_read_the_first_sentence_predicate_and_persons():
    cusco = title_types(
        "Cusco", "Cusco: Cusco or Cuzco is a city in southeastern Peru. It is the capital of a region."
    )
    assert "city" in cusco and "peru" not in cusco and PERSON not in cusco
    # the predicate stops at a preposition: Europa is no planet though "Jupiter" follows
    europa = title_types("Europa (moon)", "Europa (moon): Europa is the smallest of the moons of Jupiter, a planet.")
    assert "planet" not in europa and "smallest" in europa
    assert "planet" in title_types("Mercury (planet)", "Mercury is the first planet from the Sun.")  # no "Title: "
    newton = title_types(
        "Isaac Newton", "Isaac Newton: Sir Isaac Newton was an English polymath. He was a key figure; his laws ..."
    )
    assert PERSON in newton and "polymath" in newton
    # a named kind of person is a person even where the text says "it" more often
    assert PERSON in title_types("Ada Lovelace", "Ada Lovelace was an English mathematician. It was ... its ...")
    # an article that says "he" about someone else, whose title is no name, is not a person
    assert PERSON not in title_types(
        "Elliptical galaxy", "Elliptical galaxy: An elliptical galaxy is a type. He saw it"
    )
    assert title_types("Notes", "no copula here and no pronoun") == frozenset()


def test_answer_types_from_titles_and_mentions():
    table = AnswerTypes.from_titles(
        [
            ("Peru", "Peru: Peru, officially the Republic of Peru, is a country in western South America."),
            ("Cusco", "Cusco: Cusco is a city in southeastern Peru."),
            ("Mercury (planet)", "Mercury (planet): Mercury is the first planet from the Sun."),
            ("Mercury (element)", "Mercury (element): Mercury is a chemical element; it has symbol Hg."),
            ("Untyped", "Untyped: nothing to read."),
            ("Nashville, Tennessee", "Nashville, Tennessee: Nashville is the capital of the state of Tennessee."),
        ]
    )
    # a block writes "Nashville" as often as the title: both are the capital, so neither is promoted over the other
    assert "capital" in table.types("Nashville") and "capital" in table.types("Nashville, Tennessee")
    assert "country" in table.types("peru") and "city" in table.types(" Cusco ")
    assert {"planet", "element"} <= table.types("Mercury")  # both articles type the surface without its parenthesis
    assert (
        table.types("Untyped") is None and len(table) == 7
    )  # peru, cusco, mercury, each mercury as titled, nashville x2
    text = "Machu Picchu lies above Cusco, in Peru."
    found = {(text[start:end], "country" in types) for start, end, types in table.mentions(text)}
    assert found == {("Cusco", False), ("Peru", True)}  # the sentence's full stop left out of "Peru"


def test_answer_type_tiers_map_mentions_to_candidate_spans():
    table = AnswerTypes.from_titles(
        [("Peru", "Peru is a country in South America."), ("Cusco", "Cusco is a city in Peru.")]
    )
    text = "Machu Picchu is near Cusco in Peru ."
    words = text.split(" ")
    offsets, position = {}, 0
    for index, word in enumerate(words):
        start = text.index(word, position)
        offsets[index + 1] = (start, start + len(word))  # reader positions start after [CLS] and the question
        position = start + len(word)
    candidates = {(4 + 1, 4 + 1): 0, (6 + 1, 6 + 1): 1, (1, 2): 2, (4 + 1, 6 + 1): 3}  # Cusco, Peru, Machu Picchu, ...
    assert answer_type_tiers(candidates, offsets, text, table, "country") == {0: OTHER, 1: TYPED}
    assert answer_type_tiers(candidates, offsets, text, table, "city") == {0: TYPED, 1: OTHER}
    assert answer_type_tiers(candidates, offsets, text, AnswerTypes(), "city") == {}


def test_answer_types_from_records_with_and_without_titles():
    untitled = ["Paris is the capital and largest city of France.", "Paris Paris is a city.", "the river is long"]
    table = AnswerTypes.from_records(untitled)
    assert opening_subject(untitled[1]) == "Paris" and opening_subject(untitled[2]) is None
    assert {"capital", "city"} <= table.types("Paris") and len(table) == 1
    assert len(AnswerTypes.from_records(untitled, titles_are_headings=True)) == 0
    # a corpus too large to read on first use gets no table
    assert len(AnswerTypes.from_records(untitled, max_blocks=2)) == 0


def test_a_stores_answer_types_are_kept_on_disk_and_read_back(tmp_path, monkeypatch):
    from realm_hf.pipelines import answer_types as module
    from realm_hf.retrieval.document_store import DocumentStore, DocumentStoreBlockRecords

    monkeypatch.setenv("REALM_HF_HOME", str(tmp_path / "home"))
    store = DocumentStore.from_records([{"title": "Lima", "text": "Lima is the capital city of Peru."},
                                        {"title": "Cusco", "text": "Cusco is a city in southeastern Peru."},
                                        {"title": "Cusco", "text": "It was the Inca capital."}],
                                       cache_dir=tmp_path / "store")  # fmt: skip
    records = DocumentStoreBlockRecords(store)
    expected = AnswerTypes.from_records(records).types_by_surface
    assert {"capital", "city"} <= expected["lima"] and "city" in expected["cusco"]
    assert stored_answer_types(records).types_by_surface == expected
    (written,) = (tmp_path / "home" / "answer_types").iterdir()
    assert written.name.startswith(f"{store.fingerprint()}-titles-")
    with monkeypatch.context() as patched:
        patched.setattr(module.AnswerTypes, "from_records", lambda *a, **k: pytest.fail("worked out again, not read"))
        assert stored_answer_types(records).types_by_surface == expected
    # other rules (this module changed) do not read what older ones kept
    module._rules_digest.cache_clear()
    with monkeypatch.context() as patched:
        patched.setattr(module, "_rules_digest", lambda: "newer")
        assert stored_answer_types(records).types_by_surface == expected
    assert len(list((tmp_path / "home" / "answer_types").iterdir())) == 2
    # headings name no thing, and nothing is kept for them
    assert len(stored_answer_types(records, titles_are_headings=True)) == 0
    assert len(list((tmp_path / "home" / "answer_types").iterdir())) == 2
    written.write_text("{not json")  # a damaged file is worked out again and replaced
    assert stored_answer_types(records).types_by_surface == expected

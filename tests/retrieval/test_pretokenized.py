"""PreTokenizedRetriever: the same reader inputs and answer labels as RealmRetriever, from ids tokenized once."""

import struct

import numpy as np
import pytest
import torch
from conftest import tiny_config, write_vocab

from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer
from realm_hf.retrieval.pretokenized import PreTokenizedBlocks, PreTokenizedRetriever, tokenize_corpus

WORDS = [
    "the", "first", "second", "third", "fourth", "fifth", "record", "is", "this", "test", "question", "low", "lowest",
    "paris", "france", "capital", "river", "city", "north", "south", "big", "small", "of", "in", "a", "and",
]  # fmt: skip
VOCAB = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", ",", ".", *WORDS, "want", "##want", "##ed", "un", "runn", "##ing"]  # fmt: skip
QUESTIONS = ["test question", "this is the capital of france", "the lowest river in the north is", "unwanted"]
ANSWERS = [["the fourth", "fifth"], ["paris"], ["river", "the north"], ["unwanted", "low"]]


def _corpus(num_blocks: int = 30) -> list[str]:
    rng = np.random.default_rng(0)
    words = [*WORDS, "unwanted", "running", ",", "."]
    return [" ".join(rng.choice(words, size=int(rng.integers(0, 24)))) for _ in range(num_blocks)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pretokenized")
    tokenizer = RealmTokenizer(str(write_vocab(directory / "vocab", VOCAB)))
    texts = _corpus()
    path = tokenize_corpus(tokenizer, texts, directory / "blocks.safetensors", batch_size=7)
    blocks = PreTokenizedBlocks.open(path)
    reference = RealmRetriever(np.array([text.encode() for text in texts], dtype=object), tokenizer)
    retriever = PreTokenizedRetriever(blocks, tokenizer, block_records=reference.block_records)
    return tokenizer, texts, path, retriever, reference


def _answer_ids(tokenizer, answers):
    return tokenizer(answers, add_special_tokens=False, return_token_type_ids=False,
                     return_attention_mask=False).input_ids  # fmt: skip


def _assert_same(expected, received):
    assert expected[:3] == received[:3]  # has_answers, start_pos, end_pos: Python lists
    assert sorted(expected[3]) == sorted(received[3])
    for key in expected[3]:
        assert torch.equal(expected[3][key], received[3][key]), key


def test_round_trip(setup):
    tokenizer, texts, path, retriever, _ = setup
    blocks = PreTokenizedBlocks.open(path)
    assert len(blocks) == len(texts) == len(retriever)
    for index, text in enumerate(texts):
        expected = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert blocks[index].dtype == np.int32 and blocks[index].tolist() == expected
    assert blocks[-1].tolist() == blocks[len(texts) - 1].tolist()
    assert blocks.metadata["vocab_size"] == str(len(tokenizer)) and blocks.metadata["num_blocks"] == str(len(texts))
    assert not list(path.parent.glob(".*.tmp"))  # the atomic write left no temporary file
    with pytest.raises(IndexError):
        blocks[len(texts)]


def test_max_block_length_and_document_store(setup, tmp_path):
    from realm_hf.retrieval import DocumentStore

    tokenizer, texts, _, _, _ = setup
    store = DocumentStore.from_records([{"text": text} for text in texts])
    blocks = PreTokenizedBlocks.open(tokenize_corpus(tokenizer, store, tmp_path / "b.safetensors", max_block_length=5))
    for index, text in enumerate(texts):
        assert blocks[index].tolist() == tokenizer(text, add_special_tokens=False)["input_ids"][:5]


@pytest.mark.parametrize("question_index", range(len(QUESTIONS)))
def test_equals_realm_retriever_without_truncation(setup, question_index):
    tokenizer, texts, _, retriever, reference = setup
    question = tokenizer([QUESTIONS[question_index]], padding="max_length", max_length=16, return_tensors="pt")
    answers = _answer_ids(tokenizer, ANSWERS[question_index])
    block_ids = np.random.default_rng(question_index).permutation(len(texts))[:20]
    expected = reference(block_ids, question.input_ids, answers, max_length=320)
    received = retriever(block_ids, question.input_ids, answers, max_length=320)
    _assert_same(expected, received)
    assert any(expected[0])  # the answers really occur somewhere
    assert retriever(block_ids, question.input_ids, None, max_length=320)[:3] == (None, None, None)


@pytest.mark.parametrize("max_length", [4, 7, 10, 13, 16])
@pytest.mark.parametrize("question_index", range(len(QUESTIONS)))
def test_longest_first_truncation_equals_the_tokenizer(setup, max_length, question_index):
    tokenizer, texts, _, retriever, reference = setup
    question = tokenizer([QUESTIONS[question_index]], return_tensors="pt")
    answers = _answer_ids(tokenizer, ANSWERS[question_index])
    block_ids = np.arange(len(texts))
    _assert_same(reference(block_ids, question.input_ids, answers, max_length=max_length),
                 retriever(block_ids, question.input_ids, answers, max_length=max_length))  # fmt: skip


def test_left_padding(setup):
    import copy

    tokenizer, texts, _, retriever, reference = setup
    left = copy.deepcopy(tokenizer)
    left.padding_side = "left"
    question = left(["the lowest river in the north is"], return_tensors="pt")
    answers = _answer_ids(tokenizer, ANSWERS[2])
    block_ids = np.arange(len(texts))
    _assert_same(
        RealmRetriever(reference.block_records, left)(block_ids, question.input_ids, answers, max_length=12),
        PreTokenizedRetriever(retriever.blocks, left)(block_ids, question.input_ids, answers, max_length=12),
    )


def test_numpy_and_list_outputs(setup):
    tokenizer, _, _, retriever, reference = setup
    question = tokenizer(["test question"]).input_ids
    for return_tensors in ("np", None):
        expected = reference(np.int64(3), question, [], max_length=32, return_tensors=return_tensors)
        received = retriever(np.int64(3), question, [], max_length=32, return_tensors=return_tensors)
        assert expected[:3] == received[:3] == ([False], [[]], [[]])
        for key in expected[3]:
            assert np.array_equal(np.asarray(expected[3][key]), np.asarray(received[3][key]))


def test_errors(setup, tmp_path):
    tokenizer, texts, path, retriever, _ = setup
    with pytest.raises(ValueError, match=r"must lie in \[0, 30\)"):
        retriever(np.array([0, 30]), tokenizer(["test"]).input_ids)
    other = RealmTokenizer(str(write_vocab(tmp_path / "other", VOCAB[:-1])))
    with pytest.raises(ValueError, match="vocabulary of 39 tokens.*the tokenizer has 38"):
        PreTokenizedRetriever(PreTokenizedBlocks.open(path), other)

    data = path.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[:-3])
    with pytest.raises(ValueError, match="truncated: expected"):
        PreTokenizedBlocks.open(truncated)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(struct.pack("<Q", 10**6) + data[8:])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        PreTokenizedBlocks.open(corrupt)
    not_ours = tmp_path / "block_records.safetensors"
    from realm_hf.retrieval import save_block_records

    save_block_records([b"x"], not_ours)
    with pytest.raises(ValueError, match="expected safetensors metadata format 'realm_hf.pretokenized_blocks'"):
        PreTokenizedBlocks.open(not_ours)


def test_open_qa_gives_the_same_losses_and_answers(setup):
    tokenizer, texts, _, retriever, reference = setup
    torch.manual_seed(0)
    config = tiny_config(vocab_size=len(VOCAB), num_block_records=len(texts), reader_beam_size=3, searcher_beam_size=8)
    model = RealmForOpenQA(config, retriever=reference)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
        model.block_emb.normal_()
    model.eval()
    batch = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    answers = [_answer_ids(tokenizer, answers) for answers in ANSWERS]
    expected = model(**batch, answer_ids=answers)
    model.retriever = retriever
    received = model(**batch, answer_ids=answers)
    assert expected.reader_output.retriever_correct.any()
    torch.testing.assert_close(expected.reader_output.loss, received.reader_output.loss, rtol=0, atol=0)
    for field in ("retriever_loss", "reader_loss", "retriever_correct", "reader_correct", "block_idx", "start_pos"):
        assert torch.equal(getattr(expected.reader_output, field), getattr(received.reader_output, field)), field
    assert torch.equal(expected.retrieved_block_ids, received.retrieved_block_ids)
    for left, right in zip(expected.predicted_answer_ids, received.predicted_answer_ids):
        assert torch.equal(left, right)


# ---------------------------------------------------------------------------------------------------------------------
# the batched contract, blocks tokenized on first retrieval, left truncation


def _batch(tokenizer, seed: int = 0):
    questions = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    block_ids = torch.as_tensor(np.random.default_rng(seed).permutation(30)[:24].reshape(4, 6))  # (B=4, K=6)
    answers = [_answer_ids(tokenizer, answer) for answer in ANSWERS]
    return block_ids, questions.input_ids, answers


@pytest.mark.parametrize("with_answers", [True, False])
@pytest.mark.parametrize("num_read", [None, 3])
def test_batched_retrieve_equals_realm_retriever(setup, with_answers, num_read):
    from realm_hf.retrieval import ReaderInputs, Retriever

    tokenizer, _, _, retriever, reference = setup
    block_ids, questions, answers = _batch(tokenizer)
    answers = answers if with_answers else None
    assert isinstance(retriever, Retriever) and isinstance(reference, Retriever)
    expected = reference.retrieve(block_ids, questions, answers, max_length=14, num_read=num_read)
    received = retriever.retrieve(block_ids, questions, answers, max_length=14, num_read=num_read)
    assert isinstance(received, ReaderInputs) and isinstance(received, tuple)
    read = 6 if num_read is None else num_read
    assert received.concat_inputs["input_ids"].shape[:2] == (4, read)
    for key in expected.concat_inputs:
        assert torch.equal(expected.concat_inputs[key], received.concat_inputs[key]), key
    if with_answers:
        assert received.has_answers.shape == (4, 6) and torch.equal(expected.has_answers, received.has_answers)
        assert bool(received.has_answers.any())
        assert torch.equal(expected.start_pos, received.start_pos) and torch.equal(expected.end_pos, received.end_pos)
    else:
        assert received[:3] == (None, None, None)


def test_blocks_tokenized_on_first_retrieval_equal_the_file(setup):
    from realm_hf.retrieval import TokenizedBlockCache

    tokenizer, texts, _, retriever, reference = setup
    lazy = PreTokenizedRetriever.from_block_records(reference.block_records, tokenizer)
    block_ids, questions, answers = _batch(tokenizer, seed=1)
    expected = retriever.retrieve(block_ids, questions, answers, max_length=320)
    received = lazy.retrieve(block_ids, questions, answers, max_length=320)
    for key in expected.concat_inputs:
        assert torch.equal(expected.concat_inputs[key], received.concat_inputs[key]), key
    assert torch.equal(expected.start_pos, received.start_pos)
    # The offsets of that one tokenization locate every wordpiece in the text.
    assert isinstance(lazy.blocks, TokenizedBlockCache)
    for block_id in block_ids.reshape(-1).tolist():
        text, offsets = lazy.block_offsets(block_id)
        pieces = tokenizer.convert_ids_to_tokens(retriever.blocks[block_id].tolist())
        assert text == texts[block_id] and len(offsets) == len(pieces)
        for piece, (start, end) in zip(pieces, offsets.tolist(), strict=True):
            assert text[start:end] == piece.removeprefix("##") or piece == "[UNK]"
    small = TokenizedBlockCache(reference.block_records, tokenizer, max_blocks=4)
    small.ragged(np.arange(10))
    assert len(small._cache) == 4  # least recently used blocks leave


def test_left_truncation_keeps_the_last_wordpieces(setup):
    import copy

    tokenizer, texts, _, retriever, reference = setup
    left = copy.deepcopy(tokenizer)
    left.truncation_side = "left"
    question = left([QUESTIONS[2]], return_tensors="pt")
    answers = _answer_ids(tokenizer, ANSWERS[2])
    block_ids = np.arange(len(texts))
    for max_length in (6, 9, 12):
        _assert_same(
            RealmRetriever(reference.block_records, left)(
                block_ids, question.input_ids, answers, max_length=max_length
            ),
            PreTokenizedRetriever(retriever.blocks, left)(
                block_ids, question.input_ids, answers, max_length=max_length
            ),
        )


@pytest.mark.parametrize("truncation_side", ["right", "left"])
@pytest.mark.parametrize("max_length", [12, 14, 320])
def test_unread_blocks_are_labelled_without_their_rows(setup, truncation_side, max_length):
    """With num_read, only the read blocks get reader rows; has_answers of the others comes from their wordpieces
    (`blocks_holding_answer`) and equals what rows for every block give, truncation included."""
    import copy

    tokenizer, _, _, retriever, _ = setup
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.truncation_side = truncation_side
    retriever = PreTokenizedRetriever(retriever.blocks, tokenizer)
    block_ids, questions, answers = _batch(tokenizer, seed=2)
    every_row = retriever.retrieve(block_ids, questions, answers, max_length=max_length)
    read_two = retriever.retrieve(block_ids, questions, answers, max_length=max_length, num_read=2)
    assert read_two.concat_inputs["input_ids"].shape[:2] == (4, 2)
    assert torch.equal(every_row.has_answers, read_two.has_answers)
    assert bool(read_two.has_answers[:, 2:].any())  # the unread blocks hold answers to find
    matches = read_two.start_pos.shape[-1]
    for field in ("start_pos", "end_pos"):
        expected = getattr(every_row, field)[:, :2]
        assert torch.equal(expected[..., :matches], getattr(read_two, field))
        assert bool((expected[..., matches:] == -1).all())


def test_blocks_holding_answer_matches_whole_answers_inside_blocks():
    from realm_hf.retrieval.pretokenized import blocks_holding_answer

    token_ids = np.array([5, 6, 7, 8, 9, 5, 6, 1, 2, 3])
    starts, lengths = np.array([0, 4, 7, 3]), np.array([4, 3, 3, 0])  # [5 6 7 8] [9 5 6] [1 2 3] []
    assert blocks_holding_answer(token_ids, starts, lengths, [[5, 6]]).tolist() == [True, True, False, False]
    # [8, 9] spans blocks 0 and 1 in token_ids: neither holds it; an empty answer matches nothing.
    assert blocks_holding_answer(token_ids, starts, lengths, [[8, 9], []]).tolist() == [False] * 4
    assert blocks_holding_answer(token_ids, starts, lengths, [[3], [9]]).tolist() == [False, True, True, False]
    assert blocks_holding_answer(token_ids, starts[:0], lengths[:0], [[5]]).tolist() == []


def test_answers_with_special_tokens_get_every_row(setup):
    """4.x's labels let a match run from the block into its [SEP]; such answers get rows for every block, as there."""
    tokenizer, _, _, retriever, reference = setup
    block_ids, questions, answers = _batch(tokenizer)
    answers = [[[*answer[-1:], tokenizer.sep_token_id] for answer in question if answer] for question in answers]
    expected = reference.retrieve(block_ids, questions, answers, max_length=14, num_read=2)
    received = retriever.retrieve(block_ids, questions, answers, max_length=14, num_read=2)
    assert torch.equal(expected.has_answers, received.has_answers) and bool(received.has_answers.any())
    assert torch.equal(expected.start_pos, received.start_pos)

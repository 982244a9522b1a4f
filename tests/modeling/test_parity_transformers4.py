"""Parity with transformers 4.44.2, the behavioural reference, on Hub-style checkpoints it wrote.

The golden files in tests/fixtures/realm4 come from `make_golden.py` (run with transformers 4.44.2 in a side venv):
`pytorch_model.bin` files with 4.16-era legacy keys, config.json with `searcher_seq_len`/`use_cache`, a pickled
`block_records.npy`, and the reference outputs of every class. Here realm_hf loads those files and must reproduce the
outputs. README.md in that folder documents every key.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import seed_hub_cache
from safetensors.torch import load_file

from realm_hf import (
    RealmEmbedder,
    RealmForOpenQA,
    RealmKnowledgeAugEncoder,
    RealmReader,
    RealmRetriever,
    RealmScorer,
    RealmTokenizer,
)

GOLDEN = Path(__file__).parents[1] / "fixtures" / "realm4"
ATOL = 1e-4


def golden(component: str) -> tuple[dict, dict, dict]:
    tensors = load_file(GOLDEN / f"{component}_io.safetensors")
    inputs = {key[len("input.") :]: value for key, value in tensors.items() if key.startswith("input.")}
    outputs = {key[len("output.") :]: value for key, value in tensors.items() if key.startswith("output.")}
    return inputs, outputs, json.loads((GOLDEN / f"{component}_io.json").read_text())


def assert_close(actual: torch.Tensor, expected: torch.Tensor, name: str = ""):
    if expected.dtype == torch.uint8:  # bools are stored as uint8
        expected = expected.bool()
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    if expected.is_floating_point():
        torch.testing.assert_close(actual.float(), expected, atol=ATOL, rtol=0, msg=name)
    else:
        assert torch.equal(actual.to(expected.dtype), expected), f"{name}: {actual} != {expected}"


@pytest.mark.parametrize(
    ("directory", "model_class"),
    [
        ("embedder", RealmEmbedder),
        ("scorer", RealmScorer),
        ("encoder", RealmKnowledgeAugEncoder),
        ("reader", RealmReader),
        ("openqa", RealmForOpenQA),
    ],
)
def test_hub_checkpoints_load_with_no_missing_or_unexpected_keys(directory, model_class):
    model, info = model_class.from_pretrained(GOLDEN / directory, output_loading_info=True)
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"], info["unexpected_keys"]
    assert not info["mismatched_keys"], info["mismatched_keys"]
    assert not model.training
    assert model.config.searcher_seq_len == 64
    # every tensor of the 4.x file is in the model, under the same name
    legacy = torch.load(GOLDEN / directory / "pytorch_model.bin", weights_only=True)
    state = model.state_dict()
    for key, value in legacy.items():
        if key.endswith("position_ids"):
            continue
        target = key.replace("query_embedder.", "embedder.") if directory == "scorer" else key
        assert torch.equal(state[target], value), key


def test_embedder_outputs_and_gradients():
    inputs, outputs, _ = golden("embedder")
    model = RealmEmbedder.from_pretrained(GOLDEN / "embedder", attn_implementation="eager")
    result = model(
        inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        token_type_ids=inputs["token_type_ids"],
        output_hidden_states=True,
        output_attentions=True,
    )
    assert_close(result.projected_score, outputs["projected_score"], "projected_score")
    for index, hidden in enumerate(result.hidden_states):
        assert_close(hidden, outputs[f"hidden_states.{index}"], f"hidden_states.{index}")
    for index, attention in enumerate(result.attentions):
        assert_close(attention, outputs[f"attentions.{index}"], f"attentions.{index}")

    model.train()
    projected = model(
        inputs["grad_input_ids"], attention_mask=inputs["attention_mask"], token_type_ids=inputs["token_type_ids"]
    ).projected_score
    loss = (projected * inputs["grad_weight"]).sum()
    assert_close(loss, outputs["grad_loss"], "grad_loss")
    loss.backward()
    parameters = dict(model.named_parameters())
    for key, expected in outputs.items():
        if key.startswith("grad.") and not key.startswith("grad_"):
            assert_close(parameters[key[len("grad.") :]].grad, expected, key)
    # the padding row (id 1 = config.pad_token_id) never receives a gradient, as in 4.x
    assert torch.count_nonzero(parameters["realm.embeddings.word_embeddings.weight"].grad[1]) == 0


def test_scorer_outputs():
    inputs, outputs, _ = golden("scorer")
    model = RealmScorer.from_pretrained(GOLDEN / "scorer")
    result = model(
        inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        token_type_ids=inputs["token_type_ids"],
        candidate_input_ids=inputs["candidate_input_ids"],
        candidate_attention_mask=inputs["candidate_attention_mask"],
        candidate_token_type_ids=inputs["candidate_token_type_ids"],
    )
    for name in ("relevance_score", "query_score", "candidate_score"):
        assert_close(getattr(result, name), outputs[name], name)


def test_knowledge_augmented_encoder_outputs():
    inputs, outputs, _ = golden("encoder")
    model = RealmKnowledgeAugEncoder.from_pretrained(GOLDEN / "encoder")
    common = {
        "attention_mask": inputs["attention_mask"],
        "token_type_ids": inputs["token_type_ids"],
        "relevance_score": inputs["relevance_score"],
        "labels": inputs["labels"],
    }
    result = model(inputs["input_ids"], mlm_mask=inputs["mlm_mask"], **common)
    assert_close(result.logits, outputs["logits"], "logits")
    assert_close(result.loss, outputs["loss"], "loss")
    assert_close(model(inputs["input_ids"], **common).loss, outputs["loss_no_mask"], "loss_no_mask")


def test_reader_outputs():
    inputs, outputs, _ = golden("reader")
    model = RealmReader.from_pretrained(GOLDEN / "reader")
    common = {
        "attention_mask": inputs["attention_mask"],
        "token_type_ids": inputs["token_type_ids"],
        "relevance_score": inputs["relevance_score"],
        "block_mask": inputs["block_mask"].bool(),
    }
    result = model(
        inputs["input_ids"],
        start_positions=inputs["start_positions"],
        end_positions=inputs["end_positions"],
        has_answers=inputs["has_answers"].bool(),
        **common,
    )
    for name in ("loss", "retriever_loss", "reader_loss", "retriever_correct", "reader_correct", "block_idx",
                 "candidate", "start_pos", "end_pos"):  # fmt: skip
        assert_close(getattr(result, name), outputs[name], name)
    result = model(inputs["input_ids"], **common)
    for name in ("block_idx", "candidate", "start_pos", "end_pos"):
        assert_close(getattr(result, name), outputs[f"nolabel.{name}"], f"nolabel.{name}")


@pytest.fixture(scope="module")
def open_qa():
    retriever = RealmRetriever.from_pretrained(GOLDEN / "openqa")
    model = RealmForOpenQA.from_pretrained(GOLDEN / "openqa", retriever=retriever)
    return model, retriever.tokenizer


def _question(inputs: dict, index: int) -> dict:
    return {name: inputs[f"q{index}.{name}"] for name in ("input_ids", "attention_mask", "token_type_ids")}


PREDICTION_FIELDS = ("block_idx", "candidate", "start_pos", "end_pos")
LOSS_FIELDS = ("loss", "retriever_loss", "reader_loss", "retriever_correct", "reader_correct")


@pytest.mark.parametrize("index", [0, 1, 2])
def test_open_qa_eval_matches(open_qa, index):
    model, tokenizer = open_qa
    inputs, outputs, meta = golden("openqa")
    model.eval()
    result = model(**_question(inputs, index))
    prefix = f"q{index}.eval."
    assert_close(result.predicted_answer_ids, outputs[prefix + "predicted_answer_ids"], "predicted_answer_ids")
    assert_close(result.retrieved_block_ids[0], outputs[prefix + "retrieved_block_ids"], "retrieved_block_ids")
    for name in PREDICTION_FIELDS:
        assert_close(getattr(result.reader_output, name), outputs[prefix + name], prefix + name)
    assert tokenizer.decode(result.predicted_answer_ids) == meta["decoded_predictions"][f"q{index}.eval"]

    with_answers = model(**_question(inputs, index), answer_ids=meta["answer_ids"][index])
    prefix = f"q{index}.eval_ans."
    for name in PREDICTION_FIELDS + LOSS_FIELDS:
        assert_close(getattr(with_answers.reader_output, name), outputs[prefix + name], prefix + name)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_open_qa_train_mode_losses_and_gradients_match(open_qa, index):
    model, _ = open_qa
    inputs, outputs, meta = golden("openqa")
    model.train()
    model.zero_grad()
    try:
        result = model(**_question(inputs, index), answer_ids=meta["answer_ids"][index])
        prefix = f"q{index}.train."
        assert_close(result.retrieved_block_ids[0], outputs[prefix + "retrieved_block_ids"], "retrieved_block_ids")
        for name in PREDICTION_FIELDS + LOSS_FIELDS:
            assert_close(getattr(result.reader_output, name), outputs[prefix + name], prefix + name)
        assert_close(result.predicted_answer_ids, outputs[prefix + "predicted_answer_ids"], "predicted_answer_ids")
        result.reader_output.loss.backward()
        parameters = dict(model.named_parameters())
        for key, expected in outputs.items():
            if key.startswith(prefix + "grad."):
                assert_close(parameters[key[len(prefix + "grad.") :]].grad, expected, key)
    finally:
        model.eval()
        model.zero_grad()


def test_open_qa_batch_of_golden_questions_equals_the_reference(open_qa):
    model, tokenizer = open_qa
    inputs, outputs, meta = golden("openqa")
    model.eval()
    batch = tokenizer(meta["questions"], padding=True, return_tensors="pt")
    result = model(**batch, answer_ids=meta["answer_ids"])
    for index in range(3):
        prefix = f"q{index}.eval_ans."
        assert_close(result.predicted_answer_ids[index], outputs[prefix + "predicted_answer_ids"], "answer")
        for name in ("retriever_loss", "reader_loss", "retriever_correct", "block_idx", "start_pos", "end_pos"):
            expected = outputs[prefix + name].reshape(()) if name.endswith("_pos") else outputs[prefix + name]
            assert_close(getattr(result.reader_output, name)[index], expected, prefix + name)
        # The batch is padded to its longest question, so span indices differ; the gold spans themselves must not.
        assert _gold_spans(result.reader_output.reader_correct[index]) == _gold_spans(
            outputs[prefix + "reader_correct"]
        )


def _gold_spans(reader_correct: torch.Tensor) -> set[tuple[int, int, int]]:
    """`(block, start, end)` of every span flagged correct in a `(R, N)` matrix over width-major span candidates."""
    from realm_hf.modeling.modeling_realm import span_candidates

    num_spans, width = reader_correct.shape[-1], 3  # max_span_width of the golden config
    seq_len = (num_spans + width * (width - 1) // 2) // width
    starts, ends = span_candidates(seq_len, width)
    blocks, spans = torch.nonzero(reader_correct.bool(), as_tuple=True)
    return {(int(b), int(starts[n]), int(ends[n])) for b, n in zip(blocks, spans)}


def test_open_qa_from_a_repo_id_in_the_offline_cache(open_qa):
    seed_hub_cache("qqaatw/realm-orqa-nq-openqa", GOLDEN / "openqa")
    retriever = RealmRetriever.from_pretrained("qqaatw/realm-orqa-nq-openqa")
    model = RealmForOpenQA.from_pretrained("qqaatw/realm-orqa-nq-openqa", retriever=retriever)
    assert model.name_or_path == "qqaatw/realm-orqa-nq-openqa"
    inputs, outputs, _ = golden("openqa")
    result = model(**_question(inputs, 0))
    assert_close(result.predicted_answer_ids, outputs["q0.eval.predicted_answer_ids"], "predicted_answer_ids")


def test_tokenizer_matches():
    reference = json.loads((GOLDEN / "tokenizer_io.json").read_text())
    tokenizer = RealmTokenizer(str(GOLDEN / "vocab.txt"))
    for case in reference["encode"]:
        encoded = tokenizer(case["text"], case["text_pair"], return_special_tokens_mask=True)
        for key in ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask"):
            assert encoded[key] == case[key], (case["text"], key)
        assert tokenizer.decode(encoded["input_ids"], skip_special_tokens=True) == case["decode_skip_special_tokens"]
    for case in reference["batch_encode_candidates"]:
        kwargs = dict(case["kwargs"])
        if case["text_pair"] is not None:
            kwargs["text_pair"] = case["text_pair"]
        encoded = tokenizer.batch_encode_candidates(case["text"], **kwargs)
        for key in case["output_keys"]:
            assert encoded[key] == case["output"][key], (case["name"], key)


@pytest.mark.parametrize("case_name", ["basic", "truncated", "wordpiece", "no_match", "no_answers"])
def test_retriever_matches(case_name):
    reference = json.loads((GOLDEN / "retriever_io.json").read_text())
    case = next(case for case in reference["cases"] if case["name"] == case_name)
    retriever = RealmRetriever.from_pretrained(GOLDEN / "openqa")
    has_answers, start_pos, end_pos, concat = retriever(
        np.array(case["retrieved_block_ids"]),
        case["question_input_ids"],
        case["answer_ids"],
        max_length=case["max_length"],
        return_tensors="np",
    )
    expected = case["output"]
    assert (has_answers, start_pos, end_pos) == (expected["has_answers"], expected["start_pos"], expected["end_pos"])
    for key in expected["concat_keys"]:
        assert concat[key].tolist() == expected[key], key


@pytest.mark.parametrize(
    ("model_class", "checkpoint", "part"),
    [(RealmEmbedder, "openqa", "embedder"), (RealmReader, "openqa", "reader"), (RealmEmbedder, "scorer", "embedder")],
)
def test_sub_models_load_from_composite_checkpoints(model_class, checkpoint, part):
    # 4.x loaded every weight as missing here; realm_hf takes the sub-model's part of the checkpoint.
    model, info = model_class.from_pretrained(GOLDEN / checkpoint, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    composite = torch.load(GOLDEN / checkpoint / "pytorch_model.bin", weights_only=True)
    for key, value in model.state_dict().items():
        assert torch.equal(value, composite[f"{part}.{key}"]), key

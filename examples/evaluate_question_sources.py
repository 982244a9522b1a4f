"""Per-source dev results for an open-QA model, dense vs BM25 vs hybrid candidates, and its calibration.

    python examples/evaluate_question_sources.py --model models/realm-minilm-factbook \
        --questions build/default_model/question_sources --output examples/results/default_model_sources.json \
        --fit-calibration --plot docs/images/accuracy_coverage.png

1. The question sources of `realm_hf.data.question_sources` (written to --questions if missing: about a minute, plus
   the bsdgames download).
2. For each source's dev set (at most --max-per-source questions, a fixed sample), three candidate sets read by the
   same model: its dense search, BM25's blocks (`HybridSearcher` with `bm25_fraction=1`, "BM25 + the same reader"),
   and the hybrid union (`--bm25-fraction`), each scored by the model's relevance. Metrics: answer recall@1/5/20 of
   the candidate lists (all sampled questions), EM and the answer in the top evidence block (the first
   --max-read-per-source of them: reading is what costs time on a CPU). With several --bm25-weights the hybrid is
   read with each BM25 term in its relevance, on the dev sources and on --seen-per-source training questions per
   source, and the smallest weight within one standard error of the best mean EM is the hybrid system.
3. With --choose-searcher: the candidates with the higher mean dev EM over the sources, dense or hybrid, become the
   model's own (`searcher.json` written into --model for hybrid, removed for dense).
4. With --fit-calibration: a logistic calibration fitted on the dev answers of the model's own searcher (unanswerable
   questions count as wrong). For each candidate feature set, the budget (the share of each source's right dev
   answers the threshold may abstain on) is the largest, in 1% steps up to --dev-budget (15%), at which a
   calibration fitted without a source abstains on at most --max-correct-abstained (the goal, 25%) of that source's
   right answers, for every source (leave-one-source-out: a stand-in for kinds of question no dev set has); the set
   that then abstains on the most unanswerable dev questions is chosen (--pooled-threshold: budgets over all sources
   pooled). Both goals are measured on the test split (at most --max-test-per-source per source) and on
   --check-questions (questions people wrote, of no source, never fitted on); `calibration.json` is written into
   --model, and an accuracy-coverage plot (--plot, needs matplotlib: `pip install realm_hf[plot]`).
5. With --document-sets (and --fit-calibration): each set of documents and questions read over an index of its own
   documents, as a user's; the calibration's threshold over a user's documents (`documents_threshold`) is the highest
   that abstains on at most --max-correct-abstained of their right answers, pooled (leave-one-set-out reported).
   --check-document-sets are read alike and never fitted on.

Writes one JSON (--output) with every number; the model card and docs/default-model.md quote it.
"""

import argparse
import importlib.util
import json
import logging
import math
import random
import time
from pathlib import Path
from typing import NamedTuple

import torch

logger = logging.getLogger("evaluate_question_sources")

KS = (1, 5, 20)
# Candidate calibration features (names from realm_hf.evaluation.calibration.CALIBRATION_FEATURES). Raw logits
# (span_logit, max_retrieval_logit) are left out: their scale shifts from one kind of question to another. With them
# ("all" five), leave-one-source-out chose them at a 15% budget (worst held-out source 12.9%), and 44% of the right
# answers to people's questions (examples/trivia_questions.jsonl) were abstained, against 23% without them.
FEATURE_SETS = {
    "probabilities": ("log_span_probability", "margin", "log_block_probability"),
    "span": ("log_span_probability", "margin"),
    "probabilities+coverage": ("log_span_probability", "margin", "log_block_probability", "question_coverage"),
    "span+coverage": ("log_span_probability", "margin", "question_coverage"),
    # The answer's probability summed over the blocks read that hold it, in place of its one span's or beside it.
    "answer": ("log_answer_probability", "margin", "log_block_probability"),
    "answer+span": ("log_answer_probability", "log_span_probability", "margin", "log_block_probability"),
    # The question's rare words in the answer's block: the unanswerable question's often are in no block at all.
    "answer+span+rare words": ("log_answer_probability", "log_span_probability", "margin", "log_block_probability",
                               "question_idf_coverage"),
    # The same among the spans of the kind the question asks for (a number, a year, a name), where a rule restricts it.
    "kind span": ("log_kind_span_probability", "kind_margin"),
    "kind span+coverage": ("log_kind_span_probability", "kind_margin", "question_coverage"),
    "kind probabilities+coverage": ("log_kind_span_probability", "kind_margin", "log_block_probability",
                                    "question_coverage"),
    "kind answer+span+rare words": ("log_kind_answer_probability", "log_kind_span_probability", "kind_margin",
                                    "log_block_probability", "question_idf_coverage"),
    # and whether the typed rule put the answer first: the kind features read a promoted answer below the one it
    # displaced, so without this every promoted answer is abstained (session 18: 15 of 39 were right)
    "kind answer+span+rare words+typed": ("log_kind_answer_probability", "log_kind_span_probability", "kind_margin",
                                          "log_block_probability", "question_idf_coverage", "typed_promoted"),
}  # fmt: skip
# Chosen among by default: the sets that read the answer in the pool the pipeline chose it from. Where no answer-kind
# rule applies they are the plain sets; where one does, the plain sets measure the answer among spans it was not
# chosen from. (With the plain sets among the candidates, session 17's model got a plain set, by 2 of 61 unanswerable
# dev questions, and it abstained on 27% of the right answers to the trivia questions, "Who discovered penicillin?"
# "Alexander Fleming" at 0.00; with the kind sets alone 17%, the unanswerable test questions abstained alike.)
DEFAULT_FEATURE_SETS = sorted(name for name in FEATURE_SETS if name.startswith("kind"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def sample(rows: list[dict], limit: int, seed: int) -> list[dict]:
    if len(rows) <= limit:
        return rows
    return random.Random(seed).sample(rows, limit)


def ensure_questions(directory: Path, seed: int, tokenizer) -> dict:
    from realm_hf.data.question_sources import write_question_sources

    if not (directory / "counts.json").is_file():
        write_question_sources(directory, seed=seed, tokenizer=tokenizer)
    return json.loads((directory / "counts.json").read_text(encoding="utf-8"))


@torch.no_grad()
def candidates(model, tokenizer, searcher, rows: list[dict], batch_size: int) -> dict[int, list[list[int]]]:
    """For each k in KS, the k candidate block ids of each question (retrieval only: cheap). A hybrid searcher is
    asked once per k: its union depends on k (k=5 is what the reader reads), so the top 5 of its 20 are not its 5."""
    per_k = {k: [] for k in KS}
    for start in range(0, len(rows), batch_size):
        questions = [row["question"] for row in rows[start : start + batch_size]]
        inputs = tokenizer(questions, padding=True, truncation=True, max_length=model.config.searcher_seq_len,
                           return_tensors="pt")  # fmt: skip
        embeddings = model.embedder(**inputs).projected_score
        if hasattr(searcher, "query_texts"):
            with searcher.query_texts(tokenizer.batch_decode(inputs["input_ids"], skip_special_tokens=True)):
                for k in KS:
                    per_k[k] += searcher.search(embeddings, k).ids.tolist()
        else:
            ids = searcher.search(embeddings, max(KS)).ids.tolist()
            for k in KS:
                per_k[k] += [row[:k] for row in ids]
    return per_k


def read(open_qa, searcher, rows: list[dict], batch_size: int) -> list[dict]:
    """The best answer of each question, with its calibration features and the names no block holds
    ([`unknown_names`]: the pipeline abstains on those questions whatever its confidence), read from `searcher`'s
    blocks."""
    from realm_hf.pipelines.open_qa import answers_with_features

    open_qa.model.searcher = searcher
    return answers_with_features(open_qa, [row["question"] for row in rows], batch_size)


def read_document_sets(model_dir: Path, folders: list[Path], batch_size: int) -> dict[str, tuple[list, list]]:
    """Each document set's questions (a folder of `corpus/` and `questions.jsonl`, as examples/own_documents) answered
    over an index of its own documents alone, built with the model as `realm-hf index build` builds a user's, and read
    through the pipeline as a user's `pipeline("open-qa", model=..., index=...)` reads them: `{"documents/<folder
    name>": (rows, results)}`, results as [`read`] gives them."""
    import tempfile

    from transformers import pipeline

    from realm_hf.cli.main import main as cli
    from realm_hf.pipelines.open_qa import answers_with_features

    read_sets = {}
    with tempfile.TemporaryDirectory(prefix="document-index-") as scratch:
        for folder in folders:
            index = Path(scratch) / folder.name
            code = cli(["index", "build", "--model", str(model_dir), "--corpus", str(folder / "corpus"), "--output",
                        str(index), "--quiet"])  # fmt: skip
            if code != 0:
                raise SystemExit(f"{folder}: realm-hf index build failed with exit code {code}")
            open_qa = pipeline("open-qa", model=str(model_dir), index=str(index), device="cpu")
            open_qa._cached_calibration = None  # features are read here, not confidences
            rows = read_jsonl(folder / "questions.jsonl")
            started = time.time()
            results = answers_with_features(open_qa, [row["question"] for row in rows], batch_size)
            read_sets[f"documents/{folder.name}"] = (rows, results)
            logger.info("documents %s: %d questions read in %.0f s, EM %.3f", folder.name, len(rows),
                        time.time() - started, score(results, rows)["exact_match"])  # fmt: skip
    return read_sets


def recall(per_k: dict[int, list[list[int]]], rows: list[dict], block_texts) -> dict:
    from realm_hf.evaluation.metrics import has_answer

    metrics = {}
    for k, ids in per_k.items():
        hits = [float(any(has_answer(text, row["answers"]) for text in block_texts(row_ids)))
                for row_ids, row in zip(ids, rows, strict=True) if row["answers"]]  # fmt: skip
        if hits:
            metrics[f"recall@{k}"] = sum(hits) / len(hits)
    return metrics


def score(results: list[dict], rows: list[dict]) -> dict:
    from realm_hf.evaluation.metrics import exact_match, has_answer

    pairs = [(result, row) for result, row in zip(results, rows, strict=True) if row["answers"]]
    if not pairs:
        return {}
    return {"read": len(pairs),
            "exact_match": sum(exact_match(result["answer"], row["answers"]) for result, row in pairs) / len(pairs),
            "answer_in_top_evidence": sum(has_answer(result["evidence"], row["answers"]) for result, row in pairs)
            / len(pairs)}  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/realm-minilm-factbook"))
    parser.add_argument("--questions", type=Path, default=Path("build/default_model/question_sources"))
    parser.add_argument("--output", type=Path, default=Path("examples/results/default_model_sources.json"))
    parser.add_argument("--max-per-source", type=int, default=300, help="dev questions per source for recall@k")
    parser.add_argument(
        "--max-read-per-source",
        type=int,
        default=40,
        help="of those, the first N are read (EM, top evidence, calibration): reading is the slow part",
    )
    parser.add_argument("--max-test-per-source", type=int, default=25, help="test questions read per source")
    parser.add_argument("--bm25-fraction", type=float, default=0.4)
    parser.add_argument("--seen-per-source", type=int, default=30,
                        help="training questions per source read for each BM25 weight (the seen questions)")  # fmt: skip
    parser.add_argument("--bm25-weights", type=float, nargs="+", default=[0.0],
                        help="BM25 terms in the hybrid candidates' relevance (HybridSearcher's bm25_weight) to try: "
                             "the smallest within one standard error of the best mean EM over the dev sources and the "
                             "seen questions is the hybrid system's")  # fmt: skip
    parser.add_argument("--systems", nargs="+", default=["dense", "bm25", "hybrid"],
                        choices=["dense", "bm25", "hybrid"])  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--choose-searcher",
        action="store_true",
        help="make dense or hybrid, whichever has the higher mean dev EM, the model's own searcher (searcher.json)",
    )
    parser.add_argument("--fit-calibration", action="store_true")
    parser.add_argument(
        "--max-correct-abstained",
        type=float,
        default=0.25,
        help="the goal: the most of the right answers of a kind of question the calibration never saw that may be "
        "abstained, checked by leave-one-source-out (default: 0.25)",
    )
    parser.add_argument(
        "--dev-budget",
        type=float,
        default=0.15,
        help="the most of each source's right dev answers the threshold may abstain on: a margin under the goal, as "
        "people's questions are answered less confidently than the dev sources' (at 25%%, 37%% of the right answers "
        "to examples/trivia_questions.jsonl were abstained; default: 0.15)",
    )
    parser.add_argument(
        "--pooled-threshold",
        action="store_true",
        help="choose the threshold on all dev answers pooled (default: the budget holds within every source)",
    )
    parser.add_argument(
        "--feature-sets",
        nargs="+",
        choices=sorted(FEATURE_SETS),
        default=DEFAULT_FEATURE_SETS,
        help="the calibration feature sets to choose among (default: the 'kind' sets, which read the answer among the "
        "spans of the kind the question asks for where the pipeline's rules restrict it)",
    )
    parser.add_argument(
        "--check-questions",
        type=Path,
        nargs="*",
        default=[Path(__file__).parent / "everyday_questions.jsonl", Path(__file__).parent / "trivia_questions.jsonl"],
        help="files of questions of no source (JSONL with answers) read once with the fitted calibration: a check of "
        "how it abstains on questions people write, unlike the dev sets (never used for fitting)",
    )
    parser.add_argument(
        "--document-sets",
        type=Path,
        nargs="*",
        default=[],
        help="folders of documents and questions (corpus/, questions.jsonl, as examples/document_calibration/*), "
        "each read over an index of its own documents: the calibration's threshold over a user's documents "
        "(documents_threshold) is chosen on them (with --fit-calibration). The model's confidence runs lower over "
        "people's documents, and its own threshold abstained on half the right answers over a company's files",
    )
    parser.add_argument(
        "--check-document-sets",
        type=Path,
        nargs="*",
        default=[],
        help="folders as --document-sets, read alike with the fitted calibration and never fitted on (a check: "
        "examples/own_documents, examples/town_documents)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="accuracy-coverage PNG (with --fit-calibration)")
    args = parser.parse_args(argv)
    for folder in [*args.document_sets, *args.check_document_sets]:  # before the work, not after it
        if not ((folder / "corpus").is_dir() and (folder / "questions.jsonl").is_file()):
            raise SystemExit(f"{folder}: expected a folder of documents and questions (corpus/ and questions.jsonl)")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:  # before the work, not after it
        raise SystemExit("--plot needs matplotlib: pip install 'realm_hf[plot]'")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_grad_enabled(False)

    from transformers import pipeline

    from realm_hf.data.question_sources import SOURCES
    from realm_hf.default_model import load_open_qa
    from realm_hf.retrieval.hybrid import HybridSearcher, hybrid_searcher_for

    model, retriever = load_open_qa(args.model)
    counts = ensure_questions(args.questions, args.seed, retriever.tokenizer)
    open_qa = pipeline("open-qa", model=model, tokenizer=retriever.tokenizer, retriever=retriever, device="cpu")
    open_qa._cached_calibration = None  # features, not confidences, are read here: ignore any calibration.json
    started = time.time()
    hybrid = hybrid_searcher_for(model, bm25_fraction=args.bm25_fraction)
    logger.info("BM25 over %d blocks in %.0f s", hybrid.num_blocks, time.time() - started)
    searchers = {"dense": hybrid.dense, "bm25": HybridSearcher(hybrid.dense, hybrid.bm25, bm25_fraction=1.0)}
    weights = sorted(set(args.bm25_weights))
    for weight in weights:
        searchers[f"hybrid@{weight:g}"] = HybridSearcher(hybrid.dense, hybrid.bm25, args.bm25_fraction, weight)
    systems = [name for system in args.systems
               for name in ([f"hybrid@{weight:g}" for weight in weights] if system == "hybrid" else [system])]  # fmt: skip

    def block_texts(ids):
        return [retriever.block_records[block].decode("utf-8") for block in ids if block >= 0]

    report = {"model": str(args.model), "question_counts": counts, "settings": vars(args) | {"ks": list(KS)},
              "dev": {}, "test": {}}  # fmt: skip
    report["settings"] = json.loads(json.dumps(report["settings"], default=str))  # paths as strings
    dev_rows = {source: sample(read_jsonl(args.questions / f"{source}.dev.jsonl"), args.max_per_source, args.seed)
                for source in SOURCES}  # fmt: skip
    dev_results = {system: {} for system in systems}
    for source, rows in dev_rows.items():
        report["dev"][source] = {}
        for system in systems:
            if source == "unanswerable" and system == "bm25":
                continue
            started = time.time()
            metrics = {"questions": len(rows)}
            if source != "unanswerable":
                metrics.update(recall(candidates(model, open_qa.tokenizer, searchers[system], rows, args.batch_size),
                                      rows, block_texts))  # fmt: skip
            # Unanswerable questions are few and matter most for abstention: twice as many are read.
            read_rows = rows[: args.max_read_per_source * (2 if source == "unanswerable" else 1)]
            results = read(open_qa, searchers[system], read_rows, args.batch_size)
            metrics.update(score(results, read_rows))
            metrics["seconds"] = round(time.time() - started, 1)
            report["dev"][source][system] = metrics
            dev_results[system][source] = results
            logger.info("dev %s %s: %s", source, system, metrics)
            _write(args.output, report)
    answerable = [source for source in SOURCES if source != "unanswerable"]
    if "hybrid" in args.systems:  # the weight with the highest mean EM over dev and seen questions becomes the hybrid
        # Seen questions: the model's own training questions, which users ask too ("What is the capital of Peru?").
        # A BM25 term that helps unseen kinds of question can push a right block the model learned down the list.
        seen = []
        if len(weights) > 1 and args.seen_per_source > 0:
            for source in answerable:
                train = args.questions / f"{source}.train.jsonl"
                if train.is_file():
                    seen += [
                        row for row in sample(read_jsonl(train), args.seen_per_source, args.seed) if row["answers"]
                    ]
        seen_em = {}
        for weight in weights if seen else []:
            results = read(open_qa, searchers[f"hybrid@{weight:g}"], seen, args.batch_size)
            seen_em[weight] = score(results, seen)["exact_match"]
            logger.info("seen questions, BM25 weight %g: EM %.3f (%d questions)", weight, seen_em[weight], len(seen))
        means = {
            weight: (sum(report["dev"][source][f"hybrid@{weight:g}"]["exact_match"] for source in answerable)
                     + seen_em.get(weight, 0.0)) / (len(answerable) + (1 if seen_em else 0))
            for weight in weights
        }  # fmt: skip
        # The one-standard-error rule: the smallest weight whose mean EM is within one standard error of the best
        # (a binomial error over the questions read). Weights this close are not told apart by these questions, and
        # a smaller BM25 term disturbs the retrieval the model learned less (with the best weight alone, 10 here,
        # "What is the capital of Peru?" was answered "Arequipa").
        top = max(means.values())
        read_count = len(seen) + sum(report["dev"][source][f"hybrid@{weights[0]:g}"]["read"] for source in answerable)
        standard_error = math.sqrt(top * (1.0 - top) / max(read_count, 1))
        best = min(weight for weight in weights if means[weight] >= top - standard_error)
        report["bm25_weight_sweep"] = {
            "bm25_fraction": args.bm25_fraction, "chosen": best, "seen_questions": len(seen),
            "rule": "smallest weight within one standard error of the best mean EM", "standard_error": standard_error,
            "mean_exact_match": {f"{weight:g}": means[weight] for weight in weights},
            "seen_exact_match": {f"{weight:g}": value for weight, value in seen_em.items()},
            "dev_exact_match": {f"{weight:g}": {source: report["dev"][source][f"hybrid@{weight:g}"]["exact_match"]
                                                for source in answerable} for weight in weights},
        }  # fmt: skip
        for source in report["dev"]:
            for weight in weights:
                metrics = report["dev"][source].pop(f"hybrid@{weight:g}", None)
                if weight == best and metrics is not None:
                    report["dev"][source]["hybrid"] = metrics
        searchers["hybrid"] = searchers[f"hybrid@{best:g}"]
        dev_results["hybrid"] = dev_results[f"hybrid@{best:g}"]
        logger.info("BM25 weight: %g (mean EM over the dev sources and the seen questions, by weight: %s)", best,
                    report["bm25_weight_sweep"]["mean_exact_match"])  # fmt: skip
        _write(args.output, report)
    chosen = "dense"
    if args.choose_searcher:
        from realm_hf.retrieval.hybrid import save_searcher_settings

        means = {system: sum(report["dev"][source][system]["exact_match"] for source in answerable) / len(answerable)
                 for system in ("dense", "hybrid")}  # fmt: skip
        chosen = "hybrid" if means["hybrid"] > means["dense"] else "dense"
        save_searcher_settings(searchers[chosen], args.model)
        report["searcher_choice"] = {"mean_dev_exact_match": means, "chosen": chosen,
                                     "bm25_fraction": args.bm25_fraction if chosen == "hybrid" else None,
                                     "bm25_weight": searchers["hybrid"].bm25_weight if chosen == "hybrid" else None}  # fmt: skip
        logger.info("searcher: %s (mean dev EM %s)", chosen, means)
    model.searcher = searchers[chosen]

    if args.fit_calibration:
        report["calibration"] = calibrate(args, open_qa, searchers[chosen], dev_rows, dev_results[chosen],
                                          read_document_sets(args.model, args.document_sets, args.batch_size),
                                          read_document_sets(args.model, args.check_document_sets, args.batch_size))  # fmt: skip
        report["calibration"]["searcher"] = chosen
        _write(args.output, report)
    _write(args.output, report)


def _correct(results, rows):
    from realm_hf.evaluation.metrics import exact_match

    return [bool(row["answers"]) and exact_match(result["answer"], row["answers"]) == 1.0
            for result, row in zip(results, rows, strict=True)]  # fmt: skip


def _confidence(calibration, features, unknown):
    # As the pipeline abstains: a question naming a word no block holds, or asking about its asker over a corpus that
    # never speaks to or as a person, is abstained on whatever its confidence.
    return calibration.confidence(features).masked_fill(unknown, 0.0)


def choose_calibration(features, correct, answerable, sources, unknown, feature_sets, goal, dev_budget,
                       pooled_threshold=False) -> dict:  # fmt: skip
    """The calibration fitted on the dev answers (features `(N, F)`, correct, answerable and unknown `(N,)`, one
    source name each) and its threshold: for each of `feature_sets`, the largest budget (the share of each source's
    right answers the threshold may abstain on, in 1% steps up to `dev_budget`) at which a calibration fitted without
    a source abstains on at most `goal` of that source's right answers, for every source (leave-one-source-out, a
    stand-in for kinds of question no dev set has); of those, the set that then abstains on the most unanswerable dev
    questions (ties: the lower worst held-out share, then a set of the kind features). Returns `{"calibration"
    (threshold set), "features_chosen", "budget", "feature_sets" (each set's held-out results), "dev" (rates),
    "confidences"}`."""
    from realm_hf.evaluation.calibration import choose_threshold, fit_calibration, leave_one_group_out

    groups = None if pooled_threshold else sources
    budgets = [step / 100 for step in range(1, round(100 * dev_budget) + 1)]
    held_out, fitted_by_set = {}, {}
    for name in feature_sets:
        names = FEATURE_SETS[name]
        for budget in reversed(budgets):
            rates = leave_one_group_out(features, correct, answerable, sources, names, budget,
                                        per_group_threshold=not pooled_threshold)  # fmt: skip
            shares = [rate["correct_abstained"] for rate in rates.values() if rate["correct_abstained"] is not None]
            if max(shares) <= goal or budget == budgets[0]:
                break
        fitted = fitted_by_set[name] = fit_calibration(features, correct, names)
        _, rates_at_budget = choose_threshold(_confidence(fitted, features, unknown), correct, answerable, budget,
                                              groups)  # fmt: skip
        held_out[name] = {"features": list(names), "budget": budget, "worst_correct_abstained": max(shares),
                          "mean_correct_abstained": sum(shares) / len(shares), "within_goal": max(shares) <= goal,
                          "dev_unanswerable_abstained": rates_at_budget["unanswerable_abstained"],
                          "by_source": rates}  # fmt: skip
        logger.info("features %s: budget %.2f, held-out sources' correct answers abstained worst %.3f, mean %.3f; "
                    "dev unanswerable abstained %.3f", name, budget, held_out[name]["worst_correct_abstained"],
                    held_out[name]["mean_correct_abstained"], held_out[name]["dev_unanswerable_abstained"])  # fmt: skip
    # Last, on a tie, the set that reads the answer among the spans of the kind asked for: that is the pool the pipeline
    # chose it from ("1912" is unlikely among all spans, likely among the years).
    chosen = max(
        held_out,
        key=lambda name: (held_out[name]["within_goal"], held_out[name]["dev_unanswerable_abstained"],
                          -held_out[name]["worst_correct_abstained"], name.startswith("kind")),
    )  # fmt: skip
    calibration = fitted_by_set[chosen]
    confidences = _confidence(calibration, features, unknown)
    calibration.threshold, dev_rates = choose_threshold(confidences, correct, answerable, held_out[chosen]["budget"],
                                                        groups)  # fmt: skip
    return {"calibration": calibration, "features_chosen": chosen, "budget": held_out[chosen]["budget"],
            "feature_sets": held_out, "dev": dev_rates, "confidences": confidences}  # fmt: skip


class Answered(NamedTuple):
    """Answers as a calibration reads them, one row per question: `features` `(N, F)`, `correct`, `answerable` and
    `unknown` `(N,)` bools (`unknown`: abstained on whatever the confidence, see [`read`]), `sources` their names."""

    features: torch.Tensor
    correct: torch.Tensor
    answerable: torch.Tensor
    sources: list[str]
    unknown: torch.Tensor


def gather(rows_by_source: dict[str, list[dict]], results_by_source: dict[str, list[dict]]) -> Answered:
    """The questions of every source (`{source: rows}`) and their answers (`{source: results}`, [`read`]; rows past
    the results are left out) as one [`Answered`]."""
    from realm_hf.pipelines.open_qa import abstains_whatever_the_confidence

    features, correct, answerable, sources, unknown = [], [], [], [], []
    for source, rows in rows_by_source.items():
        results = results_by_source[source]
        rows = rows[: len(results)]
        features += [result["features"] for result in results]
        correct += _correct(results, rows)
        answerable += [bool(row["answers"]) for row in rows]
        sources += [source] * len(rows)
        unknown += [abstains_whatever_the_confidence(result) for result in results]
    return Answered(torch.tensor(features), torch.tensor(correct), torch.tensor(answerable), sources,
                    torch.tensor(unknown))  # fmt: skip


def documents_threshold(calibration, sets: dict, goal: float) -> dict:
    """Sets `calibration.documents_threshold`, the threshold over a user's documents, on `sets` (`{name: Answered}`,
    each a set of documents read over an index of its own, [`gather`]): the highest that
    abstains on at most `goal` of their right answers, pooled. The calibration itself stays as fitted on the dev
    sources: it ranks answers over documents as well as one fitted on documents (session 25), but its confidences
    run lower there. The goal itself, with no margin under it: these questions are written as people ask theirs (the
    dev sources' margin, --dev-budget, is for template questions). Returns what it measured (empty without sets):
    the rates, and each set's rates at the threshold chosen on the others (leave-one-set-out)."""
    from realm_hf.evaluation.calibration import abstention_rates, choose_threshold

    if not sets:
        return {}
    features, correct, answerable, unknown = (
        torch.cat([getattr(part, field) for part in sets.values()])
        for field in ("features", "correct", "answerable", "unknown")
    )
    confidences = _confidence(calibration, features, unknown)
    calibration.documents_threshold, rates = choose_threshold(confidences, correct, answerable, goal)
    names, held_out = [name for name, part in sets.items() for _ in part.sources], {}
    for name in sets:
        mask = torch.tensor([other == name for other in names])
        threshold, _ = choose_threshold(confidences[~mask], correct[~mask], answerable[~mask], goal)
        held_out[name] = {"threshold": threshold, **abstention_rates(confidences[mask], correct[mask],
                                                                      answerable[mask], threshold)}  # fmt: skip
    logger.info("documents threshold %.3f: %s; leave-one-set-out %s", calibration.documents_threshold, rates,
                held_out)  # fmt: skip
    return {"fitted_on": sorted(sets), "rule": f"pooled: at most {goal:g} of the right answers abstained",
            "threshold": calibration.documents_threshold, "rates": rates, "leave_one_set_out": held_out,
            "right": int(correct.sum()), "unanswerable": int((~answerable).sum()), "questions": len(correct),
            "goal": goal}  # fmt: skip


def calibrate(args, open_qa, searcher, dev_rows, dev_results, document_sets=None, check_document_sets=None) -> dict:
    """The calibration fitted on the dev answers of `searcher` (`dev_rows` / `dev_results` by source), with its
    threshold over a user's documents chosen on `document_sets` (`{"documents/<name>": (rows, results)}`,
    [`read_document_sets`]; [`documents_threshold`]); measured on the test split, --check-questions and
    `check_document_sets` (read alike, never fitted on); written into --model."""
    from realm_hf.data.question_sources import SOURCES
    from realm_hf.evaluation.calibration import abstention_rates, accuracy_coverage

    features, correct, answerable, sources, unknown = gather(dev_rows, dev_results)
    chosen = choose_calibration(features, correct, answerable, sources, unknown,
                                [name for name in FEATURE_SETS if name in args.feature_sets],
                                args.max_correct_abstained, args.dev_budget, args.pooled_threshold)  # fmt: skip
    calibration, threshold, dev_rates = chosen["calibration"], chosen["calibration"].threshold, chosen["dev"]
    held_out, chosen_features, budget, confidences = (chosen["feature_sets"], chosen["features_chosen"],
                                                      chosen["budget"], chosen["confidences"])  # fmt: skip
    goal = args.max_correct_abstained
    documents = documents_threshold(calibration, {name: gather({name: rows}, {name: results})
                                                  for name, (rows, results) in (document_sets or {}).items()}, goal)  # fmt: skip
    test_rows = {source: sample(read_jsonl(args.questions / f"{source}.test.jsonl"),
                                args.max_test_per_source * (2 if source == "unanswerable" else 1), args.seed)
                 for source in SOURCES}  # fmt: skip
    test_results = {source: read(open_qa, searcher, rows, args.batch_size) for source, rows in test_rows.items()}
    test_features, test_correct, test_answerable, test_sources, test_unknown = gather(test_rows, test_results)
    test_confidences = _confidence(calibration, test_features, test_unknown)
    test_rates = abstention_rates(test_confidences, test_correct, test_answerable, threshold)
    # Reliability: mean confidence vs share correct in five confidence bins, on test.
    bins = []
    for low in (0.0, 0.2, 0.4, 0.6, 0.8):
        mask = (test_confidences >= low) & (test_confidences < low + 0.2 + (1e-9 if low == 0.8 else 0))
        if bool(mask.any()):
            bins.append({"bin": [low, round(low + 0.2, 1)], "answers": int(mask.sum()),
                         "mean_confidence": float(test_confidences[mask].mean()),
                         "share_correct": float(test_correct[mask].double().mean())})  # fmt: skip
    by_source = {}
    for source in SOURCES:
        mask = torch.tensor([name == source for name in test_sources])
        by_source[source] = abstention_rates(test_confidences[mask], test_correct[mask], test_answerable[mask],
                                             threshold)  # fmt: skip
        if bool((mask & test_answerable).any()):
            by_source[source]["exact_match"] = float(test_correct[mask & test_answerable].double().mean())
    check, check_sets = {}, {}  # file stem -> rates; file stem -> (features, correct, answerable, names)
    for path in args.check_questions or []:
        if not path.is_file():
            logger.warning("check questions %s: no such file, skipped", path)
            continue
        check_rows = read_jsonl(path)
        check_results = read(open_qa, searcher, check_rows, args.batch_size)
        check_sets[path.stem] = gather({path.stem: check_rows}, {path.stem: check_results})
        check_features, check_correct, check_answerable, _, check_unknown = check_sets[path.stem]
        check[path.stem] = {"questions": path.name, "read": len(check_rows),
                            "exact_match": float(check_correct.double().mean()),
                            **abstention_rates(_confidence(calibration, check_features, check_unknown),
                                               check_correct, check_answerable, threshold)}  # fmt: skip
        logger.info("check questions (%s): %s", path.name, check[path.stem])
    # Documents people ask about, never fitted on: each set over an index of its own documents, as a user's.
    for name, (check_rows, check_results) in (check_document_sets or {}).items():
        check_sets[name] = gather({name: check_rows}, {name: check_results})
        check_features, check_correct, check_answerable, _, check_unknown = check_sets[name]
        check[name] = {"questions": f"{name.removeprefix('documents/')}/questions.jsonl", "read": len(check_rows),
                       "exact_match": float(check_correct[check_answerable].double().mean()),
                       **abstention_rates(_confidence(calibration, check_features, check_unknown), check_correct,
                                          check_answerable, calibration.threshold_for(own_index=False))}  # fmt: skip
        logger.info("check documents (%s): %s", name, check[name])
    calibration.metadata = {
        "fitted_on": "dev answers of the model's own searcher, all question sources (unanswerable = wrong)",
        "threshold_rule": "pooled" if args.pooled_threshold else "per source",
        "features_chosen_by": "leave-one-source-out: the largest budget within the goal for every held-out source, "
        "then the most unanswerable dev questions abstained",
        "dev_examples": len(features), "dev_correct": int(correct.sum()), "max_correct_abstained": budget,
        "goal_correct_abstained": goal, "dev": dev_rates, "test": test_rates, "check": check,
        "unknown_names": "a question naming a word no block holds, or asking about its asker over a corpus that "
        "never speaks to or as a person, is abstained on whatever its confidence (rates "
        f"include it): {int(unknown.sum())} of {len(unknown)} dev questions, {int(test_unknown.sum())} of "
        f"{len(test_unknown)} test questions",
    }  # fmt: skip
    if documents:
        calibration.metadata["documents"] = {key: documents[key] for key in ("fitted_on", "rule", "rates")}
    calibration.save(args.model)
    logger.info("calibration: threshold %.3f; dev %s; test %s", threshold, dev_rates, test_rates)
    curves = {"dev": accuracy_coverage(confidences, correct), "test": accuracy_coverage(test_confidences, test_correct),
              "dev_by_score": accuracy_coverage(features[:, 0], correct)}  # fmt: skip
    if args.plot is not None:
        plot(args.plot, curves, dev_rates, test_rates)
    thin = {name: points[:: max(1, len(points) // 50)] + points[-1:] for name, points in curves.items()}
    answers = {split: [{"source": source, "features": [round(value, 5) for value in row.tolist()],
                        "correct": bool(right), "answerable": bool(can), "unknown": bool(abstains)}
                       for source, row, right, can, abstains in zip(names, split_features, split_correct,
                                                                    split_answerable, split_unknown, strict=True)]
               for split, (split_features, split_correct, split_answerable, names, split_unknown) in
               {"dev": (features, correct, answerable, sources, unknown),
                "test": (test_features, test_correct, test_answerable, test_sources, test_unknown),
                **check_sets}.items()}  # fmt: skip
    return {"calibration": calibration.to_dict(), "dev": dev_rates, "test": test_rates, "test_by_source": by_source,
            "test_reliability": bins, "check": check, "feature_sets": held_out, "features_chosen": chosen_features,
            "documents": documents,
            "accuracy_coverage": thin, "answers": answers}  # fmt: skip


def plot(path: Path, curves: dict, dev_rates: dict, test_rates: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise SystemExit("the plot needs matplotlib: pip install 'realm_hf[plot]'") from error
    figure, axis = plt.subplots(figsize=(6, 4), dpi=120)
    for name, label in (("dev", "dev, calibrated confidence"), ("test", "test, calibrated confidence"),
                        ("dev_by_score", "dev, raw span probability")):  # fmt: skip
        coverage, accuracy = zip(*curves[name], strict=True)
        axis.plot(coverage, accuracy, label=label, linestyle="--" if "raw" in label else "-")
    axis.axvline(test_rates["coverage"], color="grey", linewidth=0.8, linestyle=":")
    axis.annotate(f"threshold: {test_rates['unanswerable_abstained']:.0%} of unanswerable and\n"
                  f"{test_rates['correct_abstained']:.0%} of correct answers abstained (test)",
                  (test_rates["coverage"], 0.05), fontsize=7, ha="right")  # fmt: skip
    axis.set_xlabel("coverage (share of questions answered, most confident first)")
    axis.set_ylabel("accuracy (exact match) of the answered")
    axis.set_ylim(0, 1)
    axis.set_xlim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    axis.set_title("realm-minilm-factbook: accuracy vs coverage", fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


def _write(path: Path, payload) -> None:
    from realm_hf.atomic import atomic_path

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temporary:
        Path(temporary).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

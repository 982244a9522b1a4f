"""A calibrated answer confidence and an abstention threshold, stored as plain numbers (JSON, no pickle).

The "open-qa" pipeline computes, for every answer, the features in [`CALIBRATION_FEATURES`] from numbers it already
has: the answer's probability among all (block, span) pairs read, its logit, the margin to the next best span, the
probability of its block among the blocks read (a softmax of the retrieval logits), the best retrieval logit, the
share of the question's words in the answer's block (plain, and weighted by each word's rarity in the corpus), and the
answer's probability summed over the blocks that hold it; the span, margin and answer probability again among the spans
of the kind the question asks for (a number, a year, a name); and whether the typed rule put the answer first. A
[`Calibration`] is a logistic (Platt-style) model over those features, fitted on dev answers labelled correct or not
(unanswerable questions count as not correct) by [`fit_calibration`]; `confidence = sigmoid(w . standardized(x) + b)`
lies in [0, 1], and an answer is abstained when its confidence is below `threshold`, chosen on dev by
[`choose_threshold`] to abstain on as many unanswerable questions as possible while abstaining on at most a given share
of the correctly answered ones.

A model directory carries its calibration as `calibration.json` ([`Calibration.save`] / [`Calibration.load`]);
models without one never abstain.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

__all__ = [
    "CALIBRATION_FEATURES",
    "CALIBRATION_FILE",
    "PREVIOUS_CALIBRATION_FILE",
    "Calibration",
    "abstention_rates",
    "accuracy_coverage",
    "choose_threshold",
    "fit_calibration",
    "leave_one_group_out",
    "set_aside_calibration",
]

CALIBRATION_FILE = "calibration.json"
PREVIOUS_CALIBRATION_FILE = "calibration.previous.json"
CALIBRATION_FEATURES = (
    "log_span_probability",  # log of the answer's probability among every (block, span) pair read
    "span_logit",  # the answer's logit: reader span logit + retrieval logit of its block
    "margin",  # its logit minus the best other span's (the next one down for the best answer), capped at 20
    "log_block_probability",  # log softmax of the retrieval logits over the blocks read, at the answer's block
    "max_retrieval_logit",  # the best question . block inner product among the blocks read
    "question_coverage",  # share of the question's content wordpieces that occur in the answer's block
    "log_answer_probability",  # log of the summed probability of every span read with the answer's wordpieces
    "question_idf_coverage",  # share of the question's words, weighted by rarity in the corpus, in the answer's block
    # The span probability, margin and answer probability again, among the spans of the kind the question asks for,
    # where the pipeline's rules restrict it
    # (a number, a year, a name): "In which year did the Titanic sink?" "1912" is unlikely among all spans and likely
    # among the years. The same as the plain ones where no rule applies.
    "log_kind_span_probability",
    "kind_margin",
    "log_kind_answer_probability",
    # 1 where a rule narrowed the question's spans past what the kind features read and kept this answer: the typed
    # rule (a title of the kind the question names, over the span the reader ranked first: "In which country is Machu
    # Picchu?" Peru over Cusco) or the unit rule (one amount in the unit asked for: "How long ...?" "11 hours"), else
    # 0. The kind features read the answer as the reader ranks it among every span of the kind (every number); this
    # says a narrower rule kept it.
    "typed_promoted",
)
MAX_MARGIN = 20.0


@dataclass
class Calibration:
    """A logistic model from answer features to the probability that the answer is right, and a threshold.

    Attributes:
        features (`list[str]`): feature names, in order ([`CALIBRATION_FEATURES`]).
        mean, scale (`list[float]`): standardization: `(x - mean) / scale`.
        weights (`list[float]`), bias (`float`): the logistic model on standardized features.
        threshold (`float`): answers with `confidence < threshold` are abstained.
        documents_threshold (`float`, *optional*): the threshold instead over any index but the model's own (a
            user's documents, `pipeline("open-qa", model=..., index=...)`): the same confidence runs lower there,
            where questions are worded as people ask and documents hold many facts of one kind, and the model's own
            threshold abstained on half the right answers over a company's files. Chosen on sets of documents and
            questions ([`choose_threshold`]); `None` uses `threshold` everywhere.
        metadata (`dict`): how it was fitted and what it measured (free-form, JSON-serializable).
    """

    features: list[str]
    mean: list[float]
    scale: list[float]
    weights: list[float]
    bias: float
    threshold: float = 0.0
    documents_threshold: float | None = None
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        sizes = {len(self.features), len(self.mean), len(self.scale), len(self.weights)}
        if len(sizes) != 1:
            raise ValueError(
                f"calibration: features, mean, scale and weights must have one length, received {len(self.features)}, "
                f"{len(self.mean)}, {len(self.scale)} and {len(self.weights)}"
            )
        unknown = [name for name in self.features if name not in CALIBRATION_FEATURES]
        if unknown:
            raise ValueError(
                f"calibration: unknown features {unknown}; expected names among {list(CALIBRATION_FEATURES)}"
            )
        if any(not math.isfinite(value) for value in [*self.mean, *self.weights, self.bias, self.threshold]) or any(
            not math.isfinite(value) or value <= 0 for value in self.scale
        ):
            raise ValueError("calibration: every number must be finite and every scale positive")
        for name in ("threshold", "documents_threshold"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"calibration: {name} must lie in [0, 1], received {value}")

    def threshold_for(self, own_index: bool) -> float:
        """The threshold over the model's own index (`own_index`), or over another one (a user's documents:
        `documents_threshold` where set)."""
        return self.threshold if own_index or self.documents_threshold is None else self.documents_threshold

    def confidence(self, features: torch.Tensor | Sequence[Sequence[float]]) -> torch.Tensor:
        """Confidences in [0, 1] for features `(..., len(CALIBRATION_FEATURES))` in [`CALIBRATION_FEATURES`] order."""
        features = torch.as_tensor(features, dtype=torch.float64)
        if features.shape[-1] != len(CALIBRATION_FEATURES):
            raise ValueError(f"features: expected a last dim of {len(CALIBRATION_FEATURES)} "
                             f"({list(CALIBRATION_FEATURES)}), received shape {tuple(features.shape)}")  # fmt: skip
        columns = [CALIBRATION_FEATURES.index(name) for name in self.features]
        selected = features[..., columns]
        mean, scale = torch.tensor(self.mean, dtype=torch.float64), torch.tensor(self.scale, dtype=torch.float64)
        standardized = torch.nan_to_num((selected - mean) / scale, nan=0.0, posinf=10.0, neginf=-10.0)
        return torch.sigmoid(standardized @ torch.tensor(self.weights, dtype=torch.float64) + self.bias)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: dict) -> Calibration:
        if not isinstance(payload, dict):
            raise TypeError(f"calibration: expected a JSON object, received {type(payload).__name__}")
        expected = {"features", "mean", "scale", "weights", "bias"}
        missing = sorted(expected - set(payload))
        if missing:
            raise ValueError(
                f"calibration: missing keys {missing}; expected {sorted(expected)} (+ threshold, documents_threshold, metadata)"
            )
        return cls(
            features=[str(name) for name in payload["features"]],
            mean=[float(value) for value in payload["mean"]],
            scale=[float(value) for value in payload["scale"]],
            weights=[float(value) for value in payload["weights"]],
            bias=float(payload["bias"]),
            threshold=float(payload.get("threshold", 0.0)),
            documents_threshold=_optional_float(payload.get("documents_threshold")),
            metadata=dict(payload.get("metadata", {})),
        )

    def save(self, directory: str | os.PathLike) -> Path:
        """Writes `directory/calibration.json` atomically (a temporary file renamed into place; this package
        imports nothing else from realm_hf, so `realm_hf.atomic` is not used)."""
        path = Path(directory) / CALIBRATION_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            temporary.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        """Reads a `calibration.json`, or the one in a directory."""
        path = Path(path)
        if path.is_dir():
            path = path / CALIBRATION_FILE
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from error
        return cls.from_dict(payload)


def _optional_float(value) -> float | None:
    return None if value is None else float(value)


def set_aside_calibration(directory: str | os.PathLike) -> Path | None:
    """Moves `directory`'s `calibration.json` to `calibration.previous.json` (kept, not lost), before a new fit or a
    new model there; returns where it went, or `None` where there was none."""
    current = Path(directory) / CALIBRATION_FILE
    if not current.is_file():
        return None
    previous = current.with_name(PREVIOUS_CALIBRATION_FILE)
    os.replace(current, previous)
    return previous


def fit_calibration(
    features: torch.Tensor | Sequence[Sequence[float]],
    correct: torch.Tensor | Sequence[bool],
    feature_names: Sequence[str] = CALIBRATION_FEATURES,
    l2: float = 1e-2,
    steps: int = 100,
) -> Calibration:
    """Fits the logistic model by Newton's method (L2-regularized, so separable data stays finite).

    Args:
        features: `(N, len(CALIBRATION_FEATURES))`, in [`CALIBRATION_FEATURES`] order.
        correct: `(N,)`, whether each answer was right (unanswerable questions: `False`).
        feature_names: the features the model uses (a subset of [`CALIBRATION_FEATURES`]).
        l2 (`float`, *optional*, defaults to 0.01): penalty on the weights (not the bias), per example.
        steps (`int`, *optional*, defaults to 100): Newton steps at most (it stops when the step is tiny).

    Returns:
        [`Calibration`] with `threshold` 0 (never abstains): set it with [`choose_threshold`].
    """
    features = torch.as_tensor(features, dtype=torch.float64)
    labels = torch.as_tensor(correct, dtype=torch.float64)
    if features.dim() != 2 or features.shape[1] != len(CALIBRATION_FEATURES) or labels.shape != features.shape[:1]:
        raise ValueError(f"expected features (N, {len(CALIBRATION_FEATURES)}) and correct (N,), received "
                         f"{tuple(features.shape)} and {tuple(labels.shape)}")  # fmt: skip
    if features.shape[0] < 2 or labels.min() == labels.max():
        raise ValueError("fitting a calibration needs at least one correct and one incorrect answer")
    unknown = [name for name in feature_names if name not in CALIBRATION_FEATURES]
    if unknown or not feature_names:
        raise ValueError(
            f"feature_names: expected names among {list(CALIBRATION_FEATURES)}, received {list(feature_names)}"
        )
    selected = features[:, [CALIBRATION_FEATURES.index(name) for name in feature_names]]
    selected = torch.nan_to_num(selected, nan=0.0, posinf=MAX_MARGIN, neginf=-1e4)
    mean = selected.mean(0)
    scale = selected.std(0).clamp(min=1e-6)
    x = torch.cat([(selected - mean) / scale, torch.ones(len(selected), 1, dtype=torch.float64)], dim=1)
    theta = torch.zeros(x.shape[1], dtype=torch.float64)
    penalty = torch.full((x.shape[1],), l2 * len(x), dtype=torch.float64)
    penalty[-1] = 0.0
    for _ in range(steps):
        probabilities = torch.sigmoid(x @ theta)
        gradient = x.T @ (probabilities - labels) + penalty * theta
        hessian = (
            (x.T * (probabilities * (1 - probabilities))) @ x + torch.diag(penalty) + 1e-9 * torch.eye(len(theta))
        )
        step = torch.linalg.solve(hessian, gradient)
        theta = theta - step
        if step.abs().max() < 1e-8:
            break
    return Calibration(features=list(feature_names), mean=mean.tolist(), scale=scale.tolist(),
                       weights=theta[:-1].tolist(), bias=float(theta[-1]), threshold=0.0,
                       metadata={"examples": len(x), "correct": int(labels.sum())})  # fmt: skip


def choose_threshold(
    confidences: torch.Tensor | Sequence[float],
    correct: torch.Tensor | Sequence[bool],
    answerable: torch.Tensor | Sequence[bool],
    max_correct_abstained: float = 0.25,
    groups: Sequence[str] | None = None,
) -> tuple[float, dict]:
    """The threshold that abstains on the most unanswerable questions while abstaining on at most
    `max_correct_abstained` of the correctly answered ones (`abstained = confidence < threshold`).

    With `groups` (one name per answer, e.g. its question source) the budget holds within every group that has correct
    answers: the threshold is the smallest of the groups' own. Pooled, a group whose correct answers are less confident
    than the rest (general questions beside templated ones) can have most of them abstained.

    Returns:
        `(threshold, rates)`: `rates` holds `unanswerable_abstained`, `correct_abstained`, `wrong_abstained`
        (answerable questions answered wrongly) and `coverage` (share of all questions answered) at that threshold.
    """
    confidences = torch.as_tensor(confidences, dtype=torch.float64)
    correct = torch.as_tensor(correct, dtype=torch.bool)
    answerable = torch.as_tensor(answerable, dtype=torch.bool)
    if not (confidences.shape == correct.shape == answerable.shape) or confidences.dim() != 1:
        raise ValueError(f"expected three (N,) sequences, received shapes {tuple(confidences.shape)}, "
                         f"{tuple(correct.shape)} and {tuple(answerable.shape)}")  # fmt: skip
    if bool((correct & ~answerable).any()):
        raise ValueError("an unanswerable question cannot be answered correctly")
    if not 0.0 <= max_correct_abstained <= 1.0:
        raise ValueError(f"max_correct_abstained must lie in [0, 1], received {max_correct_abstained}")
    if groups is not None:
        if len(groups) != len(confidences):
            raise ValueError(f"groups: expected one name per answer ({len(confidences)}), received {len(groups)}")
        names = sorted({name for name, right in zip(groups, correct.tolist(), strict=True) if right})
        thresholds = []
        for name in names:
            mask = torch.tensor([group == name for group in groups])
            thresholds.append(choose_threshold(confidences[mask], correct[mask], answerable[mask],
                                               max_correct_abstained)[0])  # fmt: skip
        threshold = min(thresholds, default=1.0)
        return threshold, abstention_rates(confidences, correct, answerable, threshold)
    correct_confidences = torch.sort(confidences[correct]).values
    if len(correct_confidences) == 0:
        threshold = 1.0
    else:
        # Abstaining below the k-th lowest correct confidence abstains on k - 1 correct answers (ties aside).
        allowed = math.floor(max_correct_abstained * len(correct_confidences))
        # The largest threshold that abstains on at most `allowed` of them: any higher one passes the next.
        threshold = float(correct_confidences[allowed]) if allowed < len(correct_confidences) else 1.0
    return threshold, abstention_rates(confidences, correct, answerable, threshold)


def leave_one_group_out(
    features: torch.Tensor | Sequence[Sequence[float]],
    correct: torch.Tensor | Sequence[bool],
    answerable: torch.Tensor | Sequence[bool],
    groups: Sequence[str],
    feature_names: Sequence[str] = CALIBRATION_FEATURES,
    max_correct_abstained: float = 0.25,
    per_group_threshold: bool = True,
) -> dict[str, dict]:
    """How a calibration abstains on a kind of question it never saw: for each group with correct answers, fit
    ([`fit_calibration`]) and choose the threshold ([`choose_threshold`]) on the other groups (unanswerable questions
    included), then measure [`abstention_rates`] on the held-out group. Users ask questions of kinds no dev set has;
    this is the closest a dev set comes to measuring that.

    Returns:
        `{group: rates}` for every held-out group, rates as in [`abstention_rates`].
    """
    features = torch.as_tensor(features, dtype=torch.float64)
    correct = torch.as_tensor(correct, dtype=torch.bool)
    answerable = torch.as_tensor(answerable, dtype=torch.bool)
    if len(groups) != len(features):
        raise ValueError(f"groups: expected one name per answer ({len(features)}), received {len(groups)}")
    results = {}
    for name in sorted({name for name, right in zip(groups, correct.tolist(), strict=True) if right}):
        held_out = torch.tensor([group == name for group in groups])
        rest = [group for group, out in zip(groups, held_out.tolist(), strict=True) if not out]
        calibration = fit_calibration(features[~held_out], correct[~held_out], feature_names)
        threshold, _ = choose_threshold(calibration.confidence(features[~held_out]), correct[~held_out],
                                        answerable[~held_out], max_correct_abstained,
                                        groups=rest if per_group_threshold else None)  # fmt: skip
        results[name] = abstention_rates(calibration.confidence(features[held_out]), correct[held_out],
                                         answerable[held_out], threshold)  # fmt: skip
    return results


def abstention_rates(confidences, correct, answerable, threshold: float) -> dict:
    """Shares abstained at `threshold`: of unanswerable, of correctly answered, of wrongly answered questions."""
    confidences = torch.as_tensor(confidences, dtype=torch.float64)
    correct = torch.as_tensor(correct, dtype=torch.bool)
    answerable = torch.as_tensor(answerable, dtype=torch.bool)
    abstained = confidences < threshold

    def share(mask: torch.Tensor) -> float | None:
        return float(abstained[mask].double().mean()) if bool(mask.any()) else None

    return {
        "threshold": threshold,
        "unanswerable_abstained": share(~answerable),
        "correct_abstained": share(correct),
        "wrong_abstained": share(answerable & ~correct),
        "coverage": float((~abstained).double().mean()) if len(abstained) else None,
        "accuracy_answered": float(correct[~abstained].double().mean()) if bool((~abstained).any()) else None,
    }


def accuracy_coverage(confidences, correct) -> list[tuple[float, float]]:
    """`(coverage, accuracy)` points: answering only the most confident questions first; unanswerable ones count as
    wrong when answered. The last point (coverage 1) is the plain accuracy."""
    confidences = torch.as_tensor(confidences, dtype=torch.float64)
    correct = torch.as_tensor(correct, dtype=torch.float64)
    order = torch.argsort(confidences, descending=True, stable=True)
    hits = torch.cumsum(correct[order], 0)
    counts = torch.arange(1, len(order) + 1, dtype=torch.float64)
    return [(float(count / len(order)), float(hit / count)) for count, hit in zip(counts, hits, strict=True)]

"""Calibration: logistic fit, threshold choice, accuracy-coverage and the JSON round trip, on synthetic numbers."""

import json
import math

import pytest
import torch

from realm_hf.evaluation.calibration import (
    CALIBRATION_FEATURES,
    Calibration,
    abstention_rates,
    accuracy_coverage,
    choose_threshold,
    fit_calibration,
    leave_one_group_out,
)


def synthetic(n: int = 2000, seed: int = 0):
    """Answers whose correctness follows a known logistic law in the margin feature; the rest is noise."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n, len(CALIBRATION_FEATURES), generator=generator, dtype=torch.float64)
    features[:, 2] = features[:, 2] * 3 + 4  # margin: mean 4, std 3
    true_probability = torch.sigmoid(1.5 * (features[:, 2] - 4) / 3 - 0.5)
    # the labels from a generator of their own: the same draws whatever the number of features
    correct = torch.rand(n, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64) < true_probability
    return features, correct, true_probability


def test_fit_recovers_a_known_logistic_law():
    features, correct, true_probability = synthetic()
    calibration = fit_calibration(features, correct, l2=1e-4)
    margin = calibration.features.index("margin")
    assert calibration.weights[margin] == pytest.approx(1.5, abs=0.2)
    assert calibration.bias == pytest.approx(-0.5, abs=0.15)
    others = [weight for index, weight in enumerate(calibration.weights) if index != margin]
    assert max(abs(weight) for weight in others) < 0.2
    confidence = calibration.confidence(features)
    assert float((confidence - true_probability).abs().mean()) < 0.03
    # Calibrated: in each confidence bin, the share correct is close to the mean confidence.
    for low in (0.0, 0.25, 0.5, 0.75):
        in_bin = (confidence >= low) & (confidence < low + 0.25)
        if int(in_bin.sum()) > 100:
            assert float(correct[in_bin].double().mean()) == pytest.approx(float(confidence[in_bin].mean()), abs=0.06)


def test_fit_stays_finite_on_separable_data_and_checks_inputs():
    features = torch.zeros(6, len(CALIBRATION_FEATURES))
    features[:, 0] = torch.tensor([-5.0, -4, -3, 3, 4, 5])
    calibration = fit_calibration(features, [False, False, False, True, True, True])
    assert all(math.isfinite(weight) for weight in calibration.weights)
    assert calibration.confidence(features[3])[()] > 0.5 > calibration.confidence(features[0])[()]
    with pytest.raises(ValueError, match="one correct and one incorrect"):
        fit_calibration(features, [True] * 6)
    with pytest.raises(ValueError, match="expected features"):
        fit_calibration(features[:, :2], [True, False] * 3)
    with pytest.raises(ValueError, match="feature_names"):
        fit_calibration(features, [True, False] * 3, feature_names=["nope"])


def test_choose_threshold_meets_the_budget_on_correct_answers():
    # 8 correct answers with confidences 0.1 .. 0.8, 4 wrong ones, 4 unanswerable ones with low confidence.
    confidences = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8] + [0.15, 0.35, 0.55, 0.9] + [0.05, 0.12, 0.25, 0.6]
    correct = [True] * 8 + [False] * 8
    answerable = [True] * 12 + [False] * 4
    threshold, rates = choose_threshold(confidences, correct, answerable, max_correct_abstained=0.25)
    assert threshold == pytest.approx(0.3)  # abstains on 0.1 and 0.2: 2 of 8 correct answers
    assert rates["correct_abstained"] == pytest.approx(0.25)
    assert rates["unanswerable_abstained"] == pytest.approx(0.75)  # 0.05, 0.12, 0.25 (not 0.6)
    assert rates["wrong_abstained"] == pytest.approx(0.25)  # 0.15
    assert rates["coverage"] == pytest.approx(10 / 16)  # 6 of 16 abstained
    # Any higher threshold would abstain on a third correct answer.
    assert abstention_rates(confidences, correct, answerable, 0.31)["correct_abstained"] > 0.25
    assert choose_threshold(confidences, correct, answerable, max_correct_abstained=0.0)[0] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="unanswerable question cannot be answered correctly"):
        choose_threshold([0.5], [True], [False])


def test_choose_threshold_per_group_holds_the_budget_in_every_group():
    # Group "easy": 8 correct answers at 0.6 .. 0.95; group "hard": 4 correct answers at 0.1 .. 0.4.
    easy = [0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]
    hard = [0.1, 0.2, 0.3, 0.4]
    confidences = easy + hard + [0.05, 0.5]
    correct = [True] * 12 + [False] * 2
    answerable = [True] * 12 + [False] * 2
    groups = ["easy"] * 8 + ["hard"] * 4 + ["none"] * 2
    pooled, _ = choose_threshold(confidences, correct, answerable, 0.25)
    assert pooled == pytest.approx(0.4)  # 3 of 12 pooled: every "hard" answer but the best is abstained
    threshold, rates = choose_threshold(confidences, correct, answerable, 0.25, groups=groups)
    assert threshold == pytest.approx(0.2)  # "hard"'s own threshold, the smaller of the two (easy: 0.65)
    for name, answers in (("easy", easy), ("hard", hard)):
        assert sum(value < threshold for value in answers) <= 0.25 * len(answers), name
    assert rates["unanswerable_abstained"] == pytest.approx(0.5)  # 0.05 is, 0.5 is not
    with pytest.raises(ValueError, match="one name per answer"):
        choose_threshold(confidences, correct, answerable, groups=groups[:-1])


def test_leave_one_group_out_measures_a_group_the_fit_never_saw():
    # Two groups share the law "correct iff margin is high" but one has its span logits shifted by +5: a calibration
    # that leans on span_logit and never saw that group is fooled by it; one on the margin alone is not.
    generator = torch.Generator().manual_seed(0)
    n = 600
    features = torch.randn(n, len(CALIBRATION_FEATURES), generator=generator, dtype=torch.float64)
    correct = features[:, 2] + 0.3 * torch.randn(n, generator=generator, dtype=torch.float64) > 0
    groups = ["a"] * 300 + ["b"] * 300
    features[:300, 1] = features[:300, 2] + 0.5 * torch.randn(300, generator=generator, dtype=torch.float64)
    features[300:, 1] = features[300:, 2] - 3.0  # group b: same margins, much lower span logits
    answerable = torch.ones(n, dtype=torch.bool)
    both = leave_one_group_out(features, correct, answerable, groups, ("span_logit", "margin"))
    margin_only = leave_one_group_out(features, correct, answerable, groups, ("margin",))
    assert set(both) == set(margin_only) == {"a", "b"}
    assert margin_only["b"]["correct_abstained"] < 0.4
    assert both["b"]["correct_abstained"] > margin_only["b"]["correct_abstained"]
    with pytest.raises(ValueError, match="one name per answer"):
        leave_one_group_out(features, correct, answerable, groups[:-1])


def test_accuracy_coverage_curve():
    points = accuracy_coverage([0.9, 0.1, 0.5, 0.7], [True, False, False, True])
    assert points == [(0.25, 1.0), (0.5, 1.0), (0.75, pytest.approx(2 / 3)), (1.0, 0.5)]


def test_json_round_trip_and_validation(tmp_path):
    features, correct, _ = synthetic(300)
    calibration = fit_calibration(features, correct)
    calibration.threshold = 0.4
    path = calibration.save(tmp_path)
    payload = json.loads(path.read_text())
    assert set(payload) == {"features", "mean", "scale", "weights", "bias", "threshold", "documents_threshold",
                            "metadata"}  # fmt: skip
    loaded = Calibration.load(tmp_path)
    assert torch.equal(loaded.confidence(features), calibration.confidence(features))
    assert loaded.documents_threshold is None and loaded.threshold_for(own_index=False) == 0.4
    # a calibration written before documents_threshold existed loads as one without it
    payload.pop("documents_threshold")
    assert Calibration.from_dict(payload).documents_threshold is None
    calibration.documents_threshold = 0.1
    loaded = Calibration.load(calibration.save(tmp_path))
    assert (loaded.threshold_for(own_index=True), loaded.threshold_for(own_index=False)) == (0.4, 0.1)
    with pytest.raises(ValueError, match=r"documents_threshold must lie in \[0, 1\], received -0.5"):
        Calibration.from_dict({**payload, "documents_threshold": -0.5})
    with pytest.raises(ValueError, match="missing keys"):
        Calibration.from_dict({"features": []})
    with pytest.raises(ValueError, match="one length"):
        Calibration(features=["margin"], mean=[0.0, 1.0], scale=[1.0], weights=[1.0], bias=0.0)
    with pytest.raises(ValueError, match="threshold"):
        Calibration(features=["margin"], mean=[0.0], scale=[1.0], weights=[1.0], bias=0.0, threshold=2.0)
    with pytest.raises(ValueError, match="unknown features"):
        Calibration(features=["bogus"], mean=[0.0], scale=[1.0], weights=[1.0], bias=0.0)
    (tmp_path / "calibration.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Calibration.load(tmp_path)

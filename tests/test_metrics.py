"""workbench.core.metrics: every number against a closed-form count on small hand-made arrays, plus the edge cases."""

from __future__ import annotations

import doctest
import sys

import numpy as np
import pytest

pytest.importorskip("sklearn")
from workbench.core import metrics  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402

# Six samples, three classes. Recalls: class 0 1/2, class 1 2/2, class 2 1/2. Counts (tp, fp, fn):
# class 0 (1, 1, 1), class 1 (2, 1, 0), class 2 (1, 0, 1). Marginals: truth 2/6 each, predicted 2/6, 3/6, 1/6.
TRUTH = np.array([0, 0, 1, 1, 2, 2])
PREDICTED = np.array([0, 1, 1, 1, 2, 0])


# ------------------------------------------------------------------------------- independent references
def counted_f1(truth, predicted, c):
    tp = np.sum((predicted == c) & (truth == c))
    fp = np.sum((predicted == c) & (truth != c))
    fn = np.sum((predicted != c) & (truth == c))
    return 0.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def counted_kappa(truth, predicted):
    classes = np.union1d(truth, predicted)
    observed = np.mean(truth == predicted)
    expected = sum(np.mean(truth == c) * np.mean(predicted == c) for c in classes)
    return (observed - expected) / (1 - expected)


def pairwise_auroc(truth, scores):
    """Mann-Whitney: the fraction of (positive, negative) pairs the scores order correctly, ties ½."""
    positives, negatives = scores[truth == 1], scores[truth == 0]
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def stepwise_average_precision(truth, scores):
    """``Σ_n (R_n − R_{n−1}) P_n`` over the distinct thresholds, highest first (ties enter together)."""
    total, previous_recall = 0.0, 0.0
    for t in np.sort(np.unique(scores))[::-1]:
        chosen = scores >= t
        recall = np.sum(chosen & (truth == 1)) / np.sum(truth == 1)
        precision = np.sum(chosen & (truth == 1)) / np.sum(chosen)
        total += (recall - previous_recall) * precision
        previous_recall = recall
    return total


# ------------------------------------------------------------------------------------------ label metrics
def test_label_metrics_against_hand_counts():
    assert metrics.accuracy(TRUTH, PREDICTED) == pytest.approx(4 / 6)
    np.testing.assert_allclose(metrics.per_class_recall(TRUTH, PREDICTED), [1 / 2, 1, 1 / 2])
    assert metrics.balanced_accuracy(TRUTH, PREDICTED) == pytest.approx(2 / 3)
    np.testing.assert_allclose(metrics.per_class_f1(TRUTH, PREDICTED), [2 / 4, 4 / 5, 2 / 3])
    assert metrics.macro_f1(TRUTH, PREDICTED) == pytest.approx((2 / 4 + 4 / 5 + 2 / 3) / 3)
    # p_o = 4/6, p_e = (2·2 + 2·3 + 2·1) / 36 = 1/3: kappa = (2/3 − 1/3) / (2/3) = 1/2
    assert metrics.cohen_kappa(TRUTH, PREDICTED) == pytest.approx(0.5)
    assert metrics.classification_scores(TRUTH, PREDICTED) == pytest.approx(
        {"accuracy": 4 / 6, "balanced_accuracy": 2 / 3, "macro_f1": (2 / 4 + 4 / 5 + 2 / 3) / 3}
    )


@pytest.mark.parametrize("seed", range(5))
def test_label_metrics_against_counting_on_random_labels(seed):
    rng = np.random.default_rng(seed)
    truth, predicted = rng.integers(0, 4, 60), rng.integers(0, 5, 60)  # class 4 is only ever predicted
    classes = np.unique(truth)
    recalls = [np.mean(predicted[truth == c] == c) for c in classes]
    assert metrics.accuracy(truth, predicted) == pytest.approx(np.mean(truth == predicted), abs=1e-15)
    np.testing.assert_allclose(metrics.per_class_recall(truth, predicted), recalls, atol=1e-15)
    assert metrics.balanced_accuracy(truth, predicted) == pytest.approx(np.mean(recalls), abs=1e-15)
    f1s = [counted_f1(truth, predicted, c) for c in classes]
    np.testing.assert_allclose(metrics.per_class_f1(truth, predicted), f1s, atol=1e-15)
    assert metrics.macro_f1(truth, predicted) == pytest.approx(np.mean(f1s), abs=1e-15)
    assert metrics.cohen_kappa(truth, predicted) == pytest.approx(counted_kappa(truth, predicted), abs=1e-12)


def test_a_class_absent_from_truth():
    truth, predicted = np.array([0, 0, 1, 1]), np.array([0, 2, 1, 1])  # class 2 is predicted, never true
    # balanced accuracy and macro F1 run over the classes in truth: recalls 1/2, 1; F1 2/3, 1
    assert metrics.balanced_accuracy(truth, predicted) == pytest.approx(3 / 4)
    assert metrics.macro_f1(truth, predicted) == pytest.approx(5 / 6)
    recall = metrics.per_class_recall(truth, predicted, labels=[0, 1, 2])
    assert recall[:2].tolist() == [0.5, 1.0] and np.isnan(recall[2])  # recall of a class never true: undefined
    np.testing.assert_allclose(metrics.per_class_f1(truth, predicted, labels=[0, 1, 2]), [2 / 3, 1, 0])
    # a class neither true nor predicted: F1 0 by convention, and it lowers a macro F1 over explicit labels
    assert metrics.macro_f1(truth, predicted, labels=[0, 1, 3]) == pytest.approx((2 / 3 + 1 + 0) / 3)
    # kappa counts every class of either array: p_o = 3/4, p_e = 1/2·1/4 + 1/2·1/2 = 3/8 -> (3/4 − 3/8)/(5/8)
    assert metrics.cohen_kappa(truth, predicted) == pytest.approx(0.6)


def test_kappa_extremes():
    assert metrics.cohen_kappa([0, 1, 2, 1], [0, 1, 2, 1]) == pytest.approx(1.0)
    assert metrics.cohen_kappa([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(0.0)  # p_o = p_e = 1/2
    assert np.isnan(metrics.cohen_kappa([2, 2, 2], [2, 2, 2]))  # p_e = 1: undefined, not a warning


def test_float_labels_score_as_integers():
    """Tasks pass float32 truth (a torch batch) with int64 predictions: same numbers."""
    as_float = metrics.classification_scores(TRUTH.astype(np.float32), PREDICTED)
    assert as_float == metrics.classification_scores(TRUTH, PREDICTED)


# ---------------------------------------------------------------------------------------- ranking metrics
def test_ranking_metrics_against_hand_values():
    truth = np.array([1, 0, 1, 0])
    scores = np.array([0.9, 0.8, 0.7, 0.6])[:, None]
    # pairs (0.9 > 0.8, 0.6), (0.7 > 0.6, 0.7 < 0.8): 3/4; precision at the positives 1/1 and 2/3: AP 5/6
    assert metrics.per_class_auroc(truth[:, None], scores) == pytest.approx([3 / 4])
    assert metrics.per_class_average_precision(truth[:, None], scores) == pytest.approx([5 / 6])
    # a tie between a positive and a negative counts one half; both enter the precision together
    tied = np.array([0.9, 0.9, 0.7, 0.6])[:, None]
    assert metrics.macro_auroc(truth[:, None], tied) == pytest.approx(2.5 / 4)
    assert metrics.macro_average_precision(truth[:, None], tied) == pytest.approx(0.5 * 1 / 2 + 0.5 * 2 / 3)


def test_multiclass_probabilities_score_one_vs_rest():
    rng = np.random.default_rng(1)
    truth = np.repeat([0, 1, 3], 7)  # class 2 never true: no positive, its AUROC is undefined
    logits = rng.normal(size=(len(truth), 4)) + 1.5 * (truth[:, None] == np.arange(4))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    aurocs = metrics.per_class_auroc(truth, probabilities)
    precisions = metrics.per_class_average_precision(truth, probabilities)
    assert np.isnan(aurocs[2]) and np.isnan(precisions[2])
    for k in (0, 1, 3):
        assert aurocs[k] == pytest.approx(pairwise_auroc((truth == k).astype(int), probabilities[:, k]), abs=1e-12)
        expected = stepwise_average_precision((truth == k).astype(int), probabilities[:, k])
        assert precisions[k] == pytest.approx(expected, abs=1e-12)
    assert metrics.macro_auroc(truth, probabilities) == pytest.approx(np.mean(aurocs[[0, 1, 3]]), abs=1e-15)
    assert metrics.macro_average_precision(truth, probabilities) == pytest.approx(np.mean(precisions[[0, 1, 3]]))


def test_no_class_with_positives_and_negatives_is_an_error():
    truth = np.array([[1, 0], [1, 0], [1, 0]])  # class 0 always positive, class 1 never
    assert np.isnan(metrics.per_class_auroc(truth, np.full((3, 2), 0.5))).all()
    with pytest.raises(UserError, match="no class has both positive and negative samples: AUROC is undefined"):
        metrics.macro_auroc(truth, np.full((3, 2), 0.5))
    with pytest.raises(UserError, match="average precision is undefined"):
        metrics.macro_average_precision(truth, np.full((3, 2), 0.5))


# ----------------------------------------------------------------------------------- multi-label scores
def test_thresholds_maximise_f1_ties_go_to_the_one_nearest_half():
    truth = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 0]], dtype=float)
    probabilities = np.array([[0.9, 0.2, 0.85], [0.3, 0.1, 0.8], [0.2, 0.4, 0.1], [0.1, 0.35, 0.7]])
    thresholds = metrics.choose_thresholds(truth, probabilities)
    # class 0: t = 0.3 gives F1 1 (0.2: 4/5, 0.5: 2/3)
    # class 1: t = 0.35 catches the positive with one false positive (0.4): F1 2/3, the best
    # class 2: F1 2/3 at t = 0.85 (one of two positives, no false one) and at t = 0.1 (all four); 0.85 is nearer
    #          0.5; 0.8 gives 1/2, 0.7 and 0.5 give 2/5
    assert thresholds.tolist() == pytest.approx([0.3, 0.35, 0.85])
    # a class without a positive keeps 0.5
    assert metrics.choose_thresholds(np.zeros((3, 1)), np.array([[0.1], [0.7], [0.9]])).tolist() == [0.5]


def test_multilabel_scores_keys_and_values():
    truth = np.array([[1, 0, 0], [1, 0, 1], [0, 0, 1], [0, 0, 0], [1, 0, 0]])
    probabilities = np.array([[0.8, 0.1, 0.3], [0.6, 0.2, 0.9], [0.7, 0.6, 0.2], [0.1, 0.3, 0.4], [0.4, 0.1, 0.1]])
    thresholds = np.array([0.5, 0.5, 0.25])
    scores = metrics.multilabel_scores(truth, probabilities, thresholds, ("Alpha", "Beta", "Gamma"))
    # class Beta has no positive: no AUROC key, and F1 0 (one false positive at 0.6)
    assert list(scores) == [
        "macro_auroc", "macro_average_precision", "macro_f1", "auroc_alpha", "f1_alpha", "f1_beta", "auroc_gamma",
        "f1_gamma",
    ]  # fmt: skip
    auroc = [pairwise_auroc(truth[:, k], probabilities[:, k]) for k in (0, 2)]
    ap = [stepwise_average_precision(truth[:, k], probabilities[:, k]) for k in (0, 2)]
    predicted = probabilities >= thresholds
    f1 = [counted_f1(truth[:, k], predicted[:, k].astype(int), 1) for k in range(3)]
    assert scores["auroc_alpha"] == pytest.approx(auroc[0]) and scores["auroc_gamma"] == pytest.approx(auroc[1])
    assert scores["macro_auroc"] == pytest.approx(np.mean(auroc))
    assert scores["macro_average_precision"] == pytest.approx(np.mean(ap))
    assert [scores["f1_alpha"], scores["f1_beta"], scores["f1_gamma"]] == pytest.approx(f1)
    assert f1[1] == 0 and scores["macro_f1"] == pytest.approx(np.mean(f1))  # over all classes, Beta's 0 too
    with pytest.raises(UserError, match="2 thresholds and 2 class names"):
        metrics.multilabel_scores(truth[:, :2], probabilities[:, :2], thresholds, ("Alpha", "Beta"))


# ------------------------------------------------------------------------------------------- bad input
def test_bad_shapes_are_user_errors():
    with pytest.raises(UserError, match=r"shape \(n_samples,\)"):
        metrics.accuracy([0, 1, 2], [0, 1])
    with pytest.raises(UserError, match="argmax"):
        metrics.macro_f1(np.zeros((4, 2)), np.zeros((4, 2)))
    with pytest.raises(UserError, match="no samples"):
        metrics.balanced_accuracy([], [])
    with pytest.raises(UserError, match="class indices 0..1"):
        metrics.per_class_auroc([0, 1, 2], np.zeros((3, 2)))
    with pytest.raises(UserError, match="does not fit"):
        metrics.macro_auroc(np.zeros((3, 3)), np.zeros((3, 2)))
    with pytest.raises(UserError, match="must be 0/1"):
        metrics.choose_thresholds(np.full((3, 2), 2.0), np.zeros((3, 2)))


def test_missing_scikit_learn_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.metrics", None)  # makes `import sklearn.metrics` fail
    with pytest.raises(UserError, match="pip install scikit-learn"):
        metrics.macro_f1(TRUTH, PREDICTED)
    assert metrics.accuracy(TRUTH, PREDICTED) == pytest.approx(4 / 6)  # numpy only


def test_docstring_examples():
    assert doctest.testmod(metrics).failed == 0

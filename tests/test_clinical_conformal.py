"""Conformal sets (`workbench.clinical.conformal`): the same sets as crepes on the same scores, weighted = split
when the weights are equal, coverage on closed-form toys (exchangeable, and under a known covariate shift)."""

from __future__ import annotations

import math

import crepes
import numpy as np
import pytest
from scipy.stats import spearmanr

from workbench.clinical import conformal


def _classifier_toy(rng: np.random.Generator, n: int, k: int = 4):
    """Probabilities from a Dirichlet and labels drawn from them: a calibrated classifier."""
    probabilities = rng.dirichlet(np.ones(k), size=n)
    truth = np.array([rng.choice(k, p=p) for p in probabilities])
    return probabilities, truth


@pytest.mark.parametrize("n_cal", [50, 120, 333])
@pytest.mark.parametrize("alpha", [0.1, 0.2, 0.05])
def test_split_sets_are_crepes_sets_on_the_same_scores(n_cal, alpha):
    rng = np.random.default_rng(n_cal)
    p_cal, y_cal = _classifier_toy(rng, n_cal)
    p_test, _ = _classifier_toy(rng, 400)
    scores = conformal.true_scores(p_cal, y_cal, multilabel=False)
    ours = conformal.prediction_sets(p_test, conformal.split_quantile(scores, alpha), multilabel=False)
    reference = crepes.ConformalClassifier().fit(scores)
    theirs = reference.predict_set(conformal.label_scores(p_test, False), confidence=1 - alpha, smoothing=False)
    assert (alpha * (n_cal + 1)) % 1 != 0  # crepes keeps p = alpha too: the sets differ only when this is whole
    assert np.array_equal(ours, theirs.astype(bool))
    assert 0 < ours.sum(axis=1).mean() < 4


def test_per_class_multilabel_sets_are_crepes_sets_of_each_class():
    rng = np.random.default_rng(7)
    p_cal, p_test = rng.random((80, 3)), rng.random((200, 3))
    y_cal = (rng.random((80, 3)) < p_cal).astype(int)
    scores = conformal.true_scores(p_cal, y_cal, multilabel=True)
    q = np.array([conformal.split_quantile(scores[:, k], 0.1) for k in range(3)])
    ours = conformal.prediction_sets(p_test, q, multilabel=True)
    for k in range(3):
        theirs = crepes.ConformalClassifier().fit(scores[:, k]).predict_set(
            conformal.label_scores(p_test, True)[:, k], confidence=0.9, smoothing=False)
        assert np.array_equal(ours[:, k], theirs.astype(bool))


def test_the_quantile_rank_and_too_few_items():
    scores = np.arange(1, 10) / 10  # 0.1 … 0.9
    assert conformal.split_quantile(scores, 0.1) == 0.9  # k = ⌈10 · 0.9⌉ = 9
    assert conformal.split_quantile(scores, 0.2) == 0.8  # k = 8
    assert conformal.split_quantile(scores[:8], 0.1) == math.inf  # k = ⌈9 · 0.9⌉ = 9 > 8


@pytest.mark.parametrize("n_cal", [9, 19, 50, 101])
def test_weighted_with_equal_weights_is_split_conformal(n_cal):
    rng = np.random.default_rng(n_cal)
    scores = rng.random(n_cal)
    for alpha in (0.05, 0.1, 0.2, 0.5):
        q = conformal.weighted_quantiles(scores, np.full(n_cal, 3.0), np.full(5, 3.0), alpha)
        assert np.all(q == conformal.split_quantile(scores, alpha))


def test_split_coverage_on_a_closed_form_toy_is_at_least_nominal_and_below_the_upper_bound():
    # exchangeable calibration and test: coverage in [1 − α, 1 − α + 1 / (n + 1)] in expectation over draws
    rng = np.random.default_rng(11)
    n_cal, alpha, covered = 49, 0.1, []
    for _ in range(400):
        p_cal, y_cal = _classifier_toy(rng, n_cal)
        p_test, y_test = _classifier_toy(rng, 200)
        q = conformal.split_quantile(conformal.true_scores(p_cal, y_cal, False), alpha)
        covered.append(conformal.coverage(conformal.prediction_sets(p_test, q, False), y_test, False))
    mean, error = np.mean(covered), np.std(covered) / np.sqrt(len(covered))
    assert 1 - alpha - 3 * error <= mean <= 1 - alpha + 1 / (n_cal + 1) + 3 * error


def _shift_toy(rng: np.random.Generator, n: int, mean: float):
    """x ~ N(mean, 1); y | x ~ N(0, (1 + |x|)²) (heteroscedastic; the same at source and target); score |y|."""
    x = rng.normal(mean, 1, n)
    return x, np.abs(rng.normal(0, 1 + np.abs(x)))


def test_weighted_quantiles_keep_coverage_under_a_known_covariate_shift_where_split_ones_lose_it():
    # source N(0, 1), target N(1, 1): w(x) = exp(x − 1/2) exactly; the target's scores are noisier. Weighted
    # conformal is valid (≥ 1 − α) and, with 500 calibration items, close to nominal (its +∞ mass is small)
    rng = np.random.default_rng(5)
    alpha, weighted, split = 0.1, [], []
    for _ in range(300):
        x_cal, s_cal = _shift_toy(rng, 500, 0.0)
        x_test, s_test = _shift_toy(rng, 100, 1.0)
        q = conformal.weighted_quantiles(s_cal, np.exp(x_cal - 0.5), np.exp(x_test - 0.5), alpha)
        weighted.append(np.mean(s_test <= q))
        split.append(np.mean(s_test <= conformal.split_quantile(s_cal, alpha)))
    error = np.std(weighted) / np.sqrt(len(weighted))
    assert 1 - alpha - 3 * error <= np.mean(weighted) < 1 - alpha + 0.015
    assert np.mean(split) < 1 - alpha - 0.04


def test_density_ratio_weights_from_the_workbench_estimator_follow_the_true_ratio():
    rng = np.random.default_rng(3)
    x_cal, x_batch = rng.normal(0, 1, (300, 1)), rng.normal(1, 1, (300, 1))
    estimator = conformal.density_ratio_estimator("dre-ulsif", seed=0)
    w_cal, w_batch = conformal.density_ratio_weights(x_cal, x_batch, estimator)
    truth = np.exp(x_cal[:, 0] - 0.5)
    assert spearmanr(w_cal, truth).statistic > 0.98  # in order; uLSIF shrinks the largest ratios (its ridge)
    assert w_cal.mean() == pytest.approx(1.0) and (w_batch > 0).all()


def test_too_few_items_for_a_density_ratio_is_a_clear_error():
    from workbench.core.errors import UserError

    with pytest.raises(UserError, match="at least 2 calibration and 2 batch"):
        conformal.density_ratio_weights(np.zeros((5, 2)), np.zeros((1, 2)), estimator=None)

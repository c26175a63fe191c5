"""Temperature scaling and the expected calibration error (`workbench.clinical.calibration`), against a brute-force
NLL minimum and a hand computation."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.clinical import calibration


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _toy_softmax(seed: int = 0, n: int = 400, sharpness: float = 3.0):
    """Labels drawn from softmax(z); the reported probabilities are softmax(sharpness · z): over-confident."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 4))
    truth = np.array([rng.choice(4, p=p) for p in _softmax(z)])
    return _softmax(sharpness * z), truth


def test_the_fitted_temperature_is_the_brute_force_nll_minimum_softmax():
    probabilities, truth = _toy_softmax()
    fitted = calibration.fit_temperature(probabilities, truth, multilabel=False)
    grid = np.exp(np.linspace(np.log(0.2), np.log(20), 4001))
    nll = [calibration.negative_log_likelihood(calibration.apply_temperature(probabilities, np.array([t]), False),
                                               truth, False) for t in grid]  # fmt: skip
    assert fitted.shape == (1,)
    assert fitted[0] == pytest.approx(grid[int(np.argmin(nll))], rel=2e-3)
    assert 2.0 < fitted[0] < 4.5  # the labels' own temperature is 3: the fit recovers it within the sample's noise


def test_each_class_gets_its_own_temperature_multilabel():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(600, 3)) * 2
    truth = (rng.random(z.shape) < 1 / (1 + np.exp(-z))).astype(float)
    sharpness = np.array([0.5, 1.0, 4.0])  # under-, well- and over-confident classes
    probabilities = 1 / (1 + np.exp(-z * sharpness))
    fitted = calibration.fit_temperature(probabilities, truth, multilabel=True)
    grid = np.exp(np.linspace(np.log(0.05), np.log(20), 3001))
    for k in range(3):
        nll = [calibration.negative_log_likelihood(calibration.apply_temperature(probabilities[:, [k]], np.array([t]),
                                                                                 True), truth[:, [k]], True)
               for t in grid]  # fmt: skip
        assert fitted[k] == pytest.approx(grid[int(np.argmin(nll))], rel=3e-3)
    assert fitted[0] < 1 < fitted[2]


def test_scaling_keeps_every_argmax_and_lowers_the_nll():
    probabilities, truth = _toy_softmax(seed=2)
    t = calibration.fit_temperature(probabilities, truth, False)
    scaled = calibration.apply_temperature(probabilities, t, False)
    assert (scaled.argmax(axis=1) == probabilities.argmax(axis=1)).all()
    assert np.allclose(scaled.sum(axis=1), 1)
    assert calibration.negative_log_likelihood(scaled, truth, False) < calibration.negative_log_likelihood(
        probabilities, truth, False)
    assert np.allclose(calibration.apply_temperature(probabilities, np.ones(1), False), probabilities, atol=1e-5)


def test_ece_by_hand():
    # top-class confidences 0.95, 0.95, 0.62, 0.40 (bins 14, 14, 9, 6 of 15); right, wrong, right, right
    probabilities = np.array([[0.95, 0.05], [0.95, 0.05], [0.38, 0.62], [0.40, 0.35]])
    probabilities[3] = [0.40, 0.35]  # rows need not sum to 1 for the ECE: only the top value is read
    truth = np.array([0, 1, 1, 0])
    expected = (2 * abs(0.5 - 0.95) + abs(1 - 0.62) + abs(1 - 0.40)) / 4
    assert calibration.expected_calibration_error(probabilities, truth, False) == pytest.approx(expected)


def test_ece_by_hand_multilabel_pools_every_class():
    probabilities = np.array([[0.1, 0.9], [0.1, 0.7]])
    truth = np.array([[0, 1], [1, 1]])
    # bin 1: p 0.1, 0.1 outcomes 0, 1; bin 10: p 0.7 outcome 1; bin 13: p 0.9 outcome 1
    expected = (2 * abs(0.5 - 0.1) + abs(1 - 0.7) + abs(1 - 0.9)) / 4
    assert calibration.expected_calibration_error(probabilities, truth, True) == pytest.approx(expected)


def test_a_probability_of_one_falls_in_the_last_bin_and_calibrated_probabilities_give_a_small_ece():
    assert calibration.expected_calibration_error(np.array([[1.0, 0.0]]), np.array([0]), False) == 0.0
    rng = np.random.default_rng(3)
    p = rng.random(20000)
    truth = (rng.random(20000) < p).astype(float)[:, None]
    assert calibration.expected_calibration_error(p[:, None], truth, True) < 0.02

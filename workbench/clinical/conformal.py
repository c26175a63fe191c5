"""Split conformal prediction sets, and weighted ones for a covariate shift (Tibshirani, Barber, Candès & Ramdas,
NeurIPS 2019).

Score of a candidate label: ``s(x, y) = 1 − p_y(x)`` (the "LAC" score; ``p`` the calibrated probabilities). With
calibration scores ``s_1 … s_n`` (each item's true label) and level ``α``:

* split conformal: ``q̂ = s_(k)``, the ``k = ⌈(n + 1)(1 − α)⌉``-th smallest (``+∞`` when ``k > n``); the set of
  ``x`` is ``{y : s(x, y) ≤ q̂}``. Exchangeable calibration and test items give ``P(y ∈ set) ≥ 1 − α``. The same
  set as a conformal p-value ``(#{s_i ≥ s} + 1) / (n + 1) > α`` (crepes's ``predict_set`` without smoothing, which
  keeps ``p = α`` too: the two differ only when ``α (n + 1)`` is a whole number);
* weighted: when the test point comes from a density ``p_test(x) = w(x) p_cal(x)`` (the same ``p(y | x)``),
  ``q̂(x)`` is the ``1 − α`` quantile of ``Σ_i p_i δ_{s_i} + p_{n+1} δ_{+∞}`` with ``p_i = w(x_i) / (Σ_j w(x_j) +
  w(x))`` and ``p_{n+1} = w(x) / (Σ_j w(x_j) + w(x))``: the smallest ``s_i`` whose cumulative mass reaches
  ``1 − α``. Equal weights give the split conformal ``q̂``.

Multi-label tasks: each class is its own binary problem (labels 0 / 1, ``p_0 = 1 − p_k``) with its own ``q̂``: a
class's set is {}, {0}, {1} or {0, 1}, and the coverage guarantee is per class.

Shapes:
    scores (n_cal,) or, multi-label, (n_cal, n_classes); weights (n_cal,); test weights (n_test,);
    q̂ (n_test,) or (n_test, n_classes).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from workbench.core.errors import UserError


def split_quantile(scores: np.ndarray, alpha: float) -> float:
    """Split conformal ``q̂`` of calibration ``scores`` (n,) at level ``alpha`` (+inf when n is too small)."""
    scores = np.sort(np.asarray(scores, dtype=np.float64))
    k = math.ceil((len(scores) + 1) * (1 - alpha) - 1e-12)  # a whole number stays whole despite rounding
    return float(scores[k - 1]) if k <= len(scores) else math.inf


def weighted_quantiles(scores: np.ndarray, weights: np.ndarray, test_weights: np.ndarray, alpha: float) -> np.ndarray:
    """Weighted conformal ``q̂(x)`` for each test point (see the module docstring).

    Args:
        scores: (n,) calibration scores.
        weights: (n,) ``w(x_i) ≥ 0`` of the calibration items.
        test_weights: (m,) ``w(x)`` of the test points.
        alpha: miscoverage level in (0, 1).

    Returns (m,) float64, +inf where the point mass at +inf is needed to reach ``1 − alpha``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    test_weights = np.atleast_1d(np.asarray(test_weights, dtype=np.float64))
    order = np.argsort(scores, kind="stable")
    sorted_scores, cumulative = scores[order], np.cumsum(weights[order])  # (n,)
    total = cumulative[-1] + test_weights  # (m,)
    # the first index whose mass reaches 1 − alpha: cumulative ≥ (1 − alpha) · total (a relative tolerance keeps
    # equal weights exactly where split conformal's whole-number rank is)
    needed = (1 - alpha) * total * (1 - 1e-12)
    index = np.searchsorted(cumulative, needed, side="left")
    result = np.full(len(test_weights), math.inf)
    inside = index < len(scores)
    result[inside] = sorted_scores[index[inside]]
    return result


def label_scores(probabilities: np.ndarray, multilabel: bool) -> np.ndarray:
    """Scores of every candidate label: (n, K) ``1 − p`` (softmax); (n, K, 2) ``[p_k, 1 − p_k]`` for labels 0 and
    1 of each class (multi-label)."""
    p = np.asarray(probabilities, dtype=np.float64)
    return np.stack([p, 1 - p], axis=-1) if multilabel else 1 - p


def true_scores(probabilities: np.ndarray, truth: np.ndarray, multilabel: bool) -> np.ndarray:
    """Scores of the true labels: (n,) softmax; (n, K) multi-label."""
    every = label_scores(probabilities, multilabel)
    if multilabel:
        y = np.asarray(truth, dtype=np.int64)
        return np.take_along_axis(every, y[..., None], axis=-1)[..., 0]
    return every[np.arange(len(every)), np.asarray(truth, dtype=np.int64)]


def prediction_sets(probabilities: np.ndarray, quantiles: np.ndarray, multilabel: bool) -> np.ndarray:
    """Which labels are in each set: (n, K) bool (softmax; ``quantiles`` (n,) or a scalar), (n, K, 2) bool for
    labels 0 / 1 of each class (multi-label; ``quantiles`` (n, K) or (K,))."""
    every = label_scores(probabilities, multilabel)
    q = np.asarray(quantiles, dtype=np.float64)
    q = q[..., None] if multilabel or q.ndim == 1 else q
    return every <= q


def coverage(sets: np.ndarray, truth: np.ndarray, multilabel: bool) -> float:
    """Share of true labels inside their sets (multi-label: over every item and class)."""
    if multilabel:
        y = np.asarray(truth, dtype=np.int64)
        return float(np.take_along_axis(sets, y[..., None], axis=-1).mean())
    return float(sets[np.arange(len(sets)), np.asarray(truth, dtype=np.int64)].mean())


def density_ratio_weights(calibration: np.ndarray, batch: np.ndarray, estimator: Any, clip: float = 20.0
                          ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``w = p_batch / p_cal`` at the calibration items and the batch's own items, from a fitted density-ratio
    ``estimator`` (``fit(x_numerator, x_denominator)``, ``ratio(x)``: the workbench's uLSIF, KLIEP or ppDRE).

    Weights are clipped at ``clip`` × their mean over the calibration items (a ratio estimated from a few points
    can spike), and a batch item's weight is at least a tiny positive number.

    Shapes: calibration (n_cal, d), batch (m, d) → ((n_cal,), (m,)).

    Raises:
        UserError: fewer than 2 items on either side (no density can be estimated from one).
    """
    calibration, batch = np.asarray(calibration, dtype=np.float64), np.asarray(batch, dtype=np.float64)
    if len(calibration) < 2 or len(batch) < 2:
        raise UserError(f"weighted conformal needs at least 2 calibration and 2 batch items, got {len(calibration)} "
                        f"and {len(batch)}")  # fmt: skip
    estimator.fit(batch, calibration)
    w_cal = np.maximum(np.asarray(estimator.ratio(calibration), dtype=np.float64), 0.0)
    w_batch = np.maximum(np.asarray(estimator.ratio(batch), dtype=np.float64), 0.0)
    mean = w_cal.mean() if w_cal.mean() > 0 else 1.0
    w_cal, w_batch = np.minimum(w_cal, clip * mean) / mean, np.minimum(w_batch, clip * mean) / mean
    return w_cal, np.maximum(w_batch, 1e-12)


def density_ratio_estimator(name: str, seed: int) -> Any:
    """The density-ratio estimator of the registered weighting method ``name`` (its ``make_estimator``), on the
    CPU; a `UserError` naming the choices when ``name`` makes none."""
    from workbench.core.registry import methods

    method = methods.get(name)()
    if not hasattr(method, "make_estimator"):
        raise UserError(f"method '{name}' estimates no density ratio; choose a weighting method (workbench list)")
    return method.make_estimator(seed, torch.device("cpu"))

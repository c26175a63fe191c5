"""The metrics of `workbench.core.metrics`, on many resamples of one set of predictions at once.

A resample is given as how often it draws each item: ``counts (n_resamples, n_items)`` (a bootstrap draws items with
replacement; `workbench.run.item_bootstrap`). A metric of a resample equals that metric, as `workbench.core.metrics`
computes it, on the items repeated as often as drawn; it is computed here from count-weighted sums, vectorised over
resamples (scikit-learn's per-call checks cost milliseconds: 1000 resamples of a multi-label score take over a minute
there, milliseconds here). `workbench.core.metrics` stays the reference: the tests compare every function below with it.

Every function returns ``(n_resamples,)`` or ``(n_resamples, n_classes)`` float64, NaN where a resample does not
define the metric (no positive or no negative of a class for AUROC, no item at all, ...).
"""

from __future__ import annotations

import numpy as np


def _counts(counts: np.ndarray, n_items: int) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[1] != n_items:
        raise ValueError(f"counts must have shape (n_resamples, {n_items}), got {counts.shape}")
    return counts


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, NaN where the denominator is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), np.nan)


def mean(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The mean of ``values`` over each resample. Shapes: values (n_items,), counts (n_resamples, n_items) →
    (n_resamples,)."""
    values = np.asarray(values, dtype=np.float64)
    counts = _counts(counts, len(values))
    return _ratio(counts @ values, counts.sum(axis=1))


def confusion(truth: np.ndarray, predicted: np.ndarray, counts: np.ndarray, n_classes: int) -> np.ndarray:
    """Count-weighted confusion matrices, rows the true class. Shapes: truth, predicted (n_items,) class indices
    < ``n_classes``; counts (n_resamples, n_items) → (n_resamples, n_classes, n_classes)."""
    truth, predicted = np.asarray(truth, dtype=np.int64), np.asarray(predicted, dtype=np.int64)
    counts = _counts(counts, len(truth))
    cell = np.zeros((len(truth), n_classes * n_classes))
    cell[np.arange(len(truth)), truth * n_classes + predicted] = 1.0
    return (counts @ cell).reshape(len(counts), n_classes, n_classes)


def label_scores(matrices: np.ndarray) -> dict[str, np.ndarray]:
    """`workbench.core.metrics`' label metrics of confusion matrices (`confusion`), over the classes present in each
    resample's truth as there: ``accuracy``, ``balanced_accuracy``, ``macro_f1``, ``cohen_kappa`` (NaN when truth and
    prediction are one class) (n_resamples,), and per class ``recall`` (NaN for a class absent from the truth) and
    ``f1`` (0 when the class is neither true nor predicted) (n_resamples, n_classes)."""
    tp = np.diagonal(matrices, axis1=1, axis2=2)
    true, made = matrices.sum(axis=2), matrices.sum(axis=1)
    total = true.sum(axis=1)
    present = true > 0
    recall = _ratio(tp, true)
    f1 = np.where(true + made > 0, _ratio(2 * tp, true + made), 0.0)
    n_present = present.sum(axis=1)
    accuracy = _ratio(tp.sum(axis=1), total)
    expected = _ratio((true * made).sum(axis=1), total**2)
    one_class = ((true > 0) | (made > 0)).sum(axis=1) <= 1
    kappa = np.where(one_class, np.nan, _ratio(accuracy - expected, 1 - expected))
    return {
        "accuracy": accuracy,
        "balanced_accuracy": _ratio(np.where(present, recall, 0.0).sum(axis=1), n_present),
        "macro_f1": _ratio(np.where(present, f1, 0.0).sum(axis=1), n_present),
        "cohen_kappa": kappa,
        "recall": recall,
        "f1": f1,
    }


def _ranked(truth: np.ndarray, scores: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Count-weighted positives and negatives at or above each distinct score, highest score first. Shapes:
    truth, scores (n_items,) → two (n_resamples, n_distinct)."""
    order = np.argsort(-scores, kind="stable")
    ranked = scores[order]
    ends = np.flatnonzero(np.r_[ranked[1:] != ranked[:-1], True])
    positive = truth[order].astype(np.float64)
    drawn = counts[:, order]
    return np.cumsum(drawn * positive, axis=1)[:, ends], np.cumsum(drawn * (1 - positive), axis=1)[:, ends]


def per_class_ranking(truth: np.ndarray, scores: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-class AUROC (ties count ½) and average precision ``Σ_n (R_n − R_{n−1}) P_n`` of each resample, NaN for a
    class without positives or negatives in it (`workbench.core.metrics.per_class_auroc`,
    `per_class_average_precision`).

    Shapes: truth (n_items, n_classes) 0/1, scores (n_items, n_classes), counts (n_resamples, n_items) → two
    (n_resamples, n_classes).
    """
    truth, scores = np.asarray(truth), np.asarray(scores, dtype=np.float64)
    counts = _counts(counts, len(truth))
    auroc = np.full((len(counts), truth.shape[1]), np.nan)
    precision = np.full_like(auroc, np.nan)
    for k in range(truth.shape[1]):
        tp, fp = _ranked(truth[:, k], scores[:, k], counts)
        positives, negatives = tp[:, -1], fp[:, -1]
        defined = (positives > 0) & (negatives > 0)
        new_tp, new_fp = np.diff(tp, prepend=0, axis=1), np.diff(fp, prepend=0, axis=1)
        below = negatives[:, None] - fp  # negatives scored strictly lower than this distinct score
        pairs = (new_tp * (below + 0.5 * new_fp)).sum(axis=1)
        auroc[defined, k] = pairs[defined] / (positives[defined] * negatives[defined])
        steps = np.where(new_tp > 0, new_tp * _ratio(tp, tp + fp), 0.0).sum(axis=1)
        precision[defined, k] = steps[defined] / positives[defined]
    return auroc, precision


def binary_f1(truth: np.ndarray, predicted: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per-class F1 ``2·tp / (2·tp + fp + fn)`` of multi-label predictions (0 where ``tp + fp + fn = 0``). Shapes:
    truth, predicted (n_items, n_classes) 0/1, counts (n_resamples, n_items) → (n_resamples, n_classes)."""
    truth, predicted = np.asarray(truth, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    counts = _counts(counts, len(truth))
    tp = counts @ (truth * predicted)
    wrong = counts @ (truth * (1 - predicted)) + counts @ ((1 - truth) * predicted)
    return np.where(2 * tp + wrong > 0, _ratio(2 * tp, 2 * tp + wrong), 0.0)


def macro(values: np.ndarray) -> np.ndarray:
    """The mean over classes where defined, NaN where none is. Shapes: (n_resamples, n_classes) → (n_resamples,)."""
    defined = ~np.isnan(values)
    return _ratio(np.where(defined, values, 0.0).sum(axis=1), defined.sum(axis=1).astype(np.float64))

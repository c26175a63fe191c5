"""Classification metrics shared by every task: label metrics, ranking metrics, per-class thresholds.

Two kinds of truth, one vocabulary:

- **multi-class**: ``truth (n_samples,)`` holds one class per sample; ``predicted (n_samples,)`` the predicted
  class; ``probabilities (n_samples, n_classes)`` one score per class, column ``k`` for class ``k``.
- **multi-label**: ``truth (n_samples, n_classes)`` is multi-hot (0/1); ``probabilities`` has the same shape.

Label metrics (multi-class), computed over the classes present in ``truth`` unless ``labels`` says otherwise:

- accuracy ``= mean(predicted == truth)``;
- recall of class c ``= #{predicted = c, truth = c} / #{truth = c}``; balanced accuracy = their mean;
- F1 of class c ``= 2·tp / (2·tp + fp + fn)`` (0 when ``tp + fp + fn = 0``); macro-F1 = their mean;
- Cohen's kappa ``= (p_o − p_e) / (1 − p_e)``, ``p_o`` the accuracy and ``p_e = Σ_c P(truth = c)·P(predicted = c)``.

Ranking metrics, per class (one-vs-rest for multi-class truth): AUROC (the probability that a random positive
scores above a random negative, ties counting ½) and average precision ``AP = Σ_n (R_n − R_{n−1}) P_n``
(scikit-learn's step-wise area under the precision-recall curve). Both are defined for a class only when
``truth`` holds positives and negatives of it; a macro value averages the classes where it is defined.

scikit-learn computes F1, recall, kappa, AUROC and AP; it is imported when first needed (the base install
does not have it). The functions are plain numpy in, Python floats or numpy arrays out.

>>> import numpy as np
>>> truth, predicted = np.array([0, 0, 1, 1, 2]), np.array([0, 1, 1, 1, 2])
>>> classification_scores(truth, predicted)["balanced_accuracy"]  # recalls 1/2, 1, 1
0.8333333333333334
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from workbench.core.errors import UserError


def _sklearn_metrics():
    try:
        import sklearn.metrics
    except ImportError:
        raise UserError(
            "workbench.core.metrics needs scikit-learn for F1, recall, kappa, AUROC and average precision: "
            "pip install scikit-learn"
        ) from None
    return sklearn.metrics


def _labels_pair(truth, predicted, function: str) -> tuple[np.ndarray, np.ndarray]:
    truth, predicted = np.asarray(truth), np.asarray(predicted)
    if truth.ndim != 1 or predicted.shape != truth.shape:
        raise UserError(
            f"{function}: expected truth and predicted of shape (n_samples,) (one class per sample), got "
            f"{truth.shape} and {predicted.shape}; for scores use argmax(axis=1), for multi-label truth use "
            "multilabel_scores"
        )
    if not len(truth):
        raise UserError(f"{function}: no samples; evaluate on a split that holds at least one")
    return truth, predicted


def _indicator(truth, scores, function: str) -> tuple[np.ndarray, np.ndarray]:
    """``(truth (n_samples, n_classes) 0/1, scores (n_samples, n_classes))``: class indices become one-vs-rest."""
    truth, scores = np.asarray(truth), np.asarray(scores)
    if scores.ndim != 2 or not len(scores) or not np.issubdtype(scores.dtype, np.number):
        raise UserError(
            f"{function}: expected numeric scores of shape (n_samples, n_classes), got {scores.dtype} {scores.shape}"
        )
    n_classes = scores.shape[1]
    if truth.ndim == 1 and len(truth) == len(scores):
        if not np.all((truth == np.round(truth)) & (truth >= 0) & (truth < n_classes)):
            raise UserError(
                f"{function}: multi-class truth must hold class indices 0..{n_classes - 1} (one per score column), "
                f"found values {np.unique(truth)[:8].tolist()}"
            )
        return truth[:, None] == np.arange(n_classes), scores
    if truth.shape != scores.shape:
        raise UserError(
            f"{function}: truth {truth.shape} does not fit scores {scores.shape}: expected class indices "
            "(n_samples,) or a multi-hot array (n_samples, n_classes)"
        )
    if not np.isin(truth, (0, 1)).all():
        raise UserError(f"{function}: multi-label truth must be 0/1, found values {np.unique(truth)[:8].tolist()}")
    return truth, scores


def _defined(column: np.ndarray) -> bool:
    """Whether a 0/1 truth column holds both positives and negatives (AUROC and AP are defined)."""
    return 0 < column.sum() < len(column)


# ------------------------------------------------------------------------------------------ label metrics
def accuracy(truth, predicted) -> float:
    """The fraction of samples whose predicted class is the true one.

    Shapes: truth, predicted (n_samples,) → float.
    """
    truth, predicted = _labels_pair(truth, predicted, "accuracy")
    return float(np.mean(predicted == truth))


def per_class_recall(truth, predicted, labels: Sequence | None = None) -> np.ndarray:
    """Recall of each class: ``#{predicted = c, truth = c} / #{truth = c}``; NaN for a class absent from ``truth``.

    Args:
        labels: the classes, in output order; default the classes present in ``truth``, sorted.

    Shapes: truth, predicted (n_samples,) → (n_labels,) float64.
    """
    truth, predicted = _labels_pair(truth, predicted, "per_class_recall")
    labels = np.unique(truth) if labels is None else np.asarray(labels)
    recall = _sklearn_metrics().recall_score(truth, predicted, labels=labels, average=None, zero_division=np.nan)
    return np.asarray(recall, dtype=np.float64)


def balanced_accuracy(truth, predicted) -> float:
    """Mean recall over the classes present in ``truth`` (a class only predicted adds nothing).

    Shapes: truth, predicted (n_samples,) → float.
    """
    return float(np.mean(per_class_recall(truth, predicted)))


def per_class_f1(truth, predicted, labels: Sequence | None = None) -> np.ndarray:
    """F1 of each class, ``2·tp / (2·tp + fp + fn)``; 0 when ``tp + fp + fn = 0``.

    Args:
        labels: the classes, in output order; default the classes present in ``truth``, sorted.

    Shapes: truth, predicted (n_samples,) → (n_labels,) float64.
    """
    truth, predicted = _labels_pair(truth, predicted, "per_class_f1")
    labels = np.unique(truth) if labels is None else np.asarray(labels)
    f1 = _sklearn_metrics().f1_score(truth, predicted, labels=labels, average=None, zero_division=0)
    return np.asarray(f1, dtype=np.float64)


def macro_f1(truth, predicted, labels: Sequence | None = None) -> float:
    """Mean of `per_class_f1` over ``labels`` (default: the classes present in ``truth``).

    Shapes: truth, predicted (n_samples,) → float.
    """
    truth, predicted = _labels_pair(truth, predicted, "macro_f1")
    labels = np.unique(truth) if labels is None else np.asarray(labels)
    return float(_sklearn_metrics().f1_score(truth, predicted, labels=labels, average="macro", zero_division=0))


def cohen_kappa(truth, predicted) -> float:
    """Cohen's kappa ``(p_o − p_e) / (1 − p_e)``: agreement beyond chance (1 perfect, 0 chance level).

    ``p_o`` is the accuracy, ``p_e = Σ_c P(truth = c)·P(predicted = c)`` over the classes of either array.
    NaN when ``p_e = 1`` (truth and predicted are one and the same class everywhere).

    Shapes: truth, predicted (n_samples,) → float.
    """
    truth, predicted = _labels_pair(truth, predicted, "cohen_kappa")
    if len(np.union1d(truth, predicted)) == 1:
        return float("nan")
    return float(_sklearn_metrics().cohen_kappa_score(truth, predicted))


def classification_scores(truth, predicted) -> dict[str, float]:
    """``{"accuracy", "balanced_accuracy", "macro_f1"}``, the last two over the classes present in ``truth``.

    Shapes: truth, predicted (n_samples,) → dict of floats.
    """
    return {
        "accuracy": accuracy(truth, predicted),
        "balanced_accuracy": balanced_accuracy(truth, predicted),
        "macro_f1": macro_f1(truth, predicted),
    }


# ---------------------------------------------------------------------------------------- ranking metrics
def per_class_auroc(truth, scores) -> np.ndarray:
    """AUROC of each class's scores (one-vs-rest for multi-class truth); NaN where it is undefined.

    A class's AUROC is undefined when ``truth`` has no positive or no negative of it.

    Shapes: truth (n_samples,) class indices or (n_samples, n_classes) 0/1; scores (n_samples, n_classes)
    → (n_classes,) float64.
    """
    truth, scores = _indicator(truth, scores, "per_class_auroc")
    roc_auc_score = _sklearn_metrics().roc_auc_score
    return np.array(
        [roc_auc_score(truth[:, k], scores[:, k]) if _defined(truth[:, k]) else np.nan for k in range(truth.shape[1])]
    )


def per_class_average_precision(truth, scores) -> np.ndarray:
    """Average precision of each class's scores (one-vs-rest for multi-class truth); NaN where AUROC is undefined.

    Shapes: truth (n_samples,) class indices or (n_samples, n_classes) 0/1; scores (n_samples, n_classes)
    → (n_classes,) float64.
    """
    truth, scores = _indicator(truth, scores, "per_class_average_precision")
    average_precision_score = _sklearn_metrics().average_precision_score
    return np.array(
        [
            average_precision_score(truth[:, k], scores[:, k]) if _defined(truth[:, k]) else np.nan
            for k in range(truth.shape[1])
        ]
    )


def _macro(values: np.ndarray, name: str) -> float:
    defined = values[~np.isnan(values)]
    if not len(defined):
        raise UserError(
            f"no class has both positive and negative samples: {name} is undefined; evaluate on a split that "
            "holds both for at least one class"
        )
    return float(np.mean(defined))


def macro_auroc(truth, scores) -> float:
    """Mean `per_class_auroc` over the classes where it is defined.

    Shapes: truth (n_samples,) or (n_samples, n_classes); scores (n_samples, n_classes) → float.

    Raises:
        UserError: when no class has both positive and negative samples.
    """
    return _macro(per_class_auroc(truth, scores), "AUROC")


def macro_average_precision(truth, scores) -> float:
    """Mean `per_class_average_precision` over the classes where AUROC is defined.

    Shapes: truth (n_samples,) or (n_samples, n_classes); scores (n_samples, n_classes) → float.

    Raises:
        UserError: when no class has both positive and negative samples.
    """
    return _macro(per_class_average_precision(truth, scores), "average precision")


# -------------------------------------------------------------------------------- multi-label thresholds
def choose_thresholds(truth, probabilities) -> np.ndarray:
    """Per-class threshold maximising the F1 of ``probabilities >= t`` on (validation) ``truth``.

    Candidates are the class's distinct probabilities (and 0.5); ties go to the threshold closest to 0.5.
    A class without a positive sample keeps 0.5.

    Shapes:
        truth (n_samples, n_classes) 0/1, probabilities (n_samples, n_classes) → (n_classes,) float64
    """
    truth, probabilities = _indicator(truth, probabilities, "choose_thresholds")
    f1_score = _sklearn_metrics().f1_score
    thresholds = np.full(truth.shape[1], 0.5)
    for k in range(truth.shape[1]):
        if truth[:, k].sum() == 0:
            continue
        candidates = np.unique(np.concatenate([probabilities[:, k], [0.5]]))
        scores = [f1_score(truth[:, k], probabilities[:, k] >= t, zero_division=0) for t in candidates]
        best = max(scores)
        thresholds[k] = min((t for t, s in zip(candidates, scores) if s == best), key=lambda t: abs(t - 0.5))
    return thresholds


def multilabel_scores(truth, probabilities, thresholds, classes: Sequence[str]) -> dict[str, float]:
    """Macro AUROC / average precision (classes with positives and negatives) and macro F1 at ``thresholds``.

    Keys: ``macro_auroc``, ``macro_average_precision``, ``macro_f1`` (mean F1 over all classes, 0 for a class
    with no positive and none predicted), then per class ``auroc_<class>`` (where defined) and ``f1_<class>``,
    class names lower-cased.

    Shapes:
        truth (n_samples, n_classes) 0/1, probabilities (n_samples, n_classes), thresholds (n_classes,),
        classes (n_classes,) → dict of floats

    Raises:
        UserError: when no class has both positive and negative samples.
    """
    truth, probabilities = _indicator(truth, probabilities, "multilabel_scores")
    thresholds = np.asarray(thresholds)
    if thresholds.shape != (truth.shape[1],) or len(classes) != truth.shape[1]:
        raise UserError(
            f"multilabel_scores: expected {truth.shape[1]} thresholds and {truth.shape[1]} class names (one per "
            f"column of probabilities), got thresholds of shape {thresholds.shape} and {len(classes)} names"
        )
    f1_score = _sklearn_metrics().f1_score
    predicted = probabilities >= thresholds
    aurocs, precisions = per_class_auroc(truth, probabilities), per_class_average_precision(truth, probabilities)
    scores: dict[str, float] = {}
    for k, name in enumerate(classes):
        key = name.lower()
        if not np.isnan(aurocs[k]):
            scores[f"auroc_{key}"] = float(aurocs[k])
        scores[f"f1_{key}"] = float(f1_score(truth[:, k], predicted[:, k], zero_division=0))
    return {
        "macro_auroc": _macro(aurocs, "AUROC"),
        "macro_average_precision": _macro(precisions, "average precision"),
        "macro_f1": float(np.mean([scores[f"f1_{name.lower()}"] for name in classes])),
        **scores,
    }


#: The range of every score this module computes, by the end of its name (``balanced_accuracy``, ``f1_norm``,
#: ``closed_accuracy``, ``auroc_mi``): what a record read back may hold (`check_recorded`).
RANGES: dict[str, tuple[float, float]] = {
    "accuracy": (0.0, 1.0), "f1": (0.0, 1.0), "recall": (0.0, 1.0), "auroc": (0.0, 1.0),
    "average_precision": (0.0, 1.0), "kappa": (-1.0, 1.0),
}  # fmt: skip


def metric_range(name: str, lower_is_better: frozenset[str] | set[str] = frozenset()) -> tuple[float, float]:
    """The values metric ``name`` can take: `RANGES` for a score of this module (``f1_<class>``, ``<x>_accuracy``:
    matched by a word of its name), ``[0, inf]`` for an error (a name in the task's ``lower_is_better``), else any."""
    words = name.lower().split("_")
    for end, bounds in RANGES.items():
        if end in words or name.lower().endswith(end):
            return bounds
    return (0.0, float("inf")) if name in lower_is_better else (float("-inf"), float("inf"))


def check_recorded(path: object, field: str, metrics: object, lower_is_better: frozenset[str] | set[str] = frozenset()
                   ) -> None:  # fmt: skip
    """The metrics ``metrics`` read back from ``path`` (its ``field``) are numbers in their range (`metric_range`):
    NaN or null stands for a metric undefined on its data, +inf only for an error; nothing else passes.

    Raises:
        UserError: naming the file, the field and what was expected.
    """
    if not isinstance(metrics, dict):
        raise UserError(f"{path}: {field} is {type(metrics).__name__}, expected an object of metric -> number")
    for name, value in metrics.items():
        if value is None or (isinstance(value, float) and np.isnan(value)):
            continue
        low, high = metric_range(name, lower_is_better)
        finite = high < float("inf") or name not in lower_is_better
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high or (
            finite and not np.isfinite(value)
        ):  # fmt: skip
            expected = f"a number in [{low:g}, {high:g}]" if np.isfinite([low, high]).all() else (
                "a number >= 0 (an error)" if low == 0 else "a finite number")  # fmt: skip
            raise UserError(f"{path}: {field}.{name} is {value!r}, expected {expected}; the record was changed or "
                            "damaged after it was written")  # fmt: skip

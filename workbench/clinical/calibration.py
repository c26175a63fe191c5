"""Temperature scaling (Guo et al., ICML 2017) and the expected calibration error, from probabilities alone.

A classifier's probabilities give back its logits: ``log p`` (softmax; up to a per-row constant, which the softmax
ignores) and ``logit(p) = log p − log(1 − p)`` (sigmoid), so calibration applies after any task's scoring:

* softmax tasks (one label per item): one temperature ``T``, ``p_T = softmax(log p / T)``;
* multi-label tasks (independent sigmoids): one temperature per class, ``p_T,k = sigmoid(logit(p_k) / T_k)``.

``T`` minimises the negative log-likelihood of the validation labels; it is fitted as ``log T`` (so ``T > 0``) by
L-BFGS. ``T > 1`` softens over-confident probabilities; a monotone map per class, it changes no argmax and no
ranking (AUROC) and maps a threshold ``t`` to ``p_T(t)``.

The expected calibration error (ECE) uses `N_BINS` = 15 equal-width bins of [0, 1]: ``Σ_b (n_b / n) |acc_b −
conf_b|``. Softmax: the top class's probability against whether it is the true class. Multi-label: every (item,
class) probability against that label (the classes pooled).

Shapes:
    probabilities (n_items, n_classes); truth (n_items,) int64 class indices (softmax) or (n_items, n_classes)
    {0, 1} (multi-label); temperatures (1,) softmax or (n_classes,) multi-label.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

#: Equal-width bins of the expected calibration error.
N_BINS = 15
#: Probabilities are clipped to [EPS, 1 − EPS] before their logarithm (a CSV keeps 6 decimals).
EPS = 1e-6


def logits_of(probabilities: np.ndarray, multilabel: bool) -> np.ndarray:
    """The logits behind ``probabilities``: ``logit(p)`` (multi-label) or ``log p`` (softmax, up to a per-row
    constant). Shapes: (n, K) → (n, K) float64."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p) if multilabel else np.log(p)


def apply_temperature(probabilities: np.ndarray, temperatures: np.ndarray, multilabel: bool) -> np.ndarray:
    """``probabilities`` scaled by ``temperatures`` (see the module docstring). Shapes: (n, K) → (n, K)."""
    z = logits_of(probabilities, multilabel) / np.asarray(temperatures, dtype=np.float64)
    if multilabel:
        return 1.0 / (1.0 + np.exp(-z))
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def negative_log_likelihood(probabilities: np.ndarray, truth: np.ndarray, multilabel: bool) -> float:
    """Mean NLL of ``truth`` under ``probabilities`` (multi-label: mean over items and classes) [nats]."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), EPS, 1 - EPS)
    if multilabel:
        y = np.asarray(truth, dtype=np.float64)
        return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean())
    return float(-np.log(p[np.arange(len(p)), np.asarray(truth, dtype=np.int64)]).mean())


def fit_temperature(probabilities: np.ndarray, truth: np.ndarray, multilabel: bool) -> np.ndarray:
    """The temperatures that minimise the NLL of ``truth`` (L-BFGS on ``log T``, from ``T = 1``).

    Returns (1,) for softmax, (n_classes,) for multi-label: each class's own NLL (sigmoids are independent)."""
    logits = torch.as_tensor(logits_of(probabilities, multilabel))
    n_temperatures = logits.shape[1] if multilabel else 1
    log_t = torch.zeros(n_temperatures, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=200, tolerance_grad=1e-10, tolerance_change=1e-12,
                                  line_search_fn="strong_wolfe")  # fmt: skip
    if multilabel:
        y = torch.as_tensor(np.asarray(truth, dtype=np.float64))
    else:
        y = torch.as_tensor(np.asarray(truth, dtype=np.int64))

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        z = logits / torch.exp(log_t)
        if multilabel:  # a sum over classes of each class's mean: the gradient of T_k is class k's alone
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y, reduction="none").mean(dim=0).sum()
        else:
            loss = torch.nn.functional.cross_entropy(z, y)
        loss.backward()
        return loss

    optimizer.step(closure)
    return torch.exp(log_t).detach().numpy()


def expected_calibration_error(probabilities: np.ndarray, truth: np.ndarray, multilabel: bool,
                               n_bins: int = N_BINS) -> float:  # fmt: skip
    """ECE over ``n_bins`` equal-width bins (the module docstring says of what); in [0, 1]."""
    confidence, correct = _confidence(probabilities, truth, multilabel)
    bins = np.minimum((confidence * n_bins).astype(np.int64), n_bins - 1)  # p = 1 falls in the last bin
    total = 0.0
    for b in range(n_bins):
        inside = bins == b
        if inside.any():
            total += inside.sum() * abs(correct[inside].mean() - confidence[inside].mean())
    return float(total / len(confidence))


def _confidence(probabilities: np.ndarray, truth: np.ndarray, multilabel: bool) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, outcome in {0, 1}) pairs that the ECE and the reliability diagram bin."""
    p = np.asarray(probabilities, dtype=np.float64)
    if multilabel:
        return p.reshape(-1), np.asarray(truth, dtype=np.float64).reshape(-1)
    top = p.argmax(axis=1)
    return p.max(axis=1), (top == np.asarray(truth)).astype(np.float64)


def reliability_diagram(before: np.ndarray, after: np.ndarray, truth: np.ndarray, multilabel: bool, path: Path,
                        ece: tuple[float, float]) -> None:  # fmt: skip
    """Write a PNG: observed frequency against mean confidence per bin (`N_BINS`), before and after scaling."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4.8, 4.4))
    axis = figure.subplots()
    axis.plot([0, 1], [0, 1], color="0.6", ls="--", lw=1)
    for probabilities, label, value, marker in ((before, "before", ece[0], "o"), (after, "after", ece[1], "s")):
        confidence, correct = _confidence(probabilities, truth, multilabel)
        bins = np.minimum((confidence * N_BINS).astype(np.int64), N_BINS - 1)
        used = [b for b in range(N_BINS) if (bins == b).any()]
        axis.plot([confidence[bins == b].mean() for b in used], [correct[bins == b].mean() for b in used],
                  marker=marker, label=f"{label} (ECE {value:.3f})")  # fmt: skip
    axis.set_xlim(0, 1)
    axis.set_ylim(0, 1)
    axis.set_xlabel("mean confidence in bin" + (" (every class's p)" if multilabel else " (top class)"))
    axis.set_ylabel("observed frequency")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)

"""A shift alarm: does a batch of inputs look like the data the model was adapted on? An MMD two-sample test on
the model's own features, with a permutation p-value.

Features: what the model's head reads (a forward pre-hook on the module its `workbench.core.model.ModelSpec` names as
``head``; the last ``nn.Linear`` for a model that declares none), flattened per item: the penultimate layer.

Statistic: the (biased, V-statistic) squared maximum mean discrepancy between the reference features ``X`` (n, d)
and the batch's ``Y`` (m, d) under a Gaussian kernel ``k(a, b) = exp(−|a − b|² / (2 σ²))``, ``σ`` the median
pairwise distance of the pooled sample (the median heuristic; permutation-invariant, so the test stays exact):

    MMD² = mean k(X, X) + mean k(Y, Y) − 2 mean k(X, Y)

p-value: ``(1 + #{b : MMD²_b ≥ MMD²}) / (1 + B)`` over ``B`` random relabellings of the pooled sample into n
reference and m batch items: under "no shift" (exchangeable reference and batch) ``P(p ≤ a) ≤ a`` for every ``a``.
Verdict at `ALPHA`: "shift" when ``p ≤ ALPHA``, "no shift" otherwise, "too few" when the batch has fewer than
`MIN_ITEMS` items.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from workbench.core.model import spec_of

#: Level of the verdict.
ALPHA = 0.05
#: Fewest batch items the alarm gives a verdict on.
MIN_ITEMS = 3
#: Relabellings of the permutation p-value.
PERMUTATIONS = 500
#: Most reference feature vectors a run keeps.
MAX_REFERENCE = 500


def feature_module(model: nn.Module) -> nn.Module:
    """The module whose input is the model's penultimate features: its declared head, else its last Linear."""
    spec = spec_of(model)
    if spec is not None and spec.head:
        try:
            return model.get_submodule(spec.head)
        except AttributeError:
            pass
    linear = [module for module in model.modules() if isinstance(module, nn.Linear)]
    if not linear:
        raise ValueError(f"{type(model).__name__} has no declared head and no Linear layer to take features from")
    return linear[-1]


@contextmanager
def captured_features(model: nn.Module) -> Iterator[list[np.ndarray]]:
    """Collect, while the block runs, the input of `feature_module` at every forward call: a list of (batch, d)
    float32 arrays in call order (one row per item the model scored)."""
    found: list[np.ndarray] = []

    def hook(_module: nn.Module, inputs: tuple[Any, ...]) -> None:
        x = inputs[0]
        found.append(x.detach().float().reshape(x.shape[0], -1).cpu().numpy())

    handle = feature_module(model).register_forward_pre_hook(hook)
    try:
        yield found
    finally:
        handle.remove()


def _squared_distances(z: np.ndarray) -> np.ndarray:
    norms = (z * z).sum(axis=1)
    return np.maximum(norms[:, None] + norms[None, :] - 2 * z @ z.T, 0.0)


def mmd_test(reference: np.ndarray, batch: np.ndarray, permutations: int = PERMUTATIONS, seed: int = 0,
             alpha: float = ALPHA) -> dict[str, Any]:  # fmt: skip
    """The MMD permutation test of ``batch`` (m, d) against ``reference`` (n, d) (module docstring).

    Returns ``{"statistic": MMD², "p_value", "verdict", "bandwidth": σ, "reference": n, "batch": m}``.
    """
    x, y = np.asarray(reference, dtype=np.float64), np.asarray(batch, dtype=np.float64)
    n, m = len(x), len(y)
    if m < MIN_ITEMS or n < 2:
        return {"statistic": None, "p_value": None, "verdict": "too few", "bandwidth": None, "reference": n, "batch": m}
    z = np.concatenate([x, y])
    distances = _squared_distances(z)
    upper = distances[np.triu_indices(len(z), k=1)]
    median = float(np.median(upper[upper > 0])) if (upper > 0).any() else 1.0
    kernel = np.exp(-distances / (2 * median))  # σ² = the median squared distance: σ = the median distance
    rng = np.random.default_rng(seed)
    labels = np.zeros((permutations + 1, n + m))  # row 0: the observed split; 1 marks a batch item
    labels[0, n:] = 1
    for b in range(1, permutations + 1):
        labels[b, rng.permutation(n + m)[:m]] = 1
    kz = kernel @ labels.T  # (n + m, B + 1)
    row_sums = kernel.sum(axis=1)
    s_yy = np.einsum("ib,bi->b", kz, labels)
    s_xy = labels @ row_sums - s_yy  # Σ_{batch i, reference j} k
    s_xx = kernel.sum() - 2 * s_xy - s_yy
    statistics = s_xx / n**2 + s_yy / m**2 - 2 * s_xy / (n * m)
    observed = statistics[0]
    p_value = float((1 + np.sum(statistics[1:] >= observed - 1e-12)) / (1 + permutations))
    return {"statistic": float(observed), "p_value": p_value, "verdict": "shift" if p_value <= alpha else "no shift",
            "bandwidth": float(np.sqrt(median)), "reference": n, "batch": m}  # fmt: skip


def reference_sample(features: np.ndarray, seed: int, limit: int = MAX_REFERENCE) -> np.ndarray:
    """At most ``limit`` rows of ``features`` (n, d), drawn without replacement with ``seed`` (all when fewer)."""
    if len(features) <= limit:
        return np.asarray(features, dtype=np.float32)
    index = np.sort(np.random.default_rng(seed).permutation(len(features))[:limit])
    return np.asarray(features[index], dtype=np.float32)


def model_features(model: nn.Module, score: Any) -> tuple[Any, np.ndarray]:
    """``score()``'s result and the features of the items it scored (rows in call order, (n, d) float32)."""
    with torch.no_grad(), captured_features(model) as found:
        result = score()
    features = np.concatenate(found) if found else np.zeros((0, 0), np.float32)
    return result, features

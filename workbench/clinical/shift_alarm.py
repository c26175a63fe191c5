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

That null is "other items of the reference's patients": items cluster by patient, and the features fit the
training patients, so a batch of *new* patients from the same site is flagged far more often than ``ALPHA``
(`benchmarks/conformal_shift.py`). `patient_test` calibrates the same statistic on held-out patients instead.
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


def _kernel_means(z: np.ndarray, reference: np.ndarray, two_sigma2: float, chunk: int = 2048) -> np.ndarray:
    """Mean Gaussian kernel of each row of ``z`` (q, d) against ``reference`` (n, d): (q,)."""
    ref_norms = (reference * reference).sum(axis=1)
    out = np.empty(len(z))
    for start in range(0, len(z), chunk):
        part = z[start : start + chunk]
        d2 = np.maximum((part * part).sum(axis=1)[:, None] + ref_norms[None, :] - 2 * part @ reference.T, 0.0)
        out[start : start + chunk] = np.exp(-d2 / two_sigma2).mean(axis=1)
    return out


def _within_means(y: np.ndarray, two_sigma2: float) -> np.ndarray:
    """Mean Gaussian kernel over all ordered pairs (the diagonal included) of each batch in ``y`` (B, m, d): (B,)."""
    norms = (y * y).sum(axis=2)
    d2 = np.maximum(norms[:, :, None] + norms[:, None, :] - 2 * y @ y.transpose(0, 2, 1), 0.0)
    return np.exp(-d2 / two_sigma2).mean(axis=(1, 2))


def _subsets(sizes: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct positions in ``range(size)`` for each entry of ``sizes`` (any shape), uniformly drawn
    without replacement (where ``size < count`` the later positions run past ``size - 1``): shape ``(*sizes.shape,
    count)``. The j-th draw is uniform over the ``size - j`` positions not yet taken, found by stepping a uniform
    index over the taken ones in increasing order."""
    flat = sizes.reshape(-1).astype(np.int64)
    taken = np.empty((len(flat), count), np.int64)
    for j in range(count):
        position = (rng.random(len(flat)) * np.maximum(flat - j, 1)).astype(np.int64)
        for earlier in np.sort(taken[:, :j], axis=1).T:
            position += earlier <= position
        taken[:, j] = position
    return taken.reshape(*sizes.shape, count)


def patient_test(reference: np.ndarray, batch: np.ndarray, batch_groups: np.ndarray, pool: np.ndarray,
                 pool_groups: np.ndarray, *, draws: int = PERMUTATIONS, seed: int = 0,
                 alpha: float = ALPHA) -> dict[str, Any]:  # fmt: skip
    """The MMD² of ``batch`` against ``reference``, calibrated on pseudo-batches of held-out patients.

    Null: "the batch's patients are new patients of the source site, exchangeable with the pool's". The batch's own
    patients join the pool's in the draw (a permutation of patients between batch and pool, so the observed batch is
    one of the null's draws and a batch as large as the pool still meets a varied null). Each of ``draws``
    pseudo-batches copies the batch's group structure: as many distinct patients of pool and batch as the batch has
    groups (without replacement), and from each as many of its items as the batch's group holds (without
    replacement; with replacement only for a patient with fewer items). p-value: ``(1 + #{b : MMD²_b ≥ MMD²}) /
    (1 + draws)``.

    Why not `mmd_test`: its relabellings mix batch items with reference items, so its null is "more items of the
    reference's patients". Items cluster by patient and the features fit the training patients, so new patients
    alone look like a shift. Here the null items come from patients the reference never saw, with the batch's
    clustering, so the test asks "is this batch further from the reference than new patients are?". Where every
    patient gives the batch's number of items (one record each, say) the permutation is exact; otherwise the items
    drawn per patient follow the batch's counts, and the pool's own spread is what the null knows, so keep the pool
    large beside a batch's number of patients (`benchmarks/conformal_shift.py` measures the rates).

    Statistic: the V-statistic MMD² of `mmd_test` with a Gaussian kernel whose ``σ`` is the median pairwise
    distance of the reference alone (one kernel for the batch and every pseudo-batch; a pooled median would
    change with each pseudo-batch).

    Shapes: reference (n, d), batch (m, d), batch_groups (m,), pool (p, d), pool_groups (p,) (any hashable ids).

    Returns ``{"statistic", "p_value", "verdict", "bandwidth", "reference": n, "batch": m, "null": "held-out
    patients", "pool_patients", "item_draws": "without replacement" | "with replacement"}`` (with replacement for
    the slots whose patient has fewer items than the slot needs); verdict "too few"
    (statistic and p-value None) under `MIN_ITEMS` batch items, 2 reference items or 2 pool patients.

    Raises:
        ValueError: groups whose length differs from their features', or feature widths that differ.
    """
    x, y = np.asarray(reference, dtype=np.float64), np.asarray(batch, dtype=np.float64)
    z = np.asarray(pool, dtype=np.float64)
    y_groups, z_groups = np.asarray(batch_groups), np.asarray(pool_groups)
    if len(y_groups) != len(y) or len(z_groups) != len(z):
        raise ValueError(f"patient_test: batch_groups has {len(y_groups)} ids for {len(y)} batch items and "
                         f"pool_groups {len(z_groups)} for {len(z)} pool items: give one id per item")  # fmt: skip
    widths = {a.shape[1] for a in (x, y, z) if a.ndim == 2 and len(a)}
    if len(widths) > 1 or any(a.ndim != 2 for a in (x, y, z) if len(a)):
        raise ValueError(f"patient_test: reference {x.shape}, batch {y.shape} and pool {z.shape} must be (items, d) "
                         "with one d")  # fmt: skip
    n, m = len(x), len(y)
    pool_patients = len(np.unique(z_groups))
    result = {"statistic": None, "p_value": None, "verdict": "too few", "bandwidth": None, "reference": n, "batch": m,
              "null": "held-out patients", "pool_patients": pool_patients, "item_draws": None}  # fmt: skip
    if m < MIN_ITEMS or n < 2 or pool_patients < 2:
        return result
    z = np.concatenate([z, y])  # the batch's patients join the draw, their ids kept apart from the pool's
    ids = np.concatenate([np.char.add("pool:", z_groups.astype(str)), np.char.add("batch:", y_groups.astype(str))])
    patients, z_index = np.unique(ids, return_inverse=True)
    distances = _squared_distances(x)
    upper = distances[np.triu_indices(n, k=1)]
    median = float(np.median(upper[upper > 0])) if (upper > 0).any() else 1.0
    two_sigma2 = 2 * median  # σ² = the median squared distance, as in mmd_test
    xx = float(np.exp(-distances / two_sigma2).mean())
    counts = np.sort(np.unique(y_groups, return_counts=True)[1])[::-1]  # items per batch group, largest first
    items, short = _pseudo_batches(counts, z_index, len(patients), draws, np.random.default_rng(seed))
    used, inverse = np.unique(items, return_inverse=True)
    to_reference = _kernel_means(z[used], x, two_sigma2)[inverse.reshape(items.shape)]  # (B, m)
    null = xx + _within_means(z[items], two_sigma2) - 2 * to_reference.mean(axis=1)
    observed = xx + _within_means(y[None], two_sigma2)[0] - 2 * _kernel_means(y, x, two_sigma2).mean()
    p_value = float((1 + np.sum(null >= observed - 1e-12)) / (1 + draws))
    return {**result, "statistic": float(observed), "p_value": p_value,
            "verdict": "shift" if p_value <= alpha else "no shift", "bandwidth": float(np.sqrt(median)),
            "item_draws": "with replacement" if short else "without replacement"}  # fmt: skip


def _pseudo_batches(counts: np.ndarray, z_index: np.ndarray, patients: int, draws: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, bool]:  # fmt: skip
    """Rows of the pool for ``draws`` pseudo-batches with the batch's structure: ``counts`` (k,) items of each of its
    k groups (largest first), each slot filled from its own patient of the ``patients`` ≥ k (``z_index`` (p,): each
    pool row's patient). Returns (items (draws, sum(counts)) pool rows, items drawn with replacement for some slot)."""
    k = len(counts)
    chosen = np.argsort(rng.random((draws, patients)), axis=1)[:, :k]  # (B, k) distinct patients
    order = np.argsort(z_index, kind="stable")
    sizes = np.bincount(z_index, minlength=patients)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ranks = _subsets(sizes[chosen], int(counts[0]), rng)  # (B, k, largest group) positions within each patient
    short = counts[None, :, None] > sizes[chosen][:, :, None]  # a patient with fewer items: with replacement
    if short.any():
        fallback = (rng.random(ranks.shape) * sizes[chosen][:, :, None]).astype(np.int64)
        ranks = np.where(short, fallback, ranks)
    slots = np.concatenate([np.full(c, s) for s, c in enumerate(counts)])  # (m,) slot of each batch position
    within = np.concatenate([np.arange(c) for c in counts])
    return order[starts[chosen[:, slots]] + ranks[:, slots, within]], bool(short.any())


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

"""Partial domain adaptation problems with known outlier classes: Gaussian class clusters, shifted target.

The setting of WARMPOT (seed 000 of this project): the target holds only a subset of the source's classes
(the *target classes*); the other source classes are *outlier classes*, and a good partial-DA method puts
(almost) no source-loss weight on their samples. Everything below is drawn from one
``numpy.random.default_rng(seed)``, in this order:

* class means ``μ_k ~ N(0, σ² I_dim)``, ``σ = separation / √(2·dim)``, so ``E‖μ_k − μ_l‖² = separation²``;
* the target classes (a sorted random subset of size ``target_classes``, or the given list);
* the shift: a rotation ``R`` by ``rotation`` radians in a random 2-D plane (``R = I`` for 0) and a
  translation ``t`` of norm ``shift`` along a random direction;
* source: labels balanced over all ``n_classes`` (``n_source // n_classes`` per class, the first classes
  one more), shuffled; ``x = μ_y + noise · ε``;
* target: labels balanced over the target classes, shuffled; ``x = R (μ_y + noise · ε) + t``.

Ground truth: ``outlier_classes`` (the classes absent from the target), the labels of both sides, and the
shift itself (``rotation_matrix``, ``translation``: ``target_x = (μ_y + noise · ε) @ R.T + t``). Units:
features are in units of the within-class standard deviation when ``noise = 1``.

Example::

    >>> problem = make_partial_da(n_classes=10, target_classes=5, seed=0)
    >>> problem.source_x.shape, problem.target_x.shape, len(problem.outlier_classes)
    ((2000, 16), (1000, 16), 5)
    >>> bool(set(problem.target_y) & set(problem.outlier_classes))
    False
    >>> problem.shared_fraction
    0.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True, eq=False)
class PartialDAProblem:
    """One draw of a partial-DA problem (float64 features, int64 labels).

    Attributes:
        source_x, source_y: labelled source sample, every class present.
        target_x, target_y: target sample and its labels (the labels are for evaluation only).
        outlier_classes: sorted classes of the source that the target lacks (ground truth).
        target_classes: sorted classes the target holds (shared with the source).
        class_means: ``μ_k``, before the shift.
        rotation_matrix, translation: the target's shift ``x ↦ R x + t`` (orthogonal ``R``).

    Shapes:
        source_x ``(n_source, dim)``, source_y ``(n_source,)``; target_x ``(n_target, dim)``,
        target_y ``(n_target,)``; outlier_classes ``(n_outlier,)``; target_classes ``(n_target_classes,)``;
        class_means ``(n_classes, dim)``; rotation_matrix ``(dim, dim)``; translation ``(dim,)``.
    """

    source_x: np.ndarray
    source_y: np.ndarray
    target_x: np.ndarray
    target_y: np.ndarray
    outlier_classes: np.ndarray
    target_classes: np.ndarray
    class_means: np.ndarray
    rotation_matrix: np.ndarray
    translation: np.ndarray

    @property
    def source_is_outlier(self) -> np.ndarray:
        """True for source samples of outlier classes. Shapes: -> ``(n_source,)`` bool."""
        return np.isin(self.source_y, self.outlier_classes)

    @property
    def shared_fraction(self) -> float:
        """Fraction of the source samples whose class the target holds (the largest sensible OT mass)."""
        return float(1.0 - self.source_is_outlier.mean())


def _balanced_labels(n: int, classes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(classes[np.arange(n) % len(classes)]).astype(np.int64)


def _plane_rotation(dim: int, angle: float, rng: np.random.Generator) -> np.ndarray:
    """Rotation by ``angle`` radians in a random 2-D plane of ``R^dim`` (identity elsewhere)."""
    if angle == 0:
        return np.eye(dim)
    plane, _ = np.linalg.qr(rng.standard_normal((dim, 2)))
    u, v = plane[:, 0], plane[:, 1]
    cos, sin = math.cos(angle), math.sin(angle)
    return np.eye(dim) + (cos - 1) * (np.outer(u, u) + np.outer(v, v)) + sin * (np.outer(v, u) - np.outer(u, v))


def _chosen_classes(target_classes: int | Sequence[int], n_classes: int) -> np.ndarray | None:
    """The target's classes as an int64 array ``(n_target_classes,)`` when listed, None when only counted
    (then drawn later); a ValueError when out of range or repeated."""
    if isinstance(target_classes, (int, np.integer)):
        if not 1 <= target_classes <= n_classes:
            raise ValueError(f"target_classes must be between 1 and n_classes={n_classes}, got {target_classes}")
        return None
    chosen = np.asarray(target_classes, dtype=np.int64)
    if (
        chosen.ndim != 1
        or chosen.size == 0
        or len(np.unique(chosen)) != chosen.size
        or chosen.min() < 0
        or chosen.max() >= n_classes
    ):
        raise ValueError(
            f"target_classes must be distinct class indices in [0, {n_classes}), got {list(target_classes)}"
        )
    return chosen


def make_partial_da(
    n_classes: int = 10,
    target_classes: int | Sequence[int] = 5,
    n_source: int = 2000,
    n_target: int = 1000,
    dim: int = 16,
    separation: float = 8.0,
    noise: float = 1.0,
    shift: float = 2.0,
    rotation: float = 0.0,
    seed: int = 0,
) -> PartialDAProblem:
    """Draw a `PartialDAProblem` (see the module docstring); the same arguments give the same arrays.

    Args:
        n_classes: number of source classes (>= 2).
        target_classes: how many classes the target holds (a random subset, 1 to ``n_classes``), or
            which ones (distinct indices in ``[0, n_classes)``).
        n_source, n_target: sample sizes (at least one sample per class of their side).
        dim: feature dimension (>= 2 when ``rotation`` is not 0).
        separation: expected distance between two class means, in feature units (default 8).
        noise: within-class standard deviation per feature (default 1).
        shift: norm of the target's translation, in feature units (default 2).
        rotation: angle of the target's rotation about the origin, radians (default 0).
        seed: seed of the one ``numpy.random.default_rng`` that draws everything.
    """
    if n_classes < 2:
        raise ValueError(f"n_classes must be at least 2, got {n_classes}")
    chosen = _chosen_classes(target_classes, n_classes)
    n_target_classes = target_classes if chosen is None else chosen.size
    if n_source < n_classes:
        raise ValueError(f"n_source must be at least n_classes={n_classes} (one sample per class), got {n_source}")
    if n_target < n_target_classes:
        raise ValueError(f"n_target must be at least the number of target classes ({n_target_classes}), got {n_target}")
    if dim < 1 or (rotation != 0 and dim < 2):
        raise ValueError(f"dim must be at least 1 (at least 2 with a rotation), got {dim}")
    for name, value in (("separation", separation), ("shift", shift), ("noise", noise)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    if noise == 0:
        raise ValueError("noise must be > 0 (the within-class standard deviation)")

    rng = np.random.default_rng(seed)
    class_means = rng.standard_normal((n_classes, dim)) * (separation / math.sqrt(2 * dim))
    if chosen is None:
        chosen = rng.choice(n_classes, size=n_target_classes, replace=False)
    shared = np.sort(chosen).astype(np.int64)
    outliers = np.setdiff1d(np.arange(n_classes), shared).astype(np.int64)
    rotation_matrix = _plane_rotation(dim, rotation, rng)
    direction = rng.standard_normal(dim)
    translation = shift * direction / np.linalg.norm(direction)

    source_y = _balanced_labels(n_source, np.arange(n_classes), rng)
    source_x = class_means[source_y] + noise * rng.standard_normal((n_source, dim))
    target_y = _balanced_labels(n_target, shared, rng)
    target_x = (class_means[target_y] + noise * rng.standard_normal((n_target, dim))) @ rotation_matrix.T
    target_x += translation
    return PartialDAProblem(
        source_x=source_x,
        source_y=source_y,
        target_x=target_x,
        target_y=target_y,
        outlier_classes=outliers,
        target_classes=shared,
        class_means=class_means,
        rotation_matrix=rotation_matrix,
        translation=translation,
    )

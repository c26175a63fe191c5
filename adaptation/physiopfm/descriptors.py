"""Task descriptors for PhysioPFM: what a site's classes look like, as one vector per (sub-)task.

PhysioPFM conditions its weight generator on per-class *shapelets* found with perceptually important points
(PIPs; Chung et al. 2001, Fu et al. 2008), a fixed number per class, and reports that shapelets condition better
than whole series. The discovery procedure is not published; ours (*unverified*) is:

1. a class's prototype is the pointwise median of its (z-scored) series (robust to a few odd beats);
2. its PIPs: the two end points, then repeatedly the sample farthest (vertical distance) from the straight line
   through its two neighbouring PIPs, until ``n_points`` are chosen;
3. the shapelet is the piecewise-linear curve through the PIPs, read at ``length`` evenly spaced times.

A task's descriptor concatenates, class by class, ``[present, share, values...]``: present 1/0, the class's share
of the labelled series, and the shapelet (``kind="shapelet"``) or the whole prototype (``kind="raw"``, the
ablation); an absent class is all zeros.

Shapes:
    series (n, T); labels (n,) in 0..K−1; prototypes (K, T); descriptor (K · (2 + length)) or (K · (2 + T)) for raw
"""

from __future__ import annotations

import numpy as np

from workbench.core.errors import UserError

DESCRIPTOR_KINDS = ("shapelet", "raw")


def class_prototypes(series: np.ndarray, labels: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Each class's pointwise median series (K, T) float32 (zeros for an absent class) and its count (K,) int64."""
    series, labels = np.asarray(series, np.float64), np.asarray(labels)
    if series.ndim != 2 or len(series) != len(labels):
        raise UserError(f"descriptors need series (n, T) and n labels; got {series.shape} and {labels.shape}")
    if not np.isfinite(series).all():
        raise UserError("descriptors: the series hold NaN or infinite values")
    prototypes = np.zeros((n_classes, series.shape[1]), np.float32)
    counts = np.bincount(labels, minlength=n_classes)[:n_classes].astype(np.int64)
    for k in np.flatnonzero(counts):
        prototypes[k] = np.median(series[labels == k], axis=0)
    return prototypes, counts


def perceptually_important_points(y: np.ndarray, n_points: int) -> np.ndarray:
    """Indices (n_points,), increasing, of the PIPs of a series ``y`` (T,) by vertical distance."""
    y = np.asarray(y, np.float64)
    if n_points < 2:
        raise UserError(f"perceptually important points: n_points must be ≥ 2, got {n_points}")
    if len(y) < n_points:
        raise UserError(f"a series of {len(y)} samples is shorter than the {n_points} important points asked for")
    chosen = [0, len(y) - 1]
    t = np.arange(len(y))
    while len(chosen) < n_points:
        knots = np.sort(chosen)
        distance = np.abs(y - np.interp(t, knots, y[knots]))  # vertical distance to the line between neighbours
        distance[knots] = -1.0
        chosen.append(int(np.argmax(distance)))
    return np.sort(chosen)


def pip_shapelet(y: np.ndarray, n_points: int, length: int) -> np.ndarray:
    """The piecewise-linear curve through the PIPs of ``y`` (T,), read at ``length`` evenly spaced times."""
    y = np.asarray(y, np.float64)
    if len(y) < length:
        raise UserError(f"a series of {len(y)} samples is shorter than the shapelet length {length}")
    knots = perceptually_important_points(y, n_points)
    return np.interp(np.linspace(0, len(y) - 1, length), knots, y[knots]).astype(np.float32)


def task_descriptor(
    prototypes: np.ndarray, counts: np.ndarray, kind: str = "shapelet", n_points: int = 12, length: int = 32
) -> np.ndarray:
    """One task's descriptor (float32) from its class prototypes (K, T) and counts (K,) (see the module)."""
    if kind not in DESCRIPTOR_KINDS:
        raise UserError(f"descriptor kind {kind!r}: choose one of {DESCRIPTOR_KINDS}")
    prototypes, counts = np.asarray(prototypes), np.asarray(counts)
    share = counts / max(int(counts.sum()), 1)
    parts = []
    for k in range(len(prototypes)):
        values = prototypes[k] if kind == "raw" else pip_shapelet(prototypes[k], n_points, length)
        if counts[k] == 0:
            values = np.zeros_like(values)
        parts.append(np.concatenate([[float(counts[k] > 0), share[k]], values]))
    return np.concatenate(parts).astype(np.float32)

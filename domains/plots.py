"""Figures shared by the domains' reports. Each function draws on its own `matplotlib.figure.Figure` (no pyplot, no
global backend), saves a PNG into ``out_dir`` and returns (caption, file name) for ``report.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from workbench.task import Evaluation


def confusion_matrices(
    evaluations: Mapping[str, Evaluation], classes: Sequence[str], out_dir: Path, samples: str = "windows"
) -> tuple[str, str]:
    """One panel per method (and the model before adaptation): test windows counted by true (rows) and predicted
    (columns) class, each row shaded by its share of the true class; ``samples`` names what is counted.

    Shapes: each evaluation's ``truth``, ``predicted`` (n_samples,) class indices into ``classes``.
    """
    names = list(evaluations)
    n = len(classes)
    fig = Figure(figsize=(2.6 * len(names) + 0.6, 2.9 + 0.12 * n))
    axes = np.atleast_1d(fig.subplots(1, len(names)))
    for ax, name in zip(axes, names):
        p = evaluations[name].predictions
        counts = np.zeros((n, n), int)
        np.add.at(counts, (p["truth"].astype(int), p["predicted"].astype(int)), 1)
        shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
        ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
        for i in range(n):
            for j in range(n):
                ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if shares[i, j] > 0.6 else "black")  # fmt: skip
        ax.set_xticks(range(n), classes, fontsize=7, rotation=45 if n > 3 else 0)
        ax.set_yticks(range(n), classes, fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("predicted", fontsize=8)
    axes[0].set_ylabel("true", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "confusion_matrices.png", dpi=110)
    return (
        f"Confusion matrices on the test subjects' {samples} (counts; shading: share of the true class)",
        "confusion_matrices.png",
    )

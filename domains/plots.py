"""Figures shared by the domains' reports. Each function draws on its own `matplotlib.figure.Figure` (no pyplot, no
global backend), saves a PNG into ``out_dir`` and returns (caption, file name) for ``report.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from workbench.core.task import Evaluation

#: Panels per row of `confusion_matrices` and the side of one panel [in]: four panels at 110 dpi stay within 1,400 px.
PANELS_PER_ROW = 4
PANEL_IN = 3.0
DPI = 110


def confusion_matrices(
    evaluations: Mapping[str, Evaluation], classes: Sequence[str], out_dir: Path, samples: str = "windows"
) -> tuple[str, str]:
    """One panel per method (and the model before adaptation): test windows counted by true (rows) and predicted
    (columns) class, each row shaded by its share of the true class; ``samples`` names what is counted. Panels wrap
    into rows of `PANELS_PER_ROW`; the counts' font scales with the cell (its side and the longest count).

    Shapes: each evaluation's ``truth``, ``predicted`` (n_samples,) class indices into ``classes``.
    """
    names = list(evaluations)
    n = len(classes)
    counts = {}
    for name in names:
        p = evaluations[name].predictions
        counts[name] = np.zeros((n, n), int)
        np.add.at(counts[name], (p["truth"].astype(int), p["predicted"].astype(int)), 1)
    columns = min(len(names), PANELS_PER_ROW)
    rows = -(-len(names) // columns)
    fig = Figure(figsize=(PANEL_IN * columns, PANEL_IN * rows + 0.2))
    axes = np.atleast_2d(fig.subplots(rows, columns, squeeze=False))
    digits = max(len(str(c.max())) for c in counts.values())
    cell_pt = 0.62 * PANEL_IN * 72 / n  # the drawn matrix takes about 62 % of a panel's side
    fontsize = float(np.clip(min(0.34 * cell_pt, 1.5 * cell_pt / max(digits, 1)), 5, 12))
    label_size = float(np.clip(0.3 * cell_pt, 6, 10))
    for ax, name in zip(axes.flat, names):
        shares = counts[name] / np.maximum(counts[name].sum(axis=1, keepdims=True), 1)
        ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
        for i in range(n):
            for j in range(n):
                ax.text(j, i, str(counts[name][i, j]), ha="center", va="center", fontsize=fontsize,
                        color="white" if shares[i, j] > 0.6 else "black")  # fmt: skip
        ax.set_xticks(range(n), classes, fontsize=label_size, rotation=45 if n > 5 else 0)
        ax.set_yticks(range(n), classes, fontsize=label_size)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("predicted", fontsize=9)
    for row in axes:
        row[0].set_ylabel("true", fontsize=9)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(out_dir / "confusion_matrices.png", dpi=DPI)
    return (
        f"Confusion matrices on the test subjects' {samples} (counts; shading: share of the true class)",
        "confusion_matrices.png",
    )

"""Plots of the features task: confusion matrices (classes) and fitted values along the shift (regression)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
from matplotlib.figure import Figure

from workbench.core.task import Evaluation


def confusion_matrices(
    evaluations: Mapping[str, Evaluation], out_dir: Path, name: str = "confusion.png"
) -> tuple[str, str]:
    """One row-normalised confusion matrix per model: rows the target's classes, columns every source class.

    Columns of classes the target lacks show how much of the target a model sends to absent classes.
    """
    columns = len(evaluations)
    figure = Figure(figsize=(3.0 * columns, 3.2))
    axes = figure.subplots(1, columns, squeeze=False)
    for axis, (label, evaluation) in zip(axes[0], evaluations.items()):
        truth = evaluation.predictions["truth"]
        predicted = evaluation.predictions["probabilities"].argmax(-1)
        n_classes = evaluation.predictions["probabilities"].shape[1]
        rows = np.unique(truth)
        matrix = np.array([np.bincount(predicted[truth == c], minlength=n_classes) / (truth == c).sum() for c in rows])
        axis.imshow(matrix, vmin=0, vmax=1, cmap="Blues", aspect="auto")
        axis.set_yticks(range(len(rows)), [str(c) for c in rows], fontsize=7)
        axis.set_xticks(range(n_classes), [str(c) for c in range(n_classes)], fontsize=7)
        axis.set_xlabel("predicted class")
        axis.set_title(f"{label}\nacc {evaluation.metrics['accuracy']:.3f}", fontsize=9)
    axes[0][0].set_ylabel("true target class")
    figure.tight_layout()
    figure.savefig(Path(out_dir) / name, dpi=110)
    return "Confusion matrices on the target test split (rows: true class, normalised)", name


def regression_fits(evaluations: Mapping[str, Evaluation], out_dir: Path, name: str = "fits.png") -> tuple[str, str]:
    """Predicted vs true values on the target test split, every model in one panel."""
    figure = Figure(figsize=(5.0, 4.4))
    axis = figure.subplots()
    truth = next(iter(evaluations.values())).predictions["truth"]
    low, high = float(truth.min()), float(truth.max())
    axis.plot([low, high], [low, high], color="0.6", lw=1)
    for index, (label, evaluation) in enumerate(evaluations.items()):
        p = evaluation.predictions
        axis.scatter(
            p["truth"],
            p["predicted"],
            s=6,
            alpha=0.5,
            color=f"C{index}",
            label=f"{label} (MSE {evaluation.metrics['mse']:.3g})",
        )
    axis.set_xlabel("true value")
    axis.set_ylabel("predicted value")
    axis.legend(fontsize=7, markerscale=2)
    figure.tight_layout()
    figure.savefig(Path(out_dir) / name, dpi=110)
    return "Predicted vs true values on the target test split", name

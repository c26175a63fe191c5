"""Figures of the ``ptbxl`` report: ROC curves per class and confusion counts per class at the thresholds."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from workbench.core.task import Evaluation


def roc_curves(evaluations: Mapping[str, Evaluation], classes: Sequence[str], out_dir: Path) -> tuple[str, str]:
    """One panel per class: the test ROC curve of the model before adaptation and of each method."""
    from sklearn.metrics import roc_curve

    fig = Figure(figsize=(3.2 * len(classes), 3.4))
    axes = fig.subplots(1, len(classes), sharey=True)
    for k, (ax, name) in enumerate(zip(np.atleast_1d(axes), classes)):
        for method, evaluation in evaluations.items():
            truth, scores = evaluation.predictions["truth"][:, k], evaluation.predictions["probabilities"][:, k]
            if 0 < truth.sum() < len(truth):
                fpr, tpr, _ = roc_curve(truth, scores)
                ax.plot(fpr, tpr, label=method, lw=1.4, ls="--" if method == "before" else "-")
        ax.plot([0, 1], [0, 1], color="0.7", lw=0.8)
        ax.set_title(name)
        ax.set_xlabel("false positive rate")
    np.atleast_1d(axes)[0].set_ylabel("true positive rate")
    np.atleast_1d(axes)[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out_dir / "roc_curves.png", dpi=110)
    return "ROC curves per class on the test split (before adaptation: dashed)", "roc_curves.png"


def confusion_tables(evaluations: Mapping[str, Evaluation], out_dir: Path) -> tuple[str, str]:
    """A table (rows: models, columns: classes) of TP / FP / FN / TN at each model's validation thresholds."""
    names = list(evaluations)
    first = evaluations[names[0]].predictions
    n_classes = first["truth"].shape[1]
    from workbench.domains.ecg.readers import SUPERCLASSES

    classes = SUPERCLASSES if n_classes == len(SUPERCLASSES) else [str(k) for k in range(n_classes)]
    cells = []
    for name in names:
        p = evaluations[name].predictions
        predicted = p["probabilities"] >= p["thresholds"]
        truth = p["truth"] > 0.5
        row = []
        for k in range(n_classes):
            tp = int(np.sum(predicted[:, k] & truth[:, k]))
            fp = int(np.sum(predicted[:, k] & ~truth[:, k]))
            fn = int(np.sum(~predicted[:, k] & truth[:, k]))
            tn = int(np.sum(~predicted[:, k] & ~truth[:, k]))
            row.append(f"TP {tp}  FP {fp}\nFN {fn}  TN {tn}\nt = {p['thresholds'][k]:.2f}")
        cells.append(row)
    fig = Figure(figsize=(2.0 * n_classes + 1.5, 0.75 * len(names) + 0.8))
    ax = fig.subplots()
    ax.axis("off")
    table = ax.table(cellText=cells, rowLabels=names, colLabels=list(classes), loc="center", cellLoc="center")
    table.scale(1, 3.2)
    table.set_fontsize(8)
    fig.tight_layout()
    fig.savefig(out_dir / "confusion_tables.png", dpi=110)
    return (
        "Confusion counts per class on the test split at the thresholds chosen on validation (t)",
        "confusion_tables.png",
    )

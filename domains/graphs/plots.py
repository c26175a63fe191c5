"""Plots of the csbm task: target and source accuracy of every model side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
from matplotlib.figure import Figure

from workbench.core.task import Evaluation


def accuracy_bars(
    evaluations: Mapping[str, Evaluation],
    out_dir: Path,
    target_homophily: float | None = None,
    name: str = "accuracy.png",
) -> tuple[str, str]:
    """Grouped bars: target accuracy, source (held-out) accuracy, and the target's edge homophily under each
    model's predicted labels, beside the true one (dashed) when ``target_homophily`` is given."""
    labels = list(evaluations)
    target = [evaluations[k].metrics["accuracy"] for k in labels]
    source = [evaluations[k].metrics["source_accuracy"] for k in labels]
    predicted_h = [evaluations[k].metrics.get("predicted_target_homophily", np.nan) for k in labels]
    x = np.arange(len(labels))
    figure = Figure(figsize=(1.3 * len(labels) + 2.5, 3.8))
    axis = figure.subplots()
    axis.bar(x - 0.27, target, 0.27, label="target accuracy", color="C0")
    axis.bar(x, source, 0.27, label="source accuracy (held-out nodes)", color="C7")
    axis.bar(x + 0.27, predicted_h, 0.27, label="target edge homophily of predicted labels", color="C2", alpha=0.6)
    if target_homophily is not None:
        axis.axhline(
            target_homophily, color="C2", ls="--", lw=1, label=f"true target edge homophily {target_homophily:.2f}"
        )
    axis.set_xticks(x, labels, rotation=20, fontsize=8)
    axis.set_ylim(0, 1.3)
    axis.set_yticks(np.linspace(0, 1, 6))
    axis.legend(fontsize=7, loc="upper center", ncol=2, frameon=False)
    figure.tight_layout()
    figure.savefig(Path(out_dir) / name, dpi=110)
    return "Target vs source accuracy per model (and the homophily their target predictions imply)", name

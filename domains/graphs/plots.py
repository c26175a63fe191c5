"""Plots of the csbm task: target and source accuracy of every model side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from workbench.task import Evaluation  # noqa: E402


def accuracy_bars(evaluations: Mapping[str, Evaluation], out_dir: Path, name: str = "accuracy.png") -> tuple[str, str]:
    """Grouped bars: target accuracy, source (held-out) accuracy, and the edge homophily the model predicts."""
    labels = list(evaluations)
    target = [evaluations[k].metrics["accuracy"] for k in labels]
    source = [evaluations[k].metrics["source_accuracy"] for k in labels]
    predicted_h = [evaluations[k].metrics.get("predicted_target_homophily", np.nan) for k in labels]
    x = np.arange(len(labels))
    figure, axis = plt.subplots(figsize=(1.3 * len(labels) + 2.5, 3.8))
    axis.bar(x - 0.27, target, 0.27, label="target accuracy", color="C0")
    axis.bar(x, source, 0.27, label="source accuracy (held-out nodes)", color="C7")
    axis.bar(x + 0.27, predicted_h, 0.27, label="target edge homophily of predicted labels", color="C2", alpha=0.6)
    axis.set_xticks(x, labels, rotation=20, fontsize=8)
    axis.set_ylim(0, 1.05)
    axis.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(Path(out_dir) / name, dpi=110)
    plt.close(figure)
    return "Target vs source accuracy per model (and the homophily their target predictions imply)", name

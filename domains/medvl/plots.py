"""Figures of the medvl reports: each method's scores side by side, and its generated images beside the inputs and
targets.

Every function draws on its own `matplotlib.figure.Figure` (no pyplot), saves a PNG into ``out_dir`` and returns
the file name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
from matplotlib.figure import Figure

from workbench.core.task import Evaluation

#: The scores drawn as bars, with their labels (all in [0, 1], higher is better).
SCORES = {
    "closed_accuracy": "closed VQA\naccuracy",
    "open_recall": "open VQA\nrecall",
    "report_f1": "report\nfindings F1",
    "ssim_reconstruct": "SSIM\nreconstruct",
    "ssim_super_resolution": "SSIM\nsuper-res.",
    "ssim_modality_conversion": "SSIM\nCT→MR",
}


def scores_by_method(evaluations: Mapping[str, Evaluation], out_dir: Path) -> str:
    """Grouped bars: one group per score present, one bar per method (``before``: the model before adaptation)."""
    names = list(evaluations)
    keys = [k for k in SCORES if any(k in evaluations[n].metrics for n in names)]
    fig = Figure(figsize=(max(6.0, 1.3 * len(keys) + 2), 3.4))
    ax = fig.subplots()
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        values = [evaluations[name].metrics.get(k, np.nan) for k in keys]
        ax.bar(np.arange(len(keys)) + (j - (len(names) - 1) / 2) * width, values, width, label=name)
    ax.set_xticks(range(len(keys)), [SCORES[k] for k in keys], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("score (higher is better)")
    ax.legend(fontsize=7, ncol=min(4, len(names)), loc="upper center", bbox_to_anchor=(0.5, -0.28))
    fig.tight_layout()
    fig.savefig(out_dir / "scores.png", dpi=110)
    return "scores.png"


def generated_images(evaluations: Mapping[str, Evaluation], out_dir: Path, examples: int = 2) -> str | None:
    """Per generation sub-task, ``examples`` test records: the input and target slices, then each method's output,
    grey on [0, 1], one image pixel per drawn pixel block (no smoothing), each output titled with its SSIM to the
    target; the title gives the image tokenizer's own SSIM (``ssim_vq_ceiling``), the best any output can reach.

    Shapes: predictions ``input_<task>``, ``target_<task>``, ``generated_<task>`` (n, 1, S, S), ``ssim_each_<task>``
    (n_all,) whose first n belong to those images.
    """
    methods = list(evaluations)
    first = evaluations[methods[0]].predictions
    tasks = [key.removeprefix("target_") for key in first if key.startswith("target_")]
    if not tasks:
        return None
    columns = ["input", "target"] + methods
    rows = [(task, i) for task in tasks for i in range(min(examples, len(first[f"target_{task}"])))]
    fig = Figure(figsize=(1.45 * len(columns), 1.55 * len(rows) + 0.5))
    axes = np.atleast_2d(fig.subplots(len(rows), len(columns)))
    for r, (task, i) in enumerate(rows):
        pictures = [first[f"input_{task}"][i], first[f"target_{task}"][i]]
        pictures += [evaluations[m].predictions[f"generated_{task}"][i] for m in methods]
        for c, picture in enumerate(pictures):
            ax = axes[r, c]
            ax.imshow(np.asarray(picture)[0], cmap="gray", vmin=0, vmax=1, interpolation="nearest", aspect="equal")
            ax.set_xticks([])
            ax.set_yticks([])
            title = columns[c] if r == 0 else ""
            if c >= 2 and f"ssim_each_{task}" in evaluations[columns[c]].predictions:
                ssim = float(evaluations[columns[c]].predictions[f"ssim_each_{task}"][i])
                title = f"{title}\nSSIM {ssim:.2f}".lstrip("\n")
            ax.set_title(title, fontsize=7)
            if c == 0:
                ax.set_ylabel(task.replace("_", " "), fontsize=7)
    ceiling = evaluations[methods[0]].metrics.get("ssim_vq_ceiling")
    if ceiling is not None:
        fig.suptitle(f"outputs are decoded image tokens: the tokenizer alone reaches SSIM {ceiling:.2f}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "generated.png", dpi=110)
    return "generated.png"

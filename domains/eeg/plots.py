"""Figures of the EEG reports: true vs predicted hypnograms (sleep); the confusion matrices are shared
(`workbench.domains.plots`).

Every function draws on its own `matplotlib.figure.Figure` (no pyplot, no global backend), saves a PNG into
``out_dir`` and returns (caption, file name) for ``report.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from workbench.core.task import Evaluation


def hypnograms(evaluations: Mapping[str, Evaluation], classes: Sequence[str], out_dir: Path) -> tuple[str, str]:
    """The first test subject's night: the scored hypnogram, then each method's predicted stages, one row each,
    against time [h] from the first scored epoch. Stages are drawn top to bottom W, REM, N1, N2, N3 (the usual
    hypnogram order) when those are the classes.

    Shapes: each evaluation's ``truth``, ``predicted``, ``subject_index``, ``onsets_s`` (n_windows,).
    """
    order = [c for c in ("W", "REM", "N1", "N2", "N3") if c in classes] or list(classes)
    level = {classes.index(name): len(order) - 1 - k for k, name in enumerate(order)}
    methods = [name for name in evaluations if name != "before"] or list(evaluations)
    first = evaluations[methods[0]].predictions
    mine = np.flatnonzero(first["subject_index"] == 0)
    mine = mine[np.argsort(first["onsets_s"][mine])]
    hours = (first["onsets_s"][mine] - first["onsets_s"][mine].min()) / 3600.0
    rows = [("scored", first["truth"][mine])] + [(name, evaluations[name].predictions["predicted"][mine])
                                                  for name in methods]  # fmt: skip
    fig = Figure(figsize=(8.0, 1.05 * len(rows) + 0.6))
    axes = np.atleast_1d(fig.subplots(len(rows), 1, sharex=True))
    for ax, (name, stages) in zip(axes, rows):
        ax.step(hours, [level[int(k)] for k in stages], where="post", lw=1.2, color="k" if name == "scored" else "C0")
        ax.set_yticks(range(len(order)), order[::-1], fontsize=6)
        ax.set_ylim(-0.5, len(order) - 0.5)
        ax.set_ylabel(name, fontsize=7, rotation=0, ha="right", va="center")
    axes[-1].set_xlabel("time from the first scored epoch [h]")
    fig.tight_layout()
    fig.savefig(out_dir / "hypnograms.png", dpi=110)
    return "Hypnogram of one test subject: scored (top) and predicted by each method", "hypnograms.png"

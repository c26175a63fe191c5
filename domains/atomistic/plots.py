"""Parity plots of energies and forces, the picture computational chemists check first."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from matplotlib.figure import Figure

from workbench.core.task import Evaluation


def parity(evaluations: Mapping[str, Evaluation], out_dir: Path, name: str = "parity.png") -> tuple[str, str]:
    """One column per model: energy (relative to the mean reference, meV) and force components (eV/Å)."""
    columns = len(evaluations)
    figure = Figure(figsize=(3.2 * columns, 6.4))
    axes = figure.subplots(2, columns, squeeze=False)
    for column, (label, evaluation) in enumerate(evaluations.items()):
        p, m = evaluation.predictions, evaluation.metrics
        offset = p["energy_ref_ev"].mean()
        pairs = [
            (
                (p["energy_ref_ev"] - offset) * 1000,
                (p["energy_pred_ev"] - offset) * 1000,
                "energy − mean [meV]",
                f"MAE {m['energy_mae_mev']:.1f} meV",
            ),
            (
                p["forces_ref_ev_per_a"].ravel(),
                p["forces_pred_ev_per_a"].ravel(),
                "force component [eV/Å]",
                f"MAE {m['forces_mae_mev_per_a']:.0f} meV/Å",
            ),
        ]
        for row, (ref, pred, quantity, text) in enumerate(pairs):
            axis = axes[row, column]
            low, high = min(ref.min(), pred.min()), max(ref.max(), pred.max())
            axis.plot([low, high], [low, high], color="0.6", lw=0.8)
            axis.scatter(ref, pred, s=3, alpha=0.5, rasterized=True)
            axis.set_title(f"{label}\n{text}" if row == 0 else text, fontsize=9)
            axis.set_xlabel(f"reference {quantity}", fontsize=8)
            if column == 0:
                axis.set_ylabel(f"predicted {quantity}", fontsize=8)
            axis.tick_params(labelsize=7)
    figure.tight_layout()
    figure.savefig(Path(out_dir) / name, dpi=110)
    return "Parity of energies and forces on the test split, per model", name

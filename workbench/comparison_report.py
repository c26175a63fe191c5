"""What a comparison says (`workbench.comparison`): per method mean ± sd of every metric, the paired difference to the
reference over the (fold, seed) cells with a 95 % bootstrap interval and a Wilcoxon signed-rank p-value, costs, a
forest plot, and claims checked against the intervals.

The interval is a percentile bootstrap of the mean paired difference (10,000 draws, seeded). With at least
`MIN_SEEDS_FOR_CLUSTERS` seeds it resamples whole seeds (each drawn seed brings all its folds): folds of one seed
share training data (and, for generated problems, the problem itself), so they are not independent, and resampling
cells would make the interval too narrow (Bengio & Grandvalet, 2004). With fewer seeds it resamples cells and says
so. A difference whose interval holds 0 is reported as noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from workbench.checkpoint import write_text

#: Percentile-bootstrap draws of a paired interval.
BOOTSTRAP_DRAWS = 10_000
#: Metrics the forest plot shows (the first of the task's).
FOREST_METRICS = 3
#: A difference is shown when its 95 % interval excludes the bound and the signed-rank test agrees at this level.
SIGNIFICANCE = 0.05
#: Fewest seeds for an interval that resamples seeds rather than cells.
MIN_SEEDS_FOR_CLUSTERS = 5
#: Fewest paired cells for a verdict: below it a percentile bootstrap is too narrow and the signed-rank test cannot
#: reach p < 0.05 (its smallest p with n cells is 2 / 2**n).
MIN_CELLS_FOR_VERDICT = 6


def paired_interval(
    differences: Sequence[float], clusters: Sequence[Any] | None = None, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``differences``: whole ``clusters`` (each cell's seed) resampled
    with replacement when there are at least `MIN_SEEDS_FOR_CLUSTERS` of them, else single cells."""
    values = np.asarray(differences, dtype=float)
    if len(values) < 2:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    labels = np.asarray(clusters if clusters is not None else np.arange(len(values)))
    names = np.unique(labels)
    if len(names) >= MIN_SEEDS_FOR_CLUSTERS:
        sums = np.array([values[labels == name].sum() for name in names])
        counts = np.array([(labels == name).sum() for name in names])
        draws = rng.integers(0, len(names), size=(BOOTSTRAP_DRAWS, len(names)))
        means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    else:
        means = values[rng.integers(0, len(values), size=(BOOTSTRAP_DRAWS, len(values)))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def resampled(seeds: Sequence[Any]) -> str:
    """What `paired_interval` resamples for cells of these seeds: "seeds" or "cells"."""
    return "seeds" if len(set(seeds)) >= MIN_SEEDS_FOR_CLUSTERS else "cells"


def signed_rank_p(differences: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of ``differences`` (scipy; 1.0 when every difference is 0, nan with
    fewer than two cells). With n cells the smallest possible p is 2 / 2**n (0.0625 for 5)."""
    from scipy.stats import wilcoxon

    values = np.asarray(differences, dtype=float)
    if len(values) < 2:
        return float("nan")
    if np.all(values == 0):
        return 1.0
    return float(wilcoxon(values).pvalue)


def summarise(spec: Any, facts: Mapping[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """``comparison.json``: the spec, the groups, every cell, and per method its metrics, paired differences to
    the reference and costs."""
    metrics = [name for name in facts["metrics"] if all(name in r["metrics"] for r in records)]
    lower = set(facts["lower_is_better"])
    by_method = {name: [r for r in records if r["method"] == name] for name in spec.methods}
    reference = {(r["fold"], r["seed"]): r for r in by_method[spec.reference]}
    summary = {}
    for name, cells in by_method.items():
        summary[name] = {"cells": len(cells), "metrics": {}, "costs": _costs(cells)}
        for metric in metrics:
            values = [r["metrics"][metric] for r in cells]
            entry = {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}
            if name != spec.reference:
                entry["vs_reference"] = _paired(cells, reference, metric, metric in lower)
            summary[name]["metrics"][metric] = entry
    return {
        "spec": spec.to_dict(),
        "development_seeds": spec.development,
        **dict(facts),
        "metrics": metrics,
        "budget_note": _budget_note(spec, records) + _schedule_note(spec),
        "summary": summary,
        "cells": records,
    }


def _paired(cells: list[dict], reference: dict, metric: str, lower_better: bool) -> dict[str, Any]:
    """The paired difference (method − reference) of ``metric`` over the cells both have."""
    differences = [r["metrics"][metric] - reference[(r["fold"], r["seed"])]["metrics"][metric] for r in cells]
    seeds = [r["seed"] for r in cells]
    low, high = paired_interval(differences, seeds)
    sign = -1 if lower_better else 1
    better_low, better_high = sorted((sign * low, sign * high))  # the interval in the better direction
    p = signed_rank_p(differences)
    if len(differences) < MIN_CELLS_FOR_VERDICT:
        verdict = f"too few cells for a verdict (< {MIN_CELLS_FOR_VERDICT})"
    elif math.isnan(low) or better_low <= 0 <= better_high or not p < SIGNIFICANCE:
        verdict = "no difference shown"
    else:
        verdict = "better" if better_low > 0 else "worse"
    return {
        "mean": float(np.mean(differences)),
        "interval": [low, high],
        "wilcoxon_p": p,
        "wins": int(sum(sign * d > 0 for d in differences)),
        "cells": len(differences),
        "resampled": resampled(seeds),
        "verdict": verdict,
    }


def _costs(cells: list[dict]) -> dict[str, Any]:
    """Median trainable parameters and mean steps, epochs, training seconds and peak memory of a method's cells."""

    def mean(key: str) -> float | None:
        values = [r[key] for r in cells if r.get(key) is not None]
        return float(np.mean(values)) if values else None

    parameters = [r["trainable_parameters"] for r in cells if r.get("trainable_parameters") is not None]
    return {
        "trainable_parameters": int(np.median(parameters)) if parameters else None,
        "steps": mean("steps"),
        "epochs": mean("epochs"),
        "train_seconds": mean("train_seconds"),
        "peak_memory_bytes": mean("peak_memory_bytes"),
        "training_step_bytes": mean("training_step_bytes"),
        "test_samples": mean("test_samples"),
        "learning_rates": sorted({r["learning_rate"] for r in cells if r.get("learning_rate") is not None}),
    }


def _budget_note(spec: Any, records: list[dict]) -> str:
    """Whether every method took the same optimizer steps in each cell (``steps`` budget), else which did not."""
    if spec.budget != "steps":
        patience = f"{spec.patience} epochs" if spec.patience else "the task's early-stopping patience"
        return f"each method trained until its validation objective had not improved for {patience}"
    steps: dict[tuple[int, int], dict[str, int]] = {}
    for r in records:
        steps.setdefault((r["fold"], r["seed"]), {})[r["method"]] = r["steps"]
    unequal = {m for cell in steps.values() for m, n in cell.items() if n != max(cell.values())}
    if not unequal:
        return "every method took the same optimizer steps in every cell"
    return (
        "unequal optimizer steps: " + ", ".join(sorted(unequal)) + " took fewer than the most in some cells (methods "
        "with several stages, or that do not train by gradient steps; see the steps column)"
    )


def _schedule_note(spec: Any) -> str:
    """The schedule and selection every method trained under, when not the default (plateau, validation loss)."""
    parts = []
    if spec.schedule == "linear":
        parts.append(f"learning rate warmed up linearly over {spec.warmup_share:.0%} of the steps, then decayed "
                     "linearly to 0")  # fmt: skip
    if spec.select_on != "loss":
        parts.append(f"the epoch (and early stopping) chosen on validation {spec.select_on}")
    return "".join(f"; {part}" for part in parts)


# -- claims ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    """A claim a benchmark tests: ``method`` against ``against`` (default: the reference) on ``metric``, paired over
    the cells both have.

    ``kind`` "better": the 95 % interval of the difference lies beyond ``margin`` in the metric's better direction;
    "not_worse": it lies above ``-margin`` (non-inferiority within ``margin``). ``direction`` "higher" / "lower"
    names the better direction of a metric the task does not list (a diagnostic such as a weight share).
    """

    method: str
    metric: str
    kind: str = "better"
    margin: float = 0.0
    against: str = ""
    direction: str = ""
    text: str = ""

    def verdict(self, comparison: Mapping[str, Any]) -> dict[str, Any]:
        """``{"holds": bool, "line": "holds: ..." / "does not hold: ...", "difference", "interval", "cells"}``."""
        against = self.against or comparison["spec"]["reference"]
        theirs = {(c["fold"], c["seed"]): c["metrics"] for c in comparison["cells"] if c["method"] == against}
        mine = [c for c in comparison["cells"] if c["method"] == self.method and (c["fold"], c["seed"]) in theirs]
        differences = [c["metrics"][self.metric] - theirs[(c["fold"], c["seed"])][self.metric] for c in mine]
        interval = paired_interval(differences, [c["seed"] for c in mine])
        lower = self.direction == "lower" or (not self.direction and self.metric in comparison["lower_is_better"])
        sign = -1 if lower else 1
        low = min(sign * interval[0], sign * interval[1])  # the interval's bound nearest "worse"
        enough = len(differences) >= MIN_CELLS_FOR_VERDICT
        bound_value = self.margin if self.kind == "better" else -self.margin
        p = signed_rank_p([sign * d - bound_value for d in differences])  # the test of "beyond the bound"
        holds = enough and low > bound_value and p < SIGNIFICANCE
        bound = f"{bound_value:+g}"
        mean = float(np.mean(differences)) if differences else float("nan")
        line = (
            f"{'holds' if holds else 'does not hold'}: {self.method} − {against} on {self.metric} {mean:+.3f} "
            f"[{interval[0]:+.3f}, {interval[1]:+.3f}] over {len(differences)} cells "
            f"({'resampling seeds' if resampled([c['seed'] for c in mine]) == 'seeds' else 'resampling cells'}), "
            f"signed-rank p={p:.2g} (holds when the interval clears {bound} towards {'lower' if lower else 'higher'} "
            f"and p < {SIGNIFICANCE:g})"
            + ("" if enough else f"; too few cells for a verdict (< {MIN_CELLS_FOR_VERDICT})")
        )
        return {"holds": bool(holds), "line": line, "difference": mean, "interval": list(interval),
                "cells": len(differences)}  # fmt: skip


# -- writing -------------------------------------------------------------------------------------------------------
def _cell(entry: Mapping[str, Any]) -> str:
    return f"{entry['mean']:.3f} ± {entry['sd']:.3f}"


def _difference(entry: Mapping[str, Any]) -> str:
    paired = entry.get("vs_reference")
    if paired is None:
        return "reference"
    low, high = paired["interval"]
    return f"{paired['mean']:+.3f} [{low:+.3f}, {high:+.3f}] p={paired['wilcoxon_p']:.3g} ({paired['verdict']})"


def table(comparison: Mapping[str, Any], metrics: Sequence[str] | None = None) -> str:
    """The markdown table of a comparison: per method mean ± sd, paired difference with interval, costs (step MiB:
    the tensors one training step allocates, `workbench.memory`; the process's peak is in the cells)."""
    metrics = list(metrics or comparison["metrics"][:2])
    headline = metrics[0]
    head = ["method", "cells", *(f"{m} (mean ± sd)" for m in metrics), f"Δ {headline} vs reference [95 % CI]",
            "trainable params", "steps", "train s", "step MiB"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, entry in comparison["summary"].items():
        costs = entry["costs"]
        memory = costs.get("training_step_bytes")
        row = [
            name,
            str(entry["cells"]),
            *(_cell(entry["metrics"][m]) for m in metrics),
            _difference(entry["metrics"][headline]),
            f"{costs['trainable_parameters']:,}" if costs["trainable_parameters"] is not None else "–",
            f"{costs['steps']:.0f}" if costs["steps"] is not None else "–",
            f"{costs['train_seconds']:.1f}" if costs["train_seconds"] is not None else "–",
            f"{memory / 2**20:.1f}" if memory else "–",
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def console_table(comparison: Mapping[str, Any]) -> str:
    """The headline metric per method, for the terminal."""
    headline = comparison["metrics"][0]
    lines = [f"{'method':16}{headline + ' (mean ± sd)':>28}  Δ vs {comparison['spec']['reference']} [95 % CI]"]
    for name, entry in comparison["summary"].items():
        metric = entry["metrics"][headline]
        lines.append(f"{name:16}{_cell(metric):>28}  {_difference(metric)}")
    return "\n".join(lines)


def write(comparison: Mapping[str, Any], out: Path) -> None:
    """``report.md`` and ``forest.png`` in ``out``."""
    spec = comparison["spec"]
    forest = forest_plot(comparison, out / "forest.png")
    seeds = ", ".join(str(seed) for seed in spec["seeds"])
    lines = [
        f"# Comparison on {spec['domain']}: {', '.join(spec['methods'])}",
        "",
        f"- Cells: {spec['folds']} grouped folds × seeds {seeds} (groups: {comparison['group_kind']}, "
        f"{', '.join(str(n) for n in sorted(set(comparison['groups_per_seed'].values())))} per seed; each tested "
        "once per seed); every method on the same cells.",
        f"- Budget: {spec['budget']} — {comparison['budget_note']}.",
        f"- Learning rate: {_rate_text(spec, comparison['cells'])}.",
        f"- Paired differences to **{spec['reference']}** over the (fold, seed) cells: mean, 95 % percentile-bootstrap "
        f"interval ({_resampling_text(spec['seeds'])}), Wilcoxon signed-rank p over the cells. An interval holding 0 "
        "is noise ('no difference shown').",
    ]
    if comparison["development_seeds"]:
        lines.append("- **Development seeds (below 100): for tuning, not for reporting.**")
    lines += ["", table(comparison, comparison["metrics"][:3]), "", comparison["metrics_note"], ""]
    if forest:
        lines += [f"![paired differences]({forest})", ""]
    write_text(out / "report.md", "\n".join(lines))


def _resampling_text(seeds: Sequence[int]) -> str:
    if resampled(seeds) == "seeds":
        return f"resampling whole seeds: {len(seeds)} seeds"
    return (f"resampling cells: fewer than {MIN_SEEDS_FOR_CLUSTERS} seeds, and folds of one seed are not independent, "
            "so the interval is somewhat too narrow")  # fmt: skip


def _rate_text(spec: Mapping[str, Any], cells: Sequence[Mapping[str, Any]]) -> str:
    if spec["lr_grid"]:
        grid = ", ".join(f"{rate:g}" for rate in spec["lr_grid"])
        chosen = []
        for name in spec["methods"]:
            rates = [c["learning_rate"] for c in cells if c["method"] == name]
            chosen.append(f"{name} " + ", ".join(f"{r:g} ×{rates.count(r)}" for r in sorted(set(rates))))
        return f"each method's chosen per cell on validation loss from {grid} (chosen: {'; '.join(chosen)})"
    if spec["learning_rate"] is not None:
        return f"{spec['learning_rate']:g} for every method"
    return "each method's own default (the task's where it sets one)"


def forest_plot(comparison: Mapping[str, Any], path: Path) -> str | None:
    """Paired differences to the reference with their intervals, one panel per metric; the file name, or None
    with a single method."""
    others = [name for name in comparison["summary"] if name != comparison["spec"]["reference"]]
    if not others:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = comparison["metrics"][:FOREST_METRICS]
    figure, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 0.6 * len(others) + 1.4), squeeze=False)
    for axis, metric in zip(axes[0], metrics):
        for row, name in enumerate(others):
            paired = comparison["summary"][name]["metrics"][metric]["vs_reference"]
            low, high = paired["interval"]
            axis.errorbar(paired["mean"], row, xerr=[[paired["mean"] - low], [high - paired["mean"]]], fmt="o",
                          capsize=3, color="C3" if paired["verdict"] == "worse" else "C0")  # fmt: skip
        axis.axvline(0, color="grey", lw=1)
        axis.set_yticks(range(len(others)), others)
        better = "lower" if metric in comparison["lower_is_better"] else "higher"
        axis.set_xlabel(f"Δ {metric} vs {comparison['spec']['reference']} ({better} is better)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path.name

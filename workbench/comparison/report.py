"""What a comparison says (`workbench.comparison`): per method mean ± sd of every metric, the paired difference to
the reference over independent units with a 95 % t interval, a Holm-adjusted p and the minimum detectable
difference (`workbench.comparison.statistics`), costs, a forest plot, and claims with three verdicts: holds, does not
hold, no verdict.

The unit is the seed (each seed re-draws the folds and, for generated problems, the problem; a benchmark may say
what a seed stands for, such as a target site): the folds of one seed share training data, so a unit's folds are
averaged first and the statistics run over the unit means. Nothing is said (``no verdict``) where the verdict rules
(`workbench.comparison.rules.gate`) forbid it: fewer than `workbench.comparison.statistics.MIN_UNITS` units, seeds
below `workbench.comparison.design.FIRST_REPORTED_SEED`, a reference that trained but did not move from the base model
(its after − before interval holds 0: every entry then sits at the base model), or zero spread across units. A
difference that a claim tests is decided by that claim, in the table too (`decided`): one verdict per difference.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from workbench.comparison import statistics
from workbench.comparison.design import DEVELOPMENT_SEEDS_BELOW, FIRST_REPORTED_SEED, SEED_FIELD
from workbench.comparison.rules import (  # noqa: F401 (the report's names since 0.1)
    CLAIM_KINDS,
    Claim,
    covered,
    did_not_move,
    gate,
    moved_text,
    reference_moved,
    spent_text,
    table_from_claims,
    verdicts,
)
from workbench.core.checkpoint import write_text

#: Metrics the forest plot shows (the first of the task's).
FOREST_METRICS = 3


def summarise(spec: Any, facts: Mapping[str, Any], records: list[dict[str, Any]],
              claimed: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:  # fmt: skip
    """``comparison.json``: the spec, the groups, every cell, whether the reference moved from the base model, and per
    method its metrics, paired differences to the reference (Holm over the methods a verdict may be given, per metric,
    leaving out the (method, metric) differences ``claimed`` by claims: `decided` fills those in) and costs."""
    metrics = [name for name in facts["metrics"] if all(name in r["metrics"] for r in records)]
    lower = set(facts["lower_is_better"])
    by_method = {name: [r for r in records if r["method"] == name] for name in spec.methods}
    reference = {(r["fold"], r["seed"]): r for r in by_method[spec.reference]}
    moved = {metric: reference_moved(by_method[spec.learner or spec.reference], metric) for metric in metrics}
    summary = {}
    for name, cells in by_method.items():
        summary[name] = {"cells": len(cells), "metrics": {}, "costs": _costs(cells)}
        for metric in metrics:
            values = [r["metrics"][metric] for r in cells]
            entry = {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}
            if name != spec.reference:
                entry["vs_reference"] = _paired(cells, reference, metric)
            summary[name]["metrics"][metric] = entry
    for metric in metrics:  # Holm over the entries of the table that no claim decides, one family per metric
        entries = [summary[name]["metrics"][metric]["vs_reference"] for name in spec.methods
                   if name != spec.reference and (name, metric) not in set(claimed)]  # fmt: skip
        gates = [gate(e, e["seeds"], moved[metric], lambda m: f"{m['method']} did not move from the base model")
                 for e in entries]  # fmt: skip
        tested = [float("nan") if why else e["p"] for e, why in zip(entries, gates)]
        for entry, adjusted, step, why in zip(entries, statistics.holm(tested), statistics.holm_steps(tested), gates):
            entry["p_holm"] = adjusted
            entry["holm_level"] = statistics.ALPHA / (1.0 if math.isnan(step) else step)
            entry["mdd_holm"] = statistics.minimum_detectable_difference(entry["unit_sd"], entry["units"],
                                                                         alpha=entry["holm_level"])  # fmt: skip
            entry["verdict"] = f"no verdict: {why}" if why else _table_verdict(entry, metric in lower)
    return {
        "spec": spec.to_dict(),
        "development_seeds": spec.development,
        **dict(facts),
        "metrics": metrics,
        "unit": facts.get("unit", "seed"),
        "fixed_data": facts.get("fixed_data"),
        "units": len({r["seed"] for r in records}),
        "budget_note": _budget_note(spec, records) + _schedule_note(spec),
        "reference_moved": moved,
        "summary": summary,
        "cells": records,
    }


def reference_line(comparison: Mapping[str, Any], metric: str) -> str:
    """One sentence on whether the entry every verdict rests on (the learner, else the reference) trained on
    ``metric``: its after − before (`moved_text`), that nothing gets a verdict when it did not move, or that it takes
    no optimizer step."""
    spec = comparison["spec"]
    role, name = ("Learner", spec["learner"]) if spec.get("learner") else ("Reference", spec["reference"])
    moved = comparison["reference_moved"].get(metric)
    if moved is None:
        return f"{role} ({name}) on {metric}: takes no optimizer step here, so it has no after − before."
    if did_not_move(moved):
        return f"Nothing trained on {metric} ({moved_text(moved)}): no entry gets a verdict."
    return f"{role} on {metric}: {moved_text(moved)}."


def _paired(cells: list[dict], reference: dict, metric: str) -> dict[str, Any]:
    """The paired difference (method − reference) of ``metric`` over the units both have (`statistics.paired_units`;
    ``wins``: cells where the method is ahead)."""
    differences = [r["metrics"][metric] - reference[(r["fold"], r["seed"])]["metrics"][metric] for r in cells]
    paired = statistics.paired_units(differences, [r["seed"] for r in cells])
    paired["wins"] = int(sum(d > 0 for d in differences))
    paired["seeds"] = sorted({int(r["seed"]) for r in cells})
    return paired


def _table_verdict(paired: Mapping[str, Any], lower_better: bool) -> str:
    """ "better" / "worse" (Holm-adjusted two-sided p below `statistics.ALPHA`) or "no difference shown", for a
    difference `rules.gate` lets through."""
    if not paired["p_holm"] < statistics.ALPHA:
        return "no difference shown"
    return "better" if (paired["mean"] < 0) == lower_better else "worse"


def _costs(cells: list[dict]) -> dict[str, Any]:
    """Median trainable parameters, mean steps, epochs, training seconds and peak memory of a method's cells, and how
    many kept their first epoch."""

    def mean(key: str) -> float | None:
        values = [r[key] for r in cells if r.get(key) is not None]
        return float(np.mean(values)) if values else None

    parameters = [r["trainable_parameters"] for r in cells if r.get("trainable_parameters") is not None]
    kept = [r["kept_epoch"] for r in cells if r.get("kept_epoch") is not None and r.get("epochs", 0) > 1]
    return {
        "trainable_parameters": int(np.median(parameters)) if parameters else None,
        "steps": mean("steps"),
        "epochs": mean("epochs"),
        "train_seconds": mean("train_seconds"),
        "peak_memory_bytes": mean("peak_memory_bytes"),
        "training_step_bytes": mean("training_step_bytes"),
        "test_samples": mean("test_samples"),
        "learning_rates": sorted({r["learning_rate"] for r in cells if r.get("learning_rate") is not None}),
        #: Cells (of those trained for more than one epoch that record it) whose kept epoch is the first.
        "kept_first_epoch": [sum(k == 1 for k in kept), len(kept)],
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
def decided(spec: Any, facts: Mapping[str, Any], records: list[dict[str, Any]],
            claims: Sequence[Claim]) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """The comparison (`summarise`) and its claims' verdicts (`rules.verdicts`), one decision per difference: a table
    difference that a claim tests (`rules.covered`) leaves the table's Holm family and shows the claim's verdict."""
    claimed = covered(claims, spec.reference, [m for m in facts["metrics"]])
    comparison = summarise(spec, facts, records, claimed=list(claimed))
    out = verdicts(claims, comparison)
    table_from_claims(comparison, claims, out)
    return comparison, out


def seeds_line(comparison: Mapping[str, Any]) -> str | None:
    """The flag of a comparison on seeds below `FIRST_REPORTED_SEED` (None without one): it gives no verdict."""
    spent = spent_text(comparison["spec"]["seeds"])
    return f"**No verdict on {spent}: every difference here reads 'no verdict'.**" if spent else None


def dataset_line(comparison: Mapping[str, Any]) -> str | None:
    """The sentence a comparison whose every unit re-partitions one fixed dataset carries (its intervals are
    conditional on this dataset), or one whose seeds each read their own (`workbench.comparison.design.SEED_FIELD`);
    None otherwise."""
    data = comparison["spec"].get("data") or ""
    if SEED_FIELD in data:
        return f"One dataset per seed (`{data}`): the intervals cover new data as well as new partitions."
    if not comparison.get("fixed_data"):
        return None
    return ("Conditional on this dataset: every seed re-partitions and retrains on the same data, so the intervals "
            "and verdicts cover new partitions and training runs of these data, not a new dataset.")  # fmt: skip


# -- writing -------------------------------------------------------------------------------------------------------
def _cell(entry: Mapping[str, Any]) -> str:
    return f"{entry['mean']:.3f} ± {entry['sd']:.3f}"


def _difference(entry: Mapping[str, Any]) -> str:
    paired = entry.get("vs_reference")
    if paired is None:
        return "reference"
    low, high = paired["interval"]
    p = "" if math.isnan(paired["p_holm"]) else f" Holm p={paired['p_holm']:.2g},"
    if "mdd_holm" in paired and not math.isnan(paired["p_holm"]):
        mdd = f"MDD {paired['mdd_holm']:.3g} at its Holm level {paired['holm_level']:.2g}"
    else:
        mdd = f"MDD {paired['mdd']:.3g}"
    return f"{paired['mean']:+.3f} [{low:+.3f}, {high:+.3f}]{p} {mdd} ({paired['verdict']})"


def table(comparison: Mapping[str, Any], metrics: Sequence[str] | None = None) -> str:
    """The markdown table of a comparison: per method mean ± sd, the paired difference over units with its 95 %
    interval, Holm-adjusted p, minimum detectable difference (MDD, 80 % power) and verdict, costs (step MiB: the
    tensors one training step allocates, `workbench.core.memory`; the process's peak is in the cells) and the cells
    whose kept epoch is the first."""
    metrics = list(metrics or comparison["metrics"][:2])
    headline = metrics[0]
    head = ["method", "cells", *(f"{m} (mean ± sd)" for m in metrics), f"Δ {headline} vs reference [95 % CI]",
            "trainable params", "steps", "train s", "step MiB", "kept epoch 1"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, entry in comparison["summary"].items():
        costs = entry["costs"]
        memory = costs.get("training_step_bytes")
        first, recorded = costs.get("kept_first_epoch", (0, 0))
        row = [
            name,
            str(entry["cells"]),
            *(_cell(entry["metrics"][m]) for m in metrics),
            _difference(entry["metrics"][headline]),
            f"{costs['trainable_parameters']:,}" if costs["trainable_parameters"] is not None else "–",
            f"{costs['steps']:.0f}" if costs["steps"] is not None else "–",
            f"{costs['train_seconds']:.1f}" if costs["train_seconds"] is not None else "–",
            f"{memory / 2**20:.1f}" if memory else "–",
            f"{first}/{recorded}" if recorded else "–",
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
        f"- Paired differences to **{spec['reference']}**: {statistics_text(comparison)}",
    ]
    lines.append(f"- {reference_line(comparison, comparison['metrics'][0])}")
    if comparison["development_seeds"]:
        lines.append(f"- **Development seeds (below {DEVELOPMENT_SEEDS_BELOW}): for tuning, not for reporting.**")
    if seeds_line(comparison):
        lines.append(f"- {seeds_line(comparison)}")
    if dataset_line(comparison):
        lines.append(f"- {dataset_line(comparison)}")
    lines += ["", table(comparison, comparison["metrics"][:3]), "", comparison["metrics_note"], ""]
    if forest:
        lines += [f"![paired differences]({forest})", ""]
    write_text(out / "report.md", "\n".join(lines))


def statistics_text(comparison: Mapping[str, Any]) -> str:
    """How the paired differences are computed and decided, in one sentence."""
    unit, units = comparison.get("unit", "seed"), comparison["units"]
    return (
        f"the folds of each unit ({unit}; {units} here) averaged, then the mean over units with a 95 % t interval, "
        f"a two-sided t test Holm-adjusted over the table's entries that no claim tests (shown at p < "
        f"{statistics.ALPHA:g}; an entry a claim tests shows that claim's verdict) and the minimum detectable "
        f"difference (MDD) at {statistics.POWER * 100:.0f} % power at the level of its Holm step; no verdict with "
        f"fewer than {statistics.MIN_UNITS} units, on seeds below {FIRST_REPORTED_SEED} (spent or development), with "
        "zero spread across units, or when the reference (or the named learner) did not move from the base model."
    )


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


# -- planning ----------------------------------------------------------------------------------------------------
#: What a seed stands for in a comparison (a benchmark may say otherwise: ``facts["unit"]``).
SEED_UNIT = "a seed, which redraws the folds, the training randomness and generated data; its folds averaged first"


def design(spec: Any) -> tuple[str, str | None]:
    """What ``spec``'s design can show, said before any cell runs (`workbench.comparison.execute.compare`) and by
    ``compare --plan``: the design line (folds × seeds = cells per method; the units verdicts are taken over), and the
    line saying why the design cannot give a verdict, with its fix (fewer than `statistics.MIN_UNITS` seeds, one method
    with nothing to pair), or None."""
    folds, units, cells = spec.folds, len(spec.seeds), spec.folds * len(spec.seeds)
    seeds = f"{units} seed{'s' * (units != 1)}"
    line = (f"design: {folds} folds × {seeds} = {cells} cells per method, {cells * len(spec.methods)} in all; "
            f"units: {seeds} (unit: {SEED_UNIT}); verdicts need ≥ {statistics.MIN_UNITS} units")  # fmt: skip
    problems = []
    if len(spec.methods) < 2:
        problems.append(f"one method ({spec.methods[0]}) has nothing to be paired with; name two or more in --methods")
    if units < statistics.MIN_UNITS:
        first = min(spec.seeds)
        problems.append(f"{seeds}, fewer than {statistics.MIN_UNITS} units, so every verdict of this comparison will "
                        f"read 'no verdict'; give --seeds {first}-{first + statistics.MIN_UNITS - 1}")  # fmt: skip
    if spent_text(spec.seeds):
        problems.append(f"{spent_text(spec.seeds)}: every verdict will read 'no verdict'; draw seeds from "
                        f"{FIRST_REPORTED_SEED} on")  # fmt: skip
    return line, ("cannot give a verdict: " + "; ".join(problems)) if problems else None


def plan(spec: Any, sd: float | None = None, effect: float | None = None,
         pilot: Mapping[str, Any] | None = None) -> str:  # fmt: skip
    """What ``workbench compare --plan`` prints, running no cell: for the planned units (``spec.seeds``), the minimum
    detectable difference at `statistics.POWER` from ``sd`` (the standard deviation of one unit's mean paired
    difference) or, per entry and metric, from a ``pilot`` comparison's unit means; and the units needed to detect
    ``effect``."""
    units = len(spec.seeds)
    lines = [f"plan: {spec.domain}, {', '.join(spec.methods)} against {spec.reference}; {units} unit(s) (seeds "
             f"{', '.join(str(s) for s in spec.seeds)}) × {spec.folds} folds; no cell is run."]  # fmt: skip
    lines += [text for text in design(spec) if text]
    sources = []
    if sd is not None:
        sources.append(("given --sd", sd))
    if pilot is not None:
        headline = pilot["metrics"][0]
        for name, entry in pilot["summary"].items():
            paired = entry["metrics"][headline].get("vs_reference")
            if paired is not None and not math.isnan(paired.get("unit_sd", float("nan"))):
                sources.append((f"pilot {name} − {pilot['spec']['reference']} on {headline} ({paired['units']} units)",
                                paired["unit_sd"]))  # fmt: skip
    lines.append(f"minimum detectable difference (MDD) at {statistics.POWER * 100:.0f} % power, two-sided "
                 f"{statistics.ALPHA:g}, t over {units} unit means:")  # fmt: skip
    for source, value in sources:
        mdd = statistics.minimum_detectable_difference(value, units)
        needed = statistics.units_needed(value, effect) if effect else None
        wanted = "" if not effect else (f"; to detect {effect:g}: {needed} seeds" if needed is not None
                                        else f"; to detect {effect:g}: more than 1000 seeds")  # fmt: skip
        lines.append(f"  {source}: sd of a unit's mean difference {value:.3g} → MDD {mdd:.3g}{wanted}")
    lines.append("The folds of a seed are averaged before testing: more folds shrink a unit's sd (a pilot measures "
                 "it), more seeds shrink the MDD.")  # fmt: skip
    return "\n".join(lines)

"""Does a comparison's 95 % interval cover the true difference, and how often does a "better" claim hold when
nothing differs? Measured by simulation at the project's real shapes, per procedure (issue 35).

A simulated comparison has ``units`` seeds × ``folds`` folds of paired differences

    d[s, k] = delta + sqrt(rho) * u[s] + sqrt(1 - rho) * e[s, k]

with unit variance in every cell and fold correlation ``rho`` within a seed (folds of one seed share training data);
``u`` and ``e`` are standard normal, or Student t with 3 degrees of freedom scaled to unit variance (heavy tails).

Procedures:
- ``bootstrap (before)``: the statistics before issue 35 — a percentile bootstrap of the mean over cells (over whole
  seeds from 5 seeds on); a "better" claim held when the interval cleared 0, a Wilcoxon signed-rank test over the
  cells gave p < 0.05, and there were at least 6 cells.
- ``corrected t``: the corrected repeated k-fold t (Nadeau & Bengio 2003; Bouckaert & Frank 2004) over all cells,
  variance inflated by 1 / (units · folds) + n_test / n_train with n_test / n_train = 1 / (folds − 1).
- ``unit-mean t`` (`workbench.comparison.statistics`, the default): Student t over the seeds' mean differences; a claim holds
  when the one-sided p < 0.025 with at least 3 units.

Columns: coverage of the nominal 95 % interval at delta = 0.5 (translation-equivariant procedures cover the same
at any delta); "false holds": the share of comparisons at delta = 0 where "better" holds; "power": the share where
it holds at delta = 1 (one cell sd). ``python benchmarks/interval_coverage.py`` prints the table and writes
``results/interval_coverage.json`` (simulation seed 200); ``tests/test_interval_coverage.py`` runs a reduced grid.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.stats import t as student_t
from scipy.stats import wilcoxon

from workbench.comparison import statistics

RESULTS = Path(__file__).resolve().parent / "results"
#: (units, folds): the shapes the project's benchmarks have run (1×6 elora_vs_baselines; 2×3 EEG and graphs;
#: 3×3; 5×3 partial_da_weights and ecg_htuning) and a powered one.
SHAPES = ((1, 6), (2, 3), (3, 3), (5, 3), (10, 5))
CORRELATIONS = (0.0, 0.5, 0.9)
NOISES = ("normal", "heavy")
PROCEDURES = ("bootstrap (before)", "corrected t", "unit-mean t")
#: Bootstrap draws per simulated comparison (the engine drew 10,000; the quantiles move by far less than the
#: Monte-Carlo error of the coverage).
DRAWS = 2000
#: The seed of the reported table (reported seeds start at 200).
SEED = 200
#: Before issue 35: fewest cells for a verdict, and fewest seeds for resampling seeds rather than cells.
OLD_MIN_CELLS, OLD_MIN_SEEDS = 6, 5


def draw(rng: np.random.Generator, reps: int, units: int, folds: int, rho: float, noise: str) -> np.ndarray:
    """Simulated paired differences at delta = 0: (reps, units, folds), unit variance per cell, fold correlation
    ``rho``."""

    def standard(size: tuple[int, ...]) -> np.ndarray:
        if noise == "normal":
            return rng.standard_normal(size)
        return rng.standard_t(3, size) / math.sqrt(3.0)  # t(3) has variance 3

    return math.sqrt(rho) * standard((reps, units, 1)) + math.sqrt(1 - rho) * standard((reps, units, folds))


def bootstrap_interval(d: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The percentile-bootstrap 95 % interval before issue 35: (reps, 2)."""
    reps, units, folds = d.shape
    if units >= OLD_MIN_SEEDS:
        values, width = d.mean(axis=2), units  # whole seeds, equal folds: the mean of drawn seed means
    else:
        values, width = d.reshape(reps, units * folds), units * folds
    index = rng.integers(0, width, size=(DRAWS, width))
    out = np.empty((reps, 2))
    for start in range(0, reps, 200):
        means = values[start : start + 200][:, index].mean(axis=2)
        out[start : start + 200] = np.quantile(means, [0.025, 0.975], axis=1).T
    return out


def corrected_t_interval(d: np.ndarray) -> np.ndarray:
    """The corrected repeated-k-fold t interval over all cells: (reps, 2)."""
    reps, units, folds = d.shape
    cells = d.reshape(reps, units * folds)
    n = units * folds
    variance = cells.var(axis=1, ddof=1) * (1 / n + 1 / (folds - 1))
    half = student_t.ppf(0.975, n - 1) * np.sqrt(variance)
    mean = cells.mean(axis=1)
    return np.stack([mean - half, mean + half], axis=1)


def unit_t_interval(d: np.ndarray) -> np.ndarray:
    """The t interval over unit means (`workbench.comparison.statistics.t_interval`, vectorised): (reps, 2); nan below two
    units."""
    means = d.mean(axis=2)
    reps, units = means.shape
    if units < 2:
        return np.full((reps, 2), np.nan)
    half = student_t.ppf(0.975, units - 1) * means.std(axis=1, ddof=1) / math.sqrt(units)
    centre = means.mean(axis=1)
    return np.stack([centre - half, centre + half], axis=1)


def holds(procedure: str, d: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Whether a "better than 0" claim holds in each simulated comparison: (reps,) bool."""
    reps, units, folds = d.shape
    if procedure == "bootstrap (before)":
        if units * folds < OLD_MIN_CELLS:
            return np.zeros(reps, bool)
        cells = d.reshape(reps, units * folds)
        p = wilcoxon(cells, axis=1).pvalue
        return (bootstrap_interval(d, rng)[:, 0] > 0) & (p < statistics.ALPHA)
    if procedure == "corrected t":
        return corrected_t_interval(d)[:, 0] > 0
    if units < statistics.MIN_UNITS:
        return np.zeros(reps, bool)
    return unit_t_interval(d)[:, 0] > 0  # the one-sided p < 0.025 exactly when the 95 % interval clears 0


def interval(procedure: str, d: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if procedure == "bootstrap (before)":
        return bootstrap_interval(d, rng)
    if procedure == "corrected t":
        return corrected_t_interval(d)
    return unit_t_interval(d)


def measure(shape: tuple[int, int], rho: float, noise: str, reps: int, seed: int = SEED,
            procedures: Sequence[str] = PROCEDURES) -> list[dict[str, Any]]:  # fmt: skip
    """One row per procedure: coverage at delta = 0.5, false holds at 0, power at 1 (shares of ``reps``)."""
    units, folds = shape
    rng = np.random.default_rng([seed, units, folds, int(rho * 10), NOISES.index(noise)])
    noise_draws = draw(rng, reps, units, folds, rho, noise)
    rows = []
    for procedure in procedures:
        bounds = interval(procedure, 0.5 + noise_draws, rng)
        covered = (bounds[:, 0] <= 0.5) & (0.5 <= bounds[:, 1])
        rows.append({
            "units": units, "folds": folds, "correlation": rho, "noise": noise, "procedure": procedure,
            "coverage": None if np.isnan(bounds).all() else float(covered.mean()),
            "false_holds": float(holds(procedure, noise_draws, rng).mean()),
            "power": float(holds(procedure, 1.0 + noise_draws, rng).mean()),
        })  # fmt: skip
    return rows


def grid(reps: int, shapes=SHAPES, correlations=CORRELATIONS, noises=NOISES, procedures=PROCEDURES) -> list[dict]:
    """`measure` over every shape × correlation × noise."""
    rows = []
    for shape, rho, noise in itertools.product(shapes, correlations, noises):
        rows += measure(shape, rho, noise, reps, procedures=procedures)
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The markdown table: one row per shape × correlation × noise, three columns per procedure."""
    procedures = list(dict.fromkeys(row["procedure"] for row in rows))
    head = ["units × folds", "fold corr.", "noise"] + [f"{p}: {c}" for p in procedures
                                                      for c in ("coverage", "false holds", "power")]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keyed: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        keyed.setdefault((row["units"], row["folds"], row["correlation"], row["noise"]), {})[row["procedure"]] = row
    for (units, folds, rho, noise), by in keyed.items():
        cells = [f"{units} × {folds}", f"{rho:g}", noise]
        for procedure in procedures:
            row = by[procedure]
            cells += ["–" if row["coverage"] is None else f"{row['coverage']:.3f}", f"{row['false_holds']:.3f}",
                      f"{row['power']:.3f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="coverage and false holds of each interval procedure")
    parser.add_argument("--reps", type=int, default=4000, help="simulated comparisons per row (default: 4000)")
    args = parser.parse_args(argv)
    rows = grid(args.reps)
    print(table(rows))
    RESULTS.mkdir(exist_ok=True)
    content = {"script": "interval_coverage.py", "reps": args.reps, "seed": SEED, "draws": DRAWS, "rows": rows}
    (RESULTS / "interval_coverage.json").write_text(json.dumps(content, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

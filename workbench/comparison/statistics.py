"""Paired statistics over independent units: the numbers behind every verdict of `workbench compare`.

A comparison's cells are (fold, seed) pairs, but the folds of one seed share training data (and, for generated
problems, the problem itself): they are not independent. The unit of analysis is the seed (or what a seed stands
for: a target site, a domain pair). Every interval and test here is computed over **unit means** — the mean paired
difference of each unit's folds — with Student's t on ``n_units - 1`` degrees of freedom. That handles any
correlation between the folds of a unit (their mean is one draw per unit, whatever the correlation), at the price
of few degrees of freedom; `benchmarks/interval_coverage.py` measures it beside the alternatives (cell bootstrap,
seed bootstrap, the corrected repeated-k-fold t of Nadeau & Bengio 2003) at the project's shapes: it is the only
one that keeps its 95 % coverage at every fold correlation, and so the default.

Decisions:
- a difference is shown (tables) when its Holm-adjusted two-sided p is below `ALPHA`;
- a one-sided claim ("better by more than m", "not worse by more than m") holds when its Holm-adjusted one-sided p
  is below `ALPHA` / 2 — alone, exactly when the 95 % interval clears the bound;
- an equivalence claim ("within ±m") holds by TOST at `ALPHA` / 2 per side — alone, exactly when the 95 % interval
  lies inside ±m;
- fewer than `MIN_UNITS` units give no verdict at all, and neither do unit means without spread (`zero_spread`:
  their t statistic is undefined, so every p here is nan for them, never 0 on a zero-width interval).
The minimum detectable difference (80 % power, two-sided level) is the smallest true difference the comparison
would show four times in five, from the noncentral t; it is printed at the level of the difference's Holm step
(`holm_steps`). An equivalence's power is TOST's at a true difference of 0 (`tost_power`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

#: Two-sided level of every test; one-sided claims use half of it (their 95 % interval clears the bound).
ALPHA = 0.05
#: Power at which the minimum detectable difference is computed.
POWER = 0.8
#: Fewest independent units for any verdict.
MIN_UNITS = 3


def unit_means(values: Sequence[float], units: Sequence[Any]) -> np.ndarray:
    """The mean of ``values`` per unit, in sorted unit order. Shapes: values (n_cells,), units (n_cells,) →
    (n_units,)."""
    values = np.asarray(values, dtype=float)
    labels = np.asarray(units)
    if values.shape != labels.shape:
        raise ValueError(f"{len(values)} values but {len(labels)} unit labels")
    return np.array([values[labels == name].mean() for name in np.unique(labels)])


def zero_spread(means: Sequence[float]) -> bool:
    """Whether two or more unit means are equal up to rounding (their spread is below 64 ulps of the largest): no
    t statistic exists for them."""
    means = np.asarray(means, dtype=float)
    if len(means) < 2 or np.isnan(means).any():
        return False
    largest = max(float(np.abs(means).max()), np.finfo(float).tiny)
    return bool(float(np.ptp(means)) <= 64 * np.finfo(float).eps * largest)


def _t_parts(means: Sequence[float]) -> tuple[float, float, int]:
    """(mean, standard error, degrees of freedom) of unit means; the standard error is 0 for `zero_spread`."""
    means = np.asarray(means, dtype=float)
    se = 0.0 if zero_spread(means) else float(means.std(ddof=1) / math.sqrt(len(means)))  # no rounding spread
    return float(means.mean()), se, len(means) - 1


def t_interval(means: Sequence[float], level: float = 1 - ALPHA) -> tuple[float, float]:
    """Student-t interval of the mean of independent unit means (nan with fewer than two units)."""
    from scipy.stats import t

    if len(means) < 2:
        return (float("nan"), float("nan"))
    mean, se, df = _t_parts(means)
    half = float(t.ppf(1 - (1 - level) / 2, df)) * se
    return (mean - half, mean + half)


def one_sided_p(means: Sequence[float], bound: float = 0.0) -> float:
    """p of the t test of H0: mean ≤ ``bound`` against mean > ``bound``; nan with fewer than two units or equal unit
    means (`zero_spread`: no test, whatever side of the bound they sit)."""
    from scipy.stats import t

    if len(means) < 2:
        return float("nan")
    mean, se, df = _t_parts(means)
    if se == 0:
        return float("nan")
    return float(t.sf((mean - bound) / se, df))


def two_sided_p(means: Sequence[float]) -> float:
    """p of the two-sided t test of H0: mean = 0 (nan with fewer than two units or `zero_spread`)."""
    if len(means) < 2 or zero_spread(means):
        return float("nan")
    return min(1.0, 2 * min(one_sided_p(means), one_sided_p(-np.asarray(means, dtype=float))))


def equivalence_p(means: Sequence[float], margin: float) -> float:
    """TOST p of "the mean lies inside ±``margin``": the larger of the two one-sided p's (mean > −margin, mean <
    +margin); nan with fewer than two units or `zero_spread`."""
    if len(means) < 2:
        return float("nan")
    means = np.asarray(means, dtype=float)
    sides = (one_sided_p(means, -margin), one_sided_p(-means, -margin))
    return float("nan") if any(math.isnan(p) for p in sides) else max(sides)


def inequivalence_p(means: Sequence[float], margin: float) -> float:
    """p of "the mean lies outside ±``margin``" (the contrary of an equivalence): the smaller of the one-sided p's of
    mean > +margin and mean < −margin (each side at the same level as TOST's, so it is below `ALPHA` / 2 exactly when
    the 95 % interval lies outside ±margin); nan as `equivalence_p`."""
    if len(means) < 2:
        return float("nan")
    means = np.asarray(means, dtype=float)
    return min(one_sided_p(means, margin), one_sided_p(-means, margin))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the input order; nan stays nan and is not counted."""
    values = np.asarray(pvalues, dtype=float)
    adjusted = np.full(len(values), np.nan)
    finite = np.flatnonzero(~np.isnan(values))
    order = finite[np.argsort(values[finite], kind="stable")]
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * values[index]))
        adjusted[index] = running
    return adjusted.tolist()


def holm_steps(pvalues: Sequence[float]) -> list[float]:
    """The step of Holm's procedure at which each p is tested, as the number of hypotheses still in the family there
    (the smallest p: all of them; the largest: 1), so that its level is ``ALPHA / step``; nan for nan (not tested)."""
    values = np.asarray(pvalues, dtype=float)
    steps = np.full(len(values), np.nan)
    finite = np.flatnonzero(~np.isnan(values))
    order = finite[np.argsort(values[finite], kind="stable")]
    steps[order] = len(order) - np.arange(len(order))
    return steps.tolist()


def tost_power(sd: float, units: int, margin: float, alpha: float = ALPHA, difference: float = 0.0) -> float:
    """Probability that TOST (each side one-sided at ``alpha`` / 2, as the 95 % interval inside ±``margin``) shows
    equivalence over ``units`` unit means of standard deviation ``sd`` when the true mean difference is
    ``difference``: exact, by integrating over the sample variance (the mean and the variance of normal unit means are
    independent; TOST rejects when the mean lies inside ±(margin − t·se)). nan below two units or without spread."""
    from scipy.integrate import quad
    from scipy.stats import chi2, norm, t

    if units < 2 or math.isnan(sd) or sd <= 0:
        return float("nan")
    df, root = units - 1, math.sqrt(units)
    critical = float(t.ppf(1 - alpha / 2, df))
    most = df * (margin * root / (critical * sd)) ** 2  # the chi-square value at which the band margin − t·se closes

    def inside(variance: float) -> float:
        half = margin - critical * sd * math.sqrt(variance / df) / root
        spread = sd / root
        return float(norm.cdf((half - difference) / spread) - norm.cdf((-half - difference) / spread))

    power, _ = quad(lambda v: inside(v) * float(chi2.pdf(v, df)), 0.0, most, limit=200)
    return float(min(1.0, max(0.0, power)))


def minimum_detectable_difference(sd: float, units: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference a two-sided t test over ``units`` unit means (standard deviation ``sd``)
    detects with probability ``power`` at level ``alpha`` (noncentral t, both tails); nan below two units, 0 when
    ``sd`` is 0."""
    from scipy.optimize import brentq
    from scipy.stats import nct, t

    if units < 2 or math.isnan(sd):
        return float("nan")
    if sd == 0:
        return 0.0
    df = units - 1
    critical = float(t.ppf(1 - alpha / 2, df))

    def shortfall(shift: float) -> float:  # shift: the noncentrality, effect / sd * sqrt(units)
        upper, lower = float(nct.sf(critical, df, shift)), float(nct.cdf(-critical, df, shift))
        return (1.0 if math.isnan(upper) else upper) + (0.0 if math.isnan(lower) else lower) - power

    high = 1.0
    while shortfall(high) < 0:
        high *= 2
    return float(brentq(shortfall, 0.0, high, xtol=1e-10)) * sd / math.sqrt(units)


def units_needed(sd: float, effect: float, alpha: float = ALPHA, power: float = POWER, most: int = 1000) -> int | None:
    """The fewest units (at least `MIN_UNITS`) whose minimum detectable difference is at most ``effect`` (a bisection:
    the difference falls as units grow); None when even ``most`` units are too few."""
    if effect <= 0:
        raise ValueError(f"the effect to detect must be positive, got {effect}")
    if minimum_detectable_difference(sd, most, alpha, power) > effect:
        return None
    low, high = MIN_UNITS - 1, most  # too few at low (or below the floor), enough at high
    if minimum_detectable_difference(sd, MIN_UNITS, alpha, power) <= effect:
        return MIN_UNITS
    low = MIN_UNITS
    while high - low > 1:
        middle = (low + high) // 2
        if minimum_detectable_difference(sd, middle, alpha, power) <= effect:
            high = middle
        else:
            low = middle
    return high


def paired_units(differences: Sequence[float], units: Sequence[Any]) -> dict[str, Any]:
    """What a paired difference says over its units: ``{"mean", "interval", "p", "units", "cells", "unit_sd",
    "mdd", "zero_spread"}`` (the mean of the unit means; the 95 % t interval; the two-sided p; the sd of the unit
    means and the minimum detectable difference at `POWER` and two-sided `ALPHA`; whether the unit means are equal)."""
    means = unit_means(differences, units) if len(differences) else np.array([])
    sd = float(means.std(ddof=1)) if len(means) > 1 else float("nan")
    return {
        "mean": float(means.mean()) if len(means) else float("nan"),
        "interval": list(t_interval(means)),
        "p": two_sided_p(means),
        "units": len(means),
        "cells": len(differences),
        "unit_sd": sd,
        "mdd": minimum_detectable_difference(sd, len(means)),
        "zero_spread": zero_spread(means),
    }

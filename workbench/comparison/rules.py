"""The verdict rules of a comparison (`workbench.comparison.report` writes what they decide): when a paired difference
may get a verdict at all, and the claims a benchmark tests with their verdicts (holds, does not hold, no verdict).

No verdict, whatever the p (`gate`): fewer than `workbench.comparison.statistics.MIN_UNITS` units; a unit on a seed
below `workbench.comparison.design.FIRST_REPORTED_SEED` (spent on reported benchmarks, or for development: the designs
were chosen looking at them); a reference (or named learner) that trained but did not move from the base model (every
entry then sits at the base model); equal unit means (zero spread: no t statistic exists).

A claim is tested in both directions at one Holm step: its p for the claim and its p against it (the contrary
one-sided test, or for an equivalence the test that the mean lies outside ± margin) make one directional p, the
smaller; Holm runs over the directional p's of the benchmark's tested claims, and a claim whose adjusted p is below
`workbench.comparison.statistics.ALPHA` / 2 "holds" or "does not hold" by the side its smaller p is on. Otherwise
"no verdict", saying why (the interval clears the bound either way but the Holm step does not, or it reaches across).
The minimum detectable difference and TOST's power are printed at the level of the claim's Holm step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from workbench.comparison import statistics
from workbench.comparison.design import FIRST_REPORTED_SEED

#: Claim kinds: better by more than the margin; not worse by more than it; equivalent within ± it.
CLAIM_KINDS = ("better", "not_worse", "equivalent")


def reference_moved(cells: Sequence[Mapping[str, Any]], metric: str) -> dict[str, Any] | None:
    """The reference's test ``metric`` after − before training over its units (`statistics.paired_units` plus
    ``moved``: the 95 % interval excludes 0, or None below two units); None when it took no optimizer step (a method
    that does not train, or the base model itself) or its cells do not record the metric before training."""
    if not cells or not any(c.get("steps") for c in cells) or not all(metric in c.get("before", {}) for c in cells):
        return None
    paired = statistics.paired_units([c["metrics"][metric] - c["before"][metric] for c in cells],
                                     [c["seed"] for c in cells])  # fmt: skip
    low, high = paired["interval"]
    paired["moved"] = None if math.isnan(low) else not low <= 0 <= high
    paired["method"] = cells[0]["method"]
    steps = [c.get("steps", 0) for c in cells]
    kept = [c["kept_epoch"] for c in cells if c.get("kept_epoch") is not None]
    paired["steps"] = [min(steps), max(steps)]
    paired["kept_first"] = [sum(k == 1 for k in kept), len(kept)]
    return paired


def did_not_move(moved: Mapping[str, Any] | None) -> bool:
    """Whether the reference trained and stayed inside its own noise (`reference_moved`)."""
    return moved is not None and moved["moved"] is False


def moved_text(moved: Mapping[str, Any]) -> str:
    """How far the reference (or the comparison's learner) moved: its after − before with interval, steps per cell
    and kept epochs."""
    low, high = moved["interval"]
    first, recorded = moved["kept_first"]
    steps = "–".join(str(s) for s in sorted(set(moved["steps"])))
    kept = f"kept epoch 1 in {first} of {recorded} cells" if recorded else "kept epochs not recorded"
    verb = {True: "moved from", False: "did not move from"}.get(
        moved["moved"], "has too few units to tell if it moved from"
    )
    interval = f" [{low:+.3f}, {high:+.3f}]" if not math.isnan(low) else ""
    return (
        f"{moved['method']} {verb} the base model: after − before {moved['mean']:+.3f}{interval} over "
        f"{moved['units']} units; {steps} steps per cell, {kept}"
    )


def seed_text(seeds: Sequence[int]) -> str:
    """Seeds as runs: 100–103, 150."""
    runs: list[list[int]] = []
    for seed in sorted(set(int(s) for s in seeds)):
        if runs and seed == runs[-1][-1] + 1:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    return ", ".join(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def spent_text(seeds: Sequence[int]) -> str | None:
    """Why seeds below `FIRST_REPORTED_SEED` give no verdict (naming them), or None when there are none."""
    spent = [s for s in seeds if int(s) < FIRST_REPORTED_SEED]
    return f"seeds < {FIRST_REPORTED_SEED} (spent/development: {seed_text(spent)})" if spent else None


def gate(paired: Mapping[str, Any], seeds: Sequence[int], moved: Mapping[str, Any] | None,
         moved_words: Callable[[Mapping[str, Any]], str] = moved_text) -> str | None:  # fmt: skip
    """Why the difference ``paired`` (`statistics.paired_units`, over units on ``seeds``) gets no verdict whatever its
    p, or None when it may get one: too few units, spent or development seeds, a reference that did not move
    (``moved_words`` says it), zero spread across units."""
    if paired["units"] < statistics.MIN_UNITS:
        return f"{paired['units']} unit(s), at least {statistics.MIN_UNITS} needed"
    spent = spent_text(seeds)
    if spent:
        return spent
    if did_not_move(moved):
        return moved_words(moved)
    if paired.get("zero_spread"):
        return "zero spread across units (every unit mean equal): no t test"
    return None


@dataclass(frozen=True)
class Claim:
    """A claim a benchmark tests: ``method`` against ``against`` (default: the reference) on ``metric``, paired within
    units over the cells both have.

    ``kind`` "better": better by more than ``margin`` (one-sided t over unit means); "not_worse": not worse by more
    than ``margin`` (non-inferiority, one-sided); "equivalent": within ± ``margin`` (TOST). ``direction`` "higher" /
    "lower" names the better direction of a metric the task does not list (a diagnostic such as a weight share).
    `verdicts` decides a benchmark's claims together (Holm over them).
    """

    method: str
    metric: str
    kind: str = "better"
    margin: float = 0.0
    against: str = ""
    direction: str = ""
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CLAIM_KINDS:
            raise ValueError(f"claim kind must be one of {', '.join(CLAIM_KINDS)}, got {self.kind!r}")
        if self.margin < 0 or (self.kind == "equivalent" and self.margin == 0):
            raise ValueError(f"the margin of a {self.kind} claim must be positive, got {self.margin}")

    def evidence(self, comparison: Mapping[str, Any]) -> dict[str, Any]:
        """The paired difference over units (`statistics.paired_units`), its test's p for the claim (one-sided
        against the bound, or TOST) and against it (``p_against``), both before adjustment, the units' seeds and
        whether the comparison's reference moved from the base model."""
        against = self.against or comparison["spec"]["reference"]
        theirs = {(c["fold"], c["seed"]): c["metrics"] for c in comparison["cells"] if c["method"] == against}
        mine = [c for c in comparison["cells"] if c["method"] == self.method and (c["fold"], c["seed"]) in theirs]
        differences = [c["metrics"][self.metric] - theirs[(c["fold"], c["seed"])][self.metric] for c in mine]
        units = [c["seed"] for c in mine]
        paired = statistics.paired_units(differences, units)
        lower = self.direction == "lower" or (not self.direction and self.metric in comparison["lower_is_better"])
        better = -statistics.unit_means(differences, units) if lower else statistics.unit_means(differences, units)
        if self.kind == "equivalent":
            p = statistics.equivalence_p(better, self.margin)
            p_against = statistics.inequivalence_p(better, self.margin)
        else:
            bound = self.margin if self.kind == "better" else -self.margin
            p, p_against = statistics.one_sided_p(better, bound), statistics.one_sided_p(-better, -bound)
        learner = comparison["spec"].get("learner") or comparison["spec"]["reference"]
        moved = reference_moved([c for c in comparison["cells"] if c["method"] == learner], self.metric)
        return {**paired, "against": against, "lower": lower, "p": p, "p_against": p_against,
                "seeds": sorted(set(units)), "reference_moved": moved}  # fmt: skip

    def decide(self, evidence: Mapping[str, Any], adjusted: float) -> tuple[str, str]:
        """(verdict, why): "no verdict" with the reason of `gate`; else "holds" / "does not hold" when the
        Holm-adjusted directional p is below `statistics.ALPHA` / 2, by the side of the smaller p (for or against the
        claim); else "no verdict", saying whether the 95 % interval clears the bound (either way) and only the Holm
        step stops it, or reaches across it."""
        reason = gate(evidence, evidence["seeds"], evidence["reference_moved"])
        if reason:
            return "no verdict", reason
        if adjusted < statistics.ALPHA / 2:
            return ("holds" if evidence["p"] <= evidence["p_against"] else "does not hold"), ""
        low, high = sorted(-x if evidence["lower"] else x for x in evidence["interval"])  # towards "better"
        bound = self.margin if self.kind == "better" else -self.margin  # of "better" and "not_worse"
        if self.kind == "equivalent":
            clears, contradicted = -self.margin < low and high < self.margin, low >= self.margin or high <= -self.margin
        else:
            clears, contradicted = low > bound, high <= bound
        if clears or contradicted:
            side = "clears the bound" if clears else "lies beyond the bound, against the claim"
            return "no verdict", f"the 95 % interval {side}, the Holm-adjusted p ({adjusted:.2g}) does not"
        if self.kind == "equivalent":
            power = evidence.get("tost_power_holm", float("nan"))
            weak = f" and TOST's power at a true difference of 0 is {power:.2f}" if power < statistics.POWER else ""
        else:
            mdd = evidence.get("mdd_holm", evidence["mdd"])
            weak = " and the minimum detectable difference exceeds the margin" if mdd > self.margin else ""
        return "no verdict", "the interval reaches across the bound" + weak

    def wording(self) -> str:
        """What the claim tests, in words."""
        if self.kind == "better":
            return "better" + (f" by more than {self.margin:g}" if self.margin else "")
        if self.kind == "not_worse":
            return f"not worse by more than {self.margin:g}"
        return f"equivalent within ±{self.margin:g}"


def _power_text(claim: Claim, e: Mapping[str, Any], step: float) -> str:
    """The claim's minimum detectable difference, or for an equivalence TOST's power at a true difference of 0, at
    its Holm step's level (and, for TOST, at the unadjusted level too)."""
    if claim.kind == "equivalent":
        nominal = f"TOST power at a true difference of 0: {e['tost_power']:.2f} at {statistics.ALPHA / 2:g} per side"
        if math.isnan(step):
            return "; " + nominal
        return f"; {nominal}, {e['tost_power_holm']:.2f} at its Holm level ({statistics.ALPHA / step / 2:.2g} per side)"
    if math.isnan(step):
        return f"; minimum detectable difference {e['mdd']:.3g}"
    return f"; minimum detectable difference {e['mdd_holm']:.3g} at its Holm level ({statistics.ALPHA / step:.2g})"


def verdicts(claims: Sequence[Claim], comparison: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each claim's verdict, Holm-adjusted over the claims that are tested (those `gate` lets through), for and
    against alike: ``{"verdict", "holds", "line", "difference", "interval", "units", "cells", "p", "p_against",
    "p_holm", "holm_level", "mdd", "mdd_holm", "tost_power", "tost_power_holm"}``."""
    evidence = [claim.evidence(comparison) for claim in claims]
    tested = [gate(e, e["seeds"], e["reference_moved"]) is None for e in evidence]
    directional = [min(e["p"], e["p_against"]) if ok else float("nan") for e, ok in zip(evidence, tested)]
    adjusted, steps = statistics.holm(directional), statistics.holm_steps(directional)
    family = sum(tested)
    out = []
    for claim, e, p_holm, step in zip(claims, evidence, adjusted, steps):
        level = statistics.ALPHA / (1.0 if math.isnan(step) else step)
        e["mdd_holm"] = statistics.minimum_detectable_difference(e["unit_sd"], e["units"], alpha=level)
        power = [statistics.tost_power(e["unit_sd"], e["units"], claim.margin, alpha=a) if claim.kind == "equivalent"
                 else float("nan") for a in (statistics.ALPHA, level)]  # fmt: skip
        e["tost_power"], e["tost_power_holm"] = power
        verdict, why = claim.decide(e, p_holm)
        low, high = e["interval"]
        unit = comparison.get("unit", "seed")
        test = "TOST" if claim.kind == "equivalent" else "one-sided t"
        line = (
            f"{verdict}: {claim.method} − {e['against']} on {claim.metric} {e['mean']:+.3f} [{low:+.3f}, {high:+.3f}] "
            f"over {e['units']} unit(s) ({unit}; {e['cells']} cells); {claim.wording()} towards "
            f"{'lower' if e['lower'] else 'higher'}: {test} p={e['p']:.2g} (against the claim {e['p_against']:.2g})"
            + (f", Holm-adjusted p={p_holm:.2g} over {family} claim(s)" if not math.isnan(p_holm) else "")
            + _power_text(claim, e, step)
            + (f" — {why}" if why else "")
        )
        out.append({"verdict": verdict, "holds": verdict == "holds", "line": line, "difference": e["mean"],
                    "interval": list(e["interval"]), "units": e["units"], "cells": e["cells"], "p": e["p"],
                    "p_against": e["p_against"], "p_holm": p_holm, "holm_level": level, "mdd": e["mdd"],
                    "mdd_holm": e["mdd_holm"], "tost_power": power[0], "tost_power_holm": power[1]})  # fmt: skip
    return out


def covered(claims: Sequence[Claim], reference: str, metrics: Sequence[str]) -> dict[tuple[str, str], list[int]]:
    """The table's differences (entry, metric) that claims decide: those of a claim against the reference on a metric
    of the table, with the indices of the claims that test each."""
    out: dict[tuple[str, str], list[int]] = {}
    for index, claim in enumerate(claims):
        if (claim.against or reference) == reference and claim.method != reference and claim.metric in metrics:
            out.setdefault((claim.method, claim.metric), []).append(index)
    return out


def table_from_claims(comparison: dict[str, Any], claims: Sequence[Claim],
                      decided: Sequence[Mapping[str, Any]]) -> None:  # fmt: skip
    """Write into ``comparison``'s table the verdict of each difference a claim decides (`covered`), so that a table and
    its claims say one thing per difference: the claims' verdicts, Holm p, level and MDD."""
    where = covered(claims, comparison["spec"]["reference"], comparison["metrics"])
    for (method, metric), indices in where.items():
        entry = comparison["summary"].get(method, {}).get("metrics", {}).get(metric, {}).get("vs_reference")
        if entry is None:
            continue
        first = decided[indices[0]]
        entry.update(p_holm=first["p_holm"], holm_level=first["holm_level"], mdd_holm=first["mdd_holm"])
        entry["verdict"] = "; ".join(f"claim '{claims[i].wording()}': {decided[i]['verdict']}" for i in indices)
        entry["claims"] = indices

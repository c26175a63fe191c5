"""The verdict rules of issue 52 (`workbench.comparison.rules`), each planted in a small comparison: no verdict on spent
or development seeds, Holm for "does not hold" exactly as for "holds", no verdict on zero spread, TOST's power
against an independent computation, one verdict per difference across a table and its claims, and the rendered
"conditional on this dataset"."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.comparison import statistics
from workbench.comparison.design import FIRST_REPORTED_SEED, CompareSpec
from workbench.comparison.report import Claim, decided, design, summarise, verdicts

ROOT = Path(__file__).resolve().parents[1]
FACTS = {"metrics": ["m"], "lower_is_better": [], "group_kind": "g", "groups_per_seed": {}, "metrics_note": ""}


class Spec:
    """What `summarise` reads of a spec: full is the reference; a, b, c are compared with it."""

    methods, reference, learner, development = ("full", "a", "b", "c"), "full", "", False
    budget, schedule, select_on = "steps", "plateau", "loss"

    def __init__(self, seeds, methods=("full", "a", "b", "c")):
        self.seeds, self.methods = list(seeds), tuple(methods)

    def to_dict(self):
        return {"reference": "full", "methods": list(self.methods), "seeds": self.seeds}


def _cells(differences: dict[str, list[float]], seeds: list[int], folds: int = 2) -> list[dict]:
    """Cells of full and of each method, ``differences[method][i]`` above full on seed ``seeds[i]`` (every fold)."""
    cells = []
    for i, seed in enumerate(seeds):
        for fold in range(folds):
            base = {"fold": fold, "seed": seed, "steps": 10, "epochs": 3}
            reference = 0.6 + 0.01 * ((seed * 7 + fold) % 5)  # moved from 0.5, with some spread
            cells.append({**base, "method": "full", "metrics": {"m": reference}, "before": {"m": 0.5}})
            for method, shifts in differences.items():
                jitter = 0.001 * (fold - 0.5)
                cells.append({**base, "method": method, "metrics": {"m": reference + shifts[i] + jitter},
                              "before": {"m": 0.5}})  # fmt: skip
    return cells


def _comparison(differences, seeds):
    return {"spec": {"reference": "full", "seeds": list(seeds)}, "lower_is_better": [],
            "cells": _cells(differences, seeds)}  # fmt: skip


CLEAR = [0.05, 0.06, 0.055, 0.045, 0.052]


# -- spent and development seeds ------------------------------------------------------------------------------------
@pytest.mark.parametrize("seeds", [[100, 101, 102, 103, 104], [0, 1, 2, 3, 4], [199, 200, 201, 202, 203]])
def test_a_claim_on_a_seed_below_200_gets_no_verdict_and_says_why(seeds):
    fresh = verdicts([Claim("a", "m")], _comparison({"a": CLEAR}, range(200, 205)))[0]
    assert fresh["verdict"] == "holds"  # the same differences on fresh seeds
    spent = verdicts([Claim("a", "m")], _comparison({"a": CLEAR}, seeds))[0]
    assert spent["verdict"] == "no verdict" and not spent["holds"]
    assert f"seeds < {FIRST_REPORTED_SEED} (spent/development: " in spent["line"]
    assert math.isnan(spent["p_holm"])  # not tested, so not in the Holm family
    against = verdicts([Claim("a", "m", margin=0.5)], _comparison({"a": CLEAR}, seeds))[0]
    assert against["verdict"] == "no verdict"  # "does not hold" is refused alike


def test_a_table_on_spent_seeds_flags_every_difference_and_the_design_says_so():
    seeds = [100, 101, 102, 103, 104]
    table = summarise(Spec(seeds), FACTS, _cells({"a": CLEAR, "b": CLEAR, "c": CLEAR}, seeds))
    for name in ("a", "b", "c"):
        assert table["summary"][name]["metrics"]["m"]["vs_reference"]["verdict"] == (
            "no verdict: seeds < 200 (spent/development: 100–104)")  # fmt: skip
    fresh = summarise(Spec(range(200, 205), ("full", "a")), FACTS, _cells({"a": CLEAR}, list(range(200, 205))))
    assert fresh["summary"]["a"]["metrics"]["m"]["vs_reference"]["verdict"] == "better"
    _, problem = design(CompareSpec("features", ("full", "warmpot"), seeds=(100, 101, 102)))
    assert problem is not None and "seeds < 200" in problem
    assert design(CompareSpec("features", ("full", "warmpot"), seeds=(200, 201, 202)))[1] is None


def test_physiopfm_no_longer_holds_on_its_spent_seeds():
    result = json.loads((ROOT / "benchmarks" / "results" / "physiopfm.json").read_text())
    assert min(result["comparison"]["spec"]["seeds"]) < FIRST_REPORTED_SEED
    assert all(claim["verdict"] == "no verdict" for claim in result["claims"])
    page = (ROOT / "docs" / "domains" / "physio.md").read_text()
    block = page.split("<!-- rendered: physiopfm -->", 1)[1].split("<!-- end rendered -->", 1)[0]
    assert "**holds**" not in block and "**does not hold**" not in block and "seeds < 200" in block


# -- Holm for "does not hold" ---------------------------------------------------------------------------------------
def test_does_not_hold_takes_the_same_holm_step_as_holds():
    from statsmodels.stats.multitest import multipletests

    seeds = list(range(200, 205))
    # a: below 0 (alone its interval lies below 0: "does not hold", p against 0.019); b, c: far from their bounds;
    # d: noise (the largest p, so that a is not tested at Holm's last, unadjusted step)
    barely = [-0.001, -0.016, -0.004, -0.013, -0.008]
    noise = [0.01, -0.02, 0.015, -0.005, 0.0]
    comparison = _comparison({"a": barely, "b": CLEAR, "c": [-x for x in CLEAR], "d": noise}, seeds)
    alone = verdicts([Claim("a", "m")], comparison)[0]
    assert alone["verdict"] == "does not hold" and alone["p_against"] < statistics.ALPHA / 2
    claims = [Claim("a", "m"), Claim("b", "m"), Claim("c", "m"), Claim("d", "m"),
              Claim("c", "m", kind="not_worse", margin=0.01)]  # fmt: skip
    family = verdicts(claims, comparison)
    directional = [min(v["p"], v["p_against"]) for v in family]
    assert [v["p_holm"] for v in family] == pytest.approx(list(multipletests(directional, method="holm")[1]))
    assert family[0]["p_holm"] > statistics.ALPHA / 2  # the Holm step it now fails
    assert family[0]["verdict"] == "no verdict" and "against the claim" in family[0]["line"]
    assert family[1]["verdict"] == "holds" and family[2]["verdict"] == "does not hold"
    assert family[3]["verdict"] == "no verdict" and "reaches across" in family[3]["line"]
    assert family[4]["verdict"] == "does not hold"  # c is far worse than −0.01: refuted at its Holm step


def test_an_equivalence_that_fails_its_holm_step_against_it_gets_no_verdict():
    seeds = list(range(200, 205))
    outside = [0.021, 0.036, 0.024, 0.033, 0.028]  # outside ±0.02 (p against the equivalence 0.019)
    comparison = _comparison({"a": outside, "b": CLEAR, "d": [0.01, -0.02, 0.015, -0.005, 0.0]}, seeds)
    alone = verdicts([Claim("a", "m", kind="equivalent", margin=0.02)], comparison)[0]
    assert alone["verdict"] == "does not hold"
    claims = [Claim("a", "m", kind="equivalent", margin=0.02), Claim("b", "m"), Claim("d", "m")]
    family = verdicts(claims, comparison)
    assert family[1]["verdict"] == "holds"
    assert family[0]["p_holm"] > statistics.ALPHA / 2 and family[0]["verdict"] == "no verdict"
    assert "against the claim, the Holm-adjusted p" in family[0]["line"]


# -- zero spread ------------------------------------------------------------------------------------------------------
def test_identical_unit_means_give_no_verdict_never_p_zero():
    seeds = list(range(200, 203))
    same = {"spec": {"reference": "full"}, "lower_is_better": [], "cells": []}
    for seed in seeds:  # three identical positive unit means, no spread at all
        base = {"fold": 0, "seed": seed, "steps": 10, "epochs": 3, "before": {"m": 0.5}}
        same["cells"] += [{**base, "method": "full", "metrics": {"m": 0.6 + 0.01 * (seed - 200)}},
                          {**base, "method": "a", "metrics": {"m": 0.6 + 0.01 * (seed - 200) + 0.125}}]  # fmt: skip
    for claim in (Claim("a", "m"), Claim("a", "m", kind="not_worse", margin=0.1),
                  Claim("a", "m", kind="equivalent", margin=0.2)):  # fmt: skip
        result = verdicts([claim], same)[0]
        assert result["verdict"] == "no verdict" and "zero spread across units" in result["line"]
        assert math.isnan(result["p"]) and result["p"] != 0
    assert math.isnan(statistics.one_sided_p([0.125, 0.125, 0.125]))
    assert statistics.zero_spread([0.1, 0.1 + 1e-17, 0.1]) and not statistics.zero_spread([0.1, 0.1001, 0.1])
    table = summarise(Spec(seeds, ("full", "a")), FACTS, same["cells"])
    assert "zero spread" in table["summary"]["a"]["metrics"]["m"]["vs_reference"]["verdict"]


# -- TOST power --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sd, units, margin", [(0.02, 5, 0.02), (0.01, 3, 0.02), (0.03, 10, 0.02), (0.05, 4, 0.1)])
def test_tost_power_is_the_simulated_rejection_rate_of_statsmodels_tost(sd, units, margin):
    from scipy.stats import t
    from statsmodels.stats.weightstats import ttost_paired

    rng = np.random.default_rng(7)
    draws = rng.normal(0.0, sd, (200_000, units))
    mean, se = draws.mean(axis=1), draws.std(axis=1, ddof=1) / math.sqrt(units)
    critical = t.ppf(1 - statistics.ALPHA / 2, units - 1)
    simulated = np.mean((mean - critical * se > -margin) & (mean + critical * se < margin))
    exact = statistics.tost_power(sd, units, margin)
    assert exact == pytest.approx(simulated, abs=4 * math.sqrt(simulated * (1 - simulated) / len(draws)) + 1e-4)
    for row in draws[:200]:  # the simulated rule is statsmodels' TOST at 0.025 per side
        p = ttost_paired(row, np.zeros(units), -margin, margin)[0]
        assert (p < statistics.ALPHA / 2) == bool(abs(row.mean()) + critical * row.std(ddof=1) / math.sqrt(units)
                                                  < margin)  # fmt: skip
    assert statistics.tost_power(sd, units, margin, alpha=statistics.ALPHA / 3) < exact  # a Holm step lowers it


def test_an_equivalence_claim_prints_tost_power_and_others_the_holm_level_mdd():
    seeds = list(range(200, 205))
    comparison = _comparison({"a": [0.004, -0.01, 0.012, 0.0, 0.006], "b": CLEAR}, seeds)
    equivalent, better = verdicts([Claim("a", "m", kind="equivalent", margin=0.02), Claim("b", "m")], comparison)
    power = statistics.tost_power(equivalent_sd(comparison, "a"), 5, 0.02)
    assert equivalent["tost_power"] == pytest.approx(power)
    assert f"TOST power at a true difference of 0: {power:.2f}" in equivalent["line"]
    assert "minimum detectable difference" not in equivalent["line"]
    step = 1 if better["p_holm"] >= equivalent["p_holm"] else 2
    level = statistics.ALPHA / step
    assert better["mdd_holm"] == pytest.approx(statistics.minimum_detectable_difference(equivalent_sd(comparison, "b"),
                                                                                         5, alpha=level))  # fmt: skip
    assert f"at its Holm level ({level:.2g})" in better["line"]


def equivalent_sd(comparison, method):
    """The sd of ``method``'s unit mean differences to full."""
    full = {(c["fold"], c["seed"]): c["metrics"]["m"] for c in comparison["cells"] if c["method"] == "full"}
    mine = [c for c in comparison["cells"] if c["method"] == method]
    means = statistics.unit_means([c["metrics"]["m"] - full[(c["fold"], c["seed"])] for c in mine],
                                  [c["seed"] for c in mine])  # fmt: skip
    return float(np.std(means, ddof=1))


# -- one verdict per difference ----------------------------------------------------------------------------------------
def test_a_table_shows_the_verdict_of_the_claim_that_tests_its_difference():
    seeds = list(range(200, 203))
    # a is clearly better; alone among three two-sided tests it would not pass Holm, as its one-sided claim does
    differences = {"a": [0.05, 0.08, 0.065], "b": [0.01, -0.02, 0.0], "c": [0.0, 0.015, -0.01]}
    cells = _cells(differences, seeds)
    plain = summarise(Spec(seeds), FACTS, cells)
    assert plain["summary"]["a"]["metrics"]["m"]["vs_reference"]["verdict"] == "no difference shown"
    comparison, claims = decided(Spec(seeds), FACTS, cells, [Claim("a", "m")])
    assert claims[0]["verdict"] == "holds"
    entry = comparison["summary"]["a"]["metrics"]["m"]["vs_reference"]
    assert entry["verdict"] == "claim 'better': holds" and entry["p_holm"] == claims[0]["p_holm"]
    others = [comparison["summary"][n]["metrics"]["m"]["vs_reference"] for n in ("b", "c")]
    assert [e["p_holm"] for e in others] == pytest.approx(statistics.holm([e["p"] for e in others]))  # a left out


def _claims_module():
    spec = importlib.util.spec_from_file_location("benchmark_claims_rules", ROOT / "benchmarks" / "claims.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_results_file_gives_one_verdict_per_difference_and_says_when_it_is_conditional():
    claims_module = _claims_module()
    checked = 0
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        result = json.loads(path.read_text())
        if "comparison" not in result:
            continue
        comparison = result["comparison"]
        for claim in result["claims"]:
            against = claim["against"] or comparison["spec"]["reference"]
            paired = comparison["summary"].get(claim["method"], {}).get("metrics", {}).get(claim["metric"], {})
            if against == comparison["spec"]["reference"] and "vs_reference" in paired:
                assert f"': {claim['verdict']}" in paired["vs_reference"]["verdict"], (path.name, claim["text"])
                checked += 1
        text = claims_module.rendered(result)
        assert ("Conditional on this dataset" in text) == bool(comparison["fixed_data"]), path.name
    assert checked > 10
    covariate = json.loads((ROOT / "benchmarks" / "results" / "covariate_shift_weights_d50.json").read_text())
    assert covariate["comparison"]["summary"]["dre-pp"]["metrics"]["mse"]["vs_reference"]["verdict"] == (
        "claim 'better': holds")  # fmt: skip


def test_a_comparison_knows_whether_its_seeds_share_one_dataset(tmp_path):
    from workbench.comparison.design import fixed_data, plan_cells

    generated = CompareSpec("features", ("full", "warmpot"), folds=2, seeds=(200, 201), train_size=60, val_size=20,
                            task_options={"pretrain_epochs": 1})  # fmt: skip
    assert fixed_data(generated) is False and plan_cells(generated)[1]["fixed_data"] is False  # a problem per seed
    assert fixed_data(CompareSpec("features", ("full", "warmpot"), seeds=(200, 201, 202), data=str(tmp_path)))
    assert fixed_data(CompareSpec("rmd17", ("full", "elora"), seeds=(200, 201, 202)))  # the embedded frames


def test_a_data_path_holding_seed_reads_one_dataset_per_seed(tmp_path):
    """``--data DIR/seed{seed}``: each seed's cells read that seed's own folder (the fold plan reads it, the cell's
    run is given it, the cell's data fingerprint is its files'), and the comparison is no longer conditional on one
    dataset; a seed without its folder is refused before anything runs, naming it."""
    from workbench.comparison.cells import data_fingerprint
    from workbench.comparison.design import cell_request, fixed_data, plan_cells
    from workbench.core.errors import UserError
    from workbench.core.registry import tasks

    task = tasks.get("features")()
    for seed in (200, 201):
        task.generate(tmp_path / f"seed{seed}", seed=seed)
    spec = CompareSpec("features", ("full", "warmpot"), folds=2, seeds=(200, 201), data=str(tmp_path / "seed{seed}"))
    spec.check()
    assert not fixed_data(spec)
    cells, facts = plan_cells(spec)
    assert facts["fixed_data"] is False
    by_seed = {cell.seed: cell for cell in cells}
    for seed, cell in by_seed.items():
        assert cell_request(spec, cell, tmp_path / "run", None, None).data == str(tmp_path / f"seed{seed}")
    prints = {seed: data_fingerprint(spec.data_for(seed), "features", {}, seed) for seed in (200, 201)}
    assert prints[200] != prints[201]  # two generated problems, two sets of file digests
    with pytest.raises(UserError, match=r"seed\(s\) 202: .*seed202"):
        CompareSpec("features", ("full", "warmpot"), seeds=(200, 201, 202), data=str(tmp_path / "seed{seed}")).check()
    from workbench.comparison.report import dataset_line

    line = dataset_line({"spec": spec.to_dict(), "fixed_data": False})
    assert line.startswith("One dataset per seed") and "seed{seed}" in line

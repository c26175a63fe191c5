"""`workbench.comparison.statistics` against scipy and statsmodels, and the verdict rules of
`workbench.comparison.report`: seeds are the units, Holm decides, equivalence is two-sided, nothing is said without
units or without learning."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import ttest_1samp

from workbench.comparison import statistics
from workbench.comparison.report import Claim, summarise, verdicts

statsmodels = pytest.importorskip("statsmodels")


@pytest.mark.parametrize("means", [[0.01, 0.03, -0.005, 0.02], [0.3, 0.1, 0.2], [-1.0, 2.0, 0.5, 0.25, 3.0, -0.1]])
def test_t_interval_and_p_values_are_scipys_one_sample_t(means):
    reference = ttest_1samp(means, 0.0)
    assert statistics.t_interval(means) == pytest.approx(tuple(reference.confidence_interval(0.95)))
    assert statistics.two_sided_p(means) == pytest.approx(reference.pvalue)
    greater = ttest_1samp(means, 0.01, alternative="greater").pvalue
    assert statistics.one_sided_p(means, 0.01) == pytest.approx(greater)


def test_equivalence_p_is_statsmodels_tost():
    from statsmodels.stats.weightstats import ttost_paired

    means = np.array([0.004, -0.01, 0.012, 0.0, 0.006])
    expected = ttost_paired(means, np.zeros_like(means), -0.02, 0.02)[0]
    assert statistics.equivalence_p(means, 0.02) == pytest.approx(expected)


@pytest.mark.parametrize("units", [3, 5, 10, 40])
def test_minimum_detectable_difference_is_statsmodels_power_solution(units):
    from statsmodels.stats.power import TTestPower

    effect = TTestPower().solve_power(nobs=units, alpha=0.05, power=0.8, alternative="two-sided")
    assert statistics.minimum_detectable_difference(0.02, units) == pytest.approx(effect * 0.02, rel=1e-6)


def test_units_needed_is_the_fewest_that_detect_the_effect():
    needed = statistics.units_needed(0.02, 0.01)
    assert statistics.minimum_detectable_difference(0.02, needed) <= 0.01
    assert statistics.minimum_detectable_difference(0.02, needed - 1) > 0.01
    assert statistics.units_needed(0.02, 1.0) == statistics.MIN_UNITS
    assert statistics.units_needed(1.0, 1e-4) is None  # more than the most it searches


def test_holm_is_statsmodels_holm_and_skips_untested():
    from statsmodels.stats.multitest import multipletests

    p = [0.01, 0.04, 0.03, 0.2, 0.001]
    assert statistics.holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))
    adjusted = statistics.holm([0.01, float("nan"), 0.03])
    assert math.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.02) and adjusted[2] == pytest.approx(0.03)


def test_zeros_and_equal_differences_give_no_test():
    assert math.isnan(statistics.two_sided_p([0.0, 0.0, 0.0]))
    assert statistics.t_interval([0.0, 0.0, 0.0]) == (0.0, 0.0)
    assert math.isnan(statistics.one_sided_p([0.1, 0.1, 0.1])) and math.isnan(statistics.one_sided_p([0.0] * 4))
    assert math.isnan(statistics.equivalence_p([0.1, 0.1, 0.1], 0.5))
    # a zero among positive differences: the t test, not a signed-rank normal approximation (which gave 0.043)
    with_zero = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert statistics.two_sided_p(with_zero) == pytest.approx(ttest_1samp(with_zero, 0.0).pvalue)


def _cells(differences, seeds, before_move=0.1, lower=()):
    """A comparison of lora against full: one cell per difference, on the given seeds (fold = rank within seed)."""
    cells, folds = [], {}
    for d, seed in zip(differences, seeds):
        fold = folds[seed] = folds.get(seed, -1) + 1
        base = {"fold": fold, "seed": seed, "steps": 10, "epochs": 3}
        reference = 0.5 + before_move + 0.001 * fold + 0.002 * (seed % 7)  # moved by about before_move
        cells.append({**base, "method": "full", "metrics": {"m": reference}, "before": {"m": 0.5}})
        cells.append({**base, "method": "lora", "metrics": {"m": reference + d}, "before": {"m": 0.5}})
    return {"spec": {"reference": "full"}, "lower_is_better": list(lower), "cells": cells}


def _verdict(claim, comparison):
    return verdicts([claim], comparison)[0]


def test_folds_of_one_seed_are_not_independent_units():
    seed_means = [0.02, 0.05, -0.01, 0.04, 0.03]
    differences = [m for m in seed_means for _ in range(3)]  # three identical folds per seed
    seeds = [200 + s for s in range(5) for _ in range(3)]
    result = _verdict(Claim("lora", "m"), _cells(differences, seeds))
    assert result["units"] == 5 and result["cells"] == 15
    assert result["p"] == pytest.approx(ttest_1samp(seed_means, 0.0, alternative="greater").pvalue)
    assert ttest_1samp(differences, 0.0).pvalue < 0.001  # what counting cells as units would have said
    assert result["verdict"] != "holds"


def test_holm_decides_an_interval_that_clears_zero_alone_does_not_hold():
    seeds = [200, 201, 202, 203]
    clear = _cells([0.01, 0.03, 0.02, 0.035], seeds)
    alone = _verdict(Claim("lora", "m"), clear)
    assert alone["interval"][0] > 0 and alone["verdict"] == "holds"
    family = verdicts([Claim("lora", "m"), Claim("lora", "m", margin=0.001), Claim("lora", "m", margin=0.002)], clear)
    assert family[0]["p_holm"] == pytest.approx(3 * alone["p"])
    assert family[0]["interval"][0] > 0 and family[0]["p_holm"] > statistics.ALPHA / 2
    assert family[0]["verdict"] == "no verdict"
    assert "interval clears the bound, the Holm-adjusted p" in family[0]["line"]  # not "reaches across the bound"
    assert "reaches across the bound" in _verdict(Claim("lora", "m"), _cells([0.01, -0.03, 0.02, 0.005], seeds))["line"]


def test_equivalence_is_tested_on_both_sides():
    seeds = [200, 201, 202, 203, 204]
    far_better = _cells([0.2, 0.21, 0.19, 0.2, 0.22], seeds)
    assert _verdict(Claim("lora", "m", kind="not_worse", margin=0.02), far_better)["verdict"] == "holds"
    assert _verdict(Claim("lora", "m", kind="equivalent", margin=0.02), far_better)["verdict"] == "does not hold"
    close = _cells([0.001, -0.002, 0.0015, 0.0, -0.001], seeds)
    assert _verdict(Claim("lora", "m", kind="equivalent", margin=0.02), close)["verdict"] == "holds"
    with pytest.raises(ValueError, match="margin"):
        Claim("lora", "m", kind="equivalent")


def test_fewer_than_three_units_or_a_reference_that_did_not_move_give_no_verdict():
    two_cells = _verdict(Claim("lora", "m"), _cells([0.2, 0.25], [200, 200]))
    assert two_cells["verdict"] == "no verdict" and "at least 3" in two_cells["line"] and not two_cells["holds"]
    seeds = [200, 201, 202, 203, 204]
    still = _cells([0.05, 0.06, 0.05, 0.055, 0.045], seeds, before_move=0.0)
    for cell in still["cells"]:  # the reference jitters around the base model
        if cell["method"] == "full":
            cell["metrics"]["m"] = 0.5 + (0.01 if cell["seed"] % 2 else -0.01)
    result = _verdict(Claim("lora", "m"), still)
    assert result["verdict"] == "no verdict" and "full did not move from the base model" in result["line"]
    assert "10 steps per cell" in result["line"]
    moved = _verdict(Claim("lora", "m"), _cells([0.05, 0.06, 0.05, 0.055, 0.045], seeds))
    assert moved["verdict"] == "holds"


def test_a_table_says_no_verdict_below_three_units_and_names_the_unmoved_reference():
    class Spec:
        methods, reference, learner, development = ("full", "lora"), "full", "", False
        budget, schedule, select_on = "steps", "plateau", "loss"

        def to_dict(self):
            return {"reference": "full", "methods": list(self.methods)}

    facts = {"metrics": ["m"], "lower_is_better": [], "group_kind": "g", "groups_per_seed": {}, "metrics_note": ""}
    one_seed = summarise(Spec(), facts, _cells([0.2, 0.25], [200, 200])["cells"])
    assert one_seed["summary"]["lora"]["metrics"]["m"]["vs_reference"]["verdict"].startswith("no verdict: 1 unit")
    seeds = [200, 201, 202, 203, 204]
    shown = summarise(Spec(), facts, _cells([0.05, 0.06, 0.05, 0.055, 0.045], seeds)["cells"])
    paired = shown["summary"]["lora"]["metrics"]["m"]["vs_reference"]
    assert paired["verdict"] == "better" and paired["units"] == 5 and paired["mdd"] > 0


def test_every_table_states_how_far_its_reference_moved():
    from workbench.comparison.report import reference_line, reference_moved

    seeds = [200, 201, 202, 203, 204]
    full = [c for c in _cells([0.05, 0.06, 0.05, 0.055, 0.045], seeds)["cells"] if c["method"] == "full"]
    moved = reference_moved(full, "m")
    mean = np.mean([c["metrics"]["m"] - c["before"]["m"] for c in full])  # one cell per seed
    spec = {"reference": "full", "learner": ""}
    line = reference_line({"spec": spec, "reference_moved": {"m": moved}}, "m")
    assert line.startswith("Reference on m: full moved from the base model") and f"{mean:+.3f}" in line
    still = {"spec": spec, "reference_moved": {"m": {**moved, "moved": False}}}
    assert reference_line(still, "m").startswith("Nothing trained on m (full did not move")
    untrained = {"spec": {"reference": "base", "learner": "warmpot"}, "reference_moved": {"m": None}}
    expected = "Learner (warmpot) on m: takes no optimizer step here, so it has no after − before."
    assert reference_line(untrained, "m") == expected


def test_compare_plan_prints_the_minimum_detectable_difference_and_runs_nothing(tmp_path, capsys, monkeypatch):
    from workbench.cli import run as cli

    monkeypatch.chdir(tmp_path)
    code = cli(["compare", "--plan", "--domain", "features", "--methods", "full,warmpot", "--folds", "3",
                "--seeds", "100-104", "--sd", "0.02", "--effect", "0.03"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "5 unit(s)" in out
    assert f"MDD {statistics.minimum_detectable_difference(0.02, 5):.3g}" in out and "MDD 0.0336" in out
    assert f"to detect 0.03: {statistics.units_needed(0.02, 0.03)} seeds" in out
    assert list(tmp_path.iterdir()) == []  # no run folder, no cell
    code = cli(["compare", "--plan", "--domain", "features", "--methods", "full,warmpot", "--seeds", "100-101",
                "--sd", "0.02"])  # fmt: skip
    assert code == 0 and "every verdict of this comparison will read 'no verdict'" in capsys.readouterr().out


def test_compare_plan_reads_a_pilots_seed_spread(tmp_path, capsys):
    import json
    from pathlib import Path

    from workbench.cli import run as cli

    stored = json.loads((Path(__file__).parents[1] / "benchmarks/results/partial_da_weights.json").read_text())
    (tmp_path / "pilot").mkdir()
    (tmp_path / "pilot" / "comparison.json").write_text(json.dumps(stored["comparison"]))
    code = cli(["compare", "--plan", "--domain", "features", "--methods", "full,warmpot", "--folds", "3",
                "--seeds", "200-209", "--pilot", str(tmp_path / "pilot")])  # fmt: skip
    out = capsys.readouterr().out
    sd = stored["comparison"]["summary"]["warmpot"]["metrics"]["balanced_accuracy"]["vs_reference"]["unit_sd"]
    assert code == 0 and f"MDD {statistics.minimum_detectable_difference(sd, 10):.3g}" in out
    from workbench.core.errors import UserError

    with pytest.raises(UserError, match="--plan needs --sd"):
        cli(["compare", "--plan", "--domain", "features", "--methods", "full,warmpot"])

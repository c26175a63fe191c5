"""The verdict line under every ``workbench adapt`` table and in ``report.md`` (`workbench.core.verdicts.verdict`):
the run's method better than, worse than, or not told apart from the best baseline, by the paired interval over the
test items, direction-aware, with the ``workbench compare`` command that settles it across seeds; and console
tables kept within `workbench.run.report.CONSOLE_WIDTH`."""

from __future__ import annotations

import dataclasses
import doctest
import re

from workbench.core import verdicts
from workbench.run import report


def _metrics(estimate, low, high, baselines=None, metric="forces_mae"):
    """A run of method "elora" beside "full" and "readout" (full the best in ``metric`` unless ``baselines`` says)."""
    baselines = baselines or {"full": {metric: 10.0}, "readout": {metric: 30.0}}
    return {
        "task": "rmd17", "method": "elora", "samples": {"train": 50, "val": 10, "test": 200},
        "test_units": {"items": 200, "groups": 5, "item_kind": "frame", "group_kind": "trajectory block",
                       "resamples": 1000},
        "baselines": baselines,
        "differences": {f"elora − {name}": {metric: {"estimate": estimate, "low": low, "high": high}}
                        for name in baselines},
    }  # fmt: skip


def test_worse_for_a_lower_is_better_metric():
    line = verdicts.verdict(_metrics(1.13, 0.29, 2.02), ["forces_mae", "energy_mae"], {"forces_mae", "energy_mae"})
    assert line.startswith("elora is worse than full (the best baseline) in forces_mae (lower is better): elora − "
                           "full = +1.130, 95 % interval [+0.290, +2.020] over 200 frames from 5 trajectory blocks")
    assert "not over training seeds" in line
    assert line.endswith("`workbench compare --domain rmd17 --methods elora,full --seeds 200-202`")


def test_better_for_a_lower_is_better_metric_and_worse_for_a_higher_is_better_one():
    assert verdicts.verdict(_metrics(-1.0, -2.0, -0.5), ["forces_mae"], {"forces_mae"}).startswith(
        "elora is better than full (the best baseline) in forces_mae (lower is better): elora − full = -1.000")
    auroc = _metrics(-0.062, -0.131, -0.006, {"full": {"auroc": 0.9}, "readout": {"auroc": 0.7}}, "auroc")
    assert verdicts.verdict(auroc, ["auroc"]).startswith(
        "elora is worse than full (the best baseline) in auroc (higher is better): elora − full = -0.062, 95 % "
        "interval [-0.131, -0.006]")
    higher = _metrics(0.05, 0.01, 0.09, {"full": {"auroc": 0.9}, "readout": {"auroc": 0.7}}, "auroc")
    assert verdicts.verdict(higher, ["auroc"]).startswith("elora is better than full")


def test_cannot_tell_and_the_best_baseline_follows_the_direction():
    line = verdicts.verdict(_metrics(0.2, -0.1, 0.5), ["forces_mae"], {"forces_mae"})
    assert line.startswith("elora and full (the best baseline) cannot be told apart in forces_mae (lower is better)")
    # higher-is-better read of the same numbers: readout (30) is then the best baseline
    assert verdicts.verdict(_metrics(0.2, -0.1, 0.5), ["forces_mae"]).startswith("elora and readout (the best")


def test_no_line_without_baselines_or_without_an_interval():
    assert verdicts.verdict({**_metrics(1, 0, 2), "baselines": {}}, ["forces_mae"]) == ""
    assert verdicts.verdict(_metrics(1.0, None, None), ["forces_mae"], {"forces_mae"}) == ""


def test_the_example_runs_and_the_command_names_compare_s_default_seeds():
    from workbench.cli.compare import _seeds_text
    from workbench.comparison.design import CompareSpec

    assert doctest.testmod(verdicts).failed == 0
    seeds = next(f.default for f in dataclasses.fields(CompareSpec) if f.name == "seeds")
    assert verdicts.COMPARE_SEEDS == _seeds_text(seeds)


def _wide_metrics():
    names = ("accuracy", "macro_f1", "source_accuracy", "predicted_class_entropy", "predicted_target_homophily")
    cost = {"trainable_parameters": 18636, "seconds_per_epoch": 0.07, "training_step_bytes": 2**20, "epochs": 2}
    metrics = {"task": "csbm", "method": "homophily", "samples": {"train": 1, "val": 1, "test": 1000},
               "before": dict.fromkeys(names, 0.33), "after": dict.fromkeys(names, 0.42), "baselines": {},
               "costs": {"homophily": cost}, "intervals": {"after": {"accuracy": [0.39, 0.45]}}}  # fmt: skip
    return metrics, names


def test_a_wide_table_wraps_its_column_names_and_puts_the_costs_under_it():
    metrics, names = _wide_metrics()
    text = report.table(metrics, names, "homophily")
    assert max(map(len, text.splitlines())) <= report.CONSOLE_WIDTH
    assert "predicted_" in text and "homophily" in text and "18,636" in text and "0.42 [0.39, 0.45]" in text
    errors = ("forces_mae_mev_per_a", "forces_rmse_mev_per_a", "energy_mae_mev", "energy_rmse_mev",
              "energy_mae_mev_per_atom")  # five columns of "230.24 [221.80, 237.63]": packed into two blocks
    wide = {**metrics, "before": dict.fromkeys(errors, 230.24), "after": dict.fromkeys(errors, 122.88),
            "intervals": {"before": dict.fromkeys(errors, [221.8, 237.63]),
                          "after": dict.fromkeys(errors, [100.6, 147.06])}}
    lines = report.table(wide, errors, "homophily", set(errors)).splitlines()
    assert max(map(len, lines)) <= report.CONSOLE_WIDTH and sum(line.startswith("model") for line in lines) == 2
    assert all(any(name in line for line in lines) for name in errors[:4]) and "per_atom" in " ".join(lines)
    narrow = report.table(metrics, ("accuracy",), "homophily")
    assert "  trainable params  s/epoch  step MiB  epochs run" in narrow  # a narrow table keeps one header line


def test_a_real_run_prints_the_verdict_under_its_table(tmp_path, capsys):
    from workbench.cli import run

    assert run(["adapt", "--domain", "features", "--epochs", "2", "--train-size", "200", "--out",
                str(tmp_path / "run")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    said = re.search(r"^warmpot (is better than|is worse than|and) \S+ \(the best baseline\)", out, re.M)
    assert said, out
    assert re.search(r"^  `workbench compare --domain features --methods warmpot,\S+ --seeds 200-202`$", out, re.M)
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "(the best baseline)" in markdown and "--seeds 200-202" in markdown


def test_a_long_line_under_the_table_wraps_and_keeps_the_interval_whole():
    line = verdicts.verdict(_metrics(1.13, 0.29, 2.02), ["forces_mae"], {"forces_mae"})
    wrapped = report._wrapped(line).splitlines()
    assert max(map(len, wrapped)) <= report.CONSOLE_WIDTH and wrapped[-1].startswith("  `workbench compare")
    assert "[+0.290, +2.020]" in " ".join(wrapped)

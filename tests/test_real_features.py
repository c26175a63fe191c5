"""The features task on a real published table (tests/data/real/features/README.md): the diabetes study's patients
split by age, a covariate shift read from CSV as a user would give it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench import cli

PAIR = Path(__file__).parent / "data" / "real" / "features" / "diabetes-by-age"


def test_data_check_on_the_real_pair(capsys):
    assert cli.run(["data", "check", "features", "--data", str(PAIR)]) == 0
    out = capsys.readouterr().out
    assert "214 samples × 10 features" in out and "228 labelled" in out and "ok:" in out


def test_density_ratio_methods_on_the_real_pair(tmp_path):
    out = tmp_path / "run"
    cli.run(["adapt", "--domain", "features", "--data", str(PAIR), "--method", "dre-pp", "--train-size", "170",
             "--val-size", "44", "--epochs", "2", "--baselines", "full", "--quiet", "--out", str(out)])  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["samples"] == {"train": 170, "val": 44, "test": 114}
    assert {"mse", "mae", "r2"} <= set(metrics["after"]) and "full" in metrics["baselines"]
    assert metrics["skipped_records"]["skipped"] == 0


@pytest.mark.slow
def test_default_density_ratio_comparison_on_the_real_pair(tmp_path):
    out = tmp_path / "run"
    cli.run(["adapt", "--domain", "features", "--data", str(PAIR), "--method", "dre-pp", "--train-size", "170",
             "--val-size", "44", "--quiet", "--out", str(out)])  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["baselines"]) == {"full", "dre-ulsif", "dre-kliep", "dre-logistic"}

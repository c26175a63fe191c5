"""The reduced grid of `benchmarks/interval_coverage.py`: the default interval covers and its claims keep their level
at every shape with at least three units; the bootstrap used before issue 35 does not."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _coverage():
    spec = importlib.util.spec_from_file_location("interval_coverage", ROOT / "benchmarks" / "interval_coverage.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_unit_mean_t_covers_and_keeps_false_holds_at_five_percent():
    coverage = _coverage()
    rows = coverage.grid(1500, shapes=((3, 3), (5, 3)), correlations=(0.0, 0.9), procedures=("unit-mean t",))
    assert len(rows) == 8
    for row in rows:
        assert row["coverage"] >= 0.93, row
        assert row["false_holds"] <= 0.05, row


def test_the_unit_mean_t_never_holds_below_three_units():
    coverage = _coverage()
    rows = coverage.grid(300, shapes=((1, 6), (2, 3)), correlations=(0.9,), noises=("normal",),
                         procedures=("unit-mean t",))  # fmt: skip
    assert all(row["false_holds"] == row["power"] == 0.0 for row in rows)


def test_the_cell_bootstrap_used_before_undercovers_when_folds_are_correlated():
    coverage = _coverage()
    (row,) = coverage.grid(1000, shapes=((2, 3),), correlations=(0.9,), noises=("normal",),
                           procedures=("bootstrap (before)",))  # fmt: skip
    assert row["coverage"] < 0.8 and row["false_holds"] > 0.05

"""``workbench compare --side-by-side``: the seeds of a method and fold meet at training and train as one batched
computation (`workbench.lockstep`, `workbench.seed_batch`); their cells equal the cells run one seed at a time."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from workbench import lockstep
from workbench.comparison import CompareSpec, compare, rerun_cell


def records(out: Path) -> dict[str, dict]:
    return {f"{p.parent.parent.name}/{p.parent.name}": json.loads(p.read_text())
            for p in sorted((out / "cells").glob("*/*/cell.json"))}  # fmt: skip


def test_seeds_side_by_side_equal_the_seeds_one_at_a_time(tmp_path):
    spec = CompareSpec(domain="features", methods=("full", "warmpot"), folds=2, seeds=(0, 1, 2), epochs=3)
    compare(spec, tmp_path / "alone", quiet=True)
    compare(spec, tmp_path / "together", quiet=True, side_by_side=True)
    assert logging.getLogger("workbench").propagate  # the cells' overlapping quiet blocks gave the logger back
    alone, together = records(tmp_path / "alone"), records(tmp_path / "together")
    assert alone.keys() == together.keys() and len(alone) == 12
    for name, record in together.items():
        for metric, value in alone[name]["metrics"].items():
            assert math.isclose(record["metrics"][metric], value, rel_tol=1e-6, abs_tol=1e-9), (name, metric)
        assert record["steps"] == alone[name]["steps"] and record["kept_epoch"] == alone[name]["kept_epoch"]
        assert "seeds_side_by_side" not in alone[name]
    # full keeps the task's loss: batched, three seeds at a time; warmpot weights its loss by the cell's own
    # transport plan: one seed at a time, and its records say why
    assert {r["seeds_side_by_side"] for n, r in together.items() if n.startswith("full/")} == {3}
    warmpot = [r for n, r in together.items() if n.startswith("warmpot/")]
    assert {r["seeds_side_by_side"] for r in warmpot} == {1} and all("batchable" in r["side_by_side_note"]
                                                                     for r in warmpot)  # fmt: skip
    report = (tmp_path / "together" / "report.md").read_text()
    assert "- Seeds side by side: full: 6/6 cells batched (3 seeds at a time" in report
    assert "warmpot: 0/6 cells batched" in report
    rerun = rerun_cell(tmp_path / "together", "full/fold1-seed2")  # alone, within the side-by-side tolerance
    assert rerun["matches"], rerun["differences"]


def test_threads_take_turns_and_an_error_reaches_the_caller():
    order = []

    def job(name, fail=False):
        def run():
            order.append(f"{name} starts")
            if fail:
                raise RuntimeError(f"{name} failed")
            order.append(f"{name} ends")
            return name

        return run

    meeting = lockstep.Lockstep(["a", "b", "c"])
    assert meeting.run({"a": job("a"), "b": job("b"), "c": job("c")}) == {"a": "a", "b": "b", "c": "c"}
    assert order == ["a starts", "a ends", "b starts", "b ends", "c starts", "c ends"]  # one at a time, in order
    with pytest.raises(RuntimeError, match="b failed"):
        lockstep.Lockstep(["a", "b", "c"]).run({"a": job("a"), "b": job("b", fail=True), "c": job("c")})
    assert lockstep.current() is None  # the caller's thread is in no lockstep

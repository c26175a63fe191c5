"""Fixed costs paid once per comparison (`workbench.core.reuse`): the same numbers in every cell as computed alone."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.comparison.design import CompareSpec
from workbench.comparison.execute import compare
from workbench.core import reuse


def cell_metrics(out: Path) -> dict[str, dict]:
    return {f"{p.parent.parent.name}/{p.parent.name}": json.loads(p.read_text())["metrics"]
            for p in sorted((out / "cells").glob("*/*/cell.json"))}  # fmt: skip


@pytest.mark.parametrize(
    "domain, methods, epochs",
    [("features", ("warmpot", "full"), 2), ("sleepedf", ("lora", "full"), 1)],
)
def test_a_comparison_gives_the_same_cells_with_and_without_sharing(tmp_path, domain, methods, epochs):
    spec = CompareSpec(domain=domain, methods=methods, folds=2, seeds=(0, 1), epochs=epochs)
    reuse.clear()
    compare(spec, tmp_path / "alone", quiet=True, share=False)
    computed = []
    original = reuse.shared

    def counted(step, key, make, task=None):
        return original(step, key, lambda: (computed.append(step), make())[1], task)

    reuse.shared = counted
    try:
        compare(spec, tmp_path / "shared", quiet=True, share=True)
    finally:
        reuse.shared = original
        reuse.clear()
    alone, shared = cell_metrics(tmp_path / "alone"), cell_metrics(tmp_path / "shared")
    assert len(alone) == 2 * 2 * len(methods) and alone == shared  # bit for bit
    counts = [computed.count(step) for step in ("read", "model", "prepared", "before")]
    assert counts == [2, 2, 4, 4]  # per seed, per seed, per (fold, seed), per (fold, seed): not per cell
    assert not list((tmp_path / "shared" / "cells").glob("*/*/report.md"))  # cells write no report of their own
    assert (tmp_path / "shared" / "report.md").is_file()


def test_a_shared_step_runs_once_and_leaves_the_generators_and_task_as_it_did():
    class Task:
        pass

    calls = []

    def make(task):
        calls.append(1)
        task.scale = torch.rand(1).item()  # draws from the global generator and sets an attribute
        return {"values": torch.rand(3)}

    def run(share):
        torch.manual_seed(5)
        np.random.seed(5)
        random.seed(5)
        task = Task()
        with reuse.sharing(share):
            value = reuse.shared("step", {"seed": 5}, lambda: make(task), task)
        return value, task.scale, torch.rand(2), np.random.rand(), random.random()

    reuse.clear()
    try:
        alone = run(False)
        first, again = run(True), run(True)
    finally:
        reuse.clear()
    assert len(calls) == 2  # once alone, once shared: the second shared call reused it
    for result in (first, again):
        assert torch.equal(result[0]["values"], alone[0]["values"]) and result[1] == alone[1]
        assert torch.equal(result[2], alone[2]) and result[3:] == alone[3:]  # the draws after it are the same
    first[0]["values"].add_(1)  # a cell changes what it got: the next one gets the value as made
    assert torch.equal(run(True)[0]["values"], alone[0]["values"])
    reuse.clear()


def test_other_generator_state_or_no_key_is_never_shared():
    calls = []
    with reuse.sharing():
        for seed in (1, 2, 1):
            torch.manual_seed(seed)
            reuse.shared("step", "same key", lambda: calls.append(seed))
        reuse.shared("step", None, lambda: calls.append("no key"))
        reuse.shared("step", None, lambda: calls.append("no key"))
    reuse.clear()
    assert calls == [1, 2, "no key", "no key"]


def test_kept_values_are_bounded():
    with reuse.sharing():
        for key in range(reuse.KEPT + 5):
            reuse.shared("step", key, lambda: key)
    assert len(reuse._kept) == reuse.KEPT
    reuse.clear()


def test_a_measurement_is_taken_once_per_worker_while_sharing():
    taken = []
    for share in (False, False, True, True):
        with reuse.sharing(share):
            assert reuse.measured_once("probe", {"method": "lora"}, lambda: taken.append(share) or len(taken)) >= 1
    reuse.clear()
    assert taken == [False, False, True]  # every time alone; once while sharing

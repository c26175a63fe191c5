"""Grouped folds (``workbench compare``) of the EEG tasks and the physio task, on the embedded data: `Task.hold_out`
puts exactly the held-out subjects (records with ``--split-by record``; the target site's patients) in the test and
validation splits and none of their samples in training; a bad split names the data; a run re-split by a fold keeps
its split in ``metrics.json`` and ``workbench.evaluate`` re-applies it.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("braindecode")
pytest.importorskip("edfio")
pytest.importorskip("wfdb")

import workbench  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.core.registry import tasks  # noqa: E402

TINY = {"epochs": 1, "train_size": 12, "val_size": 6, "batch_size": 6, "baselines": (), "quiet": True}
#: (task, task options, the fold's validation and test groups, the group of a sample)
FOLDS = {
    "sleepedf": ("sleepedf", {}, ["01"], ["04", "05"], lambda s: s.subject),
    "sleepedf-records": ("sleepedf", {"split_by": "record"}, ["SC4011"], ["SC4051"], lambda s: s.record),
    "motor-imagery": ("motor-imagery", {}, ["S002"], ["S007", "S008"], lambda s: s.subject),
    "physio": ("physio", {"target_site": "B"}, ["B02"], ["B05", "B06"], lambda s: s.subject),
}


def _read(name: str, options: dict):
    task = tasks.get(name)(**options)
    task.progress = False
    return task, task.read(None, seed=0)


@pytest.mark.parametrize("case", list(FOLDS))
def test_hold_out_puts_exactly_the_held_out_groups_in_validation_and_test(case):
    name, options, val, test, group_of = FOLDS[case]
    task, raw = _read(name, options)
    assert "folds" in task.capabilities
    groups = task.split_groups(raw)
    assert groups == sorted(set(groups)) and set(val + test) < set(groups)
    before = {part: list(groups_) for part, groups_ in raw.split.items()}
    held = task.hold_out(raw, {"val": val, "test": test})
    assert raw.split == before  # the task's own split is left as it was
    assert held.split == {"train": sorted(set(groups) - set(val + test)), "val": val, "test": test}
    data, _ = task.prepare(task.load_model(None), held, 10_000, 10_000, 0)
    assert {group_of(s) for s in data.test} == set(test) and {group_of(s) for s in data.val} == set(val)
    assert {group_of(s) for s in data.train} == set(groups) - set(val + test)  # no held-out sample trains
    assert data.summary["split"] == held.split
    assert {group_of(s) for s in task.test_samples(task.load_model(None), held)} == set(test)


@pytest.mark.parametrize("case", ["sleepedf", "sleepedf-records", "physio"])
def test_a_bad_split_names_the_data(case):
    name, options, val, test, _ = FOLDS[case]
    task, raw = _read(name, options)
    kind = task.group_kind
    assert kind == {"sleepedf": "subject", "sleepedf-records": "record", "physio": "patient"}[case]
    with pytest.raises(UserError, match=rf"{raw.source}: the test {kind}\(s\) nobody of the split are not in the"):
        task.hold_out(raw, {"val": val, "test": ["nobody"]})
    with pytest.raises(UserError, match=rf"{raw.source}: {kind}\(s\) {test[0]} are in both the validation and the"):
        task.hold_out(raw, {"val": [test[0]], "test": test})
    with pytest.raises(UserError, match=rf"{raw.source}: the split names no validation {kind}s"):
        task.hold_out(raw, {"test": test})
    with pytest.raises(UserError, match=rf"{raw.source}: the split holds out every {kind}"):
        task.hold_out(raw, {"val": val, "test": [g for g in task.split_groups(raw) if g not in val]})


@pytest.mark.parametrize("case, method", [("sleepedf", "lora"), ("motor-imagery", "readout"), ("physio", "lora")])
def test_a_run_on_a_fold_keeps_its_split_and_evaluate_reapplies_it(tmp_path, case, method):
    name, options, val, test, _ = FOLDS[case]
    out = tmp_path / "run"
    workbench.adapt(name, method, out=str(out), split={"val": val, "test": test}, **options, **TINY)
    metrics = json.loads((out / "metrics.json").read_text())
    split = metrics["data_summary"]["split"]
    assert split["val"] == val and split["test"] == test and not set(split["train"]) & set(val + test)
    _, raw = _read(name, options)
    assert raw.split["test"] != test  # the task's own split would score other subjects
    subjects = (raw.windows if hasattr(raw, "windows") else raw.beats).subjects.tolist()
    counts = metrics["data_summary"].get("windows") or metrics["data_summary"]["beats"]
    assert counts["test"] == sum(subjects.count(group) for group in test)
    assert workbench.evaluate(out, out=out.parent / "evaluation.json") == pytest.approx(metrics["after"], abs=1e-6)
    assert json.loads((out.parent / "evaluation.json").read_text())["test_samples"] == counts["test"]

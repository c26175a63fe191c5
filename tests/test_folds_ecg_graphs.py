"""Grouped folds of the ``ptbxl`` and ``csbm`` tasks (``workbench compare``): `Task.hold_out` puts exactly the
held-out groups (ECG patients, or records where the data have none; target-graph nodes) in the test split, no test
group reaches training, a bad split is a clear error naming the data, and a run adapted on a fold re-scores as
recorded (``workbench.evaluate`` re-applies the split)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from workbench.domains.ecg.readers import EMBEDDED_PTBXL

import workbench
from workbench.core.errors import UserError
from workbench.core.registry import tasks

CINC = Path(__file__).parent / "data" / "real" / "ecg" / "cinc2021"
#: Metrics the csbm task scores on the target's test nodes (``source_accuracy`` is on source nodes: `evaluate` of a
#: finished run scores every labelled source node, the run's "after" only its held-out validation nodes).
TARGET_METRICS = ("accuracy", "macro_f1", "balanced_accuracy", "predicted_target_homophily")


def split_records(task, raw) -> dict[str, set[str]]:
    """Record ids of each split of ``raw`` as the run would get them (`Task.prepare`, every record)."""
    data, _ = task.prepare(task.load_model(None), raw, 10**6, 10**6, seed=0)
    return {name: {sample.record for sample in getattr(data, name)} for name in ("train", "val", "test")}


# -- ptbxl ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shared_patients(tmp_path_factory) -> tuple[Path, Any, Any]:
    """(folder, task, raw): the embedded set's first 60 rows in PTB-XL's layout, three consecutive records per
    patient (``patient_id`` 20000 + (ecg_id - 1) // 3), read by the task."""
    folder = tmp_path_factory.mktemp("ptbxl") / "shared-patients"
    shutil.copytree(EMBEDDED_PTBXL, folder)
    table = pd.read_csv(folder / "ptbxl_database.csv", index_col="ecg_id").head(60)
    table["patient_id"] = 20000.0 + (table.index.to_numpy() - 1) // 3
    table.to_csv(folder / "ptbxl_database.csv")
    task = tasks.get("ptbxl")()
    task.progress = False
    return folder, task, task.read(folder, 0)


def test_ptbxl_hold_out_keeps_every_patient_in_one_split(shared_patients):
    folder, task, raw = shared_patients
    table = pd.read_csv(folder / "ptbxl_database.csv", index_col="ecg_id")
    patient_of = {str(ecg_id): str(int(patient)) for ecg_id, patient in table["patient_id"].items()}
    groups = task.split_groups(raw)
    assert task.group_kind == "patient" and groups == sorted(set(patient_of.values()))
    split = {"val": groups[1::4], "test": groups[2::4]}
    parts = split_records(task, task.hold_out(raw, split))
    assert set().union(*parts.values()) == set(patient_of)  # every record is in a split
    for name in ("val", "test"):
        assert parts[name] == {record for record, patient in patient_of.items() if patient in split[name]}, name
    held = set(split["val"]) | set(split["test"])
    assert not {patient_of[record] for record in parts["train"]} & held


def test_ptbxl_hold_out_without_patient_ids_holds_out_records():
    """CinC 2021 folders have no patient ids: each record is its own group (E07502 has no superclass: not used)."""
    task = tasks.get("ptbxl")()
    raw = task.read(CINC, 0)
    groups = task.split_groups(raw)
    assert task.group_kind == "record"
    assert groups == sorted(path.stem for path in CINC.glob("*.hea") if path.stem != "E07502")
    split = {"val": ["HR06001", "JS20001"], "test": ["E07500", "HR06002", "HR06003"]}
    parts = split_records(task, task.hold_out(raw, split))
    assert parts["val"] == set(split["val"]) and parts["test"] == set(split["test"])
    assert parts["train"] == set(groups) - set(split["val"]) - set(split["test"])


def test_ptbxl_bad_split_names_the_data(shared_patients):
    folder, task, raw = shared_patients
    groups = task.split_groups(raw)
    where = re.escape(str(folder))
    with pytest.raises(UserError, match=rf"{where}: the test patient\(s\) 99999 of the split are not in the data"):
        task.hold_out(raw, {"val": groups[:2], "test": ["99999"]})
    with pytest.raises(UserError, match=rf"{where}: patient\(s\) {groups[1]} are in both"):
        task.hold_out(raw, {"val": groups[:2], "test": groups[1:4]})
    with pytest.raises(UserError, match=rf"{where}: the split holds out no validation patient"):
        task.hold_out(raw, {"test": groups[:4]})
    missing = replace(raw.records, patients=np.where(raw.records.record_ids == "5", "", raw.records.patients))
    with pytest.raises(UserError, match=rf"{where}/ptbxl_database.csv: field 'patient_id': .* none for ecg_id 5"):
        task.hold_out(replace(raw, records=missing), {"val": groups[:2], "test": groups[2:4]})


def test_ptbxl_run_on_a_fold_rescores_as_recorded(shared_patients, tmp_path):
    folder, task, raw = shared_patients
    groups = task.split_groups(raw)
    split = {"val": groups[::4], "test": groups[1::4]}  # 5 patients each, 15 records
    run = workbench.adapt(
        domain="ptbxl", method="lora", data=str(folder), split=split, epochs=1, train_size=8, baselines=(),
        quiet=True, out=str(tmp_path / "run"),
    )  # fmt: skip
    assert run.metrics["samples"] == {"train": 8, "val": 15, "test": 15}
    rescored = workbench.evaluate(run.path, device="cpu", out=tmp_path / "evaluations")
    for name in task.metrics:
        assert rescored[name] == pytest.approx(run.metrics["after"][name], abs=1e-6), name
    record = tmp_path / "evaluations" / "run-shared-patients.json"  # outside the run: <run name>-<data stem>.json
    assert json.loads(record.read_text())["test_samples"] == 15


# -- csbm ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def csbm():
    task = tasks.get("csbm")(nodes=120, feature_dim=8)
    return task, task.read(None, 0)


def test_csbm_hold_out_scores_exactly_the_test_nodes_and_trains_on_no_target_label(csbm):
    task, raw = csbm
    groups = task.split_groups(raw)
    assert task.group_kind == "target node" and groups == [f"node{i}" for i in range(120)]
    split = {"val": groups[1::3], "test": groups[::3]}
    test_nodes = sorted(int(group.removeprefix("node")) for group in split["test"])
    held = task.hold_out(raw, split)
    model = task.load_model(None)
    data, _ = task.prepare(model, held, 1, 1, seed=0)
    (test,) = data.test
    assert torch.nonzero(test.target.labelled).flatten().tolist() == test_nodes
    assert torch.equal(test.target.y[test_nodes], raw.target_graph.y[test_nodes])
    assert all(bool((sample.target.y == -1).all()) for sample in (*data.train, *data.val, *data.target))
    (rescored,) = task.test_samples(model, held)
    assert torch.nonzero(rescored.target.labelled).flatten().tolist() == test_nodes
    assert bool(raw.target_graph.labelled.all())  # the read pair is not changed


def test_csbm_bad_split_names_the_target_graph(csbm):
    task, raw = csbm
    with pytest.raises(UserError, match=r"CSBM target: the test target node\(s\) node120 of the split are not in"):
        task.hold_out(raw, {"test": ["node0", "node120"]})
    with pytest.raises(UserError, match=r"CSBM target: target node\(s\) node3 are in both"):
        task.hold_out(raw, {"val": ["node3"], "test": ["node3", "node4"]})


def test_csbm_run_on_a_fold_rescores_as_recorded(tmp_path):
    groups = [f"node{i}" for i in range(120)]
    run = workbench.adapt(
        domain="csbm", split={"val": groups[1::4], "test": groups[::4]}, epochs=2, baselines=(), quiet=True,
        nodes=120, feature_dim=8, out=str(tmp_path / "run"),
    )  # fmt: skip
    assert run.metrics["data_summary"]["target_test_nodes"] == 30
    rescored = workbench.evaluate(run.path, device="cpu")
    for name in TARGET_METRICS:
        assert rescored[name] == pytest.approx(run.metrics["after"][name], abs=1e-6), name

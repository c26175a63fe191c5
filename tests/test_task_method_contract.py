"""Every task × every method, driven by the registries: a method that says it applies to a task (its ``check``
passes on the task's data and model) runs one tiny epoch end to end and writes a valid run directory; one that
does not is refused with a clear message before the run directory appears. The table below is what each task
claims today — a change of claims must show up here.

Every pair's ``adapt``, ``evaluate`` and (where the task has batch prediction) ``predict`` run under the placement
harness (`workbench.core.placement_harness`): the run device is told apart from the CPU, so a tensor a hook leaves on
the host fails here as it would on a GPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import write_rmd17_layout

import workbench
from workbench.core.errors import UserError
from workbench.core.placement_harness import placement_harness
from workbench.core.registry import methods, tasks

DOMAINS = Path(__file__).resolve().parents[1] / "domains"
#: Inputs of ``workbench predict`` for the tasks with batch prediction: files from the embedded data.
PREDICT_INPUTS = {
    "ptbxl": [DOMAINS / "ecg/embedded/ptbxl_synthetic/records100/00000" / f"00001_lr{suffix}"
              for suffix in (".hea", ".dat")],
    "sleepedf": [DOMAINS / "eeg/embedded/sleep-edf/sleep-cassette" / name
                 for name in ("SC4001E0-PSG.edf", "SC4001EC-Hypnogram.edf")],
    "motor-imagery": [DOMAINS / "eeg/embedded/eegmmidb/S001/S001R04.edf"],
    "physio": [DOMAINS / "physio/embedded/site-D" / f"D01{suffix}" for suffix in (".hea", ".dat", ".atr")],
}  # fmt: skip

#: task -> the methods that apply to its default model and data.
APPLIES = {
    "rmd17": {"elora", "full", "readout", "mace-lora", "feature-lora"},
    "ptbxl": {"full", "readout", "lora", "lift", "htuning", "distill"},
    "sleepedf": {"full", "readout", "lora", "lift", "htuning"},
    "motor-imagery": {"full", "readout", "lora", "lift", "htuning"},
    "physio": {
        "full",
        "readout",
        "lora",
        "lift",
        "htuning",
        "physiopfm",
        "physiopfm-none",
        "physiopfm-mean",
        "physiopfm-nearest",
        "physiopfm-local",
    },
    "csbm": {"full", "readout", "homophily", "mixed-filters", "udagcn"},
    "medvl": {"full", "readout", "lora", "lift", "hlora", "moelora", "hlora-lora", "hlora-mixed"},
    "features": {
        "full",
        "readout",
        "warmpot",
        "pada",
        "oracle",
        "dre-pp",
        "dre-ulsif",
        "dre-kliep",
        "dre-logistic",
    },
}

#: One tiny epoch per task (on the embedded data or a cut of it).
TINY = {
    "rmd17": {"epochs": 1, "train_size": 5, "val_size": 2, "batch_size": 5},
    "ptbxl": {"epochs": 1, "train_size": 8, "val_size": 8, "batch_size": 8, "epochs_factor": 1},
    "csbm": {"epochs": 1, "nodes": 200},
    "sleepedf": {"epochs": 1, "train_size": 8, "val_size": 4, "batch_size": 4},
    "motor-imagery": {"epochs": 1, "train_size": 8, "val_size": 4, "batch_size": 4},
    "physio": {"epochs": 1, "train_size": 16, "val_size": 8, "batch_size": 8},
    "medvl": {"epochs": 1, "train_size": 24, "val_size": 8, "batch_size": 8},
    "features": {"epochs": 1, "train_size": 200, "val_size": 50, "pretrain_epochs": 10},
}


@pytest.fixture(scope="module")
def data_paths(tmp_path_factory) -> dict[str, str]:
    """Cut-down data of the tasks whose embedded data are too large for one tiny epoch per method."""
    from workbench.domains.medvl.generate import generate

    medvl = tmp_path_factory.mktemp("medvl") / "medvl"
    generate(medvl, seed=5, train_subjects=6, test_subjects=1)
    rmd17 = write_rmd17_layout(tmp_path_factory.mktemp("rmd17") / "rmd17", n_frames=30, n_train=20)
    return {"rmd17": str(rmd17), "medvl": str(medvl)}


def settings(task: str, method: str, data_paths: dict[str, str]) -> dict:
    tiny = dict(TINY[task])
    method_options = (
        {"epochs_factor": tiny.pop("epochs_factor")} if "epochs_factor" in tiny and method == "distill" else {}
    )
    tiny.pop("epochs_factor", None)
    if method == "physiopfm":
        method_options = {"iterations": 20, "sampling_steps": 5}
    if task in data_paths:
        tiny["data"] = data_paths[task]
    return {**tiny, "method_options": method_options, "baselines": [], "quiet": True}


def claims(task_name: str, data_paths: dict[str, str]) -> set[str]:
    """The methods whose ``check`` passes on the task's data and default model (what `adapt` runs first)."""
    task = tasks.get(task_name)(**{k: v for k, v in TINY[task_name].items() if k in ("nodes", "pretrain_epochs")})
    task.progress = False
    raw = task.read(data_paths.get(task_name), 0)
    model = task.load_model(None)
    tiny = TINY[task_name]
    data, _ = task.prepare(model, raw, tiny.get("train_size", 1), tiny.get("val_size", 1), 0)
    applies = set()
    for name in methods.names():
        try:
            methods.get(name)().check(task, data, model)
        except UserError as error:
            assert str(error), name  # refused with a message
        else:
            applies.add(name)
    return applies


def test_every_task_has_a_row():
    assert set(APPLIES) == set(tasks.names()) == set(TINY)


@pytest.mark.parametrize("task", sorted(APPLIES))
def test_claims_match_the_table_and_refusals_leave_nothing(task, data_paths, tmp_path):
    assert claims(task, data_paths) == APPLIES[task]
    refused = sorted(set(methods.names()) - APPLIES[task])[0]
    out = tmp_path / "refused"
    with pytest.raises(UserError, match=refused):
        workbench.adapt(task, refused, out=str(out), **settings(task, refused, data_paths))
    assert not out.exists()


#: The pairs the default suite runs (each domain's own method and one more where cheap; medvl's H-LoRA run is
#: `tests/test_medvl_task.py`'s); every other applicable pair runs under ``-m slow`` (the default suite has to stay
#: inside CI's time; each method's own tests run by default).
DEFAULT_PAIRS = {
    ("rmd17", "elora"),
    ("ptbxl", "lora"),
    ("ptbxl", "htuning"),
    ("sleepedf", "lora"),
    ("motor-imagery", "lift"),
    ("physio", "physiopfm"),
    ("physio", "lora"),
    ("csbm", "homophily"),
    ("features", "warmpot"),
    ("features", "dre-pp"),
}


def pairs() -> list:
    """Every applicable (task, method), those outside `DEFAULT_PAIRS` marked slow."""
    listed = sorted((t, m) for t, names in APPLIES.items() for m in names)
    assert DEFAULT_PAIRS <= set(listed)
    return [pytest.param(*pair, marks=() if pair in DEFAULT_PAIRS else pytest.mark.slow) for pair in listed]


@pytest.mark.parametrize("task, method", pairs())
def test_an_applicable_pair_runs_one_tiny_epoch(task, method, data_paths, tmp_path):
    out = tmp_path / "run"
    with placement_harness():
        run = workbench.adapt(task, method, out=str(out), **settings(task, method, data_paths))
    metrics = json.loads((out / "metrics.json").read_text())
    generates = method.startswith("physiopfm") and method != "physiopfm-local"  # no training stage: weights generated
    assert metrics["task"] == task and metrics["method"] == method
    assert (metrics["costs"][method]["epochs"] == 0) == generates
    assert metrics["after"] and all(value == value for value in metrics["after"].values())  # scored, no NaN
    for name in ("config.yaml", "adapter.safetensors", "adapter.json", "report.md", "log.txt"):
        assert (out / name).is_file(), name
    assert not (out / "checkpoints").exists()
    assert isinstance(run.model, torch.nn.Module)  # rebuilt from the run directory's files (`Run.load`)
    with placement_harness():
        rescored = workbench.evaluate(out)
    assert rescored and set(rescored) <= set(metrics["after"])  # the method's diagnostics are not rescored
    if task in PREDICT_INPUTS:
        inputs = tmp_path / "inputs"
        inputs.mkdir()
        for path in PREDICT_INPUTS[task]:
            shutil.copy(path, inputs / path.name)
        with placement_harness():
            record = workbench.predict(out, inputs, tmp_path / "predicted.csv")
        assert record["records"] >= 1 and record["failed"] < record["records"]

"""The command line end to end on small data: runs, re-scoring, resume after a kill, torchrun, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cli, write_rmd17_layout

SMALL = ["--epochs", "3", "--train-size", "10", "--val-size", "5", "--quiet"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def workbench(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=ENV)
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}\n{result.stderr[-3000:]}")
    return result


def test_help_and_list():
    help_text = workbench("adapt", "--help").stdout
    assert "examples (every task" in help_text and "workbench adapt --domain TASK --help" in help_text
    listing = workbench("list").stdout
    for name in ("rmd17", "mace", "elora", "full", "readout", "mace-lora", "card: rmd17-embedded"):
        assert name in listing


@pytest.mark.slow
def test_adapt_evaluate_and_report(tiny_rmd17, tmp_path):
    out = tmp_path / "run"
    workbench("adapt", "--domain", "rmd17", "--data", str(tiny_rmd17), "--out", str(out), *SMALL)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "rmd17" and metrics["method"] == "elora" and metrics["seed"] == 0
    assert set(metrics["baselines"]) == {"full", "readout", "mace-lora"}
    names = {
        "energy_mae_mev",
        "energy_rmse_mev",
        "energy_mae_mev_per_atom",
        "forces_mae_mev_per_a",
        "forces_rmse_mev_per_a",
    }
    for block in (metrics["before"], metrics["after"], *metrics["baselines"].values()):
        assert set(block) == names and all(np.isfinite(v) and v > 0 for v in block.values())
    assert 0 < metrics["trainable_parameters"] < metrics["total_parameters"]
    assert metrics["train_seconds"] > 0 and metrics["peak_memory_bytes"] > 0
    assert metrics["samples"] == {"train": 10, "val": 5, "test": 20}
    for name in (
        "config.yaml",
        "adapter.safetensors",
        "adapter.json",
        "report.md",
        "parity.png",
        "learning_curves.png",
        "log.txt",
    ):
        assert (out / name).is_file(), name
    assert not (out / "checkpoints").exists()
    assert "![" in (out / "report.md").read_text()
    # The adapted model rebuilt from the run directory scores exactly what the run measured.
    rescored = workbench("evaluate", "--run", str(out), "--out", str(tmp_path / "evaluations")).stdout
    value = float(next(line.split()[1] for line in rescored.splitlines() if line.startswith("forces_mae_mev_per_a")))
    assert value == pytest.approx(metrics["after"]["forces_mae_mev_per_a"], rel=1e-6)
    assert (tmp_path / "evaluations" / f"{out.name}-rmd17.json").is_file()  # named after the run and --data given
    assert not (out / "evaluations").exists()  # never inside the (sealed) run
    # Same settings, existing directory: refused without --resume; with --resume: nothing to redo.
    refused = workbench("adapt", "--domain", "rmd17", "--data", str(tiny_rmd17), "--out", str(out), *SMALL, check=False)
    assert refused.returncode == 2 and "--resume" in refused.stderr


def _checkpoint_epoch(path: Path) -> int:
    try:
        return int(torch.load(path, weights_only=True)["epoch"])
    except Exception:
        return -1


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_numbers(tiny_rmd17, tmp_path):
    args = [
        "adapt",
        "--domain",
        "rmd17",
        "--data",
        str(tiny_rmd17),
        "--baselines",
        "readout",
        "--epochs",
        "8",
        "--train-size",
        "10",
        "--val-size",
        "5",
        "--quiet",
    ]
    workbench(*args, "--out", str(tmp_path / "whole"))
    interrupted = tmp_path / "interrupted"
    process = subprocess.Popen(
        [sys.executable, "-m", "workbench", *args, "--out", str(interrupted)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    checkpoint = interrupted / "checkpoints" / "elora.pt"
    deadline = time.time() + 300
    while _checkpoint_epoch(checkpoint) < 2 and time.time() < deadline and process.poll() is None:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (interrupted / "metrics.json").exists(), "the run finished before it could be interrupted"
    assert checkpoint.is_file()
    workbench(*args, "--out", str(interrupted), "--resume")
    whole = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    resumed = json.loads((interrupted / "metrics.json").read_text())
    pairs = [(resumed["before"], whole["before"]), (resumed["after"], whole["after"])]
    pairs += [(resumed["baselines"][name], whole["baselines"][name]) for name in whole["baselines"]]
    for got, expected in pairs:
        assert got == pytest.approx(expected, rel=1e-10)


@pytest.mark.slow
def test_torchrun_two_processes(tiny_rmd17, tmp_path):
    out = tmp_path / "ddp"
    torchrun = Path(sys.executable).with_name("torchrun")
    result = subprocess.run(
        [
            str(torchrun),
            "--nproc_per_node",
            "2",
            "-m",
            "workbench",
            "adapt",
            "--domain",
            "rmd17",
            "--data",
            str(tiny_rmd17),
            "--baselines",
            "",
            "--out",
            str(out),
            *SMALL,
        ],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["processes"] == 2
    assert np.isfinite(metrics["after"]["forces_mae_mev_per_a"])


# -- bad input: a clear message naming file and field, exit code 2, no traceback, no run directory ---------
def _bad_npz(tmp_path: Path, **replace) -> Path:
    return write_rmd17_layout(tmp_path / "bad", **replace)


def _extxyz_without_energy(tmp_path: Path) -> Path:
    import ase.io
    from ase import Atoms

    atoms = Atoms("OH2", positions=[[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]])
    atoms.arrays["REF_forces"] = np.zeros((3, 3))
    ase.io.write(tmp_path / "no_energy.xyz", [atoms] * 4, format="extxyz")
    return tmp_path / "no_energy.xyz"


def _corrupt_checkpoint(tmp_path: Path) -> list[str]:
    from workbench.models.mace import SHIPPED_CHECKPOINT

    bad = tmp_path / "corrupt.safetensors"
    bad.write_bytes(SHIPPED_CHECKPOINT.read_bytes()[:1000])
    bad.with_suffix(".json").write_text(SHIPPED_CHECKPOINT.with_suffix(".json").read_text())
    return ["--model", str(bad)]


def _unopened_pickle(tmp_path: Path) -> list[str]:
    """A MACE ``.model`` file (never opened without --trust-checkpoint, so its bytes do not matter)."""
    (tmp_path / "x.model").write_bytes(b"a pickle")
    return ["--model", str(tmp_path / "x.model")]


BAD_INPUTS = {
    "npz without forces": (lambda p: ["--data", str(_bad_npz(p, forces=None))], "rmd17_ethanol.npz: field 'forces'"),
    "NaN energies": (
        lambda p: ["--data", str(_bad_npz(p, energies=np.full(60, np.nan)))],
        "rmd17_ethanol.npz: no usable frame",  # each frame is a record: all skipped (named), then nothing is left
    ),
    "extxyz without energies": (
        lambda p: ["--data", str(_extxyz_without_energy(p))],
        "no_energy.xyz [frame 0]: no energy",
    ),
    "unknown element": (
        lambda p: ["--data", str(_bad_npz(p, nuclear_charges=np.array([16, 6, 8, 1, 1, 1, 1, 1, 1])))],
        "field 'atomic numbers': the model knows elements [1, 6, 7, 8], found [16]",
    ),
    "corrupt checkpoint": (_corrupt_checkpoint, "corrupt.safetensors: not a readable safetensors file"),
    "pickle without trust": (_unopened_pickle, "--trust-checkpoint"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input(case, tmp_path):
    make_args, message = BAD_INPUTS[case]
    out = tmp_path / "run"
    result = cli("adapt", "--domain", "rmd17", *make_args(tmp_path), "--out", str(out), *SMALL)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_unknown_names_and_options():
    for args, message in (
        (["--domain", "nope"], "unknown task 'nope'"),
        (["--domain", "rmd17", "--method", "nope"], "unknown method 'nope'"),
        (
            ["--domain", "rmd17", "--method", "full", "--rank", "4"],
            "--rank is not an option of task 'rmd17' or method 'full'",
        ),
    ):
        result = cli("adapt", *args)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "domain, method, message",
    [
        (
            "rmd17",
            "htuning",
            "method 'htuning' needs adapter target groups; the mace model (ScaleShiftMACE) declares none",
        ),
        (
            "rmd17",
            "homophily",
            "method 'homophily' adapts gnn models; this model (ScaleShiftMACE) is of the mace family",
        ),
        (
            "ptbxl",
            "warmpot",
            "method 'warmpot' needs a task that offers target_pool; task 'ptbxl' offers folds, predict",
        ),
        ("csbm", "pada", "method 'pada' needs a task that exposes a batch's features and class logits"),
    ],
)
def test_a_method_that_does_not_fit_the_task_is_refused_before_the_run_directory(domain, method, message, tmp_path):
    out = tmp_path / "run"
    result = cli("adapt", "--domain", domain, "--method", method, "--out", str(out))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_data_generate_takes_the_task_s_own_options(tmp_path):
    """Generator options are declared by each task: features writes its layout; a flag of another task's
    generator is refused, naming what was asked."""
    out = tmp_path / "problem"
    result = cli("data", "generate", "features", "--out", str(out), "--problem", "covariate-shift", "--seed", "3")
    assert result.returncode == 0 and (out / "source.npz").is_file() and (out / "target.npz").is_file()
    assert "--data" in result.stdout
    refused = cli("data", "generate", "features", "--out", str(tmp_path / "x"), "--frames", "3")
    assert refused.returncode == 2
    assert "--frames is not an option of task 'features' or the data generator of task 'features'" in refused.stderr
    assert not (tmp_path / "x").exists()

"""kill -9 after any epoch, then ``--resume``: the run's metrics.json equals the uninterrupted run's, bit for bit
(everything but wall times and memory), dropout included — one task with dropout in the default suite, every task
with its default method in the slow one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
#: metrics.json fields that measure the machine, not the run.
MACHINE = {"train_seconds", "seconds_per_epoch", "seconds", "peak_memory_bytes", "training_memory_bytes",
           "training_step_bytes"}  # fmt: skip


def without_machine(value):
    if isinstance(value, dict):
        return {k: without_machine(v) for k, v in value.items() if k not in MACHINE}
    if isinstance(value, list):
        return [without_machine(v) for v in value]
    return value


def newest_epoch(folder: Path) -> int:
    """The largest epoch among the checkpoints in ``folder`` (-1 while there is none)."""
    epochs = [-1]
    for path in folder.glob("*.pt") if folder.is_dir() else ():
        try:
            epochs.append(int(torch.load(path, weights_only=True)["epoch"]))
        except Exception:  # being written
            pass
    return max(epochs)


def kill_and_resume(args: list[str], tmp_path: Path, kill_after_epochs: int) -> tuple[dict, dict]:
    """(uninterrupted metrics.json, killed-then-resumed metrics.json) of ``workbench adapt *args``."""
    command = [sys.executable, "-m", "workbench", "adapt", *args, "--quiet"]
    whole, interrupted = tmp_path / "whole", tmp_path / "interrupted"
    subprocess.run([*command, "--out", str(whole)], check=True, env=ENV, capture_output=True)
    process = subprocess.Popen([*command, "--out", str(interrupted)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=ENV)  # fmt: skip
    deadline = time.time() + 600
    while newest_epoch(interrupted / "checkpoints") < kill_after_epochs - 1 and process.poll() is None:
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (interrupted / "metrics.json").exists(), "the run finished before it could be killed"
    resumed = subprocess.run([*command, "--out", str(interrupted), "--resume"], env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return (json.loads((whole / "metrics.json").read_text()), json.loads((interrupted / "metrics.json").read_text()))


def test_killed_csbm_run_with_dropout_resumes_bit_for_bit(tmp_path):
    """Graph models train with dropout 0.5 (torch's global generator). Before checkpoints carried the generator
    states, the resumed run drew other dropout masks and ended elsewhere."""
    args = ["--domain", "csbm", "--method", "full", "--baselines", "", "--epochs", "8", "--patience", "100"]
    whole, resumed = kill_and_resume(args, tmp_path, kill_after_epochs=3)
    assert without_machine(resumed) == without_machine(whole)


#: Every task with its default method, a few epochs on its embedded data.
EVERY_TASK = {
    "rmd17": ["--train-size", "10", "--val-size", "5", "--epochs", "4"],
    "features": ["--epochs", "4"],
    "csbm": ["--epochs", "4"],
    "ptbxl": ["--epochs", "4"],
    "sleepedf": ["--epochs", "4"],
    "motor-imagery": ["--epochs", "4"],
    "physio": ["--method", "lora", "--epochs", "4"],  # physiopfm itself does not train
    "medvl": ["--epochs", "6"],
}


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(EVERY_TASK))
def test_every_task_resumes_bit_for_bit(task, tmp_path):
    args = ["--domain", task, "--baselines", "", "--patience", "100", *EVERY_TASK[task]]
    whole, resumed = kill_and_resume(args, tmp_path, kill_after_epochs=2)
    assert without_machine(resumed) == without_machine(whole)

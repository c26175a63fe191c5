"""Adding a model, a method and a domain touches no workbench file: the toy plug-ins in ``tests/data/toy_plugins``
(one module each, the domain's data card beside it, one entry-point line each, as a third-party distribution
declares them) are found through their entry points and run end to end by the command line (ARCHITECTURE.md, "Adding a
plug-in")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TOY = Path(__file__).parent / "data" / "toy_plugins"


def workbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TOY), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_the_toy_plugins_are_the_files_the_architecture_names():
    files = sorted(str(p.relative_to(TOY)) for p in TOY.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert files == ["toy_domain.py", "toy_domain.yaml", "toy_method.py", "toy_model.py",
                     "toy_plugins-0.1.dist-info/METADATA", "toy_plugins-0.1.dist-info/entry_points.txt"]  # fmt: skip
    lines = [line for line in (TOY / "toy_plugins-0.1.dist-info" / "entry_points.txt").read_text().splitlines()
             if "=" in line]  # fmt: skip
    assert len(lines) == 3  # one entry point per plug-in


def test_a_third_party_model_method_and_domain_run_end_to_end(tmp_path):
    run = workbench("adapt", "--domain", "toy-shift", "--out", str(tmp_path / "run"), "--threads", "1", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["method"] == "toy-recalibration" and set(metrics["baselines"]) == {"full"}
    # y = 2 w·x + 1 from a model of w·x: the recalibration (scale 2, offset 1) can fit it exactly
    assert metrics["before"]["mse"] > 1.0 and metrics["after"]["mse"] < 0.05 * metrics["before"]["mse"]
    assert (tmp_path / "run" / "report.md").is_file() and (tmp_path / "run" / "adapter.safetensors").is_file()
    # its rescore gives every row an interval around its estimate, and the paired after − before excludes 0
    low, high = metrics["intervals"]["after"]["mse"]
    assert low <= metrics["after"]["mse"] <= high
    assert metrics["differences"]["after − before"]["mse"]["high"] < 0
    assert metrics["test_units"]["items"] == 64

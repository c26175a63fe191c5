"""A run directory, and the files `predict` writes, have one owner: concurrent runs never mix their outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import workbench
from workbench import cli
from workbench.core.errors import UserError
from workbench.run.rundir import OutputBusy, claim_file, claim_run_dir

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
FEATURES = ["adapt", "--domain", "features", "--epochs", "1", "--baselines", "", "--quiet"]


def hold_in_another_process(kind: str, path: Path) -> subprocess.Popen:
    """A process that claims ``path`` (a run directory or an output file) and holds it until killed."""
    claim = "claim_run_dir(Path(sys.argv[1]), resume=True)" if kind == "run" else "claim_file(Path(sys.argv[1]))"
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from workbench.run.rundir import claim_file, claim_run_dir
        with {claim}:
            print("held", flush=True)
            time.sleep(120)
    """)
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=ENV)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_two_runs_into_one_out_one_wins_and_nothing_mixes(tmp_path):
    """The issue's repro: two runs started 0.2 s apart into one --out. Before: both exit 0 and metrics.json mixes
    seed 0's `before` with seed 1's `after`. Now exactly one finishes; the other exits 2 naming the directory."""
    out = tmp_path / "R"
    command = [sys.executable, "-m", "workbench", *FEATURES, "--out", str(out)]
    first = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=ENV)
    time.sleep(0.2)
    second = subprocess.Popen([*command, "--seed", "1"], stderr=subprocess.PIPE, text=True, env=ENV)
    results = [(process.wait(timeout=600), process.stderr.read()) for process in (first, second)]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "Traceback" not in loser and str(out.name) in loser
    winner_seed = [0, 1][[code for code, _ in results].index(0)]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["seed"] == winner_seed
    config = (out / "config.yaml").read_text()
    assert f"seed: {winner_seed}" in config
    assert not (out / ".owner.json").exists()  # released


def test_a_held_run_directory_is_refused_naming_its_holder(tmp_path):
    out = tmp_path / "run"
    holder = hold_in_another_process("run", out)
    try:
        with pytest.raises(OutputBusy, match=f"process {holder.pid}"):
            workbench.adapt("features", epochs=1, baselines=(), out=str(out), quiet=True)
        assert set(p.name for p in out.iterdir()) <= {".lock", ".owner.json"}  # nothing written
    finally:
        holder.kill()
        holder.wait()
    # the holder was killed (kill -9): the kernel released its lock; the folder is free again
    with claim_run_dir(out, resume=False):
        pass


def test_a_held_predict_output_is_refused(tmp_path):
    output = tmp_path / "predictions.csv"
    holder = hold_in_another_process("file", output)
    try:
        with pytest.raises(OutputBusy, match="in use by process"):
            with claim_file(output):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_out_naming_a_file_is_a_one_line_error(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    for out in (afile, afile / "run"):
        with pytest.raises(SystemExit) as exit_:
            cli.main([*FEATURES, "--out", str(out)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "Traceback" not in err and "is a file, not a folder" in err
    assert afile.read_text() == "not a folder"


def test_a_fresh_run_refuses_a_folder_another_run_filled_meanwhile(tmp_path):
    """The check after taking the lock: a folder that was empty when the run began reading its data and holds
    another run's files when it is claimed is refused (never reused without --resume)."""
    out = tmp_path / "run"
    out.mkdir()
    with claim_run_dir(out, resume=False):
        (out / "metrics.json").write_text("{}")  # what a faster run left
    with pytest.raises(UserError, match="already exists"):
        with claim_run_dir(out, resume=False):
            pass
    with claim_run_dir(out, resume=True):  # --resume takes it
        pass

"""Resume and rerun that check what they continue, workers that die with their parent, and file and disk errors in
one line (issue 42 items 3, 4, 5), through the command line.

A run records its data's fingerprint and its settings' hash when it starts (``fingerprint.json``); ``--resume``
refuses other data or settings naming them. A comparison records its ``--threads`` (``compute.json``); a rerun
refuses other threads, other settings (naming the fields) and a recorded cell whose data changed. A damaged
``cell.json`` is a cache (its cell runs again), a copied one, a damaged ``spec.json`` or ``config.yaml``, a full or
read-only disk and a killed worker are one line with exit code 2. Local workers die with their parent; a lock whose
owner died is taken over.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.comparison import cells, execute
from workbench.run import rundir
from workbench.run.fingerprint import data_fingerprint
from workbench.run.rundir import OutputBusy, claim_run_dir

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
#: A features run small enough for the default suite.
ADAPT = ["adapt", "--domain", "features", "--method", "full", "--baselines", "", "--epochs", "2", "--train-size",
         "60", "--val-size", "20", "--batch-size", "20", "--pretrain-epochs", "20", "--threads", "1",
         "--quiet"]  # fmt: skip
#: The smallest comparison: full fine-tuning of the features task, 2 folds of one seed, one epoch.
COMPARE = ["compare", "--domain", "features", "--methods", "full", "--folds", "2", "--seeds", "5", "--epochs", "1",
           "--train-size", "60", "--val-size", "20", "--batch-size", "20", "--pretrain-epochs", "20",
           "--quiet"]  # fmt: skip
CELLS = ("full/fold0-seed5", "full/fold1-seed5")


def cli(*args) -> subprocess.CompletedProcess:
    """``workbench ARGS`` in this process (`conftest.cli`; imported here, not at the top, so that a worker process
    that imports this module for `_dies_in_fold1` does not import what conftest imports)."""
    from conftest import cli as run

    return run(*[str(a) for a in args])


def one_line_error(result: subprocess.CompletedProcess, *names: str) -> str:
    """`conftest.one_line_error`, imported when called (as `cli`)."""
    from conftest import one_line_error as check

    return check(result, *names)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A folder with a generated features data set (``data/``), a finished run on it (``run/``) and a finished
    comparison on it (``cmp/``), made in that folder with relative paths: a copy of it is a world of its own."""
    folder = tmp_path_factory.mktemp("guarded")
    here = Path.cwd()
    os.chdir(folder)
    try:
        for args in (["data", "generate", "features", "--out", "data"], [*ADAPT, "--data", "data", "--out", "run"],
                     [*COMPARE, "--data", "data", "--out", "cmp"]):  # fmt: skip
            result = cli(*args)
            assert result.returncode == 0, result.stderr
    finally:
        os.chdir(here)
    return folder


@pytest.fixture
def world(base, tmp_path, monkeypatch) -> Path:
    """A copy of `base`, the working folder of the test."""
    copy = tmp_path / "world"
    shutil.copytree(base, copy)
    monkeypatch.chdir(copy)
    return copy


def change(data: Path) -> None:
    """One value of the target file changed (same names, same shapes)."""
    arrays = dict(np.load(data / "target.npz"))
    name = next(iter(arrays))
    arrays[name] = arrays[name].copy()
    arrays[name].flat[0] += 1
    np.savez(data / "target.npz", **arrays)


def resume(*flags: str) -> subprocess.CompletedProcess:
    """``adapt --resume`` of the run in the working folder, as it was started (``flags``: FLAG VALUE to change)."""
    args = [*ADAPT, "--data", "data", "--out", "run", "--resume"]
    for flag, value in zip(flags[::2], flags[1::2]):
        args[args.index(flag) + 1] = value
    return cli(*args)


def rerun(*flags: str) -> subprocess.CompletedProcess:
    """The comparison's command again in the working folder (``flags``: FLAG VALUE to change or add)."""
    args = [*COMPARE, "--data", "data", "--out", "cmp"]
    for flag, value in zip(flags[::2], flags[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return cli(*args)


# -- adapt --resume -----------------------------------------------------------------------------------------------
def test_a_run_records_the_fingerprint_of_its_data_and_settings(base):
    recorded = json.loads((base / "run" / "fingerprint.json").read_text())
    assert set(recorded) == {"settings_hash", "data_fingerprint", "data_source", "data_files"}
    assert set(recorded["data_files"]) == {"source.npz", "target.npz"}
    assert recorded["data_fingerprint"] == data_fingerprint(base / "data", "features", {}, 0)


def test_resume_with_changed_data_exits_2_naming_the_file(world):
    """The issue's repro: --resume after --data changed went on (test accuracy 0.544 against 0.754 uninterrupted)."""
    (world / "run" / "metrics.json").unlink()  # interrupted before its last step
    change(world / "data")
    one_line_error(resume(), "run: the data changed since this run started", "changed: target.npz")
    assert not (world / "run" / "metrics.json").exists()


def test_resume_on_the_same_data_finishes(world):
    (world / "run" / "metrics.json").unlink()
    result = resume()
    assert result.returncode == 0, result.stderr
    assert (world / "run" / "metrics.json").is_file()


def test_a_run_from_before_fingerprints_resumes_with_a_warning(world):
    for name in ("metrics.json", "fingerprint.json"):
        (world / "run" / name).unlink()
    result = resume()
    assert result.returncode == 0, result.stderr
    assert "resuming without checking that its data are unchanged" in result.stderr
    assert (world / "run" / "fingerprint.json").is_file()  # checked from now on


@pytest.mark.parametrize(
    "edit, flags, names",
    [
        (
            lambda text: text.replace("threads: 1", "threads: 2"),
            [],
            ["--resume must use the same settings", "threads: was 2, now 1"],
        ),  # fmt: skip
        (
            lambda text: text.replace("\nepochs: 2\n", "\nepochs: 3\n"),
            ["--epochs", "3"],
            ["config.yaml: changed since the run started"],
        ),  # fmt: skip
        (lambda text: "{{: not yaml", [], ["config.yaml: damaged (not YAML"]),
        (lambda text: "- a list\n", [], ["config.yaml: damaged (no mapping)"]),
    ],
    ids=["another-threads", "edited-config", "garbage", "a-list"],
)
def test_other_settings_or_a_damaged_config_are_one_line(world, edit, flags, names):
    (world / "run" / "metrics.json").unlink()
    config = world / "run" / "config.yaml"
    config.write_text(edit(config.read_text()))
    one_line_error(resume(*flags), *names)


# -- compare reruns ----------------------------------------------------------------------------------------------
def test_a_comparison_records_its_threads_and_a_rerun_continues(world):
    assert json.loads((world / "cmp" / "compute.json").read_text()) == {"threads": 1}
    kept = {name: (world / "cmp" / "cells" / name / "cell.json").read_bytes() for name in CELLS}
    result = rerun()
    assert result.returncode == 0, result.stderr
    assert {name: (world / "cmp" / "cells" / name / "cell.json").read_bytes() for name in CELLS} == kept


def test_a_rerun_with_other_threads_exits_2_naming_threads(world):
    """The issue's repro: a rerun with another --threads mixed seed 0 at 1 thread with seed 1 at 2, unreported."""
    one_line_error(rerun("--threads", "2"), "computed with --threads 1 (compute.json)", "this command with --threads 2")
    (world / "cmp" / "compute.json").unlink()  # a comparison from before compute.json: its cells' records say
    one_line_error(rerun("--threads", "2"), "--threads 1 (its cells' cell.json)")


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--epochs", "2"], "epochs: was 1, now 2"),
        (["--fold-val-share", "0.3"], "val_share (--fold-val-share): was 0.2, now 0.3"),
        (["--seeds", "5,6"], "seeds: was [5], now [5, 6]"),
    ],
)
def test_other_settings_exit_2_naming_the_fields(world, flags, named):
    one_line_error(rerun(*flags), "cmp holds a comparison with other settings", named)


def test_a_recorded_cell_on_changed_data_exits_2_naming_the_cell(world):
    change(world / "data")
    one_line_error(rerun(), f"cell {CELLS[0]}: the data changed since it was recorded")


@pytest.mark.parametrize(
    "damage",
    [b'{"method": "full", "fo', b"null", b"[]", b'{"method": "full"}', b"\xff\xfe"],
    ids=["truncated", "null", "a-list", "keys-missing", "not-utf8"],
)
def test_a_damaged_cell_record_is_a_cache_and_its_cell_runs_again(world, damage):
    record = world / "cmp" / "cells" / CELLS[1] / "cell.json"
    before = json.loads(record.read_text())
    record.write_bytes(damage)
    result = rerun()
    assert result.returncode == 0, result.stderr
    assert "damaged" in result.stderr and f"running cell {CELLS[1]} again" in result.stderr
    assert "Traceback" not in result.stderr
    again = json.loads(record.read_text())
    assert again["metrics"] == before["metrics"] and again["split"] == before["split"]


def test_a_cell_record_copied_from_another_cell_is_one_line(world):
    cells = world / "cmp" / "cells"
    shutil.copy(cells / CELLS[0] / "cell.json", cells / CELLS[1] / "cell.json")
    one_line_error(rerun(), f"{CELLS[1]}/cell.json: records the cell {CELLS[0]}, not {CELLS[1]}")


@pytest.mark.parametrize(
    "name, content, named",
    [
        ("spec.json", '{"domain": "features", "meth', "spec.json: damaged (not JSON"),
        ("spec.json", "null", "spec.json: damaged (null, not a JSON object)"),
        ("spec.json", '{"domain": "features", "colour": 1}', "spec.json: not the spec of a comparison"),
        ("spec.json", '{"domain": "features", "methods": 5}', "spec.json: not the spec of a comparison"),
        ("compute.json", "null", "compute.json: damaged"),
        ("compute.json", '{"threads": "one"}', "compute.json: damaged (no threads)"),
    ],
    ids=["spec-truncated", "spec-null", "spec-unknown-field", "spec-wrong-type", "compute-null", "compute-text"],
)
def test_a_damaged_spec_or_compute_json_is_one_line(world, name, content, named):
    (world / "cmp" / name).write_text(content)
    one_line_error(rerun(), named)


def test_rerun_cell_of_a_damaged_record_or_spec_is_one_line(world):
    """A damaged record or spec is one that differs from its seal: reported as modified (issue 53), in one line."""
    record = world / "cmp" / "cells" / CELLS[0] / "cell.json"
    kept = record.read_bytes()
    record.write_text("null")
    one_line_error(cli("compare", "--rerun-cell", CELLS[0], "cmp"), "cell.json: 4 bytes", "modified after it was")
    record.write_bytes(kept)
    (world / "cmp" / "spec.json").write_text("[1, 2")
    one_line_error(cli("compare", "--rerun-cell", CELLS[0], "cmp"), "spec.json: 5 bytes", "modified after it was")


def test_a_cell_killed_while_writing_its_first_file_runs_afresh(world):
    """What a worker killed inside the first atomic write of a cell's run leaves (found by the Dask kill -9 test):
    the lock, its owner and a hidden temporary; before, a rerun refused it ("already exists ... --resume")."""
    cell = world / "cmp" / "cells" / CELLS[1]
    before = json.loads((cell / "cell.json").read_text())
    shutil.rmtree(cell)
    cell.mkdir()
    for name in (".lock", ".owner.json", ".config.yaml.9mhigrgz.tmp.yaml"):
        (cell / name).write_text("")
    result = rerun()
    assert result.returncode == 0, result.stderr
    assert json.loads((cell / "cell.json").read_text())["metrics"] == before["metrics"]


@pytest.mark.parametrize("content", ["null", '{"summary": null}', '{"summary": {"full": 3}}', '{"summ'])
def test_a_damaged_pilot_comparison_is_one_line(tmp_path, content):
    (tmp_path / "comparison.json").write_text(content)
    plan = ["compare", "--domain", "features", "--methods", "full,warmpot", "--plan", "--pilot", tmp_path]
    one_line_error(cli(*plan), f"--pilot {tmp_path}", "comparison.json")


def test_a_garbage_config_yaml_in_an_interrupted_cell_is_one_line(world):
    cell = world / "cmp" / "cells" / CELLS[1]
    for name in ("cell.json", "metrics.json", "seal.json"):  # interrupted before its run finished (and was sealed)
        (cell / name).unlink()
    (cell / "config.yaml").write_bytes(b"\x00\x01 task: [unclosed")
    one_line_error(rerun(), f"cell {CELLS[1]}", "config.yaml: damaged")


def test_compares_messages_suggest_only_its_own_flags(tmp_path, monkeypatch):
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("someone's")
    line = one_line_error(cli(*COMPARE, "--out", occupied), "already exists; choose another --out")
    assert "--resume" not in line

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(execute, "compare", interrupted)
    result = cli(*COMPARE, "--out", tmp_path / "c")
    assert result.returncode == 130 and "--resume" not in result.stderr
    assert "run the same command again to continue" in result.stderr
    monkeypatch.setattr("workbench.run.adapting.run_request", interrupted)
    result = cli(*ADAPT, "--out", tmp_path / "r")
    assert result.returncode == 130 and "plus --resume" in result.stderr


def test_a_refused_link_out_suggests_allow_paths_outside_only_where_the_command_takes_it(tmp_path, monkeypatch):
    """predict and evaluate read with the run's task options and take no --allow-paths-outside flag."""
    from workbench.core.paths import confined

    folder, outside = tmp_path / "input", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "A01.dat").write_bytes(b"\0" * 8)
    (folder / "A01.dat").symlink_to(outside / "A01.dat")

    def predict(*args, **kwargs):  # what a reader does with a .hea naming a linked .dat
        confined("A01.dat", folder, f"{folder}/A01.hea")

    monkeypatch.setattr("workbench.run.predicting.predict", predict)
    line = one_line_error(cli("predict", "--run", tmp_path, "--input", folder, "--output", tmp_path / "p.csv"),
                          "A01.hea: names 'A01.dat', which lies outside the data folder")  # fmt: skip
    assert "--allow-paths-outside" not in line and "copy the file into that folder" in line
    from workbench.core.registry import tasks

    monkeypatch.setattr(tasks.get("features"), "info", lambda self, data: predict())
    line = one_line_error(cli("data", "info", "features"), "outside the data folder")
    assert "pass --allow-paths-outside to read it anyway" in line  # data info takes the flag


# -- workers and locks -------------------------------------------------------------------------------------------
def _dies_in_fold1(spec, cell, out, *arguments):
    """`workbench.comparison.cells.run_cell`, except that the worker running fold 1 is killed (kill -9) first."""
    if cell.fold == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return cells.run_cell(spec, cell, out, *arguments)


def test_a_killed_local_worker_is_one_line_and_the_rerun_continues(tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    monkeypatch.setattr(cells, "run_cell", _dies_in_fold1)
    line = one_line_error(cli(*COMPARE, "--workers", "2", "--out", out), "a worker process died (killed, or out "
                          "of memory?) before cell", "run the same command again to continue")  # fmt: skip
    assert "--resume" not in line
    monkeypatch.undo()
    result = cli(*COMPARE, "--workers", "2", "--out", out)
    assert result.returncode == 0, result.stderr
    assert all((out / "cells" / name / "cell.json").is_file() for name in CELLS)


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every process below ``pid``: psutil when installed, else /proc."""
    try:
        import psutil

        return [(p.pid, str(p.create_time())) for p in psutil.Process(pid).children(recursive=True)]
    except ImportError:
        pass
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), fields[19])  # parent, start time (clock ticks after boot)
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [(child, start) for child, (ppid, start) in stats.items() if ppid == parent]
        found += children
        frontier += [child for child, _ in children]
    return found


def still_running(process: tuple[int, str]) -> bool:
    """Whether the process (pid, start time) of `descendants` runs (not ended, nor a zombie, nor a reused pid)."""
    pid, start = process
    try:
        import psutil

        try:
            p = psutil.Process(pid)
            return str(p.create_time()) == start and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    except ImportError:
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == start and fields[0] not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the processes in /proc (or with psutil)")
@pytest.mark.parametrize("executor", ["local", pytest.param("dask", marks=pytest.mark.slow)])  # ~40 s, ~55 s
def test_kill_9_of_compare_leaves_no_worker_alive_and_the_rerun_continues(tmp_path, executor):
    """The issue's repro: kill -9 of ``compare --workers 2`` left its pool workers running queued cells with nobody
    holding the comparison's lock (alive 42 s later), and an immediate rerun was refused ("cell in use by"). The
    local pool's workers get the kernel's parent-death signal; Dask's watch their parent themselves."""
    if executor == "dask":
        pytest.importorskip("distributed")
    out = tmp_path / "cmp"
    command = [sys.executable, "-m", "workbench", *COMPARE, "--workers", "2", "--executor", executor, "--out", str(out)]
    command[command.index("--folds") + 1] = "4"  # 4 cells: some left to run when the first is recorded
    parent = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list(out.glob("cells/*/*/cell.json")):
        assert parent.poll() is None, parent.stderr.read()
        assert time.time() < deadline, "no cell was recorded"
        time.sleep(0.02)
    children = descendants(parent.pid)
    assert len(children) >= 2, children  # the two workers (and multiprocessing's resource tracker)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    recorded = {p.parent.name: p.read_bytes() for p in out.glob("cells/*/*/cell.json")}
    assert len(recorded) < 4, "the comparison finished before it could be killed"
    time.sleep(5)
    alive = [child for child in children if still_running(child)]
    assert not alive, f"still running 5 s after their parent was killed: {alive}"
    again = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    records = {p.parent.name: p.read_bytes() for p in out.glob("cells/*/*/cell.json")}
    assert len(records) == 4 and all(records[name] == content for name, content in recorded.items())


def test_where_the_kernel_offers_no_parent_death_signal_a_thread_watches_the_parent(tmp_path):
    """The fallback of `_die_with_parent` (systems without ``prctl``): a grandchild that watches its parent ends
    once the parent is killed."""
    code = textwrap.dedent("""
        import subprocess, sys
        watcher = subprocess.Popen([sys.executable, "-c", "import os, sys; from workbench.comparison.cells "
                                    "import _watch_parent; print('watching', flush=True); "
                                    "_watch_parent(os.getppid(), 0.1)"],
                                   stdout=subprocess.PIPE, text=True)
        print(watcher.pid, flush=True)
        assert watcher.stdout.readline().strip() == "watching"
        print("ready", flush=True)
        watcher.wait()
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    watcher = int(parent.stdout.readline())
    assert parent.stdout.readline().strip() == "ready"
    (process,) = [p for p in descendants(parent.pid) if p[0] == watcher]
    parent.kill()
    parent.wait()
    deadline = time.time() + 5
    while still_running(process) and time.time() < deadline:
        time.sleep(0.05)
    assert not still_running(process)


def _held_for_a_dead_owner(out: Path, seconds: float) -> tuple[subprocess.Popen, int]:
    """A process that holds the lock of the run directory ``out`` for ``seconds`` while its ``.owner.json`` names a
    process that has ended: what a process left behind by a dead owner does, holding the lock it inherited (filelock
    4 closes the lock in a forked child; an older one, another tool or a network file system may not). Returns the
    holder (once it holds the lock) and the dead owner's pid."""
    dead = _ended_pid()
    code = textwrap.dedent(f"""
        import fcntl, json, os, socket, sys, time
        from datetime import datetime, timezone
        folder = sys.argv[1]
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with open(os.path.join(folder, ".owner.json"), "w") as owner:
            json.dump({{"pid": {dead}, "host": socket.gethostname(), "started": started, "command": "x"}}, owner)
        print("held", flush=True)
        time.sleep({seconds})
    """)
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder, dead


@pytest.mark.skipif(sys.platform == "win32", reason="holds the lock with fcntl.flock")
def test_a_lock_whose_owner_died_is_taken_over_and_a_live_holder_is_not(tmp_path, monkeypatch, caplog):
    out = tmp_path / "run"
    holder, dead = _held_for_a_dead_owner(out, seconds=1.5)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="workbench"), claim_run_dir(out, resume=True):
        waited = time.monotonic() - started
        assert json.loads((out / ".owner.json").read_text())["pid"] == os.getpid()
    holder.wait()
    assert 0.5 < waited < rundir.STALE_WAIT_SECONDS, waited  # it waited for the holder, then took the lock over
    assert f"taking over from process {dead}" in caplog.text
    # a holder that outlives the wait: refused, naming the dead owner
    monkeypatch.setattr(rundir, "STALE_WAIT_SECONDS", 0.5)
    holder, dead = _held_for_a_dead_owner(out, seconds=30)
    try:
        with pytest.raises(OutputBusy, match=f"process {dead} .* \\(ended; a process it started still holds"):
            with claim_run_dir(out, resume=True):
                pass
    finally:
        holder.kill()
        holder.wait()
    # a holder that runs: refused at once
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom workbench.run.rundir import claim_run_dir\n"
        "with claim_run_dir(Path(sys.argv[1]), resume=True):\n    print('held', flush=True)\n    time.sleep(60)\n"
    )
    live = subprocess.Popen([sys.executable, "-c", code, str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(OutputBusy, match=f"in use by process {live.pid} "):
            with claim_run_dir(out, resume=True):
                pass
        assert time.monotonic() - started < 0.5
    finally:
        live.kill()
        live.wait()


def test_a_pid_reused_by_a_later_process_is_not_the_owner(tmp_path):
    """An .owner.json naming this very process, but with a time before it started: a reused pid, not a holder."""
    info = {"pid": os.getpid(), "host": rundir.socket.gethostname(), "started": "2001-01-01T00:00:00+00:00"}
    assert not rundir._running(info)
    assert rundir._running({**info, "started": "2999-01-01T00:00:00+00:00"})
    assert not rundir._running({**info, "pid": _ended_pid()})
    assert rundir._running({**info, "host": "elsewhere"})  # another host's: cannot tell, so it may run


def _ended_pid() -> int:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    return ended.pid


# -- disks -------------------------------------------------------------------------------------------------------
class _FullDisk(io.RawIOBase):
    """A binary file that takes ``room`` bytes and then fails as a full disk does."""

    def __init__(self, path, room: int):
        self.file, self.room = open(path, "wb"), room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)

    def close(self) -> None:
        self.file.close()
        super().close()


def test_a_full_disk_while_a_checkpoint_is_saved_is_one_line_and_resume_finishes(world, monkeypatch):
    """torch.save on a full disk: before, a RuntimeError traceback ("unexpected pos") and exit 1. The disk is full
    for the checkpoint's writes only (`_FullDisk`), so the run's other files are written and it can resume."""
    from workbench.core import checkpoint

    with monkeypatch.context() as full:
        full.setattr(checkpoint, "open", lambda path, mode: _FullDisk(path, room=300), raising=False)
        line = one_line_error(cli(*ADAPT, "--data", "data", "--out", "again"), "again/checkpoints/full.pt",
                              "No space left on device", "free some space")  # fmt: skip
    assert "--resume" not in line
    assert not [p.name for p in (world / "again" / "checkpoints").iterdir()]  # no temporary file left behind
    result = cli(*ADAPT, "--data", "data", "--out", "again", "--resume")  # space freed
    assert result.returncode == 0, result.stderr


def _mounted(folder: Path, options: str) -> bool:
    folder.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True,
                          check=False).returncode == 0  # fmt: skip


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0, reason="mounts a small tmpfs (root)")
@pytest.mark.parametrize("options, named", [("size=64k", "No space left on device"), ("ro", "Read-only file system")])
def test_a_full_or_read_only_file_system_is_one_line(tmp_path, options, named):
    disk = tmp_path / "disk"
    if not _mounted(disk, options):
        pytest.skip("tmpfs cannot be mounted here")
    try:
        one_line_error(cli("data", "generate", "features", "--out", disk / "data"), str(disk), named)
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.slow  # ~45 s: starts a local Dask cluster
def test_dask_logs_nothing_under_quiet(tmp_path):
    pytest.importorskip("distributed")
    result = subprocess.run([sys.executable, "-m", "workbench", *COMPARE, "--workers", "2", "--executor", "dask",
                             "--out", str(tmp_path / "c")], env=ENV, capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if line.strip()]  # before: ~37 lines of distributed's loggers
    assert all(line.startswith("WARNING cannot give a verdict") for line in said), result.stderr  # the design's own


def test_only_disk_errors_of_a_write_become_one_line(tmp_path):
    """A full disk, a read-only file system or a refused permission is the user's to fix (one line naming the file);
    any other failure of a write is a bug and keeps its traceback. The file is left as it was either way."""
    from workbench.core.checkpoint import atomic_path
    from workbench.core.errors import DiskError

    target = tmp_path / "x.json"
    target.write_text("before")
    for code in (errno.ENOSPC, errno.EROFS, errno.EACCES):
        with pytest.raises(DiskError, match=f"x.json: {os.strerror(code)}"):
            with atomic_path(target):
                raise OSError(code, os.strerror(code))
    with pytest.raises(DiskError, match="No space left on device"):  # as safetensors reports it
        with atomic_path(target):
            raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    with pytest.raises(ValueError, match="a bug"):
        with atomic_path(target):
            raise ValueError("a bug")
    with pytest.raises(FileNotFoundError):
        with atomic_path(target):
            raise FileNotFoundError(errno.ENOENT, "gone")
    assert target.read_text() == "before" and [p.name for p in tmp_path.iterdir()] == ["x.json"]

"""Threads that follow the load: `ThreadPolicy` rises when other work goes and falls when it returns (with a gap
that stops it flapping), `OtherWork` never counts this process's own work, a run records each epoch's count, and
results that follow the load match a pinned run's in their last digits only."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

import workbench
from workbench.core.config import RunRequest
from workbench.run.adapting import run_request
from workbench.run.threads import OtherWork, ThreadPolicy

#: Relative difference allowed between a run that followed the load and a pinned one: float32 numbers summed in
#: another order differ by a few units in the last place (1.2e-7) per operation, and training carries them on.
ORDER_TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def torch_threads(monkeypatch):
    """Each test starts without OMP_NUM_THREADS and leaves torch's thread count as it found it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def readings(*busy):
    """An `OtherWork` stand-in that returns the CPUs busy elsewhere ``busy``, one per call."""
    values = iter(busy)
    return lambda: next(values)


def test_the_count_rises_when_other_work_goes_and_falls_when_it_returns():
    policy = ThreadPolicy(usable=2, other_work=readings(0.0, 0.4, 0.67, 1.0, 0.4, None, 0.2, 2.0, 0.0))
    counts = [policy.update() for _ in range(9)]
    # 0.4 busy keeps 2 threads when at 2 and 1 when at 1: between RISE and FALL nothing moves; None: no news
    assert counts == [2, 2, 1, 1, 1, 1, 2, 1, 2]
    assert torch.get_num_threads() == 2


def test_the_count_jumps_to_what_is_free_within_the_usable_cpus():
    policy = ThreadPolicy(usable=4, other_work=readings(0.0, 2.6, 0.0, 1.3, 5.0))
    assert [policy.update() for _ in range(5)] == [4, 1, 4, 3, 1]


def test_a_pinned_count_never_changes_and_never_reads_the_load(monkeypatch):
    def unread():
        raise AssertionError("a pinned policy read the load")

    policy = ThreadPolicy(3, usable=2, other_work=unread)
    assert policy.pinned == 3 and [policy.update() for _ in range(3)] == [3, 3, 3] and torch.get_num_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert ThreadPolicy(usable=2, other_work=unread).pinned == 1  # the environment's count is pinned too
    with pytest.raises(workbench.core.errors.UserError, match="--threads must be at least 1"):
        ThreadPolicy(0)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="affinity masks are a Linux feature")
def test_other_work_counts_others_and_never_this_process():
    # On one CPU kept busy all along (this process spins, and so does a competitor on the same CPU), the CPU time
    # other processes took plus this process's own is 1 CPU: OtherWork counts the competitor, not our spinning.
    code = """
import os, subprocess, sys, time
from workbench.run.threads import OtherWork
cpu = sorted(os.sched_getaffinity(0))[0]
os.sched_setaffinity(0, {cpu})
spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL)
try:
    time.sleep(0.3)
    other, start, own = OtherWork(min_window_s=1.0), time.monotonic(), os.times()
    while time.monotonic() - start < 1.5:
        pass
    ended, mine = time.monotonic(), os.times()
    busy = other()
finally:
    spinner.kill()
print(busy, (mine.user + mine.system - own.user - own.system) / (ended - start))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    busy, own = map(float, done.stdout.split())
    assert own > 0.1 and busy > 0.1
    assert busy + own == pytest.approx(1.0, abs=0.1)
    assert OtherWork(min_window_s=60.0)() is None  # a window too short: no news


def test_a_run_that_follows_the_load_records_each_epochs_threads(tmp_path):
    run = workbench.adapt("features", epochs=2, train_size=100, baselines=(), quiet=True, out=str(tmp_path / "r"))
    method = run.metrics["method"]
    history = json.loads((run.path / "results" / f"{method}.json").read_text())["history"]
    per_epoch = run.metrics["costs"][method]["threads_per_epoch"]
    assert run.config.threads is None and run.metrics["threads"] is None  # null: followed the load
    assert per_epoch == [entry["threads"] for entry in history] and len(per_epoch) == 2
    assert all(1 <= count <= os.cpu_count() for count in per_epoch)
    assert "threads: null" in (run.path / "config.yaml").read_text().splitlines()
    # --resume keeps following the load; pinning a run that followed it is another setting
    assert workbench.adapt("features", epochs=2, train_size=100, baselines=(), quiet=True, out=str(run.path),
                           resume=True).config.threads is None  # fmt: skip
    with pytest.raises(workbench.core.errors.UserError, match="threads: was None, now 2"):
        workbench.adapt("features", epochs=2, train_size=100, baselines=(), quiet=True, out=str(run.path), threads=2,
                        resume=True)  # fmt: skip


def _features(out, threads=None, policy=None):
    """(test metrics, each epoch's validation loss, each epoch's threads) of a short features run."""
    request = RunRequest(domain="features", epochs=3, train_size=100, baselines=(), out=str(out), threads=threads)
    run = run_request(request, quiet=True, threads=policy)
    history = json.loads((run.path / "results" / f"{run.metrics['method']}.json").read_text())["history"]
    return run.metrics["after"], [entry["val_loss"] for entry in history], [entry["threads"] for entry in history]


def test_following_the_load_changes_only_the_last_digits_and_pinned_reruns_are_bit_identical(tmp_path):
    load = itertools.cycle([0.0, 1.0])  # other work comes and goes: 2, 1, 2 threads
    followed = _features(tmp_path / "auto", policy=ThreadPolicy(usable=2, other_work=lambda: next(load)))
    pinned, again = _features(tmp_path / "one", threads=1), _features(tmp_path / "one-again", threads=1)
    assert followed[2] == [2, 1, 2] and pinned[2] == [1, 1, 1]
    assert pinned == again  # --threads N: bit for bit
    assert followed[0] == pytest.approx(pinned[0], rel=ORDER_TOLERANCE)
    assert followed[1] == pytest.approx(pinned[1], rel=ORDER_TOLERANCE)

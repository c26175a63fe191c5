"""The thread policy: CPUs the process may use, less those other processes keep busy; kept by --resume."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import workbench
from workbench.core.errors import UserError
from workbench.run.threads import busy_elsewhere, choose_threads, following_load, usable_cpus, use_threads


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="affinity masks are a Linux feature")
def test_usable_cpus_follow_the_affinity_mask():
    code = "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); " \
           "from workbench.run.threads import usable_cpus; print(usable_cpus())"  # fmt: skip
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "1"
    assert 1 <= usable_cpus() <= os.cpu_count()


def test_busy_processes_are_seen_and_leave_their_cpus(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        assert busy_elsewhere() >= 2  # a spinning process is always runnable
        threads, why = choose_threads()
        assert threads <= max(1, usable_cpus() - 2) and "busy with other processes" in why
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def test_omp_num_threads_from_the_environment_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert choose_threads() == (3, "OMP_NUM_THREADS")


def test_a_library_call_follows_the_load_and_gives_the_callers_threads_back(monkeypatch):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        with following_load() as threads:
            assert threads == 2 and torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
        monkeypatch.delenv("OMP_NUM_THREADS")
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cpus())]
        try:
            with following_load() as threads:  # every usable CPU busy elsewhere: one thread, not one per core
                assert threads == 1 == torch.get_num_threads()
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
    finally:
        torch.set_num_threads(before)


def test_use_threads_sets_torch_and_refuses_nonsense():
    before = torch.get_num_threads()
    try:
        assert use_threads(1) == 1 and torch.get_num_threads() == 1
        with pytest.raises(UserError, match="--threads must be at least 1"):
            use_threads(0)
    finally:
        torch.set_num_threads(before)


def test_a_run_records_its_threads_and_resume_keeps_them(tmp_path):
    before = torch.get_num_threads()
    try:
        run = workbench.adapt("features", epochs=1, baselines=(), quiet=True, out=str(tmp_path / "r"), threads=1)
        assert run.config.threads == 1 and run.metrics["threads"] == 1
        with pytest.raises(UserError, match="threads: was 1, now 2"):
            workbench.adapt("features", epochs=1, baselines=(), quiet=True, out=str(tmp_path / "r"), threads=2,
                            resume=True)  # fmt: skip
    finally:
        torch.set_num_threads(before)

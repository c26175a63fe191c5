"""How many CPU threads a workbench process computes with (``--threads``; by default chosen at start).

PyTorch starts one intra-op thread per core it sees. On a machine where other processes are busy (a shared
cluster node, a laptop, a second run) that is the worst choice: every parallel operation waits for its slowest
thread, and a thread that shares its core with another busy process waits for a whole scheduler time slice.
Measured on a 2-core machine beside one busy process: an epoch of the README's first run 8.3 s with 2 threads
against 3.4 s with 1, the entropic partial-OT solver 0.41 s against 0.17 s (`benchmarks/threads_under_load.py`).

The default (`choose_threads`) is ``OMP_NUM_THREADS`` where the environment sets it, else the number of CPUs the
process may use (its affinity mask and its cgroup's CPU quota, which ``os.cpu_count`` ignores), less the CPUs
other processes keep busy now (the median count of runnable tasks in ``/proc/stat`` over a tenth of a second, this
process excluded), at least 1. Floating-point sums may
depend on the thread count, so the count chosen is written to ``config.yaml``, and ``--resume`` keeps the
interrupted run's: give ``--threads`` to make runs on different machines or under different loads comparable
bit for bit.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
from pathlib import Path

import torch

from workbench.errors import UserError

log = logging.getLogger("workbench")


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by its cgroup's CPU quota (v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us``) rounded up."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota else cpus


def _cgroup_quota() -> float | None:
    """The CPU quota of this process's cgroup in CPUs, or None when unlimited or not told."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0" and controllers == "":  # cgroup v2
                limit = Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.max"
                if not limit.is_file():
                    limit = Path("/sys/fs/cgroup/cpu.max")
                quota, period = limit.read_text().split()
                return None if quota == "max" else int(quota) / int(period)
            if "cpu" in controllers.split(","):  # cgroup v1
                root = Path("/sys/fs/cgroup/cpu,cpuacct") if Path("/sys/fs/cgroup/cpu,cpuacct").is_dir() else None
                root = root or Path("/sys/fs/cgroup/cpu")
                quota = int((root / "cpu.cfs_quota_us").read_text())
                period = int((root / "cpu.cfs_period_us").read_text())
                return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None
    return None


def busy_elsewhere(samples: int = 10, interval_s: float = 0.01) -> int:
    """CPUs other processes keep busy now: the median of ``procs_running`` in ``/proc/stat`` (runnable tasks on
    the whole machine) over ``samples`` readings, less the one reading it (0 where /proc/stat is absent)."""
    counts, pause = [], threading.Event()  # never set: wait() just waits
    for _ in range(samples):
        try:
            text = Path("/proc/stat").read_text()
        except OSError:
            return 0
        counts += [int(line.split()[1]) for line in text.splitlines() if line.startswith("procs_running")]
        pause.wait(interval_s)
    return max(0, round(statistics.median(counts)) - 1) if counts else 0


def choose_threads() -> tuple[int, str]:
    """(threads, why): ``OMP_NUM_THREADS`` when the environment sets it (a batch scheduler's or the user's choice),
    else the usable CPUs less those busy elsewhere, at least 1."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given), "OMP_NUM_THREADS"
    usable, busy = usable_cpus(), busy_elsewhere()
    threads = max(1, usable - busy)
    return threads, f"{usable} usable CPU(s), {busy} busy with other processes"


def use_threads(requested: int | None) -> int:
    """Set torch's intra-op threads to ``requested`` (`choose_threads` when None) and return the count."""
    if requested is not None and requested < 1:
        raise UserError(f"--threads must be at least 1, got {requested}")
    if requested is None:
        requested, why = choose_threads()
        log.info("computing with %d thread(s) (%s; --threads to choose)", requested, why)
    torch.set_num_threads(requested)
    return requested

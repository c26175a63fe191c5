"""How many CPU threads a workbench process computes with (``--threads``; by default following the load).

PyTorch starts one intra-op thread per core it sees. On a machine where other processes are busy (a shared cluster
node, a laptop, a second run) that is the worst choice: every parallel operation waits for its slowest thread, and a
thread that shares its core with another busy process waits for a whole scheduler time slice. Measured on a 2-core
machine beside one busy process: an epoch of the README's first run 8.3 s with 2 threads against 3.4 s with 1, the
entropic partial-OT solver 0.41 s against 0.17 s (`benchmarks/threads_under_load.py`).

`ThreadPolicy` holds a run's count. Pinned (``--threads N``, else ``OMP_NUM_THREADS`` where the environment sets
it): that count, never changed. Otherwise it starts at `choose_threads` (the CPUs the process may use, less those
other processes keep busy now: the median of ``procs_running`` in ``/proc/stat`` over a tenth of a second, this
process excluded, at least 1) and follows the load: before every epoch of every method (`ThreadPolicy.update`, the
trainer's ``threads`` hook) `OtherWork` reads the CPU time other processes took on this process's CPUs since the
last reading, at least a second back (``/proc/stat``'s per-CPU busy time less this process's own, so that our own
threads never count, whether computing or spin-waiting after a parallel region), and the count rises when the CPUs
left free reach one more thread (less `ThreadPolicy.RISE`) and falls when they drop below the count (less
`ThreadPolicy.FALL`): the gap between the two keeps it from flapping.

Reproducibility: the thread count changes only the order in which parallel operations sum floating-point numbers,
never what is computed, so runs that follow the load differ from pinned runs in their last digits (each step's
rounding; training carries them on): on the features task (float32, 3 epochs), a run at 2, 1, 2 threads and one at 1
thread end with test metrics 3e-8 and validation losses 4e-7 apart, relative (`tests/test_threads_follow.py` allows
1e-5). ``--threads N`` on the same machine and software gives bit-identical reruns, and kill -9 + ``--resume`` of a
pinned run gives the uninterrupted run bit for bit (one that follows the load: to the last digits). ``config.yaml``'s
``threads`` is the pinned count, or null for a run that followed the load (its epochs' counts are in each method's
history, ``results/*.json``, and in ``metrics.json``'s ``costs`` as ``threads_per_epoch``); ``--resume`` keeps the
interrupted run's setting. Older runs recorded the count chosen at start: they resume pinned at it (0, from runs
older still, follows the load).

A comparison's cells are pinned (``workbench compare --threads``, default 1: reruns agree bit for bit, and one thread
per cell cannot be crowded out by a busy neighbour; more cores go to more ``--workers``). Library functions called
outside a run (from a notebook) leave the process's threads alone; `following_load` gives such a call the count a
run would start with.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Collection, Iterator

import torch

from workbench.core.errors import UserError

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


@contextmanager
def following_load() -> Iterator[int]:
    """``with following_load() as threads:`` torch computes the block with `choose_threads`'s count (the usable CPUs
    less those other processes keep busy now, or ``OMP_NUM_THREADS``), and the caller's count is put back after.

    For heavy torch or optimal-transport work called outside a run (a method's solver called from a notebook): a
    library function never changes the process's threads itself (inside a run the run's policy holds them), so a
    notebook beside a busy process wraps the call in this."""
    previous = torch.get_num_threads()
    threads, why = choose_threads()
    log.debug("computing with %d thread(s) (%s)", threads, why)
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(previous)


def _busy_seconds(cpus: Collection[int]) -> float | None:
    """CPU seconds the CPUs ``cpus`` spent busy since boot (``/proc/stat``'s per-CPU user, nice, system, irq,
    softirq and steal time); None where /proc/stat is absent."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted, ticks = {f"cpu{cpu}" for cpu in cpus}, 0
    for line in lines:
        fields = line.split()
        if fields and fields[0] in wanted:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
            ticks += user + nice + system + irq + softirq + steal
    return ticks / os.sysconf("SC_CLK_TCK")


class OtherWork:
    """CPUs other processes kept busy since the last reading: ``/proc/stat``'s busy time of the CPUs this process
    may run on, less this process's own CPU time (every thread of it: computing or spin-waiting), per second.

    A call returns that average [CPUs] and starts the next window; None (the window going on) while less than
    ``min_window_s`` [s] has passed, or where /proc/stat is absent.
    """

    def __init__(self, min_window_s: float = 1.0):
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.min_window_s = min_window_s
        self._last = self._reading()

    def _reading(self) -> tuple[float, float | None, float]:
        own = os.times()
        return time.monotonic(), _busy_seconds(self.cpus), own.user + own.system

    def __call__(self) -> float | None:
        now = self._reading()
        wall = now[0] - self._last[0]
        if wall < self.min_window_s or now[1] is None or self._last[1] is None:
            return None
        busy = (now[1] - self._last[1]) - (now[2] - self._last[2])
        self._last = now
        return max(0.0, busy / wall)


class ThreadPolicy:
    """The CPU threads a run computes with: ``pinned`` (never changed), or following the load (`update`).

    Args:
        pinned: a count (``--threads``); None: ``OMP_NUM_THREADS`` where set (pinned too), else `choose_threads`'s
            count at start, then following the load.
        usable: CPUs the process may use (default `usable_cpus`).
        other_work: ``other_work() -> CPUs busy elsewhere since the last call, or None (no news)``; default
            `OtherWork` over the CPUs this process may run on.
    """

    #: A thread is added when the CPUs left free by other work reach the new count less this [CPUs].
    RISE = 0.25
    #: A thread is dropped when the CPUs left free fall below the count less this [CPUs].
    FALL = 0.5

    def __init__(
        self,
        pinned: int | None = None,
        usable: int | None = None,
        other_work: Callable[[], float | None] | None = None,
    ):
        if pinned is not None and pinned < 1:
            raise UserError(f"--threads must be at least 1, got {pinned}")
        self.usable = usable or usable_cpus()
        if pinned is None:
            threads, why = choose_threads()
            if why == "OMP_NUM_THREADS":
                pinned = threads
            log.info("computing with %d thread(s) (%s; %s)", threads, why,
                     "--threads to choose" if pinned else "following the load; --threads to pin")  # fmt: skip
        self.pinned = pinned
        self.threads = pinned or min(threads, self.usable)
        self.other_work = None if pinned else other_work or OtherWork()
        torch.set_num_threads(self.threads)

    def update(self) -> int:
        """The count to compute with now (set in torch): the pinned one, else the last one moved by what other work
        left free since the last call (by `RISE` / `FALL`), within 1 and ``usable``."""
        busy = None if self.other_work is None else self.other_work()
        if busy is not None:
            free = self.usable - busy
            rise, fall = math.floor(free + self.RISE), math.floor(free + self.FALL)
            threads = rise if rise > self.threads else fall if fall < self.threads else self.threads
            threads = max(1, min(self.usable, threads))
            if threads != self.threads:
                log.info("computing with %d thread(s) from now on (other processes kept %.1f CPU(s) busy)", threads,
                         busy)  # fmt: skip
                self.threads = threads
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        return self.threads


def use_threads(requested: int | None) -> int:
    """Set torch's intra-op threads to ``requested`` (`choose_threads` when None) and return the count."""
    return ThreadPolicy(requested).threads

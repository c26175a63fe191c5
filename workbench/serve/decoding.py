"""Uploads checked off the event loop, inside budgets: a small pool of worker processes that run the header checks
(`workbench.serve.limits.check_upload`) of each request.

A check may have to parse a header the client crafted (a deflated DICOM dataset, an image PIL opens lazily, a gzipped
NIfTI header); it never runs in the server's own process. The workers are started with the ``forkserver`` method
(``spawn`` where there is none; never a fork of the threaded server), at most ``workers`` of them, each when first
needed, and each limited by the kernel:

- address space (``RLIMIT_AS``): what the worker holds when it starts plus ``memory_bytes``; a check that needs more
  gets ``MemoryError`` and the request 413;
- CPU time (``RLIMIT_CPU``): ``cpu_seconds`` more than the worker has used, set again before every check; past it
  the kernel ends the worker (SIGXCPU) and the request gets 413;
- wall time: ``timeout_s`` per check; past it the worker is killed (SIGKILL) and the request gets 413.

A worker that failed is replaced by a fresh one at the next check. The server's event loop only waits on a pipe (from
a thread), so ``/health`` and other requests are answered meanwhile.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import resource
import threading
from pathlib import Path
from typing import Any, Callable

from workbench.serve.limits import Limits, check_upload

log = logging.getLogger("workbench.serve")


class CheckFailed(Exception):
    """A check that did not finish within its budget: ``status`` (413) and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_folder(folder: Path, limits: Limits) -> tuple[int, str] | None:
    """The first refusal (`check_upload`) among the files of ``folder``, in name order; None when all may be
    decoded. Runs in a worker."""
    for path in sorted(Path(folder).iterdir()):
        found = check_upload(path, limits)
        if found is not None:
            return found
    return None


class CheckPool:
    """Worker processes running checks within their budgets (module docstring); `call` is blocking (run it on a
    thread).

    Args:
        workers: processes at most (and checks at a time).
        memory_bytes: address space a worker may add to what it holds when it starts [bytes].
        cpu_seconds: CPU time of one check [s].
        timeout_s: wall time of one check [s].
    """

    def __init__(self, workers: int, memory_bytes: int, cpu_seconds: float, timeout_s: float):
        self.memory_bytes, self.cpu_seconds, self.timeout_s = memory_bytes, cpu_seconds, timeout_s
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self._context = multiprocessing.get_context(method)
        self._slots = threading.BoundedSemaphore(max(1, workers))
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def for_limits(cls, limits: Limits) -> "CheckPool":
        return cls(limits.check_workers, limits.check_memory_mb << 20, limits.check_seconds, limits.check_seconds)

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` (picklable, importable by name) in a worker, its value returned.

        Raises:
            CheckFailed: 413 past the memory, CPU or wall budget (the worker is replaced), 503 once closed.
            Exception: what ``function`` raised, re-raised here as ``RuntimeError`` with its one-line message.
        """
        budget = f"{self.timeout_s:g} s and {self.memory_bytes >> 20} MiB"
        if not self._slots.acquire(timeout=self.timeout_s):
            raise CheckFailed(413, f"the upload's headers were not checked within {budget} (all checkers busy)")
        try:
            if self._closed:
                raise CheckFailed(503, "the server is shutting down")
            worker = self._take()
            try:
                worker.connection.send((function, args))
                if not worker.connection.poll(self.timeout_s):
                    worker.kill()
                    raise CheckFailed(413, f"the upload's headers could not be checked within {budget}: refused")
                ok, value = worker.connection.recv()
            except (EOFError, OSError):
                code = worker.kill()
                why = "CPU time" if code == -24 else f"the checker ended ({code})"
                raise CheckFailed(413, f"the upload's headers could not be checked within {budget} ({why}): "
                                       "refused") from None  # fmt: skip
            if ok:
                self._give(worker)
                return value
            worker.kill()  # a fault or MemoryError may leave it in a bad state: a fresh one next time
            if value[0] == "MemoryError":
                raise CheckFailed(413, f"the upload's headers could not be checked within {budget} (memory): refused")
            raise RuntimeError(f"{value[0]}: {value[1]}")
        finally:
            self._slots.release()

    def close(self) -> None:
        """Ends the idle workers; checks still running end with theirs."""
        self._closed = True
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()

    def _take(self) -> "_Worker":
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _Worker(self._context, self.memory_bytes, self.cpu_seconds)

    def _give(self, worker: "_Worker") -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.kill()


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, context: Any, memory_bytes: int, cpu_seconds: float):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_work, args=(child, memory_bytes, cpu_seconds), daemon=True,
                                       name="workbench-check")  # fmt: skip
        self.process.start()
        child.close()

    def kill(self) -> int | None:
        """Ends the process (SIGKILL when it still runs); its exit code."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.connection.close()
        return self.process.exitcode


def _work(connection: Any, memory_bytes: int, cpu_seconds: float) -> None:
    """A worker's loop: limits set, then ``(function, args)`` in, ``(True, value)`` or ``(False, (kind, message))``
    out, until the parent's end closes."""
    _limit_memory(memory_bytes)
    while True:
        try:
            function, args = connection.recv()
        except (EOFError, OSError):
            return
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (math.ceil(used + cpu_seconds), hard))
        try:
            result = (True, function(*args))
        except MemoryError:
            result = (False, ("MemoryError", "out of memory"))
        except Exception as error:  # reported to the parent, which decides
            result = (False, (type(error).__name__, str(error).splitlines()[0] if str(error) else ""))
        connection.send(result)


def _limit_memory(memory_bytes: int) -> None:
    """``RLIMIT_AS``: the address space held now plus ``memory_bytes``."""
    try:
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) << 10 for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        log.warning("no /proc/self/status: the check workers run without a memory limit")
        return
    resource.setrlimit(resource.RLIMIT_AS, (size + memory_bytes, resource.getrlimit(resource.RLIMIT_AS)[1]))

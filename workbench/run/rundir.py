"""One owner per output: a run directory (or a file ``predict`` writes) belongs to one process at a time.

`claim_run_dir` takes an exclusive lock (`filelock`: ``flock`` on POSIX, released by the kernel when the process
dies, so a killed run never leaves a stale lock) inside the run directory when it is created, and holds it for
the run's life. A second process that wants the directory exits with code 2 naming the holder (``.owner.json``:
pid, host, start time, command line). A fresh run (no ``--resume``) refuses a directory that holds anything but
the lock; ``--resume`` continues only a run nobody holds.

A lock whose ``.owner.json`` names a process that has ended is taken over safely: when the kernel has released it,
the new owner takes it and says whose it was; when something still holds it (a process the dead owner left behind
with its lock inherited, a network file system that releases locks late), the new owner waits up to
`STALE_WAIT_SECONDS` for it, and never breaks a lock that a running process holds.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from workbench.core.checkpoint import is_temporary, write_json
from workbench.core.errors import UserError

LOCK = ".lock"
OWNER = ".owner.json"
#: How long a claim waits for a lock whose named owner has ended, before it gives up [s].
STALE_WAIT_SECONDS = 10.0

log = logging.getLogger("workbench")


class OutputBusy(UserError):
    """Another process holds the output."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C while a process held its run folder (`claim_run_dir`): ``run_dir`` is the folder ``--resume``
    continues."""

    def __init__(self, run_dir: Path):
        super().__init__(str(run_dir))
        self.run_dir = run_dir


#: What a refusal of a folder that is not empty says by default: how a run continues.
RESUME_HINT = "add --resume to continue that run"


def check_out_path(out_dir: Path, resume: bool, continues: str | None = RESUME_HINT) -> None:
    """What can be told before any data are read: ``--out`` is not a file, and a fresh run's folder is empty
    (``continues``: how the command continues what a folder holds, said when it is not empty; None: it cannot)."""
    for parent in (out_dir, *out_dir.parents):
        if parent.exists() and not parent.is_dir():
            raise UserError(f"--out {out_dir}: {parent} is a file, not a folder; give a folder for the run")
    if not resume and _holds_anything(out_dir):
        raise UserError(f"{out_dir}: already exists; choose another --out" + (f", or {continues}" if continues else ""))


def _holds_anything(folder: Path) -> bool:
    """Whether ``folder`` holds anything but a lock, its owner and what interrupted atomic writes left behind (a
    run killed while writing its first file is no run to resume)."""
    return folder.is_dir() and any(p.name not in (LOCK, OWNER) and not is_temporary(p.name) for p in folder.iterdir())


@contextmanager
def claim_run_dir(out_dir: Path, resume: bool, continues: str | None = RESUME_HINT) -> Iterator[None]:
    """Create ``out_dir`` (parents too) and hold it for the block: a `UserError` when another process holds it, or
    when a fresh run finds it not empty (another run got there first; ``continues``: see `check_out_path`)."""
    check_out_path(out_dir, resume, continues)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"--out {out_dir}: cannot create the folder ({error.strerror})") from None
    with _held(out_dir / LOCK, out_dir, "run directory"):
        if not resume and _holds_anything(out_dir):
            raise UserError(
                f"{out_dir}: another run wrote into it while this one was reading its data; choose another --out"
            )
        try:
            yield
        except RunInterrupted:
            raise
        except KeyboardInterrupt as interrupt:  # the console names the folder to resume (`RunInterrupted`)
            raise RunInterrupted(out_dir) from interrupt


@contextmanager
def claim_file(path: Path) -> Iterator[None]:
    """Hold the output file ``path`` (a hidden lock beside it) while the block writes it and its companions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _held(path.with_name(f".{path.name}{LOCK}"), path, "output"):
        yield


@contextmanager
def _held(lock_path: Path, what: Path, kind: str) -> Iterator[None]:
    owner = lock_path.with_name(OWNER) if kind == "run directory" else lock_path.with_suffix(".owner.json")
    lock = FileLock(lock_path, timeout=0)
    _acquire(lock, owner, what, kind)
    try:
        write_json(owner, {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
        })  # fmt: skip
        yield
    finally:
        owner.unlink(missing_ok=True)
        lock.release()


def _acquire(lock: FileLock, owner: Path, what: Path, kind: str) -> None:
    """Take ``lock``; an `OutputBusy` naming the holder (``owner``: its ``.owner.json``) when a running process
    holds it. A lock whose named owner has ended is waited for (`STALE_WAIT_SECONDS`: what still holds it is
    something the owner left behind), and taken over saying whose it was."""
    deadline = time.monotonic() + STALE_WAIT_SECONDS
    waiting = 0.0  # the first try does not wait
    while True:
        info = _owner(owner)
        try:
            lock.acquire(timeout=waiting, poll_interval=0.05)
            break
        except Timeout:
            if info is None or _running(info) or time.monotonic() > deadline:
                gone = "" if info is None or _running(info) else (
                    f" (ended; a process it started still holds the lock after {STALE_WAIT_SECONDS:g} s)")  # fmt: skip
                raise OutputBusy(f"{what}: this {kind} is in use by {_holder(owner)}{gone}; wait for it or choose "
                                 "another") from None  # fmt: skip
            waiting = 0.1
    info = _owner(owner)  # still there once the lock is this process's: its owner ended without removing it
    if info is not None:
        log.info("%s: taking over from process %s on %s, which ended without releasing it", what, info.get("pid"),
                 info.get("host"))  # fmt: skip


def _owner(owner: Path) -> dict | None:
    """The content of an ``.owner.json``; None when there is none (or it cannot be read)."""
    try:
        info = json.loads(owner.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _running(info: dict) -> bool:
    """Whether the owner an ``.owner.json`` names may still run: True for another host's (this one cannot tell)
    and for a running process of this host that started before it took the lock (a later one reuses the pid)."""
    if info.get("host") != socket.gethostname() or not isinstance(info.get("pid"), int):
        return True
    started = process_started(info["pid"])
    if started is None:
        return False
    try:
        claimed = datetime.fromisoformat(info["started"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return True
    return started <= claimed + 1  # the owner file's time has whole seconds


def process_started(pid: int) -> float | None:
    """When process ``pid`` of this machine started [s since the epoch]; None when none runs (a zombie has ended).
    A running process whose start cannot be read (no ``/proc``) counts as started at 0."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    except OSError:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))  # fmt: skip
    except (OSError, IndexError, StopIteration, ValueError):
        return 0.0
    if fields[0] in ("Z", "X"):  # ended, not yet reaped
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _holder(owner: Path) -> str:
    """Who holds a lock, as its ``.owner.json`` says (it may be a moment behind the lock)."""
    try:
        info = json.loads(owner.read_text())
        return f"process {info['pid']} on {info['host']} (started {info['started']}: {info['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"

"""One owner per output: a run directory (or a file ``predict`` writes) belongs to one process at a time.

`claim_run_dir` takes an exclusive lock (`filelock`: ``flock`` on POSIX, released by the kernel when the process
dies, so a killed run never leaves a stale lock) inside the run directory when it is created, and holds it for
the run's life. A second process that wants the directory exits with code 2 naming the holder (``.owner.json``:
pid, host, start time, command line). A fresh run (no ``--resume``) refuses a directory that holds anything but
the lock; ``--resume`` continues only a run nobody holds.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from workbench.checkpoint import write_json
from workbench.errors import UserError

LOCK = ".lock"
OWNER = ".owner.json"


class OutputBusy(UserError):
    """Another process holds the output."""


def check_out_path(out_dir: Path, resume: bool) -> None:
    """What can be told before any data are read: ``--out`` is not a file, and a fresh run's folder is empty."""
    for parent in (out_dir, *out_dir.parents):
        if parent.exists() and not parent.is_dir():
            raise UserError(f"--out {out_dir}: {parent} is a file, not a folder; give a folder for the run")
    if not resume and _holds_anything(out_dir):
        raise UserError(f"{out_dir}: already exists; choose another --out, or add --resume to continue that run")


def _holds_anything(folder: Path) -> bool:
    return folder.is_dir() and any(p.name not in (LOCK, OWNER) for p in folder.iterdir())


@contextmanager
def claim_run_dir(out_dir: Path, resume: bool) -> Iterator[None]:
    """Create ``out_dir`` (parents too) and hold it for the block: a `UserError` when another process holds it, or
    when a fresh run finds it not empty (another run got there first)."""
    check_out_path(out_dir, resume)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"--out {out_dir}: cannot create the folder ({error.strerror})") from None
    with _held(out_dir / LOCK, out_dir, "run directory"):
        if not resume and _holds_anything(out_dir):
            raise UserError(
                f"{out_dir}: another run wrote into it while this one was reading its data; choose another --out"
            )
        yield


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
    try:
        lock.acquire()
    except Timeout:
        raise OutputBusy(f"{what}: this {kind} is in use by {_holder(owner)}; wait for it or choose another") from None
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


def _holder(owner: Path) -> str:
    """Who holds a lock, as its ``.owner.json`` says (it may be a moment behind the lock)."""
    try:
        info = json.loads(owner.read_text())
        return f"process {info['pid']} on {info['host']} (started {info['started']}: {info['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"

"""The served model's audit log: append-only JSON lines, one per prediction request, each chained to the one before.

Every line is one JSON object (keys sorted, ASCII, no spaces) closed by its own hash::

    {"caller":"ward-7",...,"prev":"<sha256 of the line before>","seq":12,...,"time":"...","sha256":"<hex>"}

``sha256`` is the hash of the line's text without that last field (the line with ``,"sha256":"<hex>"`` removed);
``prev`` is the ``sha256`` of the line before (`GENESIS` for the first line); ``seq`` counts lines from 1. So an
edited line fails its own hash, and a deleted, inserted or reordered line breaks the chain at the line after it:
`verify_log` names the first bad line. What a chain cannot tell alone: lines removed from the end. `verify_log`
reports the last line's hash (the head); kept somewhere else (a ticket, a second machine), it detects that too.

A line is written with one ``write`` to a file opened for appending, then ``fsync``-ed, before the caller answers the
request: a line that was answered survives a kill -9 of the server and a power cut. One `AuditLog` holds the file's
exclusive lock (``flock``) for its lifetime, so a second server cannot interleave lines into the same chain, and its
lines are written under one thread lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from workbench.core.errors import UserError

#: ``prev`` of the first line.
GENESIS = "0" * 64
#: The ``format`` field of every line.
FORMAT = "workbench-audit/1"
_HASH_FIELD = re.compile(rb',"sha256":"([0-9a-f]{64})"\}$')


def _line(entry: Mapping[str, Any]) -> bytes:
    """``entry`` as one audit line (no newline): its canonical JSON with its own ``sha256`` appended."""
    body = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + f',"sha256":"{digest}"}}'.encode()


@dataclass(frozen=True)
class LogCheck:
    """What `verify_log` found: ``lines`` intact lines from the start; ``bad_line`` (1-based) and ``problem`` for the
    first bad one (None when all are intact); ``head``: the ``sha256`` of the last intact line (`GENESIS` if none)."""

    path: Path
    lines: int
    head: str
    bad_line: int | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.bad_line is None

    def summary(self) -> str:
        """One line: ``ok: ...`` or ``LOG: line N: problem``."""
        if self.ok:
            return (f"ok: {self.path}: {self.lines} line(s), hash chain intact from the first line; last line's "
                    f"sha256 {self.head} (keep it elsewhere to detect lines removed from the end)")  # fmt: skip
        return f"{self.path}: line {self.bad_line}: {self.problem} ({self.lines} line(s) before it are intact)"


def verify_log(path: str | Path) -> LogCheck:
    """Check every line of the audit log ``path``: its own hash, its ``seq`` and its link to the line before.

    Returns:
        `LogCheck` with the first bad line, if any (an empty file is intact, with no lines).

    Raises:
        UserError: ``path`` is not a readable file.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file (give the audit log that workbench serve --audit-log wrote)")
    content = path.read_bytes()
    lines = content.split(b"\n")
    complete, last = lines[:-1], lines[-1]
    previous = GENESIS
    for number, raw in enumerate(complete, start=1):
        problem = _line_problem(raw, number, previous)
        if problem:
            return LogCheck(path, number - 1, previous, number, problem)
        previous = _HASH_FIELD.search(raw).group(1).decode()
    if last:
        count = len(complete)
        return LogCheck(path, count, previous, count + 1, "incomplete line (no newline at its end: a write cut short)")
    return LogCheck(path, len(complete), previous)


def _line_problem(raw: bytes, number: int, previous: str) -> str | None:
    """Why line ``number`` (``raw``, no newline) is not the intact successor of the line hashed ``previous``."""
    found = _HASH_FIELD.search(raw)
    if not found:
        return "no sha256 field at its end (not an audit line, or cut)"
    body = raw[: found.start()] + b"}"
    if hashlib.sha256(body).hexdigest() != found.group(1).decode():
        return "its content does not match its sha256 (the line was edited)"
    try:
        entry = json.loads(body)
    except ValueError as error:
        return f"not valid JSON ({error})"
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return f"not a {FORMAT} line"
    if entry.get("prev") != previous:
        return "its prev does not match the line before (a line before it was edited, removed, inserted or moved)"
    if entry.get("seq") != number:
        return f"seq {entry.get('seq')!r}, expected {number} (lines removed, inserted or moved)"
    return None


class AuditLog:
    """The audit log a server appends to (`append`), opened once: an existing log is verified first and continued.

    Args:
        path: the JSON-lines file; created (mode 0600) when missing, its folder too.

    Raises:
        UserError: the existing log fails `verify_log` (naming the line; a broken chain is never continued), or
            another process holds it (a second server on the same log).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.is_dir():
            raise UserError(f"--audit-log {self.path}: a folder; give a file name (a .jsonl file)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise UserError(f"--audit-log {self.path}: another process (a second server?) writes to this log; give "
                            "each server its own --audit-log") from None  # fmt: skip
        check = verify_log(self.path)
        if not check.ok:
            os.close(self._fd)
            raise UserError(f"--audit-log {check.summary()}; a broken chain is never continued: move the log aside "
                            "(keep it as evidence) and start a new one")  # fmt: skip
        self._fsync_folder()
        self._lock = threading.Lock()
        self._head, self._seq = check.head, check.lines
        self._failed: str | None = None

    def _fsync_folder(self) -> None:
        """Make the log's directory entry durable (the file may just have been created)."""
        handle = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)

    def append(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Write ``entry`` (JSON-able; no ``format``, ``seq``, ``prev`` or ``sha256`` keys) as the next line, fsynced
        before returning; returns the entry as written (with those four).

        Raises:
            OSError: the line could not be written and synced (a full disk, say); every later call raises too, since
                the file may end in a torn line that the chain cannot continue.
        """
        with self._lock:
            if self._failed:
                raise OSError(f"{self.path}: an earlier write failed ({self._failed}); restart the server")
            full = {**entry, "format": FORMAT, "seq": self._seq + 1, "prev": self._head}
            line = _line(full)
            try:
                written = os.write(self._fd, line + b"\n")
                if written != len(line) + 1:
                    raise OSError(f"{self.path}: short write ({written} of {len(line) + 1} bytes)")
                os.fsync(self._fd)
            except OSError as error:  # the chain may end in a torn line now: nothing more is appended
                self._failed = str(error)
                raise
            self._seq, self._head = full["seq"], _HASH_FIELD.search(line).group(1).decode()
        return {**full, "sha256": self._head}

    def close(self) -> None:
        """Release the log (its lock goes with the file descriptor)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

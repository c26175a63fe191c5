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

What a chain cannot prove alone (lines removed from the end, a log emptied or rewritten whole) the signed heads of
`workbench.serve.audit_head` prove: every ``checkpoint_every`` lines, ``checkpoint_s`` seconds and at close the log
writes its head (``seq``, ``sha256`` of its last line), signed, to a second file, and ``GET /audit/head`` serves it;
``workbench audit verify --expect-head`` / ``--since-checkpoint`` check a log against them.

A write that fails (a full disk) leaves the log `failure` set: nothing more is appended, and the server reports
itself unhealthy and refuses requests with that one reason. Such a write can leave a torn last line (no newline);
on the next start it is moved to ``<log>.torn-<UTC time>`` (its bytes kept as evidence), the log is cut back to its
last intact line and a ``quarantined_torn_line`` line, with the torn bytes' sha256, continues the chain.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Collection, Mapping

from workbench.core.errors import UserError

#: ``prev`` of the first line.
GENESIS = "0" * 64
#: The ``format`` field of every line.
FORMAT = "workbench-audit/1"
_HASH_FIELD = re.compile(rb',"sha256":"([0-9a-f]{64})"\}$')
_TORN = "incomplete line (no newline at its end: a write cut short)"


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
    #: ``{sha256: seq}`` of the intact lines whose hash `verify_log` was asked to find (``wanted``).
    found: dict[str, int] = field(default_factory=dict)
    #: Bytes of the intact lines (where a torn last line starts).
    intact_bytes: int = 0

    @property
    def torn_last_line(self) -> bool:
        """Whether the only problem is an incomplete last line (a write cut short)."""
        return self.bad_line is not None and self.problem == _TORN

    @property
    def ok(self) -> bool:
        return self.bad_line is None

    def summary(self) -> str:
        """One line: ``ok: ...`` or ``LOG: line N: problem``."""
        if self.ok:
            return (f"ok: {self.path}: {self.lines} line(s), hash chain intact from the first line; last line's "
                    f"sha256 {self.head} (lines removed from the end show only against heads kept elsewhere: "
                    "--since-checkpoint, --expect-head)")  # fmt: skip
        return f"{self.path}: line {self.bad_line}: {self.problem} ({self.lines} line(s) before it are intact)"


def verify_log(path: str | Path, wanted: Collection[str] = ()) -> LogCheck:
    """Check every line of the audit log ``path``: its own hash, its ``seq`` and its link to the line before.

    Args:
        wanted: line hashes (heads kept elsewhere) to look for: `LogCheck.found` tells at which ``seq`` each is.

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
    previous, wanted, found, offset = GENESIS, set(wanted), {}, 0
    for number, raw in enumerate(complete, start=1):
        problem = _line_problem(raw, number, previous)
        if problem:
            return LogCheck(path, number - 1, previous, number, problem, found, offset)
        previous = _HASH_FIELD.search(raw).group(1).decode()
        offset += len(raw) + 1
        if previous in wanted:
            found[previous] = number
    if last:
        return LogCheck(path, len(complete), previous, len(complete) + 1, _TORN, found, offset)
    return LogCheck(path, len(complete), previous, found=found, intact_bytes=offset)


def _line_problem(raw: bytes, number: int, previous: str, entry: Any = None) -> str | None:
    """Why line ``number`` (``raw``, no newline) is not the intact successor of the line hashed ``previous``;
    ``entry``: ``raw`` already parsed by the caller (the whole line), not parsed again."""
    found = _HASH_FIELD.search(raw)
    if not found:
        return "no sha256 field at its end (not an audit line, or cut)"
    body = raw[: found.start()] + b"}"
    if hashlib.sha256(body).hexdigest() != found.group(1).decode():
        return "its content does not match its sha256 (the line was edited)"
    try:
        entry = json.loads(body) if entry is None else entry
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
    """The audit log a server appends to (`append`), opened once: an existing log is verified first and continued (a
    torn last line quarantined, the module's docstring).

    Args:
        path: the JSON-lines file; created (mode 0600) when missing, its folder too.
        heads: where its signed heads go (`workbench.serve.audit_head.Heads`), None for none.
        checkpoint_every: lines between two signed heads.
        checkpoint_s: seconds after which the next line also writes a signed head.

    Raises:
        UserError: the existing log fails `verify_log` other than by a torn last line (naming the line; a broken
            chain is never continued), or another process holds it (a second server on the same log).
    """

    def __init__(self, path: str | Path, heads: Any = None, checkpoint_every: int = 100, checkpoint_s: float = 300.0):
        self.path = Path(path)
        if self.path.is_dir():
            raise UserError(f"--audit-log {self.path}: a folder; give a file name (a .jsonl file)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise UserError(f"--audit-log {self.path}: another process (a second server?) writes to this log; give "
                            "each server its own --audit-log") from None  # fmt: skip
        check = verify_log(self.path)
        if not check.ok and not check.torn_last_line:
            os.close(self._fd)
            raise UserError(f"--audit-log {check.summary()}; a broken chain is never continued: move the log aside "
                            "(keep it as evidence) and start a new one")  # fmt: skip
        self._fsync_folder()
        self._lock = threading.Lock()
        self._head, self._seq = check.head, check.lines
        self._failed: str | None = None
        self.heads, self.checkpoint_every, self.checkpoint_s = heads, max(1, int(checkpoint_every)), checkpoint_s
        self._checkpointed = (self._seq, time.monotonic())  # the last head claimed for signing, and when
        self._heads_lock = threading.Lock()  # heads are written one at a time, in order
        self._head_written = -1  # seq of the last head written to the heads file
        if check.torn_last_line:
            self.append(self._quarantine(check))
        if self.heads is not None:
            self.checkpoint()

    @property
    def failure(self) -> str | None:
        """Why nothing more can be appended (an earlier write failed), None while the log is writable."""
        return self._failed

    @property
    def head(self) -> tuple[int, str]:
        """``(seq, sha256)`` of the last line written (``(0, GENESIS)`` for an empty log)."""
        with self._lock:
            return self._seq, self._head

    def _quarantine(self, check: LogCheck) -> dict[str, Any]:
        """Move the torn last line to ``<log>.torn-<UTC time>``, cut the log back to its intact lines; the entry
        that records it."""
        torn = self.path.read_bytes()[check.intact_bytes:]
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        evidence = self.path.with_name(f"{self.path.name}.torn-{stamp}")
        handle = os.open(evidence, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(handle, torn)
            os.fsync(handle)
        finally:
            os.close(handle)
        os.ftruncate(self._fd, check.intact_bytes)
        os.fsync(self._fd)
        self._fsync_folder()
        return {"event": "quarantined_torn_line", "torn_bytes": len(torn),
                "torn_sha256": hashlib.sha256(torn).hexdigest(), "quarantine_file": evidence.name,
                "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds")}  # fmt: skip

    def _fsync_folder(self) -> None:
        """Make the log's directory entry durable (the file may just have been created)."""
        handle = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)

    def append(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Write ``entry`` (JSON-able; no ``format``, ``seq``, ``prev`` or ``sha256`` keys) as the next line, fsynced
        before returning (and a signed head when one is due); returns the entry as written (with those four).

        Raises:
            OSError: the line could not be written and synced (a full disk, say); every later call raises too, since
                the file may end in a torn line that the chain cannot continue (`failure` says why).
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
                self._failed = f"the audit log {self.path} cannot be written ({error.strerror or error})"
                raise
            self._seq, self._head = full["seq"], _HASH_FIELD.search(line).group(1).decode()
            written = {**full, "sha256": self._head}
            due = self._seq - self._checkpointed[0] >= self.checkpoint_every
            due = self.heads is not None and (due or time.monotonic() - self._checkpointed[1] >= self.checkpoint_s)
            if due:  # claimed here, under the lock: no other append signs this head too
                self._checkpointed = (self._seq, time.monotonic())
        if due:
            self._write_head(written["seq"], written["sha256"])
        return written

    def checkpoint(self) -> dict[str, Any] | None:
        """Write the current head, signed, to the heads file (`workbench.serve.audit_head.Heads.write`); the signed
        head, None without a heads file or when that head was written already. A head that cannot be written marks
        the log failed, as a line would."""
        if self.heads is None:
            return None
        with self._lock:
            seq, head = self._seq, self._head
            self._checkpointed = (seq, time.monotonic())
        return self._write_head(seq, head)

    def _write_head(self, seq: int, head: str) -> dict[str, Any] | None:
        """Sign and write the head ``(seq, head)``; None when a head as late was written already (by another
        thread): the heads file never holds one head twice or a later one before an earlier."""
        with self._heads_lock:
            if seq <= self._head_written:
                return None
            try:
                signed = self.heads.write(self.path.name, seq, head)
            except OSError as error:
                with self._lock:
                    self._failed = (f"the audit heads file {self.heads.path} cannot be written "
                                    f"({error.strerror or error})")  # fmt: skip
                raise
            self._head_written = seq
            return signed

    def close(self) -> None:
        """Write a last signed head when lines came since the last one, then release the log (its lock goes with the
        file descriptor)."""
        if self._fd < 0:
            return
        if self.heads is not None and not self._failed and self._seq > self._checkpointed[0]:
            try:
                self.checkpoint()
            except OSError:
                pass  # `failure` says why; the log itself is intact
        os.close(self._fd)
        self._fd = -1

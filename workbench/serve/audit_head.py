"""Signed heads of an audit log: what proves that no line was removed from its end and that it was not rewritten.

A head is ``{"format", "log", "seq", "head", "time"}`` (the log's file name, its line count, the ``sha256`` of its
last line, UTC time) signed with the key that signs run seals (`workbench.core.sealkeys`): ``key_id``,
``public_key`` and ``signature`` (ed25519 over the head's canonical JSON without ``signature``). The server writes
one to its heads file (`Heads`: a second location, ``--audit-heads``; one JSON line each, fsynced) every so many
lines and at shutdown, and answers ``GET /audit/head`` with a fresh one.

`check_heads` tests a log against heads kept elsewhere: each must be signed by a trusted key and name a line of the
log at its ``seq``. A log cut short, emptied or rewritten (even with a recomputed chain) fails: its lines no longer
hold the signed hashes. ``workbench audit verify LOG --expect-head SHA256`` does the same for one hash noted by hand.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from workbench.core import sealkeys
from workbench.core.errors import UserError
from workbench.serve.audit import LogCheck, verify_log

#: The ``format`` of a signed head.
FORMAT = "workbench-audit-head/1"


def sign_head(log_name: str, seq: int, head: str, **extra: Any) -> dict[str, Any]:
    """The signed head of the log ``log_name`` at line ``seq`` (whose sha256 is ``head``), with ``extra`` fields
    (signed too)."""
    record = {"format": FORMAT, "log": log_name, "seq": seq, "head": head,
              "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), **extra}  # fmt: skip
    return _signed(record)


def _canonical(record: dict[str, Any]) -> bytes:
    """What a signature covers: ``record`` without ``signature``, as canonical JSON."""
    body = {key: value for key, value in record.items() if key != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _signed(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with ``key_id``, ``public_key`` and ``signature`` (ed25519 over `_canonical`) added."""
    key = sealkeys.signing_key()
    raw = sealkeys.raw_public(key.public_key())
    record = {**record, "key_id": sealkeys.key_id(raw), "public_key": sealkeys.encode(raw)}
    return {**record, "signature": sealkeys.encode(key.sign(_canonical(record)))}


def _signature_problem(record: dict[str, Any]) -> str | None:
    """Why ``record``'s signature does not prove it (not signed, a bad signature, a key not trusted here)."""
    try:
        raw = sealkeys.decode(record.get("public_key"), "public key")
        signature = sealkeys.decode(record.get("signature"), "signature")
    except ValueError as error:
        return f"not signed ({error})"
    if not sealkeys.signature_holds(raw, signature, _canonical(record)):
        return "its signature does not match its content (the head was edited)"
    key = sealkeys.key_id(raw)
    if record.get("key_id") != key:
        return f"its key_id {record.get('key_id')!r} is not its public key's ({key})"
    if key not in sealkeys.trusted_keys():
        return (f"signed by key {key}, which this machine does not trust (add 'NAME {record['public_key']}' to "
                f"{sealkeys.trusted_path()} if that key is yours)")  # fmt: skip
    return None


class Heads:
    """The file the server writes its signed heads to, one JSON line each (created with mode 0600).

    Args:
        path: the heads file; never the log itself (keep it on another disk or machine where you can).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.is_dir():
            raise UserError(f"--audit-heads {self.path}: a folder; give a file name (a .jsonl file)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sealkeys.signing_key()  # the key is found (or made) now, not at the first head

    def write(self, log_name: str, seq: int, head: str) -> dict[str, Any]:
        """Append the signed head (`sign_head`) and fsync it; returns it.

        Raises:
            OSError: it could not be written.
        """
        signed = sign_head(log_name, seq, head)
        line = json.dumps(signed, sort_keys=True, separators=(",", ":")).encode() + b"\n"
        handle = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if os.write(handle, line) != len(line):
                raise OSError(f"{self.path}: short write")
            os.fsync(handle)
        finally:
            os.close(handle)
        return signed


def read_heads(path: str | Path) -> list[dict[str, Any]]:
    """The signed heads in the heads file ``path``, in order.

    Raises:
        UserError: the file is missing, or a line is not a signed head (naming it).
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--since-checkpoint {path}: no such file (give the heads file workbench serve "
                        "--audit-heads wrote)")  # fmt: skip
    heads = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            head = json.loads(raw)
        except ValueError:
            raise UserError(f"{path}: line {number}: not JSON (expected a signed audit head)") from None
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            raise UserError(f"{path}: line {number}: not a {FORMAT} line")
        heads.append(head)
    return heads


def check_heads(log: str | Path, heads: list[dict[str, Any]] = (), expect_head: str | None = None) -> list[str]:
    """Why the audit log ``log`` does not hold the signed ``heads`` (and the hash ``expect_head``): one line per
    problem, none when it holds them all. Its own chain is checked too (`verify_log`)."""
    wanted = [h.get("head") for h in heads if isinstance(h.get("head"), str)] + [expect_head or ""]
    check = verify_log(log, wanted=[w for w in wanted if w])
    problems = [] if check.ok else [check.summary()]
    if expect_head is not None and expect_head not in check.found:
        problems.append(f"{log}: no intact line has sha256 {expect_head} (lines were removed from the end, or the "
                        "log was emptied or rewritten)")  # fmt: skip
    for index, head in enumerate(heads, start=1):
        problem = _head_problem(check, head)
        if problem:
            problems.append(f"signed head {index} (seq {head.get('seq')}, {head.get('time')}): {problem}")
    return problems


def _head_problem(check: LogCheck, head: dict[str, Any]) -> str | None:
    """Why one signed head is not borne out by the log ``check`` read."""
    why = _signature_problem(head)
    if why:
        return why
    if head.get("log") != check.path.name:
        return f"signed for the log {head.get('log')!r}, not {check.path.name!r}"
    if head["seq"] == 0:
        return None
    if head["head"] not in check.found:
        return (f"the log has no intact line with its sha256 {head['head']} (lines were removed from the end, or the "
                "log was emptied or rewritten)")  # fmt: skip
    if check.found[head["head"]] != head["seq"]:
        return f"its line is at seq {check.found[head['head']]}, not {head['seq']}"
    return None

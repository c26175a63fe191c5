"""``workbench serve``: a finished run's model under uvicorn, with a graceful shutdown.

The first SIGTERM (or Ctrl-C) starts draining: the listening socket stays open, new requests get 503 (`Gate`), the
requests in flight finish and get their answers and audit lines; once none is left (or ``drain_s`` has passed)
uvicorn shuts down and the command exits 0. A second signal stops waiting (uvicorn's own shutdown: a second Ctrl-C
forces it).

Each server writes its requests' files into a spool folder of its own, ``workbench-serve-<pid>`` under the spool
root (``spool_dir``, else the environment variable `SPOOL_VARIABLE`, else the system's temporary folder), removed when
it stops; at start it removes the spool folders that servers of the same user left when they were killed (their pid no
longer alive), so uploads do not stay on disk after ``kill -9``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import uvicorn

from workbench.core.errors import UserError
from workbench.core.seal import run_folder_above
from workbench.serve.app import Gate, create_app
from workbench.serve.audit import AuditLog
from workbench.serve.audit_head import Heads
from workbench.serve.auth import load_tokens
from workbench.serve.limits import Limits

log = logging.getLogger("workbench.serve")

#: The environment variable naming the spool root when ``spool_dir`` is not given.
SPOOL_VARIABLE = "WORKBENCH_SERVE_SPOOL"
_SPOOL = re.compile(r"^workbench-serve-(\d+)$")


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def spool_folder(spool_dir: str | Path | None = None) -> Path:
    """This server's own spool folder (created, mode 700), after removing those of dead servers (module
    docstring)."""
    root = Path(spool_dir or os.environ.get(SPOOL_VARIABLE) or tempfile.gettempdir())
    if not root.is_dir():
        raise UserError(f"spool folder {root}: no such folder (set {SPOOL_VARIABLE} or give an existing folder)")
    for left in root.iterdir():
        found = _SPOOL.match(left.name)
        if found and int(found.group(1)) != os.getpid() and not _alive(int(found.group(1))):
            if left.is_dir() and not left.is_symlink() and left.stat().st_uid == os.getuid():
                log.info("removing %s, left by a server that no longer runs", left)
                shutil.rmtree(left, ignore_errors=True)
    own = root / f"workbench-serve-{os.getpid()}"
    shutil.rmtree(own, ignore_errors=True)  # a folder of a dead process whose pid this one has
    own.mkdir(mode=0o700)
    return own


class _DrainingServer(uvicorn.Server):
    """uvicorn's server whose first exit signal drains the `Gate` before the shutdown begins."""

    def __init__(self, config: uvicorn.Config, gate: Gate, drain_s: float):
        super().__init__(config)
        self.gate, self.drain_s, self.drain_started = gate, drain_s, None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.drain_started is None:
            log.info("draining: new requests get 503; %d in flight finish first", self.gate.in_flight)
            self.gate.draining, self.drain_started = True, time.monotonic()
        else:
            super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None and not self.should_exit:
            waited = time.monotonic() - self.drain_started
            if self.gate.in_flight == 0 or waited > self.drain_s:
                self.should_exit = True
        return await super().on_tick(counter)


def default_audit_log(run: Path) -> Path:
    """Where the audit log goes without ``--audit-log``: ``audit-<run folder name>.jsonl`` in the current folder."""
    return Path(f"audit-{Path(run).resolve().name}.jsonl")


def default_audit_heads(audit_log: Path) -> Path:
    """Where the signed heads go without ``--audit-heads``: ``<log>.heads.jsonl`` beside the log (give another disk or
    a mounted share where you can: a copy that survives the log's folder)."""
    return audit_log.with_name(f"{audit_log.name}.heads.jsonl")


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (a `UserError` when that cannot be)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        why = "in use by another program" if error.errno == errno.EADDRINUSE else error.strerror
        raise UserError(f"--host {host} --port {port}: cannot listen there ({why}); choose another --port") from None
    return sock


def serve(run: str | Path, *, host: str = "127.0.0.1", port: int = 8000, intake: str | Path | None = None,
          token_file: str | Path | None = None, audit_log: str | Path | None = None,
          audit_heads: str | Path | None = None, limits: Limits = Limits(), trust_modified: bool = False,
          workers: int | None = None, device: str = "auto", spool_dir: str | Path | None = None,
          calibration: str | Path | None = None) -> None:  # fmt: skip
    """Serve the finished run ``run`` until SIGTERM or Ctrl-C (`workbench.serve.app` has the routes).

    Checked in this order, before the model is loaded: the tokens (`workbench.serve.auth.load_tokens`), the intake
    folder, the audit log (not inside a run folder; an existing one is verified and continued), the port; then the
    run is verified against its seal and loaded once.

    Args:
        run: a finished run folder (``workbench adapt --out``).
        host, port: where to listen (loopback by default; elsewhere, put a TLS proxy in front: tokens travel in
            clear).
        intake: a folder whose files JSON requests may name (None: uploads only).
        token_file: ``caller_id token`` lines (None: the environment variable ``WORKBENCH_SERVE_TOKENS``).
        audit_log: the JSON-lines audit log (default `default_audit_log`).
        audit_heads: where the log's signed heads go (default `default_audit_heads`).
        limits: request limits.
        trust_modified: serve a run whose files differ from its seal (recorded in ``/model``'s ``run_seal``).
        workers: threads answering requests (default: the CPU count, at most 4).
        device: where the model computes (``--device``, `workbench.core.device.resolve`).
        spool_dir: where this server's spool folder goes (module docstring; None: ``$WORKBENCH_SERVE_SPOOL``, else
            the system's temporary folder).
        calibration: a layer of ``workbench calibrate`` answering instead of the run's own clinical files (verified
            with the run: `workbench.clinical.site_calibration.check_layer`).

    Raises:
        UserError: one of the checks above fails.
    """
    from workbench.clinical.predictor import ClinicalPredictor

    tokens = load_tokens(token_file)
    intake_folder = None
    if intake is not None:
        intake_folder = Path(intake).resolve()
        if not intake_folder.is_dir():
            raise UserError(f"--intake {intake}: no such folder")
    audit_path = Path(audit_log) if audit_log is not None else default_audit_log(Path(run))
    inside = run_folder_above(audit_path.parent)
    if inside is not None:
        raise UserError(f"--audit-log {audit_path}: inside the run folder {inside}; logs are never written into a run "
                        "folder: choose an --audit-log outside it")  # fmt: skip
    if not Path(run).is_dir():
        raise UserError(f"--run {run}: no such folder (give a finished run: workbench adapt --out)")
    heads_path = Path(audit_heads) if audit_heads is not None else default_audit_heads(audit_path)
    if heads_path.resolve() == audit_path.resolve() or run_folder_above(heads_path.parent) is not None:
        raise UserError(f"--audit-heads {heads_path}: the audit log itself or inside a run folder; give a file "
                        "elsewhere (another disk where you can)")  # fmt: skip
    created = [path for path in (audit_path, heads_path) if not path.exists()]
    audit = AuditLog(audit_path, heads=Heads(heads_path))
    sock = spool = None
    started = False
    try:
        sock = _listening_socket(host, port)
        spool = spool_folder(spool_dir)
        predictor = ClinicalPredictor.load(run, trust_modified=trust_modified, device=device, calibration=calibration)
        threads = workers or max(1, min(4, os.cpu_count() or 1))
        gate = create_app(predictor, tokens, audit, limits, intake_folder, workers=threads, spool=spool)
        if host not in ("127.0.0.1", "::1", "localhost"):
            log.warning("listening on %s: bearer tokens travel in clear; put a TLS proxy in front", host)
        config = uvicorn.Config(gate, log_level="info", timeout_graceful_shutdown=int(limits.timeout_s) + 5,
                                server_header=False)  # fmt: skip
        where = f"http://{host}:{sock.getsockname()[1]}"
        print(f"serving {run} on {where} (POST /predict, GET /model, GET /audit/head, GET /dashboard, GET /health); "
              f"audit log {audit_path}, signed heads {heads_path}", flush=True)  # fmt: skip
        started = True
        _DrainingServer(config, gate, drain_s=limits.timeout_s + 5).run(sockets=[sock])
    finally:
        if sock is not None:
            sock.close()
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
        _close_audit(audit, created if not started else [])


def _close_audit(audit: AuditLog, created: list[Path]) -> None:
    """Close the audit log; a start that failed before serving removes the log and heads files it created, when the
    log holds no line (nothing was answered: an empty log would only mislead)."""
    if created and audit.head[0] == 0:
        audit.heads = None  # no closing head for a log about to be removed
        audit.close()
        for path in created:
            path.unlink(missing_ok=True)
        return
    audit.close()

"""``workbench serve`` (a finished run's model over HTTP, with an audit log) and ``workbench audit verify`` (that
log's hash chain)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from workbench.cli.flags import _add_device, _add_threads, _add_trust_modified
from workbench.cli.predict import _add_calibration
from workbench.core.errors import UserError


def _add_serve_commands(commands: Any) -> None:
    """``serve`` (a finished run over HTTP) and ``audit verify`` (its log's hash chain)."""
    from workbench.serve.limits import Limits

    default = Limits()
    serve = commands.add_parser("serve", help="answer records over HTTP with a finished run's model, with an audit "
                                "log (needs the serve extra)")  # fmt: skip
    serve.add_argument("--run", required=True, metavar="RUN", help="run directory (from workbench adapt)")
    serve.add_argument("--host", default="127.0.0.1", metavar="ADDRESS", help="address to listen on (default: "
                       "127.0.0.1; elsewhere put a TLS proxy in front)")  # fmt: skip
    serve.add_argument("--port", type=int, default=8000, metavar="INT", help="port (default: 8000)")
    serve.add_argument("--intake", metavar="DIR", help="folder whose records JSON requests may name by a relative "
                       "path (default: uploads only)")  # fmt: skip
    serve.add_argument("--token-file", metavar="FILE", help="lines 'caller_id token' (default: the environment "
                       "variable WORKBENCH_SERVE_TOKENS)")  # fmt: skip
    serve.add_argument("--audit-log", metavar="FILE", help="hash-chained JSON-lines log, one line per request; an "
                       "existing one is verified and continued (default: audit-<run name>.jsonl here)")  # fmt: skip
    serve.add_argument("--audit-heads", metavar="FILE", help="where the log's signed heads go, every 100 lines, 5 "
                       "minutes and at shutdown (default: <audit log>.heads.jsonl; another disk where you can)")
    serve.add_argument("--max-request-mb", type=float, default=default.max_request_bytes / 2**20, metavar="FLOAT",
                       help=f"largest request body [MiB] (default: {default.max_request_bytes / 2**20:g})")  # fmt: skip
    serve.add_argument("--max-record-s", type=float, default=default.max_record_seconds, metavar="FLOAT",
                       help=f"longest signal record [s] (default: {default.max_record_seconds:g})")  # fmt: skip
    serve.add_argument("--max-pixels", type=int, default=default.max_pixels, metavar="INT",
                       help=f"largest image, told by its header (default: {default.max_pixels})")  # fmt: skip
    serve.add_argument("--timeout-s", type=float, default=default.timeout_s, metavar="FLOAT",
                       help=f"time to answer one request [s], else 504 (default: {default.timeout_s:g})")  # fmt: skip
    serve.add_argument("--check-memory-mb", type=int, default=default.check_memory_mb, metavar="INT",
                       help="memory a worker checking an upload's headers may use [MiB] (default: "
                       f"{default.check_memory_mb}); past it: 413")  # fmt: skip
    serve.add_argument("--check-s", type=float, default=default.check_seconds, metavar="FLOAT",
                       help=f"time one upload's check may take [s] (default: {default.check_seconds:g}); past it: 413")
    serve.add_argument("--max-json-mb", type=float, default=default.max_json_bytes / 2**20, metavar="FLOAT",
                       help="largest uploaded JSON file, such as a questions file [MiB] (default: "
                       f"{default.max_json_bytes / 2**20:g})")  # fmt: skip
    serve.add_argument("--max-questions", type=int, default=default.max_questions, metavar="INT",
                       help=f"most records in one uploaded JSON list (default: {default.max_questions})")
    serve.add_argument("--spool-dir", metavar="DIR", help="where the server keeps each request's files while it "
                       "answers (default: $WORKBENCH_SERVE_SPOOL, else the system's temporary folder)")  # fmt: skip
    _add_calibration(serve)
    _add_trust_modified(serve)
    _add_threads(serve)
    _add_device(serve)

    audit = commands.add_parser("audit", help="check a served model's audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    audit_verify = audit_commands.add_parser("verify", help="check every line's hash and the chain between lines")
    audit_verify.add_argument("log", metavar="FILE", help="the log workbench serve --audit-log wrote")
    audit_verify.add_argument("--expect-head", metavar="SHA256", help="a line hash noted elsewhere (GET "
                              "/audit/head): the log must still hold it")  # fmt: skip
    audit_verify.add_argument("--since-checkpoint", metavar="FILE", help="the signed heads file (workbench serve "
                              "--audit-heads): every head must be signed by a trusted key and held by the log")


def run_serve(args: argparse.Namespace) -> int:
    """``workbench serve``: the limits from the flags, then `workbench.serve.server.serve` until SIGTERM."""
    from workbench.serve.limits import Limits

    for flag, value in (("--max-request-mb", args.max_request_mb), ("--max-record-s", args.max_record_s),
                        ("--max-pixels", args.max_pixels), ("--timeout-s", args.timeout_s),
                        ("--check-memory-mb", args.check_memory_mb), ("--check-s", args.check_s),
                        ("--max-json-mb", args.max_json_mb), ("--max-questions", args.max_questions)):  # fmt: skip
        if not value > 0:
            raise UserError(f"{flag} {value}: expected a positive number")
    if not 0 <= args.port < 65536:
        raise UserError(f"--port {args.port}: expected 0-65535")
    try:
        from workbench.serve.server import serve
    except ImportError as error:
        raise UserError(f"workbench serve needs the serve extra ({error}): pip install -e \".[serve]\"") from None
    limits = Limits(max_request_bytes=int(args.max_request_mb * 2**20), max_record_seconds=args.max_record_s,
                    max_pixels=args.max_pixels, timeout_s=args.timeout_s, check_memory_mb=args.check_memory_mb,
                    check_seconds=args.check_s, max_json_bytes=int(args.max_json_mb * 2**20),
                    max_questions=args.max_questions)  # fmt: skip
    serve(args.run, host=args.host, port=args.port, intake=args.intake, token_file=args.token_file,
          audit_log=args.audit_log, audit_heads=args.audit_heads, limits=limits, trust_modified=args.trust_modified,
          device=args.device, spool_dir=args.spool_dir, calibration=args.calibration)  # fmt: skip
    return 0


def run_audit(args: argparse.Namespace) -> int:
    """``workbench audit verify LOG [--expect-head SHA256] [--since-checkpoint FILE]``: 0 and a summary when every
    line is intact and the log holds the heads given; else 1, naming each problem on stderr."""
    from workbench.serve.audit import verify_log
    from workbench.serve.audit_head import check_heads, read_heads

    heads = read_heads(args.since_checkpoint) if args.since_checkpoint else []
    if args.expect_head is not None and not re.fullmatch(r"[0-9a-f]{64}", args.expect_head):
        raise UserError(f"--expect-head {args.expect_head!r}: expected a sha256 (64 lowercase hex digits)")
    problems = check_heads(args.log, heads, args.expect_head)
    if problems:
        for problem in problems:
            print(f"workbench: error: {problem}", file=sys.stderr)
        return 1
    check = verify_log(args.log)
    print(check.summary())
    if heads:
        last = heads[-1]
        print(f"ok: {len(heads)} signed head(s) in {args.since_checkpoint} held by the log; the last at seq "
              f"{last['seq']} ({last['time']}, key {last['key_id']}); {check.lines - last['seq']} line(s) after it")
    if args.expect_head is not None:
        print(f"ok: the log holds {args.expect_head}")
    return 0

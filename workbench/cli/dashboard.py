"""``workbench dashboard``: the monitoring page of a served model (`workbench.serve.dashboard`), written offline from
its audit log and run, the same page that ``GET /dashboard`` serves (no token: it reads the files)."""

from __future__ import annotations

import argparse
from typing import Any

from workbench.cli.flags import _add_device, _add_trust_modified


def _add_dashboard_command(commands: Any) -> None:
    """``workbench dashboard --run RUN --audit-log FILE --out FILE [--max-lines INT]``."""
    from workbench.serve.dashboard import MAX_LINES

    dashboard = commands.add_parser("dashboard", help="write the monitoring page of a served model (HTML: requests, "
                                    "shift alarms, conformal sets over time) from its audit log")  # fmt: skip
    dashboard.add_argument("--run", required=True, metavar="RUN", help="the run the server answered with")
    dashboard.add_argument("--audit-log", required=True, metavar="FILE", help="the log workbench serve --audit-log "
                           "writes (read safely while a server appends to it)")  # fmt: skip
    dashboard.add_argument("--out", required=True, metavar="FILE", help="the page to write (.html, outside every run "
                           "folder; an earlier page there is replaced)")  # fmt: skip
    dashboard.add_argument("--max-lines", type=int, default=MAX_LINES, metavar="INT", help="most lines read from the "
                           f"log's end (default: {MAX_LINES}; the page says when earlier lines were left out)")
    _add_trust_modified(dashboard)
    _add_device(dashboard)


def run_dashboard(args: argparse.Namespace) -> int:
    """``workbench dashboard``: the page (`workbench.serve.dashboard.write_page`) and where it went."""
    from workbench.serve.dashboard import write_page

    out = write_page(args.run, args.audit_log, args.out, max_lines=args.max_lines, trust_modified=args.trust_modified,
                     device=args.device)
    print(f"wrote {out}")
    return 0

"""``workbench verify DIR``: a run's or a comparison's files against their seals."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _add_verify_command(commands: Any) -> None:
    """``workbench verify DIR``."""
    verify = commands.add_parser("verify", help="check a run's or a comparison's files against their seals")
    verify.add_argument("folder", metavar="DIR", help="a run (workbench adapt --out) or comparison folder")


def run_verify(args: argparse.Namespace) -> int:
    """``workbench verify``: `_verify` of the folder given."""
    return _verify(args.folder)


def _verify(folder: str) -> int:
    """``workbench verify DIR``: 0 and "ok: N files verified" when every sealed file below ``DIR`` matches its seal
    and every finished run, cell and comparison there has one; else 2, naming each bad file on stderr."""
    from workbench.core.errors import UserError
    from workbench.core.seal import SEAL, verify

    path = Path(folder)
    if not path.is_dir():
        raise UserError(f"{path}: no such folder (give a run or comparison folder)")
    result = verify(path)
    if not (result.checked or result.problems or result.unsealed):
        raise UserError(f"{path}: not a finished run or comparison (no {SEAL}, no metrics.json or comparison.json)")
    for extra in result.extra:
        print(f"not sealed (added after sealing; not checked): {extra}")
    for problem in result.problems:
        print(f"workbench: error: {problem}", file=sys.stderr)
    for unsealed in result.unsealed:
        print(f"workbench: error: {unsealed}: no {SEAL} (written before runs were sealed): cannot be verified",
              file=sys.stderr)  # fmt: skip
    if not result.ok:
        return 2
    print(f"ok: {result.checked} files verified in {path}")
    return 0

"""``workbench verify DIR``: a run's or a comparison's files against their signed seals, folder by folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from workbench.cli.flags import _add_seal_key


def _add_verify_command(commands: Any) -> None:
    """``workbench verify DIR``."""
    verify = commands.add_parser("verify", help="check a run's or a comparison's files against their seals")
    verify.add_argument("folder", metavar="DIR", help="a run (workbench adapt --out) or comparison folder")
    _add_seal_key(verify)


def run_verify(args: argparse.Namespace) -> int:
    """``workbench verify``: `_verify` of the folder given."""
    return _verify(args.folder)


def _verify(folder: str) -> int:
    """``workbench verify DIR``: one line per sealed folder below ``DIR`` ("verified: FOLDER (KIND, key KEY_ID, N
    files)" on stdout, or "workbench: error: FOLDER: not verified: WHY" on stderr, one line per problem), one per
    finished-looking folder without a seal (not complete); then 0 and "ok: N files verified" when everything
    verifies, else 2."""
    from workbench.core.errors import UserError
    from workbench.core.seal import SEAL, verify

    path = Path(folder)
    if not path.is_dir():
        raise UserError(f"{path}: no such folder (give a run or comparison folder)")
    result = verify(path)
    if not (result.folders or result.unsealed):
        raise UserError(f"{path}: not a finished run or comparison (no {SEAL}, no metrics.json or comparison.json)")
    for sealed in result.folders:
        if not sealed.problems:
            print(f"verified: {sealed.path} ({sealed.kind}, key {sealed.key_id}, {sealed.files} files)")
        for problem in sealed.problems:
            print(f"workbench: error: {sealed.path}: not verified: {problem}", file=sys.stderr)
    for unsealed in result.unsealed:
        print(f"workbench: error: {unsealed}: not complete: no {SEAL} (interrupted before it was sealed: resume it "
              "with the same command plus --resume; or written before runs were sealed): cannot be verified",
              file=sys.stderr)  # fmt: skip
    if not result.ok:
        return 2
    print(f"ok: {result.checked} files verified in {path}")
    return 0

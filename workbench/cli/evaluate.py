"""``workbench evaluate``: a finished run re-scored on other data (or its own), with what its seal says."""

from __future__ import annotations

import argparse
from typing import Any

from workbench.cli.flags import _add_settings, _add_trust_modified


def _add_evaluate_command(commands: Any) -> None:
    """``workbench evaluate RUN``: the run, the data and the evaluation's run settings."""
    evaluate = commands.add_parser("evaluate", help="re-score a finished run on other data")
    evaluate.add_argument("run_folder", nargs="?", metavar="RUN", help="run directory (or --run RUN)")
    evaluate.add_argument("--run", metavar="RUN", help="run directory")
    evaluate.add_argument("--data", metavar="PATH", help="data to score on (default: the run's own); its test split "
                          "is used")  # fmt: skip
    evaluate.add_argument("--out", metavar="PATH", default="evaluations", help="where the evaluation's record "
                          "goes: a .json file, or a folder for <run name>-<data stem>.json; never inside a run "
                          "(default: evaluations/ in the current folder)")  # fmt: skip
    _add_settings(evaluate, "evaluate")
    _add_trust_modified(evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    """``workbench evaluate``: the seal line, then one line per metric (`workbench.run.evaluating.evaluate_run`)."""
    from workbench.core.errors import UserError
    from workbench.run.evaluating import evaluate_run

    if (args.run is None) == (args.run_folder is None):
        raise UserError("evaluate needs one run: workbench evaluate RUN (or --run RUN)")
    run_folder = args.run or args.run_folder
    metrics, sealed, written = evaluate_run(run_folder, data=args.data, device=args.device,
                                            trust_modified=args.trust_modified, out=args.out)  # fmt: skip
    print(_seal_line(run_folder, sealed))
    print("\n".join(f"{name:28}{value:12.3f}" for name, value in metrics.items()))
    print(f"record written to {written}")
    return 0


def _seal_line(run: str, sealed: dict[str, Any]) -> str:
    """What ``evaluate`` and ``predict`` print about the run's seal (`workbench.core.seal.check_run`)."""
    if sealed["status"] == "verified":
        return f"run {run}: {sealed['files']} files match its seal.json, signed by key {sealed['key_id']}"
    return f"run {run}: {sealed['status']}: " + "; ".join(sealed["problems"])

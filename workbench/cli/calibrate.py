"""``workbench calibrate``: a run's clinical layer fitted again on a site's own labelled records."""

from __future__ import annotations

import argparse
from typing import Any

from workbench.cli.flags import _add_device, _add_threads, _add_trust_modified


def _add_calibrate_command(commands: Any) -> None:
    """``workbench calibrate --run RUN --data DIR --out LAYER [--seed N] [--overwrite]``."""
    calibrate = commands.add_parser("calibrate", help="fit temperatures, conformal thresholds and the shift reference "
                                    "of a finished run on a site's own labelled records (a sealed layer)")  # fmt: skip
    calibrate.add_argument("--run", required=True, metavar="RUN", help="run directory (from workbench adapt)")
    calibrate.add_argument("--data", required=True, metavar="DIR", help="the site's labelled records, in a layout "
                           "the run's task reads (as workbench adapt --data)")  # fmt: skip
    calibrate.add_argument("--out", required=True, metavar="LAYER", help="new folder for the layer, outside every run "
                           "folder; give it to predict, serve and card as --calibration LAYER")  # fmt: skip
    calibrate.add_argument("--seed", type=int, metavar="INT", help="deals the site's patients into the temperature, "
                           "conformal and report parts (default: the run's seed)")  # fmt: skip
    calibrate.add_argument("--overwrite", action="store_true", help="replace an earlier layer at --out")
    _add_trust_modified(calibrate)
    _add_threads(calibrate)
    _add_device(calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    """``workbench calibrate``: the layer (`workbench.clinical.site_calibration.calibrate`), then its held-out
    report as a short table."""
    from workbench.clinical.site_calibration import calibrate, report_lines

    summary = calibrate(args.run, args.data, args.out, seed=args.seed, overwrite=args.overwrite,
                        trust_modified=args.trust_modified, device=args.device)  # fmt: skip
    temperatures = ", ".join(f"{t:.2f}" for t in summary["calibration"]["temperatures"])
    unfitted = summary["calibration"]["unfitted_classes"]
    print(f"wrote the calibration layer {args.out} (sealed); temperatures {temperatures}"
          + (f" ({len(unfitted)} kept at 1: too few fitting items or one label only)" if unfitted else ""))
    for line in report_lines(summary["site_report"]):
        print(line)
    print(f"use it with: workbench predict --run {args.run} --calibration {args.out} --input DIR --output FILE")
    return 0

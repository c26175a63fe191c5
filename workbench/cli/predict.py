"""``workbench predict``: every record of a folder scored with a finished run's model, into a CSV."""

from __future__ import annotations

import argparse
from typing import Any

from workbench.cli.evaluate import _seal_line
from workbench.cli.flags import _add_device, _add_threads, _add_trust_modified


def _add_calibration(parser: argparse.ArgumentParser) -> None:
    """``--calibration LAYER`` of the commands that use a run's clinical layer (predict, serve, card)."""
    parser.add_argument("--calibration", metavar="LAYER", help="a clinical layer fitted on a site's own records "
                        "(workbench calibrate --out LAYER), used instead of the run's own; verified against its seal "
                        "and its run (default: the run's own layer)")  # fmt: skip


def _add_predict_command(commands: Any) -> None:
    """``workbench predict --run RUN --input DIR --output FILE``."""
    predict = commands.add_parser("predict", help="score every record of a folder with a finished run's model")
    predict.add_argument("--run", required=True, metavar="RUN", help="run directory (from workbench adapt)")
    predict.add_argument("--input", required=True, metavar="DIR",
                         help="folder of inputs (records, files: what the run's task reads)")  # fmt: skip
    predict.add_argument("--output", required=True, metavar="FILE", help="CSV to write (a .json with hashes is "
                         "written beside it); never inside a run folder")  # fmt: skip
    predict.add_argument("--overwrite", action="store_true", help="replace an earlier CSV and record at --output")
    _add_calibration(predict)
    _add_trust_modified(predict)
    _add_threads(predict)
    _add_device(predict)


def run_predict(args: argparse.Namespace) -> int:
    """``workbench predict``: the CSV (`workbench.run.predicting.predict`), and the run's seal when it is not intact."""
    from workbench.run.predicting import predict

    record = predict(
        args.run, args.input, args.output, overwrite=args.overwrite, trust_modified=args.trust_modified,
        device=args.device, calibration=args.calibration,
    )
    if "problems" in record["run_seal"]:
        print(_seal_line(args.run, record["run_seal"]))
    print(f"wrote {record['records']} row(s) to {args.output}, {record['failed']} without scores (see status)")
    for line in _clinical_lines(record.get("clinical")):
        print(line)
    return 0


def _clinical_lines(clinical: dict[str, Any] | None) -> list[str]:
    """What the record's ``clinical`` part says of this batch, in words: the shift verdict and what the conformal
    sets hold (empty without a fitted clinical layer)."""
    if not clinical:
        return []
    lines = []
    layer = clinical.get("layer") or {}
    site = layer.get("source") == "site calibration layer"
    if site:
        lines.append(f"clinical layer: {layer['path']} (fitted on the site's records at {layer.get('data')})")
    shift = clinical.get("shift")
    if shift:
        tested = isinstance(shift.get("statistic"), (int, float)) and isinstance(shift.get("p_value"), (int, float))
        lines.append(f"shift: {shift.get('verdict')}" + (
            f" (statistic {shift['statistic']:.4g}, p = {shift['p_value']:.3g}, {shift.get('batch', '?')} item(s) "
            f"tested against the {'layer' if site else 'run'}'s reference)" if tested else ""))  # fmt: skip
    sets = clinical.get("sets")
    if sets:
        lines.append(f"conformal sets: {sets['all_classes']} of {sets['items']} hold every class ({sets['classes']}) "
                     f"and say nothing, {sets['empty']} are empty; mean size {sets['mean_size']:.2f}")  # fmt: skip
    return lines

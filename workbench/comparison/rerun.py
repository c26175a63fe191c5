"""``workbench compare --rerun-cell``: one recorded cell run again in a temporary folder, its numbers beside the
recorded ones."""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch

from workbench.comparison.cells import lower_is_better, run_cell
from workbench.comparison.design import json_object, plan_cells, read_spec
from workbench.core.errors import UserError
from workbench.core.metrics import check_recorded
from workbench.core.seal import verify, verify_seal

_log = logging.getLogger("workbench")

#: Largest absolute difference of a metric that `rerun_cell` counts as reproduced (CPU reruns with one seed and
#: one thread count are bit-identical).
RERUN_TOLERANCE = 1e-9


#: Relative difference allowed, on top, between a cell whose seeds trained side by side (``--side-by-side``
#: before 0.2) and its rerun alone.
SIDE_BY_SIDE_TOLERANCE = 1e-5


def rerun_cell(out: str | Path, cell_name: str, threads: int | None = None) -> dict[str, Any]:
    """Run the recorded cell ``cell_name`` (`Cell.name`, ``METHOD/fold<k>-seed<s>``) of the comparison in ``out``
    again, as its ``spec.json`` says, in a temporary folder (``out`` is left as it is) and with the CPU threads the
    cell recorded (``threads``: others), and set its numbers beside the recorded ones.

    Returns ``recorded`` and ``rerun`` (metric -> value), ``differences`` (metric -> absolute difference; None where
    one side lacks the metric), ``mismatched`` (the metrics whose difference is missing or above `RERUN_TOLERANCE`,
    plus `SIDE_BY_SIDE_TOLERANCE` of the value for a cell whose seeds trained side by side),
    ``hashes`` (``config_hash`` and ``data_fingerprint``: ``recorded``, ``rerun`` and ``match``, None for a record
    without a manifest), ``changed`` (package versions and commit that differ from the manifest's: "torch 2.6.0 ->
    2.7.0"), ``manifests`` (``recorded``, ``rerun``), ``threads`` and ``matches``: no metric and no hash differs.

    Raises:
        UserError: ``out`` holds no ``spec.json``, or no record of the cell ``cell_name``; the comparison's or the
            cell's seal does not verify (a modified record, `_verify_recorded`); a recorded metric is out of its range.
    """
    out = Path(out)
    if not (out / "spec.json").is_file():
        raise UserError(f"{out}: no spec.json; give the folder of a comparison (the --out of workbench compare)")
    names = sorted(path.parent.relative_to(out / "cells").as_posix() for path in out.glob("cells/*/*/cell.json"))
    if cell_name not in names:
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise UserError(f"{out} has no recorded cell {cell_name!r} (METHOD/fold<k>-seed<s>; its cells: "
                        f"{shown or 'none yet'})")  # fmt: skip
    _verify_recorded(out, cell_name)
    spec = read_spec(out / "spec.json")
    record = json_object(out / "cells" / cell_name / "cell.json")
    if isinstance(record, dict):
        check_recorded(out / "cells" / cell_name / "cell.json", "metrics", record.get("metrics"), lower_is_better(spec))
    if isinstance(record, str) or not isinstance(record.get("seed"), int):
        why = record if isinstance(record, str) else "no seed"
        raise UserError(f"{out / 'cells' / cell_name / 'cell.json'}: damaged ({why}); rerun the comparison (the same "
                        "command) to record that cell again")  # fmt: skip
    cells, _ = plan_cells(dataclasses.replace(spec, seeds=(record["seed"],)))
    cell = next((cell for cell in cells if cell.name == cell_name), None)
    if cell is None:
        raise UserError(f"{out}/spec.json plans no cell {cell_name!r} (was it edited after the comparison ran?)")
    threads = threads or record.get("threads") or 1
    previous = torch.get_num_threads()  # the rerun sets this process's threads: give the caller's back
    try:
        with tempfile.TemporaryDirectory(prefix="workbench-rerun-") as folder:
            rerun = run_cell(spec, cell, folder, threads, share=False)  # computes everything itself
    finally:
        torch.set_num_threads(previous)
    recorded, again = record["metrics"], rerun["metrics"]
    differences = {
        name: _difference(recorded[name], again[name]) if name in recorded and name in again else None
        for name in {**recorded, **again}
    }
    batched = (record.get("seeds_side_by_side") or 1) > 1  # trained batched (before 0.2): equal to rounding

    def allowed(name: str) -> float:
        value = recorded.get(name)
        relative = SIDE_BY_SIDE_TOLERANCE * abs(value) if batched and isinstance(value, (int, float)) else 0.0
        return RERUN_TOLERANCE + relative

    mismatched = [name for name, value in differences.items() if value is None or value > allowed(name)]
    before, after = record.get("manifest") or {}, rerun["manifest"]
    hashes = {
        key: {"recorded": before.get(key), "rerun": after[key], "match": before[key] == after[key] if before else None}
        for key in ("config_hash", "data_fingerprint")
    }
    return {
        "cell": cell_name,
        "threads": threads,
        "recorded": recorded,
        "rerun": again,
        "differences": differences,
        "mismatched": mismatched,
        "hashes": hashes,
        "changed": _changed(before, after),
        "manifests": {"recorded": before or None, "rerun": after},
        "matches": not mismatched and all(entry["match"] is not False for entry in hashes.values()),
    }


def _verify_recorded(out: Path, cell_name: str) -> None:
    """The comparison's own seal (its ``spec.json``) and the cell's (its record and run) verify: a rerun is compared
    only with a record as it was written.

    Raises:
        UserError: naming the first problem: a modified record is reported as such, never as a method that does not
            reproduce.
    """
    cell = verify(out / "cells" / cell_name)
    problems = cell.problems + [verify_seal(folder)[0] for folder in cell.unsealed] + verify_seal(out)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"{problems[0]}{more}; the recorded cell or its comparison was modified after it was "
                        f"written (or is not sealed by a trusted key), so a rerun cannot be compared with it: "
                        f"workbench verify {out}")  # fmt: skip


def _changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The package versions and the commit of manifest ``after`` that differ from ``before``'s ("torch 2.6.0 ->
    2.7.0"); none when ``before`` is empty (a record without a manifest)."""
    if not before:
        return []
    pairs = [(name, before["versions"].get(name), version) for name, version in after["versions"].items()]
    pairs.append(("commit", before["commit"], after["commit"]))
    return [f"{name} {old} -> {new}" for name, old, new in pairs if old != new]


def _difference(recorded: Any, rerun: Any) -> float | None:
    """|recorded − rerun| of one metric's values: 0 for equal ones (two nulls, two NaNs), inf for a NaN and a number,
    None for unequal values that are not both numbers."""
    if recorded == rerun:
        return 0.0
    if not all(isinstance(value, (int, float)) for value in (recorded, rerun)):
        return None
    if math.isnan(recorded) and math.isnan(rerun):
        return 0.0
    difference = abs(recorded - rerun)
    return math.inf if math.isnan(difference) else difference

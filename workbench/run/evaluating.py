"""Re-score a finished run on its own or other data (``workbench evaluate``): its record goes outside the run.

A run is sealed when it finishes (`workbench.core.seal`): nothing is written into it afterwards. The record of an
evaluation (the data, the test samples, the metrics and what the run's seal said) is written to ``out``, a file or a
folder outside every run and comparison folder (``workbench evaluate``'s default: ``evaluations/<run name>-<data
stem>.json`` in the current folder; the data stem of the run's own data when none are given).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.core import device as placement
from workbench.core.checkpoint import write_json
from workbench.core.errors import UserError
from workbench.core.finished import Run
from workbench.core.registry import tasks
from workbench.core.seal import check_run, run_folder_above
from workbench.run.rundir import claim_file


def evaluate(
    run: str | Path, data: str | None = None, device: str = "auto", trust_modified: bool = False,
    out: str | Path | None = None,
) -> dict[str, float]:
    """Re-score a finished run on the test split of ``data`` (default: its own data); returns the metrics.

    The run's files are verified against its seal first (`workbench.core.seal.check_run`): a run that does not verify
    is a `UserError` naming why, unless ``trust_modified``. ``out``: where the record goes (`record_path`; None:
    nothing is written)."""
    return evaluate_run(run, data, device, trust_modified, out)[0]


def record_path(out: str | Path, run: str | Path, data: str | None) -> Path:
    """The evaluation record's file: ``out`` itself when it ends in ``.json``, else ``out/<run name>-<data
    stem>.json`` (``data``: the data scored; None: the task's default data, ``default-data``).

    Raises:
        UserError: the file would be inside a run or comparison folder (`workbench.core.seal.run_folder_above`), or
            is a folder.
    """
    out = Path(out)
    stem = Path(data).stem if data else "default-data"
    path = out if out.suffix.lower() == ".json" else out / f"{Path(run).resolve().name}-{stem}.json"
    inside = run_folder_above(path.parent)
    if inside is not None:
        raise UserError(f"--out {out}: inside the run folder {inside}; an evaluation is never written into a run or "
                        "comparison folder (that would break its seal): choose an --out outside it")  # fmt: skip
    if path.is_dir():
        raise UserError(f"--out {out}: {path} is a folder; give a .json file name or a folder for it")
    return path


def evaluate_run(
    run: str | Path, data: str | None = None, device: str = "auto", trust_modified: bool = False,
    out: str | Path | None = None,
) -> tuple[dict[str, float], dict[str, Any], Path | None]:
    """`evaluate`, with what `workbench.core.seal.check_run` said of the run's seal and where the record went (None:
    not written) (``workbench evaluate`` prints them).

    The data are read with the run's preprocessing (`workbench.core.task.Task.use_run_state`, as `predict` does). The
    output is checked before the run is read, and written (atomically, under its lock) once the metrics are known."""
    config = Run.read_config(run)
    source = data if data is not None else config.data
    target = record_path(out, run, source) if out is not None else None
    sealed = check_run(run, trust_modified)  # before anything the run wrote is used
    device = placement.resolve(device)
    finished = Run.load(run, device, sealed=sealed)
    task = tasks.get(config.task)(**config.task_options)
    task.use_run_state(json.loads((finished.path / "adapter.json").read_text())["task_state"])
    raw = task.read(source, config.seed)
    if data is None and config.split is not None:
        raw = task.hold_out(raw, config.split)
    samples = task.test_samples(finished.model, raw)
    evaluation = task.evaluate(finished.model, samples, device)
    if target is not None:
        with claim_file(target):
            write_json(target, {"run": str(finished.path), "data": source or "the task's default data",
                                "test_samples": len(samples), "metrics": evaluation.metrics, "run_seal": sealed})
    return evaluation.metrics, sealed, target

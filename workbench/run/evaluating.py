"""Re-score a finished run on its own or other data (``workbench evaluate``): writes ``evaluations/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.core import device as placement
from workbench.core.checkpoint import write_json
from workbench.core.finished import Run
from workbench.core.registry import tasks
from workbench.core.seal import check_run
from workbench.run.rundir import claim_run_dir


def evaluate(
    run: str | Path, data: str | None = None, device: str = "auto", trust_modified: bool = False
) -> dict[str, float]:
    """Re-score a finished run on the test split of ``data`` (default: its own data); writes ``evaluations/``.

    The run's files are verified against its seal first (`workbench.core.seal.check_run`): a file changed after the run
    finished is a `UserError` naming it, unless ``trust_modified``. Returns the metrics."""
    return evaluate_run(run, data, device, trust_modified)[0]


def evaluate_run(
    run: str | Path, data: str | None = None, device: str = "auto", trust_modified: bool = False
) -> tuple[dict[str, float], dict[str, Any]]:
    """`evaluate`, with what `workbench.core.seal.check_run` said of the run's seal (``workbench evaluate`` prints it).

    The data are read with the run's preprocessing (`workbench.core.task.Task.use_run_state`, as `predict` does)."""
    config = Run.read_config(run)
    sealed = check_run(run, trust_modified)  # before anything the run wrote is used
    device = placement.resolve(device)
    finished = Run.load(run, device)
    task = tasks.get(config.task)(**config.task_options)
    task.use_run_state(json.loads((finished.path / "adapter.json").read_text())["task_state"])
    source = data if data is not None else config.data
    raw = task.read(source, config.seed)
    if data is None and config.split is not None:
        raw = task.hold_out(raw, config.split)
    samples = task.test_samples(finished.model, raw)
    evaluation = task.evaluate(finished.model, samples, device)
    with claim_run_dir(finished.path, resume=True):
        write_json(
            finished.path / "evaluations" / f"{Path(source).stem if source else 'default-data'}.json",
            {"data": source or "the task's default data", "test_samples": len(samples), "metrics": evaluation.metrics,
             "run_seal": sealed},
        )  # fmt: skip
    return evaluation.metrics, sealed

"""Score a folder of inputs with a finished run (``workbench predict``): a CSV and its record, written as a pair."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from workbench.core.errors import UserError
from workbench.core.finished import Run
from workbench.core.registry import tasks
from workbench.core.seal import check_run, sha256_file
from workbench.core.task import Predictions
from workbench.run.rundir import claim_file


def predict(
    run: str | Path, input: str | Path, output: str | Path, *, overwrite: bool = False, trust_modified: bool = False,
    device: str | torch.device = "auto", calibration: str | Path | None = None,
) -> dict[str, Any]:
    """Score every input of the folder ``input`` with a finished run's merged model on ``device``
    (``workbench predict``).

    Writes ``output`` (CSV, one row per input: the task's columns and a ``status`` saying why a bad input has no
    scores; for a run with a ``clinical.json``, `workbench.clinical.predictor`'s ``calibrated_p_<class>`` and
    ``conformal_set`` columns) and beside it ``<output stem>.json``: sha256 of the base model's files, the adapter,
    the data card and the CSV, what the run's seal said (``run_seal``), the facts the task adds (classes,
    thresholds, ...), the workbench version, and ``clinical`` (calibration, conformal level, the shift alarm's
    statistic, p-value and verdict for the whole input folder; None for a run without). With ``calibration`` (a
    layer of ``workbench calibrate``, fitted on a site's records), that layer's clinical files are used instead of
    the run's, once it verifies and is found to belong to the run (`workbench.clinical.site_calibration.check_layer`);
    ``clinical.layer`` says which were used. Returns that record.

    Before the model is loaded and any input scored: the run's files are verified against its seal (a changed file
    is a `UserError` naming it unless ``trust_modified``: then the record says so), and the output is checked
    (`workbench.run.outputs`): a ``.csv`` outside every run folder, not a folder, in a writable folder with room for it,
    and not there yet unless ``overwrite``. The CSV and its record are written as a pair under the output's lock
    (`workbench.run.outputs.write_pair`: a reader never sees a CSV beside the record of another write). Inputs are made
    with the run's preprocessing (`workbench.core.task.Task.use_run_state`, as `evaluate` does).

    Raises:
        UserError: besides the checks above, when no input could be scored (nothing is written then).
    """
    from workbench.clinical.predictor import ClinicalPredictor
    from workbench.run.outputs import check_location, check_output, record_path, write_pair

    folder, output = Path(input), Path(output)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (give --input a folder of inputs)")
    check_location(output)
    config = Run.read_config(run)
    task = tasks.get(config.task)(**config.task_options)
    if "predict" not in task.capabilities:
        raise UserError(f"task '{config.task}' has no batch prediction (workbench predict)")
    sealed = check_run(run, trust_modified)  # before anything the run wrote is used
    if calibration is not None:  # refused before the model is loaded
        from workbench.clinical.site_calibration import check_layer

        calibration = check_layer(calibration, run)  # verified once, here
    with claim_file(output):  # the output is this process's from its check to its last rename
        check_output(output, overwrite, _output_estimate(folder))
        finished = Run.load(run, device, sealed=sealed)  # verified once, above
        adapter = json.loads((finished.path / "adapter.json").read_text())
        task.use_run_state(adapter["task_state"])
        predictor = ClinicalPredictor(finished.path, config, task, finished.model, adapter, sealed, shift_window=0,
                                      calibration=calibration)  # fmt: skip
        predictions, _, clinical = predictor.predict(folder)  # + calibrated probabilities and conformal sets
        statuses = [row.get("status", "ok") for row in predictions.rows]
        if all(status != "ok" for status in statuses):
            first = next(iter(predictions.rows), {})
            example = f" (the first, {first.get('record', '?')}: {first.get('status')})" if first else ""
            raise UserError(f"{folder}: no input could be scored: all {len(statuses)} failed{example}; nothing was "
                            f"written to {output}")  # fmt: skip (every task gives a bad input a row: never 0 rows)
        table = _csv(predictions)
        provenance = _provenance(finished, config, task, adapter, sealed)
        files = provenance.pop("sha256")
        record = {
            **provenance,
            "input": str(folder),
            "output": str(output),
            "records": len(predictions.rows),
            "failed": sum(status != "ok" for status in statuses),
            **predictions.facts,
            "clinical": (_clinical_record(predictor.describe(), clinical, predictions.rows,
                                          adapter["task_state"].get("classes") or [])
                         if predictor.summary is not None else None),  # fmt: skip
            "sha256": {**files, "csv": hashlib.sha256(table).hexdigest()},
        }
        content = (json.dumps(record, indent=2) + "\n").encode()
        check_output(output, True, len(table) + len(content))  # the exact size, now that it is known
        write_pair(output, table, record_path(output), content)
    return record


def _csv(predictions: Predictions) -> bytes:
    """The predictions as CSV bytes: a header of the task's columns, one row per input."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=predictions.columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(predictions.rows)
    return text.getvalue().encode()


def _provenance(finished: Run, config: Any, task: Any, adapter: dict[str, Any], sealed: dict[str, Any]
                ) -> dict[str, Any]:  # fmt: skip
    """What made the predictions: the workbench version, the time, the run and its seal, the method, and sha256 of
    the base model's files, the adapter and the data cards (``sha256``; the CSV's is added once it is written)."""
    import workbench
    from workbench.core.datacard import load_card

    cards = [task.card] if config.data is None else list(task.reads or (task.card,))
    return {
        "workbench_version": workbench.__version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run": str(finished.path),
        "run_seal": sealed,
        "task": config.task,
        "method": adapter["method"],
        "method_options": adapter["options"],
        "sha256": {
            "base_model": {str(p): sha256_file(p) for p in task.model_files(config.model) if Path(p).is_file()},
            "adapter": {name: sha256_file(finished.path / name) for name in ("adapter.safetensors", "adapter.json")},
            "data_cards": {name: sha256_file(Path(load_card(name).path)) for name in cards},
        },
    }


def _clinical_record(described: dict[str, Any], batch: dict[str, Any], rows: list[dict[str, Any]],
                     classes: list[str]) -> dict[str, Any]:  # fmt: skip
    """The prediction record's ``clinical`` part: the calibration and conformal settings, the alarm's test, which
    clinical layer gave them (``layer``: the run's own or a site's), and for this batch the shift statistic, p-value
    and verdict, the kind of conformal sets given and what they hold (`set_sizes`)."""
    return {"calibration": described["calibration"], "conformal": described["conformal"],
            "shift_test": described["shift"], "shift": batch["shift"], "conformal_kind": batch["conformal_kind"],
            "sets": set_sizes(rows, len(classes)), "layer": described["clinical_layer"]}  # fmt: skip


def set_sizes(rows: list[dict[str, Any]], classes: int) -> dict[str, Any] | None:
    """What the scored rows' conformal sets (``conformal_set``: class names joined by ``|``) hold: ``items``, those
    holding every one of the ``classes`` (``all_classes``: they do not narrow the answer), the ``empty`` ones and
    the mean size; None when no row has a set."""
    sizes = [len([name for name in str(row["conformal_set"]).split("|") if name]) for row in rows
             if row.get("status", "ok") == "ok" and row.get("conformal_set") is not None]  # fmt: skip
    if not sizes or classes < 1:
        return None
    return {"items": len(sizes), "classes": classes, "all_classes": sum(size >= classes for size in sizes),
            "empty": sum(size == 0 for size in sizes), "mean_size": sum(sizes) / len(sizes)}  # fmt: skip


def _output_estimate(folder: Path) -> int:
    """What ``predict``'s output needs before anything is scored [bytes]: a lower estimate (`OUTPUT_BYTES_PER_INPUT`
    per file of the input folder), so that a nearly full disk is refused early and no output is refused that could
    fit; the exact size is checked again before writing."""
    return OUTPUT_BYTES_PER_INPUT * sum(1 for path in folder.rglob("*") if path.is_file())


#: Bytes of predictions per input file that `_output_estimate` counts (one CSV row of a handful of scores).
OUTPUT_BYTES_PER_INPUT = 256

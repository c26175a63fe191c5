"""A run: adapt a pretrained model with one method, beside its baselines, and write the run directory.

Run directory::

    config.yaml             the resolved configuration
    fingerprint.json        written when the run starts: the hash of its settings (config.yaml less --out) and the
                            fingerprint of its data (`workbench.fingerprint`); --resume refuses what differs
    metrics.json            before/after, baselines, parameter counts, time, memory (written last)
    adapter.safetensors     what the chosen method trained (+ adapter.json: method, options, task state)
    report.md, *.png        tables and plots
    log.txt                 the log
    results/                one finished method each (metrics, history, predictions): what --resume reuses
    checkpoints/            the method in training, one file per method, removed when the run completes
    <method>/               what the chosen method's stages made besides the adapter (`PlanInputs.outputs`)
    clinical.json, .npz     a task with batch prediction: temperatures, conformal calibration, the shift alarm's
    reliability.png         reference features (`workbench.clinical.fit`); written with report.md
    seal.json               sha256 and size of every file above (`workbench.seal`): written when the run finishes;
                            `evaluate` and `predict` verify it before they use the run
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterator

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn

from workbench import device as placement
from workbench import item_bootstrap, lockstep, randomness, report, reuse
from workbench.checkpoint import load_tensors, save_tensors, write_json, write_text
from workbench.config import MethodEntry, RunConfig, RunRequest, resolve_config, upgraded
from workbench.errors import UserError
from workbench.fingerprint import data_changes, data_record, file_digests, settings_hash
from workbench.memory import PeakMemory, training_step_bytes
from workbench.method import Method, PlanInputs, Stage, count_parameters
from workbench.options import renamed
from workbench.records import SkipReport
from workbench.registry import methods, tasks
from workbench.rundir import check_out_path, claim_file, claim_run_dir
from workbench.seal import check_run, seal
from workbench.settings import SETTINGS
from workbench.task import Evaluation, Task, TaskData
from workbench.threads import ThreadPolicy
from workbench.trainer import Trainer, TrainSettings, distributed

log = logging.getLogger("workbench")


@dataclass
class Run:
    """A finished run: its directory, configuration, metrics and adapted (merged) model."""

    path: Path
    config: RunConfig
    metrics: dict[str, Any]
    model: nn.Module | None = field(default=None, repr=False)

    @property
    def paths(self) -> dict[str, Path]:
        names = ["config.yaml", "metrics.json", "adapter.safetensors", "adapter.json", "report.md", "log.txt"]
        return {name: self.path / name for name in names if (self.path / name).exists()}

    @staticmethod
    def read_config(path: str | Path) -> RunConfig:
        """The configuration of the finished run in ``path``; a `UserError` when it is not one."""
        path = Path(path)
        for name in ("config.yaml", "metrics.json", "adapter.safetensors", "adapter.json"):
            if not (path / name).is_file():
                raise UserError(f"{path}: not a finished run ({name} is missing)")
        return Run.read_config_file(path)

    @staticmethod
    def read_config_file(path: str | Path) -> RunConfig:
        """The ``config.yaml`` of a run directory, finished or not."""
        return RunConfig.from_dict(yaml.safe_load((Path(path) / "config.yaml").read_text()))

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "auto") -> "Run":
        """Read a finished run and rebuild its adapted model (base model + task state + adapter, merged) on
        ``device`` (`workbench.device.resolve`)."""
        config = cls.read_config(path)
        metrics = json.loads((Path(path) / "metrics.json").read_text())
        return cls(Path(path), config, metrics, _adapted_model(Path(path), config, placement.resolve(device)))


def _adapted_model(path: Path, config: RunConfig, device: torch.device) -> nn.Module:
    """The chosen method's model from a run directory's adapter files: base + task state + adapter, merged, on
    ``device`` (the base model is placed before the method's hooks see it)."""
    adapter = json.loads((path / "adapter.json").read_text())
    task = tasks.get(config.task)(**config.task_options)
    model = cast(task.rebuild(config.model, config.trust_checkpoint, adapter["task_state"]), config.precision)
    model = placement.place(model, device)
    method = methods.get(adapter["method"])(**adapter["options"])
    randomness.seed_all(config.seed)
    model = placement.place(method.prepare(model), device)
    method.load_trainable_state(model, load_tensors(path / "adapter.safetensors"), source=path / "adapter.safetensors")
    model = method.merge(model).eval()
    task.restore(model, adapter["task_state"])  # the merged model may be a new one (a distilled student)
    return model


def cast(model: nn.Module, precision: str) -> nn.Module:
    """``model`` in the dtype of ``--precision`` float64 / float32 (mixed precisions keep float32 weights)."""
    dtype = {"float64": torch.float64, "float32": torch.float32}.get(precision, torch.float32)
    parameter = next(model.parameters(), None)
    return model if parameter is None or parameter.dtype == dtype else model.to(dtype)


def adapt(domain: str, method: str | None = None, *, resume: bool = False, quiet: bool = False, **settings: Any) -> Run:
    """Adapt the task's pretrained model to its data with ``method``; run the baselines beside it.

    ``settings``: any setting `workbench.settings.SETTINGS` declares (``data``, ``model``, ``out``, ``epochs``,
    ``train_size``, ``baselines``, ``method_options``, ...; an earlier name of a renamed one, with a `FutureWarning`);
    every other keyword is an option of the task (``OPTION=value``, as the task declares). ``resume`` continues the
    interrupted run in ``out``; ``quiet`` hides progress bars and the table.

    Example::

        >>> run = workbench.adapt(domain="TASK", method="METHOD", epochs=5, train_size=20)  # doctest: +SKIP
        >>> run.metrics["after"], run.path                                                  # doctest: +SKIP

    Returns a `Run` whose ``model`` is the adapted model with its adapters merged.
    """
    settings = renamed("workbench.adapt", SETTINGS, settings)
    names = {f.name for f in dataclasses.fields(RunRequest)}
    given = {key: value for key, value in settings.items() if key in names}
    task_options = {**given.pop("task_options", {}), **{k: v for k, v in settings.items() if k not in names}}
    if given.get("baselines") is not None:
        given["baselines"] = tuple(given["baselines"])
    request = RunRequest(domain=domain, method=method, task_options=task_options, **given)
    return run_request(request, resume=resume, quiet=quiet)


def run_request(
    request: RunRequest, resume: bool = False, quiet: bool = False, threads: ThreadPolicy | None = None,
    reports: bool = True,
) -> Run:
    """`adapt` for a `RunRequest` (what the command line calls); ``threads``: the policy of its CPU threads (default:
    pinned to ``request.threads``, else to the interrupted run's pinned count on resume, else following the load);
    ``reports``: write ``report.md`` and its plots (a comparison's cells may go without). Inside
    `workbench.reuse.sharing` the data, the model, the prepared splits and the base model's scores are shared with
    earlier runs of the same data, settings and seed."""
    config, warnings = resolve_config(request)
    _init_distributed(config.device)
    rank, _ = distributed()
    if rank != 0:
        log.setLevel(logging.WARNING)
    for warning in warnings:
        log.warning(warning)
    out_dir = Path(config.out)
    # chosen by the run: a default batch size may shrink to the data (`_fitted_batch_size`), threads to the machine
    fitted = tuple(name for name in ("batch_size", "threads") if getattr(request, name) is None)
    _check_out_dir(out_dir, config, resume, fitted)
    device = placement.resolve(config.device)
    if resume and (out_dir / "metrics.json").is_file():
        log.info("%s is complete; nothing to resume", out_dir)
        return Run.load(out_dir, device)
    earlier_threads = Run.read_config_file(out_dir).threads if resume and request.threads is None else None
    threads = threads or ThreadPolicy(request.threads or earlier_threads or None)  # 0: older runs, not pinned
    config = dataclasses.replace(config, threads=threads.pinned)
    data_print = data_record(config.data, config.task, config.task_options, config.seed) if rank == 0 else {}
    if resume and rank == 0:
        _check_data(out_dir, data_print)

    task: Task = tasks.get(config.task)(**config.task_options)
    task.progress = not quiet
    randomness.seed_all(config.seed)
    shared_key = _shared_key(config, data_print, device)
    raw, base, data, task_state = reuse.shared(
        "prepared", shared_key, functools.partial(_prepared, task, config, shared_key, device), task)
    if task.skipped:
        log.warning("%s", task.skipped.summary())
    config = _fitted_batch_size(config, len(data.train), request.batch_size is not None)
    bases = {None: (base, task_state)}  # the run's model, then every other model a baseline names (METHOD@MODEL)
    for entry in config.baselines:
        if entry.model is not None and entry.model not in bases:
            other = placement.place(cast(task.load_model(entry.model, config.trust_checkpoint), config.precision),
                                    device)  # fmt: skip
            bases[entry.model] = (other, task.prepare(other, raw, config.train_size, config.val_size, config.seed)[1])
    for index, entry in enumerate(config.entries()):
        options = config.method_options if index == 0 else {}
        methods.get(entry.method)(**options).check(task, data, bases[entry.model][0])
    # Everything the user gave has been read and checked: only now does the run directory appear, held by this
    # process (rank 0) until the run ends.
    steps = functools.partial(_adapt_steps, config, task, data, bases, out_dir, device, resume, quiet, rank, threads,
                              reports=reports, shared_key=shared_key)  # fmt: skip
    if rank != 0:
        return steps()
    with claim_run_dir(out_dir, resume):
        write_text(out_dir / "config.yaml", yaml.safe_dump(config.to_dict(), sort_keys=False))
        write_json(out_dir / FINGERPRINT, {"settings_hash": _settings_hash(config.to_dict()), **data_print})
        with _logging_to(out_dir / "log.txt"):
            finished = steps()
        seal(out_dir, "run")  # last, once log.txt is closed: every file the run produced (`workbench.seal`)
        return finished


def _shared_key(config: RunConfig, data_print: dict[str, Any], device: torch.device) -> dict[str, Any] | None:
    """What the run's data, model, prepared splits and base scores depend on (`workbench.reuse.shared`'s key): the
    task and its options, the data's fingerprint, the model (a checkpoint file: its sha256, hashed once per process
    while the file is unchanged, `workbench.fingerprint.file_digests`), its device, sizes, seed and split;
    None where the data have no fingerprint (they are then never shared)."""
    if not data_print:
        return None
    model = Path(config.model) if config.model else None
    return {
        "task": config.task, "task_options": config.task_options, "data": data_print["data_fingerprint"],
        "model": config.model, "model_file": file_digests(model) if model is not None and model.is_file() else None,
        "trust_checkpoint": config.trust_checkpoint, "precision": config.precision, "device": str(device),
        "train_size": config.train_size,
        "val_size": config.val_size, "seed": config.seed, "split": config.split,
    }  # fmt: skip


def _prepared(
    task: Task, config: RunConfig, shared_key: dict[str, Any] | None, device: torch.device
) -> tuple[Any, nn.Module, TaskData, Any]:
    """(raw data, base model, prepared data, task state): the task's data read and its model loaded in the run's
    precision and placed on ``device`` (each shared by every split of a seed, `workbench.reuse`), the data re-split
    by `RunConfig.split` when one is given and prepared for the model."""
    read_key = None if shared_key is None else {k: shared_key[k] for k in ("task", "task_options", "data", "seed")}
    raw = reuse.shared("read", read_key, lambda: task.read(config.data, config.seed), task)
    if config.split is not None:
        raw = task.hold_out(raw, config.split)
    model_keys = ("model", "model_file", "trust_checkpoint", "precision", "device")
    model_key = None if read_key is None else {**read_key, **{k: shared_key[k] for k in model_keys}}

    def load() -> nn.Module:
        return placement.place(cast(task.load_model(config.model, config.trust_checkpoint), config.precision), device)

    base = reuse.shared("model", model_key, load, task)  # every fold of a seed: the same weights
    data, task_state = task.prepare(base, raw, config.train_size, config.val_size, config.seed)
    return raw, base, data, task_state


def _fitted_batch_size(config: RunConfig, n_train: int, given: bool) -> RunConfig:
    """The config with a batch size the training samples can fill: a default batch larger than a small data set
    shrinks to it (with a warning); one the user gave is a `UserError`."""
    world = distributed()[1]
    if n_train >= config.batch_size * world:
        return config
    if given or n_train < world:
        raise UserError(
            f"--batch-size {config.batch_size}: the data give {n_train} training sample(s), fewer than one batch"
            + (f" in each of {world} processes" if world > 1 else "")
            + "; give a smaller --batch-size"
        )
    batch_size = n_train // world
    log.warning("the data give %d training samples: batch size %d instead of the task's default %d", n_train,
                batch_size, config.batch_size)  # fmt: skip
    return dataclasses.replace(config, batch_size=batch_size)


@dataclass(frozen=True)
class _RunContext:
    """What every method of one run shares."""

    config: RunConfig
    task: Task
    data: TaskData
    out_dir: Path
    device: torch.device
    resume: bool
    rank: int
    progress: bool
    #: Sets the CPU threads before each epoch of every method (`workbench.threads.ThreadPolicy.update`).
    threads: ThreadPolicy | None = None


def _adapt_steps(
    config: RunConfig,
    task: Task,
    data: TaskData,
    bases: dict[str | None, tuple[nn.Module, dict[str, Any]]],
    out_dir: Path,
    device: torch.device,
    resume: bool,
    quiet: bool,
    rank: int,
    threads: ThreadPolicy | None = None,
    *,
    reports: bool = True,
    shared_key: dict[str, Any] | None = None,
) -> Run:
    """Score the base model, train every method, write metrics and report (the body of `adapt`; ``reports``: the
    report and its plots; ``shared_key``: the base scores are shared by runs of the same key, `workbench.reuse`)."""
    log.info(
        "%s: %d train / %d val / %d test samples from %s; %d process(es) on %s",
        config.task,
        len(data.train),
        len(data.val),
        len(data.test),
        data.source,
        distributed()[1],
        config.device,
    )
    run = _RunContext(config, task, data, out_dir, device, resume, rank, progress=not quiet, threads=threads)
    base = bases[None][0]
    before = _evaluate_or_reuse(task, base, data, "before", out_dir, device, rank, resume, shared_key)
    warm_key = None if shared_key is None else [config.task, config.model, config.precision, str(device)]
    reuse.measured_once("warm-up", warm_key, lambda: _warm_up(task, base, data, device, config.batch_size))
    results: dict[str, dict[str, Any]] = {}
    evaluations: dict[str, Evaluation] = {"before": before}
    entries = config.entries()
    for index, entry in enumerate(entries):
        log.info("[%d/%d] %s", index + 1, len(entries), entry)
        results[str(entry)], evaluations[str(entry)] = _run_method(run, entry, *bases[entry.model], chosen=index == 0)
    metrics = {**_metrics(config, data, before, results, task.skipped), **_item_intervals(task, config, evaluations)}
    if rank == 0:
        clinical = _fit_clinical(task, config, data, out_dir, device) if reports else None
        if reports:
            figures = task.figures(evaluations, out_dir) + [report.learning_curves(results, out_dir)]
            write_text(
                out_dir / "report.md",
                report.markdown(config, data, metrics, figures, task.metrics, task.metrics_note, task.default_method,
                                task.lower_is_better, clinical),  # fmt: skip
            )
        write_json(out_dir / "metrics.json", metrics)  # last: its presence marks the run complete
        _remove_checkpoints(out_dir)
        if not quiet:
            print(report.table(metrics, task.metrics, task.default_method, task.lower_is_better))
            print(f"run written to {out_dir}")
        return Run.load(out_dir, device)  # rebuilt from what was written: the run directory is the result
    return Run(out_dir, config, metrics)


def _fit_clinical(task: Task, config: RunConfig, data: TaskData, out_dir: Path, device: torch.device
                  ) -> dict[str, Any] | None:
    """Temperatures, conformal calibration and the shift alarm's reference of the chosen method's merged model, for
    a task with batch prediction (`workbench.clinical.fit`): what ``clinical.json`` holds, None without."""
    if "predict" not in task.capabilities:
        return None
    from workbench.clinical.fit import fit_run

    state = randomness.capture()  # rank 0 alone: no barrier (`_chosen_model`), and the run's draws go on unchanged
    try:
        return fit_run(task, _adapted_model(out_dir, config, device), data, out_dir, config.seed)
    finally:
        randomness.restore(state)


def evaluate(
    run: str | Path, data: str | None = None, device: str = "auto", trust_modified: bool = False
) -> dict[str, float]:
    """Re-score a finished run on the test split of ``data`` (default: its own data); writes ``evaluations/``.

    The run's files are verified against its seal first (`workbench.seal.check_run`): a file changed after the run
    finished is a `UserError` naming it, unless ``trust_modified``. Returns the metrics."""
    return evaluate_run(run, data, device, trust_modified)[0]


def evaluate_run(
    run: str | Path, data: str | None = None, device: str = "auto", trust_modified: bool = False
) -> tuple[dict[str, float], dict[str, Any]]:
    """`evaluate`, with what `workbench.seal.check_run` said of the run's seal (``workbench evaluate`` prints it).

    The data are read with the run's preprocessing (`workbench.task.Task.use_run_state`, as `predict` does)."""
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


def predict(
    run: str | Path, input: str | Path, output: str | Path, *, overwrite: bool = False, trust_modified: bool = False,
    device: str | torch.device = "auto",
) -> dict[str, Any]:
    """Score every input of the folder ``input`` with a finished run's merged model on ``device``
    (``workbench predict``).

    Writes ``output`` (CSV, one row per input: the task's columns and a ``status`` saying why a bad input has no
    scores; for a run with a ``clinical.json``, `workbench.clinical.predictor`'s ``calibrated_p_<class>`` and
    ``conformal_set`` columns) and beside it ``<output stem>.json``: sha256 of the base model's files, the adapter,
    the data card and the CSV, what the run's seal said (``run_seal``), the facts the task adds (classes,
    thresholds, ...), the workbench version, and ``clinical`` (calibration, conformal level, the shift alarm's
    statistic, p-value and verdict for the whole input folder; None for a run without). Returns that record.

    Before the model is loaded and any input scored: the run's files are verified against its seal (a changed file
    is a `UserError` naming it unless ``trust_modified``: then the record says so), and the output is checked
    (`workbench.outputs`): a ``.csv`` outside every run folder, not a folder, in a writable folder with room for it,
    and not there yet unless ``overwrite``. The CSV and its record are written as a pair under the output's lock
    (`workbench.outputs.write_pair`: a reader never sees a CSV beside the record of another write). Inputs are made
    with the run's preprocessing (`workbench.task.Task.use_run_state`, as `evaluate` does).

    Raises:
        UserError: besides the checks above, when no input could be scored (nothing is written then).
    """
    import csv
    import hashlib
    import io
    from datetime import datetime, timezone

    import workbench
    from workbench.clinical.predictor import ClinicalPredictor
    from workbench.datacard import load_card
    from workbench.outputs import check_location, check_output, record_path, write_pair

    folder, output = Path(input), Path(output)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (give --input a folder of inputs)")
    check_location(output)
    config = Run.read_config(run)
    task = tasks.get(config.task)(**config.task_options)
    if "predict" not in task.capabilities:
        raise UserError(f"task '{config.task}' has no batch prediction (workbench predict)")
    sealed = check_run(run, trust_modified)  # before anything the run wrote is used
    with claim_file(output):  # the output is this process's from its check to its last rename
        check_output(output, overwrite, _output_estimate(folder))
        finished = Run.load(run, device)
        adapter = json.loads((finished.path / "adapter.json").read_text())
        task.use_run_state(adapter["task_state"])
        predictor = ClinicalPredictor(finished.path, config, task, finished.model, adapter, sealed, shift_window=0)
        predictions, _, clinical = predictor.predict(folder)  # + calibrated probabilities and conformal sets
        statuses = [row.get("status", "ok") for row in predictions.rows]
        if all(status != "ok" for status in statuses):
            first = next(iter(predictions.rows), {})
            example = f" (the first, {first.get('record', '?')}: {first.get('status')})" if first else ""
            raise UserError(f"{folder}: no input could be scored: all {len(statuses)} failed{example}; nothing was "
                            f"written to {output}")  # fmt: skip (every task gives a bad input a row: never 0 rows)
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=predictions.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(predictions.rows)
        table = text.getvalue().encode()

        def sha256(path: Path) -> str:
            return hashlib.sha256(Path(path).read_bytes()).hexdigest()

        cards = [task.card] if config.data is None else list(task.reads or (task.card,))
        files = {
            "base_model": {str(p): sha256(p) for p in task.model_files(config.model) if Path(p).is_file()},
            "adapter": {name: sha256(finished.path / name) for name in ("adapter.safetensors", "adapter.json")},
            "data_cards": {name: sha256(Path(load_card(name).path)) for name in cards},
            "csv": hashlib.sha256(table).hexdigest(),
        }
        record = {
            "workbench_version": workbench.__version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "run": str(finished.path),
            "run_seal": sealed,
            "task": config.task,
            "method": adapter["method"],
            "method_options": adapter["options"],
            "input": str(folder),
            "output": str(output),
            "records": len(predictions.rows),
            "failed": sum(status != "ok" for status in statuses),
            **predictions.facts,
            "clinical": _clinical_record(predictor.describe(), clinical) if predictor.summary is not None else None,
            "sha256": files,
        }
        content = (json.dumps(record, indent=2) + "\n").encode()
        check_output(output, True, len(table) + len(content))  # the exact size, now that it is known
        write_pair(output, table, record_path(output), content)
    return record


def _clinical_record(described: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """The prediction record's ``clinical`` part: the run's calibration and conformal settings, the alarm's test,
    and for this batch the shift statistic, p-value and verdict and the kind of conformal sets given."""
    return {"calibration": described["calibration"], "conformal": described["conformal"],
            "shift_test": described["shift"], "shift": batch["shift"], "conformal_kind": batch["conformal_kind"]}


def _output_estimate(folder: Path) -> int:
    """What ``predict``'s output needs before anything is scored [bytes]: a lower estimate (`OUTPUT_BYTES_PER_INPUT`
    per file of the input folder), so that a nearly full disk is refused early and no output is refused that could
    fit; the exact size is checked again before writing."""
    return OUTPUT_BYTES_PER_INPUT * sum(1 for path in folder.rglob("*") if path.is_file())


#: Bytes of predictions per input file that `_output_estimate` counts (one CSV row of a handful of scores).
OUTPUT_BYTES_PER_INPUT = 256


# -- steps of `adapt` ----------------------------------------------------------------------------
def _init_distributed(device: str) -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def _check_out_dir(out_dir: Path, config: RunConfig, resume: bool, fitted: tuple[str, ...] = ()) -> None:
    """``--out`` can take this run (`workbench.rundir.check_out_path`); with ``resume``, the interrupted run there
    had the settings of ``config`` (``fitted``: settings the run chooses itself, kept from the interrupted run), as
    its ``config.yaml`` says and its ``fingerprint.json`` confirms. A `UserError` in one line naming what differs."""
    check_out_path(out_dir, resume)
    saved = out_dir / "config.yaml"
    if resume:
        if not saved.is_file():
            raise UserError(f"{out_dir}: nothing to resume (no config.yaml); give the --out of an earlier run")
        try:
            earlier = yaml.safe_load(saved.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            earlier = error
        if not isinstance(earlier, dict):
            found = f"not YAML: {str(earlier).splitlines()[0]}" if isinstance(earlier, Exception) else "no mapping"
            raise UserError(f"{saved}: damaged ({found}), not the configuration a run writes; this run cannot be "
                            f"resumed: start afresh in another --out")  # fmt: skip
        now, named_now = config.to_dict(), upgraded(earlier)  # a run written before a rename: its keys as named now
        ignored = {"out", *fitted}
        changed = {
            key: (named_now.get(key), now[key]) for key in now if key not in ignored and named_now.get(key) != now[key]
        }
        if changed:
            details = "; ".join(f"{key}: was {old!r}, now {new!r}" for key, (old, new) in changed.items())
            raise UserError(f"{saved}: --resume must use the same settings as the interrupted run ({details})")
        recorded = _read_fingerprint(out_dir)
        if recorded is not None and recorded.get("settings_hash") != _settings_hash(earlier):
            raise UserError(f"{saved}: changed since the run started (its settings no longer match "
                            f"{out_dir / FINGERPRINT}); this run cannot be resumed: start afresh in another "
                            "--out")  # fmt: skip


#: The file in which a run records, when it starts, what its numbers depend on (`workbench.fingerprint`).
FINGERPRINT = "fingerprint.json"


def _settings_hash(settings: dict[str, Any]) -> str:
    """`workbench.fingerprint.settings_hash` of a run's resolved configuration, less where it writes."""
    return settings_hash({key: value for key, value in settings.items() if key != "out"})


def _read_fingerprint(out_dir: Path) -> dict[str, Any] | None:
    """The ``fingerprint.json`` of the run in ``out_dir``; None for a run started before runs recorded one."""
    path = out_dir / FINGERPRINT
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        content = error
    if not isinstance(content, dict):
        raise UserError(f"{path}: damaged ({'not JSON' if isinstance(content, Exception) else 'no JSON object'}); "
                        "what this run started with cannot be checked: start afresh in another --out")  # fmt: skip
    return content


def _check_data(out_dir: Path, now: dict[str, Any]) -> None:
    """The interrupted run in ``out_dir`` started on the data whose `workbench.fingerprint.data_record` is ``now``:
    a `UserError` naming what changed when not; a warning when the run is older than fingerprints."""
    recorded = _read_fingerprint(out_dir)
    if recorded is None:
        log.warning("%s was started before runs recorded their data's fingerprint: resuming without checking that "
                    "its data are unchanged", out_dir)  # fmt: skip
        return
    if recorded.get("data_fingerprint") != now["data_fingerprint"]:
        raise UserError(f"{out_dir}: the data changed since this run started ({data_changes(recorded, now)}); "
                        "resuming would mix two data sets: give the data it started on, or start afresh in another "
                        "--out")  # fmt: skip


@contextmanager
def _logging_to(path: Path | None) -> Iterator[None]:
    """Copy the workbench's log of this thread into ``path`` while the block runs (nothing when None); runs in
    other threads (`workbench.lockstep`) keep their own files."""
    if path is None:
        yield
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    thread = threading.get_ident()
    handler.addFilter(lambda record: record.thread == thread)
    log.addHandler(handler)
    if not _open_logs["count"]:
        _open_logs["level"] = log.level
        log.setLevel(logging.INFO)
    _open_logs["count"] += 1
    try:
        yield
    finally:
        log.removeHandler(handler)
        _open_logs["count"] -= 1
        if not _open_logs["count"]:  # the last open run log gives the level back
            log.setLevel(_open_logs["level"])
        handler.close()


#: Run logs open in this process, and the workbench logger's level before the first of them opened.
_open_logs: dict[str, int] = {"count": 0, "level": logging.NOTSET}


def _evaluate_or_reuse(
    task: Task, model: nn.Module, data: TaskData, name: str, out_dir: Path, device: torch.device, rank: int,
    resume: bool, shared_key: dict[str, Any] | None = None,
) -> Evaluation:
    """``model`` scored on the test samples: the saved result when resuming, else evaluated (shared by the runs of
    the same ``shared_key``, `workbench.reuse`; None: never shared)."""
    saved = _load_result(out_dir, name) if resume else None
    if saved is not None:
        return saved[1]
    score = functools.partial(task.evaluate, model, data.test, device)
    evaluation = reuse.shared(name, None if shared_key is None else [shared_key, str(device)], score, task)
    if rank == 0:
        _save_result(out_dir, name, {"metrics": evaluation.metrics}, evaluation)
    return evaluation


def _warm_up(task: Task, base: nn.Module, data: TaskData, device: torch.device, batch_size: int) -> None:
    """One throwaway training step on a copy of the base model, so that one-time set-up (autograd engine, kernel
    caches) is not counted in the memory of whichever method happens to train first."""
    model = copy.deepcopy(base).train()
    loss = task.loss(model, task.collate(data.train[:batch_size], device), True)
    if loss.requires_grad:
        loss.backward()
    del model, loss


def _run_method(
    run: _RunContext, entry: MethodEntry, base: nn.Module, task_state: dict[str, Any], chosen: bool
) -> tuple[dict[str, Any], Evaluation]:
    """Train the method of ``entry`` on a copy of ``base`` (the run's model, or the one ``METHOD@MODEL`` names)
    stage by stage, as its plan says; reuse its saved result when resuming.

    The ``chosen`` method gets the run's method options, writes its adapter (before the result that marks it
    finished) and what its stages made; the others (baselines) may learn from the chosen method's adapted model.
    """
    config, task, data, device = run.config, run.task, run.data, run.device
    saved = _load_result(run.out_dir, str(entry)) if run.resume else None
    if saved is not None:
        log.info("%s: finished earlier, reusing its results", entry)
        return saved
    method: Method = methods.get(entry.method)(**(config.method_options if chosen else {}))
    randomness.seed_all(config.seed)
    model = placement.place(method.prepare(copy.deepcopy(base)), device)
    trainable, total = count_parameters(model)
    inputs = PlanInputs(
        config.train_settings(config.learning_rate or method.learning_rate),
        outputs=run.out_dir / method.name if chosen and run.rank == 0 else None,
        adapted_model=None if chosen else functools.partial(_chosen_model, run.out_dir, config, device),
    )
    method.progress = run.progress
    with PeakMemory(device) as memory:  # the memory of this method's set-up and training alone
        method.setup(task, model, data, config.seed)
        stages = method.plan(task, model, data, inputs)
        history = _train(stages, task, model, run.out_dir / "checkpoints" / f"{entry}.pt", device, run.progress,
                         str(entry), run.resume, run.threads and run.threads.update)  # fmt: skip
    probe_key = [str(entry), config.method_options if chosen else {}, config.task, config.task_options, config.model,
                 config.precision, config.batch_size, str(device)]  # fmt: skip
    step_bytes = reuse.measured_once(  # a comparison's worker measures each method's step once
        "step memory", probe_key, lambda: _training_step_bytes(stages[-1], task, model, data, device)
    ) if stages else None  # fmt: skip
    task_state = task.refit(model, data) or task_state
    evaluation = task.evaluate(model, data.test, device)
    evaluation.metrics.update(method.diagnostics(task, model, data))
    result = {
        "metrics": evaluation.metrics,
        "learning_rate": (stages[-1].settings if stages else inputs.settings).learning_rate,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "train_seconds": float(sum(h["seconds"] for h in history)),
        "seconds_per_epoch": float(np.mean([h["seconds"] for h in history])) if history else 0.0,
        "epochs": len(history),
        "best_epoch": _best_epoch(history),
        "threads_per_epoch": [h.get("threads") for h in history],  # None: an epoch of a run older than the count
        "peak_memory_bytes": memory.peak_bytes,
        "training_memory_bytes": memory.added_bytes,
        "training_step_bytes": step_bytes,
        "task_state": task_state,
        "history": history,
    }
    if run.rank == 0:
        if chosen:
            _save_adapter(run.out_dir, method, model, task_state)
        _save_result(run.out_dir, str(entry), result, evaluation)
    return result, evaluation


def _trainer(
    stage: Stage, task: Task, model: nn.Module, device: torch.device, checkpoint: Path | None = None,
    progress: bool = False, label: str = "", settings: TrainSettings | None = None, samples: list[Any] | None = None,
    threads: Callable[[], int] | None = None,
) -> Trainer:
    """The trainer of one stage: its loss, samples, settings, gradient function, epoch hook and, when the settings
    select on a metric, its score on the validation samples (``settings`` and ``samples`` replace the stage's for a
    probe); ``threads``: sets the CPU threads before each epoch (`workbench.trainer.Trainer`)."""
    train, val = (samples, samples[:1]) if samples is not None else (stage.train, stage.val)
    settings = settings or stage.settings
    return Trainer(
        model, stage.loss, task.collate, train, val, settings, checkpoint_path=checkpoint, device=device,
        progress=progress, label=label or stage.name, epoch_start=stage.on_epoch, gradients=stage.gradients,
        before_step=stage.before_step, threads=threads, frozen=stage.frozen, learning_rates=stage.learning_rates,
        score=None if settings.select_on == "loss" else functools.partial(_validation_score, task, val, device,
                                                                             settings.select_on),
    )  # fmt: skip


def _validation_score(task: Task, samples: list[Any], device: torch.device, metric: str, model: nn.Module) -> float:
    """The objective of selecting on ``metric``: its value on ``samples``, negated where higher is better (the
    trainer minimises)."""
    value = float(task.evaluate(model, samples, device).metrics[metric])
    return value if metric in task.lower_is_better else -value


def _set_trainable(model: nn.Module, names: Collection[str]) -> None:
    """Exactly the parameters ``names`` train."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in names)


def _training_step_bytes(stage: Stage, task: Task, model: nn.Module, data: TaskData, device: torch.device) -> int:
    """Peak tensor bytes of one training step of the plan's last stage [bytes]: the larger of 2 trainer steps after
    a warm-up step (`workbench.memory.training_step_bytes`), on a copy of ``model`` training what that stage trains,
    with full batches of the stage's batch size (training samples cycled when there are fewer)."""
    random_state = randomness.capture()  # a measurement: the run's random draws go on as if it had not happened
    try:
        return _probe_step_bytes(stage, task, model, data, device)
    finally:
        randomness.restore(random_state)


def _probe_step_bytes(stage: Stage, task: Task, model: nn.Module, data: TaskData, device: torch.device) -> int:
    steps, probe = 2, copy.deepcopy(model)
    if stage.trainable is not None:
        _set_trainable(probe, stage.trainable)
    n_samples = stage.settings.batch_size * distributed()[1] * (steps + 1)
    samples = [data.train[i % len(data.train)] for i in range(n_samples)]
    settings = dataclasses.replace(stage.settings, epochs=1, select_on="loss")  # a probe: nothing to select
    trainer = functools.partial(_trainer, stage, task, probe, device, label=f"{stage.name} memory", settings=settings,
                                samples=samples)  # fmt: skip
    return max(training_step_bytes(lambda: trainer().fit(), device))


def _train(
    stages: list[Stage],
    task: Task,
    model: nn.Module,
    checkpoint: Path,
    device: torch.device,
    progress: bool,
    label: str,
    resume: bool,
    threads: Callable[[], int] | None = None,
) -> list[dict[str, Any]]:
    """Train a prepared model stage after stage (``threads``: sets the CPU threads before each epoch); the trainers'
    history, epochs numbered over all stages, each entry naming its ``stage``. Nothing for a plan without stages.
    Afterwards every parameter that was trainable before the first stage is trainable again (what the method saves
    as its adapter)."""
    history: list[dict[str, Any]] = []
    prepared = [name for name, p in model.named_parameters() if p.requires_grad]
    staged = [stage.name for stage in stages] != ["train"]
    for stage in stages:
        if stage.trainable is not None:
            _set_trainable(model, stage.trainable)
        trainer = _trainer(
            stage, task, model, device, progress=progress, label=f"{label} {stage.name}" if staged else label,
            checkpoint=checkpoint.with_name(f"{checkpoint.stem}.{stage.name}.pt") if staged else checkpoint,
            threads=threads,
        )  # fmt: skip
        meeting = lockstep.current() if stage.batchable and len(stages) == 1 else None  # seeds side by side
        for entry in trainer.fit(resume=resume) if meeting is None else meeting.train(trainer, resume):
            history.append(dict(entry, epoch=len(history), stage=stage.name, stage_epoch=entry["epoch"]))
        if stage.on_end is not None:
            stage.on_end()
    _set_trainable(model, prepared)
    return history


def _best_epoch(history: list[dict[str, Any]]) -> int:
    """The epoch (over all stages) of the best validation objective (`TrainSettings.select_on`: the loss or a metric)
    among the selectable epochs of the last stage (`TrainSettings.select_from`; the stage's last epoch when none is),
    -1 without training: different stages' losses are not comparable."""
    last = [h for h in history if h["stage"] == history[-1]["stage"]] if history else []
    selectable = [h for h in last if h["selectable"]]
    if not selectable:
        return last[-1]["epoch"] if last else -1
    return min(selectable, key=lambda h: h.get("objective", h["val_loss"]))["epoch"]


def _chosen_model(out_dir: Path, config: RunConfig, device: torch.device) -> nn.Module:
    """The chosen method's adapted model, from the adapter it wrote (rank 0 writes; the others wait for it). The
    global random generators are left as they were: building it does not change what the caller draws next."""
    if dist.is_initialized():
        dist.barrier()
    state = randomness.capture()
    try:
        return _adapted_model(out_dir, config, device)
    finally:
        randomness.restore(state)


#: The key under which a result's predictions file keeps the test items' groups (`Evaluation.groups`, as codes).
GROUPS_KEY = "test_item_groups"


def _save_result(out_dir: Path, name: str, result: dict[str, Any], evaluation: Evaluation) -> None:
    tensors = {k: torch.as_tensor(v) for k, v in evaluation.predictions.items()}
    if evaluation.groups is not None:  # group labels may be text: their codes keep which items share a group
        tensors[GROUPS_KEY] = torch.as_tensor(np.unique(evaluation.groups, return_inverse=True)[1].reshape(-1))
    save_tensors(out_dir / "results" / f"{name}.predictions.safetensors", tensors)
    write_json(out_dir / "results" / f"{name}.json", result)


def _load_result(out_dir: Path, name: str) -> tuple[dict[str, Any], Evaluation] | None:
    path = out_dir / "results" / f"{name}.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    predictions = {
        k: v.numpy() for k, v in load_tensors(out_dir / "results" / f"{name}.predictions.safetensors").items()
    }
    return result, Evaluation(result["metrics"], predictions, predictions.pop(GROUPS_KEY, None))


def _save_adapter(out_dir: Path, method: Method, model: nn.Module, task_state: dict[str, Any]) -> None:
    save_tensors(out_dir / "adapter.safetensors", method.trainable_state(model), metadata={"method": method.name})
    write_json(out_dir / "adapter.json", {"method": method.name, "options": method.config, "task_state": task_state})


def _metrics(
    config: RunConfig, data: TaskData, before: Evaluation, results: dict[str, dict[str, Any]], skipped: SkipReport
) -> dict[str, Any]:
    chosen = results[config.method]
    costs = {
        name: {key: value for key, value in result.items() if key not in ("metrics", "history", "task_state")}
        for name, result in results.items()
    }
    return {
        "task": config.task,
        "method": config.method,
        "seed": config.seed,
        "data": data.source,
        "processes": distributed()[1],
        "threads": config.threads,
        "samples": {"train": len(data.train), "val": len(data.val), "test": len(data.test)},
        "data_summary": data.summary,
        "skipped_records": skipped.to_json(),
        "before": before.metrics,
        "after": chosen["metrics"],
        "baselines": {str(entry): results[str(entry)]["metrics"] for entry in config.baselines},
        "trainable_parameters": chosen["trainable_parameters"],
        "total_parameters": chosen["total_parameters"],
        "train_seconds": chosen["train_seconds"],
        "peak_memory_bytes": chosen["peak_memory_bytes"],
        "training_memory_bytes": chosen["training_memory_bytes"],
        "training_step_bytes": chosen.get("training_step_bytes"),  # absent from results of older versions
        "costs": costs,
    }


def _item_intervals(task: Task, config: RunConfig, evaluations: dict[str, Evaluation]) -> dict[str, Any]:
    """``intervals``, ``differences`` (the run's method minus the base model, "after − before", and minus each
    baseline) and ``test_units`` of `metrics.json`: a bootstrap over the test items of the predictions in
    ``evaluations`` (`workbench.item_bootstrap`), seeded with the run's seed. Without groups or a `Task.rescore`
    (results of older versions), no intervals, with a warning."""
    rows = {"before": evaluations["before"], "after": evaluations[config.method]}
    rows.update({str(entry): evaluations[str(entry)] for entry in config.baselines})
    groups = rows["before"].groups
    items, n_groups = item_bootstrap.count_units(groups if groups is not None else [])
    found = {"test_units": {"items": items, "groups": n_groups, "item_kind": task.item_kind,
                            "group_kind": task.group_kind or task.item_kind, "resamples": item_bootstrap.RESAMPLES,
                            "resampled": item_bootstrap.resampled_units(groups) if items else None}}
    pairs = {"after − before": ("after", "before")}
    pairs.update({f"{config.method} − {entry}": ("after", str(entry)) for entry in config.baselines})
    started = time.perf_counter()
    try:
        if any(row.groups is None or len(row.groups) != items for row in rows.values()):
            raise NotImplementedError("the test items' groups are missing")
        bootstrap = item_bootstrap.item_intervals(
            task.rescore, {label: row.predictions for label, row in rows.items()}, groups,
            {label: row.metrics for label, row in rows.items()}, pairs, config.seed,
        )  # fmt: skip
    except (NotImplementedError, KeyError) as error:
        log.warning("no intervals for the test metrics: %s", error)
        return {**found, "intervals": {}, "differences": {}}
    log.info("item bootstrap (%d resamples): %.2f s", item_bootstrap.RESAMPLES, time.perf_counter() - started)
    return {**found, **bootstrap}


def _remove_checkpoints(out_dir: Path) -> None:
    folder = out_dir / "checkpoints"
    if folder.is_dir():
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()

"""A run: adapt a pretrained model with one method, beside its baselines, and write the run directory.

Run directory::

    config.yaml             the resolved configuration
    fingerprint.json        written when the run starts: the hash of its settings (config.yaml less --out) and the
                            fingerprint of its data (`workbench.run.fingerprint`); --resume refuses what differs
    metrics.json            before/after, baselines, parameter counts, time, memory (written last)
    adapter.safetensors     what the chosen method trained (+ adapter.json: method, options, task state)
    report.md, *.png        tables and plots
    log.txt                 the log
    results/                one finished method each (metrics, history, predictions): what --resume reuses
    checkpoints/            the method in training, one file per method, removed when the run completes
    <method>/               what the chosen method's stages made besides the adapter (`PlanInputs.outputs`)
    clinical.json, .npz     a task with batch prediction: temperatures, conformal calibration, the shift alarm's
    reliability.png         reference features (`workbench.clinical.fit`); written with report.md
    seal.json               sha256 and size of every file above, signed (`workbench.core.seal`): written when the run
                            finishes, and the run is complete only once it verifies; every reader verifies it first
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn

from workbench.core import device as placement
from workbench.core import randomness, reuse
from workbench.core.checkpoint import load_tensors, save_tensors, write_json, write_text
from workbench.core.config import MethodEntry, RunConfig, RunRequest, resolve_config
from workbench.core.errors import UserError
from workbench.core.finished import Run, adapted_model, cast
from workbench.core.memory import PeakMemory
from workbench.core.method import Method, PlanInputs, count_parameters
from workbench.core.options import renamed
from workbench.core.records import SkipReport
from workbench.core.registry import methods, tasks
from workbench.core.seal import SEAL, check_run, seal
from workbench.core.settings import SETTINGS
from workbench.core.task import Evaluation, Task, TaskData
from workbench.core.trainer import distributed
from workbench.run import item_bootstrap, report
from workbench.run.fingerprint import data_record, file_digests
from workbench.run.resume import FINGERPRINT, check_data, check_out_dir, run_settings_hash
from workbench.run.rundir import claim_run_dir
from workbench.run.stages import best_epoch, curve_scores, step_bytes, train_stages, warm_up
from workbench.run.threads import ThreadPolicy

log = logging.getLogger("workbench")


def adapt(domain: str, method: str | None = None, *, resume: bool = False, quiet: bool = False, **settings: Any) -> Run:
    """Adapt the task's pretrained model to its data with ``method``; run the baselines beside it.

    ``settings``: any setting `workbench.core.settings.SETTINGS` declares (``data``, ``model``, ``out``, ``epochs``,
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
    `workbench.core.reuse.sharing` the data, the model, the prepared splits and the base model's scores are shared with
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
    check_out_dir(out_dir, config, resume, fitted)
    device = placement.resolve(config.device)
    sealed = _complete(out_dir) if resume else None
    if sealed is not None:
        log.info("%s is complete; nothing to resume", out_dir)
        return Run.load(out_dir, device, sealed=sealed)
    earlier_threads = Run.read_config_file(out_dir).threads if resume and request.threads is None else None
    threads = threads or ThreadPolicy(request.threads or earlier_threads or None)  # 0: older runs, not pinned
    config = dataclasses.replace(config, threads=threads.pinned)
    data_print = data_record(config.data, config.task, config.task_options, config.seed) if rank == 0 else {}
    if resume and rank == 0:
        check_data(out_dir, data_print)

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
        write_json(out_dir / FINGERPRINT, {"settings_hash": run_settings_hash(config.to_dict()), **data_print})
        with _logging_to(out_dir / "log.txt"):
            steps()
        seal(out_dir, "run")  # last, once log.txt is closed: every file the run produced (`workbench.core.seal`)
        return Run.load(out_dir, device)  # rebuilt from what was written and sealed: the run directory is the result


def _complete(out_dir: Path) -> dict[str, Any] | None:
    """What `workbench.core.seal.check_run` says of the run in ``out_dir`` when it is complete (its ``metrics.json`` is
    there and its seal verifies); None when it is not: a run interrupted before it was sealed (``metrics.json`` but no
    ``seal.json``) runs its last steps again and seals them.

    Raises:
        UserError: its seal is there but does not verify (a file changed, an untrusted key): a run is never resumed
            over files that differ from their seal.
    """
    if not (out_dir / "metrics.json").is_file():
        return None
    if not (out_dir / SEAL).is_file():
        log.warning("%s: metrics.json but no %s (interrupted before it was sealed): its last steps run again", out_dir,
                    SEAL)  # fmt: skip
        return None
    return check_run(out_dir, fix="a run is not resumed over files that differ from its seal: start afresh in another "
                                  "--out")  # fmt: skip


def _shared_key(config: RunConfig, data_print: dict[str, Any], device: torch.device) -> dict[str, Any] | None:
    """What the run's data, model, prepared splits and base scores depend on (`workbench.core.reuse.shared`'s key): the
    task and its options, the data's fingerprint, the model (a checkpoint file: its sha256, hashed once per process
    while the file is unchanged, `workbench.run.fingerprint.file_digests`), its device, sizes, seed and split;
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
    precision and placed on ``device`` (each shared by every split of a seed, `workbench.core.reuse`), the data re-split
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
    #: Sets the CPU threads before each epoch of every method (`workbench.run.threads.ThreadPolicy.update`).
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
    report and its plots; ``shared_key``: the base scores are shared by runs of the same key,
    `workbench.core.reuse`)."""
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
    reuse.measured_once("warm-up", warm_key, lambda: warm_up(task, base, data, device, config.batch_size))
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
    return Run(out_dir, config, metrics)  # rank 0's `run_request` loads it once it is sealed


def _fit_clinical(task: Task, config: RunConfig, data: TaskData, out_dir: Path, device: torch.device
                  ) -> dict[str, Any] | None:
    """Temperatures, conformal calibration and the shift alarm's reference of the chosen method's merged model, for
    a task with batch prediction (`workbench.clinical.fit`): what ``clinical.json`` holds, None without."""
    if "predict" not in task.capabilities:
        return None
    from workbench.clinical.fit import fit_run

    state = randomness.capture()  # rank 0 alone: no barrier (`_chosen_model`), and the run's draws go on unchanged
    try:
        return fit_run(task, adapted_model(out_dir, config, device), data, out_dir, config.seed)
    finally:
        randomness.restore(state)


# -- steps of `adapt` ----------------------------------------------------------------------------
def _init_distributed(device: str) -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


@contextmanager
def _logging_to(path: Path | None) -> Iterator[None]:
    """Copy the workbench's log of this thread into ``path`` while the block runs (nothing when None); runs in
    other threads keep their own files."""
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
    the same ``shared_key``, `workbench.core.reuse`; None: never shared)."""
    saved = _load_result(out_dir, name) if resume else None
    if saved is not None:
        return saved[1]
    score = functools.partial(task.evaluate, model, data.test, device)
    evaluation = reuse.shared(name, None if shared_key is None else [shared_key, str(device)], score, task)
    if rank == 0:
        _save_result(out_dir, name, {"metrics": evaluation.metrics}, evaluation)
    return evaluation


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
        track = functools.partial(curve_scores, task, {"val": data.val, "test": data.test}, device, config.curves
                                  ) if config.curves else None  # fmt: skip
        history = train_stages(stages, task, model, run.out_dir / "checkpoints" / f"{entry}.pt", device, run.progress,
                               str(entry), run.resume, run.threads and run.threads.update, track)  # fmt: skip
    probe_key = [str(entry), config.method_options if chosen else {}, config.task, config.task_options, config.model,
                 config.precision, config.batch_size, str(device)]  # fmt: skip
    step_memory = reuse.measured_once(  # a comparison's worker measures each method's step once
        "step memory", probe_key, lambda: step_bytes(stages[-1], task, model, data, device)
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
        "best_epoch": best_epoch(history),
        "threads_per_epoch": [h.get("threads") for h in history],  # None: an epoch of a run older than the count
        "peak_memory_bytes": memory.peak_bytes,
        "training_memory_bytes": memory.added_bytes,
        "training_step_bytes": step_memory,
        "task_state": task_state,
        "history": history,
    }
    if run.rank == 0:
        if chosen:
            _save_adapter(run.out_dir, method, model, task_state)
        _save_result(run.out_dir, str(entry), result, evaluation)
    return result, evaluation


def _chosen_model(out_dir: Path, config: RunConfig, device: torch.device) -> nn.Module:
    """The chosen method's adapted model, from the adapter it wrote (rank 0 writes; the others wait for it). The
    global random generators are left as they were: building it does not change what the caller draws next."""
    if dist.is_initialized():
        dist.barrier()
    state = randomness.capture()
    try:
        return adapted_model(out_dir, config, device)
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
    ``evaluations`` (`workbench.run.item_bootstrap`), seeded with the run's seed. Without groups or a `Task.rescore`
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

"""One cell of a comparison: its runs, its record and where it runs (this process, worker processes, Dask).

Every method gets the same cells: for each seed, the task's groups (`workbench.core.task.Task.split_groups`: subjects,
patients, trajectory blocks, target rows, ...) are shuffled with the seed and cut into ``folds`` parts; fold ``k``
tests part ``k``, and a share of the other groups validates (the rest trains), so each group is tested exactly once
per seed. A cell is one method on one (fold, seed): an ordinary run (`workbench.run.adapting.run_request`, no baselines)
written to ``<out>/cells/<method>/fold<k>-seed<s>/``, and its record ``cell.json``. The budget is the same for every
method: ``steps`` trains every method for the same epochs with no early stopping (equal optimizer steps for
single-stage methods; the steps each cell took are recorded and the report flags unequal ones), ``convergence``
trains each until the same early-stopping rule stops it. With a learning-rate grid each method takes, per cell, the
rate whose run has the lowest validation loss (the test split never chooses).

A compare is resumable: cells with a record are kept, a cell whose run was interrupted resumes, and the same command
(same ``spec.json``, same ``--threads`` as ``compute.json`` records) picks up where it stopped. A rerun refuses other
settings naming the fields that differ, other threads, and a recorded cell whose data fingerprint is not that of the
data now; a damaged ``cell.json`` is a cache (its cell runs again, saying so), one copied from another cell, a damaged
``spec.json`` and a worker that died are one line. Cells run one after another in this process, in local worker
processes (which end with this process, however it ends), or on a Dask cluster (`distributed.Client`, whose executor
has the same interface as the local one; the output folder must then be on a file system every worker sees). The
results are ``comparison.json`` and ``report.md`` (`workbench.comparison.report`).
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import ctypes
import functools
import gc
import hashlib
import json
import logging
import math
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from workbench.comparison.design import RECORD_KEYS, UNHASHED, Cell, CompareSpec, cell_request, json_object
from workbench.core import reuse
from workbench.core.checkpoint import write_text
from workbench.core.config import RunConfig, resolve_config
from workbench.core.errors import UserError
from workbench.core.metrics import check_recorded
from workbench.core.registry import tasks
from workbench.core.seal import SEAL, seal, verify_seal
from workbench.run.fingerprint import data_fingerprint

_log = logging.getLogger("workbench")

def run_cell(
    spec: CompareSpec, cell: Cell, out: str, threads: int | None = None, reports: bool = False, share: bool = True
) -> dict[str, Any]:
    """Run one cell (each rate of the grid, then keep the one with the best validation objective: the loss, or the
    metric of ``select_on``) and write its record
    ``<out>/cells/<method>/fold<k>-seed<s>/cell.json``; returns the record. Runs interrupted earlier resume.

    ``reports``: each run writes its ``report.md`` and plots; ``share``: the data, model, prepared splits and base
    scores (and a method's fold-free fits) are shared with the earlier cells this process ran (`workbench.core.reuse`:
    the same numbers, computed once)."""
    folder = Path(out) / "cells" / cell.name
    done = folder / "cell.json"
    recorded = read_record(Path(out), cell, lower_is_better(spec))
    if isinstance(recorded, dict):
        return recorded
    _release_record(folder)
    rates = spec.lr_grid or (spec.learning_rate,)
    runs = {}
    start = time.perf_counter()
    with _quiet_logs(), reuse.sharing(share):
        for rate in rates:
            run_dir = folder if len(rates) == 1 else folder / f"lr{rate:g}"
            runs[rate] = _cell_run(spec, cell, run_dir, rate, threads, reports)
    wall_seconds = time.perf_counter() - start
    _freeze_imports()
    chosen = min(runs, key=lambda rate: runs[rate]["best_objective"]) if len(rates) > 1 else rates[0]
    record = {
        "method": cell.method,
        "fold": cell.fold,
        "seed": cell.seed,
        "split": {name: list(groups) for name, groups in cell.split.items()},
        "run": str(Path("cells") / cell.name / ("" if len(rates) == 1 else f"lr{chosen:g}")).rstrip("/"),
        **runs[chosen],
        "lr_grid": {f"{rate:g}": runs[rate]["best_objective"] for rate in rates} if len(rates) > 1 else {},
        "manifest": cell_manifest(spec, cell, runs[chosen], wall_seconds),
    }
    text = json.dumps(record, indent=2) + "\n"
    kind = "cell" if len(rates) == 1 else "grid-cell"  # a grid's runs are sealed in their own folders
    seal(folder, kind, pending={"cell.json": text.encode()}, extend=True)  # its run's seal, then the record
    write_text(done, text)
    return record


def cell_manifest(spec: CompareSpec, cell: Cell, run: Mapping[str, Any], wall_seconds: float) -> dict[str, Any]:
    """What a cell's record says about how its numbers were made (``run``: the kept run's `_cell_run` fields).

    ``config_hash``: sha256 (hex) of the resolved configuration of every run of the cell, one per learning rate of
    the grid (`workbench.core.config.RunConfig` as ``config.yaml`` holds it, less `UNHASHED`); ``data_fingerprint``: see
    `data_fingerprint`; ``versions`` of Python, torch, numpy, scipy and the workbench; ``commit``: `source_commit`;
    ``steps`` and ``kept_epoch`` of the kept run; ``wall_seconds``: the cell's runs in this process [s] (a resumed
    cell: since it resumed).
    """
    rates = spec.lr_grid or (spec.learning_rate,)
    configs = [resolve_config(cell_request(spec, cell, Path(), rate, None))[0] for rate in rates]
    return {
        "config_hash": config_hash(configs),
        "data_fingerprint": data_fingerprint(spec.data_for(cell.seed), spec.domain, configs[0].task_options, cell.seed),
        "versions": versions(),
        "commit": source_commit(),
        "steps": run["steps"],
        "kept_epoch": run["kept_epoch"],
        "wall_seconds": wall_seconds,
    }


def config_hash(configs: Sequence[RunConfig]) -> str:
    """sha256 (hex) of the configurations ``configs`` as canonical JSON, less the fields of `UNHASHED`."""
    content = [{k: v for k, v in config.to_dict().items() if k not in UNHASHED} for config in configs]
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def versions() -> dict[str, str]:
    """Versions of Python and of the packages that make a cell's numbers."""
    import scipy

    import workbench

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "scipy": scipy.__version__, "workbench": workbench.__version__}  # fmt: skip


@functools.cache  # the source this process imported: its commit when it started
def source_commit() -> str | None:
    """The git commit of the workbench's source tree, with "+dirty" when a tracked file differs from it; None when
    the package is not a file of a git checkout (an installed wheel) or git cannot be run."""
    package = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        command = ["git", "-C", str(package), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout.strip()

    try:
        git("ls-files", "--error-unmatch", Path(__file__).name)  # this file is tracked: the checkout is the package's
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def _cell_run(
    spec: CompareSpec, cell: Cell, run_dir: Path, rate: float | None, threads: int | None, reports: bool
) -> dict:
    """One run of a cell at learning rate ``rate``: its test metrics and costs, from its ``metrics.json``."""
    from workbench.run.adapting import run_request

    request = cell_request(spec, cell, run_dir, rate, threads)
    run = run_request(request, resume=(run_dir / "config.yaml").is_file(), quiet=True, reports=reports)
    result = json.loads((run.path / "results" / f"{request.method}.json").read_text())
    history = result.get("history", [])
    last_stage = history[-1].get("stage") if history else None
    last = [row for row in history if row.get("stage") == last_stage and row.get("selectable", 1)]
    val_losses = [row["val_loss"] for row in last]
    objectives = [row.get("objective", row["val_loss"]) for row in last]
    return {
        "metrics": run.metrics["after"],
        "before": run.metrics["before"],
        "learning_rate": result.get("learning_rate"),
        "best_val_loss": min(val_losses) if val_losses else float("nan"),
        #: The best validation objective (`CompareSpec.select_on`; lower is better: a metric negated where higher is).
        "best_objective": min(objectives) if objectives else float("nan"),
        "steps": int(sum(row.get("steps", 0) for row in history)),
        "epochs": len(history),
        "kept_epoch": kept_epoch(history),
        "trainable_parameters": result.get("trainable_parameters"),
        "train_seconds": result.get("train_seconds"),
        "peak_memory_bytes": result.get("peak_memory_bytes"),
        "training_step_bytes": result.get("training_step_bytes"),
        "test_samples": run.metrics["samples"]["test"],
        "threads": run.config.threads,
    }


def kept_epoch(history: Sequence[Mapping[str, Any]]) -> int | None:
    """The epoch (from 1, counted over all stages) whose weights a run kept, by `workbench.core.trainer.Trainer.fit`'s
    rule: among the last stage's selectable epochs, the first whose validation objective is lower than every earlier
    one's (a tie keeps the earlier epoch; NaN is never lower); none such: the stage's last epoch (its last weights
    stay). None for a run that did not train."""
    if not history:
        return None
    rows = [row for row in history if row.get("stage") == history[-1].get("stage")]
    best, kept = math.inf, rows[-1]
    for row in rows:
        objective = row.get("objective", row["val_loss"])
        if row.get("selectable", True) and objective < best:
            best, kept = objective, row
    return int(kept["epoch"]) + 1


def _freeze_imports() -> None:
    """After this process's first cell: what it imported and built once (modules, the registry) moves out of the
    garbage collector's sight (`gc.freeze`), so that the full collections that open every memory measurement
    (`workbench.core.memory`) scan only what later cells make, not the whole interpreter again."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True


_frozen = False


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """The runs of a cell log into their own ``log.txt`` only (the console shows the comparison's progress); cells
    side by side (`workbench.lockstep`) overlap their blocks: the last one out gives the logger back."""
    logger = logging.getLogger("workbench")
    if not _quiet_cells["count"]:
        _quiet_cells["propagate"] = logger.propagate
        logger.propagate = False
    _quiet_cells["count"] += 1
    try:
        yield
    finally:
        _quiet_cells["count"] -= 1
        if not _quiet_cells["count"]:
            logger.propagate = _quiet_cells["propagate"]


#: Cells inside `_quiet_logs` in this process, and the workbench logger's ``propagate`` before the first entered.
_quiet_cells: dict[str, Any] = {"count": 0, "propagate": True}


def _release_record(folder: Path) -> None:
    """A cell about to be recorded again whose ``cell.json`` is missing (a crash between its seal and its record) or
    damaged (`read_record`: a record is a cache of its run): when the rest of the folder verifies against the cell's
    seal, the damaged record is removed and the seal goes back to its run's (a "run" seal anew; a grid cell's is
    removed), so that the run is reused and the cell recorded and sealed again.

    Raises:
        UserError: the rest of the folder does not verify against that seal (naming the first problem).
    """
    path = folder / SEAL
    content = json_object(path) if path.is_file() else None
    if not isinstance(content, dict) or content.get("kind") not in ("cell", "grid-cell"):
        return
    problems = verify_seal(folder, ignore={"cell.json"})
    if problems:
        raise UserError(f"{problems[0]}; remove {folder} to run that cell again")
    (folder / "cell.json").unlink(missing_ok=True)
    if content["kind"] == "cell":
        seal(folder, "run")
    else:
        path.unlink()


@functools.cache
def _lower_is_better(domain: str, options: str) -> frozenset[str]:
    """`workbench.core.task.Task.lower_is_better` of the task ``domain`` with the options ``options`` (JSON)."""
    return frozenset(tasks.get(domain)(**json.loads(options)).lower_is_better)


def lower_is_better(spec: CompareSpec) -> frozenset[str]:
    """The metrics of which lower is better (errors) of the comparison's task with its options."""
    return _lower_is_better(spec.domain, json.dumps(dict(spec.task_options), sort_keys=True, default=str))


def read_record(out: Path, cell: Cell, lower: frozenset[str] = frozenset()) -> dict[str, Any] | str | None:
    """The record of ``cell`` in the comparison ``out``: None when it has none; a text saying what is wrong when its
    ``cell.json`` is damaged (not JSON, not an object, a key of `RECORD_KEYS` missing, metrics or split that are not
    objects): a record is a cache of its cell's run, so the cell runs again (a finished run is only read again).

    Raises:
        UserError: the record is of another cell (copied from another folder), or a metric (``metrics``,
            ``before``) is out of its range (`workbench.core.metrics.check_recorded`; ``lower``: the task's errors).
    """
    path = out / "cells" / cell.name / "cell.json"
    if not path.is_file():
        return None
    record = json_object(path)
    if isinstance(record, str):
        return record
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        return f"no {', '.join(missing)}"
    if not (isinstance(record["metrics"], dict) and isinstance(record["split"], dict)):
        return "its metrics or split are not JSON objects"
    if (record["method"], record["fold"], record["seed"]) != (cell.method, cell.fold, cell.seed):
        named = f"{record['method']}/fold{record['fold']}-seed{record['seed']}"
        raise UserError(f"{path}: records the cell {named}, not {cell.name} (copied from another cell's folder?); "
                        "remove it to run this cell again")  # fmt: skip
    try:
        for field in ("metrics", "before"):
            if field in record:
                check_recorded(path, field, record[field], lower)
    except UserError as error:
        raise UserError(f"{error}: remove {path.parent} to run that cell again") from None
    return record


def check_recorded_data(spec: CompareSpec, cell: Cell, record: Mapping[str, Any], out: Path,
                         known: dict[tuple[int, str], str]) -> bool:  # fmt: skip
    """The data fingerprint in ``cell``'s record (its manifest) is that of the data now (``known``: the fingerprints
    computed so far, by seed and task options); False for a record without one (written before manifests). A
    `UserError` naming the cell when the data changed, or when the record holds another split than the cell's."""
    path = out / "cells" / cell.name / "cell.json"
    manifest = record.get("manifest")
    recorded = manifest.get("data_fingerprint") if isinstance(manifest, dict) else None
    if recorded is not None:
        rate = (spec.lr_grid or (spec.learning_rate,))[0]
        options = resolve_config(cell_request(spec, cell, Path(), rate, None))[0].task_options
        key = (cell.seed, json.dumps(options, sort_keys=True, default=str))
        if key not in known:
            known[key] = data_fingerprint(spec.data_for(cell.seed), spec.domain, options, cell.seed)
        if known[key] != recorded:
            raise UserError(f"cell {cell.name}: the data changed since it was recorded (its data fingerprint in {path} "
                            "is not that of the data now); the comparison would mix two data sets: give the data it "
                            "ran on, or another --out")  # fmt: skip
    if record["split"] != {name: list(groups) for name, groups in cell.split.items()}:
        raise UserError(f"{path}: records another split than cell {cell.name} has (its data or its folds changed?); "
                        "remove it to run this cell again")  # fmt: skip
    return recorded is not None


def run_cells(
    spec: CompareSpec, cells: list[Cell], out: Path, parallel: tuple[int, int], executor: str, scheduler: str | None,
    quiet: bool, costs: tuple[bool, bool] = (False, True),
) -> list[dict[str, Any]]:
    """Every cell's record, in the order of ``cells``: recorded ones read, the others run (``parallel``: workers,
    threads per cell; ``costs``: `run_cell`'s ``reports`` and ``share``)."""
    workers, threads = parallel
    records: dict[str, dict[str, Any]] = {}
    todo = []
    fingerprints: dict[tuple[int, str], str] = {}
    unchecked = 0
    for cell in cells:
        record = read_record(out, cell, lower_is_better(spec))
        if isinstance(record, dict):
            unchecked += not check_recorded_data(spec, cell, record, out, fingerprints)
            records[cell.name] = record
            continue
        if record is not None:
            _log.warning("%s: damaged (%s): running cell %s again", out / "cells" / cell.name / "cell.json", record,
                         cell.name)  # fmt: skip
        todo.append(cell)
    if unchecked:
        _log.warning("%d recorded cell(s) of %s have no data fingerprint (recorded before cells had a manifest): "
                     "their data are not checked", unchecked, out)  # fmt: skip
    bar = tqdm(total=len(cells), initial=len(records), desc="cells", unit="cell", disable=quiet)
    with _executor(workers, executor, scheduler, quiet) as pool:
        if pool is None:
            previous = torch.get_num_threads()  # a cell sets this process's threads: give the caller's back
            try:
                for cell in todo:
                    run = functools.partial(run_cell, spec, cell, str(out), threads, *costs)
                    records[cell.name] = _checked(cell, run)
                    bar.update()
            finally:
                torch.set_num_threads(previous)
        else:
            futures = {pool.submit(run_cell, spec, cell, str(out), threads, *costs): cell for cell in todo}
            for future in concurrent.futures.as_completed(futures):
                cell = futures[future]
                records[cell.name] = _checked(cell, future.result)
                bar.update()
    bar.close()
    return [records[cell.name] for cell in cells]


def _checked(cell: Cell, result: Any) -> dict[str, Any]:
    """``result()``, with a cell's `UserError` naming the cell (the finished cells stay recorded)."""
    try:
        return result()
    except UserError as error:
        raise UserError(f"cell {cell.name}: {error}") from None
    except concurrent.futures.process.BrokenProcessPool:
        raise UserError(f"a worker process died (killed, or out of memory?) before cell {cell.name} was recorded; "
                        "the cells finished so far are: run the same command again to continue") from None  # fmt: skip


@contextmanager
def _executor(
    workers: int, executor: str, scheduler: str | None, quiet: bool = False
) -> Iterator[concurrent.futures.Executor | None]:
    """None (cells in this process), local worker processes, or a Dask cluster's `concurrent.futures` executor.

    Local workers end with this process, however it ends (`_die_with_parent`: kill -9 included), and on an error no
    queued cell starts (running ones finish and are recorded). A local Dask cluster is closed on any exit of the
    block; its worker processes end with this one by Dask's own watch of their parent. ``quiet``: Dask logs only
    errors."""
    if executor == "local":
        if workers == 1:
            yield None
            return
        context = multiprocessing.get_context("spawn")  # no forked torch state in the workers
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_die_with_parent, initargs=(os.getpid(),)
        ) as pool:
            try:
                yield pool
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
        return
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        from workbench.core.registry import install_command

        raise UserError(f"--executor dask needs Dask's distributed scheduler: {install_command('cluster')}") from None
    dask_logs = logging.getLogger("distributed")
    level = dask_logs.level
    if quiet:
        dask_logs.setLevel(logging.ERROR)
    try:
        if scheduler is not None:
            with Client(scheduler) as client:
                yield client.get_executor(pure=False)
            return
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            with Client(cluster) as client:
                yield client.get_executor(pure=False)
    finally:
        dask_logs.setLevel(level)


#: Linux's ``prctl`` option that sends a process a signal when its parent ends (``<linux/prctl.h>``).
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Initializer of a local worker process: it is killed when ``parent`` (the comparison's process, which started
    it) ends, kill -9 included, so that no worker goes on running cells that nobody will record. On Linux the kernel
    sends it SIGKILL (``prctl(PR_SET_PDEATHSIG)``); elsewhere a thread watches for a new parent process id."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:  # the parent ended before the call
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent,), name="workbench-parent-watch", daemon=True).start()


def _watch_parent(parent: int, every_seconds: float = 0.5) -> None:
    """End this process as soon as its parent is no longer ``parent`` (it ended; the process was given to another)."""
    tick = threading.Event()  # never set: its wait is a pause
    while os.getppid() == parent:
        tick.wait(every_seconds)
    os._exit(1)

"""``workbench compare``: several methods on one task, on grouped folds and seeds, at equal budgets.

Every method gets the same cells: for each seed, the task's groups (`workbench.task.Task.split_groups`: subjects,
patients, trajectory blocks, target rows, ...) are shuffled with the seed and cut into ``folds`` parts; fold ``k``
tests part ``k``, and a share of the other groups validates (the rest trains), so each group is tested exactly once
per seed. A cell is one method on one (fold, seed): an ordinary run (`workbench.run.run_request`, no baselines)
written to ``<out>/cells/<method>/fold<k>-seed<s>/``, and its record ``cell.json``. The budget is the same for every
method: ``steps`` trains every method for the same epochs with no early stopping (equal optimizer steps for
single-stage methods; the steps each cell took are recorded and the report flags unequal ones), ``convergence``
trains each until the same early-stopping rule stops it. With a learning-rate grid each method takes, per cell, the
rate whose run has the lowest validation loss (the test split never chooses).

Every record can be audited: it holds the epoch its run kept (``kept_epoch``) and a ``manifest`` (`cell_manifest`:
configuration hash, data fingerprint, package versions, source commit, steps, kept epoch, wall time), and
`rerun_cell` (``workbench compare --rerun-cell ID DIR``) runs one cell again in a temporary folder and sets its
metrics and hashes beside the recorded ones. Records written before the manifest existed lack both keys. Each cell
folder is sealed (`workbench.seal`: its run's files and ``cell.json``, sha256 and size) before its record appears, the
comparison seals its own files when it writes its report, and the report step verifies every cell first: a record
changed after it was written is refused, naming it (``workbench verify DIR`` checks the whole comparison).

A compare is resumable: cells with a record are kept, a cell whose run was interrupted resumes, and the same command
(same ``spec.json``, same ``--threads`` as ``compute.json`` records) picks up where it stopped. A rerun refuses other
settings naming the fields that differ, other threads, and a recorded cell whose data fingerprint is not that of the
data now; a damaged ``cell.json`` is a cache (its cell runs again, saying so), one copied from another cell, a damaged
``spec.json`` and a worker that died are one line. Cells run one after another in this process, in local worker
processes (which end with this process, however it ends), or on a Dask cluster (`distributed.Client`, whose executor
has the same interface as the local one; the output folder must then be on a file system every worker sees). The
results are ``comparison.json`` and ``report.md`` (`workbench.comparison_report`).

Fixed costs are paid once per worker, not per cell: a worker lives for the whole comparison (imports, the registry),
and the data of a seed, the model, each (fold, seed)'s prepared splits and base-model scores and a method's fold-free
fits are computed once and shared by its later cells (`workbench.reuse`, exact: the same numbers as computed alone).
Cells write no ``report.md`` or plots of their own unless asked (the comparison's report and figures always).
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import ctypes
import dataclasses
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
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from workbench import lockstep, reuse
from workbench.checkpoint import write_json, write_text
from workbench.config import MethodEntry, RunConfig, resolve_config
from workbench.errors import UserError
from workbench.fingerprint import data_fingerprint
from workbench.options import renamed
from workbench.registry import methods, models, tasks
from workbench.rundir import claim_run_dir
from workbench.seal import seal, verify
from workbench.settings import settings_for, with_settings
from workbench.statistics import MIN_UNITS

_log = logging.getLogger("workbench")

#: Budget policies: the same for every method of a comparison.
BUDGETS = ("steps", "convergence")
#: Where cells run: this process / local worker processes, or a Dask cluster.
EXECUTORS = ("local", "dask")
#: Seeds below this are for development and tuning (the report flags a comparison that uses one).
DEVELOPMENT_SEEDS_BELOW = 100
#: New reported numbers use seeds from here on: 100–199 were spent on the benchmarks reported before (their designs
#: were chosen looking at them), so a fresh claim draws seeds they never saw.
FIRST_REPORTED_SEED = 200
#: `workbench.config.RunConfig` fields a cell's configuration hash leaves out: where the run wrote, and its CPU
#: threads (not part of the spec; recorded beside the hash as ``threads``, and kept by `rerun_cell`).
UNHASHED = ("out", "threads")
#: Largest absolute difference of a metric that `rerun_cell` counts as reproduced (CPU reruns with one seed and
#: one thread count are bit-identical).
RERUN_TOLERANCE = 1e-9
#: Relative difference allowed, on top, between a cell whose seeds trained side by side and its rerun alone.
SIDE_BY_SIDE_TOLERANCE = 1e-5


def entry_of(label: str) -> MethodEntry:
    """The `workbench.config.MethodEntry` of a compared label ``METHOD[@MODEL][:VARIANT]``: ``full@OTHER`` is full
    training of the registered model ``OTHER``; ``METHOD:VARIANT`` is ``METHOD`` with the options `CompareSpec.
    method_options` gives that label (a variant compared beside plain ``METHOD``)."""
    try:
        return MethodEntry.parse(label)
    except UserError as error:
        raise UserError(f"--methods: {error}") from None


@with_settings("compare")
class CompareSpec:
    """What a comparison runs: everything that determines its numbers (``spec.json``): its own fields, then the run
    settings ``compare`` takes (`workbench.settings.settings_for`: data, model, epochs, sizes, patience under
    ``convergence``, one learning rate, schedule, selection), handed to every cell's run."""

    domain: str
    #: Compared entries, ``METHOD[@MODEL][:VARIANT]`` (`workbench.config.MethodEntry`).
    methods: tuple[str, ...]
    #: The method every other is paired against (default: the first).
    reference: str = ""
    #: The entry whose after − before shows that the cells train at all (default: the reference; name another when
    #: the reference is a source-only baseline that is not meant to move, such as uniform sample weights).
    learner: str = ""
    #: 3 folds: each group is tested once per seed while two thirds of the others train, and the default design stays
    #: at 3 × 3 = 9 cells per method (5 folds: 15). More folds only steady each seed's mean (a seed's folds are
    #: averaged first); verdicts need more seeds, not more folds.
    folds: int = 3
    #: `statistics.MIN_UNITS` reported seeds (100, 101, 102): the fewest units that can give a verdict.
    seeds: tuple[int, ...] = tuple(range(FIRST_REPORTED_SEED, FIRST_REPORTED_SEED + MIN_UNITS))
    budget: str = "steps"
    #: Learning rates each method chooses from per cell on its validation loss (empty: no choice).
    lr_grid: tuple[float, ...] = ()
    #: Share of the non-test groups that validates (at least one group).
    val_share: float = 0.2
    task_options: Mapping[str, Any] = field(default_factory=dict)
    #: Options per compared entry (its label in `methods`).
    method_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", tuple(self.methods))
        object.__setattr__(self, "seeds", tuple(int(seed) for seed in self.seeds))
        object.__setattr__(self, "lr_grid", tuple(float(rate) for rate in self.lr_grid))
        object.__setattr__(self, "reference", self.reference or (self.methods[0] if self.methods else ""))

    def check(self) -> None:
        """A `UserError` for what cannot be compared, before anything runs."""
        task_cls = tasks.get(self.domain)
        if "folds" not in task_cls.capabilities:
            raise UserError(f"task '{self.domain}' has no grouped folds (`workbench list`): it cannot be compared")
        if not self.methods:
            raise UserError("--methods names no method")
        if len(set(self.methods)) != len(self.methods):
            raise UserError(f"--methods names a method twice: {','.join(self.methods)}")
        for label in self.methods:
            entry = entry_of(label)
            methods.get(entry.method)
            if entry.model is not None:
                models.get(entry.model)
        if self.reference not in self.methods:
            raise UserError(f"--reference {self.reference} is not one of --methods {','.join(self.methods)}")
        if self.learner and self.learner not in self.methods:
            raise UserError(f"--learner {self.learner} is not one of --methods {','.join(self.methods)}")
        unknown = set(self.method_options) - set(self.methods)
        if unknown:
            raise UserError(f"options given for {', '.join(sorted(unknown))}, which --methods does not name")
        if self.folds < 2:
            raise UserError(f"--folds must be at least 2, got {self.folds}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise UserError(f"--seeds must name distinct seeds, got {list(self.seeds)}")
        if self.budget not in BUDGETS:
            raise UserError(f"--budget must be one of {', '.join(BUDGETS)}, got {self.budget!r}")
        if not 0 < self.val_share < 1:
            raise UserError(f"--fold-val-share must be in (0, 1), got {self.val_share}")
        if any(rate <= 0 for rate in self.lr_grid) or (self.lr_grid and self.learning_rate is not None):
            raise UserError("--lr-grid takes positive rates, and replaces --lr (give one of them)")

    def to_dict(self) -> dict[str, Any]:
        content = dataclasses.asdict(self)
        return json.loads(json.dumps(content))  # tuples as lists, as spec.json holds them

    @classmethod
    def from_dict(cls, content: Mapping[str, Any]) -> "CompareSpec":
        """The spec a ``spec.json`` holds (fields added since it was written take their defaults; a setting renamed
        since, its current name)."""
        content = renamed("spec.json", settings_for("compare"), content)
        return cls(**{key: tuple(value) if isinstance(value, list) else value for key, value in content.items()})

    @property
    def development(self) -> bool:
        """Whether any seed is a development seed (below `DEVELOPMENT_SEEDS_BELOW`)."""
        return min(self.seeds) < DEVELOPMENT_SEEDS_BELOW


@dataclass(frozen=True)
class Cell:
    """One method on one (fold, seed): the groups it validates and tests on."""

    method: str
    fold: int
    seed: int
    split: Mapping[str, Sequence[str]]

    @property
    def name(self) -> str:
        return f"{self.method}/fold{self.fold}-seed{self.seed}"


def fold_splits(groups: Sequence[str], folds: int, seed: int, val_share: float) -> list[dict[str, list[str]]]:
    """``folds`` splits of ``groups`` (one per fold): the groups shuffled with ``seed`` and cut into ``folds``
    near-equal parts; fold ``k`` tests part ``k`` and validates on the first ``max(1, round(val_share * rest))`` of
    the other groups (in shuffled order), so every group is tested exactly once.

    Raises:
        UserError: too few groups for ``folds`` folds with one validating and one training group each.
    """
    unique = sorted(set(groups))
    if len(unique) < folds + 2 or len(unique) - -(-len(unique) // folds) < 2:
        raise UserError(
            f"{len(unique)} group(s) cannot make {folds} folds that each keep a validation and a training group; "
            "lower --folds"
        )
    order = [unique[i] for i in np.random.default_rng(seed).permutation(len(unique))]
    parts = np.array_split(np.arange(len(order)), folds)
    splits = []
    for part in parts:
        held = set(part.tolist())
        rest = [order[i] for i in range(len(order)) if i not in held]
        n_val = min(len(rest) - 1, max(1, round(val_share * len(rest))))
        splits.append({"val": sorted(rest[:n_val]), "test": sorted(order[i] for i in part)})
    return splits


def plan_cells(spec: CompareSpec, quiet: bool = True) -> tuple[list[Cell], dict[str, Any]]:
    """Every cell of ``spec`` (methods × folds × seeds, the splits read from each seed's data) and facts about the
    groups (their kind and count per seed) for the report."""
    task = tasks.get(spec.domain)(**spec.task_options)
    task.progress = not quiet
    cells, counts = [], {}
    for seed in spec.seeds:
        groups = task.split_groups(task.read(spec.data, seed))
        counts[str(seed)] = len(set(groups))
        for fold, split in enumerate(fold_splits(groups, spec.folds, seed, spec.val_share)):
            cells += [Cell(method, fold, seed, split) for method in spec.methods]
    facts = {
        "group_kind": task.group_kind,
        "groups_per_seed": counts,
        "metrics": list(task.metrics),
        "lower_is_better": sorted(task.lower_is_better),
        "metrics_note": task.metrics_note,
    }
    return cells, facts


def run_cell(
    spec: CompareSpec, cell: Cell, out: str, threads: int | None = None, reports: bool = False, share: bool = True
) -> dict[str, Any]:
    """Run one cell (each rate of the grid, then keep the one with the best validation objective: the loss, or the
    metric of ``select_on``) and write its record
    ``<out>/cells/<method>/fold<k>-seed<s>/cell.json``; returns the record. Runs interrupted earlier resume.

    ``reports``: each run writes its ``report.md`` and plots; ``share``: the data, model, prepared splits and base
    scores (and a method's fold-free fits) are shared with the earlier cells this process ran (`workbench.reuse`:
    the same numbers, computed once)."""
    folder = Path(out) / "cells" / cell.name
    done = folder / "cell.json"
    recorded = _recorded(Path(out), cell)
    if isinstance(recorded, dict):
        return recorded
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
        **_side_by_side_record(),
    }
    text = json.dumps(record, indent=2) + "\n"
    seal(folder, "cell", pending={"cell.json": text.encode()}, extend=True)  # its run's seal, then the record
    write_text(done, text)
    return record


def _side_by_side_record() -> dict[str, Any]:
    """How the cell running in this thread trained, for its record: ``seeds_side_by_side`` (the seeds its training
    was batched with, itself included; 1: alone) and ``side_by_side_note`` (why not batched, when it met others);
    nothing for a cell that ran on its own."""
    meeting = lockstep.current()
    if meeting is None:
        return {}
    if meeting.fallback is None and not meeting.batched:
        return {"seeds_side_by_side": 1, "side_by_side_note": "its plan is not one batchable training stage (a loss "
                "that reads only the model and the batch)"}  # fmt: skip
    return {"seeds_side_by_side": meeting.batched if meeting.fallback is None else 1,
            "side_by_side_note": meeting.fallback}  # fmt: skip


def cell_manifest(spec: CompareSpec, cell: Cell, run: Mapping[str, Any], wall_seconds: float) -> dict[str, Any]:
    """What a cell's record says about how its numbers were made (``run``: the kept run's `_cell_run` fields).

    ``config_hash``: sha256 (hex) of the resolved configuration of every run of the cell, one per learning rate of
    the grid (`workbench.config.RunConfig` as ``config.yaml`` holds it, less `UNHASHED`); ``data_fingerprint``: see
    `data_fingerprint`; ``versions`` of Python, torch, numpy, scipy and the workbench; ``commit``: `source_commit`;
    ``steps`` and ``kept_epoch`` of the kept run; ``wall_seconds``: the cell's runs in this process [s] (a resumed
    cell: since it resumed).
    """
    rates = spec.lr_grid or (spec.learning_rate,)
    configs = [resolve_config(cell_request(spec, cell, Path(), rate, None))[0] for rate in rates]
    return {
        "config_hash": config_hash(configs),
        "data_fingerprint": data_fingerprint(spec.data, spec.domain, configs[0].task_options, cell.seed),
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


def cell_request(spec: CompareSpec, cell: Cell, run_dir: Path, rate: float | None, threads: int | None) -> Any:
    """The `workbench.config.RunRequest` of one run of a cell: the method alone (no baselines) on the cell's split,
    with the comparison's budget."""
    from workbench.config import RunRequest
    from workbench.trainer import TrainSettings

    epochs = spec.epochs if spec.epochs is not None else tasks.get(spec.domain).defaults.get(
        "epochs", TrainSettings.epochs)  # fmt: skip
    entry = entry_of(cell.method)
    shared = {setting.name: getattr(spec, setting.name) for setting in settings_for("compare")}
    return RunRequest(**{
        **shared,
        "domain": spec.domain,
        "method": entry.method,
        "baselines": (),
        "model": entry.model or spec.model,
        "out": str(run_dir),
        "epochs": epochs,
        "patience": epochs if spec.budget == "steps" else spec.patience,
        "learning_rate": rate,
        "seed": cell.seed,
        "threads": threads,
        "task_options": dict(spec.task_options),
        "method_options": dict(spec.method_options.get(cell.method, {})),
        "split": cell.split,
    })


def _cell_run(
    spec: CompareSpec, cell: Cell, run_dir: Path, rate: float | None, threads: int | None, reports: bool
) -> dict:
    """One run of a cell at learning rate ``rate``: its test metrics and costs, from its ``metrics.json``."""
    from workbench.run import run_request

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
    """The epoch (from 1, counted over all stages) whose weights a run kept, by `workbench.trainer.Trainer.fit`'s
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
    (`workbench.memory`) scan only what later cells make, not the whole interpreter again."""
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


def compare(
    spec: CompareSpec,
    out: str | Path,
    *,
    workers: int = 1,
    threads: int = 1,
    executor: str = "local",
    scheduler: str | None = None,
    quiet: bool = False,
    cell_reports: bool = False,
    share: bool = True,
    side_by_side: bool = False,
) -> dict[str, Any]:
    """Run every cell of ``spec`` not yet recorded in ``out``, then write ``comparison.json`` and ``report.md``.

    ``workers``: cells at a time (1: in this process); ``threads``: CPU threads of each cell (fixed, never chosen
    from the machine's load, so that executors and reruns agree bit for bit; more cores are better used by more
    workers than by more threads per cell on small models); ``executor`` "dask" runs them on the Dask cluster at
    ``scheduler`` (an address such as ``tcp://host:8786``), or on a local Dask cluster of ``workers`` processes when
    none is given. Before the data are read, prints the design (`workbench.comparison_report.design`; ``quiet``:
    only a design that cannot give a verdict, as a warning). ``cell_reports``: every cell's run writes its own
    ``report.md`` and plots (the comparison's report is always written); ``share``: each worker computes the data,
    model, splits and base scores of a seed or (fold, seed) once for all its cells (`workbench.reuse`; False: every
    cell computes its own, the same numbers, slower); ``side_by_side``: the seeds of each method and fold train as
    one batched computation where the method and model allow it (`workbench.seed_batch`; the metrics equal those of
    one seed at a time to rounding, not bit for bit; each record says how its cell trained). Returns the comparison
    (what ``comparison.json`` holds).
    """
    from workbench import comparison_report

    spec.check()
    if workers < 1 or threads < 1:
        raise UserError(f"--workers and --threads must be at least 1, got {workers} and {threads}")
    if executor not in EXECUTORS:
        raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    out = Path(out)
    resume = _check_spec(out, spec)
    if resume:
        _check_threads(out, threads)
    line, problem = comparison_report.design(spec)  # before the data are read and any cell runs
    if not quiet:
        print("\n".join(text for text in (line, problem) if text), flush=True)
    elif problem:
        _log.warning("%s", problem)
    cells, facts = plan_cells(spec, quiet)
    for cell in cells[: len(spec.methods)]:  # each method's settings, checked before anything is written
        for rate in spec.lr_grid or (spec.learning_rate,):
            resolve_config(cell_request(spec, cell, out, rate, None))
    with claim_run_dir(out, resume=resume, continues=None):  # no spec.json: nothing a rerun could continue
        if not resume:
            write_json(out / "spec.json", spec.to_dict())
        if not (out / COMPUTE).is_file():
            write_json(out / COMPUTE, {"threads": threads})
        records = _run_cells(spec, cells, out, (workers, threads), executor, scheduler, quiet, (cell_reports, share),
                             side_by_side)  # fmt: skip
        _verify_cells(out, cells)
        comparison = comparison_report.summarise(spec, facts, records)
        write_json(out / "comparison.json", comparison)
        comparison_report.write(comparison, out)
        seal(out, "comparison")  # its own files; each cell's folder holds its own seal
    if not quiet:
        print(comparison_report.console_table(comparison))
        print(f"comparison written to {out}")
    return comparison


def _verify_cells(out: Path, cells: Sequence[Cell]) -> None:
    """Every cell's record and run files as their seal says (`workbench.seal.verify`), before they are summarised;
    cells recorded before cells were sealed are used with one warning.

    Raises:
        UserError: one line naming the first file that differs from its cell's seal.
    """
    unsealed = []
    for cell in cells:
        result = verify(out / "cells" / cell.name)
        if result.problems:
            more = f" (and {len(result.problems) - 1} more: workbench verify {out})" if len(result.problems) > 1 else ""
            raise UserError(f"{result.problems[0]}{more}; the report uses only records that match their seals: "
                            f"remove {out / 'cells' / cell.name} to run that cell again")  # fmt: skip
        unsealed += result.unsealed
    if unsealed:
        logging.getLogger("workbench").warning(
            "%d cell folder(s) of %s have no seal.json (recorded before cells were sealed): not verified",
            len(unsealed),
            out,
        )


def _check_spec(out: Path, spec: CompareSpec) -> bool:
    """Whether ``out`` holds this comparison already (to continue); a `UserError` when it holds another (naming the
    fields that differ) or its ``spec.json`` cannot be read."""
    written = out / "spec.json"
    if not written.is_file():
        return False
    earlier = _read_spec(written).to_dict()
    now = spec.to_dict()
    changed = [key for key in now if earlier.get(key) != now[key]]
    if changed:
        details = "; ".join(f"{_SPEC_FLAGS.get(key, key)}: was {json.dumps(earlier.get(key))}, now "
                            f"{json.dumps(now[key])}" for key in changed)  # fmt: skip
        raise UserError(f"{out} holds a comparison with other settings ({details}; its spec.json); give another "
                        "--out, or the same settings to continue it")  # fmt: skip
    return True


#: How messages name a `CompareSpec` field whose flag is not its name.
_SPEC_FLAGS = {
    "val_share": "val_share (--fold-val-share)",
    **{s.name: f"{s.name} ({s.flag})" for s in settings_for("compare") if s.flag != "--" + s.name.replace("_", "-")},
    "method_options": "method_options (--set)",
    "task_options": "task_options (the task's flags)",
}
#: The file of a comparison folder that says how its cells computed, beside ``spec.json`` (what they compute): the
#: CPU threads of each cell (``--threads``), which change numbers in their last digits but are not compared.
COMPUTE = "compute.json"
#: What every cell record holds; a record without one of them is damaged (its cell runs again).
RECORD_KEYS = ("method", "fold", "seed", "split", "metrics")


def _json_object(path: Path) -> dict[str, Any] | str:
    """The JSON object in ``path``, or what is wrong with it in words (not UTF-8 or not JSON, say truncated; another
    JSON value, say null)."""
    try:
        content = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"not JSON: {error}"
    kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(content), "a number")
    return content if isinstance(content, dict) else f"{kind}, not a JSON object"


def _read_spec(path: Path) -> CompareSpec:
    """The spec in a comparison's ``spec.json``; a `UserError` in one line when it is damaged."""
    content = _json_object(path)
    if isinstance(content, str):
        raise UserError(f"{path}: damaged ({content}); what this comparison ran cannot be read: give another --out")
    try:
        return CompareSpec.from_dict(content)
    except (TypeError, ValueError) as error:
        raise UserError(f"{path}: not the spec of a comparison ({error}); give another --out") from None


def _check_threads(out: Path, threads: int) -> None:
    """A rerun computes with the ``--threads`` the comparison in ``out`` computed with (its ``compute.json``; for a
    comparison written before there was one: its recorded cells' threads); a `UserError` naming them when not."""
    path = out / COMPUTE
    if path.is_file():
        content = _json_object(path)
        if isinstance(content, str) or not isinstance(content.get("threads"), int):
            raise UserError(f"{path}: damaged ({content if isinstance(content, str) else 'no threads'}); the threads "
                            "this comparison computed with cannot be read: give another --out")  # fmt: skip
        earlier, source = {content["threads"]}, path.name
    else:
        records = [_json_object(record) for record in sorted(out.glob("cells/*/*/cell.json"))]
        earlier = {r["threads"] for r in records if isinstance(r, dict) and isinstance(r.get("threads"), int)}
        source = "its cells' cell.json"
    if earlier and earlier != {threads}:
        shown = ", ".join(map(str, sorted(earlier)))
        raise UserError(f"{out}: its cells computed with --threads {shown} ({source}), this command with --threads "
                        f"{threads}; the thread count changes the numbers, so the cells would not be comparable: give "
                        f"--threads {shown} to continue it, or another --out")  # fmt: skip


def _recorded(out: Path, cell: Cell) -> dict[str, Any] | str | None:
    """The record of ``cell`` in the comparison ``out``: None when it has none; a text saying what is wrong when its
    ``cell.json`` is damaged (not JSON, not an object, a key of `RECORD_KEYS` missing, metrics or split that are not
    objects): a record is a cache of its cell's run, so the cell runs again (a finished run is only read again).

    Raises:
        UserError: the record is of another cell (copied from another folder).
    """
    path = out / "cells" / cell.name / "cell.json"
    if not path.is_file():
        return None
    record = _json_object(path)
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
    return record


def _check_recorded_data(spec: CompareSpec, cell: Cell, record: Mapping[str, Any], out: Path,
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
            known[key] = data_fingerprint(spec.data, spec.domain, options, cell.seed)
        if known[key] != recorded:
            raise UserError(f"cell {cell.name}: the data changed since it was recorded (its data fingerprint in {path} "
                            "is not that of the data now); the comparison would mix two data sets: give the data it "
                            "ran on, or another --out")  # fmt: skip
    if record["split"] != {name: list(groups) for name, groups in cell.split.items()}:
        raise UserError(f"{path}: records another split than cell {cell.name} has (its data or its folds changed?); "
                        "remove it to run this cell again")  # fmt: skip
    return recorded is not None


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
        UserError: ``out`` holds no ``spec.json``, or no record of the cell ``cell_name``.
    """
    out = Path(out)
    if not (out / "spec.json").is_file():
        raise UserError(f"{out}: no spec.json; give the folder of a comparison (the --out of workbench compare)")
    spec = _read_spec(out / "spec.json")
    names = sorted(path.parent.relative_to(out / "cells").as_posix() for path in out.glob("cells/*/*/cell.json"))
    if cell_name not in names:
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise UserError(f"{out} has no recorded cell {cell_name!r} (METHOD/fold<k>-seed<s>; its cells: "
                        f"{shown or 'none yet'})")  # fmt: skip
    record = _json_object(out / "cells" / cell_name / "cell.json")
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
    batched = (record.get("seeds_side_by_side") or 1) > 1  # rerun alone: equal to rounding (`workbench.seed_batch`)

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


def _run_cells(
    spec: CompareSpec, cells: list[Cell], out: Path, parallel: tuple[int, int], executor: str, scheduler: str | None,
    quiet: bool, costs: tuple[bool, bool] = (False, True), side_by_side: bool = False,
) -> list[dict[str, Any]]:
    """Every cell's record, in the order of ``cells``: recorded ones read, the others run (``parallel``: workers,
    threads per cell; ``costs``: `run_cell`'s ``reports`` and ``share``; ``side_by_side``: the seeds of each method
    and fold together, `run_cells_together`)."""
    workers, threads = parallel
    records: dict[str, dict[str, Any]] = {}
    todo = []
    fingerprints: dict[tuple[int, str], str] = {}
    unchecked = 0
    for cell in cells:
        record = _recorded(out, cell)
        if isinstance(record, dict):
            unchecked += not _check_recorded_data(spec, cell, record, out, fingerprints)
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
    groups = _side_by_side_groups(todo) if side_by_side else [[cell] for cell in todo]
    with _executor(workers, executor, scheduler, quiet) as pool:
        if pool is None:
            previous = torch.get_num_threads()  # a cell sets this process's threads: give the caller's back
            try:
                for group in groups:
                    run = functools.partial(*_group_call(group, spec, str(out), threads, *costs))
                    records.update(_group_records(group, _checked(group[0], run)))
                    bar.update(len(group))
            finally:
                torch.set_num_threads(previous)
        else:
            futures = {pool.submit(*_group_call(group, spec, str(out), threads, *costs)): group for group in groups}
            for future in concurrent.futures.as_completed(futures):
                group = futures[future]
                records.update(_group_records(group, _checked(group[0], future.result)))
                bar.update(len(group))
    bar.close()
    return [records[cell.name] for cell in cells]


#: Most seeds one batched computation trains side by side (their data and splits are kept in `workbench.reuse`).
SIDE_BY_SIDE_SEEDS = 4


def _side_by_side_groups(cells: Sequence[Cell]) -> list[list[Cell]]:
    """``cells`` grouped by (fold, method) over their seeds, at most `SIDE_BY_SIDE_SEEDS` a group, in the order of
    each group's first cell."""
    groups: dict[tuple[str, int], list[list[Cell]]] = {}
    for cell in cells:
        chunks = groups.setdefault((cell.method, cell.fold), [[]])
        if len(chunks[-1]) == SIDE_BY_SIDE_SEEDS:
            chunks.append([])
        chunks[-1].append(cell)
    ordered = sorted((chunk for chunks in groups.values() for chunk in chunks),
                     key=lambda chunk: cells.index(chunk[0]))  # fmt: skip
    return ordered


def _group_call(group: Sequence[Cell], spec: CompareSpec, *arguments: Any) -> tuple:
    """(function, its arguments) that run ``group``: `run_cell` of one cell, `run_cells_together` of several."""
    if len(group) == 1:
        return (run_cell, spec, group[0], *arguments)
    return (run_cells_together, spec, group, *arguments)


def _group_records(group: Sequence[Cell], result: Any) -> dict[str, dict[str, Any]]:
    """Cell name -> record, from what `_group_call`'s function returned."""
    return dict(zip((cell.name for cell in group), [result] if len(group) == 1 else result))


def run_cells_together(
    spec: CompareSpec, cells: Sequence[Cell], out: str, threads: int | None, reports: bool, share: bool
) -> list[dict[str, Any]]:
    """`run_cell` of each of ``cells`` side by side (the seeds of one method and fold, `workbench.lockstep`: their
    training as one batched computation where the method allows it)."""
    meeting = lockstep.Lockstep([cell.name for cell in cells])
    done = meeting.run({cell.name: functools.partial(run_cell, spec, cell, out, threads, reports, share)
                        for cell in cells})  # fmt: skip
    return [done[cell.name] for cell in cells]


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
        from workbench.registry import install_command

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

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

A compare is resumable: cells with a record are kept, a cell whose run was interrupted resumes, and the same command
(same ``spec.json``) picks up where it stopped. Cells run one after another in this process, in local worker
processes, or on a Dask cluster (`distributed.Client`, whose executor has the same interface as the local one; the
output folder must then be on a file system every worker sees). The results are ``comparison.json`` and
``report.md`` (`workbench.comparison_report`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import multiprocessing
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from workbench.checkpoint import write_json
from workbench.config import resolve_config
from workbench.errors import UserError
from workbench.registry import methods, models, tasks
from workbench.rundir import claim_run_dir

#: Budget policies: the same for every method of a comparison.
BUDGETS = ("steps", "convergence")
#: Where cells run: this process / local worker processes, or a Dask cluster.
EXECUTORS = ("local", "dask")
#: Seeds below this are for development and tuning; reported numbers use seeds from here on.
FIRST_REPORTED_SEED = 100


def parse_label(label: str) -> tuple[str, str | None]:
    """(method, registered model or None) of a compared entry ``METHOD[@MODEL][:VARIANT]``: ``full@OTHER`` is full
    training of the registered model ``OTHER``; ``METHOD:VARIANT`` is ``METHOD`` with the options `CompareSpec.
    method_options` gives that label (a variant compared beside plain ``METHOD``)."""
    entry = label.split(":", 1)[0]
    method, _, model = entry.partition("@")
    return method, model or None


@dataclass(frozen=True)
class CompareSpec:
    """What a comparison runs: everything that determines its numbers (``spec.json``)."""

    domain: str
    #: Compared entries, ``METHOD[@MODEL][:VARIANT]`` (`parse_label`).
    methods: tuple[str, ...]
    #: The method every other is paired against (default: the first).
    reference: str = ""
    folds: int = 5
    seeds: tuple[int, ...] = (FIRST_REPORTED_SEED,)
    budget: str = "steps"
    #: Epochs of every method (``steps``) or their maximum (``convergence``); None: the task's.
    epochs: int | None = None
    #: Early-stopping patience under ``convergence`` (None: the task's); ``steps`` trains every epoch.
    patience: int | None = None
    train_size: int | None = None
    val_size: int | None = None
    batch_size: int | None = None
    #: One learning rate for every method (None: each method's own, or the task's).
    learning_rate: float | None = None
    #: Learning rates each method chooses from per cell on its validation loss (empty: no choice).
    lr_grid: tuple[float, ...] = ()
    #: Share of the non-test groups that validates (at least one group).
    val_share: float = 0.2
    #: Every method's learning-rate schedule, warm-up share and selection (`workbench.trainer.TrainSettings`).
    schedule: str = "plateau"
    warmup_share: float = 0.0
    select_on: str = "loss"
    data: str | None = None
    model: str | None = None
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
            if not re.fullmatch(r"[A-Za-z0-9_.+-]+(@[A-Za-z0-9_.+-]+)?(:[A-Za-z0-9_.+=-]+)?", label):
                raise UserError(f"--methods: {label!r} is not METHOD[@MODEL][:VARIANT] (letters, digits, _.+-)")
            method, model = parse_label(label)
            methods.get(method)
            if model is not None:
                models.get(model)
        if self.reference not in self.methods:
            raise UserError(f"--reference {self.reference} is not one of --methods {','.join(self.methods)}")
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
        """The spec a ``spec.json`` holds (fields added since it was written take their defaults)."""
        return cls(**{key: tuple(value) if isinstance(value, list) else value for key, value in content.items()})

    @property
    def development(self) -> bool:
        """Whether any seed is a development seed (below `FIRST_REPORTED_SEED`)."""
        return min(self.seeds) < FIRST_REPORTED_SEED


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


def run_cell(spec: CompareSpec, cell: Cell, out: str, threads: int | None = None) -> dict[str, Any]:
    """Run one cell (each rate of the grid, then keep the one with the best validation objective: the loss, or the
    metric of ``select_on``) and write its record
    ``<out>/cells/<method>/fold<k>-seed<s>/cell.json``; returns the record. Runs interrupted earlier resume."""
    folder = Path(out) / "cells" / cell.name
    done = folder / "cell.json"
    if done.is_file():
        return json.loads(done.read_text())
    rates = spec.lr_grid or (spec.learning_rate,)
    runs = {}
    with _quiet_logs():
        for rate in rates:
            run_dir = folder if len(rates) == 1 else folder / f"lr{rate:g}"
            runs[rate] = _cell_run(spec, cell, run_dir, rate, threads)
    chosen = min(runs, key=lambda rate: runs[rate]["best_objective"]) if len(rates) > 1 else rates[0]
    record = {
        "method": cell.method,
        "fold": cell.fold,
        "seed": cell.seed,
        "split": {name: list(groups) for name, groups in cell.split.items()},
        "run": str(Path("cells") / cell.name / ("" if len(rates) == 1 else f"lr{chosen:g}")).rstrip("/"),
        **runs[chosen],
        "lr_grid": {f"{rate:g}": runs[rate]["best_objective"] for rate in rates} if len(rates) > 1 else {},
    }
    write_json(done, record)
    return record


def cell_request(spec: CompareSpec, cell: Cell, run_dir: Path, rate: float | None, threads: int | None) -> Any:
    """The `workbench.config.RunRequest` of one run of a cell: the method alone (no baselines) on the cell's split,
    with the comparison's budget."""
    from workbench.config import RunRequest
    from workbench.trainer import TrainSettings

    epochs = spec.epochs if spec.epochs is not None else tasks.get(spec.domain).defaults.get(
        "epochs", TrainSettings.epochs)  # fmt: skip
    method, model = parse_label(cell.method)
    return RunRequest(
        domain=spec.domain,
        method=method,
        baselines=(),
        data=spec.data,
        model=model or spec.model,
        out=str(run_dir),
        epochs=epochs,
        train_size=spec.train_size,
        val_size=spec.val_size,
        batch_size=spec.batch_size,
        patience=epochs if spec.budget == "steps" else spec.patience,
        learning_rate=rate,
        seed=cell.seed,
        threads=threads,
        task_options=dict(spec.task_options),
        method_options=dict(spec.method_options.get(cell.method, {})),
        split=cell.split,
        schedule=spec.schedule,
        warmup_share=spec.warmup_share,
        select_on=spec.select_on,
    )


def _cell_run(spec: CompareSpec, cell: Cell, run_dir: Path, rate: float | None, threads: int | None) -> dict:
    """One run of a cell at learning rate ``rate``: its test metrics and costs, from its ``metrics.json``."""
    from workbench.run import run_request

    request = cell_request(spec, cell, run_dir, rate, threads)
    run = run_request(request, resume=(run_dir / "config.yaml").is_file(), quiet=True)
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
        "trainable_parameters": result.get("trainable_parameters"),
        "train_seconds": result.get("train_seconds"),
        "peak_memory_bytes": result.get("peak_memory_bytes"),
        "training_step_bytes": result.get("training_step_bytes"),
        "test_samples": run.metrics["samples"]["test"],
        "threads": run.config.threads,
    }


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """The runs of a cell log into their own ``log.txt`` only (the console shows the comparison's progress)."""
    logger = logging.getLogger("workbench")
    propagate = logger.propagate
    logger.propagate = False
    try:
        yield
    finally:
        logger.propagate = propagate


def compare(
    spec: CompareSpec,
    out: str | Path,
    *,
    workers: int = 1,
    threads: int = 1,
    executor: str = "local",
    scheduler: str | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run every cell of ``spec`` not yet recorded in ``out``, then write ``comparison.json`` and ``report.md``.

    ``workers``: cells at a time (1: in this process); ``threads``: CPU threads of each cell (fixed, never chosen
    from the machine's load, so that executors and reruns agree bit for bit; more cores are better used by more
    workers than by more threads per cell on small models); ``executor`` "dask" runs them on the Dask cluster at
    ``scheduler`` (an address such as ``tcp://host:8786``), or on a local Dask cluster of ``workers`` processes when
    none is given. Returns the comparison (what ``comparison.json`` holds).
    """
    from workbench import comparison_report

    spec.check()
    if workers < 1 or threads < 1:
        raise UserError(f"--workers and --threads must be at least 1, got {workers} and {threads}")
    if executor not in EXECUTORS:
        raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    out = Path(out)
    resume = _check_spec(out, spec)
    cells, facts = plan_cells(spec, quiet)
    for cell in cells[: len(spec.methods)]:  # each method's settings, checked before anything is written
        for rate in spec.lr_grid or (spec.learning_rate,):
            resolve_config(cell_request(spec, cell, out, rate, None))
    with claim_run_dir(out, resume=resume):
        if not resume:
            write_json(out / "spec.json", spec.to_dict())
        records = _run_cells(spec, cells, out, (workers, threads), executor, scheduler, quiet)
        comparison = comparison_report.summarise(spec, facts, records)
        write_json(out / "comparison.json", comparison)
        comparison_report.write(comparison, out)
    if not quiet:
        print(comparison_report.console_table(comparison))
        print(f"comparison written to {out}")
    return comparison


def _check_spec(out: Path, spec: CompareSpec) -> bool:
    """Whether ``out`` holds this comparison already (to continue); a `UserError` when it holds another."""
    written = out / "spec.json"
    if not written.is_file():
        return False
    if CompareSpec.from_dict(json.loads(written.read_text())).to_dict() != spec.to_dict():
        raise UserError(
            f"{out} holds a comparison with other settings (its spec.json); give another --out, or the same "
            "settings to continue it"
        )
    return True


def _run_cells(
    spec: CompareSpec, cells: list[Cell], out: Path, parallel: tuple[int, int], executor: str, scheduler: str | None,
    quiet: bool,
) -> list[dict[str, Any]]:
    """Every cell's record, in the order of ``cells``: recorded ones read, the others run (``parallel``: workers,
    threads per cell)."""
    workers, threads = parallel
    records: dict[str, dict[str, Any]] = {}
    todo = []
    for cell in cells:
        done = out / "cells" / cell.name / "cell.json"
        if done.is_file():
            records[cell.name] = json.loads(done.read_text())
        else:
            todo.append(cell)
    bar = tqdm(total=len(cells), initial=len(records), desc="cells", unit="cell", disable=quiet)
    with _executor(workers, executor, scheduler) as pool:
        if pool is None:
            previous = torch.get_num_threads()  # a cell sets this process's threads: give the caller's back
            try:
                for cell in todo:
                    records[cell.name] = _checked(cell, lambda cell=cell: run_cell(spec, cell, str(out), threads))
                    bar.update(1)
            finally:
                torch.set_num_threads(previous)
        else:
            futures = {pool.submit(run_cell, spec, cell, str(out), threads): cell for cell in todo}
            for future in concurrent.futures.as_completed(futures):
                cell = futures[future]
                records[cell.name] = _checked(cell, future.result)
                bar.update(1)
    bar.close()
    return [records[cell.name] for cell in cells]


def _checked(cell: Cell, result: Any) -> dict[str, Any]:
    """``result()``, with a cell's `UserError` naming the cell (the finished cells stay recorded)."""
    try:
        return result()
    except UserError as error:
        raise UserError(f"cell {cell.name}: {error}") from None


@contextmanager
def _executor(workers: int, executor: str, scheduler: str | None) -> Iterator[concurrent.futures.Executor | None]:
    """None (cells in this process), local worker processes, or a Dask cluster's `concurrent.futures` executor."""
    if executor == "local":
        if workers == 1:
            yield None
            return
        context = multiprocessing.get_context("spawn")  # no forked torch state in the workers
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            yield pool
        return
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        from workbench.registry import install_command

        raise UserError(f"--executor dask needs Dask's distributed scheduler: {install_command('cluster')}") from None
    if scheduler is not None:
        with Client(scheduler) as client:
            yield client.get_executor(pure=False)
        return
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            yield client.get_executor(pure=False)

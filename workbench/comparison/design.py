"""The design of a ``workbench compare``: several methods on one task, on grouped folds and seeds, at equal budgets.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from workbench.comparison.statistics import MIN_UNITS
from workbench.core.config import MethodEntry
from workbench.core.errors import UserError
from workbench.core.options import renamed
from workbench.core.registry import methods, models, tasks
from workbench.core.settings import settings_for, with_settings

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


#: What a `CompareSpec.data` path holds where each seed reads its own dataset (``--data site-{seed}``).
SEED_FIELD = "{seed}"


#: `workbench.core.config.RunConfig` fields a cell's configuration hash leaves out: where the run wrote, and its CPU
#: threads (not part of the spec; recorded beside the hash as ``threads``, and kept by `rerun_cell`).
UNHASHED = ("out", "threads")


def entry_of(label: str) -> MethodEntry:
    """The `workbench.core.config.MethodEntry` of a compared label ``METHOD[@MODEL][:VARIANT]``: ``full@OTHER`` is full
    training of the registered model ``OTHER``; ``METHOD:VARIANT`` is ``METHOD`` with the options `CompareSpec.
    method_options` gives that label (a variant compared beside plain ``METHOD``)."""
    try:
        return MethodEntry.parse(label)
    except UserError as error:
        raise UserError(f"--methods: {error}") from None


@with_settings("compare")
class CompareSpec:
    """What a comparison runs: everything that determines its numbers (``spec.json``): its own fields, then the run
    settings ``compare`` takes (`workbench.core.settings.settings_for`: data, model, epochs, sizes, patience under
    ``convergence``, one learning rate, schedule, selection), handed to every cell's run."""

    domain: str
    #: Compared entries, ``METHOD[@MODEL][:VARIANT]`` (`workbench.core.config.MethodEntry`).
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
        defaults = {option.name: option.default for option in task_cls.options}
        asked = methods_task_options(self.domain, self.methods, self.task_options)
        left = {name: value for name, value in asked.items() if value != defaults[name]}
        if left:
            flags = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in left.items())
            raise UserError(f"--methods {','.join(self.methods)}: a method's setting runs task '{self.domain}' with "
                            f"{flags}, the plan with the task's default; give {flags} so that every cell reads the "
                            "same data")  # fmt: skip
        if self.data and SEED_FIELD in self.data:
            missing = [f"{seed}: {path}" for seed in self.seeds if not Path(path := self.data_for(seed)).exists()]
            if missing:
                raise UserError(f"--data {self.data}: no data for seed(s) {'; '.join(missing)} (a path holding "
                                f"{SEED_FIELD} names one dataset per seed)")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        content = dataclasses.asdict(self)
        return json.loads(json.dumps(content))  # tuples as lists, as spec.json holds them

    @classmethod
    def from_dict(cls, content: Mapping[str, Any]) -> "CompareSpec":
        """The spec a ``spec.json`` holds (fields added since it was written take their defaults; a setting renamed
        since, its current name)."""
        content = renamed("spec.json", settings_for("compare"), content)
        return cls(**{key: tuple(value) if isinstance(value, list) else value for key, value in content.items()})

    def data_for(self, seed: int) -> str | None:
        """The data seed ``seed``'s cells read: `data` with ``{seed}`` replaced by the seed (one dataset per seed, so
        the units cover new data, not only new partitions of one dataset), else `data` itself."""
        return self.data.replace(SEED_FIELD, str(seed)) if self.data and SEED_FIELD in self.data else self.data

    @property
    def development(self) -> bool:
        """Whether any seed is a development seed (below `DEVELOPMENT_SEEDS_BELOW`)."""
        return min(self.seeds) < DEVELOPMENT_SEEDS_BELOW


def methods_task_options(domain: str, labels: Sequence[str], given: Mapping[str, Any]) -> dict[str, Any]:
    """The task options the settings of the compared entries ``labels`` ask for (`workbench.core.task.Task.profile`,
    such as the covariate-shift problem of the density-ratio methods) that ``given`` leaves open. Every cell of a
    comparison reads the same data, so the entries must agree.

    Raises:
        UserError: two entries ask for different values of one option (naming the flag that chooses).
    """
    task_cls = tasks.get(domain)
    wanted: dict[str, tuple[Any, str]] = {}
    for label in labels:
        for name, value in task_cls.profile(entry_of(label).method).get("options", {}).items():
            if name in given:
                continue
            if name in wanted and wanted[name][0] != value:
                flag = "--" + name.replace("_", "-")
                first, value_first = wanted[name][1], wanted[name][0]
                raise UserError(f"--methods: {first} runs task '{domain}' with {flag} {value_first}, {label} with "
                                f"{flag} {value}; every cell reads the same data: give {flag}")  # fmt: skip
            wanted.setdefault(name, (value, label))
    return {name: value for name, (value, _) in wanted.items()}


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
    groups (their kind and count per seed) and the data for the report (``fixed_data``: `fixed_data`)."""

    task = tasks.get(spec.domain)(**spec.task_options)
    task.progress = not quiet
    cells, counts = [], {}
    for seed in spec.seeds:
        groups = task.split_groups(task.read(spec.data_for(seed), seed))
        counts[str(seed)] = len(set(groups))
        for fold, split in enumerate(fold_splits(groups, spec.folds, seed, spec.val_share)):
            cells += [Cell(method, fold, seed, split) for method in spec.methods]
    facts = {
        "group_kind": task.group_kind,
        "groups_per_seed": counts,
        "metrics": list(task.metrics),
        "lower_is_better": sorted(task.lower_is_better),
        "metrics_note": task.metrics_note,
        "fixed_data": fixed_data(spec),
    }
    return cells, facts


def fixed_data(spec: CompareSpec) -> bool:
    """Whether every seed of ``spec`` reads the same data (`workbench.run.fingerprint.data_source`: one file or folder,
    or one generator setting that ignores the seed; not a path holding `SEED_FIELD`): its seeds only re-partition and
    retrain on one dataset, so its intervals are conditional on that dataset."""
    from workbench.run.fingerprint import data_source

    sources = {str(data_source(spec.data_for(seed), spec.domain, spec.task_options, seed)) for seed in spec.seeds}
    return len(sources) == 1


def cell_request(spec: CompareSpec, cell: Cell, run_dir: Path, rate: float | None, threads: int | None) -> Any:
    """The `workbench.core.config.RunRequest` of one run of a cell: the method alone (no baselines) on the cell's split,
    with the comparison's budget."""
    from workbench.core.config import RunRequest
    from workbench.core.trainer import TrainSettings

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
        "data": spec.data_for(cell.seed),
        "threads": threads,
        "task_options": dict(spec.task_options),
        "method_options": dict(spec.method_options.get(cell.method, {})),
        "split": cell.split,
    })


#: How messages name a `CompareSpec` field whose flag is not its name.
SPEC_FLAGS = {
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


def json_object(path: Path) -> dict[str, Any] | str:
    """The JSON object in ``path``, or what is wrong with it in words (not UTF-8 or not JSON, say truncated; another
    JSON value, say null)."""
    try:
        content = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"not JSON: {error}"
    kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(content), "a number")
    return content if isinstance(content, dict) else f"{kind}, not a JSON object"


def read_spec(path: Path) -> CompareSpec:
    """The spec in a comparison's ``spec.json``; a `UserError` in one line when it is damaged."""
    content = json_object(path)
    if isinstance(content, str):
        raise UserError(f"{path}: damaged ({content}); what this comparison ran cannot be read: give another --out")
    try:
        return CompareSpec.from_dict(content)
    except (TypeError, ValueError) as error:
        raise UserError(f"{path}: not the spec of a comparison ({error}); give another --out") from None

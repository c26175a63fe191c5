"""The shape every task shares: a named adaptation problem that reads its data and scores models.

A task (in ``domains/<domain>/``) knows how to read its data (the real layout and the embedded
default), its splits, its loss and metrics, its default model (a name in the models registry) and method,
and its data card. The run (`workbench.run`) calls the hooks below in order; the core never looks inside the
samples. What a task offers beyond the required hooks that the engine uses it declares in ``capabilities``
(`CAPABILITIES`); what a method needs beyond these is a protocol beside the method (`workbench.core.method.Method.
needs_task`); methods that need what a task lacks are refused before the run directory appears.

Placement: the run loads the model (``load_model`` / ``rebuild``), casts it and places it on the run's device
(`workbench.core.device.place`) before any other hook sees it, so ``prepare``, ``refit``, ``evaluate``,
``predict_folder`` and the rest find the device from the model they are given (`workbench.core.device.device_of`) and
``collate`` is handed it; samples may stay on the host until ``collate``. A hook never assumes the CPU.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from workbench.core.errors import UserError
from workbench.core.options import Option, resolve_options
from workbench.core.paths import ALLOW_PATHS_OUTSIDE
from workbench.core.records import ON_BAD_RECORD, SkipReport
from workbench.core.registry import install_command, models

#: What a task may offer beyond the required hooks that the engine itself uses. What a method needs from a task
#: beyond these is a ``typing.Protocol`` in the method's package (`workbench.core.method.Method.needs_task`).
CAPABILITIES = {
    "target_pool": "unlabelled target samples (`TaskData.target`)",
    "predict": "batch prediction of a folder of inputs (`Task.predict_folder`, ``workbench predict``)",
    "folds": "grouped folds for ``workbench compare`` (`Task.split_groups`, `Task.hold_out`, `Task.group_kind`)",
}


@dataclass
class TaskData:
    """Samples ready for training and testing (whatever the task's ``collate`` accepts)."""

    train: Sequence[Any]
    val: Sequence[Any]
    test: Sequence[Any]
    source: str
    #: Facts about the data written to ``metrics.json`` as ``data_summary`` (counts, classes, the subjects of each
    #: split, ...); JSON-able. ``caveat``: a few words the console table's title carries (what makes its numbers
    #: optimistic, such as a random split of correlated samples).
    summary: dict[str, Any] = field(default_factory=dict)
    #: Unlabelled samples of the target domain, for methods that look at the target while training
    #: (sample weights, alignment terms); None for tasks whose training data already is the target.
    target: Sequence[Any] | None = None


@dataclass
class Predictions:
    """What ``workbench predict`` writes: one CSV row per input (``status`` "ok" or why not), and ``facts`` the
    task adds to the JSON record beside it (classes, thresholds, preprocessing)."""

    columns: list[str]
    rows: list[dict[str, Any]]
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Evaluation:
    """Metrics on one split and the raw predictions behind them (for plots, and for `Task.rescore`)."""

    metrics: dict[str, float]
    predictions: dict[str, np.ndarray]
    #: The group of each scored item, shape (n_items,), in the item order `Task.rescore` uses: items of one group
    #: (a patient's records, a subject's windows) are resampled together (`workbench.run.item_bootstrap`); every item
    #: its own group where items are independent. None: the task cannot rescore these predictions.
    groups: np.ndarray | None = None


def to_device(array: Any, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``array`` (numpy or tensor) as a tensor on ``device``: on a GPU through pinned (page-locked) memory and a
    non-blocking copy, which overlaps the work already queued; elsewhere a plain conversion."""
    tensor = torch.as_tensor(array, dtype=dtype)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def held_out_groups(groups: Sequence[str], split: Mapping[str, Sequence[str]], where: str, kind: str) -> dict[
    str, list[str]]:  # fmt: skip
    """``{"train", "val", "test"}`` group lists for `Task.hold_out`: ``split``'s test and validation groups, checked
    against ``groups`` (the data's), and every other group for training.

    Raises:
        UserError: (naming ``where``, the data) a group the data do not have, a group in two splits, no test group,
        or no group left to train on.
    """
    available = sorted({str(group) for group in groups})
    known = set(available)
    parts = {name: sorted({str(group) for group in split.get(name, ())}) for name in ("val", "test")}
    for name, part in parts.items():
        unknown = [group for group in part if group not in known]
        if unknown:
            shown = ", ".join(available[:8]) + (", ..." if len(available) > 8 else "")
            raise UserError(
                f"{where}: the {name} {kind}(s) {', '.join(unknown[:5])} of the split are not in the data "
                f"({len(available)} {kind}s: {shown})"
            )
    both = set(parts["val"]) & set(parts["test"])
    if both:
        raise UserError(f"{where}: {kind}(s) {', '.join(sorted(both))} are in both the validation and the test split")
    if not parts["test"]:
        raise UserError(f"{where}: the split holds out no test {kind}")
    train = [group for group in available if group not in set(parts["val"]) | set(parts["test"])]
    if not train:
        raise UserError(f"{where}: the split holds out every {kind}; none is left to train on")
    return {"train": train, **parts}


class Task:
    """Base class of tasks; subclasses set the class attributes and implement the hooks."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: Data card of the embedded default data (``data_cards/<card>.yaml``).
    card: ClassVar[str]
    #: Cards of the published datasets the task also reads from a user's path.
    reads: ClassVar[tuple[str, ...]] = ()
    #: The registered model (in `workbench.core.registry.models`) adapted when the user names none.
    default_model: ClassVar[str]
    default_method: ClassVar[str]
    #: What the task offers beyond the required hooks (keys of `CAPABILITIES`).
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: Methods run beside the chosen one in the same run.
    baselines: ClassVar[tuple[str, ...]] = ()
    #: Metric names, in the order the report shows them; the first is the headline.
    metrics: ClassVar[tuple[str, ...]]
    #: Metrics of which lower is better (errors); every other metric is better higher.
    lower_is_better: ClassVar[frozenset[str]] = frozenset()
    #: What a fold of ``workbench compare`` holds out whole ("subject", "patient", "trajectory block", ...); tasks
    #: declaring the ``folds`` capability set it and implement `split_groups` and `hold_out`.
    group_kind: ClassVar[str] = ""
    #: What one test item is ("record", "window", "frame", ...): the unit `rescore` resamples (report titles).
    item_kind: ClassVar[str] = "sample"
    #: The sentence under the report's table saying what the numbers are.
    metrics_note: ClassVar[str] = "Errors are on the test split; lower is better."
    #: Training defaults of this task (`workbench.core.trainer.TrainSettings` fields and ``train_size``).
    defaults: ClassVar[Mapping[str, Any]] = {}
    #: The task's options; every task also takes ``on_bad_record`` (`workbench.core.records.ON_BAD_RECORD`) and
    #: ``allow_paths_outside`` (`workbench.core.paths.ALLOW_PATHS_OUTSIDE`), put first by ``__init_subclass__``.
    options: ClassVar[tuple[Option, ...]] = (ON_BAD_RECORD, ALLOW_PATHS_OUTSIDE)
    #: ``--precision`` values the task's models train in; the first is the default. "float64" / "float32": the
    #: model and its samples in that dtype (`prepare` makes samples in the model's dtype); "bf16" / "fp16": float32
    #: weights, training steps under ``torch.autocast`` (fp16 with loss scaling).
    precisions: ClassVar[tuple[str, ...]] = ("float32",)
    #: Import names of the packages the task needs at run time, and the extra that installs them.
    requires: ClassVar[tuple[str, ...]] = ()
    extra: ClassVar[str | None] = None
    #: Command lines shown by ``workbench --help`` (what a user of this task types first).
    examples: ClassVar[tuple[str, ...]] = ()
    #: The stages ``workbench pretrain --stage`` offers (passed to `pretrain` as ``stage``; the first is its
    #: default); empty for a task that pretrains in one go.
    pretrain_stages: ClassVar[tuple[str, ...]] = ()
    #: Options of ``workbench data generate`` (the keyword arguments of `generate` besides ``out`` and ``seed``).
    generate_options: ClassVar[tuple[Option, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        cls.options = (ON_BAD_RECORD, ALLOW_PATHS_OUTSIDE, *(o for o in cls.options if o not in Task.options))

    def __init__(self, **options: Any):
        missing = [name for name in self.requires if importlib.util.find_spec(name) is None]
        if missing:
            raise UserError(
                f"task '{self.name}' needs {', '.join(missing)}, which is not installed: {install_command(self.extra)}"
            )
        self.config = resolve_options(f"task '{self.name}'", self.options, options)
        #: The records the last `read` or `info` skipped (``self.config["on_bad_record"] == "skip"``) and how many it
        #: looked at; tasks fill it, the engine reports it (console, table, ``metrics.json``, ``report.md``, ``data
        #: check``).
        self.skipped = SkipReport()
        #: Whether the task's long loops (reading a large data set) show a progress bar (off with ``--quiet``).
        self.progress = True

    @classmethod
    def profile(cls, method: str) -> dict[str, Any]:
        """Defaults that depend on the chosen method: ``{"baselines": (...), "options": {...}, "method_options":
        {...}}`` (task options, and the chosen method's options in this task's setting).

        A task whose methods answer different questions (sample weights for a missing class vs for a
        covariate shift) picks the matching generated problem and comparison here; what the user gives
        explicitly always wins.
        """
        return {}

    # -- data and model --------------------------------------------------------------------------
    def read(self, data: str | Path | None, seed: int) -> Any:
        """Read and check the labelled data (the embedded default when ``data`` is None).

        A bad record is skipped into ``self.skipped`` (with a warning naming the file and the reason) or raised as a
        `workbench.core.records.BadRecordError`, as ``self.config["on_bad_record"]`` says.

        Returns a task-specific object with a ``source`` attribute (a path or a description).
        """
        raise NotImplementedError

    def default_data(self, seed: int) -> Path | str:
        """What `read` reads when given no data, for the data fingerprint of a run and a compared cell (`workbench.
        fingerprint.data_fingerprint`): the file or folder of the embedded data, or for generated data a text naming
        the generator, its options and ``seed`` (this default: the task, its options and ``seed``)."""
        options = ", ".join(f"{name}={value!r}" for name, value in sorted(self.config.items()))
        return f"the generator of task '{self.name}' ({options}, seed={seed})"

    def split_groups(self, raw: Any) -> list[str]:
        """The groups of ``raw`` (as returned by `read`) that a fold holds out whole, sorted: every labelled sample
        belongs to exactly one (tasks with the ``folds`` capability)."""
        raise UserError(f"task '{self.name}' has no grouped folds")

    def hold_out(self, raw: Any, split: Mapping[str, Sequence[str]]) -> Any:
        """``raw`` re-split: the groups ``split["test"]`` are its test split, ``split["val"]`` its validation split
        and every other group of `split_groups` trains (a task whose validation cannot come from the held-out groups,
        such as one that never sees target labels in training, says so in its docstring).

        Raises:
            UserError: a group not in ``raw``, a group in two splits, or an empty split.
        """
        raise UserError(f"task '{self.name}' has no grouped folds")

    def model_choice(self, source: str | Path | None) -> tuple[str, str | None]:
        """(registered model name, checkpoint path or None) of ``--model``: None is the task's default model, a
        registered name that model (its shipped checkpoint, or built fresh; a name whose plug-in cannot load is
        refused by `workbench.core.registry.Registry.get` with the extra to install), anything else a checkpoint path
        read by the task's default model family."""
        if source is None:
            return self.default_model, None
        if str(source) in models.declared():
            return str(source), None
        return self.default_model, str(source)

    def model_sizes(self) -> dict[str, Any]:
        """Sizes the data fixes (``in_features``, ``n_classes``, ...), handed to `workbench.core.model.ModelFamily.load`
        (after `read`)."""
        return {}

    def load_model(self, source: str | Path | None, trust_checkpoint: bool = False) -> nn.Module:
        """The model to adapt, through the models registry (``source``: see `model_choice`)."""
        name, path = self.model_choice(source)
        return models.get(name)().load(path, trust_checkpoint=trust_checkpoint, **self.model_sizes())

    def prepare(
        self, model: nn.Module, raw: Any, train_size: int, val_size: int, seed: int
    ) -> tuple[TaskData, dict[str, Any]]:
        """Fit the model's data-dependent constants (returned as a JSON-able task state) and make samples."""
        raise NotImplementedError

    def refit(self, model: nn.Module, data: TaskData) -> dict[str, Any] | None:
        """After training: re-fit data-dependent constants on the training samples; the new task state
        (None: unchanged)."""
        return None

    def test_samples(self, model: nn.Module, raw: Any) -> Sequence[Any]:
        """Samples of the test split of ``raw`` (as returned by ``read``) for ``model``."""
        raise NotImplementedError

    def restore(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        """Put a task state returned by ``prepare`` back into a freshly loaded model."""
        raise NotImplementedError

    def use_run_state(self, state: Mapping[str, Any]) -> None:
        """Before reading inputs for a finished run's model, adopt what the run's task state (``adapter.json``) says
        about making model inputs from files (its preprocessing). `workbench.run.evaluating.evaluate` (before `read`)
        and `workbench.run.predicting.predict` (before `predict_folder`) both call it: one code path, so both score
        inputs made as the run made them. Default: nothing (the task options in the run's ``config.yaml`` say it
        all)."""

    def rebuild(self, source: str | Path | None, trust_checkpoint: bool, state: Mapping[str, Any]) -> nn.Module:
        """The base model of a finished run: ``load_model`` then ``restore`` (tasks whose model shape depends
        on the data build it from ``state`` instead)."""
        model = self.load_model(source, trust_checkpoint)
        self.restore(model, state)
        return model

    # -- training and scoring --------------------------------------------------------------------
    def collate(self, samples: Sequence[Any], device: torch.device) -> Any:
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        raise NotImplementedError

    def evaluate(self, model: nn.Module, samples: Sequence[Any], device: torch.device) -> Evaluation:
        raise NotImplementedError

    def rescore(self, predictions: Mapping[str, np.ndarray], counts: np.ndarray) -> dict[str, np.ndarray]:
        """`evaluate`'s metrics of the test items on resamples of them (`workbench.run.item_bootstrap`), from the
        predictions `evaluate` returned: a resample draws item ``i`` ``counts[r, i]`` times (the item order of
        `Evaluation.groups`). Counts of ones reproduce `evaluate`'s metrics; metrics not of the test items (a
        source-domain score, a method's diagnostics) are left out. Vectorised over resamples
        (`workbench.core.resampled_metrics`).

        Shapes: counts (n_resamples, n_items) → {metric: (n_resamples,) float64, NaN where a resample does not
        define it}.
        """
        raise NotImplementedError(f"task '{self.name}' does not rescore resamples of its test items")

    def figures(self, evaluations: Mapping[str, Evaluation], out_dir: Path) -> list[tuple[str, str]]:
        """Write the domain's plots into ``out_dir``; returns (caption, file name) pairs."""
        return []

    # -- batch prediction (``workbench predict``) ---------------------------------------------------
    def predict_folder(self, model: nn.Module, folder: Path, state: Mapping[str, Any]) -> "Predictions":
        """Score every input file of ``folder`` with a run's merged ``model`` and its task ``state``.

        A bad input gets a row whose ``status`` says why, the others go on. Tasks offering it declare ``predict``.
        """
        raise UserError(f"task '{self.name}' has no batch prediction")

    def model_files(self, source: str | Path | None) -> list[Path]:
        """The files of the base model ``source`` (the task's default when None), hashed in prediction records."""
        name, path = self.model_choice(source)
        return models.get(name)().files(path)

    # -- data commands ---------------------------------------------------------------------------
    def info(self, data: str | Path | None) -> str:
        """A human-readable description of the data (``workbench data info`` and ``data check``), after opening
        every file a run would read; bad records go into ``self.skipped`` as in `read`."""
        raise NotImplementedError

    def generate(self, out: Path, seed: int | None = None, **options: Any) -> str:
        """Generate data with real simulators into ``out`` (``workbench data generate``); ``options`` are the
        task's ``generate_options``."""
        raise UserError(f"task '{self.name}' has no data generator")

    def pretrain(self, out: Path, **kwargs: Any) -> str:
        """Train the task's shipped foundation model from scratch (``workbench pretrain``)."""
        raise UserError(f"task '{self.name}' has no pretraining recipe")

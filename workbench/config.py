"""A run's configuration: what the user asked for (`RunRequest`), resolved against the task's defaults
(`RunConfig`) by a pure function.

`RunRequest` is the one list of run parameters: the CLI builds its ``adapt`` flags from its fields, and
`workbench.adapt` takes them as keyword arguments. `resolve_config` never changes what the user asked for: it fills
in what they left out (and says which default it took in the resolved ``config.yaml``), stops with a `UserError` on
what cannot be done, and returns warnings for what it will do but the user may not expect.

A baseline is a method name, or ``METHOD@MODEL`` for a method run on another registered model of the same task
(``full@OTHER``: full training of the registered model ``OTHER`` beside the task's default model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Mapping, Sequence

import torch

from workbench.errors import UserError
from workbench.options import resolve_options
from workbench.registry import methods, models, tasks
from workbench.trainer import SCHEDULES, TrainSettings

#: ``--precision`` values: "auto" is the task's first (`workbench.task.Task.precisions`).
PRECISIONS = ("auto", "float64", "float32", "bf16", "fp16")


def _parameter(help: str, flag: str | None = None, **argparse: Any) -> dict[str, Any]:
    return {"help": help, "flag": flag, "argparse": argparse}


@dataclass(frozen=True)
class RunRequest:
    """What the user asks of a run; None leaves the choice to the task (and says so in ``config.yaml``)."""

    domain: str = field(metadata=_parameter("task name (see `workbench list`)", required=True))
    method: str | None = field(default=None, metadata=_parameter("adaptation method (default: the task's)"))
    baselines: tuple[str, ...] | None = field(
        default=None,
        metadata=_parameter(
            "comma-separated methods run beside it, METHOD or METHOD@MODEL (default: the task's); '' for none",
            type=lambda text: tuple(name for name in text.split(",") if name),
        ),
    )
    data: str | None = field(default=None, metadata=_parameter("your data (default: the task's embedded data)"))
    model: str | None = field(
        default=None,
        metadata=_parameter("a registered model (`workbench list`) or a checkpoint file (default: the task's model)"),
    )
    trust_checkpoint: bool = field(
        default=False, metadata=_parameter("allow loading a checkpoint that is a full pickle (it can run code)")
    )
    out: str | None = field(default=None, metadata=_parameter("run directory (default: runs/<task>-<method>-<time>)"))
    epochs: int | None = field(
        default=None, metadata=_parameter("maximum epochs (early stopping on validation may end sooner)", type=int)
    )
    train_size: int | None = field(
        default=None, metadata=_parameter("training samples of the training split", type=int)
    )
    val_size: int | None = field(
        default=None, metadata=_parameter("validation samples (default: the task's or max(10, train-size/5))", type=int)
    )
    batch_size: int | None = field(
        default=None, metadata=_parameter("samples per step (per process under torchrun)", type=int)
    )
    patience: int | None = field(
        default=None, metadata=_parameter("epochs without validation improvement before stopping", type=int)
    )
    schedule: str = field(
        default="plateau",
        metadata=_parameter(
            "learning-rate schedule: plateau (halve after epochs without improvement) or linear (warm-up, then "
            "linear decay to 0 at the last epoch's last step)",
            choices=list(SCHEDULES),
        ),
    )
    warmup_share: float = field(
        default=0.0, metadata=_parameter("share of all steps that warm up under --schedule linear", type=float)
    )
    select_on: str = field(
        default="loss",
        metadata=_parameter(
            "what chooses the best epoch and stops early: loss (validation loss) or a metric of the task, scored "
            "on the validation samples after every epoch (`workbench list` shows each task's metrics)"
        ),
    )
    ema_decay: float = field(
        default=0.99,
        metadata=_parameter(
            "moving average of the trained weights, used for validation and the result (0: off)", type=float
        ),
    )
    learning_rate: float | None = field(
        default=None,
        metadata=_parameter("learning rate (default: the task's, else each method's own)", "--lr", type=float),
    )
    seed: int = field(default=0, metadata=_parameter("seeds data selection, initialisation and shuffling", type=int))
    device: str = field(default="auto", metadata=_parameter("where to train", choices=["auto", "cpu", "cuda"]))
    precision: str = field(
        default="auto",
        metadata=_parameter(
            "float64 / float32: weights and samples in that type; bf16 / fp16: float32 weights, mixed-precision "
            "(autocast) training steps (default: the task's first; `workbench list` shows each task's)",
            choices=list(PRECISIONS),
        ),
    )
    threads: int | None = field(
        default=None,
        metadata=_parameter(
            "CPU threads to compute with, pinned (default: the CPUs this process may use less those other processes "
            "keep busy, re-chosen before every epoch as that load changes; give it for runs comparable bit for bit)",
            type=int,
        ),
    )
    task_options: Mapping[str, Any] = field(default_factory=dict, metadata={"cli": False})
    method_options: Mapping[str, Any] = field(default_factory=dict, metadata={"cli": False})
    #: The task's own split replaced by held-out groups ({"val": [...], "test": [...]}, `workbench.task.Task.
    #: hold_out`); what ``workbench compare`` gives each fold.
    split: Mapping[str, Sequence[str]] | None = field(default=None, metadata={"cli": False})

    @classmethod
    def parameters(cls) -> list[Any]:
        """The fields the command line offers as flags (all but the plug-in options)."""
        return [f for f in fields(cls) if f.metadata.get("cli", True)]


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's numbers (plus where it writes them): a `RunRequest` resolved."""

    task: str
    method: str
    baselines: tuple[MethodEntry, ...]
    data: str | None
    model: str | None
    trust_checkpoint: bool
    out: str
    epochs: int
    train_size: int
    val_size: int
    batch_size: int
    #: Epochs without a better validation objective (``select_on``) before a method's training stops.
    patience: int
    #: Decay of the moving average of the trained weights (0: no averaging).
    ema_decay: float
    #: None: each method's own default learning rate (unless the task sets one for all its methods).
    learning_rate: float | None
    seed: int
    device: str
    task_options: dict[str, Any] = field(default_factory=dict)
    method_options: dict[str, Any] = field(default_factory=dict)
    #: One of `PRECISIONS` less "auto" (resolved when read from runs written before it existed: the task's first).
    precision: str = "auto"
    #: CPU threads the run computes with when pinned (``--threads``, ``OMP_NUM_THREADS``); None: following the load,
    #: each epoch's count in the methods' histories (`workbench.threads`). Older runs: the count chosen at start (kept
    #: pinned by --resume), or 0 (runs older still).
    threads: int | None = None
    #: Held-out groups replacing the task's split (`RunRequest.split`); None: the task's own split.
    split: dict[str, list[str]] | None = None
    #: `workbench.trainer.TrainSettings.schedule`, ``warmup_share`` and ``select_on`` (defaults: runs written before).
    schedule: str = "plateau"
    warmup_share: float = 0.0
    select_on: str = "loss"

    def to_dict(self) -> dict[str, Any]:
        content = dataclasses.asdict(self)
        content["baselines"] = [str(entry) for entry in self.baselines]
        return content

    @classmethod
    def from_dict(cls, content: dict[str, Any]) -> "RunConfig":
        precision = content.get("precision", "auto")
        if precision == "auto":
            precision = tasks.get(content["task"]).precisions[0]
        baselines = tuple(MethodEntry.parse(entry) for entry in content["baselines"])
        return cls(**{**content, "baselines": baselines, "precision": precision})

    def entries(self) -> list[MethodEntry]:
        """The chosen method, then the baselines: the order a run trains them in."""
        return [MethodEntry(self.method), *self.baselines]


@dataclass(frozen=True)
class MethodEntry:
    """One method of a run: ``METHOD``, or ``METHOD@MODEL`` for a baseline run on another registered model of the
    task (``full@OTHER``: full training of the model ``OTHER`` beside the task's default model)."""

    method: str
    #: A registered model's name; None for the run's own model.
    model: str | None = None

    @classmethod
    def parse(cls, text: str) -> "MethodEntry":
        """``"full@OTHER"`` → ``MethodEntry("full", "OTHER")``; ``"full"`` → ``MethodEntry("full")``."""
        method, _, model = text.partition("@")
        return cls(method, model or None)

    def __str__(self) -> str:
        return self.method if self.model is None else f"{self.method}@{self.model}"


def resolve_config(request: RunRequest, now: datetime | None = None) -> tuple[RunConfig, list[str]]:
    """Fill the task's defaults into the user's choices; returns the frozen config and warnings."""
    domain = request.domain
    task_cls = tasks.get(domain)
    method = request.method or task_cls.default_method
    if "@" in method:
        raise UserError(f"--method {method}: choose the model with --model; METHOD@MODEL is for --baselines")
    method_cls = methods.get(method)
    profile = task_cls.profile(method)
    baselines, warnings = _baselines(request, task_cls, profile, method)
    sizes = _sizes(request, task_cls.defaults)
    ema_decay = request.ema_decay
    if not 0 <= ema_decay < 1:
        raise UserError(f"--ema-decay must be in [0, 1) (0 turns averaging off), got {ema_decay}")
    learning_rate = task_cls.defaults.get("learning_rate") if request.learning_rate is None else request.learning_rate
    if learning_rate is not None and learning_rate <= 0:
        raise UserError(f"--lr must be positive, got {learning_rate}")
    precision = task_cls.precisions[0] if request.precision == "auto" else request.precision
    if precision not in task_cls.precisions:
        raise UserError(
            f"--precision {precision}: task '{domain}' trains in {', '.join(task_cls.precisions)} "
            f"(bad value or not offered by this task's models)"
        )
    _check_schedule(request, task_cls)
    task_options = {**profile.get("options", {}), **dict(request.task_options)}
    task_options = resolve_options(f"task '{domain}'", task_cls.options, task_options)
    method_options = {**profile.get("method_options", {}), **dict(request.method_options)}
    method_options = resolve_options(f"method '{method}'", method_cls.options, method_options)
    method_cls(**method_options)  # a method checks its options when built: fail before anything is written
    out = request.out or f"runs/{domain}-{method}-{(now or datetime.now()).strftime('%Y%m%d-%H%M%S')}"
    config = RunConfig(
        task=domain,
        method=method,
        baselines=baselines,
        data=None if request.data is None else str(request.data),
        model=None if request.model is None else str(request.model),
        trust_checkpoint=request.trust_checkpoint,
        out=str(out),
        **sizes,
        ema_decay=ema_decay,
        learning_rate=learning_rate,
        seed=request.seed,
        device=_device(request.device),
        task_options=task_options,
        method_options=method_options,
        precision=precision,
        threads=request.threads,
        split=_split(request.split, task_cls),
        schedule=request.schedule,
        warmup_share=request.warmup_share,
        select_on=request.select_on,
    )
    return config, warnings


def _check_schedule(request: RunRequest, task_cls: Any) -> None:
    """A `UserError` for a schedule, warm-up share or selection the trainer cannot follow."""
    if request.schedule not in SCHEDULES:
        raise UserError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {request.schedule!r}")
    if not 0 <= request.warmup_share < 1:
        raise UserError(f"--warmup-share must be in [0, 1), got {request.warmup_share}")
    if request.warmup_share and request.schedule != "linear":
        raise UserError(f"--warmup-share {request.warmup_share} needs --schedule linear")
    if request.select_on not in ("loss", *task_cls.metrics):
        raise UserError(
            f"--select-on {request.select_on}: task '{request.domain}' selects on loss or one of its metrics "
            f"({', '.join(task_cls.metrics)})"
        )


def _baselines(request: RunRequest, task_cls: Any, profile: Mapping[str, Any], method: str) -> tuple[
    tuple[MethodEntry, ...], list[str]]:  # fmt: skip
    """The baselines asked for (else the task's for ``method``), each a registered method on a registered model;
    the chosen method among them is dropped, with a warning."""
    texts = profile.get("baselines", task_cls.baselines) if request.baselines is None else request.baselines
    baselines = tuple(MethodEntry.parse(text) for text in texts)
    for entry in baselines:
        methods.get(entry.method)
        if entry.model is not None:
            models.get(entry.model)
    if MethodEntry(method) not in baselines:
        return baselines, []
    warning = f"'{method}' is the chosen method and a baseline: it runs once, as the chosen method"
    return tuple(entry for entry in baselines if entry != MethodEntry(method)), [warning]


def _sizes(request: RunRequest, defaults: Mapping[str, Any]) -> dict[str, int]:
    """Epochs, sample counts, batch size and patience: the user's, else the task's, else `TrainSettings`'."""

    def chosen(name: str, fallback: int) -> int:
        given = getattr(request, name)
        return defaults.get(name, fallback) if given is None else given

    train_size = chosen("train_size", 100)
    sizes = {
        "epochs": chosen("epochs", TrainSettings.epochs),
        "train_size": train_size,
        "val_size": chosen("val_size", max(10, train_size // 5)),
        "batch_size": chosen("batch_size", TrainSettings.batch_size),
        "patience": chosen("patience", TrainSettings.patience),
    }
    for name, value in sizes.items():
        if value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if sizes["batch_size"] > train_size:
        raise UserError(f"--batch-size {sizes['batch_size']} is larger than --train-size {train_size}")
    return sizes


def _split(split: Mapping[str, Sequence[str]] | None, task_cls: Any) -> dict[str, list[str]] | None:
    """Held-out groups as plain lists (the task checks them against its data)."""
    if split is None:
        return None
    if "folds" not in task_cls.capabilities:
        raise UserError(f"task '{task_cls.name}' has no grouped folds: it keeps its own split")
    unknown = set(split) - {"val", "test"}
    if unknown or "test" not in split:
        raise UserError(f"a split names 'test' (and optionally 'val') groups, got {sorted(split)}")
    return {name: [str(group) for group in groups] for name, groups in split.items()}


def _device(device: str) -> str:
    """``--device``: "auto" is cuda where torch sees a CUDA device, else cpu."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible to torch (use --device cpu or auto)")
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda, got {device!r}")
    return device

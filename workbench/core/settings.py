"""Every setting of a run, declared once: its name, type, default, help, metavar, check and the commands that take it.

`SETTINGS` is the one list. From it come the fields of `workbench.core.config.RunRequest` (what ``workbench.adapt(...)``
takes as keywords) and `workbench.core.config.RunConfig` (what a run's ``config.yaml`` holds, in this order), the shared
fields of `workbench.comparison.design.CompareSpec` (``spec.json``), the flags of ``workbench adapt``, ``compare`` and
``evaluate`` (`Setting.commands`) and the checks `check` runs on a resolved configuration. A new setting is one
`Setting` here (and, when it changes how a method trains, a field of that name in
`workbench.core.trainer.TrainSettings`, `Setting.trains`); a renamed one keeps its earlier name working for a while
(`Setting.renamed_from`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from workbench.core.device import DEVICES
from workbench.core.options import RenamedFrom
from workbench.core.trainer import SCHEDULES

#: The commands whose flags come from the declarations.
COMMANDS = ("adapt", "compare", "evaluate")
#: ``--precision`` values: "auto" is the task's first (`workbench.core.task.Task.precisions`).
PRECISIONS = ("auto", "float64", "float32", "bf16", "fp16")

#: ``check(values, task_cls) -> what is wrong, or None``: ``values`` holds every setting of the run as resolved
#: (`workbench.core.config.resolve_config`), by `Setting.name`.
Check = Callable[[Mapping[str, Any], Any], "str | None"]


@dataclass(frozen=True)
class Setting:
    """One setting of a run: ``name=`` in Python, ``--name`` on the command lines of `commands`, ``name:`` (or
    `stored_as`) in ``config.yaml``."""

    name: str
    #: Turns a command line's text into the value (int, float, str, or a parser such as `_names`); bool: a switch.
    type: Callable[[str], Any]
    #: What a request holds when the user leaves it out; None: the task's (filled in by `resolve_config`).
    default: Any
    help: str
    #: Of `COMMANDS`: those that offer it as a flag (none: Python only).
    commands: tuple[str, ...] = ()
    #: What ``--help`` shows after the flag (`workbench.cli.flags.METAVARS`; None: from the type, or the choices).
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None
    #: The flag, when it is not ``--`` + the name with dashes.
    flag_name: str | None = None
    #: What is wrong with the resolved value (`Check`); None: nothing to check beyond `choices`.
    check: Check | None = None
    #: Handed to every method's `workbench.core.trainer.TrainSettings` under its own name.
    trains: bool = False
    #: A value that must be given (``workbench adapt --domain``).
    required: bool = False
    #: Builds the default of a mutable value (a mapping), instead of `default`.
    factory: Callable[[], Any] | None = None
    #: Its name in `workbench.core.config.RunConfig` and ``config.yaml`` when another one.
    stored_as: str | None = None
    #: (earlier name, version that renamed it): the earlier flag, ``config.yaml`` / ``spec.json`` key and keyword
    #: keep working, with a `FutureWarning`, for one minor version (`workbench.core.options.RenamedFrom`).
    renamed_from: RenamedFrom | None = None

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.name.replace("_", "-")

    @property
    def stored_name(self) -> str:
        return self.stored_as or self.name

    def field(self) -> Any:
        """The `dataclasses.field` of this setting in a request, config or spec."""
        metadata = {"setting": self}
        if self.factory is not None:
            return dataclasses.field(default_factory=self.factory, metadata=metadata)
        if self.required:
            return dataclasses.field(metadata=metadata)
        return dataclasses.field(default=self.default, metadata=metadata)


def _names(text: str) -> tuple[str, ...]:
    """``--baselines``' comma-separated names; '' for none."""
    return tuple(name for name in text.split(",") if name)


def _at_least_one(name: str) -> Check:
    flag = "--" + name.replace("_", "-")
    return lambda values, task_cls: None if values[name] >= 1 else f"{flag} must be at least 1, got {values[name]}"


def _batch_size(values: Mapping[str, Any], task_cls: Any) -> str | None:
    problem = _at_least_one("batch_size")(values, task_cls)
    if problem is None and values["batch_size"] > values["train_size"]:
        return f"--batch-size {values['batch_size']} is larger than --train-size {values['train_size']}"
    return problem


def _ema_decay(values: Mapping[str, Any], task_cls: Any) -> str | None:
    decay = values["ema_decay"]
    return None if 0 <= decay < 1 else f"--ema-decay must be in [0, 1) (0 turns averaging off), got {decay}"


def _learning_rate(values: Mapping[str, Any], task_cls: Any) -> str | None:
    rate = values["learning_rate"]
    return None if rate is None or rate > 0 else f"--lr must be positive, got {rate}"


def _precision(values: Mapping[str, Any], task_cls: Any) -> str | None:
    if values["precision"] in task_cls.precisions:
        return None
    return (f"--precision {values['precision']}: task '{task_cls.name}' trains in {', '.join(task_cls.precisions)} "
            f"(bad value or not offered by this task's models)")  # fmt: skip


def _schedule(values: Mapping[str, Any], task_cls: Any) -> str | None:
    schedule = values["schedule"]
    return None if schedule in SCHEDULES else f"--schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}"


def _warmup_share(values: Mapping[str, Any], task_cls: Any) -> str | None:
    share = values["warmup_share"]
    if not 0 <= share < 1:
        return f"--warmup-share must be in [0, 1), got {share}"
    return f"--warmup-share {share} needs --schedule linear" if share and values["schedule"] != "linear" else None


def _clip_grad_norm(values: Mapping[str, Any], task_cls: Any) -> str | None:
    clip = values["clip_grad_norm"]
    return None if clip >= 0 else f"--clip-grad must be at least 0 (0 turns clipping off), got {clip}"


def _lr_factor(values: Mapping[str, Any], task_cls: Any) -> str | None:
    factor = values["lr_factor"]
    return None if 0 < factor < 1 else f"--lr-factor must be in (0, 1), got {factor}"


def _curves(values: Mapping[str, Any], task_cls: Any) -> str | None:
    unknown = [name for name in values["curves"] if name not in task_cls.metrics]
    if not unknown:
        return None
    return f"--curves {','.join(unknown)}: not a metric of task '{task_cls.name}' ({', '.join(task_cls.metrics)})"


def _select_on(values: Mapping[str, Any], task_cls: Any) -> str | None:
    if values["select_on"] in ("loss", *task_cls.metrics):
        return None
    return (f"--select-on {values['select_on']}: task '{task_cls.name}' selects on loss or one of its metrics "
            f"({', '.join(task_cls.metrics)})")  # fmt: skip


#: Every setting of a run, in the order of ``config.yaml``.
# fmt: off
SETTINGS: tuple[Setting, ...] = (
    Setting("domain", str, None, "task name (see `workbench list`)", ("adapt",), "TASK", required=True,
            stored_as="task"),
    Setting("method", str, None, "adaptation method (default: the task's)", ("adapt",), "METHOD"),
    Setting("baselines", _names, None, "comma-separated methods run beside it, METHOD or METHOD@MODEL (default: the "
            "task's); '' for none", ("adapt",), "METHODS"),
    Setting("data", str, None, "your data (default: the task's embedded data); compare: a path holding {seed} "
            "reads one dataset per seed", ("adapt", "compare"), "PATH"),
    Setting("model", str, None, "a registered model (`workbench list`) or a checkpoint file (default: the task's "
            "model)", ("adapt", "compare"), "MODEL"),
    Setting("trust_checkpoint", bool, False, "allow loading a checkpoint that is a full pickle (it can run code)",
            ("adapt",)),
    Setting("out", str, None, "run directory (default: runs/<task>-<method>-<time>)", ("adapt",), "DIR"),
    Setting("epochs", int, None, "maximum epochs (early stopping on validation may end sooner)", ("adapt", "compare"),
            check=_at_least_one("epochs"), trains=True),
    Setting("train_size", int, None, "training samples of the training split", ("adapt", "compare"),
            check=_at_least_one("train_size")),
    Setting("val_size", int, None, "validation samples (default: the task's or max(10, train-size/5))",
            ("adapt", "compare"), check=_at_least_one("val_size")),
    Setting("batch_size", int, None, "samples per step (per process under torchrun)", ("adapt", "compare"),
            check=_batch_size, trains=True),
    Setting("patience", int, None, "epochs without validation improvement before stopping", ("adapt", "compare"),
            check=_at_least_one("patience"), trains=True),
    Setting("ema_decay", float, 0.99, "moving average of the trained weights, used for validation and the result "
            "(0: off)", ("adapt", "compare"), check=_ema_decay),
    Setting("learning_rate", float, None, "learning rate (default: the task's, else each method's own)",
            ("adapt", "compare"), flag_name="--lr", check=_learning_rate),
    Setting("seed", int, 0, "seeds data selection, initialisation and shuffling", ("adapt",), "SEED", trains=True),
    Setting("device", str, "auto", "where to compute (auto: cuda where torch sees a CUDA device, else cpu)",
            ("adapt", "compare", "evaluate"), choices=DEVICES),
    Setting("task_options", dict, None, "the task's options (the task's flags)", factory=dict),
    Setting("method_options", dict, None, "the method's options (the method's flags)", factory=dict),
    Setting("precision", str, "auto", "float64 / float32: weights and samples in that type; bf16 / fp16: float32 "
            "weights, mixed-precision (autocast) training steps (default: the task's first; `workbench list` shows "
            "each task's)", ("adapt",), choices=PRECISIONS, check=_precision, trains=True),
    Setting("threads", int, None, "CPU threads to compute with, pinned (default: the CPUs this process may use less "
            "those other processes keep busy, which a run re-chooses before every epoch as that load changes; give it "
            "for runs comparable bit for bit)", ("adapt", "evaluate")),
    #: The task's own split replaced by held-out groups ({"val": [...], "test": [...]}, `workbench.core.task.Task.
    #: hold_out`); what ``workbench compare`` gives each fold.
    Setting("split", dict, None, "held-out groups replacing the task's split"),
    Setting("schedule", str, "plateau", "learning-rate schedule: plateau (halve after epochs without improvement) or "
            "linear (warm-up, then linear decay to 0 at the last epoch's last step)", ("adapt", "compare"),
            choices=SCHEDULES, check=_schedule, trains=True),
    Setting("warmup_share", float, 0.0, "share of all steps that warm up under --schedule linear",
            ("adapt", "compare"), check=_warmup_share, trains=True),
    Setting("select_on", str, "loss", "what chooses the best epoch and stops early: loss (validation loss) or a "
            "metric of the task, scored on the validation samples after every epoch (`workbench list` shows each "
            "task's metrics)", ("adapt", "compare"), "METRIC", check=_select_on, trains=True),
    Setting("clip_grad_norm", float, 10.0, "largest gradient norm; larger ones are scaled down to it (0: no "
            "clipping)", ("adapt", "compare"), flag_name="--clip-grad", check=_clip_grad_norm),
    Setting("lr_factor", float, 0.5, "under --schedule plateau, what the learning rate is multiplied by after "
            "--lr-patience epochs without improvement", ("adapt", "compare"), check=_lr_factor, trains=True),
    Setting("lr_patience", int, 5, "under --schedule plateau, epochs without improvement before the learning rate "
            "falls", ("adapt", "compare"), check=_at_least_one("lr_patience"), trains=True),
    Setting("curves", _names, (), "learning curves: these metrics of the task (comma-separated) scored on the "
            "validation and test samples after every epoch and kept in the history (an evaluation of both per epoch; "
            "nothing chooses on them)", ("adapt", "compare"), "METRICS", check=_curves),
    #: A method's authors' recipe (`workbench.core.recipe`): METHOD:NAME, or NAME of the chosen method.
    Setting("recipe", str, None, "a method's authors' recipe, METHOD:NAME or NAME of the chosen method (each "
            "method's page names its recipes): it sets every setting you leave at its default, and the report lists "
            "what you changed",
            ("adapt", "compare"), "METHOD:NAME"),
)
# fmt: on


def settings_for(command: str) -> list[Setting]:
    """The settings ``command`` (one of `COMMANDS`) offers as flags, in declaration order."""
    return [setting for setting in SETTINGS if command in setting.commands]


def check(values: Mapping[str, Any], task_cls: Any) -> str | None:
    """The first problem of a resolved configuration's ``values`` (by `Setting.name`), in declaration order."""
    for setting in SETTINGS:
        problem = setting.check(values, task_cls) if setting.check else None
        if problem is not None:
            return problem
    return None


def with_settings(command: str | None = None, stored: bool = False) -> Callable[[type], type]:
    """A frozen dataclass of the decorated class: its own annotated fields, then the declared settings (those
    ``command`` offers; None: every one) under their `Setting.stored_name` when ``stored``."""

    def build(cls: type) -> type:
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        for setting in SETTINGS if command is None else settings_for(command):
            name = setting.stored_name if stored else setting.name
            annotations[name] = "Any"
            setattr(cls, name, setting.field())
        cls.__annotations__ = annotations
        return dataclass(frozen=True)(cls)

    return build

"""A run's configuration: what the user asked for (`RunRequest`), resolved against the task's defaults
(`RunConfig`) by a pure function.

The fields of both are the settings `workbench.core.settings.SETTINGS` declares (the ``adapt`` flags, the keywords of
`workbench.adapt`, the keys of ``config.yaml``). `resolve_config` never changes what the user asked for: it fills in
what they left out (and says which default it took in the resolved ``config.yaml``), stops with a `UserError` on
what cannot be done (`workbench.core.settings.check`), and returns warnings for what it will do but the user may not
expect.

A baseline is a method name, or ``METHOD@MODEL`` for a method run on another registered model of the same task
(``full@OTHER``: full training of the registered model ``OTHER`` beside the task's default model).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Sequence

from workbench.core import recipe, settings
from workbench.core.device import resolve_name
from workbench.core.errors import UserError
from workbench.core.options import renamed, resolve_options
from workbench.core.registry import methods, models, tasks
from workbench.core.settings import SETTINGS, Setting, with_settings
from workbench.core.trainer import TrainSettings


@with_settings()
class RunRequest:
    """What the user asks of a run (every `workbench.core.settings.SETTINGS`, by name); None leaves the choice to the
    task (and says so in ``config.yaml``)."""

    @classmethod
    def parameters(cls) -> list[Setting]:
        """The settings the command line offers as ``adapt`` flags."""
        return settings.settings_for("adapt")


@with_settings(stored=True)
class RunConfig:
    """Everything that determines a run's numbers (plus where it writes them): a `RunRequest` resolved, with the
    fields of `workbench.core.settings.SETTINGS` (``task``: the request's ``domain``; ``baselines``: `MethodEntry`s;
    ``precision`` of runs written before it: the task's first; ``threads``: None when following the load)."""

    def to_dict(self) -> dict[str, Any]:
        content = dataclasses.asdict(self)
        content["baselines"] = [str(entry) for entry in self.baselines]
        content["curves"] = list(self.curves)
        return content

    @classmethod
    def from_dict(cls, content: dict[str, Any]) -> "RunConfig":
        content = upgraded(content)
        precision = content.get("precision", "auto")
        if precision == "auto":
            precision = tasks.get(content["task"]).precisions[0]
        baselines = tuple(MethodEntry.parse(entry) for entry in content["baselines"])
        curves = tuple(content.get("curves") or ())  # YAML keeps a list
        return cls(**{**content, "baselines": baselines, "precision": precision, "curves": curves})

    def entries(self) -> list[MethodEntry]:
        """The chosen method, then the baselines: the order a run trains them in."""
        return [MethodEntry(self.method), *self.baselines]

    def train_settings(self, learning_rate: float) -> TrainSettings:
        """The `TrainSettings` of its methods (``learning_rate``: the run's, else the method's own): every declared
        setting that trains (`workbench.core.settings.Setting.trains`) by its name; ``ema_decay`` 0 is None (off)."""
        trained = {s.name: getattr(self, s.stored_name) for s in SETTINGS if s.trains}
        return TrainSettings(**trained, learning_rate=learning_rate, ema_decay=self.ema_decay or None,
                             clip_grad_norm=self.clip_grad_norm or None)  # fmt: skip


def upgraded(content: Mapping[str, Any]) -> dict[str, Any]:
    """A ``config.yaml``'s content with every earlier name of a setting, task option or method option (``renamed_from``)
    replaced by its current one (a `FutureWarning` each), so that a run written before a rename still loads."""
    stored = [dataclasses.replace(s, name=s.stored_name) for s in SETTINGS]
    content = renamed("config.yaml", stored, content)
    for key, registry, owner in (("task_options", tasks, "task"), ("method_options", methods, "method")):
        name = content.get(owner)
        if isinstance(content.get(key), dict) and isinstance(name, str) and name in registry.declared():
            try:
                options = registry.get(name).options  # imports that plug-in alone, not every other domain's
            except UserError:  # not loadable here (its extra is missing): its options stay as written
                continue
            content[key] = renamed(f"config.yaml: {key}", options, content[key])
    return content


#: ``METHOD[@MODEL][:VARIANT]``: names of letters, digits and _.+- (a variant may hold =).
_ENTRY = re.compile(r"(?P<method>[A-Za-z0-9_.+-]+)(@(?P<model>[A-Za-z0-9_.+-]+))?(:(?P<variant>[A-Za-z0-9_.+=-]+))?")


@dataclass(frozen=True)
class MethodEntry:
    """One method of a run or a comparison: ``METHOD``; ``METHOD@MODEL`` for one run on another registered model of
    the task (``full@OTHER``: full training of the model ``OTHER`` beside the task's default model);
    ``METHOD:VARIANT`` for a compared variant (its options given by ``compare --set``)."""

    method: str
    #: A registered model's name; None for the run's own model.
    model: str | None = None
    #: A compared variant's label; None for the method with its own options.
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> "MethodEntry":
        """``"full@OTHER"`` → ``MethodEntry("full", "OTHER")``; ``"full:r4"`` → ``MethodEntry("full", None, "r4")``.

        Raises:
            UserError: ``text`` is not ``METHOD[@MODEL][:VARIANT]``.
        """
        match = _ENTRY.fullmatch(text)
        if match is None:
            raise UserError(f"{text!r} is not METHOD[@MODEL][:VARIANT] (letters, digits, _.+-)")
        return cls(match["method"], match["model"], match["variant"])

    def __str__(self) -> str:
        model = "" if self.model is None else f"@{self.model}"
        return self.method + model + ("" if self.variant is None else f":{self.variant}")


def resolve_config(request: RunRequest, now: datetime | None = None) -> tuple[RunConfig, list[str]]:
    """Fill the task's defaults into the user's choices; returns the frozen config and warnings."""
    domain = request.domain
    task_cls = tasks.get(domain)
    method = request.method or task_cls.default_method
    entry = _entry(method, "--method")
    if entry.model is not None:
        raise UserError(f"--method {method}: choose the model with --model; METHOD@MODEL is for --baselines")
    variant = {} if entry.variant is None else variant_options(method, "--method")
    method, method_cls = entry.method, methods.get(entry.method)
    if request.recipe:
        defaults = {s.name: s.default for s in SETTINGS if s.factory is None}
        request = recipe.apply(request, domain, method, defaults, methods)
    profile = task_cls.profile(method)
    baselines, warnings = _baselines(request, task_cls, profile, method)
    task_options = {**profile.get("options", {}), **dict(request.task_options)}
    method_options = {**profile.get("method_options", {}), **variant, **dict(request.method_options)}
    learning_rate = task_cls.defaults.get("learning_rate") if request.learning_rate is None else request.learning_rate
    precision = task_cls.precisions[0] if request.precision == "auto" else request.precision
    values = {
        **{setting.name: getattr(request, setting.name) for setting in SETTINGS},
        "method": method,
        "baselines": baselines,
        "data": None if request.data is None else str(request.data),
        "model": None if request.model is None else str(request.model),
        **_sizes(request, task_cls.defaults),
        "learning_rate": learning_rate,
        "precision": precision,
    }
    problem = settings.check(values, task_cls)
    if problem is not None:
        raise UserError(problem)
    values["task_options"] = resolve_options(f"task '{domain}'", task_cls.options, task_options)
    values["method_options"] = resolve_options(f"method '{method}'", method_cls.options, method_options)
    method_cls(**values["method_options"])  # a method checks its options when built: fail before anything is written
    out = request.out or f"runs/{domain}-{method}-{(now or datetime.now()).strftime('%Y%m%d-%H%M%S')}"
    values.update(out=str(out), device=resolve_name(request.device), split=_split(request.split, task_cls))
    return RunConfig(**{setting.stored_name: values[setting.name] for setting in SETTINGS}), warnings


def variant_options(label: str, flag: str = "--methods") -> dict[str, Any]:
    """The options a method declares for the variant ``label`` names (``METHOD:VARIANT``;
    `workbench.core.method.Method.variants`), a copy; a `UserError` naming ``flag`` and the variants there are when
    the method declares none of that name."""
    entry = _entry(label, flag)
    method_cls = methods.get(entry.method)
    if entry.variant not in method_cls.variants:
        known = ", ".join(f"{method_cls.name}:{name}" for name in method_cls.variants) or "none"
        raise UserError(f"{flag} {label}: method '{method_cls.name}' declares no variant '{entry.variant}' (its "
                        f"variants: {known}; compare can name its own with --set)")  # fmt: skip
    return dict(method_cls.variants[entry.variant])


def _entry(text: str, flag: str) -> MethodEntry:
    """`MethodEntry.parse` of what ``flag`` gave, its refusal naming the flag."""
    try:
        return MethodEntry.parse(text)
    except UserError as error:
        raise UserError(f"{flag}: {error}") from None


def _baselines(request: RunRequest, task_cls: Any, profile: Mapping[str, Any], method: str) -> tuple[
    tuple[MethodEntry, ...], list[str]]:  # fmt: skip
    """The baselines asked for (else the task's for ``method``), each a registered method on a registered model;
    the chosen method among them is dropped, with a warning."""
    texts = profile.get("baselines", task_cls.baselines) if request.baselines is None else request.baselines
    baselines = tuple(_entry(text, "--baselines") for text in texts)
    for entry in baselines:
        if entry.variant is not None:
            raise UserError(f"--baselines {entry}: METHOD:VARIANT is for workbench compare (give METHOD[@MODEL])")
        methods.get(entry.method)
        if entry.model is not None:
            models.get(entry.model)
    if MethodEntry(method) not in baselines:
        return baselines, []
    warning = f"'{method}' is the chosen method and a baseline: it runs once, as the chosen method"
    return tuple(entry for entry in baselines if entry != MethodEntry(method)), [warning]


def _sizes(request: RunRequest, defaults: Mapping[str, Any]) -> dict[str, int]:
    """Epochs, sample counts, batch size and patience: the user's, else the task's, else `TrainSettings`' (checked
    with the other settings, `workbench.core.settings.check`)."""

    def chosen(name: str, fallback: int) -> int:
        given = getattr(request, name)
        return defaults.get(name, fallback) if given is None else given

    train_size = chosen("train_size", 100)
    return {
        "epochs": chosen("epochs", TrainSettings.epochs),
        "train_size": train_size,
        "val_size": chosen("val_size", max(10, train_size // 5)),
        "batch_size": chosen("batch_size", TrainSettings.batch_size),
        "patience": chosen("patience", TrainSettings.patience),
    }


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

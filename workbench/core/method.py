"""The shape every adaptation method shares, and the training plan it hands the run.

A method hooks into the run at these points, in this order:

- ``check(task, data, model)``: refuse, before anything is written, a task, data or model the method cannot work
  with (the default checks ``model_families``, ``needs_model`` and ``needs_task`` against what the model and the
  task declare);
- ``prepare(model)``: attach adapters, choose what trains (every parameter any stage trains: counted and saved);
- ``setup(task, model, data, seed)``: look at the data before training (fit sample weights, keep the
  unlabelled target samples);
- ``plan(task, model, data, inputs)``: the training plan, a list of `Stage` run in order, each a whole trainer run
  with its own trainable parameters, samples, settings and loss, and optionally a gradient function, a hook before
  each optimizer step, an epoch hook, modules held frozen in eval mode (a teacher) and learning rates per group of
  parameters. One stage (the default) is ordinary training; several are staged training (alignment, embedding and
  adapter stages, say); none is a method that adapts without training (one that generates its weights in
  ``setup``).
  `PlanInputs` carries the run's training settings, the folder where the run's chosen method writes what it makes
  besides the adapter, and the run's chosen adapted model for methods that learn from it (distillation);
- ``loss(task, model, batch, training)``: the objective the default plan trains (the task's loss unless the method
  weights samples or adds a term);
- ``diagnostics(task, model, data)``: extra numbers for ``metrics.json`` after training;
- ``merge(model)``: fold adapters into plain weights at the end.

A stage's ``gradients(model, batch, step)``, for methods that replace backprop (a zeroth/first-order mix, say),
fills every trainable ``.grad`` and returns the detached batch loss (None lets the trainer call
``loss(...).backward()``). ``step`` is the global training step (0, 1, ..., the same after a resume), so a method
seeds its randomness with ``seed * 1_000_003 + step`` and a resumed run draws what an uninterrupted one would.
Validation always uses the stage's ``loss``.

Placement: the model every hook receives is already on the run's device (`workbench.core.device.place`); what a hook
makes beside it (adapters, estimators, generated weights) goes where the model is (`workbench.core.device.device_of`).
``prepare`` may create its adapters on the host: the run places the prepared model again.

The state a method owns apart from the base model (``trainable_state``) is saved as ``adapter.safetensors``.
Methods stay usable without the trainer, on plain PyTorch modules.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Collection, Mapping, Sequence

import torch
from torch import nn

from workbench.core.checkpoint import check_state_fits
from workbench.core.errors import UserError
from workbench.core.model import require
from workbench.core.options import Option, resolve_options
from workbench.core.trainer import TrainSettings

if TYPE_CHECKING:
    from workbench.core.task import Task, TaskData


@dataclass(frozen=True)
class Stage:
    """One trainer run of a method's plan (`Method.plan`)."""

    name: str
    train: Sequence[Any]
    val: Sequence[Any]
    settings: TrainSettings
    #: ``loss(model, batch, training) -> scalar tensor`` (mean over the batch); validation uses it too.
    loss: Callable[[nn.Module, Any, bool], torch.Tensor]
    #: Names of the parameters this stage trains (the rest are frozen while it runs); None: those ``prepare`` left
    #: trainable. After the last stage every parameter ``prepare`` left trainable is trainable again.
    trainable: Collection[str] | None = None
    #: ``gradients(model, batch, step) -> detached loss | None``: fills every trainable ``.grad`` itself (see the
    #: module docstring); None: ``loss(...).backward()``.
    gradients: Callable[[nn.Module, Any, int], torch.Tensor | None] | None = None
    #: ``before_step(model, optimizer, step)`` once the step's gradients are in ``.grad`` (unscaled, not yet
    #: clipped) and before the optimizer steps, at global step ``step``: for a method that edits optimizer state
    #: (LIFT drops the Adam moments of entries that left its masks).
    before_step: Callable[[nn.Module, torch.optim.Optimizer, int], None] | None = None
    #: ``on_epoch(epoch, epochs)`` before each training epoch (0-based ``epoch`` of at most ``epochs``): schedules
    #: that depend on training progress (mass annealing, class weights from the target).
    on_epoch: Callable[[int, int], None] | None = None
    #: Called once when the stage has finished training (the best weights are in the model): a plan writes what
    #: the stage made into `PlanInputs.outputs`.
    on_end: Callable[[], None] | None = None
    #: Modules held frozen and in eval mode for the whole stage (a teacher: no dropout, batch-norm statistics that do
    #: not move): a name is a submodule of the model (``model.get_submodule(name)``), a module one the method holds
    #: outside the model (a teacher its ``loss`` calls). Their parameters do not train even where ``trainable``
    #: names them; their modes and ``requires_grad`` are restored when the stage ends.
    frozen: Collection[str | nn.Module] = ()
    #: Learning rates of parameter groups, ``{pattern: rate}``: a trained parameter joins the group of the first
    #: pattern (`fnmatch.fnmatchcase` on its name, ``*`` matches dots too: ``"head.*"``) that matches it, the rest
    #: train at ``settings.learning_rate``; a schedule scales every group's rate by the same factor. Empty: one group.
    learning_rates: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanInputs:
    """What a run hands `Method.plan` besides the task, model and data."""

    #: The run's training settings (epochs, batch size, learning rate: the method's own unless the user gave one).
    settings: TrainSettings
    #: Where the run's chosen method writes what its stages made besides the adapter (``<run>/<method name>/``);
    #: None for baselines, processes other than rank 0 and runs outside `workbench.run`.
    outputs: Path | None = None
    #: The model the run's chosen method adapted (built when called), for a baseline that learns from it; None for
    #: the chosen method itself.
    adapted_model: Callable[[], nn.Module] | None = None


class Method:
    """Base class of adaptation methods; subclasses set the class attributes and ``prepare``."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: Learning rate used when the user does not give one (the method's authors' choice where known).
    learning_rate: ClassVar[float] = 1e-3
    #: Method-specific options, e.g. ``rank``.
    options: ClassVar[tuple[Option, ...]] = ()
    #: Whether long set-up work shows a progress bar (the run sets it; off with ``--quiet``).
    progress: bool = True
    #: The model families (`workbench.core.model.ModelSpec.family`) the method can adapt; empty for any.
    model_families: ClassVar[tuple[str, ...]] = ()
    #: What the model must declare (`workbench.core.model.NEEDS`: ``head``, ``adapter_target_groups``, ``embedding``,
    #: ``signal``).
    needs_model: ClassVar[tuple[str, ...]] = ()
    #: What the task must offer: names of `workbench.core.task.CAPABILITIES` (``target_pool``, ``predict``), and
    #: ``typing.Protocol`` classes (``runtime_checkable``) that the methods define in their own package (the first
    #: line of the protocol's docstring says what, for the refusal).
    needs_task: ClassVar[tuple[Any, ...]] = ()
    #: Its authors' recipes by name (`workbench.core.recipe.Recipe`; ``--recipe METHOD:NAME``).
    recipes: ClassVar[Mapping[str, Any]] = {}
    #: Named option sets by name (``--method METHOD:VARIANT``, ``compare --methods METHOD:VARIANT``: the method with
    #: these options; options the user gives win). The docstring says which are the authors' and which the project's.
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    def __init__(self, **options: Any):
        self.config = resolve_options(f"method '{self.name}'", self.options, options)

    def prepare(self, model: nn.Module) -> nn.Module:
        """Attach what the method trains and freeze the rest, in place; returns the model."""
        raise NotImplementedError

    def check(self, task: "Task", data: "TaskData", model: nn.Module) -> None:
        """Refuse a task, data or model this method cannot work with — called before the run directory appears."""
        if self.model_families or self.needs_model:
            require(model, self.name, *self.needs_model, families=self.model_families)
        missing = [need for need in self.needs_task if isinstance(need, str) and need not in task.capabilities]
        if missing:
            raise UserError(
                f"method '{self.name}' needs a task that offers {', '.join(missing)}; task '{task.name}' offers "
                f"{', '.join(sorted(task.capabilities)) or 'none of these'}"
            )
        for need in self.needs_task:
            if not isinstance(need, str) and not isinstance(task, need):
                what = (need.__doc__ or need.__name__).strip().splitlines()[0].rstrip(".")
                lacking = [name for name in dir(need) if not name.startswith("_") and not hasattr(task, name)]
                raise UserError(
                    f"method '{self.name}' needs {what[0].lower() + what[1:]}; task '{task.name}' has no "
                    f"{', '.join(lacking)}"
                )
        if "target_pool" in self.needs_task and not data.target:
            raise UserError(f"method '{self.name}' needs unlabelled target samples; task '{task.name}' has none here")

    def setup(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        """Called once before training, with the prepared model (on its device) and the run's samples."""

    def plan(self, task: "Task", model: nn.Module, data: "TaskData", inputs: "PlanInputs") -> list["Stage"]:
        """The stages to train, in order (after ``setup``). By default one stage: the run's samples and settings,
        this method's ``loss``, the parameters ``prepare`` left trainable."""
        return [Stage("train", data.train, data.val, inputs.settings, functools.partial(self.loss, task))]

    def loss(self, task: "Task", model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        """The training objective on one batch (scalar); by default the task's own loss."""
        return task.loss(model, batch, training)

    def diagnostics(self, task: "Task", model: nn.Module, data: "TaskData") -> dict[str, float]:
        """Numbers about the method itself after training (e.g. where its sample weights went)."""
        return {}

    def merge(self, model: nn.Module) -> nn.Module:
        """Fold adapters into the base weights; returns a plain model (identity for weight-only methods)."""
        return model

    def trainable_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """What the method owns apart from the frozen base: every trainable parameter, by name."""
        return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}

    def load_trainable_state(
        self, model: nn.Module, state: Mapping[str, torch.Tensor], source: str | Path = "<state>"
    ) -> None:
        """Load a state from `trainable_state` into a prepared model; every key must match."""
        params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        check_state_fits(params, state, source, f"adapter state does not fit this model and method '{self.name}'")
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts of a prepared model, adapters included."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total

"""The shape every adaptation method shares.

A method hooks into the run at named points, in this order:

- ``check(task, data, model)``: refuse, before anything is written, a task, data or model the method cannot work
  with (the default checks ``model_families``, ``needs_model`` and ``needs_task`` against what the model and the
  task declare);
- ``prepare(model)``: attach adapters, choose what trains;
- ``setup(task, model, data, seed)``: look at the data before training (fit sample weights, keep the
  unlabelled target samples);
- ``start_stage(stage, task, model, data, settings)``: for methods trained in several stages (``stages``, each a
  whole trainer run: HealthGPT's alignment, embedding and adapter stages), choose what trains in that stage and
  return its training and validation samples and settings;
- ``start_epoch(epoch, epochs)``: schedules that depend on training progress (mass annealing);
- ``loss(task, model, batch, training)``: the objective (the task's loss unless the method weights
  samples or adds a term);
- ``gradients(task, model, batch, step)``: for methods that replace backprop (H-Tuning's zeroth/first-order
  mix): fill every trainable ``.grad`` and return the detached batch loss; None (the default) lets the
  trainer call ``loss(...).backward()``. ``step`` is the global training step (0, 1, ..., the same after a
  resume), so a method seeds its randomness with ``seed * 1_000_003 + step`` (``seed`` from ``setup``) and a
  resumed run draws what an uninterrupted one would. Validation always uses ``loss``;
- ``diagnostics(task, model, data)``: extra numbers for ``metrics.json`` after training;
- ``merge(model)``: fold adapters into plain weights at the end;
- ``save_outputs(folder)``: the chosen method writes what its stages made (a generator, descriptors) into
  ``<run>/<method name>/``.

A method with ``trains = False`` adapts in ``setup`` alone (weights generated, not trained): the trainer does not
run for it and its ``train_seconds`` are 0.

A method that learns from another model (distillation, ``takes_teacher``) and runs as a baseline receives
the model the run's chosen method adapted through ``set_teacher(model)`` before ``setup``.

The state a method owns apart from the base model (``trainable_state``) is saved as
``adapter.safetensors``. Methods stay usable without the trainer, on plain PyTorch modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import torch
from torch import nn

from workbench.checkpoint import check_state_fits
from workbench.errors import UserError
from workbench.model import require
from workbench.options import Option, resolve_options

if TYPE_CHECKING:
    from workbench.task import Task, TaskData
    from workbench.trainer import TrainSettings


class Method:
    """Base class of adaptation methods; subclasses set the class attributes and ``prepare``."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: Learning rate used when the user does not give one (the method's authors' choice where known).
    learning_rate: ClassVar[float] = 1e-3
    #: Method-specific options, e.g. ``rank``.
    options: ClassVar[tuple[Option, ...]] = ()
    #: False for methods that take no gradient step on the task's data (everything happens in ``setup``).
    trains: ClassVar[bool] = True
    #: Names of the training stages, run in this order, each a whole trainer run (`start_stage` prepares each).
    stages: ClassVar[tuple[str, ...]] = ("train",)
    #: Whether long set-up work shows a progress bar (the run sets it; off with ``--quiet``).
    progress: bool = True
    #: True for methods that learn from a teacher model: a run hands them its chosen method's adapted model.
    takes_teacher: ClassVar[bool] = False
    #: The model families (`workbench.model.ModelSpec.family`) the method can adapt; empty for any.
    model_families: ClassVar[tuple[str, ...]] = ()
    #: What the model must declare (`workbench.model.NEEDS`: ``head``, ``lora_target_groups``, ``embedding``,
    #: ``signal``).
    needs_model: ClassVar[tuple[str, ...]] = ()
    #: What the task must offer (`workbench.task.CAPABILITIES`, e.g. ``sample_ids``, ``target_pool``).
    needs_task: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **options: Any):
        self.config = resolve_options(f"method '{self.name}'", self.options, options)

    def prepare(self, model: nn.Module) -> nn.Module:
        """Attach what the method trains and freeze the rest, in place; returns the model."""
        raise NotImplementedError

    def check(self, task: "Task", data: "TaskData", model: nn.Module) -> None:
        """Refuse a task, data or model this method cannot work with — called before the run directory appears."""
        if self.model_families or self.needs_model:
            require(model, self.name, *self.needs_model, families=self.model_families)
        missing = [need for need in self.needs_task if need not in task.capabilities]
        if missing:
            raise UserError(
                f"method '{self.name}' needs a task that offers {', '.join(missing)}; task '{task.name}' offers "
                f"{', '.join(sorted(task.capabilities)) or 'none of these'}"
            )
        if "target_pool" in self.needs_task and not data.target:
            raise UserError(f"method '{self.name}' needs unlabelled target samples; task '{task.name}' has none here")

    def set_teacher(self, teacher: nn.Module) -> None:
        """The model to learn from (only for ``takes_teacher`` methods)."""
        raise NotImplementedError(f"method '{self.name}' takes no teacher")

    def train_settings(self, settings: "TrainSettings") -> "TrainSettings":
        """The run's training settings as this method needs them (default: unchanged)."""
        return settings

    def setup(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        """Called once before training, with the prepared model (on its device) and the run's samples."""

    def start_stage(
        self, stage: str, task: "Task", model: nn.Module, data: "TaskData", settings: "TrainSettings"
    ) -> tuple[Sequence[Any], Sequence[Any], "TrainSettings"]:
        """Before training stage ``stage`` (one of ``stages``): set what trains (``requires_grad``) and return that
        stage's (training samples, validation samples, settings). By default: the run's, unchanged."""
        return data.train, data.val, settings

    def start_epoch(self, epoch: int, epochs: int) -> None:
        """Called before each training epoch (0-based ``epoch`` of at most ``epochs``)."""

    def loss(self, task: "Task", model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        """The training objective on one batch (scalar); by default the task's own loss."""
        return task.loss(model, batch, training)

    def gradients(self, task: "Task", model: nn.Module, batch: Any, step: int) -> torch.Tensor | None:
        """Fill the trainable parameters' ``.grad`` for one training batch and return the detached loss, or
        return None (the default) for the usual ``loss(...).backward()``."""
        return None

    def diagnostics(self, task: "Task", model: nn.Module, data: "TaskData") -> dict[str, float]:
        """Numbers about the method itself after training (e.g. where its sample weights went)."""
        return {}

    def merge(self, model: nn.Module) -> nn.Module:
        """Fold adapters into the base weights; returns a plain model (identity for weight-only methods)."""
        return model

    def save_outputs(self, folder: Path) -> None:
        """Write what the method's stages made besides the adapter into ``folder`` (default: nothing)."""

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

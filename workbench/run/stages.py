"""A method's stages trained one after another (`train_stages`), their trainers, the epoch a run keeps and the
memory of one training step (a probe that leaves the run's random draws as they were)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable, Collection

import torch
from torch import nn

from workbench.core import randomness
from workbench.core.memory import training_step_bytes
from workbench.core.method import Stage
from workbench.core.task import Task, TaskData
from workbench.core.trainer import Trainer, TrainSettings, distributed


def warm_up(task: Task, base: nn.Module, data: TaskData, device: torch.device, batch_size: int) -> None:
    """One throwaway training step on a copy of the base model, so that one-time set-up (autograd engine, kernel
    caches) is not counted in the memory of whichever method happens to train first."""
    model = copy.deepcopy(base).train()
    loss = task.loss(model, task.collate(data.train[:batch_size], device), True)
    if loss.requires_grad:
        loss.backward()
    del model, loss


def stage_trainer(
    stage: Stage, task: Task, model: nn.Module, device: torch.device, checkpoint: Path | None = None,
    progress: bool = False, label: str = "", settings: TrainSettings | None = None, samples: list[Any] | None = None,
    threads: Callable[[], int] | None = None, track: Callable[[nn.Module], dict] | None = None,
) -> Trainer:
    """The trainer of one stage: its loss, samples, settings, gradient function, epoch hook and, when the settings
    select on a metric, its score on the validation samples (``settings`` and ``samples`` replace the stage's for a
    probe); ``threads``: sets the CPU threads before each epoch; ``track``: learning curves
    (`workbench.core.trainer.Trainer`)."""
    train, val = (samples, samples[:1]) if samples is not None else (stage.train, stage.val)
    settings = settings or stage.settings
    return Trainer(
        model, stage.loss, task.collate, train, val, settings, checkpoint_path=checkpoint, device=device,
        progress=progress, label=label or stage.name, epoch_start=stage.on_epoch, gradients=stage.gradients,
        before_step=stage.before_step, threads=threads, frozen=stage.frozen, learning_rates=stage.learning_rates,
        track=track, score=None if settings.select_on == "loss" else functools.partial(
            _validation_score, task, val, device, settings.select_on),
    )  # fmt: skip


def _validation_score(task: Task, samples: list[Any], device: torch.device, metric: str, model: nn.Module) -> float:
    """The objective of selecting on ``metric``: its value on ``samples``, negated where higher is better (the
    trainer minimises)."""
    value = float(task.evaluate(model, samples, device).metrics[metric])
    return value if metric in task.lower_is_better else -value


def set_trainable(model: nn.Module, names: Collection[str]) -> None:
    """Exactly the parameters ``names`` train."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in names)


def step_bytes(stage: Stage, task: Task, model: nn.Module, data: TaskData, device: torch.device) -> int:
    """Peak tensor bytes of one training step of the plan's last stage [bytes]: the larger of 2 trainer steps after
    a warm-up step (`workbench.core.memory.training_step_bytes`), on a copy of ``model`` training what that stage
    trains, with full batches of the stage's batch size (training samples cycled when there are fewer)."""
    random_state = randomness.capture()  # a measurement: the run's random draws go on as if it had not happened
    try:
        return _probe_step_bytes(stage, task, model, data, device)
    finally:
        randomness.restore(random_state)


def _probe_step_bytes(stage: Stage, task: Task, model: nn.Module, data: TaskData, device: torch.device) -> int:
    steps, probe = 2, copy.deepcopy(model)
    if stage.trainable is not None:
        set_trainable(probe, stage.trainable)
    n_samples = stage.settings.batch_size * distributed()[1] * (steps + 1)
    samples = [data.train[i % len(data.train)] for i in range(n_samples)]
    settings = dataclasses.replace(stage.settings, epochs=1, select_on="loss")  # a probe: nothing to select
    trainer = functools.partial(stage_trainer, stage, task, probe, device, label=f"{stage.name} memory",
                                settings=settings, samples=samples)  # fmt: skip
    return max(training_step_bytes(lambda: trainer().fit(), device))


def train_stages(
    stages: list[Stage],
    task: Task,
    model: nn.Module,
    checkpoint: Path,
    device: torch.device,
    progress: bool,
    label: str,
    resume: bool,
    threads: Callable[[], int] | None = None,
    track: Callable[[nn.Module], dict] | None = None,
) -> list[dict[str, Any]]:
    """Train a prepared model stage after stage (``threads``: sets the CPU threads before each epoch; ``track``:
    each epoch's learning-curve scores, `curve_scores`); the trainers' history, epochs numbered over all stages, each
    entry naming its ``stage``. Nothing for a plan without stages. Afterwards every parameter that was trainable
    before the first stage is trainable again (what the method saves as its adapter)."""
    history: list[dict[str, Any]] = []
    prepared = [name for name, p in model.named_parameters() if p.requires_grad]
    staged = [stage.name for stage in stages] != ["train"]
    for stage in stages:
        if stage.trainable is not None:
            set_trainable(model, stage.trainable)
        trainer = stage_trainer(
            stage, task, model, device, progress=progress, label=f"{label} {stage.name}" if staged else label,
            checkpoint=checkpoint.with_name(f"{checkpoint.stem}.{stage.name}.pt") if staged else checkpoint,
            threads=threads, track=track,
        )  # fmt: skip
        for entry in trainer.fit(resume=resume):
            history.append(dict(entry, epoch=len(history), stage=stage.name, stage_epoch=entry["epoch"]))
        if stage.on_end is not None:
            stage.on_end()
    set_trainable(model, prepared)
    return history


def best_epoch(history: list[dict[str, Any]]) -> int:
    """The epoch (over all stages) of the best validation objective (`TrainSettings.select_on`: the loss or a metric)
    among the selectable epochs of the last stage (`TrainSettings.select_from`; the stage's last epoch when none is),
    -1 without training: different stages' losses are not comparable."""
    last = [h for h in history if h["stage"] == history[-1]["stage"]] if history else []
    selectable = [h for h in last if h["selectable"]]
    if not selectable:
        return last[-1]["epoch"] if last else -1
    return min(selectable, key=lambda h: h.get("objective", h["val_loss"]))["epoch"]


def curve_scores(task: Task, splits: dict[str, list[Any]], device: torch.device, metrics: tuple[str, ...],
                 model: nn.Module) -> dict[str, dict[str, float]]:  # fmt: skip
    """``{split: {metric: value}}`` of ``model`` on each split's samples (``--curves``): a learning curve's point.
    The random generators are left as they were: scoring does not change what training draws next."""
    state = randomness.capture()
    try:
        scored = {name: task.evaluate(model, samples, device).metrics for name, samples in splits.items()}
    finally:
        randomness.restore(state)
    return {name: {metric: float(values[metric]) for metric in metrics} for name, values in scored.items()}

"""Shared machinery of methods that re-weight the source samples' losses (a base class, not a method).

Every parameter trains; the loss of a batch is ``mean_i(w_i · ℓ_i)`` with per-sample losses ℓ_i from the
task (``sample_losses``, the `PerSampleLosses` protocol of `workbench.adaptation.task_needs`) and weights looked
up by sample id (``batch_ids``, `SampleIds`). Subclasses fill ``weight_by_id`` in ``setup`` (and may refresh it
before each epoch from their stage's ``on_epoch``, `workbench.core.method.Stage`, as PADA does). With weights of mean 1
over the training samples the loss stays on the scale of the unweighted one, so learning rates carry over.

Diagnostic (``outlier_weight_share``): when the task knows which classes the target holds
(``TaskData.summary["target_classes"]``), the share of the training weight that falls on source samples
of classes absent from the target — 0 for a perfect partial-DA weighting, the class share for uniform.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from workbench.adaptation.task_needs import PerSampleLosses, SampleIds

from workbench.core.device import device_of
from workbench.core.method import Method

if TYPE_CHECKING:
    from workbench.core.task import Task, TaskData


class WeightedSourceLoss(Method):
    """Base class: per-sample weights (mean 1 over the training samples) on the task's per-sample loss."""

    #: Weight validation losses too (importance-weighted validation); otherwise validation is unweighted.
    weighted_validation = True
    needs_task = (PerSampleLosses, SampleIds)

    def prepare(self, model: nn.Module) -> nn.Module:
        return model.requires_grad_(True)

    def setup(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        self.task, self.model, self.data, self.seed = task, model, data, seed
        self.device = device_of(model)
        ids = np.concatenate([task.sample_ids(data.train), task.sample_ids(data.val)])
        self.weight_by_id = torch.ones(int(ids.max()) + 1, device=self.device)
        self.train_ids = torch.as_tensor(task.sample_ids(data.train), device=self.device)
        self.val_ids = torch.as_tensor(task.sample_ids(data.val), device=self.device)

    def set_weights(self, train_weights: torch.Tensor, val_weights: torch.Tensor | None = None) -> None:
        """Weights of the training (and validation) samples, in ``data`` order; normalised by the training mean."""
        scale = train_weights.mean().clamp_min(1e-12)
        self.weight_by_id[self.train_ids] = (train_weights / scale).to(self.device, torch.float32)
        if val_weights is not None:
            self.weight_by_id[self.val_ids] = (val_weights / scale).to(self.device, torch.float32)

    def loss(self, task: "Task", model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        losses = task.sample_losses(model, batch)
        if not training and not self.weighted_validation:
            return losses.mean()
        return (self.weight_by_id[task.batch_ids(batch)] * losses).mean()

    def train_weights(self) -> torch.Tensor:
        """The current weights of the training samples (mean 1), in ``data.train`` order."""
        return self.weight_by_id[self.train_ids]

    def diagnostics(self, task: "Task", model: nn.Module, data: "TaskData") -> dict[str, float]:
        result = {"weight_effective_sample_share": effective_sample_share(self.train_weights())}
        share = outlier_weight_share(task, data, self.train_weights())
        if share is not None:
            result["outlier_weight_share"] = share
        return result


def effective_sample_share(weights: torch.Tensor) -> float:
    """Kish's effective sample size over n: (Σw)² / (n Σw²), 1 for uniform weights."""
    weights = weights.double()
    return float(weights.sum() ** 2 / (len(weights) * (weights**2).sum()).clamp_min(1e-300))


def outlier_weight_share(task: "Task", data: "TaskData", train_weights: torch.Tensor) -> float | None:
    """Share of the training weight on classes absent from the target; None when the target's classes are unknown."""
    if "target_classes" not in data.summary:
        return None
    labels = task.batch_labels(task.collate(data.train, torch.device("cpu"))).numpy()
    absent = ~np.isin(labels, data.summary["target_classes"])
    weights = train_weights.detach().cpu().double().numpy()
    return float(weights[absent].sum() / weights.sum())

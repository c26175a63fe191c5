"""Importance weighting under covariate shift (a base class for the density-ratio methods, not a method).

When inputs move between domains but p(y | x) stays, the target risk is a re-weighted source risk:

    E_target[ℓ] = E_source[r(x) ℓ],   r(x) = p_target(x) / p_source(x)        (Shimodaira, 2000)

A subclass supplies the density-ratio estimator (``make_estimator``, an object with ``fit(x_numerator,
x_denominator)`` and ``ratio(x)``). Before training it is fitted with the target's adaptation pool as
numerator and the source training inputs as denominator; the estimated ratios of the training and
validation samples become loss weights, clipped at ``clip`` times their mean (a few huge ratios would
otherwise dominate) and normalised to mean 1. Validation is importance-weighted too (IWCV, Sugiyama et
al., 2007), so early stopping estimates the target risk.

Diagnostic: ``weight_effective_sample_share``, Kish's effective sample size over n.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from workbench.adaptation.source_weighting import WeightedSourceLoss
from workbench.adaptation.task_needs import InputVectors, PerSampleLosses, SampleIds

from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.options import Option

if TYPE_CHECKING:
    from workbench.core.task import Task, TaskData


def clipped_weights(ratios: np.ndarray, reference: np.ndarray, clip: float) -> np.ndarray:
    """``ratios`` divided by the mean of ``reference`` (both ≥ 0), clipped at ``clip`` (weights of mean ~1)."""
    scale = max(float(np.mean(reference)), 1e-12)
    return np.minimum(np.maximum(ratios, 0.0) / scale, clip)


class ImportanceWeighting(WeightedSourceLoss):
    """Base class: source losses weighted by an estimated density ratio p_target(x) / p_source(x)."""

    options = (Option("clip", float, 10.0, "largest weight, in units of the mean weight"),)
    needs_task = ("target_pool", InputVectors, PerSampleLosses, SampleIds)

    def make_estimator(self, seed: int, device: torch.device) -> Any:
        """A density-ratio estimator with ``fit(x_numerator, x_denominator)`` and ``ratio(x)``; one written in
        torch fits on ``device`` (the model's)."""
        raise NotImplementedError

    def setup(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        if self.config["clip"] <= 1:
            raise UserError(f"--clip must be above 1 (the mean weight), got {self.config['clip']}")
        super().setup(task, model, data, seed)
        x_train, x_val = task.sample_inputs(data.train), task.sample_inputs(data.val)
        estimator = self.make_estimator(seed, device_of(model))
        estimator.fit(task.sample_inputs(data.target), x_train)
        train_ratio, val_ratio = estimator.ratio(x_train), estimator.ratio(x_val)
        clip = self.config["clip"]
        train = clipped_weights(train_ratio, train_ratio, clip)
        self.set_weights(torch.as_tensor(train), torch.as_tensor(clipped_weights(val_ratio, train_ratio, clip)))

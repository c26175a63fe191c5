"""PADA-style class weights for partial domain adaptation (the usual baseline of WARMPOT).

Paper: Cao et al., "Partial Adversarial Domain Adaptation", ECCV 2018 (the same class weights drive
BA3US, Liang et al., ECCV 2020). The target's predicted class distribution tells which source classes
the target holds:

    c_k = mean_j softmax(f(x_t,j))_k ,   c ← c / max_k c ,   w_i = c_{y_i}   (then mean 1 over the source)

recomputed with the current model before every epoch, so classes the target never predicts fade out.
PADA's adversarial feature alignment is left out: this is its class-weighting part, run beside WARMPOT's
plan-based weights on the same backbone and loss.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import nn
from workbench.adaptation.source_weighting import WeightedSourceLoss
from workbench.adaptation.task_needs import ClassLabels, Embeddings, PerSampleLosses, SampleIds

from workbench.core.method import PlanInputs, Stage
from workbench.core.registry import methods

if TYPE_CHECKING:
    from workbench.core.task import Task, TaskData


def target_class_weights(task: "Task", model: nn.Module, target_samples, device: torch.device) -> torch.Tensor:
    """c (n_classes,): mean predicted target class probabilities, divided by their maximum."""
    model.eval()
    with torch.no_grad():
        _, logits = task.embed(model, task.collate(target_samples, device))
        mean = torch.softmax(logits, dim=-1).mean(0)
    model.train()
    return mean / mean.max()


@methods.register
class PADAWeights(WeightedSourceLoss):
    name = "pada"
    description = "PADA/BA3US class weights: source classes weighted by the target's mean predicted probability"
    needs_task = ("target_pool", Embeddings, ClassLabels, PerSampleLosses, SampleIds)

    def setup(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        super().setup(task, model, data, seed)
        self.train_labels = task.batch_labels(task.collate(data.train, self.device))
        self.val_labels = task.batch_labels(task.collate(data.val, self.device))

    def plan(self, task: "Task", model: nn.Module, data: "TaskData", inputs: PlanInputs) -> list[Stage]:
        """One stage whose class weights are refreshed from the target before every epoch (`start_epoch`)."""
        return [dataclasses.replace(stage, on_epoch=self.start_epoch) for stage in super().plan(task, model, data,
                                                                                                 inputs)]

    def start_epoch(self, epoch: int, epochs: int) -> None:
        weights = target_class_weights(self.task, self.model, self.data.target, self.device)
        self.class_weights = weights
        self.set_weights(weights[self.train_labels], weights[self.val_labels])

"""Oracle class weights for partial domain adaptation: the upper reference, not a usable method.

Source samples of classes the target holds weigh 1, the others 0 (then mean 1). It needs the target's
class set, which a real unlabelled target does not reveal; the features task knows it for generated
problems and labelled targets (``TaskData.summary["target_classes"]``). Shows how much a perfect
weighting could gain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from workbench.adaptation.source_weighting import WeightedSourceLoss
from workbench.adaptation.task_needs import ClassLabels, PerSampleLosses, SampleIds

from workbench.core.errors import UserError
from workbench.core.registry import methods

if TYPE_CHECKING:
    from workbench.core.task import Task, TaskData


@methods.register
class OracleClassWeights(WeightedSourceLoss):
    name = "oracle"
    description = "Oracle weights (reference only): 1 on the source classes the target holds, 0 on the others"
    needs_task = (PerSampleLosses, SampleIds, ClassLabels)

    def check(self, task: "Task", data: "TaskData", model: nn.Module) -> None:
        super().check(task, data, model)
        if "target_classes" not in data.summary:
            raise UserError(
                f"method '{self.name}' needs the target's class set, which task '{task.name}' does not know"
            )

    def setup(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        super().setup(task, model, data, seed)
        present = torch.as_tensor(data.summary["target_classes"], device=self.device)

        def weights(samples) -> torch.Tensor:
            return torch.isin(task.batch_labels(task.collate(samples, self.device)), present).float()

        self.set_weights(weights(data.train), weights(data.val))

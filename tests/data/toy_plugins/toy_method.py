"""A toy method, as a third party would add one: one module and one entry-point line. It trains a scale and an
offset of the frozen model's output (a two-parameter recalibration) and folds them into the head."""

import torch
from torch import nn

from workbench.core.method import Method
from workbench.core.registry import methods


class Recalibrated(nn.Module):
    """``scale · model(x) + offset`` with ``model`` frozen."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.requires_grad_(False)
        self.scale = nn.Parameter(torch.ones(()))
        self.offset = nn.Parameter(torch.zeros(()))
        self.workbench_spec = model.workbench_spec

    def forward(self, x):
        return self.scale * self.model(x) + self.offset


@methods.register
class ToyRecalibration(Method):
    name = "toy-recalibration"
    description = "toy: learn a scale and an offset of the model's output"
    learning_rate = 5e-2

    def prepare(self, model):
        return Recalibrated(model)

    def merge(self, model):
        head = model.model.head
        with torch.no_grad():
            head.weight.mul_(model.scale)
            head.bias.mul_(model.scale).add_(model.offset)
        return model.model

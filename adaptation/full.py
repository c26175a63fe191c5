"""Full fine-tuning: every parameter of the base model trains (the usual baseline)."""

from __future__ import annotations

from torch import nn

from workbench.method import Method
from workbench.registry import methods


@methods.register
class FullFineTuning(Method):
    name = "full"
    description = "Full fine-tuning: every parameter of the pretrained model trains"
    learning_rate = 1e-3

    def prepare(self, model: nn.Module) -> nn.Module:
        return model.requires_grad_(True)

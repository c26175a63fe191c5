"""Full fine-tuning: every parameter of the base model trains (the usual baseline)."""

from __future__ import annotations

from torch import nn

from workbench.core.method import Method
from workbench.core.registry import methods


@methods.register
class FullFineTuning(Method):
    name = "full"
    description = "Full fine-tuning: every parameter of the pretrained model trains"
    # The ELoRA authors' lr for every method; also the best of 1e-3, 2e-3, 5e-3 on rmd17 validation (50 frames).
    learning_rate = 5e-3

    def prepare(self, model: nn.Module) -> nn.Module:
        return model.requires_grad_(True)

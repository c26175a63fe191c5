"""Head-only fine-tuning: the model's declared output head trains (MACE's readouts, a classifier), the
representation stays frozen."""

from __future__ import annotations

from torch import nn

from workbench.core.method import Method
from workbench.core.model import require
from workbench.core.registry import methods


@methods.register
class ReadoutFineTuning(Method):
    name = "readout"
    description = "Readout / head only: train the model's declared output head, freeze the rest"
    needs_model = ("head",)
    learning_rate = 2e-2  # better than 5e-3 on rmd17 validation (50 frames)

    def prepare(self, model: nn.Module) -> nn.Module:
        head = model.get_submodule(require(model, self.name, *self.needs_model).head)
        model.requires_grad_(False)
        head.requires_grad_(True)
        return model

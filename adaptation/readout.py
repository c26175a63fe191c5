"""Readout-only fine-tuning: the model's output heads train, the representation stays frozen."""

from __future__ import annotations

from torch import nn

from workbench.errors import UserError
from workbench.method import Method
from workbench.registry import methods


@methods.register
class ReadoutFineTuning(Method):
    name = "readout"
    description = "Readout only: train the output heads (model.readouts), freeze the rest"
    model_families = ("mace",)
    learning_rate = 2e-2  # better than 5e-3 on rmd17 validation (50 frames)

    def prepare(self, model: nn.Module) -> nn.Module:
        readouts = getattr(model, "readouts", None)
        if not isinstance(readouts, nn.Module):
            raise UserError(f"{type(model).__name__} has no 'readouts' module: readout fine-tuning does not fit it")
        model.requires_grad_(False)
        readouts.requires_grad_(True)
        return model

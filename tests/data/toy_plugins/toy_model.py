"""A toy model family, as a third party would add one: one module and one entry-point line."""

from torch import nn

from workbench.core.model import ModelFamily, ModelSpec
from workbench.core.registry import models


class ToyNet(nn.Module):
    """x (batch, in_features) → linear body → head → y (batch, 1)."""

    workbench_spec = ModelSpec(family="toy", head="head")

    def __init__(self, in_features: int):
        super().__init__()
        self.architecture = {"in_features": in_features}
        self.body = nn.Linear(in_features, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.body(x))


@models.register
class ToyFamily(ModelFamily):
    name = "toy-net"
    description = "toy: a two-layer linear regressor"

    def load(self, source=None, *, trust_checkpoint=False, in_features=3, **sizes):
        return ToyNet(in_features)

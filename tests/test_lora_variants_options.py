"""LoRA options beyond PEFT's: plug-ins that keep them, RepLoRA's reparameterised factors, Flat-LoRA's objective."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from workbench.adaptation import lora

from workbench.errors import UserError


class Net(nn.Module):
    """x (batch, 3, 12) → Conv1d (batch, 5, 12) → Linear over time (batch, 5, 7) → mean → Linear (batch, 4)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 5, 3, padding=1)
        self.fc = nn.Linear(12, 7)
        self.out = nn.Linear(7, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(F.gelu(self.conv(x)))).mean(dim=1))


def net() -> Net:
    torch.manual_seed(0)
    return Net().double()


def inputs() -> torch.Tensor:
    return torch.randn(6, 3, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


@pytest.mark.parametrize("option", [{"scaling": "rslora"}, {"init": "pissa"}, {"dora": True}])
def test_plain_lora_plugins_keep_their_init_scaling_and_dora(option):
    plugins = {"p": lora.PluginConfig(4, 8.0, kind="lora", **option), "q": lora.PluginConfig(2, 4.0, kind="lora")}
    model = lora.apply_plugins(net(), ["fc", "out"], plugins)
    for layer in lora.lora_layers(model).values():
        assert layer.adapters["p"] == plugins["p"] and layer.adapters["q"] == plugins["q"]
    if "dora" in option:
        assert set(model.fc.lora_magnitude_vector) == {"p"}
    if "init" in option:  # PiSSA's factors hold the top singular triplets of W
        layer = model.fc
        expected = torch.linalg.svdvals(net().fc.weight)[:4]
        torch.testing.assert_close(torch.linalg.svdvals(layer._lora_weight("p"))[:4], expected)

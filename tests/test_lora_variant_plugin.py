"""A new LoRA variant is one class and one registration: a learned scalar gate on the update, applied through
`lora.apply`, checked against its closed form (forward, merge, unmerge), trained, saved and loaded."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from workbench.adaptation import lora
from workbench.adaptation.lora import variants
from workbench.adaptation.lora.variants.base import LoraVariant

from workbench.core.errors import UserError


class Gate(nn.Module):
    """One learned scalar ``weight``."""

    def __init__(self, like: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(torch.empty((), dtype=like.dtype, device=like.device))


class ScalarGate(LoraVariant):
    """``g · scale · B A x`` with ``g`` learned (0.5 at start), ``ΔW = g · scale · B A``."""

    name = "test-gate"

    def add(self, layer, name, config):
        layer.part("lora_gate")[name] = Gate(layer.base_layer.weight)

    def init_parameters(self, layer, name):
        nn.init.constant_(layer.lora_gate[name].weight, 0.5)

    def update(self, layer, name, x, base):
        plain = layer._factor_forward(name, layer.lora_dropout[name](x)) * layer.scales[name]
        return layer.lora_gate[name].weight * plain

    def delta_weight(self, layer, name, delta):
        return layer.lora_gate[name].weight * delta


@pytest.fixture
def gate():
    variants.register(ScalarGate)
    yield ScalarGate
    variants.unregister(ScalarGate.name)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 6), nn.GELU(), nn.Linear(6, 3)).double()


def test_a_registered_variant_acts_by_its_closed_form_and_merges(gate):
    base = model()
    adapted = lora.apply(model(), targets=["0"], rank=2, alpha=6.0, variants=("test-gate",))
    layer = adapted[0]
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(generator=torch.Generator().manual_seed(3))
        layer.lora_gate["default"].weight.fill_(0.7)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    expected_delta = 0.7 * (6.0 / 2) * b @ a
    expected = x @ (base[0].weight + expected_delta).T + base[0].bias
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-13)
    torch.testing.assert_close(layer.delta_weight(), expected_delta, rtol=0, atol=1e-14)
    assert "gate" in repr(layer) and "test-gate" in repr(layer)

    assert layer.lora_gate["default"].weight.requires_grad  # a variant's parameter trains with the adapter
    assert "0.lora_gate.weight" in lora.adapter_state(adapted)
    layer(x).sum().backward()
    assert layer.lora_gate["default"].weight.grad is not None

    lora.merge(adapted, unload=False)
    torch.testing.assert_close(layer.base_layer.weight, base[0].weight + expected_delta, rtol=0, atol=1e-14)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-13)
    lora.unmerge(adapted)
    torch.testing.assert_close(layer.base_layer.weight, base[0].weight, rtol=0, atol=1e-15)


def test_a_variant_adapter_saves_and_loads_and_is_not_written_for_peft(gate, tmp_path):
    adapted = lora.apply(model(), targets=["0", "2"], rank=2, alpha=4.0, variants=("test-gate",))
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if p.requires_grad:
                p.normal_(generator=torch.Generator().manual_seed(len(name)))
    lora.save_adapter(adapted, tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "adapter_config.json").exists()  # PEFT has no such variant
    again = model()
    lora.load_adapter(again, tmp_path / "adapter", strict=True)
    assert again._lora_configs["default"].variants == ("test-gate",)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(again(x), adapted(x), rtol=0, atol=0)


def test_unknown_and_taken_variant_names_are_refused(gate):
    with pytest.raises(UserError, match=r"LoRA variants \['nope'\] are not registered; registered: \[.*'test-gate'"):
        lora.AdapterConfig(rank=2, alpha=2, variants=("nope",))

    class Other(ScalarGate):
        pass

    with pytest.raises(UserError, match="'test-gate' is taken by ScalarGate"):
        variants.register(Other)


def test_plain_configs_do_not_write_the_variants_field():
    """Adapter files of built-in refinements keep the fields they had (readable by earlier versions)."""
    assert "variants" not in lora.LoraConfig(dora=True).to_dict()
    assert "variants" not in lora.AdapterConfig(rank=2, alpha=2).to_dict()


def test_a_plugin_keeps_its_registered_variant(gate):
    """`apply_plugins` builds each plug-in's adapters with the variants its config asks for."""
    plugins = {"gated": lora.PluginConfig(rank=2, alpha=2.0, variants=("test-gate",))}
    adapted = lora.apply_plugins(model(), ["0"], plugins)
    assert "gated" in adapted[0].lora_gate
    assert adapted[0].lora_gate["gated"].weight.item() == 0.5

"""feature-lora builds its updates from `LoraLayer`: the same init and draws, the same forward as the low-rank formula
``base(x) + (alpha / r) · (x Aᵀ) Bᵀ`` the method had, and a merged model computing the same function."""

from __future__ import annotations

import copy
import math

import torch
from conftest import outputs_on, randomize_trainable, small_mace
from e3nn import o3
from workbench.adaptation import feature_lora

from workbench.core.registry import methods

RANK, ALPHA = 2, 3.0  # scale 1.5: not a power of two, so a misplaced scale shows
SCALE = ALPHA / RANK


class OldFormula(torch.nn.Module):
    """The method's update before it used `LoraLayer`, with the factors given: ``base(x) + scale · (x Aᵀ) Bᵀ``."""

    def __init__(self, base: o3.Linear, a: torch.Tensor, b: torch.Tensor):
        super().__init__()
        self.base, self.a, self.b = base, a.detach().clone(), b.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + SCALE * (x @ self.a.T) @ self.b.T


def _layers(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, feature_lora.FeatureLowRank)}


def _factors(layer):
    return layer.lora.lora_A.default.weight, layer.lora.lora_B.default.weight


def _as_old(model):
    """A copy of an adapted ``model`` whose adapted layers compute the old formula with the same factors."""
    old = copy.deepcopy(model)
    for name, layer in _layers(old).items():
        parent, _, child = name.rpartition(".")
        setattr(old.get_submodule(parent) if parent else old, child, OldFormula(layer.base_layer, *_factors(layer)))
    return old


def test_init_is_peft_kaiming_with_the_old_draws():
    """``A`` Kaiming-uniform (a = sqrt(5)) from the same random draws as before, ``B = 0``, only they train."""
    base = small_mace()
    linears = [m for m in base.modules() if isinstance(m, o3.Linear)]
    torch.manual_seed(7)
    model = feature_lora.apply(copy.deepcopy(base), rank=RANK, alpha=ALPHA)
    torch.manual_seed(7)
    expected = []
    for linear in linears:  # the old module's draws, layer by layer in module order
        a = torch.empty(RANK, linear.irreps_in.dim, dtype=linear.weight.dtype)
        expected.append(torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5)))
    layers = list(_layers(model).values())
    assert len(layers) == len(linears) > 0
    for layer, a_expected in zip(layers, expected):
        a, b = _factors(layer)
        torch.testing.assert_close(a, a_expected, rtol=0, atol=0)
        assert b.shape == (layer.base_layer.irreps_out.dim, RANK) and not b.any()
        assert layer.lora.scale == SCALE and layer.lora.base_layer.weight.requires_grad is False
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.lora.lora_{f}.default.weight" for n in _layers(model) for f in "AB"}


def test_update_is_the_low_rank_formula_and_merges_exactly(ethanol):
    """With ``B ≠ 0``: each layer and the whole model equal the old formula in float64, and the merged model (a
    fixed ``ΔW`` buffer per layer, no adapter parameters) equals the unmerged one."""
    z, coords = ethanol
    outputs = outputs_on(z, coords[:2])
    model = randomize_trainable(feature_lora.apply(small_mace(), rank=RANK, alpha=ALPHA), scale=0.05)
    assert next(model.parameters()).dtype == torch.float64
    generator = torch.Generator().manual_seed(3)
    for layer in _layers(model).values():
        a, b = _factors(layer)
        assert b.abs().min() > 0
        x = torch.randn(5, a.shape[1], generator=generator, dtype=torch.float64)
        expected = layer.base_layer(x) + SCALE * (x @ a.T) @ b.T
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-12)

    adapted = {k: v.detach() for k, v in outputs(model).items()}
    old = {k: v.detach() for k, v in outputs(_as_old(model)).items()}
    base = outputs(small_mace())
    assert (adapted["forces"] - base["forces"]).abs().max() > 1e-6  # the update really acts
    for key in adapted:
        torch.testing.assert_close(adapted[key], old[key], rtol=1e-12, atol=1e-12)

    deltas = {n: SCALE * (lambda a, b: b @ a)(*_factors(layer)) for n, layer in _layers(model).items()}
    merged = feature_lora.merge(model)
    assert not _layers(merged) and not any(p.requires_grad for p in merged.parameters())
    dense = {n: m for n, m in merged.named_modules() if isinstance(m, feature_lora.DenseUpdate)}
    assert dense.keys() == deltas.keys()
    for name, module in dense.items():
        assert dict(module.dense.named_buffers()).keys() == {"weight"} and not list(module.dense.parameters())
        torch.testing.assert_close(module.dense.weight, deltas[name], rtol=1e-14, atol=1e-15)
    for key, value in outputs(merged).items():
        torch.testing.assert_close(value, adapted[key], rtol=1e-12, atol=1e-12)


def test_adapter_files_with_the_old_names_load():
    """Files written before (``<layer>.lora_A`` / ``<layer>.lora_B``) load into the same factors."""
    method = methods.get("feature-lora")(rank=RANK, alpha=ALPHA)
    model = randomize_trainable(method.prepare(small_mace()))
    state = method.trainable_state(model)
    old_names = {k.replace(".lora.lora_", ".lora_").removesuffix(".default.weight"): v for k, v in state.items()}
    assert old_names.keys().isdisjoint(state)
    reloaded = method.prepare(small_mace())
    method.load_trainable_state(reloaded, old_names)
    for name, value in method.trainable_state(reloaded).items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0)

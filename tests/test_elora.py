"""ELoRA: identity at start, SO(3) equivariance with non-zero adapters, merge, layout, save/load."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import energy_forces, outputs_on, randomize_trainable, small_mace
from e3nn import o3
from torch.nn.utils import parametrize
from workbench.adaptation import elora
from workbench.domains.atomistic.frames import Frame, collate, to_graphs

from workbench.core.errors import UserError
from workbench.core.testing import (
    assert_identity_at_init,
    assert_merge_equivalent,
    assert_only_trainable_change,
    assert_rotation_equivariant,
    rotation_equivariance_error,
)


class FeatureSpaceLowRank(torch.nn.Module):
    """Negative control: a low-rank update applied in feature space, across the whole irreps axis."""

    def __init__(self, base: o3.Linear, rank: int = 4):
        super().__init__()
        self.base = base
        self.A = torch.nn.Parameter(0.3 * torch.randn(base.irreps_in.dim, rank, dtype=torch.float64))
        self.B = torch.nn.Parameter(0.3 * torch.randn(rank, base.irreps_out.dim, dtype=torch.float64))

    def forward(self, x):
        return self.base(x) + x @ self.A @ self.B


def test_identity_at_start(mace_model, ethanol):
    z, coords = ethanol
    # B = 0 makes every adapted weight W + 0 exactly; the parametrized forward may sum in another order (measured:
    # 4.6e-18 relative with OpenBLAS's Haswell kernels), so the bound is a few ulps, not zero.
    assert_identity_at_init(mace_model, elora.ELoRA(rank=4, alpha=4.0), outputs_on(z, coords[:3]), tol=1e-15)


@pytest.mark.parametrize("frame", [0, 137])
def test_equivariant_with_random_adapters_and_after_merge(mace_model, ethanol, frame):
    z, coords = ethanol
    model = randomize_trainable(elora.apply(mace_model, rank=4, alpha=4.0), scale=0.3)
    positions = torch.as_tensor(coords[frame])
    base_energy, _ = energy_forces(small_mace(), z)(positions)
    energy, _ = energy_forces(model, z)(positions)
    assert abs(float(energy - base_energy)) > 1e-3, "the adapters must really change the model for this test"
    assert_rotation_equivariant(energy_forces(model, z), positions, tol=1e-9)
    merged = assert_merge_equivalent(model, elora.ELoRA(), outputs_on(z, coords[frame : frame + 1]), tol=1e-12)
    assert not any(parametrize.is_parametrized(m) for m in merged.modules())
    assert_rotation_equivariant(energy_forces(merged, z), positions, tol=1e-9)


def test_negative_control_feature_space_lora_is_caught(mace_model, ethanol):
    z, coords = ethanol
    mace_model.products[0].linear = FeatureSpaceLowRank(mace_model.products[0].linear)
    error = rotation_equivariance_error(energy_forces(mace_model, z), torch.as_tensor(coords[0]))
    assert error > 1e-3
    with pytest.raises(AssertionError, match="not rotation-equivariant"):
        assert_rotation_equivariant(energy_forces(mace_model, z), torch.as_tensor(coords[0]))


def test_per_path_layout_matches_e3nn(mace_model):
    """Each path's update lands in e3nn's own view of that path's weights, and only there."""
    elora.apply(mace_model, rank=3, alpha=6.0)
    randomize_trainable(mace_model)
    checked = 0
    for module in mace_model.modules():
        if not isinstance(module, (o3.Linear, o3.TensorProduct)) or not parametrize.is_parametrized(module):
            continue
        adapter = module.parametrizations.weight[0]
        base = module.parametrizations.weight.original
        weighted = [i for i, ins in enumerate(module.instructions) if isinstance(module, o3.Linear) or ins.has_weight]
        for path, index in enumerate(weighted):
            block_shape = module.weight_view_for_instruction(index).shape
            expected = module.weight_view_for_instruction(index, base) + (6.0 / 3) * (
                adapter.A[path] @ adapter.B[path]
            ).reshape(block_shape)
            torch.testing.assert_close(module.weight_view_for_instruction(index), expected, rtol=0, atol=1e-13)
            checked += 1
    assert checked > 10


def test_targets_and_trainable_parameters():
    model = small_mace(channels=64)  # the foundation's width
    total = sum(p.numel() for p in model.parameters())
    elora.apply(model, rank=16, alpha=16.0)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("skip_tp.parametrizations.weight" in n for n in names)  # internal-weight tensor products
    assert any("conv_tp_weights.layer0.parametrizations" in n for n in names)  # radial MLP
    assert any("parametrizations.weights_max.0.A" in n for n in names)  # symmetric contraction, top order
    assert any(n.endswith("contractions.0.weights.0") for n in names)  # lower orders trained in full
    assert not any(n.endswith(".original") for n in names)  # base weights frozen
    element = next(m for m in model.modules() if hasattr(m, "weights_max"))
    adapter = element.parametrizations.weights_max[0]
    assert adapter.A.shape[0] == element.parametrizations.weights_max.original.shape[0]  # A per element
    assert adapter.B.shape[1] == element.parametrizations.weights_max.original.shape[2]  # B shared
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable < 0.7 * total


def test_only_adapters_change(mace_model, ethanol):
    z, coords = ethanol
    elora.apply(mace_model, rank=4, alpha=4.0)
    optimizer = torch.optim.SGD([p for p in mace_model.parameters() if p.requires_grad], lr=0.1)

    batch = collate(to_graphs([Frame(z, c) for c in coords[:2]], [1, 6, 7, 8], 5.0), "cpu")

    def step(model):
        energies = model(batch.to_dict(), training=True, compute_force=True)["energy"]
        optimizer.zero_grad()
        energies.sum().backward()
        optimizer.step()

    # B starts at zero so A has no gradient in the first step; two steps move both.
    step(mace_model)
    assert_only_trainable_change(mace_model, step)


def test_adapter_save_and_load(tmp_path, mace_model, ethanol):
    z, coords = ethanol
    adapted = randomize_trainable(elora.apply(copy.deepcopy(mace_model), rank=4, alpha=8.0))
    elora.save_adapter(adapted, tmp_path / "adapter.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter.safetensors"]  # one self-contained file
    loaded = elora.load_adapter(copy.deepcopy(mace_model), tmp_path / "adapter.safetensors")
    outputs = outputs_on(z, coords[:2])
    torch.testing.assert_close(outputs(loaded)["forces"], outputs(adapted)["forces"], rtol=0, atol=0)


def test_wrong_adapter_is_refused(tmp_path, mace_model):
    elora.save_adapter(elora.apply(copy.deepcopy(mace_model), rank=4), tmp_path / "a.safetensors")
    other = small_mace(channels=8)
    with pytest.raises(UserError, match="a.safetensors"):
        elora.load_adapter(other, tmp_path / "a.safetensors")
    with pytest.raises(UserError, match="already carries"):
        elora.apply(elora.apply(mace_model))


class DoubleWeight(torch.nn.Module):
    """A parametrization ELoRA did not create (the module uses 2·W)."""

    def forward(self, weight):
        return 2 * weight


class GainedLinear(torch.nn.Module):
    """An e3nn linear layer followed by a per-channel gain that is no ELoRA target."""

    def __init__(self):
        super().__init__()
        self.linear = o3.Linear("4x0e + 2x1o", "3x0e + 2x1o").double()
        self.gain = torch.nn.Module()
        self.gain.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 9, dtype=torch.float64))

    def forward(self, x):
        return self.linear(x) * self.gain.weight


def test_foreign_parametrizations_are_neither_refused_nor_removed():
    torch.manual_seed(0)
    x = torch.randn(5, 10, dtype=torch.float64)
    model = GainedLinear()
    parametrize.register_parametrization(model.gain, "weight", DoubleWeight())
    model = randomize_trainable(elora.apply(model, rank=2, alpha=2.0), scale=0.3)  # not refused
    assert not model.gain.parametrizations.weight.original.requires_grad
    expected = model(x)
    merged = elora.merge(model)
    assert isinstance(merged.gain.parametrizations.weight[0], DoubleWeight)  # the foreign one stays
    assert not parametrize.is_parametrized(merged.linear)  # ELoRA's own is gone
    torch.testing.assert_close(merged(x), expected, rtol=0, atol=1e-12)
    stacked = GainedLinear()
    parametrize.register_parametrization(stacked.linear, "weight", DoubleWeight())
    elora.apply(stacked, rank=2)
    with pytest.raises(UserError, match="stacked over another parametrization"):
        elora.merge(stacked)
    assert len(stacked.linear.parametrizations.weight) == 2  # refused before anything changed

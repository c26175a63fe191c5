"""The shipped property checks catch deliberately broken methods (so they can fail)."""

from __future__ import annotations

import pytest
import torch
from conftest import outputs_on, randomize_trainable, small_mace
from torch import nn
from torch.nn.utils import parametrize
from workbench.adaptation import elora

from workbench.core.method import Method
from workbench.core.testing import (
    assert_identity_at_init,
    assert_merge_equivalent,
    assert_only_trainable_change,
    assert_rotation_equivariant,
    random_rotation,
)


class PerturbsBase(Method):
    """Broken: preparing it nudges a base weight."""

    name = "broken-init"

    def prepare(self, model):
        with torch.no_grad():
            model.readouts[0].linear.weight.add_(0.1)
        return model.requires_grad_(True)


class ForgetsAdapters(elora.ELoRA):
    """Broken: merging drops the adapters instead of folding them in."""

    name = "broken-merge"

    def merge(self, model):
        for module in list(model.modules()):
            if parametrize.is_parametrized(module):
                for attribute in list(module.parametrizations.keys()):
                    parametrize.remove_parametrizations(module, attribute, leave_parametrized=False)
        return model


def test_identity_check_catches_a_perturbing_method(ethanol):
    z, coords = ethanol
    with pytest.raises(AssertionError, match="changes the model at initialisation"):
        assert_identity_at_init(small_mace(), PerturbsBase(), outputs_on(z, coords[:1]))


def test_merge_check_catches_a_forgetful_merge(ethanol):
    z, coords = ethanol
    method = ForgetsAdapters(rank=2, alpha=2.0)
    prepared = randomize_trainable(method.prepare(small_mace()))
    with pytest.raises(AssertionError, match="merged and unmerged models differ"):
        assert_merge_equivalent(prepared, method, outputs_on(z, coords[:1]))


def test_only_trainable_check_catches_a_leak():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    model[0].requires_grad_(False)

    def leaky_step(m):
        with torch.no_grad():
            m[0].weight.add_(1.0)  # touches a frozen tensor
            m[1].weight.add_(1.0)

    with pytest.raises(AssertionError, match="frozen tensors changed"):
        assert_only_trainable_change(model, leaky_step)
    with pytest.raises(AssertionError, match="no trainable tensor changed"):
        assert_only_trainable_change(model, lambda m: None)


def test_equivariance_check_catches_a_non_equivariant_function():
    def pinned_to_x_axis(positions):
        return positions[:, 0].sum() ** 2, positions * torch.tensor([1.0, 0.0, 0.0], dtype=positions.dtype)

    positions = torch.randn(5, 3, dtype=torch.float64)
    with pytest.raises(AssertionError, match="not rotation-equivariant"):
        assert_rotation_equivariant(pinned_to_x_axis, positions)

    def central(positions):  # a true invariant with equivariant forces
        return -(positions**2).sum(), 2 * positions

    assert_rotation_equivariant(central, positions, tol=1e-12)


def test_random_rotation_is_proper():
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        rotation = random_rotation(generator)
        torch.testing.assert_close(rotation @ rotation.T, torch.eye(3, dtype=torch.float64))
        assert torch.det(rotation) == pytest.approx(1.0)

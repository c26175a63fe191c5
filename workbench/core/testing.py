"""Property checks every adaptation method must pass, shipped for plug-in authors to reuse.

Each check raises ``AssertionError`` with the measured deviation; the workbench's own tests run each
of them on a deliberately broken method too, so a check that cannot fail would be noticed.
"""

from __future__ import annotations

import copy
from typing import Callable, Mapping

import torch
from torch import nn

from workbench.core.method import Method

Outputs = Callable[[nn.Module], Mapping[str, torch.Tensor]]


def random_rotation(generator: torch.Generator, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A uniformly random proper rotation matrix ``(3, 3)`` (QR of a Gaussian matrix, det = +1)."""
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=generator, dtype=dtype))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def rotation_equivariance_error(
    energy_forces: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    positions: torch.Tensor,
    n_rotations: int = 4,
    seed: int = 0,
) -> float:
    """Largest relative deviation from E(3)-rotation symmetry over random rotations ``R``.

    ``energy_forces(positions (n, 3)) -> (energy (), forces (n, 3))``. Measures
    ``|E(xRᵀ) − E(x)| / |E(x)|`` (invariance) and ``‖F(xRᵀ) − F(x)Rᵀ‖ / ‖F(x)‖`` (equivariance).
    """
    generator = torch.Generator().manual_seed(seed)
    energy, forces = energy_forces(positions)
    worst = 0.0
    for _ in range(n_rotations):
        rotation = random_rotation(generator, positions.dtype)
        energy_r, forces_r = energy_forces(positions @ rotation.T)
        worst = max(
            worst,
            float((energy_r - energy).abs().max() / energy.abs().max()),
            float(torch.linalg.norm(forces_r - forces @ rotation.T) / torch.linalg.norm(forces)),
        )
    return worst


def assert_rotation_equivariant(energy_forces, positions: torch.Tensor, tol: float = 1e-9) -> None:
    """Energy invariant and forces rotating with the structure, to ``tol`` relative."""
    error = rotation_equivariance_error(energy_forces, positions)
    assert error <= tol, f"not rotation-equivariant: relative deviation {error:.3e} > {tol:.1e}"


def _max_relative_difference(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    a, b = {k: v.detach() for k, v in a.items()}, {k: v.detach() for k, v in b.items()}
    return max(float(torch.linalg.norm(a[k] - b[k]) / max(torch.linalg.norm(a[k]), 1e-300)) for k in a)


def assert_identity_at_init(model: nn.Module, method: Method, outputs: Outputs, tol: float = 1e-12) -> nn.Module:
    """A freshly prepared model gives the base model's outputs; returns the prepared model."""
    expected = {k: v.detach() for k, v in outputs(model).items()}
    prepared = method.prepare(copy.deepcopy(model))
    error = _max_relative_difference(expected, outputs(prepared))
    assert error <= tol, f"method '{method.name}' changes the model at initialisation: {error:.3e} > {tol:.1e}"
    return prepared


def assert_merge_equivalent(prepared: nn.Module, method: Method, outputs: Outputs, tol: float = 1e-10) -> nn.Module:
    """Merging the adapters does not change the outputs; returns the merged model."""
    expected = {k: v.detach() for k, v in outputs(prepared).items()}
    merged = method.merge(prepared)
    error = _max_relative_difference(expected, outputs(merged))
    assert error <= tol, f"method '{method.name}': merged and unmerged models differ by {error:.3e} > {tol:.1e}"
    return merged


def assert_only_trainable_change(model: nn.Module, step: Callable[[nn.Module], None]) -> None:
    """One optimisation ``step`` changes some trainable tensors and no frozen one (buffers included)."""
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    frozen.update({f"buffer:{n}": b.detach().clone() for n, b in model.named_buffers()})
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    step(model)
    now = dict(model.named_parameters())
    now.update({f"buffer:{n}": b for n, b in model.named_buffers()})
    changed_frozen = [n for n, v in frozen.items() if not torch.equal(v, now[n].detach())]
    assert not changed_frozen, f"frozen tensors changed: {changed_frozen[:5]}"
    assert any(not torch.equal(v, now[n].detach()) for n, v in trainable.items()), "no trainable tensor changed"

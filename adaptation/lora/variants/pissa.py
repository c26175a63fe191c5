"""PiSSA's init (``init="pissa"``): the factors hold the top-r singular triplets of the base weight, which keeps the
residual.

Paper: Meng et al., "PiSSA: Principal Singular Values and Singular Vectors Adaptation of Large Language Models",
NeurIPS 2024 (PEFT's ``init_lora_weights="pissa"``). With ``U S Vᵀ`` the SVD of the base weight (flattened to
``(out, in·K)``; in float64 for float64 weights, else float32), ``B = U_r sqrt(S_r / scale)``, ``A = sqrt(S_r /
scale) V_rᵀ``, so ``scale · B A`` is the best rank-r approximation of ``W``, and the base weight is replaced by the
residual ``W − scale · B A`` (PEFT's convention: the layer still computes ``W`` at start). The residual is a function
of ``W`` alone, so an adapter file needs no copy of it. On a layer the initial factors are kept as non-persistent
buffers (``pissa_factors[name]``, `InitialFactors`) so that `LoraLayer.delete_adapter` puts ``W`` back; merging gives
``W + ΔW`` with ``ΔW = scale · (B A − B₀ A₀)``. On ELoRA's blocks each block ``M_i`` takes the same split (``A_i``
times ``d_i``, whose formula divides by it) and keeps the residual ``M_i − scale · A_i B_i``. Composes with DoRA
and rsLoRA; a parametrized base weight cannot take a residual (refused).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize
from workbench.adaptation.lora.variants.base import LoraVariant, promoted

from workbench.core.errors import UserError


class InitialFactors(nn.Module):
    """An SVD init's initial factors ``A`` and ``B`` (non-persistent buffers: never saved), to put the base weight
    back."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        super().__init__()
        self.register_buffer("A", torch.zeros_like(a), persistent=False)
        self.register_buffer("B", torch.zeros_like(b), persistent=False)


def principal_factors(matrix: torch.Tensor, rank: int, divisor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U_r sqrt(S_r / divisor), sqrt(S_r / divisor) V_rᵀ)`` of the SVD of ``matrix`` (rows × cols, promoted)."""
    u, singular, vh = torch.linalg.svd(matrix, full_matrices=False)
    root = (singular[:rank] / divisor).sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


def restore_base(layer: nn.Module, name: str, share: float) -> None:
    """``W ← W + share · scale · B₀ A₀``: the base weight an SVD init of adapter ``name`` found (zero before its
    first init)."""
    initial = layer.pissa_factors[name]
    with torch.no_grad():
        weight = layer.base_layer.weight
        weight.add_(share * layer._product(name, initial.A, initial.B).to(weight.dtype))


def check_rank(base: nn.Module, config, what: str) -> None:
    """A `UserError` when ``config.rank`` is above the number of singular values of ``base``'s weight."""
    largest = min(base.weight.shape[0], base.weight[0].numel())
    if config.rank > largest:
        raise UserError(
            f"init={config.init!r} takes the top-r singular triplets of the {tuple(base.weight.shape)} {what}, which "
            f"has {largest}: LoRA rank {config.rank} is too large for init={config.init!r}"
        )


def check_residual(base: nn.Module, config) -> None:
    """A `UserError` when ``base``'s weight is parametrized (it cannot take a residual)."""
    if parametrize.is_parametrized(base, "weight"):
        raise UserError(
            f"init={config.init!r} replaces the base weight by a residual, which a parametrized weight cannot take; "
            "use init='kaiming' for this target"
        )


class PiSSA(LoraVariant):
    """The principal factors and the residual base (module doc)."""

    name = "pissa"

    @classmethod
    def applies(cls, config) -> bool:
        return config.init == "pissa"

    @classmethod
    def check_fits(cls, base, config) -> None:
        if config.init == "pissa":
            check_rank(base, config, "base weight")
            check_residual(base, config)

    def label(self, config) -> str:
        return "init=pissa"

    # ---- a LoraLayer ------------------------------------------------------------------------------------------

    def add(self, layer, name, config) -> None:
        layer.part("pissa_factors")[name] = InitialFactors(layer.lora_A[name].weight, layer.lora_B[name].weight)

    def init_factors(self, layer, name) -> bool:
        """The base weight put back, then ``A``, ``B`` from its top-r SVD, kept in ``pissa_factors``, and
        ``W ← W − scale · B A`` (the products in PEFT's order, so float32 weights give PEFT's factors)."""
        restore_base(layer, name, 1.0)
        config, weight, scale = layer.adapters[name], layer.base_layer.weight, layer.scales[name]
        lora_a, lora_b = layer.lora_A[name].weight, layer.lora_B[name].weight
        flat = promoted(weight.detach().flatten(1))
        b, a = principal_factors(flat, config.rank, scale)
        with torch.no_grad():
            lora_a.copy_(a.reshape(lora_a.shape))
            lora_b.copy_(b.reshape(lora_b.shape))
            layer.pissa_factors[name].A.copy_(lora_a)
            layer.pissa_factors[name].B.copy_(lora_b)
            weight.copy_((flat - scale * b @ a).reshape(weight.shape))
        return True

    def delete(self, layer, name) -> None:
        restore_base(layer, name, 1.0)

    # ---- ELoRA's blocks ---------------------------------------------------------------------------------------

    def init_blocks(self, host, original) -> bool:
        """Every block's principal factors; ``original`` (the stored base weight) becomes the residual in place."""
        residual = []
        for i, (block, (a, _)) in enumerate(zip(host.blocks(original.detach()), host.pairs())):
            left, right = principal_factors(promoted(block), a.shape[-1], host.scale)
            host.set_factors(i, left.to(block.dtype), right.to(block.dtype))
            residual.append(block - host.scale * (left @ right).to(block.dtype))
        with torch.no_grad():
            original.copy_(host.assemble(residual))
        return True

"""LoRA-One's init (``init="lora-one"``): the factors from the top-r singular triplets of one full fine-tuning
gradient.

Paper: Zhang, Liu and Chen, "LoRA-One: One-Step Full Gradient Could Suffice for Fine-Tuning Large Language Models,
Provably and Efficiently", ICML 2025 (the authors' code, ``direction=LoRA-One``, ``scale=stable``). The adapter
starts as the default init until it is given the gradient ``G`` of the loss with respect to the base weight; then
with ``U S Vᵀ`` the SVD of ``−G`` (flattened to ``(out, in·K)``) ``B = U_r sqrt(S_r / s₁) / sqrt(γ)`` and
``A = sqrt(S_r / s₁) V_rᵀ / sqrt(γ)`` (``s₁`` the largest singular value, ``γ`` the authors' ``stable_gamma``), the
base weight left as it is: the adapted layer starts one rank-r gradient step away, ``W + scale · B A = W − scale /
(γ s₁) · G_r``. DoRA's magnitude is set again afterwards (as the authors' code does). On ELoRA's blocks each block
takes the same split of its own gradient; a block whose gradient is exactly zero keeps ELoRA's init.
"""

from __future__ import annotations

import math

import torch
from workbench.adaptation.lora.variants.base import LoraVariant, promoted
from workbench.adaptation.lora.variants.pissa import check_rank

from workbench.core.errors import UserError


def gradient_factors(descent: torch.Tensor, rank: int, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U_r sqrt(S_r / s₁) / sqrt(γ), sqrt(S_r / s₁) V_rᵀ / sqrt(γ))`` of the SVD of ``descent`` (``−G``,
    promoted)."""
    u, singular, vh = torch.linalg.svd(descent, full_matrices=False)
    root = (singular[:rank] / singular[0]).sqrt() / math.sqrt(gamma)
    return u[:, :rank] * root, root[:, None] * vh[:rank]


class LoraOne(LoraVariant):
    """Factors from one gradient (module doc); `init_from_gradient` / `init_blocks_from_gradient` set them."""

    name = "lora-one"

    @classmethod
    def applies(cls, config) -> bool:
        return config.init == "lora-one"

    @classmethod
    def check_fits(cls, base, config) -> None:
        if config.init == "lora-one":
            check_rank(base, config, "gradient")

    def label(self, config) -> str:
        return "init=lora-one"

    @staticmethod
    def gradient_error(layer, name: str, gradient: torch.Tensor) -> str | None:
        """Why `init_from_gradient` cannot take ``gradient`` for adapter ``name`` of ``layer`` — None when it can."""
        weight, rank = layer.base_layer.weight, layer.adapters[name].rank
        if tuple(gradient.shape) != tuple(weight.shape):
            return f"the gradient has shape {tuple(gradient.shape)}, the weight {tuple(weight.shape)}"
        if not gradient.abs().max() > 0:
            return "the loss does not depend on its weight (zero gradient); leave it out of the targets"
        if rank > min(weight.shape[0], weight[0].numel()):
            return f"rank {rank} is above the {tuple(weight.shape)} weight's number of singular values"
        return None

    @classmethod
    def init_from_gradient(cls, layer, name: str, gradient: torch.Tensor, gamma: float) -> None:
        """Adapter ``name``'s factors from ``gradient`` (the loss's w.r.t. the base weight, its shape); then every
        variant's `after_factors` (DoRA's magnitude)."""
        why = cls.gradient_error(layer, name, gradient)
        if why:
            raise UserError(f"LoRA-One cannot initialise this layer: {why}")
        rank = layer.adapters[name].rank
        b, a = gradient_factors(promoted(-gradient.detach().flatten(1)), rank, gamma)
        lora_a, lora_b = layer.lora_A[name].weight, layer.lora_B[name].weight
        with torch.no_grad():
            lora_a.copy_(a.reshape(lora_a.shape))
            lora_b.copy_(b.reshape(lora_b.shape))
        for variant in layer.variants[name]:
            variant.after_factors(layer, name)

    @staticmethod
    def init_blocks_from_gradient(host, original: torch.Tensor, gradient: torch.Tensor, gamma: float) -> int:
        """Every block's factors from ``gradient`` (the loss's w.r.t. the stored base weight, its shape); returns how
        many blocks had a zero gradient and kept ELoRA's own init. Then the host's `after_block_factors`."""
        untouched = 0
        for i, (block, (a, _)) in enumerate(zip(host.blocks(-gradient.detach()), host.pairs())):
            if not block.abs().max() > 0:
                untouched += 1
                continue
            left, right = gradient_factors(promoted(block), a.shape[-1], gamma)
            host.set_factors(i, left.to(block.dtype), right.to(block.dtype))
        host.after_factors(original)
        return untouched

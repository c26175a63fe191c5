"""LIFT's principal weights: the entries of a weight that LIFT fine-tunes, chosen after rank reduction.

Paper: Liu et al., "LIFT the Veil for the Truth: Principal Weights Emerge after Rank Reduction for Reasoning-Focused
Supervised Fine-Tuning", ICML 2025 (code: zihanghliu/LIFT, ``src/sparseAdam.py``, mask type ``lift_sparse``). With
``W_r`` the best rank-``r`` approximation of a weight ``W`` (its top-r singular triplets; a convolution's kernel is
flattened to ``(out, in·K)``), the principal weights are the ``k`` entries of largest ``|W_r|``; LIFT trains only
those, and re-chooses them from the current weight every so many steps. The authors' ``k`` is the parameter count of
a LoRA of rank ``rank`` on that weight, ``min((out + in·K) · rank, out·in·K)`` (`lora_budget`).

This module holds the choice of the mask (`principal_mask`). The LIFT method itself — training only the masked
entries, re-choosing the mask during training, its adapter state — is not built yet.

Shapes:
    weight (out, in) or (out, in, *kernel) → mask of the same shape (bool).
"""

from __future__ import annotations

import torch

from workbench.errors import UserError


def lora_budget(weight: torch.Tensor, rank: int) -> int:
    """The authors' number of principal weights: a rank-``rank`` LoRA's parameters, ``(out + in·K) · rank``, at most
    every entry."""
    out, fan_in = weight.shape[0], weight[0].numel()
    return min((out + fan_in) * rank, out * fan_in)


def principal_mask(weight: torch.Tensor, rank: int, count: int) -> torch.Tensor:
    """The ``count`` entries of largest magnitude in the best rank-``rank`` approximation of ``weight``, as a bool
    mask of ``weight``'s shape (the SVD in float64 for float64 weights, else float32, as the authors' code).

    Args:
        weight: a linear ``(out, in)`` or convolution ``(out, in, *kernel)`` weight.
        rank: the approximation's rank (the authors' ``filter_rank``), 1 … ``min(out, in·K)``.
        count: how many entries the mask holds, 1 … ``weight.numel()`` (`lora_budget` gives the authors' choice).
    """
    largest = min(weight.shape[0], weight[0].numel()) if weight.dim() >= 2 else 0
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= largest:
        shape = tuple(weight.shape)
        raise UserError(f"LIFT rank must be an integer in 1..{largest} for a {shape} weight, got {rank!r}")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= weight.numel():
        raise UserError(f"LIFT count must be an integer in 1..{weight.numel()} (the weight's entries), got {count!r}")
    flat = weight.detach().flatten(1).to(torch.promote_types(weight.dtype, torch.float32))
    u, singular, vh = torch.linalg.svd(flat, full_matrices=False)
    approximation = (u[:, :rank] * singular[:rank]) @ vh[:rank]
    mask = torch.zeros(weight.numel(), dtype=torch.bool, device=weight.device)
    mask[approximation.abs().flatten().topk(count).indices] = True
    return mask.view(weight.shape)

"""LIFT's principal weights: the entries of a weight that LIFT fine-tunes, chosen after rank reduction.

Paper: Liu et al., "LIFT the Veil for the Truth: Principal Weights Emerge after Rank Reduction for Reasoning-Focused
Supervised Fine-Tuning", ICML 2025 (code: zihanghliu/LIFT, ``src/sparseAdam.py``, mask type ``lift_sparse``). With
``W_r`` the best rank-``r`` approximation of a weight ``W`` (its top-r singular triplets; a convolution's kernel is
flattened to ``(out, in·K)``), the principal weights are the ``k`` entries of largest ``|W_r|``; LIFT trains only
those, and re-chooses them from the current weight every so many steps. The authors' ``k`` is the parameter count of
a LoRA of rank ``rank`` on that weight, ``min((out + in·K) · rank, out·in·K)`` (`lora_budget`).

As plain PyTorch: `apply` freezes a model but its target weights, whose gradients a hook masks to the principal
entries (so Adam, without weight decay, moves those entries alone), and `update_masks` re-chooses the masks from the
current weights and, given the optimiser, drops the Adam moments of the entries that leave the mask (the authors'
sparse Adam keeps moments for masked entries only; entries that join start from zero moments). `remove` takes the
hooks and masks away. A workbench method around these (options, re-choice every ``update_interval`` steps inside the
trainer, registration) is not built yet.

Example::

    >>> model = lift.apply(model, targets=["conv"], rank=8, budget_rank=4)     # doctest: +SKIP
    >>> optimizer = torch.optim.Adam(p for p in model.parameters() if p.requires_grad)   # doctest: +SKIP
    >>> # ... every update_interval steps: lift.update_masks(model, optimizer) ...
    >>> plain = lift.remove(model)                                             # doctest: +SKIP

Shapes:
    weight (out, in) or (out, in, *kernel) → mask of the same shape (bool).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from workbench.adaptation.lora.model import target_names

from workbench.errors import UserError

#: The attribute of a model `apply` made: ``{module name: (rank, count, hook handle)}``.
STATE = "_lift"


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


def apply(
    model: nn.Module, targets: str | Sequence[str] | None = None, rank: int = 8, budget_rank: int = 8
) -> nn.Module:
    """Freeze ``model`` in place but its target weights, each of which trains only its principal entries; returns it.

    Args:
        model: any ``nn.Module``; its ``nn.Linear``, ``nn.Conv1d`` and ``nn.Conv2d`` layers can be targets.
        targets: declared target groups and/or fnmatch patterns over module names, as `workbench.adaptation.lora.apply`
            (None: every declared group).
        rank: the rank of the approximation the mask is chosen from (the authors' ``filter_rank``), at most each
            weight's ``min(out, in·K)``.
        budget_rank: the mask holds `lora_budget` ``(weight, budget_rank)`` entries (the authors' ``lora_rank``).

    Each target module gets a non-persistent bool buffer ``lift_mask`` (its weight's shape) and a gradient hook on
    its weight that multiplies the gradient by it. Train with an optimiser without weight decay (decay would move
    the other entries too).
    """
    if hasattr(model, STATE):
        raise UserError(f"this {type(model).__name__} already carries LIFT masks; lift.remove(model) first")
    if isinstance(budget_rank, bool) or not isinstance(budget_rank, int) or budget_rank < 1:
        raise UserError(f"LIFT budget_rank must be a positive integer, got {budget_rank!r}")
    modules = {name: model.get_submodule(name) for name in target_names(model, targets)}
    masks = {}
    for name, module in modules.items():
        try:
            masks[name] = principal_mask(module.weight, rank, lora_budget(module.weight, budget_rank))
        except UserError as error:
            raise UserError(f"LIFT target '{name}': {error}") from None
    model.requires_grad_(False)
    state = {}
    for name, module in modules.items():
        module.register_buffer("lift_mask", masks[name], persistent=False)
        module.weight.requires_grad_(True)
        handle = module.weight.register_hook(lambda grad, module=module: grad * module.lift_mask)
        state[name] = (rank, int(masks[name].sum()), handle)
    setattr(model, STATE, state)
    return model


def update_masks(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, float]:
    """Re-choose every mask from the current weights (the authors do so every ``update_interval`` steps); with the
    ``optimizer`` (Adam or AdamW), zero the moments ``exp_avg`` / ``exp_avg_sq`` of the entries that left their mask.
    Returns ``{module name: share of the new mask's entries that were in the old one}``."""
    state = getattr(model, STATE, None)
    if state is None:
        raise UserError(f"this {type(model).__name__} carries no LIFT masks (call lift.apply first)")
    kept = {}
    for name, (rank, count, _) in state.items():
        module = model.get_submodule(name)
        mask = principal_mask(module.weight, rank, count)
        kept[name] = float((mask & module.lift_mask).sum()) / count
        module.lift_mask.copy_(mask)
        moments = optimizer.state.get(module.weight, {}) if optimizer is not None else {}
        for key in ("exp_avg", "exp_avg_sq"):
            if key in moments:
                moments[key].mul_(mask)
    return kept


def remove(model: nn.Module) -> nn.Module:
    """Take `apply`'s hooks and masks away (the trained weights stay); returns the model."""
    for name, (_, _, handle) in getattr(model, STATE, {}).items():
        handle.remove()
        del model.get_submodule(name).lift_mask
    if hasattr(model, STATE):
        delattr(model, STATE)
    return model

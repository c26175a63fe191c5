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
hooks and masks away. The workbench method ``lift`` (`LIFT`) runs them inside the trainer: it re-chooses the masks
every ``update_interval`` optimiser steps through its stage's per-step hook and drops the moments that left at the
next optimiser step.

Example::

    >>> model = lift.apply(model, targets=["conv"], rank=8, budget_rank=4)     # doctest: +SKIP
    >>> optimizer = torch.optim.Adam(p for p in model.parameters() if p.requires_grad)   # doctest: +SKIP
    >>> # ... every update_interval steps: lift.update_masks(model, optimizer) ...
    >>> plain = lift.remove(model)                                             # doctest: +SKIP

Shapes:
    weight (out, in) or (out, in, *kernel) → mask of the same shape (bool).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import torch
from torch import nn
from workbench.adaptation.lora.method import HEAD_OPTION, TARGETS_OPTION
from workbench.adaptation.lora.model import target_names

from workbench.core.errors import UserError
from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.model import require
from workbench.core.options import Option
from workbench.core.registry import methods

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
        rank: the rank of the approximation the mask is chosen from (the authors' ``filter_rank``); a weight whose
            ``min(out, in·K)`` is smaller takes that (its whole rank: the mask is then its largest entries).
        budget_rank: the mask holds `lora_budget` ``(weight, budget_rank)`` entries (the authors' ``lora_rank``).

    Each target module gets a non-persistent bool buffer ``lift_mask`` (its weight's shape) and a gradient hook on
    its weight that multiplies the gradient by it. Train with an optimiser without weight decay (decay would move
    the other entries too).
    """
    if hasattr(model, STATE):
        raise UserError(f"this {type(model).__name__} already carries LIFT masks; lift.remove(model) first")
    if isinstance(budget_rank, bool) or not isinstance(budget_rank, int) or budget_rank < 1:
        raise UserError(f"LIFT budget_rank must be a positive integer, got {budget_rank!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise UserError(f"LIFT rank must be a positive integer, got {rank!r}")
    modules = {name: model.get_submodule(name) for name in target_names(model, targets)}
    masks, ranks = {}, {}
    for name, module in modules.items():
        ranks[name] = min(rank, module.weight.shape[0], module.weight[0].numel())
        try:
            masks[name] = principal_mask(module.weight, ranks[name], lora_budget(module.weight, budget_rank))
        except UserError as error:
            raise UserError(f"LIFT target '{name}': {error}") from None
    model.requires_grad_(False)
    state = {}
    for name, module in modules.items():
        module.register_buffer("lift_mask", masks[name], persistent=False)
        module.weight.requires_grad_(True)
        handle = module.weight.register_hook(lambda grad, module=module: grad * module.lift_mask)
        state[name] = (ranks[name], int(masks[name].sum()), handle)
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
    if optimizer is not None:
        mask_moments(model, optimizer)
    return kept


def mask_moments(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Zero the Adam moments ``exp_avg`` / ``exp_avg_sq`` of every target weight's entries outside its mask (the
    authors' sparse Adam holds moments for masked entries only)."""
    for name in getattr(model, STATE, {}):
        module = model.get_submodule(name)
        moments = optimizer.state.get(module.weight, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in moments:
                moments[key].mul_(module.lift_mask)


def remove(model: nn.Module) -> nn.Module:
    """Take `apply`'s hooks and masks away (the trained weights stay); returns the model."""
    for name, (_, _, handle) in getattr(model, STATE, {}).items():
        handle.remove()
        del model.get_submodule(name).lift_mask
    if hasattr(model, STATE):
        delattr(model, STATE)
    return model


@methods.register
class LIFT(Method):
    """LIFT (Liu et al., ICML 2025): sparse fine-tuning of each target weight's principal entries; the model's head
    trains in full (``--head train``, default) or stays frozen.

    `prepare`: `apply` with ``rank`` (the authors' ``filter_rank``) and ``budget_rank`` (the authors' ``lora_rank``:
    each mask holds as many entries as a LoRA of that rank has parameters, `lora_budget`) on the model's declared
    target groups (or ``targets``). Training: the stage's per-step hook re-chooses every mask from the current weights
    at global steps ``update_interval``, ``2·update_interval``, … (before that step's gradient, as the authors'
    ``update_interval``; they use 400, and 10 for Llama-3.2-3B), and the Adam moments of entries that left a mask are
    zeroed just before that step's optimiser update (the stage's ``before_step``). A resumed run re-chooses its masks
    at its first step (the masks are not in the checkpoint).
    The saved state is the target weights whole (their masked entries moved) and the head; `merge` takes the hooks
    away (the weights already hold the update). Runs with weight decay are refused (decay moves every entry).
    """

    name = "lift"
    description = "LIFT: sparse fine-tuning of the principal weights (top entries of a rank-r approximation)"
    needs_model = ("adapter_target_groups",)
    learning_rate = 2e-4  # the authors' rate for Llama-3.2 / Llama-2 (math)
    options = (
        Option("rank", int, 8, "rank of the approximation the principal weights are chosen from (filter rank)"),
        Option("budget_rank", int, 16, "each mask holds as many entries as a LoRA of this rank has parameters"),
        Option("update_interval", int, 400, "re-choose the masks every this many optimiser steps"),
        TARGETS_OPTION,
        HEAD_OPTION,
    )

    def __init__(self, **options: Any):
        super().__init__(**options)
        interval = self.config["update_interval"]
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise UserError(f"method 'lift': option --update-interval must be a positive integer, got {interval!r}")
        for name in ("rank", "budget_rank"):
            if self.config[name] < 1:
                raise UserError(f"method 'lift': option --{name.replace('_', '-')} must be a positive integer, got "
                                f"{self.config[name]}")  # fmt: skip
        self._first_step, self._rechosen = True, False

    def _targets(self) -> list[str] | None:
        return [entry.strip() for entry in self.config["targets"].split(",") if entry.strip()] or None

    def check(self, task, data, model: nn.Module) -> None:
        """The model declares target groups (and a head with ``--head train``, none of the targets in it); the targets
        exist."""
        super().check(task, data, model)
        targets = target_names(model, self._targets())
        if self.config["head"] == "train":
            head = require(model, self.name, "head").head
            inside = [name for name in targets if name == head or name.startswith(head + ".")]
            if inside:
                raise UserError(
                    f"method 'lift': target '{inside[0]}' is in the head '{head}', which --head train trains in full; "
                    "use --head frozen or leave it out of --targets"
                )

    def prepare(self, model: nn.Module) -> nn.Module:
        apply(model, self._targets(), self.config["rank"], self.config["budget_rank"])
        if self.config["head"] == "train":
            head = require(model, self.name, "head").head
            targets = {f"{name}.weight" for name in getattr(model, STATE)}
            for name, p in model.get_submodule(head).named_parameters(prefix=head):
                if name in targets:
                    remove(model)
                    raise UserError(
                        f"method 'lift': target '{name.removesuffix('.weight')}' is in the head '{head}', which "
                        "--head train trains in full; use --head frozen or leave it out of --targets"
                    )
                p.requires_grad_(True)
        self._first_step, self._rechosen = True, False
        return model

    def plan(self, task, model: nn.Module, data, inputs: PlanInputs) -> list[Stage]:
        if inputs.settings.weight_decay:
            raise UserError(
                f"method 'lift': weight decay ({inputs.settings.weight_decay}) would move the entries outside the "
                "principal masks; train with weight decay 0"
            )
        loss = functools.partial(self.loss, task)
        return [Stage("train", data.train, data.val, inputs.settings, loss, gradients=self.step_hook,
                      before_step=self.before_step)]  # fmt: skip

    def step_hook(self, model: nn.Module, batch: Any, step: int) -> None:
        """Before global step ``step``'s gradient: re-choose the masks at multiples of ``update_interval`` (and at the
        first step of a resumed run), so that the gradient is masked by the new ones. Returns None: the trainer takes
        the gradient of the loss as usual."""
        first, self._first_step = self._first_step, False
        self._rechosen = not (step == 0 or (step % self.config["update_interval"] and not first))
        if self._rechosen:
            update_masks(model)
        return None

    def before_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
        """Before the optimizer steps: after a re-choice, zero the Adam moments of the entries that left the masks
        (the authors' sparse Adam keeps moments for the masked entries only)."""
        if self._rechosen:
            mask_moments(model, optimizer)

    def diagnostics(self, task, model: nn.Module, data) -> dict[str, float]:
        """``principal_entries``: how many weight entries the masks let train (``trainable_parameters`` counts the
        target weights whole)."""
        return {"principal_entries": float(sum(count for _, count, _ in getattr(model, STATE, {}).values()))}

    def merge(self, model: nn.Module) -> nn.Module:
        return remove(model)

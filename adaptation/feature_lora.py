"""Plain LoRA on an equivariant potential: the non-equivariant control for ELoRA.

Paper: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022, applied as a generic LoRA library
would apply it to an e3nn network: every ``e3nn.o3.Linear`` is read as a dense map of its flat feature vector, and
gets ``y = Linear(x) + (alpha / r) · x Aᵀ Bᵀ`` with ``A (r, d_in)`` Kaiming-uniform and ``B (d_out, r)`` zero (PEFT's
init), ``d`` the irreps' dimension (``Σ mul · (2l + 1)``). The update mixes the components of different ``l`` (and the
``m`` components of one irrep), so the adapted model is no longer rotation-equivariant once ``B ≠ 0`` — which is what
ELoRA's per-path updates avoid (`workbench.adaptation.elora`, whose tests and ``tests/test_sevennet.py`` measure it).

A dense update of the flat features has no place in e3nn's per-path weights: `merge` replaces each adapted layer by
`DenseUpdate`, the frozen layer plus the fixed product ``ΔW = (alpha / r) · Aᵀ Bᵀ``.

Shapes:
    x ``(n_nodes, d_in)`` -> ``(n_nodes, d_out)``.
"""

from __future__ import annotations

import math

import torch
from e3nn import o3
from torch import nn

from workbench.errors import UserError
from workbench.method import Method
from workbench.options import Option
from workbench.registry import methods


class FeatureLowRank(nn.Module):
    """``base_layer(x) + scale · x Aᵀ Bᵀ`` around a frozen ``o3.Linear`` (module doc)."""

    def __init__(self, base_layer: o3.Linear, rank: int, alpha: float):
        super().__init__()
        self.base_layer = base_layer.requires_grad_(False)
        weight = base_layer.weight
        d_in, d_out = base_layer.irreps_in.dim, base_layer.irreps_out.dim
        self.lora_A = nn.Parameter(torch.empty(rank, d_in, dtype=weight.dtype, device=weight.device))
        self.lora_B = nn.Parameter(torch.zeros(d_out, rank, dtype=weight.dtype, device=weight.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank

    def delta(self) -> torch.Tensor:
        """``ΔW (d_in, d_out)``: the update as a matrix acting on row vectors."""
        return self.scale * self.lora_A.T @ self.lora_B.T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.scale * (x @ self.lora_A.T) @ self.lora_B.T


class DenseUpdate(nn.Module):
    """A merged `FeatureLowRank`: ``base_layer(x) + x ΔW`` with ``ΔW (d_in, d_out)`` fixed (a buffer)."""

    def __init__(self, base_layer: o3.Linear, delta: torch.Tensor):
        super().__init__()
        self.base_layer = base_layer
        self.register_buffer("delta", delta.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + x @ self.delta


def _replace(model: nn.Module, kind: type, build) -> int:
    """Replace every submodule of ``kind`` by ``build(module)``, in place; returns how many."""
    found = [(name, module) for name, module in model.named_modules() if isinstance(module, kind)]
    for name, module in found:
        parent_name, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attribute, build(module))
    return len(found)


def apply(model: nn.Module, rank: int = 16, alpha: float = 16.0) -> nn.Module:
    """Wrap every ``o3.Linear`` of ``model`` in a `FeatureLowRank`, freeze everything else; returns ``model``."""
    model.requires_grad_(False)
    if not _replace(model, o3.Linear, lambda layer: FeatureLowRank(layer, rank, alpha)):
        raise UserError(f"{type(model).__name__} has no e3nn o3.Linear layer: feature-space LoRA does not fit it")
    return model


def merge(model: nn.Module) -> nn.Module:
    """Replace every `FeatureLowRank` by its `DenseUpdate`; returns ``model``."""
    _replace(model, FeatureLowRank, lambda layer: DenseUpdate(layer.base_layer, layer.delta()))
    return model


@methods.register
class FeatureLoRA(Method):
    """Plain (non-equivariant) LoRA on every e3nn ``o3.Linear`` (module doc): the control ELoRA is measured against."""

    name = "feature-lora"
    description = "Plain LoRA across the flat irreps features of every e3nn Linear: not equivariant (ELoRA's control)"
    model_families = ("mace", "sevennet")
    learning_rate = 5e-3  # ELoRA's (the authors' lr for every method)
    options = (
        Option("rank", int, 16, "LoRA rank r of every update"),
        Option("alpha", float, 16.0, "LoRA scale alpha (updates are multiplied by alpha / rank)"),
    )

    def __init__(self, **options):
        """The options, checked before any model is seen."""
        super().__init__(**options)
        if self.config["rank"] < 1 or not self.config["alpha"] > 0:
            raise UserError(f"method 'feature-lora': --rank must be a positive integer and --alpha positive, got "
                            f"{self.config['rank']} and {self.config['alpha']}")  # fmt: skip

    def prepare(self, model: nn.Module) -> nn.Module:
        return apply(model, rank=self.config["rank"], alpha=self.config["alpha"])

    def merge(self, model: nn.Module) -> nn.Module:
        return merge(model)

"""Plain LoRA on an equivariant potential: the non-equivariant control for ELoRA.

Paper: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022, applied as a generic LoRA library
would apply it to an e3nn network: every ``e3nn.o3.Linear`` is read as a dense map of its flat feature vector, and
gets ``y = Linear(x) + (alpha / r) · x Aᵀ Bᵀ`` with ``A (r, d_in)`` Kaiming-uniform and ``B (d_out, r)`` zero (PEFT's
init), ``d`` the irreps' dimension (``Σ mul · (2l + 1)``). The update mixes the components of different ``l`` (and the
``m`` components of one irrep), so the adapted model is no longer rotation-equivariant once ``B ≠ 0`` — which is what
ELoRA's per-path updates avoid (`workbench.adaptation.elora`, whose tests and ``tests/test_sevennet.py`` measure it).

The update is the project's one LoRA mechanism, `workbench.adaptation.lora.layer.LoraLayer` (its factors, init,
scale and ``ΔW``), adapting a stand-in ``nn.Linear(d_in, d_out)`` whose weight is a zero buffer: the frozen
``o3.Linear`` computes the base output, the `LoraLayer` only its update (``LoraLayer.update``). The factors are
``<layer>.lora.lora_A.default.weight (r, d_in)`` and ``<layer>.lora.lora_B.default.weight (d_out, r)``.

A dense update of the flat features has no place in e3nn's per-path weights: `merge` folds each update into its
stand-in's zero weight (``LoraLayer.merge``) and replaces the adapted layer by `DenseUpdate`, the frozen layer plus
that fixed ``ΔW = (alpha / r) · B A`` (a buffer, ``(d_out, d_in)``).

Shapes:
    x ``(n_nodes, d_in)`` -> ``(n_nodes, d_out)``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

import torch
from e3nn import o3
from torch import nn
from workbench.adaptation.lora.config import AdapterConfig
from workbench.adaptation.lora.layer import DEFAULT, LoraLayer

from workbench.core.errors import UserError
from workbench.core.method import Method
from workbench.core.options import Option
from workbench.core.registry import methods


def _dense_carrier(layer: o3.Linear) -> nn.Linear:
    """An ``nn.Linear(d_in, d_out)`` without bias whose weight is a zero buffer: what `LoraLayer` adapts (the update's
    shapes, dtype and device; its merge folds ``ΔW`` into that weight). No random draw, and no parameter to count."""
    dense = nn.Linear(layer.irreps_in.dim, layer.irreps_out.dim, bias=False, device="meta")
    del dense.weight
    dense.register_buffer("weight", layer.weight.new_zeros(layer.irreps_out.dim, layer.irreps_in.dim))
    return dense


class FeatureLowRank(nn.Module):
    """``base_layer(x) + scale · B A x`` around a frozen ``o3.Linear`` (module doc): ``lora``, a `LoraLayer` on a dense
    carrier (`_dense_carrier`), computes the update; its carrier's zero weight is never multiplied."""

    def __init__(self, base_layer: o3.Linear, rank: int, alpha: float):
        super().__init__()
        self.base_layer = base_layer.requires_grad_(False)
        self.lora = LoraLayer(_dense_carrier(base_layer), AdapterConfig(rank, alpha))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora.update(DEFAULT, x)


class DenseUpdate(nn.Module):
    """A merged `FeatureLowRank`: ``base_layer(x) + dense(x)``, ``dense`` the carrier holding ``ΔW`` (a buffer)."""

    def __init__(self, base_layer: o3.Linear, dense: nn.Linear):
        super().__init__()
        self.base_layer, self.dense = base_layer, dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.dense(x)


#: A factor's name in files written before the update was a `LoraLayer`.
_OLD_NAME = re.compile(r"\.lora_([AB])$")


def _replace(model: nn.Module, kind: type, build) -> int:
    """Replace every submodule of ``kind`` by ``build(module)``, in place; returns how many."""
    found = [(name, module) for name, module in model.named_modules() if isinstance(module, kind)]
    for name, module in found:
        parent_name, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attribute, build(module))
    return len(found)


def _merged(layer: FeatureLowRank) -> DenseUpdate:
    layer.lora.merge()  # LoraLayer's W ← W + ΔW on the carrier's zero weight
    return DenseUpdate(layer.base_layer, layer.lora.base_layer)


def apply(model: nn.Module, rank: int = 16, alpha: float = 16.0) -> nn.Module:
    """Wrap every ``o3.Linear`` of ``model`` in a `FeatureLowRank`, freeze everything else; returns ``model``."""
    model.requires_grad_(False)
    if not _replace(model, o3.Linear, lambda layer: FeatureLowRank(layer, rank, alpha)):
        raise UserError(f"{type(model).__name__} has no e3nn o3.Linear layer: feature-space LoRA does not fit it")
    return model


def merge(model: nn.Module) -> nn.Module:
    """Replace every `FeatureLowRank` by its `DenseUpdate`; returns ``model``."""
    _replace(model, FeatureLowRank, _merged)
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

    def load_trainable_state(
        self, model: nn.Module, state: Mapping[str, torch.Tensor], source: str | Path = "<state>"
    ) -> None:
        """`Method.load_trainable_state`, reading too the names files had before the update was a `LoraLayer`
        (``<layer>.lora_A`` / ``<layer>.lora_B``, the same shapes)."""
        renamed = {_OLD_NAME.sub(r".lora.lora_\1.default.weight", name): value for name, value in state.items()}
        super().load_trainable_state(model, renamed, source)

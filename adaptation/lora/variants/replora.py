"""RepLoRA (``reparam="replora"``): the factors the layer computes with come out of a light MLP of trained factors.

Paper: Truong et al., "RepLoRA: Reparameterizing Low-Rank Adaptation via the Perspective of Mixture of Experts",
ICML 2025. This workbench's reading of the abstract (the paper's width, activation and sharing were not available to
check): one MLP per adapter over the rank axis, its first layer ``H (r, r)`` shared by both factors, output layers
``P_A, P_B (r, r)`` their own, no biases, GELU between; with ``Â``, ``B̂`` the free factors
(flattened to ``(r, in·K)`` and ``(out, r)``)::

    A = P_A gelu(H Â),        B = gelu(B̂ Hᵀ) P_Bᵀ,        ΔW = scale · B A

``H``, ``P_A``, ``P_B`` start Kaiming-uniform (``a = sqrt(5)``, a linear layer's default), after the factors. On a
layer the MLP is ``lora_reparam[name]`` (``hidden``, ``A``, ``B``; saved with the adapter); on ELoRA's blocks each
block has its own (``reparam[i]``), ELoRA's ``A_i (rows, r)`` playing LoRA's ``B`` and ``B_i (r, cols)`` LoRA's ``A``.
`merge` adds ``ΔW`` of the MLP's factors: the merged model carries no MLP. Not defined with an init that sets the
factors (PiSSA, LoRA-One) or with DoRA (the MLP would change what they set or rescale): refused.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import skip_init
from workbench.adaptation.lora.variants.base import LoraVariant

from workbench.core.errors import UserError


class Reparam(nn.Module):
    """RepLoRA's MLP of one adapter's free factors: ``hidden`` shared, ``A`` and ``B`` per factor, each a bias-free
    ``(r, r)`` linear layer (uninitialised: `RepLoRA` draws them)."""

    def __init__(self, rank: int, like: torch.Tensor):
        super().__init__()
        factory = {"dtype": like.dtype, "device": like.device}
        self.hidden, self.A, self.B = (skip_init(nn.Linear, rank, rank, bias=False, **factory) for _ in range(3))

    def factors(self, free_a: torch.Tensor, free_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, B)`` in the free factors' shapes: ``A = P_A gelu(H Â)``, ``B = gelu(B̂ Hᵀ) P_Bᵀ``.

        Shapes: free_a (r, in, *kernel), free_b (out, r, *ones) → the same."""
        a = self.A(F.gelu(self.hidden(free_a.flatten(1).T))).T
        b = self.B(F.gelu(self.hidden(free_b.flatten(1))))
        return a.reshape(free_a.shape), b.reshape(free_b.shape)


def _draw(mlps: nn.Module) -> None:
    """Kaiming-uniform every linear layer of ``mlps``, in module order."""
    for module in mlps.modules():
        if isinstance(module, nn.Linear):
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))


class RepLoRA(LoraVariant):
    """The factors through `Reparam` (module doc)."""

    name = "replora"
    transforms_factors = True

    @classmethod
    def applies(cls, config) -> bool:
        return config.reparam == "replora"

    @classmethod
    def check(cls, config) -> None:
        if config.reparam == "replora" and (config.init != "kaiming" or config.dora):
            other = f"init={config.init!r}" if config.init != "kaiming" else "dora=True"
            raise UserError(
                f"LoRA reparam='replora' with {other} is not defined (RepLoRA's MLP would change the factors that "
                "option sets or rescales); use reparam='none' or init='kaiming' without dora"
            )

    def label(self, config) -> str:
        return "reparam=replora"

    def add(self, layer, name, config) -> None:
        layer.lora_reparam[name] = Reparam(config.rank, layer.base_layer.weight)

    def init_parameters(self, layer, name) -> None:
        _draw(layer.lora_reparam[name])

    def factors(self, layer, name, a, b):
        return layer.lora_reparam[name].factors(a, b)

    def add_to_blocks(self, host) -> None:
        pairs = host.pairs()
        host.reparam = nn.ModuleList(Reparam(b.shape[0], pairs[0][1]) for _, b in pairs)
        _draw(host.reparam)

    def block_factors(self, host, pairs):
        out = []
        for (a, b), mlp in zip(pairs, host.reparam):
            b_used, a_used = mlp.factors(b, a)  # LoRA's (A, B) roles: ELoRA's B is LoRA's A (r, in), A is B (out, r)
            out.append((a_used, b_used))
        return out

"""Token-routed experts (``kind="hlora"`` / ``"moelora"``): ``k`` low-rank experts weighed token by token.

H-LoRA (HealthGPT, seed 000; METHODS.md "H-LoRA"): ``k`` experts of ``r / k`` ranks each fused in one ``A``/``B`` pair,
weighed by the router ``lora_route[name] = Linear(in, k)``::

    hlora:    scale · B (repeat_interleave(softmax(R x), r / k) ⊙ A (dropout(x))),      scale = alpha / r · k
    moelora:  scale · Σ_e softmax(R x)_e · B_e (A_e (dropout(x)))

H-LoRA equals the MoELoRA loop with ``A_e`` the rows ``e·r/k … (e+1)·r/k − 1`` of ``A`` and ``B_e`` the same columns
of ``B``, at one matmul pair instead of ``k``; MoELoRA's ``lora_A[name]`` / ``lora_B[name]`` are ``nn.ModuleList`` s
of ``k`` experts (``in → r/k → out``). ``scale = alpha / r · k`` follows the authors' code. The router reads the
undropped input and starts Kaiming-uniform after the factors. Routed kinds adapt ``nn.Linear`` layers only, take
plain LoRA's other options at their defaults, compute the input way and cannot be merged.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn
from torch.nn.utils import skip_init
from workbench.adaptation.lora.variants.base import LoraVariant

from workbench.core.errors import UserError

#: The options of plain LoRA adapters with their defaults, which routed kinds leave as they are (unless ``free``).
PLAIN_OPTIONS = (("init", "kaiming"), ("scaling", "standard"), ("dora", False), ("reparam", "none"))


class Routed(LoraVariant):
    """What every routed kind shares: router, checks, scale ``alpha / r · k``, no merged form."""

    routed = True
    #: The plain-LoRA options this kind takes at other values than their defaults.
    free: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def applies(cls, config) -> bool:
        return config.kind == cls.name

    @classmethod
    def check(cls, config) -> None:
        if config.kind != cls.name:
            return
        for option, default in PLAIN_OPTIONS:
            if option not in cls.free and getattr(config, option) != default:
                raise UserError(
                    f"LoRA {option}={getattr(config, option)!r} is an option of plain LoRA adapters, not of "
                    f"{config.kind} adapters; leave {option} at {default!r}"
                )
        experts = config.experts
        if isinstance(experts, bool) or not isinstance(experts, int) or experts < 1:
            raise UserError(f"a {config.kind} adapter needs a positive number of experts, got {experts!r}")
        if config.rank % experts:
            raise UserError(
                f"{config.kind} adapter: rank {config.rank} must be a multiple of experts {experts} (each expert "
                "holds rank / experts ranks)"
            )
        if config.compute == "weight":
            raise UserError("routed experts (H-LoRA) depend on the input: they cannot be computed in weight space")

    @classmethod
    def check_fits(cls, base, config) -> None:
        if config.kind == cls.name and not isinstance(base, nn.Linear):
            raise UserError(
                f"routed LoRA experts ({config.kind}) adapt nn.Linear layers, not {type(base).__name__}; leave this "
                "module out of the targets"
            )

    def scale(self, config, fan_in, scale: float) -> float:
        return scale * config.experts

    def label(self, config) -> str:
        return ""

    def add(self, layer, name, config) -> None:
        base = layer.base_layer
        layer.lora_route[name] = skip_init(
            nn.Linear, base.in_features, config.experts, bias=False, dtype=base.weight.dtype, device=base.weight.device
        )

    def init_parameters(self, layer, name) -> None:
        nn.init.kaiming_uniform_(layer.lora_route[name].weight, a=math.sqrt(5))  # the router as a linear layer's

    def gates(self, layer, name: str, x: torch.Tensor) -> torch.Tensor:
        """The router's weights of each expert, ``(..., k)``."""
        return torch.softmax(layer.lora_route[name](x), dim=-1)

    def merge_error(self, layer, name) -> str | None:
        return (
            f"its {layer.adapters[name].kind} adapter '{name}' computes an input-dependent update, which no fixed "
            "weight represents; keep it unmerged (the model runs as it is)"
        )


class HLoRA(Routed):
    """H-LoRA's fused experts: one ``A``/``B`` pair, the gates repeated over each expert's ranks."""

    name = "hlora"

    def update(self, layer, name, x, base):
        config = layer.adapters[name]
        gates = self.gates(layer, name, x).repeat_interleave(config.rank // config.experts, dim=-1)
        return layer.lora_B[name](gates * layer.lora_A[name](layer.lora_dropout[name](x))) * layer.scales[name]


class MoELoRA(Routed):
    """MoELoRA's looped experts: ``k`` ``A_e``/``B_e`` pairs, one matmul pair each."""

    name = "moelora"

    def factor_modules(self, base, config, make):
        per_expert = config.rank // config.experts
        return (
            nn.ModuleList(make(base, per_expert)[0] for _ in range(config.experts)),
            nn.ModuleList(make(base, per_expert)[1] for _ in range(config.experts)),
        )

    def update(self, layer, name, x, base):
        return self.expert_sum(layer, name, x, self.gates(layer, name, x))

    @staticmethod
    def expert_sum(layer, name: str, x: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """``scale · Σ_e gates_e · B_e (A_e (dropout(x)))``."""
        dropped, total = layer.lora_dropout[name](x), 0
        for expert, (a_e, b_e) in enumerate(zip(layer.lora_A[name], layer.lora_B[name])):
            total = total + gates[..., expert : expert + 1] * b_e(a_e(dropped))
        return total * layer.scales[name]

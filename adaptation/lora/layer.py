"""The LoRA layer: a frozen ``nn.Linear`` / ``nn.Conv1d`` / ``nn.Conv2d`` plus a trainable low-rank path.

Paper: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022. Layout and names as HF PEFT's
``peft.tuners.lora.layer`` (one adapter per layer, so no adapter-name level): the wrapped layer is kept whole as
``base_layer`` and the factors are modules ``lora_A`` and ``lora_B``, so parameters are named
``<module>.base_layer.weight``, ``<module>.lora_A.weight``, ``<module>.lora_B.weight`` as in PEFT's files.

For a base layer ``W`` (bias ``b``) and input ``x``::

    y = W x + b + (alpha / r) · B (A (dropout(x)))

* linear: ``A = Linear(in, r)``, ``B = Linear(r, out)`` (no biases): ``ΔW = B A``;
* convolution: ``A`` is a convolution of the base layer's kernel, stride, padding, dilation and padding mode into
  ``r`` channels and ``B`` a 1×1 convolution back to ``out`` (PEFT's factorisation; PEFT leaves out dilation and
  padding mode, which makes its merge inexact for such layers). The composition is one convolution of weight
  ``ΔW[o, i, k] = Σ_j B[o, j] A[j, i, k]``, so the merge is exact. Grouped convolutions are refused.

Initialisation as PEFT's (and loralib's): ``A`` Kaiming-uniform with ``a = sqrt(5)`` (the default of a linear
layer's weight, fan-in ``in·K``), ``B = 0``, so the adapted layer starts equal to the base layer. Dropout acts on
the adapter's input only; the base path never sees it.

Two ways to compute the same function (``compute``):

* ``"input"`` (default, PEFT's): ``base_layer(x) + scale · B(A(dropout(x)))`` — the adapter's activations
  (``A``'s and ``B``'s outputs) are extra memory, its backward never forms a weight-sized gradient;
* ``"weight"`` (loralib's ``ConvLoRA``; the ``htuning`` method's): the base layer's own operation with ``W + ΔW``, one
  convolution or matmul — no adapter activations and one op instead of three (cheaper for convolutions over long
  signals), but a weight-sized ``ΔW`` and gradient per layer (costly for large linear layers). Dropout cannot act
  in weight space: while the adapter's dropout is active (training with ``dropout > 0``) the layer computes the
  input way. Only stock ``nn.Linear``/``nn.Conv1d``/``nn.Conv2d`` base layers (not subclasses, whose forward may
  differ), and not routed layers.

`RoutedLoraLayer` (H-LoRA) overrides one hook, `LoraLayer.update`, and is not mergeable.

Shapes:
    linear: x (..., in) → (..., out); ``lora_A.weight (r, in)``, ``lora_B.weight (out, r)``.
    conv: x (batch, in, *spatial) → (batch, out, *spatial'); ``lora_A.weight (r, in, *kernel)``,
    ``lora_B.weight (out, r, 1, ...)``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize, skip_init
from workbench.adaptation.lora.config import COMPUTES

from workbench.errors import UserError

#: The layer types LoRA wraps.
SUPPORTED = (nn.Linear, nn.Conv1d, nn.Conv2d)


class LoraLayer(nn.Module):
    """``base_layer(x) + (alpha / r) · lora_B(lora_A(dropout(x)))`` around a frozen linear or conv layer.

    Args:
        base_layer: the ``nn.Linear``, ``nn.Conv1d`` or ``nn.Conv2d`` to adapt (kept as is, as ``base_layer``).
        rank: LoRA rank ``r``.
        alpha: scale numerator; the update is multiplied by ``scale = alpha / rank``.
        dropout: dropout probability on the adapter's input (default 0: none).
        compute: ``"input"`` (default, PEFT's) or ``"weight"`` (fold ``ΔW`` into the weight on each forward).

    Shapes:
        see the module docstring.
    """

    #: Whether the update is a fixed ``ΔW`` that `merge` can fold into the base weight.
    mergeable: ClassVar[bool] = True

    def __init__(self, base_layer: nn.Module, rank: int, alpha: float, dropout: float = 0.0, compute: str = "input"):
        super().__init__()
        if not isinstance(base_layer, SUPPORTED):
            raise UserError(
                f"LoRA adapts nn.Linear, nn.Conv1d and nn.Conv2d layers, not {type(base_layer).__name__}; "
                "leave this module out of the targets"
            )
        if isinstance(base_layer, (nn.Conv1d, nn.Conv2d)) and base_layer.groups != 1:
            raise UserError(
                f"LoRA on a grouped convolution ({type(base_layer).__name__} with groups={base_layer.groups}) is not "
                "supported; leave this module out of the targets"
            )
        if rank < 1:
            raise UserError(f"LoRA rank must be a positive integer, got {rank}")
        if compute not in COMPUTES:
            raise UserError(f"LoRA compute must be one of {COMPUTES}, got {compute!r}")
        if compute == "weight" and (_stock_class(base_layer) not in SUPPORTED or not self.mergeable):
            raise UserError(
                f"compute='weight' runs the stock layer's operation with W + ΔW, which a {type(self).__name__} of a "
                f"{type(base_layer).__name__} cannot; use compute='input'"
            )
        self.compute = compute
        self.base_layer = base_layer
        self.rank = int(rank)
        self.alpha = float(alpha)
        self.scale = self.alpha / self.rank
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.lora_A, self.lora_B = _factors(base_layer, self.rank)
        self.merged = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``A`` Kaiming-uniform (``a = sqrt(5)``), ``B = 0``: the layer starts equal to its base layer."""
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def update(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter's contribution ``(alpha / r) · B(A(dropout(x)))`` — the hook variants override."""
        return self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.merged:
            return self.base_layer(x)
        if self.compute == "weight" and not (self.training and isinstance(self.lora_dropout, nn.Dropout)):
            weight = self.base_layer.weight + self.delta_weight()
            if isinstance(self.base_layer, nn.Linear):
                return F.linear(x, weight, self.base_layer.bias)
            return self.base_layer._conv_forward(x, weight, self.base_layer.bias)
        return self.base_layer(x) + self.update(x)

    @property
    def weight(self) -> torch.Tensor:
        """The weight the layer computes with, ``W + ΔW`` (``W`` once merged), for models that read ``module.weight``
        and call ``F.linear`` / ``F.conv*`` themselves (braindecode's ``Labram`` does so for its fused ``qkv``): the
        update then acts in weight space there. Adapter dropout cannot act in weight space, so reading the weight
        while it is active (training with ``dropout > 0``) is refused, as it is for a routed layer."""
        if self.merged:
            return self.base_layer.weight
        if not self.mergeable or (self.training and isinstance(self.lora_dropout, nn.Dropout)):
            raise UserError(
                f"the model reads the weight of a {type(self).__name__} directly (it calls F.linear or F.conv itself), "
                "where an input-dependent update or adapter dropout cannot act; set the LoRA dropout to 0 for this "
                "target, or leave it out of the targets"
            )
        return self.base_layer.weight + self.delta_weight()

    @property
    def bias(self) -> torch.Tensor | None:
        """The base layer's bias (LoRA adds none)."""
        return self.base_layer.bias

    def delta_weight(self) -> torch.Tensor:
        """``ΔW = (alpha / r) · B A`` in the base weight's shape (what `merge` adds)."""
        b, a = self.lora_B.weight.flatten(1), self.lora_A.weight.flatten(1)
        return (b @ a).reshape(self.base_layer.weight.shape) * self.scale

    def merge_error(self) -> str | None:
        """Why `merge` cannot fold this layer (None when it can)."""
        if not self.mergeable:
            return (
                f"{type(self).__name__} computes an input-dependent update, which no fixed weight represents; keep "
                "it unmerged (the model runs as it is)"
            )
        if parametrize.is_parametrized(self.base_layer, "weight"):
            kinds = ", ".join(type(p).__name__ for p in self.base_layer.parametrizations.weight)
            return (
                f"its base weight is computed by a parametrization LoRA did not create ({kinds}), into which ΔW cannot "
                "be folded exactly; leave this module out of the targets, or fold that parametrization first "
                "(torch.nn.utils.parametrize.remove_parametrizations(module, 'weight', leave_parametrized=True))"
            )
        return None

    def merge(self) -> None:
        """``W ← W + ΔW``; the forward then runs the base layer alone (PEFT's ``merge``). No-op when merged."""
        if self.merged:
            return
        why = self.merge_error()
        if why:
            raise UserError(f"cannot merge this LoRA layer: {why}")
        with torch.no_grad():
            weight = self.base_layer.weight
            weight.add_(self.delta_weight().to(weight.dtype))
        self.merged = True

    def unmerge(self) -> None:
        """``W ← W − ΔW`` (PEFT's ``unmerge``; equal to the base weight up to rounding). No-op when not merged."""
        if not self.merged:
            return
        with torch.no_grad():
            weight = self.base_layer.weight
            weight.sub_(self.delta_weight().to(weight.dtype))
        self.merged = False

    def adapter_parameters(self) -> list[nn.Parameter]:
        """The adapter's own parameters, in registration order (``lora_A``, ``lora_B``, then any variant's)."""
        return [p for name, p in self.named_parameters() if not name.startswith("base_layer.")]

    def extra_repr(self) -> str:
        state = f"compute={self.compute}, merged={self.merged}"
        return f"rank={self.rank}, alpha={self.alpha:g}, scale={self.scale:g}, {state}"


class RoutedLoraLayer(LoraLayer):
    """H-LoRA's token-routed experts inside one ``A``/``B`` pair (HealthGPT, seed 000; METHODS.md "H-LoRA").

    A router ``R: in → k`` weighs ``k`` experts of ``r / k`` ranks each, token by token, in one matmul pair::

        y = W x + b + scale · B (repeat_interleave(softmax(R x), r / k) ⊙ A (dropout(x))),  scale = alpha / r · k

    which equals a loop over ``k`` MoELoRA experts ``Σ_e g_e(x) · scale · B_e A_e x`` with ``A_e`` the rows
    ``e·r/k … (e+1)·r/k − 1`` of ``A`` and ``B_e`` the same columns of ``B``. ``scale = alpha / r · k`` follows the
    authors' code (their paper's Eq. 9 differs). The router is ``lora_route = Linear(in, k, bias=False)``,
    Kaiming-uniform like ``A`` (drawn after ``A``); ``B = 0``, so the layer starts equal to its base layer. The
    router reads the undropped input; dropout acts on ``A``'s input as in every layer of this package (METHODS.md
    notes the authors apply it after ``A``; with dropout 0 the two agree). The update depends on the input, so
    the layer cannot be merged. Only ``nn.Linear`` layers are routed (as H-LoRA's language-model layers are).

    Args:
        base_layer: the ``nn.Linear`` to adapt.
        rank: total rank ``r``, a multiple of ``experts``.
        alpha: scale numerator.
        dropout: dropout probability on ``A``'s input (default 0).
        experts: number of experts ``k`` (default 4, the authors').

    Shapes:
        x (..., in) → (..., out); ``lora_route.weight (k, in)``, ``lora_A.weight (r, in)``, ``lora_B.weight (out, r)``.
    """

    mergeable = False

    def __init__(self, base_layer: nn.Module, rank: int, alpha: float, dropout: float = 0.0, experts: int = 4):
        if not isinstance(base_layer, nn.Linear):
            raise UserError(
                f"routed LoRA experts (H-LoRA) adapt nn.Linear layers, not {type(base_layer).__name__}; leave this "
                "module out of the targets"
            )
        if experts < 1 or rank % experts:
            raise UserError(f"routed LoRA: rank {rank} must be a positive multiple of experts {experts}")
        super().__init__(base_layer, rank, alpha, dropout)
        self.experts = int(experts)
        weight = base_layer.weight
        self.lora_route = skip_init(
            nn.Linear, base_layer.in_features, self.experts, bias=False, dtype=weight.dtype, device=weight.device
        )
        nn.init.kaiming_uniform_(self.lora_route.weight, a=math.sqrt(5))
        self.scale = self.alpha / self.rank * self.experts

    def update(self, x: torch.Tensor) -> torch.Tensor:
        return routed_update(x, self.lora_route, self.lora_A, self.lora_B, self.lora_dropout) * self.scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, experts={self.experts}"


def routed_update(
    x: torch.Tensor, route: nn.Linear, lora_a: nn.Linear, lora_b: nn.Linear, dropout: nn.Module
) -> torch.Tensor:
    """H-LoRA's unscaled update ``B (repeat_interleave(softmax(R x), r / k) ⊙ A (dropout(x)))`` — ``k`` experts of
    ``r / k`` ranks in one matmul pair (`RoutedLoraLayer`, the ``"hlora"`` plug-ins of
    `workbench.adaptation.lora.plugins`). Shapes: x (..., in) → (..., out)."""
    rank, experts = lora_a.out_features, route.out_features
    gates = torch.softmax(route(x), dim=-1).repeat_interleave(rank // experts, dim=-1)
    return lora_b(gates * lora_a(dropout(x)))


def _stock_class(module: nn.Module) -> type:
    """The module's class, seen through the subclass ``torch.nn.utils.parametrize`` makes of a parametrized one."""
    cls = type(module)
    return cls.__bases__[0] if parametrize.is_parametrized(module) else cls


def _factors(base_layer: nn.Module, rank: int) -> tuple[nn.Module, nn.Module]:
    """Uninitialised ``(lora_A, lora_B)`` for ``base_layer`` (no random draw: `LoraLayer.reset_parameters` draws)."""
    weight = base_layer.weight
    factory = {"dtype": weight.dtype, "device": weight.device}
    if isinstance(base_layer, nn.Linear):
        return (
            skip_init(nn.Linear, base_layer.in_features, rank, bias=False, **factory),
            skip_init(nn.Linear, rank, base_layer.out_features, bias=False, **factory),
        )
    conv = nn.Conv1d if isinstance(base_layer, nn.Conv1d) else nn.Conv2d
    lora_a = skip_init(
        conv,
        base_layer.in_channels,
        rank,
        base_layer.kernel_size,
        stride=base_layer.stride,
        padding=base_layer.padding,
        dilation=base_layer.dilation,
        padding_mode=base_layer.padding_mode,
        bias=False,
        **factory,
    )
    return lora_a, skip_init(conv, rank, base_layer.out_channels, 1, bias=False, **factory)

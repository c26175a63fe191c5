"""The LoRA layer: a frozen ``nn.Linear`` / ``nn.Conv1d`` / ``nn.Conv2d`` plus named low-rank adapters.

Paper: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022. Layout and names as HF PEFT's
``peft.tuners.lora.layer``: the wrapped layer is kept whole as ``base_layer`` and each adapter's factors live under
its name in ``lora_A[name]`` / ``lora_B[name]`` (``nn.ModuleDict`` s, as PEFT's), so parameters are named
``<module>.base_layer.weight``, ``<module>.lora_A.<name>.weight``, ``<module>.lora_B.<name>.weight``; files drop the
adapter name (``<module>.lora_A.weight``), as PEFT's do. `LoraLayer.add_adapter`, `LoraLayer.set_adapter`,
`LoraLayer.delete_adapter`, `LoraLayer.merge` / `LoraLayer.unmerge` manage them as PEFT's methods of those names.

Each adapter has a kind (`workbench.adaptation.lora.config.AdapterConfig.kind`); with ``x`` the input::

    lora:     (alpha / r) · B (A (dropout(x)))
    hlora:    scale · B (repeat_interleave(softmax(R x), r / k) ⊙ A (dropout(x))),      scale = alpha / r · k
    moelora:  scale · Σ_e softmax(R x)_e · B_e (A_e (dropout(x)))

and the layer computes ``W x + b + Σ_{active, unmerged adapters} update(x)``.

* plain LoRA, linear: ``A = Linear(in, r)``, ``B = Linear(r, out)`` (no biases): ``ΔW = B A``;
* plain LoRA, convolution: ``A`` is a convolution of the base layer's kernel, stride, padding, dilation and padding
  mode into ``r`` channels and ``B`` a 1×1 convolution back to ``out`` (PEFT's factorisation; PEFT leaves out
  dilation and padding mode, which makes its merge inexact for such layers). The composition is one convolution of
  weight ``ΔW[o, i, k] = Σ_j B[o, j] A[j, i, k]``, so the merge is exact. Grouped convolutions are refused.
* H-LoRA (HealthGPT, seed 000; METHODS.md "H-LoRA"): ``k`` experts of ``r / k`` ranks each in one ``A``/``B`` pair,
  weighed token by token by the router ``lora_route[name] = Linear(in, k)``; it equals the MoELoRA loop with ``A_e``
  the rows ``e·r/k … (e+1)·r/k − 1`` of ``A`` and ``B_e`` the same columns of ``B`` at one matmul pair instead of
  ``k``. ``scale = alpha / r · k`` follows the authors' code (their paper's Eq. 9 differs). The router reads the
  undropped input; dropout acts on ``A``'s input as for every kind (METHODS.md notes the authors apply it after
  ``A``; with dropout 0 the two agree). Routed kinds adapt ``nn.Linear`` layers only and cannot be merged.
* MoELoRA: ``lora_A[name]`` / ``lora_B[name]`` are ``nn.ModuleList`` s of ``k`` experts (``in → r/k → out``).

Initialisation as PEFT's (and loralib's): ``A`` Kaiming-uniform with ``a = sqrt(5)`` (the default of a linear
layer's weight, fan-in ``in·K``), then ``B = 0``, then the router Kaiming-uniform: every adapter starts as the
identity. Dropout acts on the adapter's input only; the base path never sees it.

Two ways to compute a plain adapter (``compute``):

* ``"input"`` (default, PEFT's): ``base_layer(x) + scale · B(A(dropout(x)))`` — the adapter's activations
  (``A``'s and ``B``'s outputs) are extra memory, its backward never forms a weight-sized gradient;
* ``"weight"`` (loralib's ``ConvLoRA``; the ``htuning`` method's): the base layer's own operation with ``W + ΔW``, one
  convolution or matmul — no adapter activations and one op instead of three (cheaper for convolutions over long
  signals), but a weight-sized ``ΔW`` and gradient per layer (costly for large linear layers). Dropout cannot act
  in weight space: while the adapter's dropout is active (training with ``dropout > 0``) it computes the input way.
  Only stock ``nn.Linear``/``nn.Conv1d``/``nn.Conv2d`` base layers (not subclasses, whose forward may differ).

Shapes:
    linear: x (..., in) → (..., out); ``lora_A[name].weight (r, in)``, ``lora_B[name].weight (out, r)``,
    ``lora_route[name].weight (k, in)``; MoELoRA ``lora_A[name][e].weight (r / k, in)``.
    conv: x (batch, in, *spatial) → (batch, out, *spatial'); ``lora_A[name].weight (r, in, *kernel)``,
    ``lora_B[name].weight (out, r, 1, ...)``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize, skip_init
from workbench.adaptation.lora.config import AdapterConfig

from workbench.errors import UserError

#: The layer types LoRA wraps.
SUPPORTED = (nn.Linear, nn.Conv1d, nn.Conv2d)
#: The adapter name `LoraLayer` and `workbench.adaptation.lora.apply` use when none is given (PEFT's).
DEFAULT = "default"
#: The per-adapter containers of a layer, in registration (and file) order.
CONTAINERS = ("lora_A", "lora_B", "lora_route")


class AdapterDict(nn.ModuleDict):
    """``nn.ModuleDict`` of one part of every adapter, by adapter name (PEFT's ``lora_A`` / ``lora_B``). An attribute
    it lacks is read from its one entry when it holds one (``layer.lora_A.weight`` is the single adapter's ``A``)."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or len(self) != 1:
                raise AttributeError(
                    f"'{name}' of a layer's adapter part holding adapters {list(self.keys())}: name one "
                    f"(lora_A['<adapter>'].{name})"
                ) from None
            return getattr(next(iter(self.values())), name)


class LoraLayer(nn.Module):
    """``base_layer(x) + Σ_{active adapters} update(x)`` around a frozen linear or conv layer (PEFT's ``LoraLayer``).

    Args:
        base_layer: the ``nn.Linear``, ``nn.Conv1d`` or ``nn.Conv2d`` to adapt (kept as is, as ``base_layer``).
        config: an adapter to add and make active at once (`add_adapter`, `set_adapter`); None (default): none yet.
        name: that adapter's name (default ``"default"``, PEFT's).

    Attributes:
        adapters: ``{name: AdapterConfig}`` in the order added.
        active_adapters: the names whose updates the forward adds (PEFT's ``active_adapters``).
        merged_adapters: the names folded into the base weight, in merge order.

    The single-adapter views ``rank``, ``scale``, ``merged``, ``compute`` and ``delta_weight()`` read the one active
    adapter (a `UserError` when several are active).

    Shapes:
        see the module docstring.
    """

    def __init__(self, base_layer: nn.Module, config: AdapterConfig | None = None, name: str = DEFAULT):
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
        self.base_layer = base_layer
        self.lora_dropout = AdapterDict()
        self.lora_A, self.lora_B, self.lora_route = AdapterDict(), AdapterDict(), AdapterDict()
        self.adapters: dict[str, AdapterConfig] = {}
        self.active_adapters: tuple[str, ...] = ()
        self.merged_adapters: list[str] = []
        if config is not None:
            self.add_adapter(name, config)
            self.set_adapter(name)

    # ---- adapters -----------------------------------------------------------------------------------------

    def add_adapter(self, name: str, config: AdapterConfig) -> None:
        """Add adapter ``name`` (initialised so that it starts as the identity); the active adapters stay as they
        are (PEFT's ``update_layer``). A taken or malformed name, a routed kind on a convolution and
        ``compute="weight"`` on a non-stock base layer are refused."""
        if not isinstance(name, str) or not name or "." in name:
            raise UserError(f"LoRA adapter names are non-empty strings without '.', got {name!r}")
        if name in self.adapters:
            raise UserError(f"this layer already has a LoRA adapter named '{name}'; delete_adapter('{name}') first")
        base = self.base_layer
        if config.routed and not isinstance(base, nn.Linear):
            raise UserError(
                f"routed LoRA experts ({config.kind}) adapt nn.Linear layers, not {type(base).__name__}; leave this "
                "module out of the targets"
            )
        if config.compute == "weight" and _stock_class(base) not in SUPPORTED:
            raise UserError(
                f"compute='weight' runs the stock layer's operation with W + ΔW, which a {type(base).__name__} cannot; "
                "use compute='input'"
            )
        self.lora_dropout[name] = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        if config.kind == "moelora":
            per_expert = config.rank // config.experts
            self.lora_A[name] = nn.ModuleList(_factors(base, per_expert)[0] for _ in range(config.experts))
            self.lora_B[name] = nn.ModuleList(_factors(base, per_expert)[1] for _ in range(config.experts))
        else:
            self.lora_A[name], self.lora_B[name] = _factors(base, config.rank)
        if config.routed:
            weight = base.weight
            self.lora_route[name] = skip_init(
                nn.Linear, base.in_features, config.experts, bias=False, dtype=weight.dtype, device=weight.device
            )
        self.adapters[name] = config
        self.reset_adapter(name)

    def reset_adapter(self, name: str) -> None:
        """``A`` Kaiming-uniform (``a = sqrt(5)``), ``B = 0``, router Kaiming-uniform: adapter ``name`` is the
        identity again (the draws in that order, expert by expert)."""
        for module in self.lora_A[name].modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
        for module in self.lora_B[name].modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                nn.init.zeros_(module.weight)
        if name in self.lora_route:
            nn.init.kaiming_uniform_(self.lora_route[name].weight, a=math.sqrt(5))

    def set_adapter(self, names: str | Sequence[str]) -> None:
        """Make ``names`` (one name or several; ``()`` for none: the base layer alone) the active adapters. Unlike
        PEFT's, ``requires_grad`` is left as it is: the method chooses what trains."""
        names = (names,) if isinstance(names, str) else tuple(names)
        unknown = [n for n in names if n not in self.adapters]
        if unknown:
            raise UserError(f"no LoRA adapter named {unknown}; this layer has {list(self.adapters) or 'none'}")
        self.active_adapters = names

    def delete_adapter(self, name: str) -> None:
        """Remove adapter ``name`` and its parameters (it leaves the active adapters); a merged one is refused."""
        if name not in self.adapters:
            raise UserError(f"no LoRA adapter named '{name}'; this layer has {list(self.adapters) or 'none'}")
        if name in self.merged_adapters:
            raise UserError(f"LoRA adapter '{name}' is merged into the base weight; unmerge it first")
        for container in (self.lora_dropout, *(getattr(self, part) for part in CONTAINERS)):
            if name in container:
                del container[name]
        del self.adapters[name]
        self.active_adapters = tuple(n for n in self.active_adapters if n != name)

    def adapter_parameters(self, name: str | None = None) -> dict[str, nn.Parameter]:
        """Adapter ``name``'s parameters (None: every adapter's) by their file names inside the layer, the adapter
        name left out as in PEFT's files (``lora_A.weight``, ``lora_route.weight``, ``lora_A.0.weight``), in the
        order ``lora_A``, ``lora_B``, ``lora_route``. With None, names of several adapters keep theirs."""
        out = {}
        for part in CONTAINERS:
            for adapter, module in getattr(self, part).items():
                if name is None or adapter == name:
                    keep = "" if name is not None else f".{adapter}"
                    out.update({f"{part}{keep}.{key}": p for key, p in module.named_parameters()})
        return out

    # ---- forward ------------------------------------------------------------------------------------------

    def update(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Adapter ``name``'s contribution to the output (the module docstring's formula of its kind)."""
        config = self.adapters[name]
        a, b, dropout = self.lora_A[name], self.lora_B[name], self.lora_dropout[name]
        if config.kind == "lora":
            return b(a(dropout(x))) * config.scale
        gates = torch.softmax(self.lora_route[name](x), dim=-1)
        if config.kind == "hlora":
            gates = gates.repeat_interleave(config.rank // config.experts, dim=-1)
            return b(gates * a(dropout(x))) * config.scale
        dropped, total = dropout(x), 0
        for expert, (a_e, b_e) in enumerate(zip(a, b)):  # MoELoRA: one matmul pair per expert
            total = total + gates[..., expert : expert + 1] * b_e(a_e(dropped))
        return total * config.scale

    def _acting(self) -> list[str]:
        """The active adapters not merged into the base weight: those the forward adds."""
        return [n for n in self.active_adapters if n not in self.merged_adapters]

    def _dropout_acts(self, name: str) -> bool:
        return self.training and isinstance(self.lora_dropout[name], nn.Dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acting = self._acting()
        by_weight = [n for n in acting if self.adapters[n].compute == "weight" and not self._dropout_acts(n)]
        if by_weight:
            weight = self.base_layer.weight
            for name in by_weight:
                weight = weight + self.delta_weight(name)
            if isinstance(self.base_layer, nn.Linear):
                out = F.linear(x, weight, self.base_layer.bias)
            else:
                out = self.base_layer._conv_forward(x, weight, self.base_layer.bias)
        else:
            out = self.base_layer(x)
        for name in acting:
            if name not in by_weight:
                out = out + self.update(name, x)
        return out

    @property
    def weight(self) -> torch.Tensor:
        """The weight the layer computes with, ``W + Σ ΔW`` over the acting adapters, for models that read
        ``module.weight`` and call ``F.linear`` / ``F.conv*`` themselves (braindecode's ``Labram`` does so for its
        fused ``qkv``): the update then acts in weight space there. An input-dependent update (routed experts) or
        active adapter dropout cannot act in weight space: reading the weight then is refused."""
        weight = self.base_layer.weight
        for name in self._acting():
            if self.adapters[name].routed or self._dropout_acts(name):
                raise UserError(
                    f"the model reads the weight of a {type(self).__name__} directly (it calls F.linear or F.conv "
                    "itself), where an input-dependent update or adapter dropout cannot act; set the LoRA dropout to 0 "
                    "for this target, or leave it out of the targets"
                )
            weight = weight + self.delta_weight(name)
        return weight

    @property
    def bias(self) -> torch.Tensor | None:
        """The base layer's bias (LoRA adds none)."""
        return self.base_layer.bias

    # ---- single-adapter views -----------------------------------------------------------------------------

    def _only(self) -> str:
        if len(self.active_adapters) != 1:
            raise UserError(
                f"this LoRA layer has active adapters {list(self.active_adapters)}; name one (layer.adapters[name])"
            )
        return self.active_adapters[0]

    @property
    def rank(self) -> int:
        return self.adapters[self._only()].rank

    @property
    def scale(self) -> float:
        return self.adapters[self._only()].scale

    @property
    def compute(self) -> str:
        return self.adapters[self._only()].compute

    @property
    def merged(self) -> bool:
        """Whether any adapter is folded into the base weight (PEFT's ``merged``)."""
        return bool(self.merged_adapters)

    # ---- merging ------------------------------------------------------------------------------------------

    def delta_weight(self, name: str | None = None) -> torch.Tensor:
        """``ΔW = (alpha / r) · B A`` of plain adapter ``name`` (None: the one active adapter) in the base weight's
        shape (what `merge` adds)."""
        name = self._only() if name is None else name
        config = self.adapters[name]
        b, a = self.lora_B[name].weight.flatten(1), self.lora_A[name].weight.flatten(1)
        return (b @ a).reshape(self.base_layer.weight.shape) * config.scale

    def merge_error(self, names: Sequence[str] | None = None) -> str | None:
        """Why `merge` cannot fold ``names`` (None: the active adapters not merged yet) — None when it can."""
        names = [n for n in (self.active_adapters if names is None else names) if n not in self.merged_adapters]
        for name in names:
            if name not in self.adapters:
                return f"it has no LoRA adapter named '{name}' (it has {list(self.adapters) or 'none'})"
            if self.adapters[name].routed:
                return (
                    f"its {self.adapters[name].kind} adapter '{name}' computes an input-dependent update, which no "
                    "fixed weight represents; keep it unmerged (the model runs as it is)"
                )
        if names and parametrize.is_parametrized(self.base_layer, "weight"):
            kinds = ", ".join(type(p).__name__ for p in self.base_layer.parametrizations.weight)
            return (
                f"its base weight is computed by a parametrization LoRA did not create ({kinds}), into which ΔW cannot "
                "be folded exactly; leave this module out of the targets, or fold that parametrization first "
                "(torch.nn.utils.parametrize.remove_parametrizations(module, 'weight', leave_parametrized=True))"
            )
        return None

    def merge(self, adapter: str | Sequence[str] | None = None) -> None:
        """``W ← W + ΔW`` of adapter(s) ``adapter`` (None: the active ones), each once (PEFT's ``merge``); merged
        adapters no longer add their update in the forward."""
        names = self.active_adapters if adapter is None else (adapter,) if isinstance(adapter, str) else adapter
        why = self.merge_error(names)
        if why:
            raise UserError(f"cannot merge this LoRA layer: {why}")
        with torch.no_grad():
            weight = self.base_layer.weight
            for name in names:
                if name not in self.merged_adapters:
                    weight.add_(self.delta_weight(name).to(weight.dtype))
                    self.merged_adapters.append(name)

    def unmerge(self) -> None:
        """``W ← W − ΔW`` of every merged adapter, last merged first (PEFT's ``unmerge``; the base weight again up to
        rounding)."""
        with torch.no_grad():
            weight = self.base_layer.weight
            while self.merged_adapters:
                weight.sub_(self.delta_weight(self.merged_adapters.pop()).to(weight.dtype))

    def extra_repr(self) -> str:
        adapters = ", ".join(f"{n}: {c.kind} r={c.rank} scale={c.scale:g}" for n, c in self.adapters.items())
        return f"adapters={{{adapters}}}, active={list(self.active_adapters)}, merged={self.merged_adapters}"


def _stock_class(module: nn.Module) -> type:
    """The module's class, seen through the subclass ``torch.nn.utils.parametrize`` makes of a parametrized one."""
    cls = type(module)
    return cls.__bases__[0] if parametrize.is_parametrized(module) else cls


def _factors(base_layer: nn.Module, rank: int) -> tuple[nn.Module, nn.Module]:
    """Uninitialised ``(lora_A, lora_B)`` for ``base_layer`` (no random draw: `LoraLayer.reset_adapter` draws)."""
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

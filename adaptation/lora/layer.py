"""The LoRA layer: a frozen ``nn.Linear`` / ``nn.Conv1d`` / ``nn.Conv2d`` plus named low-rank adapters.

Paper: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022. Layout and names as HF PEFT's
``peft.tuners.lora.layer``: the wrapped layer is kept whole as ``base_layer`` and each adapter's factors live under
its name in ``lora_A[name]`` / ``lora_B[name]`` (``nn.ModuleDict`` s, as PEFT's), so parameters are named
``<module>.base_layer.weight``, ``<module>.lora_A.<name>.weight``, ``<module>.lora_B.<name>.weight``; files drop the
adapter name (``<module>.lora_A.weight``), as PEFT's do. `LoraLayer.add_adapter`, `LoraLayer.set_adapter`,
`LoraLayer.delete_adapter`, `LoraLayer.merge` / `LoraLayer.unmerge` manage them as PEFT's methods of those names.

With ``x`` the input, the layer computes ``W x + b + Σ_{active, unmerged adapters} update(x)``, a plain adapter's
update being ``(alpha / r) · B (A (dropout(x)))``:

* linear: ``A = Linear(in, r)``, ``B = Linear(r, out)`` (no biases): ``ΔW = B A``;
* convolution: ``A`` is a convolution of the base layer's kernel, stride, padding, dilation and padding mode into
  ``r`` channels and ``B`` a 1×1 convolution back to ``out`` (PEFT's factorisation; PEFT leaves out dilation and
  padding mode, which makes its merge inexact for such layers). The composition is one convolution of weight
  ``ΔW[o, i, k] = Σ_j B[o, j] A[j, i, k]``, so the merge is exact. Grouped convolutions are refused.

Every adapter starts as the identity by default: ``A`` Kaiming-uniform with ``a = sqrt(5)`` (the default of a linear
layer's weight, fan-in ``in·K``), then ``B = 0``. Dropout acts on the adapter's input only.

The refinements — the routed kinds H-LoRA, MoELoRA and GOAT, the inits PiSSA, LoRA-One and GOAT's, rsLoRA's and
GOAT's scales, RepLoRA, DoRA — are variant objects (`workbench.adaptation.lora.variants`, one module each with its
formulas and papers): the layer asks each variant of an adapter for its layout, extra parameters (registered in the
containers below under PEFT's and the earlier names), initialisation, factors, update and ``ΔW``, and knows none of
them by name. Flat-LoRA's noise ``perturbation`` (`workbench.adaptation.lora.flat`) is added to any layer's weight.

Two ways to compute a plain adapter (``compute``):

* ``"input"`` (default, PEFT's): ``base_layer(x) + scale · B(A(dropout(x)))`` — the adapter's activations
  (``A``'s and ``B``'s outputs) are extra memory, its backward never forms a weight-sized gradient;
* ``"weight"`` (loralib's ``ConvLoRA``; the ``htuning`` method's): the base layer's own operation with ``W + ΔW``, one
  convolution or matmul — no adapter activations and one op instead of three (cheaper for convolutions over long
  signals), but a weight-sized ``ΔW`` and gradient per layer (costly for large linear layers). Dropout cannot act
  in weight space: while the adapter's dropout is active (training with ``dropout > 0``) it computes the input way.
  Only stock ``nn.Linear``/``nn.Conv1d``/``nn.Conv2d`` base layers (not subclasses, whose forward may differ).

Shapes:
    linear: x (..., in) → (..., out); ``lora_A[name].weight (r, in)``, ``lora_B[name].weight (out, r)``.
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
from workbench.adaptation.lora import variants
from workbench.adaptation.lora.config import AdapterConfig

from workbench.core.errors import UserError

#: The layer types LoRA wraps.
SUPPORTED = (nn.Linear, nn.Conv1d, nn.Conv2d)
#: The adapter name `LoraLayer` and `workbench.adaptation.lora.apply` use when none is given (PEFT's).
DEFAULT = "default"
#: The per-adapter containers of a layer, in registration (and file) order; a variant may add its own (`part`).
CONTAINERS = ("lora_A", "lora_B", "lora_route", "lora_reparam", "lora_magnitude_vector")


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


def check_fits(base: nn.Module, config: AdapterConfig) -> None:
    """A `UserError` when ``config`` cannot adapt the layer ``base``: a grouped convolution, ``compute="weight"`` on a
    non-stock layer, or what a variant refuses (`workbench.adaptation.lora.variants.check_fits`: a routed kind on a
    convolution, an SVD init's rank above the weight's, a residual on a parametrized weight) — what
    `LoraLayer.add_adapter` refuses; a method checks it before a run."""
    if isinstance(base, (nn.Conv1d, nn.Conv2d)) and base.groups != 1:
        raise UserError(
            f"LoRA on a grouped convolution ({type(base).__name__} with groups={base.groups}) is not supported; "
            "leave this module out of the targets"
        )
    if config.compute == "weight" and _stock_class(base) not in SUPPORTED:
        raise UserError(
            f"compute='weight' runs the stock layer's operation with W + ΔW, which a {type(base).__name__} cannot; "
            "use compute='input'"
        )
    variants.check_fits(base, config)


class LoraLayer(nn.Module):
    """``base_layer(x) + Σ_{active adapters} update(x)`` around a frozen linear or conv layer (PEFT's ``LoraLayer``).

    Args:
        base_layer: the ``nn.Linear``, ``nn.Conv1d`` or ``nn.Conv2d`` to adapt (kept as is, as ``base_layer``).
        config: an adapter to add and make active at once (`add_adapter`, `set_adapter`); None (default): none yet.
        name: that adapter's name (default ``"default"``, PEFT's).

    Attributes:
        adapters: ``{name: AdapterConfig}`` in the order added; ``variants``: each adapter's variant objects.
        active_adapters: the names whose updates the forward adds (PEFT's ``active_adapters``).
        merged_adapters: the names folded into the base weight, in merge order (their ``ΔW`` kept for `unmerge`).

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
        self.base_layer = base_layer
        self.lora_dropout = AdapterDict()
        self.parts = list(CONTAINERS)
        for part in CONTAINERS:
            setattr(self, part, AdapterDict())
        self.adapters: dict[str, AdapterConfig] = {}
        self.variants: dict[str, list[variants.LoraVariant]] = {}
        #: Each adapter's scale on this layer (`AdapterConfig.scale_for` of its input size).
        self.scales: dict[str, float] = {}
        #: Auxiliary losses of the last training forward, by adapter (GOAT's load balancing), until taken.
        self.balance_loss: dict[str, torch.Tensor] = {}
        self.active_adapters: tuple[str, ...] = ()
        self._merged_deltas: dict[str, torch.Tensor] = {}
        #: Flat-LoRA's noise ``ε`` (the base weight's shape) while `workbench.adaptation.lora.flat.perturbed` holds it:
        #: the layer then computes with ``W + ΔW + ε``; None otherwise.
        self.perturbation: torch.Tensor | None = None
        if config is not None:
            self.add_adapter(name, config)
            self.set_adapter(name)

    def part(self, name: str) -> AdapterDict:
        """The per-adapter container ``name``, made (and listed for files) on first use: where a variant keeps its
        parameters."""
        if name not in self.parts:
            setattr(self, name, AdapterDict())
            self.parts.append(name)
        return getattr(self, name)

    # ---- adapters -----------------------------------------------------------------------------------------

    def add_adapter(self, name: str, config: AdapterConfig) -> None:
        """Add adapter ``name`` (initialised by `reset_adapter`); the active adapters stay as they are (PEFT's
        ``update_layer``). A taken or malformed name and what `check_fits` refuses are refused."""
        if not isinstance(name, str) or not name or "." in name:
            raise UserError(f"LoRA adapter names are non-empty strings without '.', got {name!r}")
        if name in self.adapters:
            raise UserError(f"this layer already has a LoRA adapter named '{name}'; delete_adapter('{name}') first")
        base = self.base_layer
        check_fits(base, config)
        chosen = variants.variants_for(config)
        self.lora_dropout[name] = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        layouts = [v.factor_modules(base, config, _factors) for v in chosen]
        self.lora_A[name], self.lora_B[name] = next((pair for pair in layouts if pair), None) or _factors(
            base, config.rank
        )
        for variant in chosen:
            variant.add(self, name, config)
        self.adapters[name], self.variants[name] = config, chosen
        self.scales[name] = config.scale_for(base.weight[0].numel())
        self.reset_adapter(name)

    def reset_adapter(self, name: str) -> None:
        """Adapter ``name`` as it starts: a variant's factors (`LoraVariant.init_factors`) or ``A`` Kaiming-uniform
        (``a = sqrt(5)``, expert by expert) and ``B = 0``; then each variant's parameters and `after_factors`."""
        chosen = self.variants[name]
        if not [v for v in chosen if v.init_factors(self, name)]:
            for module in self.lora_A[name].modules():
                if isinstance(module, SUPPORTED):
                    nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            for module in self.lora_B[name].modules():
                if isinstance(module, SUPPORTED):
                    nn.init.zeros_(module.weight)
        for variant in chosen:
            variant.init_parameters(self, name)
        for variant in chosen:
            variant.after_factors(self, name)

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
        for variant in self.variants[name]:
            variant.delete(self, name)
        for container in (self.lora_dropout, *(getattr(self, part) for part in self.parts)):
            if name in container:
                del container[name]
        del self.adapters[name], self.variants[name], self.scales[name]
        self.balance_loss.pop(name, None)
        self.active_adapters = tuple(n for n in self.active_adapters if n != name)

    def adapter_parameters(self, name: str | None = None) -> dict[str, nn.Parameter]:
        """Adapter ``name``'s parameters (None: every adapter's) by their file names inside the layer, the adapter
        name left out as in PEFT's files (``lora_A.weight``, ``lora_route.weight``, ``lora_A.0.weight``,
        ``lora_magnitude_vector``: `LoraVariant.file_names`), in the order of the containers (`CONTAINERS`, then
        the variants' own). With None, names of several adapters keep theirs
        (``lora_magnitude_vector.<adapter>.weight``)."""
        out = {}
        for part in self.parts:
            for adapter, module in getattr(self, part).items():
                if name is None or adapter == name:
                    keep = "" if name is not None else f".{adapter}"
                    out.update({f"{part}{keep}.{key}": p for key, p in module.named_parameters()})
        for variant in self.variants.get(name, ()):
            out = variant.file_names(out)
        return out

    # ---- forward ------------------------------------------------------------------------------------------

    def update(self, name: str, x: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
        """Adapter ``name``'s contribution to the output: a variant's (`LoraVariant.update`) or ``scale · B A
        dropout(x)``; ``base``: the base layer's output ``W x + b``, if at hand (DoRA reuses it)."""
        for variant in self.variants[name]:
            out = variant.update(self, name, x, base)
            if out is not None:
                return out
        return self._factor_forward(name, self.lora_dropout[name](x)) * self.scales[name]

    def take_balance_loss(self) -> torch.Tensor | float:
        """The sum of the auxiliary losses the last training forward kept (0 if none), which the layer then forgets
        (a kept graph would stop the model from being copied)."""
        total = sum(self.balance_loss.values(), 0.0)
        self.balance_loss.clear()
        return total

    def _factor_weights(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(A, B)`` adapter ``name`` computes with: its factors as the variants make them (`factors`)."""
        a, b = self.lora_A[name].weight, self.lora_B[name].weight
        for variant in self.variants[name]:
            a, b = variant.factors(self, name, a, b)
        return a, b

    def _factor_forward(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """``B (A x)`` of adapter ``name`` (unscaled), by the factors' own layers (their convolution settings)."""
        if not any(v.transforms_factors for v in self.variants[name]):
            return self.lora_B[name](self.lora_A[name](x))
        a, b = self._factor_weights(name)
        if isinstance(self.base_layer, nn.Linear):
            return F.linear(F.linear(x, a), b)
        return self.lora_B[name]._conv_forward(self.lora_A[name]._conv_forward(x, a, None), b, None)

    def _acting(self) -> list[str]:
        """The active adapters not merged into the base weight: those the forward adds."""
        return [n for n in self.active_adapters if n not in self.merged_adapters]

    def _dropout_acts(self, name: str) -> bool:
        return self.training and isinstance(self.lora_dropout[name], nn.Dropout)

    def _base_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The base layer's operation with ``weight`` and ``bias``."""
        if isinstance(self.base_layer, nn.Linear):
            return F.linear(x, weight, bias)
        return self.base_layer._conv_forward(x, weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acting = self._acting()
        by_weight = [n for n in acting if self.adapters[n].compute == "weight" and not self._dropout_acts(n)]
        if by_weight:
            weight = self.base_layer.weight
            for name in by_weight:
                weight = weight + self.delta_weight(name)
            out = self._base_forward(x, weight, self.base_layer.bias)
        else:
            out = self.base_layer(x)
        base = None if by_weight else out
        for name in acting:
            if name not in by_weight:
                out = out + self.update(name, x, base)
        if self.perturbation is not None:
            out = out + self._base_forward(x, self.perturbation, None)
        return out

    @property
    def weight(self) -> torch.Tensor:
        """The weight the layer computes with, ``W + Σ ΔW`` over the acting adapters, for models that read
        ``module.weight`` and call ``F.linear`` / ``F.conv*`` themselves (braindecode's ``Labram`` does so for its
        fused ``qkv``): the update then acts in weight space there. An input-dependent update (routed experts) or
        active adapter dropout cannot act in weight space: reading the weight then is refused. Flat-LoRA's
        ``perturbation``, while set, is added too."""
        weight = self.base_layer.weight
        for name in self._acting():
            if self.adapters[name].routed or self._dropout_acts(name):
                raise UserError(
                    f"the model reads the weight of a {type(self).__name__} directly (it calls F.linear or F.conv "
                    "itself), where an input-dependent update or adapter dropout cannot act; set the LoRA dropout to 0 "
                    "for this target, or leave it out of the targets"
                )
            weight = weight + self.delta_weight(name)
        return weight if self.perturbation is None else weight + self.perturbation

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
        return self.scales[self._only()]

    @property
    def compute(self) -> str:
        return self.adapters[self._only()].compute

    @property
    def merged_adapters(self) -> list[str]:
        """The adapters folded into the base weight, in merge order."""
        return list(self._merged_deltas)

    @property
    def merged(self) -> bool:
        """Whether any adapter is folded into the base weight (PEFT's ``merged``)."""
        return bool(self.merged_adapters)

    # ---- merging ------------------------------------------------------------------------------------------

    def delta_weight(self, name: str | None = None) -> torch.Tensor:
        """``ΔW`` of adapter ``name`` (None: the one active adapter) in the base weight's shape (what `merge` adds):
        ``scale · B A`` as the variants change it (`LoraVariant.delta_weight`; DoRA's depends on the current base
        weight)."""
        name = self._only() if name is None else name
        delta = self._lora_weight(name)
        for variant in self.variants[name]:
            delta = variant.delta_weight(self, name, delta)
        return delta

    def _product(self, name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``scale · B A`` of factors ``a`` (``lora_A``'s shape) and ``b`` of adapter ``name``, shaped as ``W``."""
        return (b.flatten(1) @ a.flatten(1)).reshape(self.base_layer.weight.shape) * self.scales[name]

    def _lora_weight(self, name: str) -> torch.Tensor:
        """``scale · B A`` of adapter ``name``'s factors (`_factor_weights`)."""
        return self._product(name, *self._factor_weights(name))

    def merge_error(self, names: Sequence[str] | None = None) -> str | None:
        """Why `merge` cannot fold ``names`` (None: the active adapters not merged yet) — None when it can."""
        names = [n for n in (self.active_adapters if names is None else names) if n not in self.merged_adapters]
        for name in names:
            if name not in self.adapters:
                return f"it has no LoRA adapter named '{name}' (it has {list(self.adapters) or 'none'})"
            why = next((w for w in (v.merge_error(self, name) for v in self.variants[name]) if w), None)
            if why:
                return why
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
        adapters no longer add their update in the forward. Every ``ΔW`` is computed from the weight before this
        merge (as the forward computes them) and kept for `unmerge` (a weight-sized tensor per merged adapter, until
        `unmerge`; `workbench.adaptation.lora.merge` with ``unload=True`` drops the layer and it)."""
        names = self.active_adapters if adapter is None else (adapter,) if isinstance(adapter, str) else adapter
        why = self.merge_error(names)
        if why:
            raise UserError(f"cannot merge this LoRA layer: {why}")
        with torch.no_grad():
            weight = self.base_layer.weight
            new = [n for n in dict.fromkeys(names) if n not in self._merged_deltas]
            deltas = {n: self.delta_weight(n).to(weight.dtype) for n in new}
            for name, delta in deltas.items():
                weight.add_(delta)
                self._merged_deltas[name] = delta

    def unmerge(self) -> None:
        """``W ← W − ΔW`` of every merged adapter, last merged first, with the ``ΔW`` `merge` added (PEFT's
        ``unmerge``; the base weight again up to rounding)."""
        with torch.no_grad():
            weight = self.base_layer.weight
            while self._merged_deltas:
                weight.sub_(self._merged_deltas.pop(next(reversed(self._merged_deltas))).to(weight))

    def extra_repr(self) -> str:
        adapters = ", ".join(
            f"{n}: {c.kind} r={c.rank} scale={self.scales[n]:g}"
            + "".join(f" {label}" for label in (v.label(c) for v in self.variants[n]) if label)
            for n, c in self.adapters.items()
        )
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

"""LoRA plug-ins chosen by task kind: one frozen ``nn.Linear``, several low-rank adapters, one of them active.

Paper: Lin et al., "HealthGPT: A Medical Large Vision-Language Model for Unifying Comprehension and Generation via
Heterogeneous Knowledge Adaptation" (seed 000; METHODS.md "H-LoRA"). Comprehension and generation get separate
plug-ins so that the two skills do not compete for one adapter; a *hard* router — the task kind of the batch —
picks which plug-in acts (`active_plugin`), and inside a plug-in H-LoRA's *soft* router weighs its experts token by
token. Only the active plug-in's parameters receive gradients, so training one plug-in leaves the others
bit-identical.

Each `PluginLoraLayer` keeps the base layer as ``base_layer`` and its plug-ins in ``plugins[<name>]``, each one of
three layouts (`PluginConfig.layout`), all starting at ``B = 0`` (the layer equals its base layer):

* ``"hlora"`` — H-LoRA (`routed_update`, the same update as `RoutedLoraLayer`): ``lora_A: in → r``,
  ``lora_B: r → out``, router ``lora_route: in → k``,
  ``scale · B (repeat_interleave(softmax(R x), r / k) ⊙ A x)`` with ``scale = alpha / r · k``;
* ``"moelora"`` — MoELoRA: ``k`` separate experts ``lora_A[e]: in → r / k``, ``lora_B[e]: r / k → out`` and the
  same router, computed as a loop ``Σ_e softmax(R x)_e · scale · B_e A_e x`` — the same function as ``"hlora"``
  when ``A_e``, ``B_e`` are H-LoRA's row and column blocks, at ``k`` matmul pairs instead of one;
* ``"lora"`` — plain LoRA of rank ``r``: ``(alpha / r) · B A x``, no router.

Plug-in files (HealthGPT swaps whole plug-in checkpoints): `save_plugin` writes one plug-in's tensors under PEFT's
names without the adapter name (``base_model.model.<module>.lora_A.weight``, ``...lora_route.weight``,
``...lora_A.<e>.weight`` for MoELoRA experts) with its `PluginConfig` in the metadata; `load_plugin` refuses a
file whose configuration (rank, experts, layout) differs from the model's plug-in, or that lacks any key.

Example::

    >>> plugins = {"comprehension": PluginConfig(rank=8, alpha=16, experts=4),
    ...            "generation": PluginConfig(rank=16, alpha=32, experts=4)}
    >>> model = apply_plugins(model, ["language"], plugins)            # doctest: +SKIP
    >>> with active_plugin(model, "generation"):                       # doctest: +SKIP
    ...     loss = task_loss(model, batch)

Shapes:
    x (..., in) → (..., out).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import torch
from torch import nn
from torch.nn.utils import skip_init
from workbench.adaptation.lora.config import LoraConfig
from workbench.adaptation.lora.io import read_adapter, write_adapter
from workbench.adaptation.lora.layer import routed_update
from workbench.adaptation.lora.model import PEFT_PREFIX, _replace, _select_targets, lora_layers

from workbench.errors import UserError

#: Plug-in layouts: H-LoRA's fused experts, MoELoRA's looped experts, plain LoRA.
LAYOUTS = ("hlora", "moelora", "lora")
#: The ``method`` written in plug-in files' metadata.
FILE_KIND = "lora-plugin"


@dataclass(frozen=True)
class PluginConfig:
    """One plug-in: total rank ``r``, scale numerator ``alpha``, ``experts`` ``k`` (None for plain LoRA), layout.

    ``rank`` must be a multiple of ``experts`` (each expert holds ``r / k`` ranks): refused here otherwise.
    """

    rank: int
    alpha: float
    experts: int | None = 4
    layout: str = "hlora"
    dropout: float = 0.0

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise UserError(f"LoRA plug-in layout must be one of {LAYOUTS}, got {self.layout!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise UserError(f"LoRA plug-in rank must be a positive integer, got {self.rank!r}")
        if self.layout == "lora":
            if self.experts is not None:
                raise UserError(f"a plain LoRA plug-in has no experts (got experts={self.experts}); use experts=None")
        elif isinstance(self.experts, bool) or not isinstance(self.experts, int) or self.experts < 1:
            raise UserError(f"a {self.layout} plug-in needs a positive number of experts, got {self.experts!r}")
        elif self.rank % self.experts:
            raise UserError(
                f"{self.layout} plug-in: rank {self.rank} must be a multiple of experts {self.experts} (each expert "
                "holds rank / experts ranks)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"LoRA plug-in dropout must be in [0, 1), got {self.dropout}")

    @property
    def scale(self) -> float:
        """``alpha / r`` (plain LoRA) or ``alpha / r · k`` (the experts' layouts, as HealthGPT's code)."""
        return self.alpha / self.rank * (self.experts or 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping, source: str | Path) -> "PluginConfig":
        try:
            return cls(**dict(values))
        except TypeError as error:
            raise UserError(f"{source}: the plug-in configuration {dict(values)} is not one ({error})") from None


def _linear(in_features: int, out_features: int, like: torch.Tensor) -> nn.Linear:
    return skip_init(nn.Linear, in_features, out_features, bias=False, dtype=like.dtype, device=like.device)


class Plugin(nn.Module):
    """One plug-in's adapter path (no base layer): ``forward(x)`` is its update to the base layer's output.

    Parameters: ``lora_A`` / ``lora_B`` (Linear, or ModuleLists of ``k`` experts for ``"moelora"``), and
    ``lora_route`` (``Linear(in, k)``) for the experts' layouts. Initialisation as `RoutedLoraLayer`: ``A`` and
    the router Kaiming-uniform (``a = sqrt(5)``), ``B = 0``.
    """

    def __init__(self, base_layer: nn.Linear, config: PluginConfig):
        super().__init__()
        weight, n_in, n_out = base_layer.weight, base_layer.in_features, base_layer.out_features
        self.config = config
        self.scale = config.scale
        self.lora_dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        if config.layout == "moelora":
            per_expert = config.rank // config.experts
            self.lora_A = nn.ModuleList(_linear(n_in, per_expert, weight) for _ in range(config.experts))
            self.lora_B = nn.ModuleList(_linear(per_expert, n_out, weight) for _ in range(config.experts))
        else:
            self.lora_A, self.lora_B = _linear(n_in, config.rank, weight), _linear(config.rank, n_out, weight)
        if config.layout != "lora":
            self.lora_route = _linear(n_in, config.experts, weight)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.lora_A.modules():
            if isinstance(module, nn.Linear):
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
        for module in self.lora_B.modules():
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.weight)
        if self.config.layout != "lora":
            nn.init.kaiming_uniform_(self.lora_route.weight, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layout = self.config.layout
        if layout == "lora":
            return self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scale
        if layout == "hlora":
            return routed_update(x, self.lora_route, self.lora_A, self.lora_B, self.lora_dropout) * self.scale
        gates = torch.softmax(self.lora_route(x), dim=-1)
        dropped = self.lora_dropout(x)
        total = 0
        for expert, (a, b) in enumerate(zip(self.lora_A, self.lora_B)):  # MoELoRA: one matmul pair per expert
            total = total + gates[..., expert : expert + 1] * b(a(dropped))
        return total * self.scale


class PluginLoraLayer(nn.Module):
    """``base_layer(x) + plugins[active](x)`` around a frozen ``nn.Linear`` (the base layer alone when none is
    active). Not mergeable: the experts' updates depend on the input, and the active plug-in changes by task.

    Args:
        base_layer: the ``nn.Linear`` to adapt.
        plugins: ``{name: PluginConfig}``.
    """

    def __init__(self, base_layer: nn.Module, plugins: Mapping[str, PluginConfig]):
        super().__init__()
        if type(base_layer) is not nn.Linear:
            raise UserError(
                f"LoRA plug-ins adapt nn.Linear layers, not {type(base_layer).__name__}; leave it out of the targets"
            )
        if not plugins:
            raise UserError("LoRA plug-ins: name at least one plug-in")
        self.base_layer = base_layer
        self.plugins = nn.ModuleDict({name: Plugin(base_layer, config) for name, config in plugins.items()})
        self.active: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        return out if self.active is None else out + self.plugins[self.active](x)

    @property
    def weight(self) -> torch.Tensor:
        """The base weight (for code that reads a layer's dtype or device)."""
        return self.base_layer.weight

    def extra_repr(self) -> str:
        return f"plugins={list(self.plugins)}, active={self.active}"


def apply_plugins(
    model: nn.Module, targets: str | Sequence[str] | None, plugins: Mapping[str, PluginConfig]
) -> nn.Module:
    """Wrap ``model``'s target ``nn.Linear`` layers in `PluginLoraLayer` s in place, freeze everything else (the
    plug-ins train) and return the model. ``targets``: declared target groups and/or fnmatch patterns over module
    names, as in `workbench.adaptation.lora.apply`. No plug-in is active until `active_plugin` picks one."""
    if lora_layers(model) or plugin_layers(model):
        raise UserError(f"this {type(model).__name__} already carries LoRA layers; apply plug-ins to a base model")
    chosen = _select_targets(model, LoraConfig(targets=targets).targets)
    layers = {}
    for name, module in chosen:
        try:
            layers[name] = PluginLoraLayer(module, plugins)
        except UserError as error:
            raise UserError(f"LoRA plug-in target '{name}': {error}") from None
    model.requires_grad_(False)
    for name, layer in layers.items():
        _replace(model, name, layer)
        layer.plugins.requires_grad_(True)
    model._lora_plugins = {name: config for name, config in plugins.items()}
    return model


def plugin_layers(model: nn.Module) -> dict[str, PluginLoraLayer]:
    """Every `PluginLoraLayer` of ``model`` by module name, in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, PluginLoraLayer)}


def plugin_names(model: nn.Module) -> tuple[str, ...]:
    """The plug-ins `apply_plugins` gave ``model``."""
    return tuple(getattr(model, "_lora_plugins", {}))


@contextmanager
def active_plugin(model: nn.Module, name: str | None) -> Iterator[None]:
    """Within the block every plug-in layer of ``model`` adds plug-in ``name``'s update (None: none, the base
    model); the previous choice comes back after."""
    layers = plugin_layers(model)
    if name is not None and name not in plugin_names(model):
        raise UserError(f"no LoRA plug-in named '{name}'; this model has {list(plugin_names(model)) or 'none'}")
    before = {layer_name: layer.active for layer_name, layer in layers.items()}
    for layer in layers.values():
        layer.active = name
    try:
        yield
    finally:
        for layer_name, layer in layers.items():
            layer.active = before[layer_name]


def plugin_parameters(model: nn.Module, name: str) -> dict[str, nn.Parameter]:
    """Plug-in ``name``'s parameters by their names in ``model``."""
    if name not in plugin_names(model):
        raise UserError(f"no LoRA plug-in named '{name}'; this model has {list(plugin_names(model)) or 'none'}")
    marker = f".plugins.{name}."
    return {key: p for key, p in model.named_parameters() if marker in key}


def _file_key(key: str, name: str) -> str:
    return PEFT_PREFIX + key.replace(f".plugins.{name}.", ".")


def save_plugin(model: nn.Module, name: str, path: str | Path) -> Path:
    """Write plug-in ``name`` to one safetensors file (PEFT's tensor names, its `PluginConfig` and targets in the
    metadata); returns the path."""
    params = plugin_parameters(model, name)
    config = dict(model._lora_plugins[name].to_dict(), name=name, targets=list(plugin_layers(model)))
    write_adapter(path, {_file_key(key, name): p for key, p in params.items()}, FILE_KIND, config)
    return Path(path)


def load_plugin(model: nn.Module, name: str, path: str | Path) -> None:
    """Load a `save_plugin` file into plug-in ``name`` of ``model``, strictly: its configuration (rank, alpha,
    experts, layout) must equal the model's plug-in and its tensors must be exactly the plug-in's (every ``lora_A``,
    ``lora_B`` and router key, of the same shapes); nothing is written otherwise."""
    tensors, stored = read_adapter(path, FILE_KIND)
    if stored is None:
        raise UserError(f"{path}: holds no plug-in configuration (metadata field 'config')")
    expected = model._lora_plugins.get(name) if name in plugin_names(model) else None
    if expected is None:
        raise UserError(f"no LoRA plug-in named '{name}'; this model has {list(plugin_names(model)) or 'none'}")
    found = PluginConfig.from_dict({k: v for k, v in stored.items() if k not in ("name", "targets")}, path)
    for what in ("layout", "rank", "experts", "alpha"):
        if getattr(found, what) != getattr(expected, what):
            raise UserError(
                f"{path}: plug-in '{name}' has {what} {getattr(found, what)!r} in the file's config, but the model's "
                f"plug-in has {what} {getattr(expected, what)!r}"
            )
    params = {_file_key(key, name): p for key, p in plugin_parameters(model, name).items()}
    missing = [key for key in params if key not in tensors]
    if missing:
        kinds = sorted({part for key in missing for part in key.split(".") if part.startswith("lora_")})
        raise UserError(
            f"{path}: plug-in '{name}' lacks {len(missing)} of its {len(params)} tensors ({', '.join(kinds)}: "
            f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
        )
    unexpected = [key for key in tensors if key not in params]
    if unexpected:
        raise UserError(f"{path}: tensors this model's plug-in '{name}' has no place for: {', '.join(unexpected[:3])}")
    for key, p in params.items():
        if tuple(tensors[key].shape) != tuple(p.shape):
            found = tuple(tensors[key].shape)
            raise UserError(f"{path}: tensor '{key}': expected shape {tuple(p.shape)}, found {found}")
    with torch.no_grad():
        for key, p in params.items():
            p.copy_(tensors[key])

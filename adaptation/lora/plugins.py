"""LoRA plug-ins chosen by task kind: named adapters of the `LoraLayer` s, one of them active per batch.

Paper: Lin et al., "HealthGPT: A Medical Large Vision-Language Model for Unifying Comprehension and Generation via
Heterogeneous Knowledge Adaptation" (seed 000; METHODS.md "H-LoRA"). Comprehension and generation get separate
plug-ins so that the two skills do not compete for one adapter; a *hard* router — the task kind of the batch —
picks which plug-in acts (`active_plugin`), and inside a plug-in H-LoRA's *soft* router weighs its experts token by
token. Only the active plug-in's parameters receive gradients, so training one plug-in leaves the others
bit-identical.

A plug-in is a named adapter (`workbench.adaptation.lora.layer.LoraLayer.add_adapter`) of any kind — ``"hlora"``
(H-LoRA's fused experts), ``"moelora"`` (the same experts looped), ``"lora"`` (plain) — given by an `AdapterConfig`
(``PluginConfig`` is the same class); `apply_plugins` adds them to every target layer and leaves none active.

Plug-in files (HealthGPT swaps whole plug-in checkpoints): `save_plugin` writes one plug-in's tensors under PEFT's
names without the adapter name (``base_model.model.<module>.lora_A.weight``, ``...lora_route.weight``,
``...lora_A.<e>.weight`` for MoELoRA experts) with its `AdapterConfig` in the metadata; `load_plugin` refuses a
file whose configuration (kind, rank, experts, alpha) differs from the model's plug-in, or that lacks any key.

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

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import torch
from torch import nn
from workbench.adaptation.lora.config import AdapterConfig, LoraConfig
from workbench.adaptation.lora.io import read_adapter, write_adapter
from workbench.adaptation.lora.model import PEFT_PREFIX, _add, _configs, lora_layers

from workbench.core.errors import UserError
from workbench.core.model import PLUGINS, active_adapters, plugins_of

#: The ``method`` written in plug-in files' metadata.
FILE_KIND = "lora-plugin"
#: A plug-in's configuration is an adapter's.
PluginConfig = AdapterConfig


def apply_plugins(
    model: nn.Module, targets: str | Sequence[str] | None, plugins: Mapping[str, AdapterConfig]
) -> nn.Module:
    """Give ``model``'s target layers the named adapters ``plugins`` (``{name: AdapterConfig}``) in place, freeze
    everything else (the plug-ins train) and return the model. ``targets``: declared target groups and/or fnmatch
    patterns over module names, as in `workbench.adaptation.lora.apply`. No plug-in is active until `active_plugin`
    picks one."""
    if lora_layers(model):
        raise UserError(f"this {type(model).__name__} already carries LoRA layers; apply plug-ins to a base model")
    if not plugins:
        raise UserError("LoRA plug-ins: name at least one plug-in")
    configs = {
        name: LoraConfig(
            targets,
            c.rank,
            c.alpha,
            c.dropout,
            experts=c.experts,
            compute=c.compute,
            kind=c.kind,
            init=c.init,
            scaling=c.scaling,
            dora=c.dora,
            reparam=c.reparam,
            variants=c.variants,
        )
        for name, c in plugins.items()
    }
    layers = _add(model, configs)
    model.requires_grad_(False)
    for layer in layers.values():
        for p in layer.adapter_parameters().values():
            p.requires_grad_(True)
    model._lora_configs = configs
    setattr(model, PLUGINS, tuple(configs))
    return model


def plugin_names(model: nn.Module) -> tuple[str, ...]:
    """The plug-ins `apply_plugins` gave ``model`` (the adapters chosen per batch)."""
    return plugins_of(model)


def _check_name(model: nn.Module, name: str) -> None:
    if name not in plugin_names(model):
        raise UserError(f"no LoRA plug-in named '{name}'; this model has {list(plugin_names(model)) or 'none'}")


@contextmanager
def active_plugin(model: nn.Module, name: str | None) -> Iterator[None]:
    """Within the block every LoRA layer of ``model`` adds plug-in ``name``'s update (None: none, the base model);
    the previous choice comes back after."""
    if name is not None:
        _check_name(model, name)
    with active_adapters(model, () if name is None else name):
        yield


def plugin_parameters(model: nn.Module, name: str) -> dict[str, nn.Parameter]:
    """Plug-in ``name``'s parameters by their names in ``model``."""
    _check_name(model, name)
    own = {id(p) for layer in lora_layers(model).values() for p in layer.adapter_parameters(name).values()}
    return {key: p for key, p in model.named_parameters() if id(p) in own}


def plugin_state(model: nn.Module) -> dict[str, nn.Parameter]:
    """Every plug-in's parameters under the names a run's ``adapter.safetensors`` holds them by,
    ``<module>.plugins.<plug-in>.lora_A.weight`` (the names of runs written before plug-ins were named adapters; the
    files of `save_plugin` have PEFT's)."""
    return {f"{layer_name}.plugins.{name}.{key}": p for layer_name, layer in lora_layers(model).items()
            for name in plugin_names(model) for key, p in layer.adapter_parameters(name).items()}  # fmt: skip


def _file_tensors(model: nn.Module, name: str) -> dict[str, nn.Parameter]:
    """Plug-in ``name``'s parameters by their file names (PEFT's, without the adapter name)."""
    _check_name(model, name)
    return {f"{PEFT_PREFIX}{layer_name}.{key}": p for layer_name, layer in lora_layers(model).items()
            for key, p in layer.adapter_parameters(name).items()}  # fmt: skip


def save_plugin(model: nn.Module, name: str, path: str | Path) -> Path:
    """Write plug-in ``name`` to one safetensors file (PEFT's tensor names, its `AdapterConfig` and targets in the
    metadata); returns the path."""
    tensors = _file_tensors(model, name)
    config = _configs(model)[name]
    adapter = config.adapter(config.rank).to_dict()
    write_adapter(path, tensors, FILE_KIND, dict(adapter, name=name, targets=list(lora_layers(model))))
    return Path(path)


def load_plugin(model: nn.Module, name: str, path: str | Path) -> None:
    """Load a `save_plugin` file into plug-in ``name`` of ``model``, strictly: its configuration (kind, rank, alpha,
    experts) must equal the model's plug-in and its tensors must be exactly the plug-in's (every ``lora_A``,
    ``lora_B`` and router key, of the same shapes); nothing is written otherwise."""
    tensors, stored = read_adapter(path, FILE_KIND)
    if stored is None:
        raise UserError(f"{path}: holds no plug-in configuration (metadata field 'config')")
    params = _file_tensors(model, name)
    config = _configs(model)[name]
    expected = config.adapter(config.rank)
    found = AdapterConfig.from_dict({k: v for k, v in stored.items() if k not in ("name", "targets")}, path)
    for what in ("kind", "rank", "experts", "alpha"):
        if getattr(found, what) != getattr(expected, what):
            raise UserError(
                f"{path}: plug-in '{name}' has {what} {getattr(found, what)!r} in the file's config, but the model's "
                f"plug-in has {what} {getattr(expected, what)!r}"
            )
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

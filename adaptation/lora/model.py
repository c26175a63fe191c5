"""LoRA on a whole model: choose the targets, wrap them, freeze the rest, merge, save and load.

Paper: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022. The model side of HF PEFT's
``tuners/lora/model.py``, working in place on a plain ``nn.Module`` (no ``PeftModel`` around it): each target
``nn.Linear`` / ``nn.Conv1d`` / ``nn.Conv2d`` is replaced by a `LoraLayer` holding it as ``base_layer``, so every
adapted module computes ``W x + b + (alpha / r) · B A x`` (see `workbench.adaptation.lora.layer`, also for the
options rsLoRA, PiSSA, DoRA and LoRA-One).

Named adapters, as PEFT's: `apply` adds the adapter ``"default"``; `add_adapter` adds another one by name (on the
same or other targets), `set_adapter` chooses which act, `delete_adapter` removes one, and `merge`, `save_adapter`,
`load_adapter` take an ``adapter`` name. Each adapter's `LoraConfig` is kept on the model (``_lora_configs``).

Targets are fnmatch patterns over module names (``"layers.*.attention.qkv"``) and/or names of the target groups a
model declares (`workbench.core.model.ModelSpec.adapter_target_groups`, e.g. ``{"qkv": ("blocks.*.attn.qkv",)}``).

Files: `save_adapter` writes a folder in PEFT's layout — ``adapter_model.safetensors`` with PEFT's tensor names
(``base_model.model.<module>.lora_A.weight``; parameters trained in full under their own names, as PEFT's
``modules_to_save``) whose metadata holds the `LoraConfig`, and, when PEFT can express the adapter, an
``adapter_config.json`` that ``peft.PeftModel.from_pretrained(model, folder)`` reads. `load_adapter` reads either.

Example::

    >>> model = lora.apply(model, targets=["qkv", "conv"], rank=8, alpha=8, dropout=0.5)   # doctest: +SKIP
    >>> # ... train: only the adapters (and the `train` patterns) have requires_grad ...
    >>> lora.save_adapter(model, "runs/eeg/adapter")                                        # doctest: +SKIP
    >>> plain = lora.merge(model)         # the original classes again, W += (alpha / r) B A  # doctest: +SKIP

Shapes:
    whatever the model takes and returns; see `LoraLayer` for each adapted layer.
"""

from __future__ import annotations

import logging
import re
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn
from workbench.adaptation.lora.config import LoraConfig
from workbench.adaptation.lora.io import LoadReport, load_into, read_adapter, write_adapter
from workbench.adaptation.lora.layer import DEFAULT, SUPPORTED, LoraLayer, check_fits
from workbench.adaptation.lora.variants.lora_one import LoraOne

from workbench.core.checkpoint import check_state_fits, write_json
from workbench.core.errors import UserError
from workbench.core.model import spec_of

log = logging.getLogger(__name__)

#: File names of PEFT's adapter folder.
ADAPTER_FILE = "adapter_model.safetensors"
PEFT_CONFIG_FILE = "adapter_config.json"
#: Prefix PEFT gives every tensor name in its files (its ``PeftModel.base_model.model``).
PEFT_PREFIX = "base_model.model."


def apply(
    model: nn.Module,
    targets: str | Sequence[str] | None = None,
    rank: int = 8,
    alpha: float = 8.0,
    dropout: float = 0.0,
    rank_pattern: Mapping[str, int] | None = None,
    conv_rank: str = "peft",
    train: str | Sequence[str] = (),
    experts: int | None = None,
    compute: str = "input",
    init: str = "kaiming",
    scaling: str = "standard",
    dora: bool = False,
    reparam: str = "none",
    objective: str = "plain",
    flat_sigma: float = 0.05,
    kind: str | None = None,
    top_k: int = 2,
    variants: Sequence[str] = (),
) -> nn.Module:
    """Wrap ``model``'s target layers in `LoraLayer` s in place, freeze everything else and return the model.

    Args:
        model: any ``nn.Module``; its ``nn.Linear``, ``nn.Conv1d`` and ``nn.Conv2d`` layers can be targets.
        targets: names of the model's declared target groups and/or fnmatch patterns over module names (a name that
            is a group is the group); each must select at least one layer. None (default): every declared group.
        rank: LoRA rank ``r`` (default 8).
        alpha: updates are multiplied by ``alpha / r`` (default 8: scale 1).
        dropout: dropout probability on each adapter's input (default 0).
        rank_pattern: ``{fnmatch pattern over module names: rank}`` for per-target ranks (first match wins).
        conv_rank: ``"peft"`` (default: convolutions take ``rank``) or ``"rule"``: the brainwave-LoRA rule
            (`conv_rule_rank`: the largest power of 2 whose adapter is not larger than the weight).
        train: fnmatch patterns over parameter names (as ``named_parameters`` gives them after `apply`, e.g.
            ``"classifier.*"``, ``"*.bias"``) trained in full besides the adapters; each must match something.
        experts: ``k`` token-routed experts per layer (an H-LoRA adapter; nn.Linear targets only, rank a multiple of
            ``k``, not mergeable); None (default) for plain LoRA.
        compute: ``"input"`` (default, PEFT's: ``W x + b + scale · B A dropout(x)``) or ``"weight"``
            (``(W + scale · B A) x + b``, loralib's conv LoRA: the same function without the adapter's activations,
            with a weight-sized gradient; while dropout is active in training the input way is used). See
            `workbench.adaptation.lora.layer`.
        init: ``"kaiming"`` (default, PEFT's: ``A`` Kaiming-uniform, ``B = 0``) or ``"pissa"`` (the top-r singular
            triplets of each base weight, which is replaced by its residual; see `workbench.adaptation.lora.layer`).
        scaling: ``"standard"`` (default, ``alpha / r``) or ``"rslora"`` (``alpha / sqrt(r)``).
        dora: DoRA, a trained magnitude per output unit times the normalised adapted weight (default False).
        reparam: ``"none"`` (default) or ``"replora"``: RepLoRA's shared MLP makes the factors the layers compute with
            (see `workbench.adaptation.lora.layer`).
        objective: ``"plain"`` (default) or ``"flat-lora"``: kept in the config for the trainer (Flat-LoRA's loss,
            `workbench.adaptation.lora.flat`); the layers compute the same either way.
        flat_sigma: Flat-LoRA's relative noise size (default 0.05).
        kind: the adapters' kind (`workbench.adaptation.lora.KINDS`); None (default): ``"hlora"`` with ``experts``,
            ``"lora"`` without. ``"goat"``: GOAT's top-k routed experts (with ``init="goat"``, ``scaling="goat"``).
        top_k: GOAT's experts per token (default 2).
        variants: names of further registered LoRA variants to apply (`workbench.adaptation.lora.variants.register`).

    The adapter is named ``"default"`` (PEFT's name) and active. A model that already carries LoRA layers is refused
    (merge them first, or `add_adapter`); parametrizations of the model are left as they are. The `LoraConfig` is
    kept on the model for `save_adapter`.
    """
    config = LoraConfig(
        targets=targets,
        rank=rank,
        alpha=alpha,
        dropout=dropout,
        rank_pattern=rank_pattern or {},
        conv_rank=conv_rank,
        train=train,
        experts=experts,
        compute=compute,
        init=init,
        scaling=scaling,
        dora=dora,
        reparam=reparam,
        objective=objective,
        flat_sigma=flat_sigma,
        kind=kind,
        top_k=top_k,
        variants=variants,
    )
    return apply_config(model, config)


def check_config(model: nn.Module, config: LoraConfig) -> None:
    """A `UserError` for what `apply_config` would refuse of ``config`` on ``model``'s targets (`check_fits`, the
    targets' selection), leaving the model as it is: a method's ``check`` before the run directory appears."""
    for target, module in _select_targets(model, config.targets):
        base = module.base_layer if isinstance(module, LoraLayer) else module
        try:
            check_fits(base, config.adapter(config.rank_of(target, base)))
        except UserError as error:
            raise UserError(f"LoRA target '{target}': {error}") from None


def apply_config(model: nn.Module, config: LoraConfig, name: str = DEFAULT) -> nn.Module:
    """`apply` with its arguments as a `LoraConfig` (what `load_adapter` rebuilds from a file); ``name``: the
    adapter's name."""
    existing = list(lora_layers(model))
    if existing:
        raise UserError(
            f"this {type(model).__name__} already carries LoRA layers ({', '.join(existing[:3])}); merge them first "
            "(lora.merge) before applying LoRA again, or add a named adapter (lora.add_adapter)"
        )
    flags = [(p, p.requires_grad) for p in model.parameters()]
    layers = _add(model, {name: config})
    model.requires_grad_(False)
    for layer in layers.values():
        layer.set_adapter(name)
        for p in layer.adapter_parameters().values():
            p.requires_grad_(True)
    try:
        _train_in_full(model, config.train)
    except UserError:  # a refused apply leaves the model as it was (PiSSA's base weights up to rounding)
        for layer_name, layer in layers.items():
            layer.delete_adapter(name)
            _replace(model, layer_name, layer.base_layer)
        for p, flag in flags:
            p.requires_grad_(flag)
        raise
    model._lora_configs = {name: config}
    return model


def add_adapter(model: nn.Module, name: str, config: LoraConfig) -> nn.Module:
    """Add adapter ``name`` to ``model`` (PEFT's ``add_adapter``): the LoRA layers among ``config.targets`` get it,
    other targets become LoRA layers; which adapters act does not change (`set_adapter`). Its parameters train
    (``requires_grad``), nothing else changes; ``config.train`` must be empty (trained-in-full modules belong to the
    model, not to one adapter). Returns the model."""
    configs = _configs(model)
    if name in configs:
        raise UserError(f"this {type(model).__name__} already has a LoRA adapter named '{name}'")
    if config.train:
        raise UserError(
            f"LoRA adapter '{name}': train patterns {list(config.train)} belong to lora.apply, not to an added adapter"
        )
    _add(model, {name: config})
    model._lora_configs = {**configs, name: config}
    return model


def set_adapter(model: nn.Module, names: str | Sequence[str]) -> nn.Module:
    """Make adapter(s) ``names`` the active ones in every LoRA layer (``()``: none, the base model); a layer without
    one of them runs the others (PEFT's ``set_adapter``). Returns the model."""
    names = (names,) if isinstance(names, str) else tuple(names)
    unknown = [n for n in names if n not in _configs(model)]
    if unknown:
        raise UserError(f"no LoRA adapter named {unknown}; this model has {list(_configs(model)) or 'none'}")
    for layer in lora_layers(model).values():
        layer.set_adapter([n for n in names if n in layer.adapters])
    return model


def delete_adapter(model: nn.Module, name: str) -> nn.Module:
    """Remove adapter ``name`` from every LoRA layer (a layer left without adapters becomes its base layer again);
    a merged adapter is refused (unmerge first). Returns the model."""
    configs = _configs(model)
    if name not in configs:
        raise UserError(f"no LoRA adapter named '{name}'; this model has {list(configs) or 'none'}")
    layers = lora_layers(model)
    merged = [n for n, layer in layers.items() if name in layer.merged_adapters]
    if merged:
        raise UserError(f"LoRA adapter '{name}' is merged into {', '.join(merged[:3])}; unmerge(model) first")
    for layer_name, layer in layers.items():
        if name in layer.adapters:
            layer.delete_adapter(name)
        if not layer.adapters:
            _replace(model, layer_name, layer.base_layer)
    model._lora_configs = {n: c for n, c in configs.items() if n != name}
    return model


def _configs(model: nn.Module) -> dict[str, LoraConfig]:
    return getattr(model, "_lora_configs", {})


def _add(model: nn.Module, configs: Mapping[str, LoraConfig]) -> dict[str, LoraLayer]:
    """Add adapters ``configs`` (``{name: LoraConfig}``, sharing their targets or not) to their targets, target by
    target in module order and within one in ``configs`` order (the random draws' order); every new layer is built
    and every check passed before the model changes. Returns the layers that hold the adapters, by module name."""
    wanted: dict[str, tuple[nn.Module, list[str]]] = {}
    for name, config in configs.items():
        for target, module in _select_targets(model, config.targets):
            wanted.setdefault(target, (module, []))[1].append(name)
    order = [target for target, _ in _candidates(model) if target in wanted]
    new, added = {}, []
    try:
        for target in order:
            module, names = wanted[target]
            layer = module if isinstance(module, LoraLayer) else LoraLayer(module)
            for name in names:
                base = layer.base_layer
                layer.add_adapter(name, configs[name].adapter(configs[name].rank_of(target, base)))
                added.append((layer, name))
            if layer is not module:
                new[target] = layer
    except UserError as error:
        for layer, name in reversed(added):  # PiSSA changed base weights: put them back
            layer.delete_adapter(name)
        raise UserError(f"LoRA target '{target}': {error}") from None
    for target, layer in new.items():
        _replace(model, target, layer)
    return {target: model.get_submodule(target) for target in order}


def target_names(model: nn.Module, targets: str | Sequence[str] | None = None) -> list[str]:
    """The module names `apply` would wrap for ``targets`` (groups and/or patterns; None: every declared group)."""
    return [name for name, _ in _select_targets(model, LoraConfig(targets=targets).targets)]


def _select_targets(model: nn.Module, targets: tuple[str, ...] | None) -> list[tuple[str, nn.Module]]:
    """(name, layer) of every target, in module order."""
    spec = spec_of(model)
    groups = dict(spec.adapter_target_groups) if spec is not None else {}
    candidates = _candidates(model)
    layer_names = _some([name for name, _ in candidates])
    if targets is None:
        if not groups:
            raise UserError(
                f"{type(model).__name__} declares no LoRA target groups; name the layers to adapt with targets= "
                f"(fnmatch patterns over module names; its linear/conv layers include {layer_names})"
            )
        targets = tuple(groups)
    chosen: set[str] = set()
    for entry in targets:
        patterns = groups.get(entry, (entry,))
        hits = [name for name, _ in candidates if any(fnmatchcase(name, pattern) for pattern in patterns)]
        if not hits:
            raise UserError(
                f"LoRA target '{entry}' selects no nn.Linear, nn.Conv1d or nn.Conv2d layer of {type(model).__name__}; "
                f"its target groups: {sorted(groups) or 'none'}; its layers include {layer_names}"
            )
        chosen.update(hits)
    shared = _shared_names(model, chosen)
    if shared:
        raise UserError(
            f"LoRA targets {shared} are one module reachable under several names (shared or tied layers); wrapping "
            "it under one name would leave the others unadapted — leave it out of the targets"
        )
    return [(name, m) for name, m in candidates if name in chosen]


def _candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every layer LoRA can target, in module order: LoRA layers (their base layers not apart)
    and the supported layers outside them."""
    out: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        inside = out and isinstance(out[-1][1], LoraLayer) and name.startswith(out[-1][0] + ".")
        if name and not inside and isinstance(module, (LoraLayer, *SUPPORTED)):
            out.append((name, module))
    return out


def _shared_names(model: nn.Module, chosen: set[str]) -> list[str]:
    names: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), []).append(name)
    return sorted(n for n in chosen if len(names[id(model.get_submodule(n))]) > 1)


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _train_in_full(model: nn.Module, patterns: tuple[str, ...]) -> None:
    adapter = {id(p) for p in adapter_parameters(model)}
    names = [(name, p) for name, p in model.named_parameters() if id(p) not in adapter]
    for pattern in patterns:
        hits = [p for name, p in names if fnmatchcase(name, pattern)]
        if not hits:
            raise UserError(
                f"train pattern '{pattern}' matches no parameter of {type(model).__name__}; parameter names after "
                f"LoRA include {_some([n for n, _ in names])}"
            )
        for p in hits:
            p.requires_grad_(True)


def _some(names: list[str], n: int = 4) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "") if names else "none"


def lora_layers(model: nn.Module) -> dict[str, LoraLayer]:
    """Every `LoraLayer` of ``model`` by module name, in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def adapter_parameters(model: nn.Module, adapter: str | None = None) -> list[nn.Parameter]:
    """The parameters of adapter ``adapter`` (None: of every adapter) in module order: ``lora_A``, ``lora_B`` (and
    ``lora_route`` of routed kinds) of each layer."""
    return [p for layer in lora_layers(model).values() for p in layer.adapter_parameters(adapter).values()]


def adapter_state(model: nn.Module, adapter: str = DEFAULT) -> dict[str, torch.Tensor]:
    """What an adapter file holds, by PEFT's file names (the parameter names without the adapter name:
    ``<module>.lora_A.weight``): adapter ``adapter``'s parameters and every parameter trained in full (the ``train``
    patterns of `apply`), in ``named_parameters`` order."""
    config = _configs(model).get(adapter)
    if config is None or not lora_layers(model):
        if _configs(model):
            raise UserError(f"no LoRA adapter named '{adapter}'; this model has {list(_configs(model))}")
        raise UserError(f"this {type(model).__name__} carries no LoRA adapter (call lora.apply first)")
    own = {id(p): f"{name}.{key}" for name, layer in lora_layers(model).items()
           for key, p in layer.adapter_parameters(adapter).items()}  # fmt: skip
    others = {id(p) for p in adapter_parameters(model)} - set(own)
    return {
        own.get(id(p), name): p
        for name, p in model.named_parameters()
        if id(p) in own or (id(p) not in others and any(fnmatchcase(name, pattern) for pattern in config.train))
    }


def load_state(
    model: nn.Module, state: Mapping[str, torch.Tensor], source: str | Path = "<state>", adapter: str = DEFAULT
) -> None:
    """Copy an `adapter_state` (by its file names; a run's ``adapter.safetensors``) into adapter ``adapter``, strictly:
    every name of the model's adapter state present with its shape and nothing else; nothing is written otherwise."""
    check_state_fits(adapter_state(model, adapter), state, source, f"it does not fit LoRA adapter '{adapter}'")
    with torch.no_grad():
        for name, p in adapter_state(model, adapter).items():
            p.copy_(state[name])


def merge(model: nn.Module, unload: bool = True, adapter: str | Sequence[str] | None = None) -> nn.Module:
    """Fold LoRA updates into their base weights, ``W ← W + ΔW`` (``scale · B A``; with DoRA
    ``f ⊙ (W + scale · B A) − W``), and return the model.

    Args:
        model: a model `apply` adapted (a model without LoRA layers is returned unchanged).
        unload: replace each `LoraLayer` by its base layer (default: a plain model of the original classes, PEFT's
            ``merge_and_unload``; adapters not merged are dropped); False keeps the layers, merged, for `unmerge`
            (PEFT's ``merge_adapter``).
        adapter: the adapter(s) to fold; None (default): the active ones.

    Merged weights keep the base weights' ``requires_grad`` (False after `apply`). Nothing changes unless every
    layer can be merged: routed (H-LoRA, MoELoRA) adapters and layers whose base weight carries a parametrization
    LoRA did not create are refused with the reason.
    """
    names = None if adapter is None else (adapter,) if isinstance(adapter, str) else tuple(adapter)
    unknown = [n for n in names or () if n not in _configs(model)]
    if unknown:
        raise UserError(f"no LoRA adapter named {unknown}; this model has {list(_configs(model)) or 'none'}")
    layers = lora_layers(model)
    chosen = {n: [a for a in (layer.active_adapters if names is None else names) if a in layer.adapters]
              for n, layer in layers.items()}  # fmt: skip
    problems = [f"{n}: {why}" for n, layer in layers.items() if (why := layer.merge_error(chosen[n]))]
    if problems:
        raise UserError("cannot merge LoRA into this model: " + "; ".join(problems))
    for name, layer in layers.items():
        layer.merge(chosen[name])
        if unload:
            _replace(model, name, layer.base_layer)
    if unload and hasattr(model, "_lora_configs"):
        del model._lora_configs
    return model


def unmerge(model: nn.Module) -> nn.Module:
    """Undo `merge` ``(unload=False)``: ``W ← W − ΔW`` with the ``ΔW`` merge added (the base weights again, up to
    rounding)."""
    for layer in lora_layers(model).values():
        layer.unmerge()
    return model


def set_adapter_weights(
    model: nn.Module, weights: Mapping[str, tuple[torch.Tensor, torch.Tensor]], adapter: str = DEFAULT
) -> nn.Module:
    """Write given factors into adapter ``adapter``: ``{module name: (A, B)}`` (weights generated elsewhere,
    PhysioPFM).

    ``A`` and ``B`` must have the shapes of ``lora_A[adapter].weight`` and ``lora_B[adapter].weight`` of that layer:
    ``(r, in)`` and ``(out, r)`` for a linear layer, ``(r, in, *kernel)`` and ``(out, r, 1, ...)`` for a
    convolution; they are converted to the adapter's dtype and device. Nothing is written unless every name and shape
    fits. Returns the model.
    """
    layers = {n: layer for n, layer in lora_layers(model).items() if adapter in layer.adapters}
    unknown = sorted(set(weights) - set(layers))
    if unknown:
        raise UserError(
            f"set_adapter_weights: {unknown} are not LoRA layers of this model with adapter '{adapter}'; its LoRA "
            f"layers: {_some(list(layers))}"
        )
    targets = {}
    for name, (a, b) in weights.items():
        layer = layers[name]
        if adapter in layer.merged_adapters:
            raise UserError(f"set_adapter_weights: LoRA layer '{name}' is merged; unmerge(model) first")
        if not isinstance(layer.lora_A[adapter], SUPPORTED):  # experts as a list of pairs
            kind = layer.adapters[adapter].kind
            raise UserError(f"set_adapter_weights: '{name}': a {kind} adapter has no single A and B")
        targets[name] = (layer.lora_A[adapter].weight, layer.lora_B[adapter].weight)
        for what, value, param in (("A", a, targets[name][0]), ("B", b, targets[name][1])):
            if tuple(value.shape) != tuple(param.shape):
                expected, found = tuple(param.shape), tuple(value.shape)
                raise UserError(f"set_adapter_weights: '{name}': {what} has shape {found}, expected {expected}")
    with torch.no_grad():
        for name, (a, b) in weights.items():
            targets[name][0].copy_(a)
            targets[name][1].copy_(b)
    return model


def save_adapter(model: nn.Module, path: str | Path, adapter: str = DEFAULT) -> Path:
    """Write adapter ``adapter`` (`adapter_state`) in PEFT's layout; returns the safetensors file written.

    ``path`` is a folder (created): ``adapter_model.safetensors`` (PEFT's tensor names, the `LoraConfig` in its
    metadata) and, when PEFT can express this adapter, ``adapter_config.json`` for
    ``peft.PeftModel.from_pretrained``; a stale one is removed otherwise (the reason is logged). A path ending in
    ``.safetensors`` writes that one file alone. (PEFT saves an adapter other than ``default`` in a sub-folder of
    its name; here the caller picks the folder.)
    """
    state = adapter_state(model, adapter)
    config = _configs(model)[adapter]
    path = Path(path)
    file = path if path.suffix == ".safetensors" else path / ADAPTER_FILE
    write_adapter(file, {PEFT_PREFIX + name: p for name, p in state.items()}, "lora", config.to_dict())
    if file is not path:
        peft_config, why_not = peft_config_of(model, adapter)
        if peft_config is not None:
            write_json(path / PEFT_CONFIG_FILE, peft_config)
        else:
            (path / PEFT_CONFIG_FILE).unlink(missing_ok=True)
            log.info("%s: no %s written: PEFT cannot load this adapter (%s)", path, PEFT_CONFIG_FILE, why_not)
    return file


def load_adapter(model: nn.Module, path: str | Path, strict: bool = False, adapter: str = DEFAULT) -> LoadReport:
    """Load an adapter into ``model`` in place as adapter ``adapter``; returns (and logs) what matched, was missing
    or unexpected.

    Args:
        model: a base model — LoRA is applied to it with the file's `LoraConfig` first —, a model carrying other
            named adapters (the file's is added as ``adapter``, PEFT's ``load_adapter``; not made active), or a model
            already carrying adapter ``adapter`` (e.g. applied by hand to match an adapter PEFT wrote), loaded as is.
        path: a folder `save_adapter` (or PEFT's ``save_pretrained``) wrote, or the safetensors file itself.
        strict: refuse missing and unexpected tensors too (default: report them; missing ones keep their values).
        adapter: the adapter's name in the model (default ``"default"``).

    A file none of whose tensors is one of the model's adapter tensors is refused, as is a tensor of another shape.
    Tensor names may carry PEFT's ``base_model.model.`` prefix or not.
    """
    path = Path(path)
    file = path / ADAPTER_FILE if path.is_dir() else path
    tensors, config = read_adapter(file, "lora")
    if adapter not in _configs(model):
        if lora_layers(model) and not _configs(model):
            raise UserError(
                f"this {type(model).__name__} carries LoRA layers that lora.apply did not make; load into a base model"
            )
        if config is None:
            raise UserError(
                f"{file}: holds no workbench LoRA configuration (written by PEFT?); apply LoRA with its targets and "
                "ranks first (lora.apply(model, targets=..., rank=...)), then load_adapter loads its tensors"
            )
        config = LoraConfig.from_dict(config, file)
        if _configs(model):
            add_adapter(model, adapter, config)
        else:
            apply_config(model, config, adapter)
    state = {name.removeprefix(PEFT_PREFIX): value for name, value in tensors.items()}
    return load_into(adapter_state(model, adapter), state, file, strict=strict)


def peft_config_of(model: nn.Module, adapter: str = DEFAULT) -> tuple[dict | None, str]:
    """(PEFT ``LoraConfig`` fields of adapter ``adapter``, "") — or (None, why PEFT cannot express it).

    Targets go into ``target_modules`` as one regular expression of the exact names and per-target ranks into
    ``rank_pattern`` (anchored names), so PEFT rebuilds exactly these layers; parameters trained in full must form
    whole modules (PEFT's ``modules_to_save``). PEFT's convolution LoRA has no dilation or padding mode and PEFT has
    no routed experts, and its PiSSA adapts linear layers only: such adapters are the workbench's alone.
    """
    config = _configs(model)[adapter]
    layers = {name: layer for name, layer in lora_layers(model).items() if adapter in layer.adapters}
    if config.kind != "lora":
        return None, f"routed experts ({config.kind}) are not a PEFT LoRA"
    if config.reparam != "none":
        return None, f"reparam={config.reparam!r} (RepLoRA's MLP of the factors) is not in PEFT"
    if config.variants:
        return None, f"variants {list(config.variants)} are the workbench's, not PEFT's"
    for name, layer in layers.items():
        base = layer.base_layer
        if isinstance(base, (nn.Conv1d, nn.Conv2d)) and (set(base.dilation) != {1} or base.padding_mode != "zeros"):
            return None, f"'{name}' is a convolution with dilation or a padding mode, which PEFT's LoRA leaves out"
        if config.init == "pissa" and not isinstance(base, nn.Linear):
            return None, f"'{name}' is a convolution, which PEFT's PiSSA leaves out"
    modules_to_save, why_not = _whole_modules(model, adapter)
    ranks = {name: layer.adapters[adapter].rank for name, layer in layers.items()}
    if why_not:
        return None, why_not
    return {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": None,
        "inference_mode": True,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": "^(?:" + "|".join(re.escape(name) for name in layers) + ")$",
        "rank_pattern": {"^" + re.escape(n): r for n, r in ranks.items() if r != config.rank},
        "alpha_pattern": {},
        "modules_to_save": modules_to_save or None,
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": "pissa" if config.init == "pissa" else True,  # LoRA-One leaves W: PEFT's default load
        "use_rslora": config.scaling == "rslora",
        "use_dora": config.dora,
    }, ""


def mean_gradients(
    model: nn.Module,
    loss: Callable[[nn.Module, Any], torch.Tensor],
    batches: Iterable[tuple[Any, int]],
    weights: Sequence[torch.Tensor],
    caller: str,
) -> list[torch.Tensor]:
    """The gradient of the mean loss over every sample of ``batches`` (``(batch, samples)`` pairs, each batch's mean
    weighed by its samples) w.r.t. each of ``weights`` (zeros where the loss does not reach one), taken in eval mode
    (no dropout); the weights' ``requires_grad``, every ``.grad`` and the model's mode are left as they were. No
    sample is a `UserError` naming ``caller`` (LoRA-One's full-batch gradient, for LoRA and ELoRA)."""
    flags, mode = [w.requires_grad for w in weights], model.training
    total, count = [torch.zeros_like(w) for w in weights], 0
    try:
        model.eval()
        for w in weights:
            w.requires_grad_(True)
        for batch, n in batches:
            grads = torch.autograd.grad(loss(model, batch), weights, allow_unused=True)
            for sum_, grad in zip(total, grads):
                if grad is not None:
                    sum_.add_(grad, alpha=n)
            count += n
    finally:
        for w, flag in zip(weights, flags):
            w.requires_grad_(flag)
        model.train(mode)
    if not count:
        raise UserError(f"{caller}: no samples in batches")
    return [g / count for g in total]


def init_lora_one(
    model: nn.Module,
    loss: Callable[[nn.Module, Any], torch.Tensor],
    batches: Iterable[tuple[Any, int]],
    gamma: float = 128.0,
    adapter: str = DEFAULT,
) -> dict[str, torch.Tensor]:
    """LoRA-One's initialisation of adapter ``adapter`` (applied with ``init="lora-one"``) from one full-batch gradient.

    Paper: Zhang, Liu and Chen, "LoRA-One: One-Step Full Gradient Could Suffice for Fine-Tuning Large Language
    Models, Provably and Efficiently", ICML 2025 (code: YuanheZ/LoRA-One). ``G`` is the gradient of the mean loss over
    every sample of ``batches`` with respect to each adapted layer's base weight, taken at the model as it is (call it
    before training: the adapters are still the identity); each layer's factors then come from the top-r singular
    triplets of ``−G`` (`workbench.adaptation.lora.variants.lora_one.LoraOne.init_from_gradient`). The
    preconditioned optimiser of the paper is not part of this initialisation. The model is left in eval mode while the
    gradient is taken (no dropout: the same gradient every time; the authors' code takes it in train mode), then in
    its mode again.

    Args:
        model: a model carrying adapter ``adapter`` with ``init="lora-one"``.
        loss: ``loss(model, batch) -> scalar``, the mean over the batch's samples.
        batches: ``(batch, number of samples)`` pairs; the full-batch mean weighs each batch by its samples.
        gamma: the authors' ``stable_gamma`` (default 128, theirs): the factors are divided by ``sqrt(γ)``.
        adapter: the adapter's name.

    Returns ``{module name: G}`` (detached, in the weights' shapes). The base weights' ``requires_grad`` and every
    ``.grad`` are left as they were.
    """
    config = _configs(model).get(adapter)
    if config is None or config.init != "lora-one":
        raise UserError(f"init_lora_one initialises an adapter applied with init='lora-one'; '{adapter}' is not one")
    if not gamma > 0:
        raise UserError(f"LoRA-One's gamma must be positive, got {gamma}")
    layers = {name: layer for name, layer in lora_layers(model).items() if adapter in layer.adapters}
    weights = [layer.base_layer.weight for layer in layers.values()]
    means = mean_gradients(model, loss, batches, weights, "init_lora_one")
    gradients = dict(zip(layers, means))
    problems = [f"{n}: {why}" for n, layer in layers.items()
                if (why := LoraOne.gradient_error(layer, adapter, gradients[n]))]  # fmt: skip
    if problems:  # nothing changes unless every layer can take its gradient
        raise UserError("LoRA-One cannot initialise " + "; ".join(problems))
    for name, layer in layers.items():
        LoraOne.init_from_gradient(layer, adapter, gradients[name], gamma)
    return gradients


def _whole_modules(model: nn.Module, adapter: str) -> tuple[list[str], str]:
    """The parameters trained in full as PEFT's ``modules_to_save`` (maximal whole modules), or why they are not."""
    full = {id(p) for p in adapter_state(model, adapter).values()} - {id(p) for p in adapter_parameters(model)}
    layers = list(lora_layers(model))
    chosen: list[str] = []
    covered: set[int] = set()
    for name, module in model.named_modules():
        inside = [c for c in chosen + layers if name == c or name.startswith(c + ".")]
        if not name or inside or lora_layers(module):
            continue
        params = {id(p) for p in module.parameters()}
        if params and params <= full:
            chosen.append(name)
            covered |= params
    if full - covered:
        return [], "parameters trained in full that are not whole modules (e.g. single biases)"
    names = [n for n, _ in model.named_modules()]
    for name in chosen:  # PEFT matches modules_to_save as name suffixes
        if [n for n in names if n.endswith(name) or (PEFT_PREFIX + n).endswith(name)] != [name]:
            return [], f"module '{name}' trained in full is also a suffix of other module names"
    return chosen, ""

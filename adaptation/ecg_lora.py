"""LoRA on the ``nn.Conv1d`` and ``nn.Linear`` layers of a 1-D signal model (the ECG models of `models.ecg`).

Paper: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022; used on every conv, the merged
qkv, the FFN and the first head layer of an ECG model by H-Tuning (ICML 2025), with r = 16 and scaling 1.

For a target with weight ``W`` (``(out, in)`` for a linear, ``(out, in / groups, k)`` for a conv)::

    W' = W + (alpha / r) · reshape(B @ A, W.shape),   A (r, in·k / groups),  B (out, r)

``A`` is drawn as a linear layer's weight (Kaiming-uniform with a = sqrt(5)), ``B = 0``: the adapted model starts
identical to the base. ``B @ A`` reshaped is a conv of kernel ``k`` into ``r`` channels followed by a 1×1 conv
back to ``out`` — the same factorisation as PEFT's and loralib's conv LoRA. A target whose smaller side is below
``r`` gets that smaller rank (``B @ A`` then already reaches every matrix); the scale stays ``alpha / r``.

The update is attached with ``torch.nn.utils.parametrize`` on the stock modules' ``weight`` (as `elora` does):
parameter names stay readable (``...qkv.parametrizations.weight.original`` frozen, ``...weight.0.A``/``.B``
trainable), and `merge` folds ``W'`` into a plain ``weight`` and removes the adapter, so merged and unmerged
models compute the same function (the same ``W'`` feeds the same ``F.conv1d``/``F.linear``).

Why not HF PEFT: PEFT's LoRA does handle ``nn.Linear`` and ``nn.Conv1d`` (``peft.tuners.lora.layer.Linear`` and
``Conv1d``, with the same factorisation) and would fit. It is not a dependency of the workbench, though, and it
replaces each target by a wrapper module (``base_layer`` + ``lora_A``/``lora_B`` ModuleDicts), which changes the
state-dict names of the base model; the ~100 lines here keep the workbench's one adapter mechanism
(parametrizations, as in `elora`), need nothing new installed, and give H-Tuning's zeroth-order step a plain
list of adapter tensors to perturb in place.

Example::

    >>> model = ecg_lora.apply(ECGEncoder(), rank=16, alpha=16, train=("classifier.*",))  # doctest: +SKIP
    >>> # ... train ...  (the optimizer steps the adapters and the classifier)
    >>> plain = ecg_lora.merge(model)                                                     # doctest: +SKIP

Shapes:
    weight ``(out, in)`` or ``(out, in / groups, k)`` → same; ``A (r, in·k / groups)``, ``B (out, r)``.
"""

from __future__ import annotations

import json
import math
from fnmatch import fnmatch
from pathlib import Path
from typing import Sequence

import torch
from torch import nn
from torch.nn.utils import parametrize

from workbench.checkpoint import load_tensors, read_metadata, save_tensors
from workbench.errors import UserError
from workbench.method import Method
from workbench.options import Option
from workbench.registry import methods

HEAD_CHOICES = ("train", "frozen")


class LowRankUpdate(nn.Module):
    """``W ↦ W + (alpha / r) · reshape(B @ A, W.shape)`` for a linear or conv weight.

    Args:
        shape: the weight's shape, ``(out, in)`` or ``(out, in / groups, k)``.
        rank, alpha: LoRA rank ``r`` and scale ``alpha`` (default scale ``alpha / r``).

    Shapes:
        weight ``shape`` → same; ``A (r, prod(shape[1:]))``, ``B (shape[0], r)``.
    """

    def __init__(self, shape: Sequence[int], rank: int, alpha: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        out_features, fan_in = int(shape[0]), math.prod(shape[1:])
        rank_used = min(rank, out_features, fan_in)
        self.scale = alpha / rank
        self.A = nn.Parameter(torch.empty(rank_used, fan_in, dtype=dtype, device=device))
        self.B = nn.Parameter(torch.zeros(out_features, rank_used, dtype=dtype, device=device))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.scale * (self.B @ self.A).reshape(weight.shape)


def _matches(name: str, patterns: Sequence[str] | None) -> bool:
    return patterns is None or any(fnmatch(name, pattern) for pattern in patterns)


def apply(
    model: nn.Module,
    rank: int = 16,
    alpha: float = 16.0,
    targets: Sequence[str] | None = None,
    train: Sequence[str] = (),
) -> nn.Module:
    """Attach LoRA to ``model``'s conv and linear layers in place, freeze everything else and return it.

    Args:
        model: any module with ``nn.Conv1d``/``nn.Linear`` layers.
        rank: LoRA rank ``r`` (default 16, H-Tuning's).
        alpha: scale; updates are multiplied by ``alpha / rank`` (default 16: scaling 1, H-Tuning's).
        targets: fnmatch patterns of module names to adapt (only their ``nn.Conv1d``/``nn.Linear`` are);
            default: ``model.lora_targets`` when the model defines it, else every conv and linear layer.
        train: fnmatch patterns of parameter names that train in full besides the adapters (e.g.
            ``"classifier.*"``, ``"*.bias"``); names as ``model.named_parameters()`` gives them after `apply`.
    """
    if rank < 1:
        raise UserError(f"LoRA rank must be a positive integer, got {rank}")
    if any(parametrize.is_parametrized(m) for m in model.modules()):
        raise UserError("this model already carries parametrized adapters; merge them first (ecg_lora.merge)")
    if targets is None:
        targets = getattr(model, "lora_targets", None)
    chosen = [
        module
        for name, module in model.named_modules()
        if isinstance(module, (nn.Conv1d, nn.Linear)) and _matches(name, targets)
    ]
    if not chosen:
        raise UserError(f"no nn.Conv1d or nn.Linear layer of {type(model).__name__} matches targets {targets}")
    model.requires_grad_(False)
    for module in chosen:
        weight = module.weight
        adapter = LowRankUpdate(weight.shape, rank, alpha, weight.dtype, weight.device)
        parametrize.register_parametrization(module, "weight", adapter)
        module.parametrizations.weight.original.requires_grad_(False)
    for name, parameter in model.named_parameters():
        if ".parametrizations.weight.original" not in name and _matches(name, train):
            parameter.requires_grad_(True)
    model._lora_config = {
        "rank": rank,
        "alpha": alpha,
        "targets": None if targets is None else list(targets),
        "train": list(train),
    }
    return model


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The ``A`` and ``B`` factors of every `LowRankUpdate` of ``model``, in module order."""
    return [p for m in model.modules() if isinstance(m, LowRankUpdate) for p in (m.A, m.B)]


def merge(model: nn.Module) -> nn.Module:
    """Fold every LoRA update into its weight, remove the adapters and return the plain model.

    Merged weights keep the base weights' ``requires_grad`` (False after `apply`).
    """
    for module in list(model.modules()):
        if parametrize.is_parametrized(module, "weight") and any(
            isinstance(p, LowRankUpdate) for p in module.parametrizations.weight
        ):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
    if hasattr(model, "_lora_config"):
        del model._lora_config
    return model


def save_adapter(model: nn.Module, path: str | Path) -> None:
    """Write what trains (adapters and the parameters trained in full) as safetensors; metadata holds the config."""
    config = getattr(model, "_lora_config", None)
    if config is None:
        raise UserError("this model carries no LoRA adapter (call ecg_lora.apply first)")
    state = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    save_tensors(path, state, metadata={"method": "lora", "config": json.dumps(config)})


def load_adapter(model: nn.Module, path: str | Path) -> nn.Module:
    """Apply LoRA to a base ``model`` with the configuration saved in ``path`` and load the adapter into it."""
    metadata = read_metadata(path)
    if metadata.get("method") != "lora" or "config" not in metadata:
        raise UserError(f"{path}: not a LoRA adapter (its metadata names method {metadata.get('method')!r})")
    config = json.loads(metadata["config"])
    apply(model, rank=config["rank"], alpha=config["alpha"], targets=config["targets"], train=config["train"])
    LoRA().load_trainable_state(model, load_tensors(path), source=path)
    return model


@methods.register
class LoRA(Method):
    """Plain LoRA as a workbench method (see the module docstring); the last classifier trains in full by default."""

    name = "lora"
    description = "LoRA on every conv and linear layer the model lists in lora_targets (Hu et al., ICLR 2022)"
    model_families = ("ecg",)
    learning_rate = 2e-3  # H-Tuning's AdamW rate for its LoRA runs
    options = (
        Option("rank", int, 16, "LoRA rank r of every update"),
        Option("alpha", float, 16.0, "LoRA scale alpha (updates are multiplied by alpha / rank)"),
        Option("head", str, "train", "train the last classifier in full, or keep it frozen", choices=HEAD_CHOICES),
    )

    def prepare(self, model: nn.Module) -> nn.Module:
        train = ("classifier.*",) if self.config["head"] == "train" else ()
        return apply(model, rank=self.config["rank"], alpha=self.config["alpha"], train=train)

    def merge(self, model: nn.Module) -> nn.Module:
        return merge(model)

"""A small GPT-2-style patch transformer for one-channel physiological series (PhysioPFM's backbone).

PhysioPFM (shared/seeds/003, METHODS.md) adapts "a 6-layer GPT-2-style backbone"; no code was released, so the
choices below are ours (marked *unverified* where they stand for the paper's): the series is cut into patches of
``patch_size`` samples, each patch is embedded linearly, a learned position embedding is added, and ``n_layers``
GPT-2 blocks run over the patches with causal self-attention::

    h_0 = W_e · patches(x) + p                                   # (batch, n_patches, width)
    h   = h + Attn(LN(h));  h = h + MLP(LN(h))                   # × n_layers; Attn: ONE fused qkv Linear, causal
    z   = LN(h)                                                  # (batch, n_patches, width)
    features = z[:, -1]      logits = head(features)             # the last patch has seen the whole series

Patch ``t``'s output depends on patches ``0 … t`` only (tested), which next-patch pretraining needs (a linear map
of ``z[:, t]`` predicting patch ``t + 1``: ``hidden`` gives every position). The head reads the last position,
as GPT-2's sequence classifier does (*unverified* for PhysioPFM, whose head is a fixed simplex ETF: a method's
matter, `workbench.adaptation`).

LoRA target groups: ``qkv`` (the fused attention input, GPT-2's ``c_attn``), ``attn_out`` (``c_proj``), ``mlp``
(``c_fc`` and the MLP's ``c_proj``); PhysioPFM's rank-4 LoRA targets are not stated — ``qkv`` is our default.

Checkpoints: safetensors + the JSON of the architecture (`save_patch_gpt` / `load_patch_gpt`).

Shapes:
    series (batch, n_times) or (batch, 1, n_times) [the task's units] → logits (batch, n_outputs);
    `PatchGPT.hidden`: (batch, n_patches, width); `PatchGPT.features`: (batch, width)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from workbench.core.checkpoint import (
    check_architecture,
    load_model,
    load_tensors,
    read_metadata,
    save_model,
    saved_model_files,
)
from workbench.core.errors import UserError
from workbench.core.model import ModelFamily, ModelSpec, SignalSpec
from workbench.core.registry import models

#: The rate [Hz] the shipped backbone was pretrained at (tasks resample to it, and say so).
BACKBONE_RATE_HZ = 250.0
#: The shipped backbone: pretrained by `workbench.domains.physio.pretrain`, no head (card ``patch-gpt-physio``).
SHIPPED_BACKBONE = Path(__file__).resolve().parent / "checkpoints" / "patch_gpt_physio.safetensors"
#: LoRA target groups of `PatchGPT` (fnmatch patterns over its module names).
PATCH_GPT_TARGET_GROUPS = {
    "qkv": ("blocks.*.attn.qkv",),
    "attn_out": ("blocks.*.attn.proj",),
    "mlp": ("blocks.*.mlp.0", "blocks.*.mlp.2"),
}


class CausalSelfAttention(nn.Module):
    """GPT-2's masked multi-head self-attention with one fused ``qkv`` Linear and an output ``proj``.

    Shapes: h (batch, n, width) → (batch, n, width)
    """

    def __init__(self, width: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, n, width = h.shape
        q, k, v = self.qkv(h).view(batch, n, 3, self.n_heads, width // self.n_heads).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, n, width))


class Block(nn.Module):
    """Pre-norm GPT-2 block: ``h + Attn(LN(h))``, then ``h + MLP(LN(h))`` with a 4× GELU MLP."""

    def __init__(self, width: int, n_heads: int, dropout: float):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, n_heads, dropout)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.ln_1(h))
        return h + self.mlp(self.ln_2(h))


class PatchGPT(nn.Module):
    """GPT-2-style causal transformer over patches of a one-channel series (see the module docstring).

    Args:
        n_times: samples per series; a whole number of patches.
        n_outputs: classes of the head.
        sfreq: sampling rate [Hz] the model is built for (recorded; series at another rate are refused by tasks).
        patch_size: samples per patch (default 25).
        width: token width (default 64); n_heads must divide it (default 4).
        n_layers: GPT-2 blocks (default 6, PhysioPFM's).
        max_patches: rows of the position embedding (default 128): series of up to that many patches can be
            pretrained on; a model uses the first ``n_times / patch_size``.
        dropout: on attention weights and the MLP output (default 0.1, GPT-2's).

    Shapes:
        series (batch, n_times) or (batch, 1, n_times) → logits (batch, n_outputs)
    """

    kind = "patch-gpt"

    def __init__(
        self,
        n_times: int,
        n_outputs: int,
        sfreq: float,
        patch_size: int = 25,
        width: int = 64,
        n_heads: int = 4,
        n_layers: int = 6,
        max_patches: int = 128,
        dropout: float = 0.1,
    ):
        super().__init__()
        if patch_size < 1 or n_times % patch_size or n_times // patch_size > max_patches:
            raise UserError(
                f"patch-gpt: n_times {n_times} must be a whole number (≤ {max_patches}) of {patch_size}-sample patches"
            )
        if width % n_heads:
            raise UserError(f"patch-gpt: n_heads {n_heads} does not divide the width {width}")
        self.architecture = {
            "kind": self.kind,
            "n_times": int(n_times),
            "n_outputs": int(n_outputs),
            "sfreq": float(sfreq),
            "patch_size": int(patch_size),
            "width": int(width),
            "n_heads": int(n_heads),
            "n_layers": int(n_layers),
            "max_patches": int(max_patches),
            "dropout": float(dropout),
        }
        self.patch_embedding = nn.Linear(patch_size, width)
        self.position = nn.Parameter(torch.zeros(max_patches, width))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, n_heads, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, n_outputs)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights and positions, zero biases, unit norms, and the residual
        projections (the attention's ``proj``, the MLP's second Linear) at N(0, 0.02 / √(2 · n_layers))."""
        residual = 0.02 / (2 * self.architecture["n_layers"]) ** 0.5
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                on_residual = name.endswith((".attn.proj", ".mlp.2"))
                nn.init.normal_(module.weight, std=residual if on_residual else 0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.position, std=0.02)

    @property
    def workbench_spec(self) -> ModelSpec:
        """LoRA target groups ``qkv``, ``attn_out``, ``mlp``; head ``head``; embedding ``features``; one channel."""
        a = self.architecture
        return ModelSpec(
            family="patch-gpt",
            head="head",
            adapter_target_groups=dict(PATCH_GPT_TARGET_GROUPS),
            embedding="features",
            signal=SignalSpec(1, a["n_outputs"], a["n_times"], a["sfreq"], None),
        )

    def hidden(self, series: torch.Tensor) -> torch.Tensor:
        """Every patch's output ``z`` (batch, n_patches, width); series of any whole number of patches."""
        if series.ndim == 3 and series.shape[1] == 1:
            series = series[:, 0]
        size = self.architecture["patch_size"]
        if series.ndim != 2 or series.shape[1] % size or series.shape[1] // size > self.position.shape[0]:
            raise UserError(
                f"patch-gpt expects series (batch, n_times) or (batch, 1, n_times) of whole {size}-sample patches "
                f"(at most {self.position.shape[0]}), got {tuple(series.shape)}"
            )
        patches = series.reshape(series.shape[0], -1, size)
        h = self.drop(self.patch_embedding(patches) + self.position[: patches.shape[1]])
        for block in self.blocks:
            h = block(h)
        return self.ln_f(h)

    def features(self, series: torch.Tensor) -> torch.Tensor:
        """What the head reads: the last patch's output (batch, width)."""
        n_times = self.architecture["n_times"]
        if series.shape[-1] != n_times:
            raise UserError(f"patch-gpt was built for series of {n_times} samples, got {series.shape[-1]}")
        return self.hidden(series)[:, -1]

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(series))


def save_patch_gpt(model: PatchGPT, path: str | Path) -> None:
    """Weights to ``path`` (.safetensors) and the architecture to the ``.json`` beside it."""
    save_model(model, path, "patch-gpt")


def load_patch_gpt(path: str | Path) -> PatchGPT:
    """A `PatchGPT` saved by `save_patch_gpt`, checked tensor by tensor."""

    def build(architecture: Mapping[str, Any]) -> PatchGPT:
        arguments = dict(architecture)
        arguments.pop("kind", None)
        return PatchGPT(**arguments)

    return load_model(path, build, "a patch-gpt checkpoint", "{'kind': 'patch-gpt', 'n_times': int, ...}")


def load_patch_gpt_backbone(path: str | Path, n_times: int, n_outputs: int, sfreq: float) -> PatchGPT:
    """A pretrained backbone (safetensors without a head, the architecture in its metadata) in a `PatchGPT` of
    ``n_times`` and ``n_outputs`` with a fresh head. Every backbone tensor must match (strict); ``sfreq`` must be
    the rate it was pretrained at.

    Raises:
        UserError: another rate, a series length it cannot embed, or tensors that do not match.
    """
    path = Path(path)
    metadata = read_metadata(path)
    if "architecture" not in metadata:
        raise UserError(f"{path}: no 'architecture' in its metadata: not a patch-gpt backbone (nor a .json beside it)")
    wanted = "metadata 'architecture': a JSON object {'kind': 'patch-gpt', 'sfreq': Hz, 'patch_size': int, ...}"
    try:
        architecture = json.loads(metadata["architecture"])
        rate = float(architecture.pop("sfreq"))
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as error:
        raise UserError(f"{path}: expected {wanted} ({type(error).__name__}: {error})") from None
    if not math.isclose(rate, sfreq):
        raise UserError(f"{path}: pretrained on series at {rate:g} Hz, the data is at {sfreq:g} Hz; resample to it")
    kind = architecture.pop("kind", "patch-gpt")
    if kind != "patch-gpt":
        raise UserError(f"{path}: expected {wanted}, found kind {kind!r}")
    try:
        model = PatchGPT(n_times=n_times, n_outputs=n_outputs, sfreq=sfreq, **architecture)
    except Exception as error:  # a field of another type or value fails somewhere in the constructor
        raise UserError(f"{path}: expected {wanted} ({type(error).__name__}: {error})") from None
    state = load_tensors(path)
    own = model.state_dict()
    expected = {k for k in own if not k.startswith("head.")}
    if set(state) != expected or any(state[k].shape != own[k].shape for k in expected):
        stray, missing = sorted(set(state) - expected), sorted(expected - set(state))
        raise UserError(f"{path}: its tensors do not match a patch-gpt backbone (unexpected {stray[:3]}, missing "
                        f"{missing[:3]}, or shapes differ)")  # fmt: skip
    model.load_state_dict({**own, **state})
    return model


#: Sizes a task gives the family (checked against a checkpoint).
PATCH_GPT_SIZES = ("n_times", "n_outputs", "sfreq")


@models.register
class PatchGPTFamily(ModelFamily):
    """`PatchGPT`: a workbench checkpoint (checked against the task's sizes) or a fresh model of the sizes."""

    name = "patch-gpt"
    description = "GPT-2-style causal patch transformer for one-channel physiological series (PhysioPFM's backbone)"

    def load(self, source=None, *, trust_checkpoint=False, n_times=None, n_outputs=None, sfreq=None, **options):
        """``source`` None: the shipped pretrained backbone with a fresh head for ``n_times`` and ``n_outputs``
        (``pretrained=False``, or before it is made: a fresh model of the sizes and ``options``, `PatchGPT`'s
        arguments); a ``.safetensors`` with its ``.json``: a workbench checkpoint, whose sizes must equal those
        given; one without: a backbone (`load_patch_gpt_backbone`)."""
        sizes = {"n_times": n_times, "n_outputs": n_outputs, "sfreq": sfreq}
        pretrained = options.pop("pretrained", True)
        if source is None and pretrained and SHIPPED_BACKBONE.is_file():
            source = SHIPPED_BACKBONE
        if source is not None and not Path(source).with_suffix(".json").is_file():
            missing = [k for k, v in sizes.items() if v is None]
            if missing or options:
                raise UserError(f"{source}: a patch-gpt backbone takes the data's sizes {missing} and no options")
            return load_patch_gpt_backbone(source, n_times, n_outputs, sfreq)
        if source is not None:
            model = load_patch_gpt(source)
            given = {k: (float(v) if k == "sfreq" else v) for k, v in sizes.items() if v is not None}
            check_architecture(source, model.architecture, given, PATCH_GPT_SIZES)
            return model
        missing = [k for k, v in sizes.items() if v is None]
        if missing:
            raise UserError(f"patch-gpt builds a fresh model from the data's sizes; it needs {missing}")
        return PatchGPT(**sizes, **options)

    def files(self, source=None) -> list[Path]:
        if source is None:
            return [SHIPPED_BACKBONE] if SHIPPED_BACKBONE.is_file() else []
        return saved_model_files(source) if Path(source).with_suffix(".json").is_file() else [Path(source)]

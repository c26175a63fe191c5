"""ECG classifiers in the shape of H-Tuning's backbone: a strided 1-D conv stem, transformer layers, a head.

Paper: "H-Tuning: Toward Low-Cost and Efficient ECG-based Cardiovascular Disease Detection with Pre-Trained
Models", ICML 2025. Its teacher is a ~50M-parameter conv + transformer model pretrained on 12-lead ECGs at
500 Hz; its distilled student is a small conv + one transformer layer (~0.26M). These are CPU-sized versions
of both, for 100 Hz × 1000-sample records (PTB-XL ``records100``):

``ECGEncoder`` (teacher)::

    tokens = Conv-stem(ecg)                          # n_blocks × [Conv1d(stride 2) → GroupNorm → GELU]
    h      = tokens + PE                            # fixed sinusoidal positions (no parameters)
    h      = h + Attn(LN(h)); h = h + FFN(LN(h))     # × n_layers, pre-norm; Attn has ONE Linear(d, 3d) for qkv
    f      = GELU(head_hidden(mean_t LN(h)))         # the head's first layer
    logits = classifier(f)                           # the last classifier

``ECGStudent``: the same with 1–2 conv blocks (stride 4), one transformer layer and a linear classifier.

The merged ``qkv`` linear is what H-Tuning's LoRA targets; each model declares (``workbench_spec``, a
`workbench.core.model.ModelSpec`) its LoRA target groups — every conv (``conv``), qkv (``qkv``), the attention output
(``attention``), the FFN (``ffn``) and the teacher's first head layer (``head``) — its head (the last
``classifier``, which LoRA methods train in full), its embedding hook (``features``) and braindecode's signal
vocabulary (leads as ``chs_info``, 100 Hz). Normalisation is GroupNorm/LayerNorm and there is no dropout, so the
forward pass has no running statistics and is deterministic: zeroth-order loss differences then measure the
parameters' effect alone, and ``train()``/``eval()`` give the same outputs.

Leads: ``n_chans`` is 12, 3 or 1. A reduced-lead model takes either its own leads ``(batch, n_chans, n_times)``
or a 12-lead batch, from which it picks `LEAD_SUBSETS[n_chans]`: lead I alone (what single-lead wearables
record), and I, II, V2 — the 3-lead set of the PhysioNet/CinC Challenge 2021 ("Will two do?"), which keeps
two limb leads (the frontal axis) and one precordial lead (anterior/septal activity).

Checkpoints are safetensors plus a JSON of the architecture (`save_ecg_model` / `load_ecg_model`). The shipped
teacher ``checkpoints/ecg_teacher_small.safetensors`` (card ``data_cards/ecg-teacher-small.yaml``) is an
``ECGEncoder()`` pretrained on site 0 of the embedded synthetic PTB-XL (``workbench pretrain --domain ptbxl``).

Shapes:
    ecg (batch, n_chans or 12, n_times) [z-scored, standard deviations] → logits (batch, n_outputs)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from workbench.core.checkpoint import check_architecture, load_model, save_model, saved_model_files
from workbench.core.errors import UserError
from workbench.core.model import ModelFamily, ModelSpec, SignalSpec
from workbench.core.registry import models

#: The shipped teacher, pretrained on the source site of the embedded data (card ``ecg-teacher-small``).
SHIPPED_CHECKPOINT = Path(__file__).parent / "checkpoints" / "ecg_teacher_small.safetensors"

#: The 12 standard leads in the order every ECG model here reads them (channel ``i`` of a batch is ``LEADS[i]``); the
#: ECG readers (`workbench.domains.ecg`) return records in this order.
LEADS: tuple[str, ...] = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
#: Leads a reduced-lead model reads from a 12-lead batch (names as in `LEADS`).
LEAD_SUBSETS: dict[int, tuple[str, ...]] = {12: LEADS, 3: ("I", "II", "V2"), 1: ("I",)}


def lead_indices(n_chans: int) -> tuple[int, ...]:
    """Positions in the 12-lead order `LEADS` of the leads an ``n_chans`` model reads."""
    if n_chans not in LEAD_SUBSETS:
        raise UserError(f"n_chans must be one of {sorted(LEAD_SUBSETS)}, got {n_chans}")
    return tuple(LEADS.index(name) for name in LEAD_SUBSETS[n_chans])


def select_leads(ecg: torch.Tensor, n_chans: int) -> torch.Tensor:
    """The ``n_chans`` subset of a 12-lead batch.

    Shapes:
        ecg (batch, 12, n_times) → (batch, n_chans, n_times)
    """
    if ecg.ndim != 3 or ecg.shape[1] != len(LEADS):
        raise UserError(f"select_leads expects ecg (batch, 12, n_times), got shape {tuple(ecg.shape)}")
    return ecg[:, list(lead_indices(n_chans))]


def sinusoidal_positions(n_tokens: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Fixed sine/cosine position codes ``(n_tokens, width)`` (Vaswani et al., 2017)."""
    position = torch.arange(n_tokens, dtype=dtype, device=device)[:, None]
    frequency = torch.exp(torch.arange(0, width, 2, dtype=dtype, device=device) * (-math.log(10000.0) / width))
    codes = torch.zeros(n_tokens, width, dtype=dtype, device=device)
    codes[:, 0::2] = torch.sin(position * frequency)
    codes[:, 1::2] = torch.cos(position * frequency[: width // 2])
    return codes


class ConvBlock(nn.Module):
    """``Conv1d(stride) → GroupNorm → GELU``; ``n_out = ceil(n_in / stride)`` with 'same'-style padding.

    Shapes:
        x (batch, in_channels, n) → (batch, out_channels, ceil(n / stride))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2)
        self.norm = nn.GroupNorm(math.gcd(8, out_channels), out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.norm(self.conv(x)))


class SelfAttention(nn.Module):
    """Multi-head self-attention with one merged ``qkv = Linear(d, 3d)`` and an output ``proj = Linear(d, d)``.

    ``Attn(h) = proj(concat_heads softmax(q kᵀ / sqrt(d / n_heads)) v)``, ``[q, k, v] = qkv(h)``.

    Shapes:
        h (batch, n_tokens, width) → (batch, n_tokens, width)
    """

    def __init__(self, width: int, n_heads: int):
        super().__init__()
        if width % n_heads:
            raise UserError(f"width {width} must be a multiple of n_heads {n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, n_tokens, width = h.shape
        qkv = self.qkv(h).reshape(batch, n_tokens, 3, self.n_heads, width // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (batch, n_heads, n_tokens, head_width)
        attended = F.scaled_dot_product_attention(q, k, v)
        return self.proj(attended.transpose(1, 2).reshape(batch, n_tokens, width))


class TransformerLayer(nn.Module):
    """Pre-norm encoder layer: ``h += Attn(LN(h)); h += FFN(LN(h))``, ``FFN = Linear → GELU → Linear``.

    Shapes:
        h (batch, n_tokens, width) → same
    """

    def __init__(self, width: int, n_heads: int, ffn_width: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = SelfAttention(width, n_heads)
        self.norm2 = nn.LayerNorm(width)
        self.ffn = nn.Sequential(nn.Linear(width, ffn_width), nn.GELU(), nn.Linear(ffn_width, width))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attention(self.norm1(h))
        return h + self.ffn(self.norm2(h))


class _ECGModel(nn.Module):
    """Shared input check, lead selection, token encoding, pooling; subclasses build ``stem``/``layers``/head."""

    kind: str
    #: LoRA target groups (fnmatch patterns over module names, `workbench.adaptation.lora.apply`).
    adapter_target_groups: dict[str, tuple[str, ...]]

    @property
    def workbench_spec(self) -> ModelSpec:
        """What the model declares to the methods: LoRA target groups, head, embedding hook, signal shape."""
        architecture = self.architecture
        return ModelSpec(
            family="ecg",
            head="classifier",
            adapter_target_groups=dict(self.adapter_target_groups),
            embedding="features",
            signal=SignalSpec(
                n_chans=architecture["n_chans"],
                n_outputs=architecture["n_outputs"],
                n_times=architecture["n_times"],
                sfreq=100.0,
                chs_info=tuple({"ch_name": lead} for lead in LEAD_SUBSETS[architecture["n_chans"]]),
            ),
        )

    def _check(self, ecg: torch.Tensor) -> torch.Tensor:
        n_chans = self.architecture["n_chans"]
        if ecg.ndim != 3 or ecg.shape[1] not in (n_chans, len(LEADS)):
            raise UserError(
                f"{type(self).__name__} expects ecg (batch, {n_chans} or 12 leads, n_times), "
                f"got shape {tuple(ecg.shape)}"
            )
        return select_leads(ecg, n_chans) if ecg.shape[1] != n_chans else ecg

    def tokens(self, ecg: torch.Tensor) -> torch.Tensor:
        """Token sequence after the transformer layers ``(batch, n_tokens, width)``."""
        h = self.stem(self._check(ecg)).transpose(1, 2)
        h = h + sinusoidal_positions(h.shape[1], h.shape[2], h.dtype, h.device)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)

    def forward(self, ecg: torch.Tensor) -> torch.Tensor:
        """Class logits ``(batch, n_outputs)`` (multi-label: one sigmoid per class)."""
        return self.classifier(self.features(ecg))


class ECGEncoder(_ECGModel):
    """Teacher: conv stem → ``n_layers`` transformer layers → mean pooling → ``hidden`` → ``classifier``.

    Args:
        n_chans: 12, 3 or 1 input leads (default 12).
        n_outputs: output logits (default 5: NORM, MI, STTC, CD, HYP).
        n_times: record length the model is built for [samples] (default 1000: 10 s at 100 Hz); recorded in
            the architecture, other lengths run too (positions are computed, not learned).
        width: token width ``d`` (default 72; ~195k parameters with the other defaults).
        n_layers: transformer layers (default 2).
        n_heads: attention heads (default 4).
        stem_channels: output channels of the conv blocks, each of stride 2 (default (32, 64, 72, 72): 16×
            shorter, 1000 samples → 63 tokens); the last must equal ``width``.

    Shapes:
        ecg (batch, n_chans or 12, n_times) → logits (batch, n_outputs); features (batch, width)
    """

    kind = "ecg_encoder"
    adapter_target_groups = {
        "conv": ("stem.*",),
        "qkv": ("layers.*.attention.qkv",),
        "attention": ("layers.*.attention.proj",),
        "ffn": ("layers.*.ffn.*",),
        "head": ("head_hidden",),
    }

    def __init__(
        self,
        n_chans: int = 12,
        n_outputs: int = 5,
        n_times: int = 1000,
        width: int = 72,
        n_layers: int = 2,
        n_heads: int = 4,
        stem_channels: tuple[int, ...] = (32, 64, 72, 72),
    ):
        super().__init__()
        lead_indices(n_chans)
        if not stem_channels or stem_channels[-1] != width:
            raise UserError(f"the last of stem_channels {tuple(stem_channels)} must equal width {width}")
        self.architecture = {
            "kind": self.kind,
            "n_chans": int(n_chans),
            "n_outputs": int(n_outputs),
            "n_times": int(n_times),
            "width": int(width),
            "n_layers": int(n_layers),
            "n_heads": int(n_heads),
            "stem_channels": [int(c) for c in stem_channels],
        }
        kernels = [7] + [5] * (len(stem_channels) - 1)
        channels = [n_chans, *stem_channels]
        self.stem = nn.Sequential(
            *(ConvBlock(channels[i], channels[i + 1], kernels[i], 2) for i in range(len(kernels)))
        )
        self.layers = nn.ModuleList(TransformerLayer(width, n_heads, 4 * width) for _ in range(n_layers))
        self.norm = nn.LayerNorm(width)
        self.head_hidden = nn.Linear(width, width)
        self.classifier = nn.Linear(width, n_outputs)

    def features(self, ecg: torch.Tensor) -> torch.Tensor:
        """What the last classifier reads: ``GELU(hidden(mean_t tokens))`` ``(batch, width)``."""
        return F.gelu(self.head_hidden(self.tokens(ecg).mean(dim=1)))


class ECGStudent(_ECGModel):
    """Student: 1–2 conv blocks of stride 4 → one transformer layer → mean pooling → linear ``classifier``.

    Args:
        n_chans: 12, 3 or 1 input leads (default 12).
        n_outputs: output logits (default 5).
        n_times: record length the model is built for [samples] (default 1000 at 100 Hz).
        width: token width (default 24; ~8.8k parameters at 12 leads, 22× fewer than the default teacher).
        n_heads: attention heads (default 2).
        stem_channels: output channels of the conv blocks (default (16, 24): 16× shorter); 1 or 2 blocks, the
            last equal to ``width``.

    Shapes:
        ecg (batch, n_chans or 12, n_times) → logits (batch, n_outputs); features (batch, width)
    """

    kind = "ecg_student"
    adapter_target_groups = {
        "conv": ("stem.*",),
        "qkv": ("layers.*.attention.qkv",),
        "attention": ("layers.*.attention.proj",),
        "ffn": ("layers.*.ffn.*",),
    }

    def __init__(
        self,
        n_chans: int = 12,
        n_outputs: int = 5,
        n_times: int = 1000,
        width: int = 24,
        n_heads: int = 2,
        stem_channels: tuple[int, ...] = (16, 24),
    ):
        super().__init__()
        lead_indices(n_chans)
        if len(stem_channels) not in (1, 2) or stem_channels[-1] != width:
            raise UserError(f"stem_channels {tuple(stem_channels)}: 1 or 2 blocks, the last equal to width {width}")
        self.architecture = {
            "kind": self.kind,
            "n_chans": int(n_chans),
            "n_outputs": int(n_outputs),
            "n_times": int(n_times),
            "width": int(width),
            "n_heads": int(n_heads),
            "stem_channels": [int(c) for c in stem_channels],
        }
        kernels = [9, 5][: len(stem_channels)]
        channels = [n_chans, *stem_channels]
        self.stem = nn.Sequential(
            *(ConvBlock(channels[i], channels[i + 1], kernels[i], 4) for i in range(len(kernels)))
        )
        self.layers = nn.ModuleList([TransformerLayer(width, n_heads, 2 * width)])
        self.norm = nn.LayerNorm(width)
        self.classifier = nn.Linear(width, n_outputs)

    def features(self, ecg: torch.Tensor) -> torch.Tensor:
        """Mean-pooled tokens ``(batch, width)``, what the classifier reads."""
        return self.tokens(ecg).mean(dim=1)


#: Sizes a task may give `ECGFamily.load` to check a checkpoint against.
ECG_SIZES = ("n_chans", "n_outputs", "n_times")

MODEL_KINDS: dict[str, type[_ECGModel]] = {ECGEncoder.kind: ECGEncoder, ECGStudent.kind: ECGStudent}


#: Architecture keys of checkpoints and runs written before the models spoke the signal vocabulary (`SignalSpec`).
LEGACY_KEYS = {"n_leads": "n_chans", "n_classes": "n_outputs", "n_samples": "n_times"}


def build_ecg_model(architecture: Mapping[str, Any]) -> _ECGModel:
    """The model an architecture dict describes (``kind`` plus the constructor's arguments; `LEGACY_KEYS` read as
    their new names)."""
    arguments = {LEGACY_KEYS.get(key, key): value for key, value in architecture.items()}
    kind = arguments.pop("kind", None)
    if kind not in MODEL_KINDS:
        raise UserError(f"ECG architecture 'kind' must be one of {sorted(MODEL_KINDS)}, got {kind!r}")
    if "stem_channels" in arguments:
        arguments["stem_channels"] = tuple(arguments["stem_channels"])
    return MODEL_KINDS[kind](**arguments)


def save_ecg_model(model: _ECGModel, path: str | Path) -> None:
    """Weights to ``path`` (.safetensors) and the architecture to the ``.json`` beside it (merge adapters first)."""
    adapted = [n for n, m in model.named_modules() if parametrize.is_parametrized(m)]  # (LoRA layers: save_model)
    if adapted:
        raise UserError(
            f"this ECG model carries adapters ({', '.join(adapted[:3])}); merge them first (the adapting method's "
            "merge) and save the result"
        )
    save_model(model, path, model.kind)


def load_ecg_model(path: str | Path) -> _ECGModel:
    """An `ECGEncoder` or `ECGStudent` saved by `save_ecg_model` (safetensors + the JSON of its architecture)."""
    return load_model(
        path,
        build_ecg_model,
        "an ECG checkpoint",
        "{'kind': 'ecg_encoder' | 'ecg_student', 'n_chans': int, ...}",
    )


@models.register
class ECGFamily(ModelFamily):
    """`ECGEncoder` / `ECGStudent` checkpoints; the shipped one is the small teacher (card ``ecg-teacher-small``)."""

    name = "ecg"
    description = "Conv + transformer 12-lead ECG classifier (H-Tuning's backbone, CPU-sized); shipped: small teacher"
    card = "ecg-teacher-small"

    def load(self, source=None, *, trust_checkpoint=False, **sizes) -> nn.Module:
        """The checkpoint at ``source`` (the shipped teacher when None) in float32; ``sizes`` it knows
        (``n_chans``, ``n_outputs``, ``n_times``) must match its architecture, others are not its concern."""
        model = load_ecg_model(SHIPPED_CHECKPOINT if source is None else source).to(torch.float32)
        check_architecture(source or SHIPPED_CHECKPOINT, model.architecture, sizes, ECG_SIZES)
        return model

    def files(self, source=None) -> list[Path]:
        return saved_model_files(SHIPPED_CHECKPOINT if source is None else source)

"""EEG classifiers over braindecode models: the LaBraM foundation model and two classic from-scratch baselines.

Papers:

- ``labram``: Jiang, Zhao & Lu, "Large Brain Model for Learning Generic Representations with Tremendous EEG Data
  in BCI", ICLR 2024 (braindecode's ``Labram``, its key layout);
- ``eegnet``: Lawhern et al., "EEGNet: a compact convolutional neural network for EEG-based brain-computer
  interfaces", J. Neural Eng. 2018 (braindecode's ``EEGNet``);
- ``shallow``: Schirrmeister et al., "Deep learning with convolutional neural networks for EEG decoding and
  visualization", Hum. Brain Mapp. 2017 (braindecode's ``ShallowFBCSPNet``).

Every model declares (``workbench_spec``, a `workbench.core.model.ModelSpec`) braindecode's signal vocabulary
(`workbench.core.model.SignalSpec`: ``n_chans``, ``n_outputs``, ``n_times``, ``sfreq``, ``chs_info``) and its head.

LaBraM cuts each channel into patches, embeds every patch with a small temporal convolution, adds a learned
embedding of the *electrode* (one of the 128 names of braindecode's ``LABRAM_CHANNEL_ORDER``) and of the patch's
time, and runs a transformer over all channel × patch tokens::

    tokens = TemporalConv(patches(x))                     # (batch, n_chans · n_patches, embed_dim)
    h      = [CLS; tokens] + position[channel] + time[patch]
    h      = h + γ₁·Attn(LN(h)); h = h + γ₂·MLP(LN(h))    # × num_layers; Attn has ONE fused qkv Linear
    logits = final_layer(LN(h)[CLS])

The electrode embedding is looked up by channel *name*, so a model is built for named channels: `LabramClassifier`
holds its channels' LaBraM names and passes them on every call (braindecode's module, under the prefix ``labram.``,
would otherwise take any channel subset silently). The family refuses a channel outside the vocabulary unless the
caller maps it explicitly (``channel_map``), and records the mapping in the architecture.

Patches: ``patch_size`` samples (default one second, ``round(sfreq)``; LaBraM-base uses 200 samples at 200 Hz);
``n_times`` must be a whole number of patches. The token width follows from the patch: the first convolution
(kernel 15, stride 8) gives ``ceil(patch_size / 8)`` steps of ``conv_out_channels`` each, so
``embed_dim = conv_out_channels · ceil(patch_size / 8)`` (4 · 32 = 128 at 250 Hz, 4 · 20 = 80 at 160 Hz,
8 · 25 = 200 for LaBraM-base).

Checkpoints: a workbench checkpoint is safetensors plus the JSON of its architecture (`save_eeg_model` /
`load_eeg_model`, never a pickle). A *converted* LaBraM state dict (a ``.safetensors`` file with no ``.json``
beside it, in braindecode's key layout or the original LaBraM repository's) loads through `load_labram_weights`,
which reports matched / missing / unexpected tensors (`CheckpointReport`, kept as ``model.load_report``).

Shapes:
    eeg (batch, n_chans, n_times) [the task's units, e.g. z-scored or µV] → logits (batch, n_outputs);
    `LabramClassifier.features`: (batch, embed_dim)
"""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from braindecode.models import EEGNet, Labram, ShallowFBCSPNet
from braindecode.models.labram import LABRAM_CHANNEL_ORDER, _Attention
from torch import nn

from workbench.core.checkpoint import check_architecture, load_model, load_tensors, save_model
from workbench.core.errors import UserError
from workbench.core.model import ModelFamily, ModelSpec, SignalSpec
from workbench.core.registry import models

log = logging.getLogger(__name__)

#: LaBraM's electrode vocabulary in upper case (braindecode matches names case-insensitively).
LABRAM_VOCABULARY = {name.upper(): name for name in LABRAM_CHANNEL_ORDER}

#: Where the shipped checkpoints live (the LaBraM backbones pretrained by `workbench.domains.eeg.pretrain`).
CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
#: Sizes a task gives every family (`workbench.core.checkpoint.check_architecture` compares them to a checkpoint).
EEG_SIZES = ("n_chans", "n_outputs", "n_times", "sfreq")

#: LoRA target groups of `LabramClassifier` (fnmatch patterns over its module names).
LABRAM_TARGET_GROUPS = {
    "qkv": ("labram.blocks.*.attn.qkv",),
    "fc": ("labram.blocks.*.mlp.0", "labram.blocks.*.mlp.2"),
    "conv": ("labram.patch_embed.temporal_conv.conv*",),
}

#: Original LaBraM (github.com/935963004/LaBraM) tensor names → braindecode's, applied after the prefix is removed.
LABRAM_RENAMES = (
    (re.compile(r"^pos_embed$"), "position_embedding"),
    (re.compile(r"^time_embed$"), "temporal_embedding"),
    (re.compile(r"^patch_embed\.((?:conv|norm)\d\.)"), r"patch_embed.temporal_conv.\1"),
    (re.compile(r"^head\."), "final_layer."),
    (re.compile(r"\.mlp\.fc1\."), ".mlp.0."),
    (re.compile(r"\.mlp\.fc2\."), ".mlp.2."),
)
#: Prefixes a converted state dict may carry: LaBraM's pretraining wrapper, and `LabramClassifier`'s own.
LABRAM_PREFIXES = ("student.", "labram.")


def channel_names(chs_info: Sequence[Mapping[str, Any] | str] | None) -> list[str] | None:
    """Channel names of braindecode's ``chs_info`` (``[{"ch_name": "C3"}, ...]``; plain strings are taken too)."""
    if chs_info is None:
        return None
    names = []
    for entry in chs_info:
        name = entry if isinstance(entry, str) else entry.get("ch_name") if isinstance(entry, Mapping) else None
        if not isinstance(name, str):
            raise UserError(f"chs_info entries must be {{'ch_name': str}} mappings, found {entry!r}")
        names.append(name)
    return names


def labram_channels(names: Sequence[str], channel_map: Mapping[str, str] | None = None) -> list[str]:
    """The LaBraM vocabulary name of each channel (``channel_map`` first, then the name itself, case-insensitive).

    A channel that is neither mapped nor in the vocabulary is a `UserError` naming it; so is a map entry naming no
    channel, a map target outside the vocabulary, or two channels landing on one electrode.
    """
    channel_map = dict(channel_map or {})
    stray = sorted(set(channel_map) - set(names))
    if stray:
        raise UserError(f"channel_map names {stray}, which are not among the data's channels {list(names)}")
    bad_targets = sorted(v for v in channel_map.values() if v.upper() not in LABRAM_VOCABULARY)
    if bad_targets:
        raise UserError(f"channel_map maps onto {bad_targets}, which are not in LaBraM's channel vocabulary")
    unknown = [n for n in names if n not in channel_map and n.upper() not in LABRAM_VOCABULARY]
    if unknown:
        raise UserError(
            f"channels {unknown} are not in LaBraM's channel vocabulary (braindecode's LABRAM_CHANNEL_ORDER, 10-20/"
            "10-10 names such as C3, CZ, FPZ); rename them to standard names, or pass channel_map={file name: LaBraM "
            "name} (e.g. {'Fpz-Cz': 'FPZ'}: a bipolar derivation approximated by its first electrode)"
        )
    mapped = [LABRAM_VOCABULARY[channel_map.get(n, n).upper()] for n in names]
    doubled = sorted({m for m in mapped if mapped.count(m) > 1})
    if doubled:
        raise UserError(f"several channels map onto the LaBraM electrode(s) {doubled}; each electrode may appear once")
    return mapped


class QkvModuleAttention(_Attention):
    """braindecode's LaBraM attention computing its fused ``qkv`` by *calling* the ``qkv`` module.

    braindecode's forward reads ``qkv.weight`` itself (``F.linear(x, qkv.weight, [q_bias, 0, v_bias])``), so an
    adapter wrapped around ``qkv`` could act only in weight space, never on the layer's input — and the LoRA of the
    brainwave-model study puts dropout 0.5 on that input. This forward is the same function, written with
    ``self.qkv(x) + [q_bias, 0, v_bias]``: multi-head scaled dot-product attention with the optional q/k norms,
    then ``proj``. Parameters and state-dict keys are braindecode's (`LabramClassifier` swaps the class in place).
    Windowed attention and the ``return_attention`` / ``return_qkv`` outputs keep braindecode's own forward.

    Shapes:
        x (batch, n_tokens, dim) → (batch, n_tokens, dim)
    """

    def forward(self, x: torch.Tensor, return_attention: bool = False, return_qkv: bool = False) -> torch.Tensor:
        if return_attention or return_qkv or self.relative_position_bias_table is not None:
            return super().forward(x, return_attention=return_attention, return_qkv=return_qkv)
        batch, n_tokens, _ = x.shape
        qkv = self.qkv(x)
        if self.q_bias is not None:
            qkv = qkv + torch.cat((self.q_bias, torch.zeros_like(self.v_bias), self.v_bias))
        q, k, v = qkv.reshape(batch, n_tokens, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # (batch, heads, n, d)
        if self.q_norm is not None:
            q = self.q_norm(q).type_as(v)
        if self.k_norm is not None:
            k = self.k_norm(k).type_as(v)
        weights = self.attn_drop(((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1))
        return self.proj_drop(self.proj((weights @ v).transpose(1, 2).reshape(batch, n_tokens, -1)))


class LabramClassifier(nn.Module):
    """braindecode's ``Labram`` (as ``self.labram``) fed the LaBraM names of its fixed, named channels.

    Paper: Jiang, Zhao & Lu, "Large Brain Model for Learning Generic Representations with Tremendous EEG Data in
    BCI", ICLR 2024. See the module docstring for the computation.

    Args:
        n_chans: input channels (must equal ``len(ch_names)``).
        n_outputs: output logits.
        n_times: samples per window; a whole number of patches.
        sfreq: sampling rate [Hz] (recorded; it also picks the default ``patch_size``).
        ch_names: the data's channel names, in input order.
        channel_map: ``{data name: LaBraM name}`` for channels whose names are not in LaBraM's vocabulary (default
            none). Sleep-EDF's bipolar ``Fpz-Cz`` → ``FPZ`` and ``Pz-Oz`` → ``PZ`` are an *approximation*: a
            bipolar derivation takes the electrode embedding of its first electrode. Recorded in ``architecture``.
        patch_size: samples per patch (default None: one second, ``round(sfreq)``).
        num_layers: transformer blocks (default 4; LaBraM-base 12).
        num_heads: attention heads (default 4; LaBraM-base 10); must divide ``embed_dim``.
        conv_out_channels: channels of the temporal convolutions (default 4, a multiple of 4 for their GroupNorm;
            LaBraM-base 8).
        mlp_ratio: MLP width over ``embed_dim`` (default 4).
        qkv_bias: learn q and v biases (default False, braindecode's).
        use_mean_pooling: classify the mean patch token (``fc_norm``) instead of the CLS token (default False).

    Shapes:
        eeg (batch, n_chans, n_times) → logits (batch, n_outputs); features (batch, embed_dim)
    """

    kind = "labram"

    def __init__(
        self,
        n_chans: int,
        n_outputs: int,
        n_times: int,
        sfreq: float,
        ch_names: Sequence[str],
        channel_map: Mapping[str, str] | None = None,
        patch_size: int | None = None,
        num_layers: int = 4,
        num_heads: int = 4,
        conv_out_channels: int = 4,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        use_mean_pooling: bool = False,
    ):
        super().__init__()
        ch_names = list(ch_names)
        if len(ch_names) != n_chans:
            raise UserError(f"LaBraM: n_chans is {n_chans} but {len(ch_names)} channel names were given")
        mapped = labram_channels(ch_names, channel_map)
        patch_size = int(round(sfreq)) if patch_size is None else int(patch_size)
        if patch_size < 1 or n_times % patch_size:
            raise UserError(
                f"LaBraM: n_times {n_times} is not a whole number of {patch_size}-sample patches (one second at "
                f"{sfreq:g} Hz by default); use windows of whole seconds or pass patch_size= (a divisor of n_times)"
            )
        if conv_out_channels % 4:
            raise UserError(
                f"LaBraM: conv_out_channels must be a multiple of 4 (GroupNorm of 4 groups), got {conv_out_channels}"
            )
        embed_dim = conv_out_channels * -(-patch_size // 8)
        if embed_dim % num_heads:
            raise UserError(
                f"LaBraM: num_heads {num_heads} does not divide the token width {embed_dim} (= conv_out_channels "
                f"{conv_out_channels} × ceil(patch_size {patch_size} / 8)); choose num_heads among its divisors"
            )
        self.architecture = {
            "kind": self.kind,
            "n_chans": int(n_chans),
            "n_outputs": int(n_outputs),
            "n_times": int(n_times),
            "sfreq": float(sfreq),
            "ch_names": ch_names,
            "channel_map": dict(channel_map or {}),
            "patch_size": patch_size,
            "num_layers": int(num_layers),
            "num_heads": int(num_heads),
            "conv_out_channels": int(conv_out_channels),
            "mlp_ratio": float(mlp_ratio),
            "qkv_bias": bool(qkv_bias),
            "use_mean_pooling": bool(use_mean_pooling),
        }
        #: Each input channel's name in LaBraM's vocabulary (what picks its electrode embedding).
        self.labram_names = mapped
        self.labram = Labram(
            n_times=n_times,
            n_outputs=n_outputs,
            n_chans=n_chans,
            sfreq=sfreq,
            patch_size=patch_size,
            num_layers=num_layers,
            num_heads=num_heads,
            conv_out_channels=conv_out_channels,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            use_mean_pooling=use_mean_pooling,
        )
        for block in self.labram.blocks:  # the same attention, calling its qkv module (adapters see the input)
            if type(block.attn) is not _Attention:
                raise TypeError(f"braindecode's Labram attention is {type(block.attn).__name__}, expected _Attention")
            block.attn.__class__ = QkvModuleAttention
        index = {name: i + 1 for i, name in enumerate(LABRAM_CHANNEL_ORDER)}  # 0 is the CLS token's
        self.register_buffer("input_chans", torch.tensor([0] + [index[n] for n in mapped]), persistent=False)

    @property
    def workbench_spec(self) -> ModelSpec:
        """LoRA target groups ``qkv``, ``fc``, ``conv``; head ``labram.final_layer``; embedding ``features``."""
        a = self.architecture
        return ModelSpec(
            family="labram",
            head="labram.final_layer",
            adapter_target_groups=dict(LABRAM_TARGET_GROUPS),
            embedding="features",
            signal=SignalSpec(
                a["n_chans"], a["n_outputs"], a["n_times"], a["sfreq"], tuple({"ch_name": n} for n in a["ch_names"])
            ),
        )

    def features(self, eeg: torch.Tensor) -> torch.Tensor:
        """What ``final_layer`` reads: the normalised CLS token (or mean patch token) ``(batch, embed_dim)``."""
        a = self.architecture
        if eeg.ndim != 3 or tuple(eeg.shape[1:]) != (a["n_chans"], a["n_times"]):
            raise UserError(
                f"LaBraM expects eeg (batch, {a['n_chans']} channels, {a['n_times']} samples), got {tuple(eeg.shape)}"
            )
        return self.labram.forward_features(eeg, input_chans=self.input_chans)

    def forward(self, eeg: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, n_outputs)``: braindecode's forward with ``ch_names`` = these channels' LaBraM names."""
        return self.labram.final_layer(self.features(eeg))


def build_labram(architecture: Mapping[str, Any]) -> LabramClassifier:
    """The `LabramClassifier` an architecture dict describes (`LabramClassifier.architecture`)."""
    arguments = dict(architecture)
    arguments.pop("kind", None)
    return LabramClassifier(**arguments)


def _declare(model: nn.Module, family: str, architecture: dict[str, Any]) -> nn.Module:
    """Give a braindecode model (a class the workbench does not own) its architecture and `ModelSpec`."""
    model.architecture = architecture
    names = architecture["ch_names"]
    model.workbench_spec = ModelSpec(
        family=family,
        head="final_layer",
        signal=SignalSpec(
            architecture["n_chans"],
            architecture["n_outputs"],
            architecture["n_times"],
            architecture["sfreq"],
            None if names is None else tuple({"ch_name": n} for n in names),
        ),
    )
    return model


def build_eegnet(architecture: Mapping[str, Any]) -> nn.Module:
    """braindecode's ``EEGNet`` (Lawhern et al., 2018: F1 = 8, D = 2, temporal kernel 64, depthwise and separable
    convolutions, and the paper's dense classifier with a max-norm of 0.25, ``final_layer_with_constraint=True``)
    for the sizes of ``architecture`` (``n_chans``, ``n_outputs``, ``n_times``, ``sfreq``, ``ch_names``).

    Batch norm momentum 0.1 (PyTorch's default) instead of braindecode's 0.01 (Keras' 0.99): on the few hundred
    training steps of a small EEG set, running statistics updated 1 % per step stay near their initial (0, 1), and
    an EEGNet evaluated with them outputs constant logits (measured here: validation loss stuck at ln 5 on the
    embedded nights while the training loss fell from 1.58 to 0.75).

    Shapes:
        eeg (batch, n_chans, n_times) → logits (batch, n_outputs)
    """
    a = _baseline_architecture("eegnet", architecture)
    model = EEGNet(
        n_chans=a["n_chans"],
        n_outputs=a["n_outputs"],
        n_times=a["n_times"],
        sfreq=a["sfreq"],
        final_layer_with_constraint=True,
        batch_norm_momentum=0.1,
    )
    return _declare(model, "eegnet", a)


def build_shallow(architecture: Mapping[str, Any]) -> nn.Module:
    """braindecode's ``ShallowFBCSPNet`` (Schirrmeister et al., 2017: temporal conv → spatial conv → square →
    mean pool → log → linear classifier; braindecode's defaults) for the sizes of ``architecture``.

    Shapes:
        eeg (batch, n_chans, n_times) → logits (batch, n_outputs)
    """
    a = _baseline_architecture("shallow", architecture)
    return _declare(
        ShallowFBCSPNet(n_chans=a["n_chans"], n_outputs=a["n_outputs"], n_times=a["n_times"], sfreq=a["sfreq"]),
        "shallow",
        a,
    )


def _baseline_architecture(kind: str, architecture: Mapping[str, Any]) -> dict[str, Any]:
    names = architecture.get("ch_names")
    if names is not None and len(names) != architecture["n_chans"]:
        raise UserError(f"{kind}: n_chans is {architecture['n_chans']} but {len(names)} channel names were given")
    return {
        "kind": kind,
        "n_chans": int(architecture["n_chans"]),
        "n_outputs": int(architecture["n_outputs"]),
        "n_times": int(architecture["n_times"]),
        "sfreq": float(architecture["sfreq"]),
        "ch_names": None if names is None else list(names),
    }


BUILDERS = {"labram": build_labram, "eegnet": build_eegnet, "shallow": build_shallow}


def build_eeg_model(architecture: Mapping[str, Any]) -> nn.Module:
    """The model an architecture dict describes (``kind``: ``labram``, ``eegnet`` or ``shallow``)."""
    kind = architecture.get("kind")
    if kind not in BUILDERS:
        raise UserError(f"EEG architecture 'kind' must be one of {sorted(BUILDERS)}, got {kind!r}")
    return BUILDERS[kind](architecture)


def save_eeg_model(model: nn.Module, path: str | Path) -> None:
    """Weights to ``path`` (.safetensors) and the architecture to the ``.json`` beside it (merge adapters first;
    EEGNet's own max-norm parametrizations are part of the model)."""
    save_model(model, path, model.architecture["kind"])


def load_eeg_model(path: str | Path) -> nn.Module:
    """A model saved by `save_eeg_model` (safetensors + the JSON of its architecture), checked tensor by tensor."""
    return load_model(
        path,
        build_eeg_model,
        "an EEG checkpoint",
        "{'kind': 'labram' | 'eegnet' | 'shallow', 'n_chans': int, 'n_outputs': int, 'n_times': int, ...}",
    )


@dataclass(frozen=True)
class CheckpointReport:
    """What loading a converted LaBraM state dict found (`load_labram_weights`).

    Args:
        source: the file.
        matched: model tensors loaded from the file.
        missing: model tensors the file lacks (they keep their fresh initialisation).
        unexpected: file tensors the model has no place for (ignored: e.g. LaBraM's pretraining ``lm_head``).
        renamed: how many file names were translated from the original LaBraM layout (``student.`` prefix,
            ``mlp.fc1``/``fc2``, ``pos_embed``, ``time_embed``, ``head``).
        head_replaced: the file's head has another number of outputs; ``final_layer`` is freshly initialised.
        adjusted: tensors loaded in part, with how (``temporal_embedding``: the rows of this window's patches).
    """

    source: str
    matched: tuple[str, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    renamed: int = 0
    head_replaced: bool = False
    adjusted: tuple[str, ...] = ()

    def __str__(self) -> str:
        total = len(self.matched) + len(self.missing)
        text = f"{self.source}: {len(self.matched)} of {total} model tensors loaded"
        if self.renamed:
            text += f" ({self.renamed} names translated from the original LaBraM layout)"
        if self.head_replaced:
            text += "; head final_layer replaced (the file's has another number of outputs)"
        if self.missing:
            text += f"; missing {len(self.missing)} (freshly initialised): {_some(self.missing)}"
        if self.unexpected:
            text += f"; unexpected {len(self.unexpected)} (ignored): {_some(self.unexpected)}"
        if self.adjusted:
            text += f"; adjusted: {'; '.join(self.adjusted)}"
        return text


def _some(names: Sequence[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def labram_state_names(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """A LaBraM state dict in braindecode's ``Labram`` key layout, and how many names were translated.

    Removes one prefix of `LABRAM_PREFIXES` and applies `LABRAM_RENAMES` (the original repository's names).
    """
    out: dict[str, torch.Tensor] = {}
    renamed = 0
    for name, value in state.items():
        new = name
        for prefix in LABRAM_PREFIXES:
            if new.startswith(prefix):
                new = new[len(prefix) :]
                break
        for pattern, replacement in LABRAM_RENAMES:
            new = pattern.sub(replacement, new)
        renamed += new != name.removeprefix("labram.")
        if new in out:
            raise UserError(f"two tensors of the file map onto '{new}' (one of them is '{name}')")
        out[new] = value
    return out, renamed


def labram_architecture_of(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """What a braindecode-layout LaBraM state dict fixes: layers, conv channels, heads (from the q-norm width),
    MLP ratio, q/v biases and pooling; an empty dict for what it does not show."""
    found: dict[str, Any] = {}
    blocks = {int(m.group(1)) for name in state if (m := re.match(r"blocks\.(\d+)\.", name))}
    if blocks:
        found["num_layers"] = max(blocks) + 1
    conv1 = state.get("patch_embed.temporal_conv.conv1.weight")
    if conv1 is not None:
        found["conv_out_channels"] = int(conv1.shape[0])
    cls = state.get("cls_token")
    q_norm = state.get("blocks.0.attn.q_norm.weight")
    if cls is not None and q_norm is not None:
        found["num_heads"] = int(cls.shape[-1]) // int(q_norm.shape[0])
    fc1 = state.get("blocks.0.mlp.0.weight")
    if cls is not None and fc1 is not None:
        found["mlp_ratio"] = fc1.shape[0] / cls.shape[-1]
    if blocks:
        found["qkv_bias"] = "blocks.0.attn.q_bias" in state
        found["use_mean_pooling"] = "fc_norm.weight" in state
    return found


def load_labram_weights(model: LabramClassifier, path: str | Path) -> CheckpointReport:
    """Load a converted LaBraM state dict (safetensors) into ``model``; returns and logs the `CheckpointReport`.

    Names are translated to braindecode's layout (`labram_state_names`). Zero matched tensors is a `UserError`
    naming the file, and so is a matched tensor of another shape — except the head ``final_layer`` (freshly
    initialised when the file's has another number of outputs, and reported) and ``temporal_embedding``, of which
    the rows this window uses are taken when the file has more (LaBraM's has 16 patches: at most 16 s windows at
    200 Hz; fewer rows than the window's patches is an error). The model's full state is then loaded with
    ``strict=True``, the file's tensors in place of the fresh ones they match.
    """
    path = Path(path)
    state, renamed = labram_state_names(load_tensors(path))
    own = model.labram.state_dict()
    matched = [name for name in own if name in state]
    if not matched:
        raise UserError(
            f"{path}: none of its {len(state)} tensors ({_some(list(state))}) is a tensor of braindecode's Labram "
            f"({_some(list(own))}), even after translating the original LaBraM names; it is not a LaBraM checkpoint"
        )
    head_replaced = any(own[n].shape != state[n].shape for n in matched if n.startswith("final_layer."))
    adjusted = []
    new_state = dict(own)
    loaded = []
    for name in matched:
        value = state[name]
        if name.startswith("final_layer.") and head_replaced:
            continue
        rows = own[name].shape[1] if name == "temporal_embedding" else None
        if rows is not None and value.ndim == 3 and value.shape[1] != rows and value.shape[2] == own[name].shape[2]:
            if value.shape[1] < rows:
                raise UserError(
                    f"{path}: tensor 'temporal_embedding' has {value.shape[1]} time rows; this model's windows of "
                    f"{rows - 1} patches need {rows}: use windows of at most {value.shape[1] - 1} patches"
                )
            adjusted.append(f"temporal_embedding: the first {rows} of the file's {value.shape[1]} rows")
            value = value[:, :rows]
        if value.shape != own[name].shape:
            raise UserError(
                f"{path}: tensor '{name}': expected shape {tuple(own[name].shape)}, found {tuple(value.shape)}; the "
                "checkpoint was built with another architecture (see labram_architecture_of)"
            )
        new_state[name] = value.to(own[name].dtype)
        loaded.append(name)
    model.labram.load_state_dict(new_state, strict=True)
    report = CheckpointReport(
        source=str(path),
        matched=tuple(loaded),
        missing=tuple(n for n in own if n not in loaded),
        unexpected=tuple(n for n in state if n not in own),
        renamed=renamed,
        head_replaced=head_replaced,
        adjusted=tuple(adjusted),
    )
    # a backbone shipped without its head (the shipped ones) is what it should be: only other gaps are warnings
    worrying = report.unexpected or head_replaced or any(not n.startswith("final_layer.") for n in report.missing)
    (log.warning if worrying else log.info)("%s", report)
    return report


def _sizes(family: str, n_chans, n_outputs, n_times, sfreq) -> dict[str, Any]:
    sizes = {"n_chans": n_chans, "n_outputs": n_outputs, "n_times": n_times, "sfreq": sfreq}
    missing = [k for k, v in sizes.items() if v is None]
    if missing:
        raise UserError(
            f"the {family} family ships no checkpoint here and builds a fresh model from the data's sizes; "
            f"it needs {missing} (a task's model_sizes give them)"
        )
    return sizes


def _check_token_width(source, state: Mapping[str, torch.Tensor], options: Mapping[str, Any], sfreq: float) -> None:
    """A converted LaBraM's token width fixes its patch size (not stored in the file): refuse other patches."""
    cls, conv = state.get("cls_token"), options.get("conv_out_channels", 4)
    patch_size = options.get("patch_size") or int(round(sfreq))
    if cls is not None and cls.shape[-1] != conv * -(-patch_size // 8):
        raise UserError(
            f"{source}: its tokens are {cls.shape[-1]} wide (conv_out_channels {conv} × ceil(patch samples / 8)), "
            f"but {patch_size}-sample patches ({sfreq:g} Hz, one per second) give {conv * -(-patch_size // 8)}: "
            "resample the data to the checkpoint's rate (LaBraM-base: 200 Hz) or pass patch_size= (LaBraM-base: 200)"
        )


class _EEGFamily(ModelFamily):
    """Shared ``load``: a workbench checkpoint (checked against the data's sizes) or a fresh model of the sizes."""

    def load(
        self,
        source: str | Path | None = None,
        *,
        trust_checkpoint: bool = False,
        n_chans: int | None = None,
        n_outputs: int | None = None,
        n_times: int | None = None,
        sfreq: float | None = None,
        chs_info: Sequence[Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> nn.Module:
        """A workbench checkpoint at ``source`` (whose sizes and channel names must equal those given), or (None)
        a fresh model of ``n_chans``, ``n_outputs``, ``n_times``, ``sfreq`` and ``chs_info``."""
        names = channel_names(chs_info)
        if source is not None:
            model = load_eeg_model(source)
            kind = model.architecture["kind"]
            if kind != self.name:
                raise UserError(f"{source}: a {kind} checkpoint, not {self.name}; load it with --model {kind}")
            unknown = sorted(set(options) - set(model.architecture))
            if unknown:
                raise UserError(
                    f"{source}: a saved {self.name} model's architecture is in its .json; options {unknown} apply to "
                    "fresh models only"
                )
            given = {"n_chans": n_chans, "n_outputs": n_outputs, "n_times": n_times, "sfreq": sfreq, "ch_names": names}
            given = {k: (float(v) if k == "sfreq" else v) for k, v in given.items() if v is not None}
            # options the architecture records (a channel map) must equal the saved ones, like the sizes
            check_architecture(source, model.architecture, {**given, **options}, (*EEG_SIZES, "ch_names", *options))
            return model
        sizes = _sizes(self.name, n_chans, n_outputs, n_times, sfreq)
        return self.build(sizes, names, options)

    def files(self, source: str | Path | None = None) -> list[Path]:
        if source is None:
            return []
        path = Path(source)
        return [path, path.with_suffix(".json")] if path.with_suffix(".json").is_file() else [path]


@models.register
class LabramFamily(_EEGFamily):
    """braindecode's ``Labram`` (LaBraM, Jiang et al., ICLR 2024) as `LabramClassifier`: a fresh CPU-sized model of
    the data's sizes, a workbench checkpoint, or a converted LaBraM state dict (`load_labram_weights`).

    ``load(source=None, *, trust_checkpoint=False, n_chans, n_outputs, n_times, sfreq, chs_info, channel_map=None,
    patch_size=None, num_layers=4, num_heads=4, conv_out_channels=4, mlp_ratio=4.0, qkv_bias=False)``: the channel
    names (``chs_info``) are required — LaBraM embeds electrodes by name — and each must be in LaBraM's vocabulary
    or mapped by ``channel_map`` (see `LabramClassifier`). ``source``: a ``.safetensors`` with its ``.json``
    architecture beside it is a workbench checkpoint (sizes must match); one without is a converted LaBraM state
    dict, loaded into a model of the data's sizes whose layers, heads, conv channels, MLP ratio and biases are read
    from the file (`labram_architecture_of`; the patch size is not in the file: LaBraM-base needs 200-sample patches,
    i.e. 200 Hz data or ``patch_size=200``); the report is ``model.load_report``.
    """

    name = "labram"
    description = (
        "LaBraM EEG foundation transformer (braindecode Labram): fresh CPU-sized, a workbench or converted checkpoint; "
        "the EEG tasks' default is their shipped pretrained backbone"
    )

    def load(
        self,
        source=None,
        *,
        trust_checkpoint=False,
        n_chans=None,
        n_outputs=None,
        n_times=None,
        sfreq=None,
        chs_info=None,
        **options,
    ) -> nn.Module:
        if source is not None and not Path(source).with_suffix(".json").is_file():
            names = channel_names(chs_info)
            sizes = _sizes(self.name, n_chans, n_outputs, n_times, sfreq)
            state = labram_state_names(load_tensors(source))[0]
            inferred = labram_architecture_of(state)
            _check_token_width(source, state, {**inferred, **options}, sizes["sfreq"])
            model = self.build(sizes, names, {**inferred, **options})
            model.load_report = load_labram_weights(model, source)
            return model
        return super().load(
            source,
            trust_checkpoint=trust_checkpoint,
            n_chans=n_chans,
            n_outputs=n_outputs,
            n_times=n_times,
            sfreq=sfreq,
            chs_info=chs_info,
            **options,
        )

    def build(self, sizes: Mapping[str, Any], names: list[str] | None, options: Mapping[str, Any]) -> nn.Module:
        if names is None:
            raise UserError("the labram family needs channel names (chs_info): LaBraM embeds each electrode by name")
        known = {
            "channel_map",
            "patch_size",
            "num_layers",
            "num_heads",
            "conv_out_channels",
            "mlp_ratio",
            "qkv_bias",
            "use_mean_pooling",
        }
        unknown = sorted(set(options) - known)
        if unknown:
            raise UserError(f"labram: unknown option(s) {unknown}; known: {sorted(known)}")
        with warnings.catch_warnings():  # braindecode warns of non-canonical chs_info: the names are checked here
            warnings.filterwarnings("ignore", message="Labram chs_info does not match")
            return LabramClassifier(**sizes, ch_names=names, **options)


@models.register
class EEGNetFamily(_EEGFamily):
    """braindecode's ``EEGNet`` (Lawhern et al., 2018), built fresh from the data's sizes: a from-scratch baseline."""

    name = "eegnet"
    description = "EEGNet compact CNN (braindecode; from scratch, ~2.5k parameters)"

    def build(self, sizes: Mapping[str, Any], names: list[str] | None, options: Mapping[str, Any]) -> nn.Module:
        if options:
            raise UserError(f"eegnet takes no options, got {sorted(options)}")
        return build_eegnet({**sizes, "ch_names": names})


@models.register
class ShallowFamily(_EEGFamily):
    """braindecode's ``ShallowFBCSPNet`` (Schirrmeister et al., 2017), built fresh: a from-scratch baseline."""

    name = "shallow"
    description = "Shallow ConvNet / ShallowFBCSPNet (braindecode; from scratch)"

    def build(self, sizes: Mapping[str, Any], names: list[str] | None, options: Mapping[str, Any]) -> nn.Module:
        if options:
            raise UserError(f"shallow takes no options, got {sorted(options)}")
        return build_shallow({**sizes, "ch_names": names})

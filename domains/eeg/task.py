"""The EEG tasks: ``sleepedf`` (5-stage sleep staging) and ``motor-imagery`` (left vs right fist, or four classes).

The situation they model (GitHub issue 11): a sleep lab or a BCI group adapts a brainwave foundation model
(braindecode's ``Labram``, model ``labram``) to its own recordings with LoRA, and compares it with full fine-tuning,
head-only tuning and the small classic nets trained from scratch (``full@eegnet``, ``full@shallow``), on honest
subject-wise numbers.

Data (every layout read through MNE by `workbench.domains.eeg`, checked against its data card):

- ``sleepedf``: Sleep-EDF Expanded, sleep-cassette layout (``SC4ssNE0-PSG.edf`` + ``SC4ssNx-Hypnogram.edf``, card
  ``sleep-edf``); 30 s epochs of ``EEG Fpz-Cz`` and ``EEG Pz-Oz`` at 100 Hz, classes W, N1, N2, N3, REM. Default:
  the embedded synthetic nights of 6 subjects (card ``sleep-edf-synthetic``).
- ``motor-imagery``: PhysioNet EEGMMIDB (``S001/S001R04.edf``, card ``eegmmidb``), BCI Competition IV 2a GDF
  (``A01T.gdf``) or its BNCI ``.mat`` files (``A01T.mat``, card ``bci-iv-2a``), told apart by the files present;
  ``--class-set left-right`` (default) keeps the left and right hand/fist trials, ``all`` the four imagery
  classes. Default: the embedded synthetic EEGMMIDB imagery runs of 8 subjects, 9 sensorimotor channels at
  160 Hz, 4 s windows (card ``motor-imagery-synthetic``).

Model: with no ``--model``, the task's shipped LaBraM backbone (pretrained here by masked patch reconstruction on
generated source subjects, `workbench.domains.eeg.pretrain`; cards ``labram-sleepedf-small`` and
``labram-motor-small``) with a fresh head for the data's classes; ``--model labram`` is a fresh, untrained LaBraM,
``--model PATH`` a workbench or converted LaBraM checkpoint (matched / missing / unexpected tensors go into
``data_summary.model_load``).

LoRA: the ``lora`` method runs in the brainwave-LoRA study's setting (seed 001, `LBM_LORA`): ``conv`` and ``qkv``
adapted together, rank 8, alpha 8, dropout 0.5 on the adapters' input, conv ranks by the power-of-2 rule; any of
these flags given on the command line wins (``--targets conv,fc``, ``--dropout 0``).

Splits are by subject: the subjects are shuffled with ``--seed`` and ``--test-subjects`` (default 1) and
``--val-subjects`` (default 1) of them held out; every other subject trains. The subjects of each split go into
``metrics.json`` (``data_summary.split``); no window of a held-out subject is ever trained on. For data of too few
subjects (one EEGMMIDB subject's runs), ``--split-by record`` holds out whole records (runs, nights) instead, the
two counts then counting records: a within-subject, cross-record score, not a cross-subject one.

Grouped folds (``workbench compare``, `EegTask.hold_out`): a fold holds out what the split holds out whole — subjects,
or records with ``--split-by record`` (`EegTask.group_kind`) — and replaces the seeded split: the fold's ``test``
subjects (records) are scored, its ``val`` ones are the validation split (early stopping, the best epoch) and every
other one trains. A fold must name validation subjects: none is taken from the training ones.

Bad records (a file MNE cannot read, an EDF whose size is not what its header says, a hypnogram of another night, a
missing channel, ...) are skipped into ``task.skipped`` (with how many records were looked at) or raised, as
``--on-bad-record`` says, in `read` and `info` alike.

Inputs (`scale_windows`): ``--scaling uv100`` (default) divides the µV signals by 100 (units of 0.1 mV), what the
LaBraM authors' fine-tuning code feeds the model (``samples / 100`` in their ``engine_for_finetuning.py``;
braindecode's ``Labram`` takes any scale) and what keeps absolute amplitude, which sleep staging reads (N3 is
defined by slow waves above 75 µV); ``--scaling zscore`` standardises each channel of each window (mean 0, SD 1),
which removes amplitude differences between amplifiers and subjects and with them that information.

Loss: cross-entropy over the classes; ``--balanced-loss`` weights each class by the inverse of its training
frequency (normalised to a mean weight of 1 over the windows).

Metrics (test split, higher is better): ``balanced_accuracy`` (headline), ``cohen_kappa``, ``macro_f1`` (over the
classes present in the test split), ``accuracy``, and per class ``f1_<class>`` (for sleep ``f1_W`` ... ``f1_REM``;
0 for a class absent from the test split and never predicted).

Shapes:
    a sample's ``signal`` (n_chans, n_times) float32 (scaled, see above); a batch (signals (batch, n_chans,
    n_times) float32, labels (batch,) int64); model output (batch, n_classes) logits.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from workbench.domains.eeg.motor import (
    BCI2A_CHANNELS,
    BCI2A_CLASSES,
    BCI2A_RENAME,
    EEGMMIDB_CHANNELS,
    EEGMMIDB_CLASSES,
    read_bci_iv_2a,
    read_bnci_2a_mat,
    read_eegmmidb,
)
from workbench.domains.eeg.readers import (
    EEG_EXTENSIONS,
    EegWindows,
    allowed_sfreqs_from_card,
    cut_windows,
    read_recording,
)
from workbench.domains.eeg.sleepedf import SLEEP_CLASSES, SLEEP_EDF_CHANNELS, read_sleep_edf
from workbench.domains.splits import held_out_subjects, split_subjects
from workbench.models.eeg import CHECKPOINTS

from workbench import resampled_metrics
from workbench.errors import UserError
from workbench.metrics import accuracy, balanced_accuracy, cohen_kappa, macro_f1, per_class_f1
from workbench.model import spec_of
from workbench.options import Option
from workbench.records import BadRecordError
from workbench.registry import models, tasks
from workbench.task import Evaluation, Predictions, Task, TaskData, to_device

log = logging.getLogger(__name__)

EMBEDDED = Path(__file__).resolve().parent / "embedded"
EMBEDDED_SLEEP = EMBEDDED / "sleep-edf"
EMBEDDED_MOTOR = EMBEDDED / "eegmmidb"
#: What ``--split-by`` holds out whole.
SPLIT_BY = ("subject", "record")
#: How µV become model inputs (`scale_windows`).
SCALINGS = ("uv100", "zscore")
#: The channels of the embedded motor-imagery set (the 3 x 3 sensorimotor grid), also the default for EEGMMIDB.
SENSORIMOTOR_CHANNELS: tuple[str, ...] = ("FC3", "FCz", "FC4", "C3", "Cz", "C4", "CP3", "CPz", "CP4")
#: Sleep-EDF's bipolar derivations -> the 10-20 electrode whose position a channel-aware model (Labram's
#: position embedding) uses for them: the first electrode of each pair (an explicit, reported approximation).
SLEEP_CHANNEL_MAP: dict[str, str] = {"EEG Fpz-Cz": "FPZ", "EEG Pz-Oz": "PZ"}
#: ``--class-set`` -> the classes kept, per layout.
CLASS_SETS = {
    "left-right": {"eegmmidb": ("left_fist", "right_fist"), "bci-iv-2a": ("left_hand", "right_hand")},
    "all": {"eegmmidb": EEGMMIDB_CLASSES, "bci-iv-2a": BCI2A_CLASSES},
}
_SMALLEST_SD_UV = 1e-3
#: The ``lora`` method's defaults in the EEG tasks: the brainwave-model study's LoRA (seed 001) — the patch
#: convolutions and the fused qkv adapted together, alpha 8, dropout 0.5 on the adapters' input, conv ranks by the
#: power-of-2 rule. Its rank for linear layers is not in the summary we have: 8 (alpha / rank = 1) is our choice.
LBM_LORA = {"targets": "conv,qkv", "rank": 8, "alpha": 8.0, "dropout": 0.5, "conv_rank": "rule"}


def scale_windows(signals_uv: np.ndarray, scaling: str) -> np.ndarray:
    """Model inputs from windows in µV: ``uv100`` divides by 100 (units of 0.1 mV, LaBraM's), ``zscore`` removes
    each channel's mean and divides by its SD within each window (an SD below 1e-3 µV counts as 1e-3 µV).

    Shapes: signals_uv (..., n_chans, n_times) [µV] -> the same shape, float32.
    """
    x = np.asarray(signals_uv, np.float64)
    if scaling == "uv100":
        return (x / 100.0).astype(np.float32)
    if scaling == "zscore":
        centred = x - x.mean(axis=-1, keepdims=True)
        return (centred / np.maximum(centred.std(axis=-1, keepdims=True), _SMALLEST_SD_UV)).astype(np.float32)
    raise UserError(f"--scaling must be one of {SCALINGS}, got {scaling!r}")


@dataclass
class EegSample:
    """One window: ``signal (n_chans, n_times)`` float32 model input, its class, subject, record and onset [s]."""

    signal: np.ndarray
    label: int
    subject: str
    record: str
    onset_s: float


@dataclass
class EegData:
    """What `EegTask.read` returns: the labelled windows, their subject split and where they came from.

    ``rename`` maps file channel names to the model's (BCI IV 2a GDF's numbered channels); ``channel_map`` maps
    channels without a 10-20 position to the electrode a channel-aware model uses for them (None: all have one).
    """

    windows: EegWindows
    split: dict[str, list[str]]
    source: str
    description: str
    rename: dict[str, str]
    channel_map: dict[str, str] | None


class EegTask(Task):
    """What both EEG tasks share: subject-wise splits, scaling, cross-entropy, the metrics, figures, prediction."""

    requires = ("mne", "edfio", "braindecode", "sklearn")
    extra = "eeg"
    default_model = "labram"
    default_method = "lora"
    capabilities = frozenset({"predict", "folds"})
    precisions = ("float32", "bf16", "fp16")  # bf16 / fp16: mixed-precision training steps
    item_kind = "window"
    #: The shipped LaBraM backbone adapted when no --model is given (`workbench.domains.eeg.pretrain` makes it).
    pretrained: ClassVar[Path | None] = None
    #: Full fine-tuning, head only, and the classic nets trained from scratch.
    baselines = ("full", "readout", "full@eegnet", "full@shallow")
    metrics_note = (
        "Scores on the test subjects' windows (subject-wise split, data_summary.split in metrics.json), higher is "
        "better: balanced accuracy (mean recall over the classes), Cohen's kappa, macro F1 over the classes present, "
        "accuracy and per-class F1. LaBraM starts from the task's shipped backbone (pretrained by masked patch "
        "reconstruction on generated source subjects; its head is fresh, hence chance before adaptation), full@labram "
        "from fresh weights; the classic nets (eegnet, shallow) are trained from scratch."
    )
    #: Every window of the training and validation subjects (train_size / val_size cut them); one learning rate.
    defaults: ClassVar[Mapping[str, Any]] = {
        "epochs": 20,
        "batch_size": 16,
        "train_size": 100_000,
        "val_size": 100_000,
        "patience": 8,
        "learning_rate": 1e-3,
    }
    shared_options: ClassVar[tuple[Option, ...]] = (
        Option("val_subjects", int, 1, "subjects (records with --split-by record) held out for validation"),
        Option("test_subjects", int, 1, "subjects (records with --split-by record) held out for the test scores"),
        Option(
            "split_by",
            str,
            "subject",
            "hold out whole subjects, or whole records (runs, nights) for data of too few subjects: a within-subject, "
            "cross-record score",
            choices=SPLIT_BY,
        ),
        Option(
            "scaling",
            str,
            "uv100",
            "model input: 'uv100' µV / 100 (LaBraM's units, keeps amplitude) or 'zscore' per window and channel",
            choices=SCALINGS,
        ),
        Option("balanced_loss", bool, False, "weight the cross-entropy by inverse training-class frequency"),
        Option(
            "extra_sfreqs",
            str,
            "",
            "comma-separated sampling rates [Hz] accepted besides the card's; such recordings are resampled to the "
            "card's rate (logged)",
        ),
    )

    def __init__(self, **options: Any):
        super().__init__(**options)
        #: What a fold holds out whole: the split's unit (``--split-by``).
        self.group_kind = self.config["split_by"]

    @classmethod
    def profile(cls, method: str) -> dict[str, Any]:
        """``lora`` in the brainwave-model study's setting (`LBM_LORA`); the other methods as they are."""
        return {"method_options": dict(LBM_LORA)} if method == "lora" else {}

    # -- data and model --------------------------------------------------------------------------
    def read(self, data: str | Path | None, seed: int = 0) -> EegData:
        raw = self._read(data)
        windows = raw.windows
        groups, by = self._groups(windows), self.config["split_by"]
        needed = self.config["val_subjects"] + self.config["test_subjects"] + 1
        if len(set(groups)) < needed and min(self.config["val_subjects"], self.config["test_subjects"]) >= 1:
            hint = "" if by == "record" else (
                f"; the {len(set(windows.records))} record(s) can be held out instead with --split-by record"
            )
            raise UserError(
                f"{raw.source}: holding out {self.config['val_subjects']} validation and {self.config['test_subjects']} "
                f"test {by}(s) and training on one needs {needed} {by}s, the data have {len(set(groups))} "
                f"({', '.join(sorted(set(groups)))}){hint}"
            )
        raw.split = split_subjects(groups.tolist(), self.config["val_subjects"], self.config["test_subjects"], seed)
        self._sizes = {
            "n_chans": windows.n_chans,
            "n_outputs": len(windows.classes),
            "n_times": windows.n_times,
            "sfreq": windows.sfreq,
            "chs_info": tuple({"ch_name": name} for name in windows.ch_names),
            **({"channel_map": dict(raw.channel_map)} if raw.channel_map else {}),
        }
        return raw

    def split_groups(self, raw: EegData) -> list[str]:
        """The subjects of the windows (their records with ``--split-by record``), sorted."""
        return sorted(set(self._groups(raw.windows).tolist()))

    def hold_out(self, raw: EegData, split: Mapping[str, Sequence[str]]) -> EegData:
        """``raw`` with the subjects (records) ``split["test"]`` as its test split, ``split["val"]`` as its validation
        split and every other one training; ``raw`` itself is left as it was.

        Raises:
            UserError: (naming the data) no validation group, a group not in the data, a group in two splits.
        """
        parts = held_out_subjects(self.split_groups(raw), split, raw.source, self.group_kind)
        return replace(raw, split=parts)

    def _read(self, data: str | Path | None) -> EegData:
        """The task's windows (the embedded data when ``data`` is None), not yet split; ``self.skipped`` holds the
        records the reader skipped and how many it looked at."""
        raw = self._read_windows(data)
        self.skipped = raw.windows.skipped
        return raw

    def _read_windows(self, data: str | Path | None) -> EegData:
        """The task's windows as its reader gives them (the embedded data when ``data`` is None)."""
        raise NotImplementedError

    def _groups(self, windows: EegWindows) -> np.ndarray:
        """What the split holds out whole: each window's subject, or its record with ``--split-by record``."""
        return windows.records if self.config["split_by"] == "record" else windows.subjects

    def _rates(self, card: str) -> tuple[tuple[float, ...] | None, float | None]:
        """(allowed rates [Hz], rate to resample to or None) from ``card`` and ``--extra-sfreqs``."""
        allowed = allowed_sfreqs_from_card(None, card)
        text = self.config["extra_sfreqs"]
        try:
            extra = tuple(float(rate) for rate in text.split(",") if rate.strip())
        except ValueError:
            raise UserError(f"--extra-sfreqs {text!r}: expected comma-separated rates in Hz, e.g. 128,200") from None
        if not extra or allowed is None:
            return allowed, None
        return allowed + extra, allowed[0]

    def model_sizes(self) -> dict[str, Any]:
        """braindecode's sizes fixed by the data (after `read`): n_chans, n_outputs, n_times, sfreq, chs_info
        (and channel_map for channels without a 10-20 position)."""
        if not hasattr(self, "_sizes"):
            raise UserError(f"task '{self.name}': read the data before loading a model (the data fixes its sizes)")
        return dict(self._sizes)

    def load_model(self, source: str | Path | None, trust_checkpoint: bool = False) -> nn.Module:
        """The model through the models registry. With no ``--model``, the task's shipped LaBraM backbone
        (`pretrained`) loaded into a model of the data's sizes — or, when the data's rate is not the one it was
        pretrained at, a fresh LaBraM, with a warning; ``--model labram`` is always a fresh one. ``channel_map``
        goes only to the ``labram`` family (the one that places channels by name; a saved model must carry the
        same map); the classic nets take the plain sizes."""
        name, path = self.model_choice(source)
        sizes = self.model_sizes()
        if name != "labram":
            sizes.pop("channel_map", None)
        if source is None and self.pretrained is not None:
            path = self._shipped_backbone(sizes["sfreq"])
        return models.get(name)().load(path, trust_checkpoint=trust_checkpoint, **sizes)

    def model_files(self, source: str | Path | None) -> list[Path]:
        """The shipped backbone when no ``--model`` was given; else the family's files of ``source``."""
        if source is None and self.pretrained is not None:
            return [self.pretrained]
        return super().model_files(source)

    def _shipped_backbone(self, sfreq: float) -> str | None:
        """The shipped backbone's path when it was pretrained at ``sfreq`` [Hz] (None, logged, when not)."""
        from safetensors import safe_open

        with safe_open(str(self.pretrained), "pt") as handle:
            provenance = handle.metadata()
        pretrained_hz = json.loads(provenance["architecture"])["sfreq"]
        if np.isclose(pretrained_hz, sfreq):
            if provenance["scaling"] != self.config["scaling"]:
                log.warning(
                    "the shipped LaBraM backbone was pretrained on --scaling %s inputs, this run feeds it %s",
                    provenance["scaling"],
                    self.config["scaling"],
                )
            return str(self.pretrained)
        log.warning(
            "the shipped LaBraM backbone (%s) was pretrained on %g Hz windows and this data is at %g Hz: a fresh, "
            "untrained LaBraM is adapted instead (--model PATH takes a LaBraM checkpoint of this rate)",
            self.pretrained.name,
            pretrained_hz,
            sfreq,
        )
        return None

    def rebuild(self, source: str | Path | None, trust_checkpoint: bool, state: Mapping[str, Any]) -> nn.Module:
        """The base model of a finished run, of the sizes saved in its task state."""
        self._sizes = {
            "n_chans": len(state["ch_names"]),
            "n_outputs": len(state["classes"]),
            "n_times": int(state["n_times"]),
            "sfreq": float(state["sfreq"]),
            "chs_info": tuple({"ch_name": name} for name in state["ch_names"]),
            **({"channel_map": dict(state["channel_map"])} if state.get("channel_map") else {}),
        }
        return super().rebuild(source, trust_checkpoint, state)

    def _check_model(self, model: nn.Module, windows: EegWindows, source: str) -> None:
        """The model was built for these windows: channels, classes, samples per window and rate."""
        spec = spec_of(model)
        if spec is None or spec.signal is None:
            raise UserError(
                f"task '{self.name}' needs a model that declares its signal sizes (n_chans, n_times, sfreq); "
                f"{type(model).__name__} declares none — load it through a registered EEG model family"
            )
        signal = spec.signal
        expected = {
            "n_times": (windows.n_times, "samples per window"),
            "n_chans": (windows.n_chans, "channels"),
            "n_outputs": (len(windows.classes), "classes"),
        }
        for name, (value, what) in expected.items():
            if getattr(signal, name) != value:
                raise UserError(
                    f"{source}: the windows have {value} {what} ({name}), the {spec.family} model was built for "
                    f"{getattr(signal, name)}; use a model built for {windows.n_times} samples at {windows.sfreq:g} Hz "
                    f"x {windows.n_chans} channels x {len(windows.classes)} classes (or none: one is built fresh)"
                )
        if not np.isclose(signal.sfreq, windows.sfreq):
            raise UserError(
                f"{source}: the windows are at {windows.sfreq:g} Hz, the {spec.family} model expects "
                f"{signal.sfreq:g} Hz; resample the data (--extra-sfreqs) or use a model built for {windows.sfreq:g} Hz"
            )

    def prepare(
        self, model: nn.Module, raw: EegData, train_size: int, val_size: int, seed: int
    ) -> tuple[TaskData, dict[str, Any]]:
        windows = raw.windows
        self._check_model(model, windows, raw.source)
        rng = np.random.default_rng(seed)
        parts = {}
        for name, limit in (("train", train_size), ("val", val_size), ("test", None)):
            index = np.flatnonzero(np.isin(self._groups(windows), raw.split[name]))
            if limit is not None and len(index) > limit:
                index = np.sort(rng.choice(index, size=limit, replace=False))
            if not len(index):
                raise UserError(f"{raw.source}: the {name} {self.config['split_by']}s {raw.split[name]} have no window")
            parts[name] = windows.subset(index)
        counts = np.bincount(parts["train"].labels, minlength=len(windows.classes)).astype(float)
        weights = np.where(counts > 0, counts.sum() / np.maximum(counts, 1) / len(windows.classes), 0.0)
        weights = weights / (weights[parts["train"].labels].mean())
        self._class_weights = weights if self.config["balanced_loss"] else None
        samples = {name: self._samples(part) for name, part in parts.items()}
        summary = {
            "data": raw.description,
            "split": raw.split,
            "split_by": self.config["split_by"],
            "windows": {name: len(part) for name, part in parts.items()},
            "class_counts": {name: part.class_counts() for name, part in parts.items()},
            "channels": list(windows.ch_names),
            "sfreq_hz": windows.sfreq,
            "window_s": windows.n_times / windows.sfreq,
            "scaling": self.config["scaling"],
            "class_weights": None if self._class_weights is None else [float(w) for w in self._class_weights],
            "excluded": dict(windows.excluded),
            "skipped_records": [str(problem) for problem in windows.skipped],
            "notes": list(windows.notes),
            **({"channel_map": raw.channel_map} if raw.channel_map else {}),
            **({"model_load": _load_counts(model.load_report)} if hasattr(model, "load_report") else {}),
        }
        data = TaskData(samples["train"], samples["val"], samples["test"], raw.source, summary)
        state = {
            "classes": list(windows.classes),
            "ch_names": list(windows.ch_names),
            "sfreq": windows.sfreq,
            "n_times": windows.n_times,
            "scaling": self.config["scaling"],
            "rename": raw.rename,
            "channel_map": raw.channel_map,
        }
        return data, state

    def _samples(self, windows: EegWindows) -> list[EegSample]:
        signals = scale_windows(windows.signals_uv, self.config["scaling"])
        return [
            EegSample(signals[i], int(windows.labels[i]), str(windows.subjects[i]), str(windows.records[i]),
                      float(windows.onsets_s[i]))
            for i in range(len(windows))
        ]  # fmt: skip

    def restore(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        """Nothing of the data lives in the model; check it was built for the state's windows."""
        spec = spec_of(model)
        if spec is not None and spec.signal is not None and spec.signal.n_times != int(state["n_times"]):
            raise UserError(
                f"the model was built for {spec.signal.n_times} samples per window, the run's windows have "
                f"{state['n_times']}"
            )

    def test_samples(self, model: nn.Module, raw: EegData) -> list[EegSample]:
        self._check_model(model, raw.windows, raw.source)
        return self._samples(raw.windows.subset(np.isin(self._groups(raw.windows), raw.split["test"])))

    # -- training and scoring --------------------------------------------------------------------
    def collate(self, samples: Sequence[EegSample], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        signals = to_device(np.stack([s.signal for s in samples]), device)
        labels = to_device([s.label for s in samples], device, torch.int64)
        return signals, labels

    def _cross_entropy(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str) -> torch.Tensor:
        weight = None
        if getattr(self, "_class_weights", None) is not None:
            weight = torch.as_tensor(self._class_weights, dtype=logits.dtype, device=logits.device)
        return F.cross_entropy(logits, labels, weight=weight, reduction=reduction)

    def logits_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of logits (batch, n_classes) against class indices (batch,) (class-weighted with
        ``--balanced-loss``): the loss methods that compute the logits themselves (H-Tuning) use."""
        return self._cross_entropy(logits, labels, "none").mean()

    def sample_losses(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Cross-entropy of each window (class-weighted with ``--balanced-loss``), shape (batch,)."""
        signals, labels = batch
        return self._cross_entropy(model(signals), labels, "none")

    def loss(self, model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        return self.sample_losses(model, batch).mean()

    def batch_labels(self, batch: Any) -> torch.Tensor:
        return batch[1]

    def _probabilities(self, model: nn.Module, signals: np.ndarray, batch_size: int = 64) -> np.ndarray:
        """Softmax class probabilities. Shapes: signals (n, n_chans, n_times) -> (n, n_classes)."""
        model.eval()
        parameter = next(model.parameters())
        out = []
        with torch.no_grad():
            for start in range(0, len(signals), batch_size):
                x = torch.as_tensor(signals[start : start + batch_size], dtype=parameter.dtype, device=parameter.device)
                out.append(torch.softmax(model(x), dim=1).float().cpu().numpy())
        return np.concatenate(out)

    def evaluate(self, model: nn.Module, samples: Sequence[EegSample], device) -> Evaluation:
        truth = np.array([s.label for s in samples], np.int64)
        probabilities = self._probabilities(model, np.stack([s.signal for s in samples]))
        predicted = probabilities.argmax(axis=1)
        classes = self._classes(probabilities.shape[1])
        kappa = cohen_kappa(truth, predicted)
        metrics = {
            "balanced_accuracy": balanced_accuracy(truth, predicted),
            "cohen_kappa": 0.0 if np.isnan(kappa) else kappa,  # one class everywhere: no agreement beyond chance
            "macro_f1": macro_f1(truth, predicted),
            "accuracy": accuracy(truth, predicted),
        }
        f1 = per_class_f1(truth, predicted, labels=range(len(classes)))
        metrics.update({f"f1_{name}": float(value) for name, value in zip(classes, f1)})
        subjects = sorted({s.subject for s in samples})
        predictions = {
            "truth": truth,
            "predicted": predicted,
            "probabilities": probabilities,
            "subject_index": np.array([subjects.index(s.subject) for s in samples], np.int64),
            "onsets_s": np.array([s.onset_s for s in samples], np.float64),
        }
        by_record = self.config["split_by"] == "record"
        return Evaluation(metrics, predictions, np.array([s.record if by_record else s.subject for s in samples]))

    def rescore(self, predictions: Mapping[str, np.ndarray], counts: np.ndarray) -> dict[str, np.ndarray]:
        """`evaluate`'s label metrics of resampled windows (kappa 0 where truth and prediction are one class)."""
        n_classes = predictions["probabilities"].shape[1]
        matrices = resampled_metrics.confusion(predictions["truth"], predictions["predicted"], counts, n_classes)
        scores = resampled_metrics.label_scores(matrices)
        metrics = {name: scores[name] for name in ("balanced_accuracy", "cohen_kappa", "macro_f1", "accuracy")}
        metrics["cohen_kappa"] = np.nan_to_num(metrics["cohen_kappa"], nan=0.0)
        metrics.update({f"f1_{name}": scores["f1"][:, k] for k, name in enumerate(self._classes(n_classes))})
        return metrics

    def _classes(self, n_classes: int) -> tuple[str, ...]:
        """The class names of the data read (the generic ``0, 1, ...`` before any read)."""
        sizes = getattr(self, "_class_names", None)
        return tuple(sizes) if sizes and len(sizes) == n_classes else tuple(str(k) for k in range(n_classes))

    def figures(self, evaluations: Mapping[str, Evaluation], out_dir: Path) -> list[tuple[str, str]]:
        from workbench.domains.plots import confusion_matrices

        first = next(iter(evaluations.values()))
        return [confusion_matrices(evaluations, self._classes(first.predictions["probabilities"].shape[1]), out_dir)]

    # -- batch prediction ------------------------------------------------------------------------
    def predict_folder(self, model: nn.Module, folder: Path, state: Mapping[str, Any]) -> Predictions:
        """Score every recording (EDF, BDF, GDF, FIF, BrainVision; recursively; Sleep-EDF hypnograms left aside) of
        ``folder`` in consecutive windows of the run's length from the recording's start: one row per window
        (record, onset [s], predicted class, class probabilities, status), and per record the windows, the predicted
        class counts and the seconds left after the last whole window in the facts.

        A bad record (unreadable, a missing channel, a rate other than the run's) gets one row with ``status``
        "error: <why>" and no scores; the others go on.
        """
        classes = list(state["classes"])
        n_times, sfreq = int(state["n_times"]), float(state["sfreq"])
        files = [
            path
            for path in sorted(Path(folder).rglob("*"))
            if path.suffix.lower() in EEG_EXTENSIONS and not path.name.lower().endswith("-hypnogram.edf")
        ]
        if not files:
            raise UserError(f"{folder}: no recording ({', '.join(EEG_EXTENSIONS)}) in this folder")
        columns = ["record", "onset_s", "status", "predicted"] + [f"p_{c}" for c in classes]
        rows: list[dict[str, Any]] = []
        records: dict[str, Any] = {}
        for path in files:
            record = str(path.relative_to(folder))
            try:
                selection = read_recording(
                    path, state["ch_names"], rename=state.get("rename") or None, allowed_sfreqs=(sfreq,)
                )
            except UserError as error:
                problem = error.problem if isinstance(error, BadRecordError) else str(error)
                rows.append({"record": record, "status": f"error: {problem}"})
                records[record] = {"status": f"error: {problem}"}
                continue
            data_uv = selection.raw.get_data() * 1e6
            starts = np.arange(0, data_uv.shape[1] - n_times + 1, n_times)
            if not len(starts):
                problem = f"shorter than one window ({data_uv.shape[1] / sfreq:g} s < {n_times / sfreq:g} s)"
                rows.append({"record": record, "status": f"error: {problem}"})
                records[record] = {"status": f"error: {problem}"}
                continue
            signals = scale_windows(cut_windows(data_uv, starts, n_times), state["scaling"])
            probabilities = self._probabilities(model, signals)
            predicted = probabilities.argmax(axis=1)
            for start, p, k in zip(starts, probabilities, predicted):
                row = {"record": record, "onset_s": f"{start / sfreq:g}", "status": "ok", "predicted": classes[k]}
                row.update({f"p_{c}": f"{p[j]:.6f}" for j, c in enumerate(classes)})
                rows.append(row)
            counts = Counter(classes[k] for k in predicted)
            records[record] = {
                "status": "ok",
                "windows": len(starts),
                "predicted_counts": {c: counts.get(c, 0) for c in classes},
                "seconds_after_last_window": (data_uv.shape[1] - starts[-1] - n_times) / sfreq,
            }
        facts = {
            "classes": classes,
            "channels": list(state["ch_names"]),
            "sfreq_hz": sfreq,
            "window_s": n_times / sfreq,
            "scaling": state["scaling"],
            "per_record": records,
        }
        return Predictions(columns, rows, facts)

    # -- data commands ---------------------------------------------------------------------------
    def pretrain(self, out: Path, **kwargs: Any) -> str:
        """The shipped LaBraM foundation of this task, made by masked patch reconstruction on generated source
        subjects (`workbench.domains.eeg.pretrain`)."""
        from workbench.domains.eeg.pretrain import pretrain

        channel_map = dict(SLEEP_CHANNEL_MAP) if self.name == "sleepedf" else None
        scores = pretrain(self.name, out, scaling=self.config["scaling"], channel_map=channel_map, **kwargs)
        return f"wrote {out} (LaBraM backbone, braindecode key layout, no head); validation {scores}"

    def info(self, data: str | Path | None) -> str:
        raw = self._read(data)
        subjects = raw.windows.subject_counts()
        return "\n".join(
            [
                f"source: {raw.description}",
                raw.windows.report(),
                f"subjects ({len(subjects)}): " + ", ".join(f"{s} {n}" for s, n in subjects.items()),
            ]
        )


@tasks.register
class SleepEdf(EegTask):
    """Five-stage sleep staging (W, N1, N2, N3, REM) on 30 s epochs of Fpz-Cz and Pz-Oz, Sleep-EDF layout."""

    name = "sleepedf"
    pretrained = CHECKPOINTS / "labram_sleepedf_small.safetensors"
    description = "Sleep staging (W/N1/N2/N3/REM) from EEG Fpz-Cz + Pz-Oz, 30 s epochs; Sleep-EDF cassette layout"
    card = "sleep-edf-synthetic"
    reads = ("sleep-edf",)
    metrics = ("balanced_accuracy", "cohen_kappa", "macro_f1", "accuracy") + tuple(f"f1_{c}" for c in SLEEP_CLASSES)
    examples = (
        "workbench adapt --domain sleepedf                       # LoRA on Labram + full, readout, EEGNet, Shallow",
        "workbench adapt --domain sleepedf --targets conv,fc --rank 4   # LoRA on other target groups",
        "workbench adapt --domain sleepedf --data ~/sleep-edfx/sleep-cassette --test-subjects 10 --val-subjects 10",
        "workbench predict --run runs/sleep --input psg_folder/ --output stages.csv",
        "workbench data generate sleepedf --out my_nights --subjects 10",
    )
    options = EegTask.shared_options + (
        Option(
            "wake_margin_min",
            float,
            30.0,
            "keep wake epochs only within this many minutes of the sleep period (-1: keep every wake epoch)",
        ),
    )
    generate_options = (Option("subjects", int, 6, "subjects (one night each) of the generated set"),)

    def default_data(self, seed: int) -> Path:
        """The embedded folder of synthetic nights."""
        return EMBEDDED_SLEEP

    def _read_windows(self, data: str | Path | None) -> EegData:
        embedded = data is None
        root = EMBEDDED_SLEEP if embedded else Path(data)
        if not root.exists():
            raise UserError(f"{root}: no such folder (give --data a folder of SC4ssNE0-PSG.edf + hypnogram pairs)")
        allowed, resample_to = self._rates("sleep-edf")
        margin = self.config["wake_margin_min"]
        windows = read_sleep_edf(
            root,
            channels=SLEEP_EDF_CHANNELS,
            wake_margin_min=None if margin < 0 else margin,
            allowed_sfreqs=allowed,
            resample_to=resample_to,
            on_error=self.config["on_bad_record"],
        )
        self._class_names = windows.classes
        what = "embedded synthetic Sleep-EDF nights" if embedded else f"Sleep-EDF cassette layout at {root}"
        return EegData(windows, {}, str(root), what, {}, dict(SLEEP_CHANNEL_MAP))

    def figures(self, evaluations: Mapping[str, Evaluation], out_dir: Path) -> list[tuple[str, str]]:
        from workbench.domains.eeg import plots

        return super().figures(evaluations, out_dir) + [plots.hypnograms(evaluations, SLEEP_CLASSES, out_dir)]

    def generate(self, out: Path, seed: int | None = None, subjects: int = 6) -> str:
        """Synthetic nights in Sleep-EDF's sleep-cassette layout (`generate_sleep_edf`, card sleep-edf-synthetic)."""
        from workbench.domains.eeg.generate import generate_sleep_edf

        if subjects < 1:
            raise UserError(f"--subjects must be at least 1, got {subjects}")
        generate_sleep_edf(out, seed=2026 if seed is None else seed, subjects=subjects, progress=self.progress)
        return f"wrote {subjects} synthetic night(s) in Sleep-EDF's layout to {out} (read with --data {out})"


_GDF = re.compile(r"^A\d\d[TE]\.gdf$", re.IGNORECASE)
_MAT = re.compile(r"^A\d\d[TE]\.mat$", re.IGNORECASE)
_EEGMMIDB = re.compile(r"^S\d{3}R\d{2}\.edf$", re.IGNORECASE)


@tasks.register
class MotorImagery(EegTask):
    """Motor imagery: left vs right fist/hand (or four classes), EEGMMIDB or BCI Competition IV 2a layouts."""

    name = "motor-imagery"
    pretrained = CHECKPOINTS / "labram_motor_small.safetensors"
    description = "Motor imagery (left vs right fist, or 4 classes); EEGMMIDB, BCI IV 2a GDF or BNCI .mat layouts"
    card = "motor-imagery-synthetic"
    reads = ("eegmmidb", "bci-iv-2a")
    metrics = ("balanced_accuracy", "cohen_kappa", "macro_f1", "accuracy")
    examples = (
        "workbench adapt --domain motor-imagery                  # left vs right fist, LoRA + 4 baselines",
        "workbench adapt --domain motor-imagery --class-set all --model labram   # 4 classes, a fresh LaBraM",
        "workbench adapt --domain motor-imagery --data ~/BCICIV_2a_gdf --test-subjects 2",
        "workbench data generate motor-imagery --out my_mi --subjects 20 --difficulty 0.5",
    )
    options = EegTask.shared_options + (
        Option(
            "class_set",
            str,
            "left-right",
            "classes: left vs right fist/hand, or all four imagery classes of the layout",
            choices=tuple(CLASS_SETS),
        ),
        Option(
            "channels",
            str,
            "",
            "comma-separated 10-20 channels of the model ('' : the 3x3 sensorimotor grid for EEGMMIDB, the 22 of BCI "
            "IV 2a; 'all': every channel of the layout)",
        ),
        Option("interpolate_channels", bool, False, "interpolate missing 10-20 channels (logged) instead of refusing"),
    )
    generate_options = (
        Option("subjects", int, 8, "subjects of the generated set"),
        Option("runs", str, "4,6", "imagery runs per subject (4/8/12: left vs right fist; 6/10/14: fists vs feet)"),
        Option("trials_per_run", int, 6, "imagery trials per run (even)"),
        Option("difficulty", float, 0.35, "0 (deep desynchronisation, little noise) ... 1 (shallow, much noise)"),
    )

    def default_data(self, seed: int) -> Path:
        """The embedded folder of synthetic EEGMMIDB runs."""
        return EMBEDDED_MOTOR

    def _layout(self, root: Path) -> str:
        """'bci-iv-2a-gdf', 'bci-iv-2a-mat' or 'eegmmidb', by the files present under ``root``."""
        names = [path.name for path in root.rglob("*")] if root.is_dir() else [root.name]
        if any(_GDF.match(name) for name in names):
            return "bci-iv-2a-gdf"
        if any(_MAT.match(name) for name in names):
            return "bci-iv-2a-mat"
        if any(_EEGMMIDB.match(name) for name in names):
            return "eegmmidb"
        raise UserError(
            f"{root}: no motor-imagery layout found: expected EEGMMIDB (S001/S001R04.edf), BCI Competition IV 2a GDF "
            "(A01T.gdf, A01E.gdf + A01E.mat) or BNCI 001-2014 (A01T.mat, A01E.mat) files"
        )

    def _channels(self, layout: str, embedded: bool) -> tuple[str, ...]:
        text = self.config["channels"].strip()
        everything = BCI2A_CHANNELS if layout.startswith("bci") else EEGMMIDB_CHANNELS
        if text == "all":
            return SENSORIMOTOR_CHANNELS if embedded else everything
        if text:
            return tuple(name.strip() for name in text.split(",") if name.strip())
        return BCI2A_CHANNELS if layout.startswith("bci") else SENSORIMOTOR_CHANNELS

    def _read_windows(self, data: str | Path | None) -> EegData:
        embedded = data is None
        root = EMBEDDED_MOTOR if embedded else Path(data)
        if not root.exists():
            raise UserError(f"{root}: no such folder (give --data an EEGMMIDB or BCI IV 2a folder)")
        layout = "eegmmidb" if embedded else self._layout(root)
        channels = self._channels(layout, embedded)
        card = "bci-iv-2a" if layout.startswith("bci") else "eegmmidb"
        allowed, resample_to = self._rates(card)
        common = {
            "channels": channels,
            "allowed_sfreqs": allowed,
            "resample_to": resample_to,
            "allow_interpolation": self.config["interpolate_channels"],
            "on_error": self.config["on_bad_record"],
        }
        reader = {"bci-iv-2a-gdf": read_bci_iv_2a, "bci-iv-2a-mat": read_bnci_2a_mat}.get(layout, read_eegmmidb)
        windows = reader(root, **common)
        kept = CLASS_SETS[self.config["class_set"]][card]
        windows = _keep_classes(windows, kept, f"class outside --class-set {self.config['class_set']}")
        self._class_names = windows.classes
        what = {
            "eegmmidb": "EEGMMIDB imagery runs",
            "bci-iv-2a-gdf": "BCI Competition IV 2a GDF",
            "bci-iv-2a-mat": "BCI IV 2a, BNCI .mat",
        }[layout]
        description = f"embedded synthetic {what}" if embedded else f"{what} at {root}"
        rename = BCI2A_RENAME if layout == "bci-iv-2a-gdf" else {}
        return EegData(windows, {}, str(root), f"{description}, classes {', '.join(kept)}", dict(rename), None)

    def generate(
        self,
        out: Path,
        seed: int | None = None,
        subjects: int = 8,
        runs: str = "4,6",
        trials_per_run: int = 6,
        difficulty: float = 0.35,
    ) -> str:
        """Synthetic imagery runs in EEGMMIDB's layout (`generate_motor_imagery`, card motor-imagery-synthetic)."""
        from workbench.domains.eeg.generate import generate_motor_imagery

        try:
            run_numbers = tuple(int(run) for run in runs.split(",") if run.strip())
        except ValueError:
            raise UserError(f"--runs {runs!r}: expected comma-separated run numbers, e.g. 4,6") from None
        generate_motor_imagery(
            out,
            seed=2026 if seed is None else seed,
            subjects=subjects,
            runs=run_numbers,
            trials_per_run=trials_per_run,
            difficulty=difficulty,
            progress=self.progress,
        )
        return f"wrote {subjects} subject(s) of synthetic imagery runs in EEGMMIDB's layout to {out}"


def _load_counts(report) -> dict[str, Any]:
    """What loading a LaBraM state dict found (`workbench.models.eeg.CheckpointReport`), for ``data_summary``."""
    return {
        "source": report.source,
        "matched": len(report.matched),
        "missing": list(report.missing),
        "unexpected": list(report.unexpected),
        "head_replaced": report.head_replaced,
    }


def _keep_classes(windows: EegWindows, kept: Sequence[str], reason: str) -> EegWindows:
    """The windows of the classes ``kept`` (numbered in that order); the others are counted under ``reason``."""
    index = [windows.classes.index(name) for name in kept]
    mask = np.isin(windows.labels, index)
    if not mask.any():
        raise UserError(f"{windows.source}: no window of the classes {', '.join(kept)}")
    subset = windows.subset(mask)
    excluded = dict(windows.excluded)
    if (~mask).sum():
        excluded[reason] = int((~mask).sum())
    relabel = np.array([index.index(label) for label in subset.labels], np.int64)
    return replace(subset, labels=relabel, classes=tuple(kept), excluded=excluded)

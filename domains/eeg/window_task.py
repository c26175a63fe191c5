"""What the two EEG tasks share (`EegTask`): subject-wise splits and folds, the model inputs (`scale_windows`), the
shipped backbone, cross-entropy, the metrics, figures and batch prediction. The tasks, and what each of these does
for the user, are described in `workbench.domains.eeg.task`.

Shapes:
    a sample's ``signal`` (n_chans, n_times) float32 (scaled, see above); a batch (signals (batch, n_chans,
    n_times) float32, labels (batch,) int64); model output (batch, n_classes) logits.
"""


from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from workbench.domains.eeg.readers import (
    EEG_EXTENSIONS,
    EegWindows,
    allowed_sfreqs_from_card,
    cut_windows,
    read_recording,
)
from workbench.domains.splits import held_out_subjects, split_subjects

from workbench.core import resampled_metrics
from workbench.core.errors import UserError
from workbench.core.metrics import accuracy, balanced_accuracy, cohen_kappa, macro_f1, per_class_f1
from workbench.core.model import spec_of
from workbench.core.options import Option
from workbench.core.records import BadRecordError
from workbench.core.registry import models
from workbench.core.task import Evaluation, Predictions, Task, TaskData, to_device

log = logging.getLogger(__name__)

#: What ``--split-by`` holds out whole.
SPLIT_BY = ("subject", "record")
#: How µV become model inputs (`scale_windows`).
SCALINGS = ("uv100", "zscore")
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
    #: Channels without a 10-20 position -> the electrode a channel-aware model uses for them (None: all have one).
    channel_map: ClassVar[Mapping[str, str] | None] = None
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
                f"{raw.source}: holding out {self.config['val_subjects']} validation and "
                f"{self.config['test_subjects']} test {by}(s) and training on one needs {needed} {by}s, the data have "
                f"{len(set(groups))} ({', '.join(sorted(set(groups)))}){hint}"
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

        channel_map = dict(self.channel_map) if self.channel_map else None
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


def _load_counts(report) -> dict[str, Any]:
    """What loading a LaBraM state dict found (`workbench.models.eeg.CheckpointReport`), for ``data_summary``."""
    return {
        "source": report.source,
        "matched": len(report.matched),
        "missing": list(report.missing),
        "unexpected": list(report.unexpected),
        "head_replaced": report.head_replaced,
    }

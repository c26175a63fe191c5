"""The ``physio`` task: heartbeat classes (AAMI N, S, V, F) at a new site, from a few labelled patients.

The situation it models (GitHub issue 12): a hospital with a few labelled recordings and no GPU personalises a
pretrained physiological backbone to its own beats. The default method is PhysioPFM (``physiopfm``,
`workbench.adaptation.physiopfm`): the site's class shapelets go into a generator fitted on a bank of LoRAs of
other sites (the shipped bank, `workbench.domains.physio.bank`, card ``physiopfm-bank``), the generated LoRA is
merged, and the model predicts — no gradient step on the site's beats. It runs beside its baselines (the frozen
backbone with the ETF head, the mean of the bank, the nearest-descriptor entry, a linear probe, the same LoRA trained
at the site, full fine-tuning); ``--method lora`` / ``full`` / ``readout`` / ``htuning`` train at the site.

Data (`workbench.domains.physio`, read through wfdb):

- default: one site of the embedded synthetic multi-site ECG (``--target-site``, default D, the wearable patch;
  card ``physio-synthetic``), its 6 subjects split below;
- ``--data FOLDER``: the folder is the new site: MIT-BIH Arrhythmia (card ``mitbih``; 360 Hz, paced records left
  out) or any folder of beat-annotated WFDB records; lead ``--lead`` (default MLII).

Splits are by subject (record) only. With MIT-BIH's record names: de Chazal's DS1 records are the site's labelled
patients (``--val-subjects`` of them, drawn with ``--seed``, for early stopping) and DS2 its test patients;
otherwise the subjects are shuffled with ``--seed``, ``--test-subjects`` (default 2) and ``--val-subjects``
(default 1) held out. The subjects of each split go into ``metrics.json`` (``data_summary.split``).

Grouped folds (``workbench compare``, `Physio.hold_out`): a fold holds out whole patients of the target site — the
patients the split above assigns (MIT-BIH records in neither DS1 nor DS2 stay out) — and replaces that split: its
``test`` patients are scored, its ``val`` patients are the validation split (early stopping; with the training
patients, the site's labelled examples PhysioPFM describes the site by) and every other patient trains. The training
patients must still have beats of two classes. The PhysioPFM bank is untouched: it holds other sites' LoRAs, and the
entries of the target site are left out as in every run. A fold must name validation patients: none is taken from
the training ones.

Inputs: a window of the lead around each annotated R peak (0.24 s before, 0.46 s after), resampled to the
backbone's rate (250 Hz, polyphase; the resampling is recorded in ``data_summary.notes``), z-scored per beat:
175 samples. Classes: N, S, V, F — AAMI's Q (paced, unclassifiable) is left out and counted; a class absent at
the site is reported (``data_summary.absent_classes``), not an error.

Loss: cross-entropy weighted by the inverse training frequency of each class (mean weight 1 over the beats;
``--unweighted-loss`` is plain cross-entropy): normal beats outnumber the others tenfold or more.

Metrics (test patients, higher is better): ``balanced_accuracy`` (headline), ``accuracy``, ``macro_f1`` (classes
present), ``cohen_kappa``, ``recall_N`` … ``recall_F`` (0 for a class absent from the test patients).

Shapes:
    a sample's ``beat`` (175,) float32; a batch (beats (batch, 175) float32, labels (batch,) int64); model output
    (batch, 4) logits.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from workbench.adaptation.physiopfm.bank import class_weights
from workbench.domains.physio.bank import SHIPPED_BANK, record_hashes
from workbench.domains.physio.beats import (
    AAMI_CLASSES,
    BeatSet,
    has_mitbih_names,
    inter_patient_split,
    read_annotated_beats,
    read_beat_folder,
    read_mitbih,
)
from workbench.domains.splits import held_out_subjects, split_subjects
from workbench.models.physio import BACKBONE_RATE_HZ

from workbench.core import resampled_metrics
from workbench.core.errors import UserError
from workbench.core.metrics import accuracy, balanced_accuracy, cohen_kappa, macro_f1, per_class_recall
from workbench.core.model import spec_of
from workbench.core.options import Option
from workbench.core.records import BadRecordError, SkipReport
from workbench.core.registry import tasks
from workbench.core.task import Evaluation, Predictions, Task, TaskData, to_device

log = logging.getLogger(__name__)

EMBEDDED = Path(__file__).resolve().parent / "embedded"
#: The classes of the task (AAMI without Q).
CLASSES = AAMI_CLASSES[:4]
BEFORE_S, AFTER_S = 0.24, 0.46  # whole samples at 250, 360 and 500 Hz: 175 at the backbone's rate
#: Samples of a beat at the backbone's rate.
BEAT_SAMPLES = round(BEFORE_S * BACKBONE_RATE_HZ) + round(AFTER_S * BACKBONE_RATE_HZ)
SITES = ("A", "B", "C", "D")
#: What ``--method physiopfm`` is compared with in the same run.
PHYSIOPFM_BASELINES = ("physiopfm-none", "physiopfm-mean", "physiopfm-nearest", "readout", "physiopfm-local", "full")


@dataclass
class BeatSample:
    """One beat: ``beat (175,)`` float32 (resampled, z-scored), its class index and subject."""

    beat: np.ndarray
    label: int
    subject: str


@dataclass
class SiteData:
    """What `Physio.read` returns: the site's beats (at the site's rate), the subject split, where they came from."""

    beats: BeatSet
    split: dict[str, list[str]]
    source: str
    description: str
    site: str
    #: sha256 of each record's .dat file (PhysioPFM refuses a bank fitted on any of them)
    record_sha256: dict[str, str]


def model_inputs(beats_mv: np.ndarray, fs_hz: float) -> np.ndarray:
    """Beats (n, samples at ``fs_hz``) [mV] → the backbone's inputs (n, 175): resampled to 250 Hz, z-scored each."""
    from scipy.signal import resample_poly

    ratio = Fraction(BACKBONE_RATE_HZ / fs_hz).limit_denominator(1000)
    x = np.asarray(beats_mv, np.float64)
    if ratio != 1:
        x = resample_poly(x, ratio.numerator, ratio.denominator, axis=1)
    if x.shape[1] != BEAT_SAMPLES:  # a rounding sample at rates whose windows are not whole
        x = (
            x[:, :BEAT_SAMPLES]
            if x.shape[1] > BEAT_SAMPLES
            else np.pad(x, ((0, 0), (0, BEAT_SAMPLES - x.shape[1])), "edge")
        )
    centred = x - x.mean(axis=1, keepdims=True)
    return (centred / np.maximum(centred.std(axis=1, keepdims=True), 1e-6)).astype(np.float32)


@tasks.register
class Physio(Task):
    """Heartbeat classes (AAMI N, S, V, F) at a new site from a few labelled patients (PhysioPFM's problem)."""

    name = "physio"
    precisions = ("float32", "bf16", "fp16")  # bf16 / fp16: mixed-precision training steps
    description = "Heartbeat classes N/S/V/F at a new site (synthetic multi-site ECG or MIT-BIH); PhysioPFM's problem"
    card = "physio-synthetic"
    reads = ("mitbih",)
    requires = ("wfdb", "neurokit2", "scipy")
    extra = "physio"
    default_model = "patch-gpt"
    default_method = "physiopfm"
    capabilities = frozenset({"predict", "folds"})
    group_kind = "patient"
    item_kind = "beat"
    baselines = ("full", "readout")
    metrics = ("balanced_accuracy", "accuracy", "macro_f1", "cohen_kappa") + tuple(f"recall_{c}" for c in CLASSES)
    metrics_note = (
        "Scores on the test patients' beats (subject-wise split, data_summary.split in metrics.json), higher is "
        "better: balanced accuracy (mean recall over the classes present), accuracy, macro F1, Cohen's kappa and "
        "per-class recall. The backbone is the shipped pretrained patch-gpt with a fresh head."
    )
    defaults: ClassVar[Mapping[str, Any]] = {
        "epochs": 20,
        "batch_size": 32,
        "train_size": 100_000,
        "val_size": 100_000,
        "patience": 6,
        "learning_rate": 1e-3,
    }
    options = (
        Option("target_site", str, "D", "the embedded site adapted to (without --data)", choices=SITES),
        Option("val_subjects", int, 1, "labelled subjects held out for validation (early stopping)"),
        Option("test_subjects", int, 2, "subjects held out for the test scores (without DS1/DS2)"),
        Option("lead", str, "MLII", "the ECG lead beats are cut from (its name in the WFDB headers)"),
        Option("unweighted_loss", bool, False, "plain cross-entropy instead of the class-weighted one"),
    )
    examples = (
        "workbench adapt --domain physio                     # PhysioPFM: a generated LoRA + 6 baselines, ~1.5 min",
        "workbench adapt --domain physio --method lora       # local LoRA on the pretrained backbone + full, probe",
        "workbench adapt --domain physio --generator regressor --descriptor raw    # PhysioPFM's ablations",
        "workbench predict --run runs/physio --input ~/my-wfdb-folder --output beats.csv",
        "workbench adapt --domain physio --target-site B --test-subjects 3",
        "workbench adapt --domain physio --data ~/mit-bih-arrhythmia-database-1.0.0   # DS1 labelled, DS2 test",
    )

    # -- data and model --------------------------------------------------------------------------
    def read(self, data: str | Path | None, seed: int = 0) -> SiteData:
        common = {"lead": self.config["lead"], "before_s": BEFORE_S, "after_s": AFTER_S, "progress": self.progress,
                  "on_error": self.config["on_bad_record"],
                  "allow_outside": self.config["allow_paths_outside"]}  # fmt: skip
        if data is None:
            site = self.config["target_site"]
            beats = read_beat_folder(EMBEDDED / f"site-{site}", **common)
            description = f"embedded synthetic multi-site ECG, site {site}"
        else:
            root = Path(data)
            if not root.is_dir():
                raise UserError(f"{root}: no such folder (give --data a folder of WFDB records with .atr beats)")
            beats = (read_mitbih if has_mitbih_names(root) else read_beat_folder)(root, **common)
            description = f"beat-annotated WFDB records at {root}"
        self.skipped = beats.skipped
        beats = _four_classes(beats)
        split = self._split(beats, seed)
        self._check_split(beats, split)
        site = self.config["target_site"] if data is None else str(data)
        records = record_hashes(EMBEDDED / f"site-{site}" if data is None else Path(data), sorted(set(beats.subjects)))
        return SiteData(beats, split, beats.source, description, site, records)

    def default_data(self, seed: int) -> Path:
        """The embedded folder of the target site's records."""
        return EMBEDDED / f"site-{self.config['target_site']}"

    def split_groups(self, raw: SiteData) -> list[str]:
        """The target site's patients (records) that the split assigns, sorted."""
        return sorted({str(subject) for part in raw.split.values() for subject in part})

    def hold_out(self, raw: SiteData, split: Mapping[str, Sequence[str]]) -> SiteData:
        """``raw`` with the patients ``split["test"]`` as its test split, ``split["val"]`` as its validation split and
        every other patient of `split_groups` training; ``raw`` itself is left as it was, the bank is not touched.

        Raises:
            UserError: (naming the data) no validation patient, a patient not in the split, a patient in two splits,
            or training patients with beats of one class only.
        """
        parts = held_out_subjects(self.split_groups(raw), split, raw.source, self.group_kind)
        self._check_split(raw.beats, parts)
        return replace(raw, split=parts)

    def _split(self, beats: BeatSet, seed: int) -> dict[str, list[str]]:
        parts = inter_patient_split(beats)
        if parts is None:
            return split_subjects(beats.subjects.tolist(), self.config["val_subjects"],
                                  self.config["test_subjects"], seed)  # fmt: skip
        labelled = sorted(set(parts["DS1"].subjects.tolist()))
        test = sorted(set(parts["DS2"].subjects.tolist()))
        if len(labelled) <= self.config["val_subjects"]:
            raise UserError(f"{beats.source}: DS1 has {len(labelled)} record(s) here; --val-subjects leaves none")
        val = sorted(np.random.default_rng(seed).choice(labelled, self.config["val_subjects"], replace=False))
        return {"train": [s for s in labelled if s not in val], "val": [str(s) for s in val], "test": test}

    def _check_split(self, beats: BeatSet, split: Mapping[str, Sequence[str]]) -> None:
        """Labelled beats of at least two classes; no subject in two splits."""
        shared = set(split["train"]) & (set(split["val"]) | set(split["test"])) | set(split["val"]) & set(split["test"])
        if shared:
            raise UserError(f"{beats.source}: subject(s) {sorted(shared)} would be in two splits")
        labelled = np.isin(beats.subjects, split["train"])
        present = sorted({CLASSES[k] for k in beats.labels[labelled]})
        if len(present) < 2:
            raise UserError(
                f"{beats.source}: the labelled subjects {split['train']} have beats of {present or 'no'} class only; "
                "a classifier needs at least two (choose other subjects: --seed, --test-subjects)"
            )

    def model_sizes(self) -> dict[str, Any]:
        return {"n_times": BEAT_SAMPLES, "n_outputs": len(CLASSES), "sfreq": BACKBONE_RATE_HZ}

    def prepare(self, model: nn.Module, raw: SiteData, train_size: int, val_size: int, seed: int):
        spec = spec_of(model)
        if spec is None or spec.signal is None or spec.signal.n_times != BEAT_SAMPLES:
            raise UserError(f"task 'physio' needs a model of {BEAT_SAMPLES}-sample beats at 250 Hz (patch-gpt)")
        beats, rng = raw.beats, np.random.default_rng(seed)
        inputs = model_inputs(beats.beats_mv, beats.fs_hz)
        samples = {}
        for name, limit in (("train", train_size), ("val", val_size), ("test", None)):
            index = np.flatnonzero(np.isin(beats.subjects, raw.split[name]))
            if limit is not None and len(index) > limit:
                index = np.sort(rng.choice(index, size=limit, replace=False))
            samples[name] = [BeatSample(inputs[i], int(beats.labels[i]), str(beats.subjects[i])) for i in index]
        weights = class_weights(np.array([s.label for s in samples["train"]], np.int64), len(CLASSES))
        self._class_weights = None if self.config["unweighted_loss"] else weights
        notes = []
        if beats.fs_hz != BACKBONE_RATE_HZ:
            notes.append(f"beats resampled from {beats.fs_hz:g} Hz to the backbone's {BACKBONE_RATE_HZ:g} Hz")
        class_counts = {
            name: dict(zip(CLASSES, np.bincount([s.label for s in part], minlength=len(CLASSES)).tolist()))
            for name, part in samples.items()
        }
        summary = {
            "data": raw.description,
            "split": raw.split,
            "beats": {name: len(part) for name, part in samples.items()},
            "class_counts": class_counts,
            "absent_classes": [c for c in CLASSES if not (beats.labels == CLASSES.index(c)).any()],
            "class_weights": None if self._class_weights is None else self._class_weights.round(4).tolist(),
            "sfreq_hz": beats.fs_hz,
            "lead": beats.lead,
            "excluded": dict(beats.excluded),
            "notes": notes,
            "site": raw.site,
            "record_sha256": raw.record_sha256,
        }
        return TaskData(samples["train"], samples["val"], samples["test"], raw.source, summary), {"classes": CLASSES}

    def restore(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        """Nothing of the data lives in the model."""

    def test_samples(self, model: nn.Module, raw: SiteData) -> list[BeatSample]:
        beats = raw.beats
        inputs = model_inputs(beats.beats_mv, beats.fs_hz)
        index = np.flatnonzero(np.isin(beats.subjects, raw.split["test"]))
        return [BeatSample(inputs[i], int(beats.labels[i]), str(beats.subjects[i])) for i in index]

    def lora_bank(self) -> Path:
        """The shipped PhysioPFM bank (`workbench.domains.physio.bank`, card ``physiopfm-bank``)."""
        if not SHIPPED_BANK.is_file():
            raise UserError(f"{SHIPPED_BANK}: the PhysioPFM bank is missing; make it with workbench pretrain "
                            f"--domain physio --stage bank --out {SHIPPED_BANK}")  # fmt: skip
        return SHIPPED_BANK

    @classmethod
    def profile(cls, method: str) -> dict[str, Any]:
        """PhysioPFM is compared with its own baselines (same head and adapters), the linear probe and full
        fine-tuning; a method that trains at the site with full fine-tuning and the linear probe."""
        return {"baselines": PHYSIOPFM_BASELINES} if method == "physiopfm" else {}

    # -- training and scoring --------------------------------------------------------------------
    def sample_inputs(self, samples: Sequence[BeatSample]) -> np.ndarray:
        """The beats (n, 175) float32, as the model reads them (PhysioPFM's descriptors are made from them)."""
        return np.stack([s.beat for s in samples])

    def collate(self, samples: Sequence[BeatSample], device: torch.device):
        beats = to_device(np.stack([s.beat for s in samples]), device)
        return beats, to_device([s.label for s in samples], device, torch.int64)

    def _cross_entropy(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str) -> torch.Tensor:
        weights = getattr(self, "_class_weights", None)
        weight = None if weights is None else torch.as_tensor(weights, dtype=logits.dtype, device=logits.device)
        return F.cross_entropy(logits, labels, weight=weight, reduction=reduction)

    def logits_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of logits (batch, 4) against class indices (batch,), class-weighted as in training:
        the loss of methods that compute the logits themselves (H-Tuning)."""
        return self._cross_entropy(logits, labels, "none").mean()

    def sample_losses(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Cross-entropy of each beat (class-weighted unless ``--unweighted-loss``), shape (batch,)."""
        beats, labels = batch
        return self._cross_entropy(model(beats), labels, "none")

    def loss(self, model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        return self.sample_losses(model, batch).mean()

    def batch_labels(self, batch: Any) -> torch.Tensor:
        return batch[1]

    def evaluate(self, model: nn.Module, samples: Sequence[BeatSample], device) -> Evaluation:
        model.eval()
        parameter = next(model.parameters())
        truth = np.array([s.label for s in samples], np.int64)
        beats = np.stack([s.beat for s in samples])
        chunks = [torch.as_tensor(beats[i : i + 256], dtype=parameter.dtype, device=parameter.device)
                  for i in range(0, len(beats), 256)]  # fmt: skip
        with torch.no_grad():
            logits = torch.cat([model(chunk) for chunk in chunks])
        probabilities = torch.softmax(logits.float(), dim=1).cpu().numpy()
        predicted = probabilities.argmax(axis=1)
        kappa = cohen_kappa(truth, predicted)
        metrics = {
            "balanced_accuracy": balanced_accuracy(truth, predicted),
            "accuracy": accuracy(truth, predicted),
            "macro_f1": macro_f1(truth, predicted),
            "cohen_kappa": 0.0 if np.isnan(kappa) else kappa,
        }
        recall = per_class_recall(truth, predicted, labels=range(len(CLASSES)))
        metrics.update({f"recall_{c}": float(0.0 if np.isnan(r) else r) for c, r in zip(CLASSES, recall)})
        predictions = {"truth": truth, "predicted": predicted, "probabilities": probabilities}
        return Evaluation(metrics, predictions, np.array([s.subject for s in samples]))

    def rescore(self, predictions: Mapping[str, np.ndarray], counts: np.ndarray) -> dict[str, np.ndarray]:
        """`evaluate`'s metrics of resampled beats (kappa, and the recall of a class absent from a resample, 0 as
        there)."""
        matrices = resampled_metrics.confusion(predictions["truth"], predictions["predicted"], counts, len(CLASSES))
        scores = resampled_metrics.label_scores(matrices)
        metrics = {name: scores[name] for name in ("balanced_accuracy", "accuracy", "macro_f1")}
        metrics["cohen_kappa"] = np.nan_to_num(scores["cohen_kappa"], nan=0.0)
        metrics.update({f"recall_{c}": np.nan_to_num(scores["recall"][:, k], nan=0.0) for k, c in enumerate(CLASSES)})
        return metrics

    def figures(self, evaluations: Mapping[str, Evaluation], out_dir: Path) -> list[tuple[str, str]]:
        from workbench.domains.plots import confusion_matrices

        return [confusion_matrices(evaluations, CLASSES, out_dir, samples="beats")]

    # -- batch prediction ------------------------------------------------------------------------
    def predict_folder(self, model: nn.Module, folder: Path, state: Mapping[str, Any]) -> Predictions:
        """Classify every beat of every beat-annotated WFDB record (``x.hea`` with ``x.atr``, recursively) of
        ``folder``: one row per annotated N/S/V/F beat (record, R-peak sample and time, its annotation symbol, class
        probabilities, predicted class), cut from the run's lead and preprocessed as in training (`model_inputs`).

        AAMI Q beats (paced, unclassifiable), non-beat annotations and beats at a record's edges get no row; they
        are counted in the facts (``excluded``). A bad record (`read_annotated_beats`: unreadable or truncated, lead
        missing, NaN or flat signal, bad annotations) gets one row with ``status`` "error: <why>" and no scores, a
        record without any N/S/V/F beat one "no beat" row; the others go on.
        """
        classes = list(state.get("classes", CLASSES))
        folder = Path(folder)
        headers = sorted(folder.rglob("*.hea"))
        if not headers:
            raise UserError(f"{folder}: no WFDB record (*.hea) in this folder")
        annotated = [h for h in headers if h.with_suffix(".atr").is_file()]
        if not annotated:
            raise UserError(f"{folder}: no WFDB record with .atr beat annotations (x.hea + x.dat + x.atr)")
        columns = ["record", "sample", "time_s", "annotation", "status"] + [f"p_{c}" for c in classes] + ["predicted"]
        rows: list[dict[str, Any]] = []
        skipped, excluded, rates, beats_read = SkipReport(), Counter(), set(), 0
        model.eval()
        parameter = next(model.parameters())
        for header in annotated:
            record = str(header.relative_to(folder).with_suffix(""))
            try:
                one = read_annotated_beats(header, lead=self.config["lead"], before_s=BEFORE_S, after_s=AFTER_S,
                                           classes=CLASSES, root=folder,
                                           allow_outside=self.config["allow_paths_outside"])  # fmt: skip
            except BadRecordError as error:
                skipped.add(record, error.problem)
                rows.append({"record": record, "status": f"error: {error.problem}"})
                continue
            excluded.update(one.excluded)
            rates.add(one.fs_hz)
            if not len(one.labels):
                rows.append({"record": record, "status": f"no beat of {'/'.join(CLASSES)} ({dict(one.excluded)})"})
                continue
            inputs = model_inputs(one.beats_mv, one.fs_hz)
            with torch.no_grad():
                logits = torch.cat([model(torch.as_tensor(inputs[i : i + 256], dtype=parameter.dtype,
                                                          device=parameter.device))
                                    for i in range(0, len(inputs), 256)])  # fmt: skip
            probabilities = torch.softmax(logits.float(), dim=1).cpu().numpy()
            for sample, symbol, p in zip(one.r_peaks, one.symbols, probabilities):
                row = {"record": record, "sample": int(sample), "time_s": f"{sample / one.fs_hz:.4f}",
                       "annotation": str(symbol), "status": "ok", "predicted": classes[int(p.argmax())]}  # fmt: skip
                row.update({f"p_{c}": f"{p[k]:.6f}" for k, c in enumerate(classes)})
                rows.append(row)
            beats_read += len(probabilities)
        facts = {
            "classes": classes,
            "lead": self.config["lead"],
            "window_s": {"before_r_peak": BEFORE_S, "after_r_peak": AFTER_S},
            "backbone_rate_hz": BACKBONE_RATE_HZ,
            "record_rates_hz": sorted(rates),
            "beats": beats_read,
            "annotated_records": len(annotated),
            "bad_records": len(skipped),
            "skipped_records": [str(problem) for problem in skipped],
            "excluded": dict(excluded),
            "not_annotated": [str(h.relative_to(folder).with_suffix("")) for h in headers if h not in annotated],
        }
        return Predictions(columns, rows, facts)

    # -- data commands ---------------------------------------------------------------------------
    pretrain_stages = ("backbone", "bank", "grid-bank")

    def pretrain(self, out: Path, epochs: int = 60, seed: int = 0, device: str = "auto", quiet: bool = False,
                 stage: str = "backbone") -> str:  # fmt: skip
        """Stage ``backbone``: the shipped backbone, made by next-patch prediction on the generated corpus
        (`workbench.domains.physio.pretrain`); stage ``bank``: PhysioPFM's bank of LoRAs of that backbone on
        sub-tasks of the embedded sites (`workbench.domains.physio.bank`; ``epochs`` are its steps per LoRA); stage
        ``grid-bank``: the bank of the procedural grid sites (`workbench.domains.physio.bank.build_grid_bank`, card
        ``physiopfm-grid-bank``; ``epochs`` its steps per LoRA, batches of 32)."""
        from workbench.domains.physio.pretrain import physio_corpus, pretrain_patch_gpt

        if stage == "bank":
            from workbench.domains.physio.bank import build_physio_bank

            bank = build_physio_bank(out, steps=epochs, seed=seed, progress=not quiet)
            return f"wrote {out}: {len(bank.entries)} LoRAs of sites {bank.sites()}"
        if stage == "grid-bank":
            from workbench.domains.physio.bank import build_grid_bank

            bank = build_grid_bank(out, steps=epochs, seed=seed, progress=not quiet)
            return f"wrote {out}: {len(bank.entries)} LoRAs of {len(bank.sites())} grid sites"
        if stage != "backbone":
            raise UserError(f"--stage {stage}: task 'physio' has the stages 'backbone', 'bank' and 'grid-bank'")

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        corpus = physio_corpus()
        scores = pretrain_patch_gpt(corpus, out, epochs=epochs, seed=seed, device=device, progress=not quiet)
        return f"wrote {out} (patch-gpt backbone, no head); validation {scores}"

    def info(self, data: str | Path | None) -> str:
        """The beats, classes, exclusions, skipped records and subject split `read` gives (every record opened)."""
        raw = self.read(data)
        return "\n".join([f"source: {raw.description}", raw.beats.report(), f"split: {raw.split}"])


def _four_classes(beats: BeatSet) -> BeatSet:
    """The beats of N, S, V, F (AAMI's Q left out and counted)."""
    keep = beats.labels < len(CLASSES)
    subset = beats.subset(keep)
    subset.classes = CLASSES
    if (~keep).sum():
        subset.excluded["class Q (paced, unclassifiable) left out"] = int((~keep).sum())
    return subset

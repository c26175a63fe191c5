"""The ``ptbxl`` task: adapt a pretrained 12-lead ECG classifier to a new site's records (5 PTB-XL superclasses).

The situation it models (GitHub issue 3): a hospital holds a 12-lead ECG model pretrained elsewhere and a few
labelled local records; it adapts the model within a small memory budget (H-Tuning) and compares with full
fine-tuning and LoRA.

Data:

- default (no ``--data``): the embedded synthetic PTB-XL (card ``ptbxl-synthetic``, 4 sites). The shipped
  teacher was pretrained on site 0 (the source clinic, `SOURCE_SITES`); the task adapts it to site
  ``--target-site`` (default "1", the ambulance monitor: noisier, 35 Hz device low-pass, more MI and STTC —
  where the shipped teacher loses most, see `DEFAULT_TARGET_SITE`). A target site holds 64 records, so
  PTB-XL's folds (1–8 / 9 / 10) would leave 6 validation and 6 test records — too few for per-class
  thresholds and AUROC. Within the target site the embedded set is therefore split by `EMBEDDED_FOLDS`:
  folds 1–5 train (~33 records), 6–7 validation (~13), 8–10 test (~18);
- ``--data FOLDER``: a folder in PTB-XL's published layout (``ptbxl_database.csv``, ``scp_statements.csv``,
  ``records100/``, ``records500/``); the whole dataset is the target, split by its recommended folds (1–8
  train, 9 validation, 10 test; `PTBXL_FOLDS`). ``--target-site`` is ignored there;
- ``--data FOLDER`` without ``ptbxl_database.csv``: PhysioNet/CinC Challenge 2021 records (``<name>.hea`` +
  ``<name>.mat`` anywhere below the folder, SNOMED CT codes in ``# Dx:``), labelled with the superclasses by
  `readers.SNOMED_SUPERCLASSES`; records none of whose codes maps to a superclass are counted and not used.
  CinC 2021 has no folds and no patient ids: the records are split at random by record, seeded by ``--seed``
  (`CINC_SPLIT`: 60 % train, 20 % validation, 20 % test).

Grouped folds (``workbench compare``, `PtbXl.hold_out`): a fold holds out whole patients — PTB-XL's ``patient_id``,
the reason its own folds are patient-wise: no patient's records are in two splits. The held-out ``val`` patients'
records are the validation split (thresholds, early stopping), the ``test`` patients' the test split, every other
patient's records train. The embedded set has one record per patient (``patient_id`` 10000 + ``ecg_id``). CinC 2021
folders have no patient ids: there each record is its own group (`PtbXl.group_kind` "record").

Records are preprocessed for the model (`PREPROCESSING`: 1–47 Hz zero-phase band-pass, per-lead z-score,
100 Hz, the first 1000 samples). Bad records are skipped and listed in the log (``--on-bad-record raise``
stops instead), never zero-filled.

Loss: BCE with logits over the 5 classes (multi-label), mean over batch and classes.

Metrics (test split, higher is better): ``macro_auroc`` (headline) and ``macro_average_precision`` over the
classes with both positive and negative test records; ``macro_f1`` over all classes at per-class thresholds
chosen on the validation split (the threshold maximising the class's validation F1; 0.5 for a class with no
validation positive). Per-class values are in ``metrics.json`` (``auroc_<class>``, ``f1_<class>``). The
thresholds of the chosen method are saved in the task state (``adapter.json``), where ``workbench predict``
reads them.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from workbench.domains.ecg.ecg_set import PTBXL_FOLDS, EcgSet
from workbench.domains.ecg.preprocess import EcgPreprocessing
from workbench.domains.ecg.readers import EMBEDDED_PTBXL, SUPERCLASSES, read_cinc2021, read_embedded, read_ptbxl
from workbench.domains.ecg.wfdb_record import read_record

from workbench.core import resampled_metrics
from workbench.core.device import device_of
from workbench.core.errors import UserError, field_error
from workbench.core.metrics import choose_thresholds, multilabel_scores
from workbench.core.options import Option
from workbench.core.records import BadRecordError
from workbench.core.registry import tasks
from workbench.core.task import Evaluation, Predictions, Task, TaskData, held_out_groups, to_device

log = logging.getLogger(__name__)

#: How records become inputs of the shipped (100 Hz, 1000-sample) models.
PREPROCESSING = EcgPreprocessing(sampling_rate_hz=100, n_samples=1000)
#: Sites of the embedded set the shipped teacher was pretrained on.
SOURCE_SITES: tuple[str, ...] = ("0",)
#: Macro AUROC of the shipped teacher (all records of a site, thresholds irrelevant): source site 0 0.93 (its
#: training data included), site 1 0.85, site 2 0.96, site 3 0.88 — site 1 loses most: the default target.
DEFAULT_TARGET_SITE = "1"
#: Split within one embedded target site (64 records): PTB-XL's 1–8 / 9 / 10 would leave 6 test records.
EMBEDDED_FOLDS: dict[str, tuple[int, ...]] = {"train": (1, 2, 3, 4, 5), "val": (6, 7), "test": (8, 9, 10)}
#: Fractions of a CinC 2021 folder (no folds, no patient ids) in each split, drawn at random by record.
CINC_SPLIT: dict[str, float] = {"train": 0.6, "val": 0.2, "test": 0.2}


@dataclass
class EcgSample:
    """One record: ``ecg (12, n_samples)`` float32, ``labels (n_classes,)`` float32 multi-hot, its record id and its
    patient (the record id where the data have no patient ids)."""

    ecg: np.ndarray
    labels: np.ndarray
    record: str
    patient: str = ""


@dataclass
class EcgSplits:
    """What `PtbXl.read` returns: the target's records, the records of each split and where they came from.

    Shapes: index["train" | "val" | "test"] (n_split,) int64, positions in ``records`` in file order; records in no
    split (PTB-XL rows outside folds 1–10) are not used.
    """

    records: EcgSet
    index: dict[str, np.ndarray]
    source: str
    description: str

    def samples(self, name: str, size: int | None = None, rng: np.random.Generator | None = None) -> list[EcgSample]:
        """The split ``name``'s records, or at most ``size`` of them drawn with ``rng``, in file order."""
        index = self.index[name]
        if size is not None:
            index = index[np.sort((rng or np.random.default_rng()).permutation(len(index))[:size])]
        records = self.records
        patients = records.record_ids if records.patients is None else records.patients
        return [EcgSample(records.signals[i], records.labels[i], str(records.record_ids[i]), str(patients[i]))
                for i in index]  # fmt: skip

    def class_counts(self, name: str) -> dict[str, int]:
        """Positive records per class in the split ``name``."""
        counts = self.records.labels[self.index[name]].sum(axis=0)
        return {label: int(count) for label, count in zip(self.records.classes, counts)}


@tasks.register
class PtbXl(Task):
    """Adapt a 12-lead ECG classifier to a target site (embedded) or to PTB-XL (``--data``)."""

    name = "ptbxl"
    precisions = ("float32", "bf16", "fp16")  # bf16 / fp16: mixed-precision training steps
    description = "Adapt a pretrained 12-lead ECG classifier (NORM/MI/STTC/CD/HYP) to a new site; PTB-XL or CinC 2021 records"
    card = "ptbxl-synthetic"
    reads = ("ptbxl", "cinc2021")
    requires = ("wfdb", "scipy", "sklearn", "pandas")
    extra = "ecg"
    default_model = "ecg"
    default_method = "htuning"
    capabilities = frozenset({"predict", "folds"})
    #: "patient" (PTB-XL's layout, the embedded set); "record" for CinC 2021 folders, which have no patient ids.
    group_kind = "patient"
    item_kind = "record"
    #: ``distill`` learns from the model the chosen method adapted (a 12-lead student; ``--n-leads`` 3 or 1).
    baselines = ("full", "lora", "distill")
    metrics = ("macro_auroc", "macro_average_precision", "macro_f1")
    metrics_note = (
        "Scores on the target's test split, higher is better: macro AUROC and macro average precision over the "
        "classes with positive and negative test records, macro F1 at per-class thresholds chosen on validation. "
        "In metrics.json `costs` gives each method's trainable parameters, train_seconds and training_step_bytes "
        "(the table's 'step MiB'). benchmarks/ecg_htuning.py also measures one training step of each method in a "
        "fresh process (its resident set), at larger batches."
    )
    #: train/val sizes: at most this many records of the split (all of them, for any real data set); one learning
    #: rate for every method (full fine-tuning's own 5e-3, chosen for MACE, diverges on this transformer).
    defaults = {
        "epochs": 30,
        "batch_size": 8,
        "train_size": 100_000,
        "val_size": 100_000,
        "patience": 10,
        "learning_rate": 1e-3,
    }
    examples = (
        "workbench adapt --domain ptbxl                          # H-Tuning, full, LoRA, a distilled student",
        "workbench adapt --domain ptbxl --data ~/ptb-xl --out runs/ptbxl",
        "workbench adapt --domain ptbxl --data ~/challenge-2021/training/georgia   # CinC 2021 .hea + .mat",
        "workbench predict --run runs/ptbxl --input new_records/ --output predictions.csv",
    )
    options = (
        Option("target_site", str, DEFAULT_TARGET_SITE, "embedded data: the site to adapt to (1, 2 or 3)"),
    )
    #: How records become model inputs: `PREPROCESSING` for a new run; a finished run's own (its task state) once
    #: `use_run_state` has been called, as `workbench evaluate` and `workbench predict` do.
    preprocessing: EcgPreprocessing = PREPROCESSING

    @classmethod
    def profile(cls, method: str) -> dict[str, Any]:
        """The other ECG methods run beside the chosen one."""
        return {"baselines": tuple(name for name in ("htuning", *cls.baselines) if name != method)}

    # -- data and model --------------------------------------------------------------------------
    def read(self, data: str | Path | None, seed: int = 0) -> EcgSplits:
        if data is None:
            site = str(self.config["target_site"])
            if site in SOURCE_SITES:
                raise UserError(f"--target-site {site} is the source site of the shipped teacher; choose 1, 2 or 3")
            records = read_embedded(self.preprocessing, on_error=self.config["on_bad_record"])
            if site not in set(records.sites.tolist()):
                raise UserError(f"--target-site {site}: the embedded data has sites {sorted(set(records.sites))}")
            records = records.subset(records.sites == site)
            index = _fold_index(records, EMBEDDED_FOLDS)
            source = f"{EMBEDDED_PTBXL} (site {site})"
            description = f"embedded synthetic PTB-XL, target site {site} (folds 1-5 / 6-7 / 8-10)"
        else:
            path = Path(data)
            records = self._read_folder(path)
            source = str(path)
            if records.folds is None:
                index = _random_split(records, seed)
                sizes = "/".join(str(len(index[name])) for name in CINC_SPLIT)
                description = (
                    f"CinC 2021 records at {path}: no folds, split at random by record with seed {seed} "
                    f"(train/val/test {sizes})"
                )
            else:
                index = _fold_index(records, PTBXL_FOLDS)
                description = f"PTB-XL layout at {path} (folds 1-8 / 9 / 10)"
                outside = len(records) - sum(len(part) for part in index.values())
                if outside:
                    log.warning("%s: %d record(s) have a strat_fold outside 1-10 and are not used", path, outside)
            if records.unlabelled:
                description += f"; {len(records.unlabelled)} record(s) without a superclass not used"
        if records.unlabelled:
            log.warning(
                "%d record(s) have no superclass among %s and are not used: %s",
                len(records.unlabelled),
                SUPERCLASSES,
                ", ".join(records.unlabelled[:10]) + (" ..." if len(records.unlabelled) > 10 else ""),
            )
        self.skipped = records.skipped
        self.group_kind = "record" if records.patients is None else "patient"
        return _checked(EcgSplits(records, index, source, description))

    def _read_folder(self, path: Path) -> EcgSet:
        """``path`` in PTB-XL's layout (``ptbxl_database.csv`` there) or as CinC 2021 records (``*.hea`` below)."""
        options = {"on_error": self.config["on_bad_record"], "progress": self.progress,
                   "allow_outside": self.config["allow_paths_outside"]}  # fmt: skip
        if (path / "ptbxl_database.csv").is_file():
            return read_ptbxl(path, self.preprocessing, card="ptbxl", **options)
        if path.is_dir() and next(path.rglob("*.hea"), None) is not None:
            return read_cinc2021(path, self.preprocessing, classes=SUPERCLASSES, card="cinc2021", **options)
        raise UserError(
            f"{path}: expected a folder in PTB-XL's layout (ptbxl_database.csv, scp_statements.csv, records100/, "
            "records500/) or PhysioNet/CinC 2021 records (<name>.hea + <name>.mat with '# Dx:' codes)"
        )

    def model_sizes(self) -> dict[str, Any]:
        """The five superclasses (the model family checks a checkpoint against them)."""
        return {"n_outputs": len(SUPERCLASSES)}

    def prepare(
        self, model: nn.Module, raw: EcgSplits, train_size: int, val_size: int, seed: int
    ) -> tuple[TaskData, dict[str, Any]]:
        rng = np.random.default_rng(seed)
        train = raw.samples("train", train_size, rng)
        val = raw.samples("val", val_size, rng)
        test = raw.samples("test")
        self._val = val
        summary = {
            "data": raw.description,
            "records": {"train": len(train), "val": len(val), "test": len(test)},
            "test_class_counts": raw.class_counts("test"),
            "train_class_counts": raw.class_counts("train"),
        }
        data = TaskData(train, val, test, raw.source, summary)
        return data, self._state(self._thresholds(model, val))

    def _state(self, thresholds: np.ndarray) -> dict[str, Any]:
        return {
            "classes": list(SUPERCLASSES),
            "thresholds": [float(t) for t in thresholds],
            "preprocessing": asdict(self.preprocessing),
        }

    def _thresholds(self, model: nn.Module, val: Sequence[EcgSample]) -> np.ndarray:
        truth, probabilities = self._predict(model, val, device_of(model))
        thresholds = choose_thresholds(truth, probabilities)
        model.ecg_thresholds = thresholds.tolist()
        return thresholds

    def refit(self, model: nn.Module, data: TaskData) -> dict[str, Any] | None:
        """After training: choose the per-class thresholds on the validation split."""
        return self._state(self._thresholds(model, data.val))

    def restore(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        model.ecg_thresholds = [float(t) for t in state["thresholds"]]

    def use_run_state(self, state: Mapping[str, Any]) -> None:
        """Read records with the run's preprocessing (its task state's; `PREPROCESSING` for runs older than it)."""
        self.preprocessing = PREPROCESSING if "preprocessing" not in state else _preprocessing(state["preprocessing"])

    def test_samples(self, model: nn.Module, raw: EcgSplits) -> list[EcgSample]:
        return raw.samples("test")

    # -- grouped folds ---------------------------------------------------------------------------
    def default_data(self, seed: int) -> Path:
        """The embedded synthetic PTB-XL folder (every site; ``--target-site`` picks one)."""
        return EMBEDDED_PTBXL

    def split_groups(self, raw: EcgSplits) -> list[str]:
        """The patients of the records in a split (the records themselves where the data have no patient ids)."""
        return sorted(set(_record_groups(raw)[np.concatenate(list(raw.index.values()))].tolist()))

    def hold_out(self, raw: EcgSplits, split: Mapping[str, Sequence[str]]) -> EcgSplits:
        """``raw`` re-split by patient (record, for CinC 2021): the records of the ``split["test"]`` patients are the
        test split, of the ``split["val"]`` patients the validation split (per-class thresholds, early stopping: the
        split must name some), of every other patient of `split_groups` the training split.

        Raises:
            UserError: (naming the data) an unknown patient, one in both splits, no test or no validation patient.
        """
        parts = held_out_groups(self.split_groups(raw), split, raw.source, self.group_kind)
        if not parts["val"]:
            raise UserError(
                f"{raw.source}: the split holds out no validation {self.group_kind}; the ptbxl task chooses its "
                f"thresholds and stops early on validation records, so name 'val' {self.group_kind}s too"
            )
        groups = _record_groups(raw)
        used = np.sort(np.concatenate(list(raw.index.values())))
        index = {name: used[np.isin(groups[used], parts[name])] for name in ("train", "val", "test")}
        sizes = "/".join(str(len(index[name])) for name in ("train", "val", "test"))
        description = f"{raw.description}; re-split by held-out {self.group_kind}s (train/val/test records {sizes})"
        return _checked(EcgSplits(raw.records, index, raw.source, description))

    # -- training and scoring --------------------------------------------------------------------
    def collate(self, samples: Sequence[EcgSample], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        ecg = to_device(np.stack([s.ecg for s in samples]), device)
        labels = to_device(np.stack([s.labels for s in samples]), device)
        return ecg, labels

    @staticmethod
    def logits_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """BCE with logits, mean over batch and classes."""
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))

    def loss(self, model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        ecg, labels = batch
        return self.logits_loss(model(ecg), labels)

    def sample_losses(self, model: nn.Module, batch: Any) -> torch.Tensor:
        ecg, labels = batch
        return F.binary_cross_entropy_with_logits(model(ecg), labels, reduction="none").mean(dim=1)

    def _predict(
        self, model: nn.Module, samples: Sequence[EcgSample], device, batch_size: int = 64
    ) -> tuple[np.ndarray, np.ndarray]:
        model.eval()
        probabilities = []
        with torch.no_grad():
            for start in range(0, len(samples), batch_size):
                ecg, _ = self.collate(samples[start : start + batch_size], device)
                probabilities.append(torch.sigmoid(model(ecg.to(next(model.parameters()).dtype))).cpu().numpy())
        truth = np.stack([s.labels for s in samples])
        return truth, np.concatenate(probabilities)

    def evaluate(self, model: nn.Module, samples: Sequence[EcgSample], device) -> Evaluation:
        """Scores on ``samples`` at thresholds chosen on this run's validation split (or the model's saved ones)."""
        if getattr(self, "_val", None):
            thresholds = self._thresholds(model, self._val)
        else:
            thresholds = np.asarray(getattr(model, "ecg_thresholds", [0.5] * len(SUPERCLASSES)))
        truth, probabilities = self._predict(model, samples, device)
        metrics = multilabel_scores(truth, probabilities, thresholds, SUPERCLASSES)
        groups = np.array([s.patient or s.record for s in samples])
        return Evaluation(metrics, {"truth": truth, "probabilities": probabilities, "thresholds": thresholds}, groups)

    def rescore(self, predictions: Mapping[str, np.ndarray], counts: np.ndarray) -> dict[str, np.ndarray]:
        """`multilabel_scores` of resampled records (per-class AUROC only where the whole split defines it, as
        there)."""
        truth, probabilities = predictions["truth"], predictions["probabilities"]
        auroc, precision = resampled_metrics.per_class_ranking(truth, probabilities, counts)
        f1 = resampled_metrics.binary_f1(truth, probabilities >= predictions["thresholds"], counts)
        scores = {
            "macro_auroc": resampled_metrics.macro(auroc),
            "macro_average_precision": resampled_metrics.macro(precision),
            "macro_f1": f1.mean(axis=1),
        }
        for k, name in enumerate(SUPERCLASSES):
            if 0 < truth[:, k].sum() < len(truth):
                scores[f"auroc_{name.lower()}"] = auroc[:, k]
            scores[f"f1_{name.lower()}"] = f1[:, k]
        return scores

    def figures(self, evaluations: Mapping[str, Evaluation], out_dir: Path) -> list[tuple[str, str]]:
        from workbench.domains.ecg import plots

        return [plots.roc_curves(evaluations, SUPERCLASSES, out_dir), plots.confusion_tables(evaluations, out_dir)]

    # -- batch prediction ------------------------------------------------------------------------
    def predict_folder(self, model: nn.Module, folder: Path, state: Mapping[str, Any]) -> Predictions:
        """Score every WFDB record (``*.hea``, recursively) of ``folder``: one row per record, and the classes and
        thresholds as facts of the record.

        A bad record gets ``status`` "error: <why>" and empty scores; the others go on.
        """
        classes = list(state["classes"])
        thresholds = np.asarray(state["thresholds"], dtype=float)
        self.use_run_state(state)
        settings = self.preprocessing
        headers = sorted(Path(folder).rglob("*.hea"))
        if not headers:
            raise UserError(f"{folder}: no WFDB record (*.hea) in this folder")
        columns = ["record", "status"] + [f"p_{c}" for c in classes] + [f"label_{c}" for c in classes]
        rows = []
        model.eval()
        dtype, device = next(model.parameters()).dtype, device_of(model)
        for header in headers:
            row: dict[str, Any] = {"record": str(header.relative_to(folder).with_suffix(""))}
            try:
                signal, _ = read_record(header, settings, root=folder, allow_outside=self.config["allow_paths_outside"])
            except BadRecordError as error:
                rows.append({**row, "status": f"error: {error.problem}"})
                continue
            with torch.no_grad():
                p = torch.sigmoid(model(torch.as_tensor(signal[None], dtype=dtype, device=device)))[0].cpu().numpy()
            row["status"] = "ok"
            row.update({f"p_{c}": f"{p[k]:.6f}" for k, c in enumerate(classes)})
            row.update({f"label_{c}": int(p[k] >= thresholds[k]) for k, c in enumerate(classes)})
            rows.append(row)
        return Predictions(columns, rows, {"thresholds": state.get("thresholds"), "classes": classes})

    # -- data commands ---------------------------------------------------------------------------
    def info(self, data: str | Path | None) -> str:
        """Every record the run would read, opened and checked (bad ones into ``self.skipped``); classes, sites,
        folds and the records left out for having no superclass."""
        if data is None:
            records = read_embedded(self.preprocessing, on_error=self.config["on_bad_record"])
        else:
            records = self._read_folder(Path(data))
        self.skipped = records.skipped
        if records.folds is None:
            shares = ", ".join(f"{name} {share:.0%}" for name, share in CINC_SPLIT.items())
            folds = f"folds: none (split at random by record, seeded by --seed: {shares})"
        else:
            counts = dict(sorted(Counter(records.folds.tolist()).items()))
            split = {name: int(np.isin(records.folds, list(numbers)).sum()) for name, numbers in PTBXL_FOLDS.items()}
            folds = f"folds: {counts}" + (f" (PTB-XL's split: {split})" if data is not None else "")
        unlabelled = ", ".join(records.unlabelled[:10]) + (" ..." if len(records.unlabelled) > 10 else "")
        lines = [
            f"source: {records.source}",
            f"records: {len(records)} × {records.signals.shape[1]} leads × {records.signals.shape[2]} samples "
            f"at {records.sampling_rate_hz:g} Hz (after preprocessing)",
            f"classes: {records.class_counts()}",
            f"sites: {records.site_counts()}",
            folds,
            f"without a superclass (not used): {len(records.unlabelled)}" + (f" ({unlabelled})" if unlabelled else ""),
        ]  # what was skipped: `workbench data info` prints ``self.skipped.summary()`` after this, for every task
        return "\n".join(lines)

    def pretrain(self, out: Path, **kwargs: Any) -> str:
        from workbench.domains.ecg.pretrain import pretrain

        scores = pretrain(out, **kwargs)
        return f"wrote {out} (+ {Path(out).with_suffix('.json').name}); source validation {scores}"


def _preprocessing(content: Mapping[str, Any]) -> EcgPreprocessing:
    content = dict(content)
    if content.get("bandpass_hz") is not None:
        content["bandpass_hz"] = tuple(content["bandpass_hz"])
    content["leads"] = tuple(content["leads"])
    return EcgPreprocessing(**content)


def _fold_index(records: EcgSet, folds: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """The records of each split by fold number (positions, in file order)."""
    return {name: np.flatnonzero(np.isin(records.folds, list(numbers))) for name, numbers in folds.items()}


def _random_split(records: EcgSet, seed: int) -> dict[str, np.ndarray]:
    """Records without folds split by `CINC_SPLIT` in a permutation seeded by ``seed`` (positions, in file order)."""
    order = np.random.default_rng(seed).permutation(len(records))
    n_test = round(CINC_SPLIT["test"] * len(records))
    n_val = round(CINC_SPLIT["val"] * len(records))
    parts = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
    return {name: np.sort(parts[name]) for name in CINC_SPLIT}


def _checked(splits: EcgSplits) -> EcgSplits:
    """``splits``, each split holding a record.

    Raises:
        UserError: (naming the data) an empty split.
    """
    for name in ("train", "val", "test"):
        if len(splits.index[name]) == 0:
            raise UserError(f"{splits.source}: the {name} split has no usable record")
    return splits


def _record_groups(raw: EcgSplits) -> np.ndarray:
    """The fold group of each record (n_records,) str: its patient, or the record where the data have no patient ids.

    Raises:
        UserError: (naming the table and field) a record whose patient id is missing.
    """
    records = raw.records
    if records.patients is None:
        return records.record_ids
    missing = np.flatnonzero(records.patients == "")
    if len(missing):
        table = Path(records.source) / "ptbxl_database.csv"
        found = f"none for ecg_id {', '.join(records.record_ids[missing[:5]])}"
        raise field_error(table, "patient_id", "a patient for every record (folds hold out whole patients)", found)
    return records.patients


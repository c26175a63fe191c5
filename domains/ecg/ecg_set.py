"""Preprocessed ECG records with multi-hot labels (`EcgSet`), and the collector that builds one record by record.

Shapes:
    `EcgSet.signals` (n_records, n_leads, n_samples) float32, `EcgSet.labels` (n_records, n_classes) float32
    multi-hot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from workbench.domains.ecg.preprocess import LEADS, EcgPreprocessing
from workbench.domains.ecg.wfdb_record import prepared_record

from workbench.core.datacard import DataCard
from workbench.core.errors import UserError
from workbench.core.records import BadRecordError, Collector, SkipReport

#: PTB-XL's recommended split of its 10 stratified folds (``strat_fold``).
PTBXL_FOLDS: dict[str, tuple[int, ...]] = {"train": (1, 2, 3, 4, 5, 6, 7, 8), "val": (9,), "test": (10,)}

ON_ERROR = ("skip", "raise")


@dataclass(frozen=True)
class EcgSet:
    """Preprocessed records with multi-hot labels, ready to batch.

    Shapes:
        signals (n_records, n_leads, n_samples) float32 [z-scored units, or mV without z-score];
        labels (n_records, n_classes) float32 multi-hot; record_ids, lengths (real samples before the
        zero padding), folds (PTB-XL ``strat_fold``), sites, patients (PTB-XL ``patient_id``; "" where the table has
        a gap): (n_records,).
    """

    signals: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    record_ids: np.ndarray
    sampling_rate_hz: float
    lengths: np.ndarray
    folds: np.ndarray | None = None
    sites: np.ndarray | None = None
    #: The patient of each record (PTB-XL's ``patient_id`` as text); None where the data have no patient ids.
    patients: np.ndarray | None = None
    leads: tuple[str, ...] = LEADS
    skipped: SkipReport = field(default_factory=SkipReport)
    #: Records dropped because none of their labels maps to one of ``classes`` (``unlabelled="drop"``).
    unlabelled: tuple[str, ...] = ()
    source: str = ""

    def __len__(self) -> int:
        return len(self.record_ids)

    def subset(self, index) -> EcgSet:
        """The records at ``index`` (a boolean mask or integer indices); reports stay with the whole set."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        return replace(
            self,
            signals=self.signals[index],
            labels=self.labels[index],
            record_ids=self.record_ids[index],
            lengths=self.lengths[index],
            folds=None if self.folds is None else self.folds[index],
            sites=None if self.sites is None else self.sites[index],
            patients=None if self.patients is None else self.patients[index],
        )

    def split(self, folds: Mapping[str, Iterable[int]] = PTBXL_FOLDS) -> dict[str, EcgSet]:
        """One subset per split name by fold number (default PTB-XL's: 1–8 train, 9 val, 10 test)."""
        if self.folds is None:
            raise UserError(f"{self.source}: these records have no folds; split them by index with subset()")
        return {name: self.subset(np.isin(self.folds, list(numbers))) for name, numbers in folds.items()}

    def class_counts(self) -> dict[str, int]:
        """Positive records per class."""
        return {name: int(count) for name, count in zip(self.classes, self.labels.sum(axis=0))}

    def site_counts(self) -> dict[str, int]:
        """Records per site (empty when the set has no sites)."""
        return {} if self.sites is None else dict(sorted(Counter(self.sites.tolist()).items()))


def on_error_from_card(value: str | None, card: DataCard) -> str:
    """``on_error`` as given, or ``card``'s ``on_bad_record`` (``stop`` read as ``raise``), checked against
    `ON_ERROR`."""
    value = value or card.content.get("on_bad_record", "skip")
    value = {"stop": "raise"}.get(value, value)
    if value not in ON_ERROR:
        raise UserError(f"on_error must be one of {ON_ERROR}, got {value!r}")
    return value


class PreparedRecords(Collector):
    """Preprocessed records in reading order; bad ones are skipped or raised as ``on_error`` says, listed under the file
    their problem names. Data files named outside ``root`` (`workbench.core.paths.PathOutsideData`) are never skipped: they
    stop the read."""

    def __init__(self, settings: EcgPreprocessing, n_max: int, on_error: str, root: Path, allow_outside: bool):
        super().__init__(on_error, report_by="file")
        self.settings = settings
        self.root, self.allow_outside = root, allow_outside
        self.kept: list[int] = []
        self.lengths: list[int] = []
        self.rates: set[float] = set()
        fixed = settings.n_samples is not None
        self.buffer = np.empty((n_max, len(settings.leads), settings.n_samples), np.float32) if fixed else None
        self.rows: list[np.ndarray] = []

    def add(
        self, position: int, path, expected_rate_hz: float | None = None, problem: str | None = None, where: str = ""
    ) -> bool:
        """Read, check and preprocess one record; False when it was skipped. ``where`` is appended to problems."""
        n_kept = len(self.kept)
        with self.record(path, where=where):
            if problem:
                raise BadRecordError(path, problem)
            signal, fs, n_real = prepared_record(path, self.settings, expected_rate_hz, self.root, self.allow_outside)
            if self.buffer is not None:
                self.buffer[n_kept] = signal
            else:
                self.rows.append(signal)
            self.kept.append(position)
            self.lengths.append(n_real)
            self.rates.add(fs)
        return len(self.kept) > n_kept

    def signals(self, source) -> np.ndarray:
        """The kept records, (n_kept, n_leads, n_samples) float32; a UserError naming ``source`` when they differ in
        length."""
        if self.buffer is not None:
            return self.buffer[: len(self.kept)]
        shapes = {row.shape for row in self.rows}
        if len(shapes) > 1:
            raise UserError(
                f"{source}: the records differ in length ({sorted(s[1] for s in shapes)[:4]} samples...); "
                "set EcgPreprocessing(n_samples=...) to crop/pad them to one length"
            )
        if not self.rows:
            return np.zeros((0, len(self.settings.leads), 0), np.float32)
        return np.stack(self.rows)

    def rate(self, source) -> float:
        """The kept records' one rate [Hz] (the settings' when they resample); a UserError when they differ."""
        if self.settings.sampling_rate_hz is not None:
            return float(self.settings.sampling_rate_hz)
        if len(self.rates) > 1:
            raise UserError(
                f"{source}: the records have different rates {sorted(self.rates)} Hz; "
                "set EcgPreprocessing(sampling_rate_hz=...) to resample them to one"
            )
        return next(iter(self.rates), float("nan"))


def multi_hot(label_lists: Sequence[Sequence[str]], classes: Sequence[str]) -> np.ndarray:
    """Per record, 1 in the column of each of its classes. Shapes: returns (len(label_lists), len(classes)) float32."""
    labels = np.zeros((len(label_lists), len(classes)), np.float32)
    column = {name: j for j, name in enumerate(classes)}
    for i, names in enumerate(label_lists):
        for name in names:
            if name in column:
                labels[i, column[name]] = 1.0
    return labels

"""Readers of 12-lead ECG records in WFDB format (wfdb), in the layouts their publishers ship.

* PTB-XL (Wagner et al. 2020, physionet.org/content/ptb-xl/1.0.3): ``ptbxl_database.csv`` (index
  ``ecg_id``; ``scp_codes`` a dict literal {SCP code: likelihood %}; ``strat_fold`` 1–10; ``site``;
  ``filename_lr`` / ``filename_hr`` the 100 / 500 Hz records under ``records100/`` / ``records500/``) and
  ``scp_statements.csv`` (index: SCP code; ``diagnostic`` 1 for diagnostic statements; ``diagnostic_class``
  their superclass). Labels are the 5 superdiagnostic classes NORM, MI, STTC, CD, HYP: the
  ``diagnostic_class`` of every code of ``scp_codes`` whose row has ``diagnostic == 1``, as the PTB-XL
  authors' example (``example_physionet.py``) aggregates them. Recommended split: folds 1–8 train,
  9 validation, 10 test (`PTBXL_FOLDS`).
* PhysioNet/CinC Challenge 2021 (Reyna et al. 2021): any folder tree of ``<record>.hea`` + ``<record>.mat``
  (WFDB format 16 with a 24-byte MATLAB v4 header, ``16+24``), labels in a header comment line
  ``# Dx: <SNOMED CT code>,<code>,...``, mapped to classes by a label map (`SNOMED_SUPERCLASSES` by
  default: the PTB-XL superclasses, so the two kinds of data share one label space).

Signals are converted to physical units exactly as wfdb's ``p_signal``: ``(digital − baseline) / gain``
[mV], samples holding the format's missing-value code are NaN. Every record is checked before it is
used (files present, data size as the header implies, checksums, all 12 leads, no NaN, no flat lead,
expected rate); a bad record becomes a `RecordProblem` (file, what is wrong) and is skipped or raised
(``on_error``), never zero-filled. Then `preprocess` makes it a model input.

Shapes:
    `read_record`: signal (12, n_samples); `EcgSet.signals` (n_records, 12, n_samples) float32,
    `EcgSet.labels` (n_records, n_classes) float32 multi-hot.
"""

from __future__ import annotations

import ast
import logging
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm
from workbench.domains.ecg.preprocess import LEADS, EcgPreprocessing, preprocess

from workbench.datacard import DataCard, load_card
from workbench.errors import UserError, field_error
from workbench.paths import confined
from workbench.records import BadRecordError, SkipReport

log = logging.getLogger(__name__)

#: PTB-XL's superdiagnostic classes, in the order of the label columns.
SUPERCLASSES: tuple[str, ...] = ("NORM", "MI", "STTC", "CD", "HYP")

#: PTB-XL's recommended split of its 10 stratified folds (``strat_fold``).
PTBXL_FOLDS: dict[str, tuple[int, ...]] = {"train": (1, 2, 3, 4, 5, 6, 7, 8), "val": (9,), "test": (10,)}

#: The synthetic PTB-XL-style set shipped with the workbench (data card ``ptbxl-synthetic``).
EMBEDDED_PTBXL = Path(__file__).resolve().parent / "embedded" / "ptbxl_synthetic"

ON_ERROR = ("skip", "raise")
UNLABELLED = ("drop", "keep")
RESOLUTIONS = ("auto", "lr", "hr")

#: SNOMED CT codes of the CinC 2021 data (dx_mapping_scored.csv / dx_mapping_unscored.csv of
#: physionetchallenges/evaluation-2021) -> PTB-XL superclass, following PTB-XL's ``diagnostic_class`` of
#: the corresponding SCP statement. Sinus rhythm stands for NORM (see ``normal_class`` of `read_cinc2021`);
#: codes not listed (rhythms, ectopy, axis, Q-wave and voltage findings without a diagnosis) carry no class.
SNOMED_SUPERCLASSES: dict[str, str] = {
    "426783006": "NORM",  # sinus rhythm (NSR)
    "164865005": "MI",  # myocardial infarction
    "164867002": "MI",  # old myocardial infarction
    "57054005": "MI",  # acute myocardial infarction
    "54329005": "MI",  # anterior myocardial infarction
    "164861001": "STTC",  # myocardial ischemia
    "413444003": "STTC",  # acute myocardial ischemia
    "413844008": "STTC",  # chronic myocardial ischemia
    "426434006": "STTC",  # anterior ischemia
    "425419005": "STTC",  # inferior ischaemia
    "425623009": "STTC",  # lateral ischaemia
    "428750005": "STTC",  # nonspecific ST-T abnormality
    "55930002": "STTC",  # ST changes
    "429622005": "STTC",  # ST depression
    "164931005": "STTC",  # ST elevation
    "164930006": "STTC",  # ST interval abnormal
    "164934002": "STTC",  # T wave abnormal
    "59931005": "STTC",  # T wave inversion
    "111975006": "STTC",  # prolonged QT interval (PTB-XL LNGQT)
    "164909002": "CD",  # left bundle branch block
    "733534002": "CD",  # complete left bundle branch block
    "251120003": "CD",  # incomplete left bundle branch block
    "59118001": "CD",  # right bundle branch block
    "713427006": "CD",  # complete right bundle branch block
    "713426002": "CD",  # incomplete right bundle branch block
    "6374002": "CD",  # bundle branch block
    "698252002": "CD",  # nonspecific intraventricular conduction disorder
    "82226007": "CD",  # diffuse intraventricular block
    "445118002": "CD",  # left anterior fascicular block
    "445211001": "CD",  # left posterior fascicular block
    "270492004": "CD",  # 1st degree AV block
    "195042002": "CD",  # 2nd degree AV block
    "54016002": "CD",  # Mobitz type I (Wenckebach) AV block
    "426183003": "CD",  # Mobitz type II AV block
    "233917008": "CD",  # AV block
    "27885002": "CD",  # complete heart block
    "74390002": "CD",  # Wolff-Parkinson-White pattern
    "164873001": "HYP",  # left ventricular hypertrophy
    "55827005": "HYP",  # left ventricular high voltage
    "89792004": "HYP",  # right ventricular hypertrophy
    "266249003": "HYP",  # ventricular hypertrophy
    "67741000119109": "HYP",  # left atrial enlargement
    "446813000": "HYP",  # left atrial hypertrophy
    "446358003": "HYP",  # right atrial hypertrophy
    "195126007": "HYP",  # atrial hypertrophy
    "253352002": "HYP",  # left atrial abnormality
    "253339007": "HYP",  # right atrial abnormality
}

# WFDB storage formats: bytes per sample (for the size check) and the digital value meaning "no sample".
_BYTES_PER_SAMPLE = {"8": 1, "16": 2, "24": 3, "32": 4, "61": 2, "80": 1, "160": 2, "212": 1.5, "310": 4 / 3,
                     "311": 4 / 3}
_MISSING_VALUE = {"16": -(2**15), "61": -(2**15), "160": -(2**15), "24": -(2**23), "32": -(2**31), "80": -(2**7)}
_MISSING_VALUE.update({"212": -(2**11), "310": -(2**9), "311": -(2**9)})
_UNITS_PER_MV = {"mv": 1.0, "uv": 1000.0, "μv": 1000.0, "µv": 1000.0, "v": 0.001, "nv": 1e6}


# ------------------------------------------------------------------------------------------- one record
@dataclass(frozen=True)
class RawEcg:
    """One checked record in physical units, before preprocessing.

    Shapes: signal_mv (n_leads, n_samples) float64 [mV], leads in the order asked for.
    """

    signal_mv: np.ndarray
    fs_hz: float
    leads: tuple[str, ...]
    comments: tuple[str, ...]
    record: str


def _record_base(path: str | Path) -> Path:
    """The record's path without extension (``x.hea``, ``x.dat``, ``x.mat`` and ``x`` all give ``x``)."""
    path = Path(path)
    return path.with_suffix("") if path.suffix.lower() in (".hea", ".dat", ".mat") else path


def read_raw_record(
    path: str | Path,
    *,
    leads: Sequence[str] = LEADS,
    expected_rate_hz: float | None = None,
    verify_checksums: bool = True,
    root: str | Path | None = None,
    allow_outside: bool = False,
) -> RawEcg:
    """Read and check one WFDB record; physical units ``(digital − baseline) / gain`` converted to mV.

    Args:
        path: the record (``.hea``, its data file, or the name without extension).
        leads: the leads to return, in this order; names match case-insensitively.
        expected_rate_hz: the rate the layout promises (100 for PTB-XL's records100/); None accepts any.
        verify_checksums: compare each signal's 16-bit sum with the header's checksum.
        root: the data folder the header's data files must lie in (default: the header's own folder).
        allow_outside: read data files the header names outside ``root`` (``--allow-paths-outside``).

    Raises:
        BadRecordError: naming the file and the problem (missing or truncated file, a header field out of range
            — no signal, no or a negative sample count, a rate that is not a positive number, an unknown storage
            format —, header/data mismatch, checksum, missing lead, NaN samples, flat lead, unexpected rate,
            unreadable file). `workbench.paths.PathOutsideData`: a data file named outside ``root``.
    """
    import wfdb

    base = _record_base(path)
    header_path, header = _read_header(base)
    fs = float(header.fs)
    if expected_rate_hz is not None and not math.isclose(fs, expected_rate_hz, rel_tol=1e-6):
        raise BadRecordError(header_path, f"sampling rate {fs:g} Hz, expected {expected_rate_hz:g} Hz")
    names = [str(name) for name in (header.sig_name or [])]
    columns = _lead_columns(header_path, names, leads)
    _check_data_files(base, header, Path(root) if root is not None else base.parent, allow_outside)
    try:
        record = wfdb.rdrecord(str(base), physical=False, return_res=64)
    except Exception as error:
        raise BadRecordError(base.with_name(base.name + ".dat"), f"unreadable signal data ({error})") from None
    digital = np.asarray(record.d_signal, dtype=np.int64)  # (n_samples, n_signals)
    if digital.shape != (header.sig_len, header.n_sig):
        raise BadRecordError(
            header_path,
            f"data holds {digital.shape} samples × signals, the header says {(header.sig_len, header.n_sig)}",
        )
    if verify_checksums and record.checksum is not None:
        _check_checksums(base, record, digital, columns, names)
    signal = np.empty((len(columns), digital.shape[0]), dtype=np.float64)
    for row, index in enumerate(columns):
        signal[row] = _lead_mv(header_path, base, record, digital, index, names[index])
    flat = [leads[row] for row in range(len(columns)) if np.ptp(signal[row]) == 0]
    if flat:
        raise BadRecordError(header_path, f"flat lead(s) {', '.join(flat)}: constant signal (electrode not connected?)")
    return RawEcg(signal, fs, tuple(leads), tuple(header.comments or ()), str(base))


def _read_header(base: Path) -> tuple[Path, Any]:
    """``(header path, wfdb header)`` of a single-segment record whose record line is checked."""
    import wfdb

    header_path = base.with_name(base.name + ".hea")
    if not header_path.is_file():
        raise BadRecordError(header_path, "header file missing")
    try:
        header = wfdb.rdheader(str(base))
    except Exception as error:  # wfdb raises many kinds for a malformed header
        raise BadRecordError(header_path, f"unreadable WFDB header ({error})") from None
    if not hasattr(header, "sig_name") or getattr(header, "seg_name", None):
        raise BadRecordError(header_path, "a multi-segment record; expected a single-segment 12-lead record")
    _check_record_line(header_path, header)
    return header_path, header


def _check_checksums(base: Path, record: Any, digital: np.ndarray, columns: list[int], names: list[str]) -> None:
    """Each wanted column's 16-bit sum against the header's checksum; ``digital`` is (n_samples, n_signals)."""
    for index in columns:
        stored = record.checksum[index]
        actual = int(digital[:, index].sum() % 65536)
        if stored is not None and int(stored) % 65536 != actual:
            raise BadRecordError(
                _data_path(base, record.file_name[index]),
                f"checksum of lead {names[index]} is {actual}, the header says {int(stored) % 65536}: "
                "header and data do not match (or the data is corrupted)",
            )


def _lead_mv(header_path: Path, base: Path, record: Any, digital: np.ndarray, index: int, lead: str) -> np.ndarray:
    """Column ``index`` of ``digital`` (n_samples, n_signals) in mV, (n_samples,) float64, after its gain, units
    and missing-sample checks."""
    gain, baseline = float(record.adc_gain[index]), float(record.baseline[index])
    if not gain > 0:
        raise BadRecordError(header_path, f"lead {lead}: ADC gain {gain:g} (uncalibrated); expected a positive gain")
    units = (record.units[index] or "mV").strip()
    per_mv = _UNITS_PER_MV.get(units.lower())
    if per_mv is None:
        raise BadRecordError(header_path, f"lead {lead}: units {units!r}, expected a voltage (mV, uV or V)")
    values = digital[:, index].astype(np.float64)
    missing = _MISSING_VALUE.get(record.fmt[index])
    if missing is not None:
        nan = digital[:, index] == missing
        if nan.any():
            raise BadRecordError(
                _data_path(base, record.file_name[index]),
                f"NaN in lead {lead}: {int(nan.sum())} of {len(nan)} samples hold WFDB's missing-sample value "
                f"(first at sample {int(np.flatnonzero(nan)[0])})",
            )
    signal_mv = (values - baseline) / gain / per_mv
    if not np.isfinite(signal_mv).all():
        raise BadRecordError(
            header_path,
            f"lead {lead}: ADC gain {gain:g} and baseline {baseline:g} give values that are not finite in mV; "
            "expected a gain in ADC units per physical unit (such as 200 or 1000 per mV)",
        )
    return signal_mv


def _lead_columns(header_path: Path, names: list[str], leads: Sequence[str]) -> list[int]:
    """Column of each wanted lead in the header (case-insensitive), or a BadRecordError naming what lacks."""
    lowered = [name.strip().lower() for name in names]
    duplicated = sorted({name for name in lowered if lowered.count(name) > 1} & {lead.lower() for lead in leads})
    if duplicated:
        raise BadRecordError(header_path, f"lead {duplicated[0]} appears more than once in the header")
    missing = [lead for lead in leads if lead.lower() not in lowered]
    if missing:
        raise BadRecordError(
            header_path, f"missing lead(s) {', '.join(missing)} (the header has {', '.join(names) or 'no signals'})"
        )
    return [lowered.index(lead.lower()) for lead in leads]


def _data_path(base: Path, file_name: str) -> Path:
    return base.parent / file_name


def _check_record_line(header_path: Path, header) -> None:
    """The record line's numbers are usable: at least one signal and one signal line per signal (wfdb allocates by
    the count), a positive sample count (this reader needs it; the data files' sizes are checked against it before
    anything is read) and a positive finite rate [Hz]."""
    n_sig, sig_len, fs = header.n_sig, header.sig_len, header.fs
    if not isinstance(n_sig, (int, np.integer)) or n_sig < 1:
        raise BadRecordError(header_path, f"record line: {n_sig} signals, expected at least one signal")
    lines = len(header.file_name or ())
    if lines != n_sig:
        raise BadRecordError(header_path, f"record line: {n_sig} signals, but {lines} signal lines follow it")
    if not isinstance(sig_len, (int, np.integer)) or sig_len < 1:
        raise BadRecordError(
            header_path, f"record line: number of samples {sig_len}, expected a positive count (the 4th field)"
        )
    if not isinstance(fs, (int, float, np.number)) or not (math.isfinite(float(fs)) and float(fs) > 0):
        raise BadRecordError(header_path, f"record line: sampling rate {fs} Hz, expected a positive number")


def _check_data_files(base: Path, header, root: Path, allow_outside: bool) -> None:
    """Every data file lies inside ``root`` (unless ``allow_outside``), exists and holds exactly the bytes the header
    implies, in a storage format this reader knows — checked before any sample is read, so that a header claiming
    10^12 samples is refused by the file's size instead of allocating them."""
    header_path = base.with_name(base.name + ".hea")
    if getattr(header, "samps_per_frame", None) and any(int(s or 1) != 1 for s in header.samps_per_frame):
        raise BadRecordError(header_path, "several samples per frame; not supported")
    groups: dict[str, list[int]] = {}
    for index, name in enumerate(header.file_name):
        groups.setdefault(name, []).append(index)
    for name, indices in groups.items():
        relative = Path(os.path.relpath(base.parent.resolve(), Path(root).resolve())) / name
        confined(relative, root, str(header_path), allow_outside)
        data = _data_path(base, name)
        if not data.is_file():
            raise BadRecordError(header_path, f"data file missing: {name}, named in the header (looked for {data})")
        fmt = str(header.fmt[indices[0]])
        per_sample = _BYTES_PER_SAMPLE.get(fmt)
        if per_sample is None:
            raise BadRecordError(
                header_path,
                f"storage format {fmt!r} of {name}: not one this reader knows ({', '.join(_BYTES_PER_SAMPLE)})",
            )
        if any(str(header.fmt[index]) != fmt for index in indices):
            raise BadRecordError(header_path, f"the signals of {name} have different storage formats")
        offset = int((header.byte_offset or [None] * header.n_sig)[indices[0]] or 0)
        if offset < 0:
            raise BadRecordError(header_path, f"byte offset {offset} of {name}: expected 0 or more")
        expected = offset + math.ceil(header.sig_len * len(indices) * per_sample)
        size = os.path.getsize(data)
        how = f"{header.sig_len} samples × {len(indices)} signals × {per_sample:g} bytes (format {fmt})"
        if offset:
            how += f" + {offset} header bytes"
        if size < expected:
            raise BadRecordError(data, f"truncated data file: {size} bytes, the header implies {expected} ({how})")
        if size > expected:
            raise BadRecordError(data, f"header/data mismatch: {size} bytes, the header implies {expected} ({how})")


def read_record(
    path: str | Path,
    settings: EcgPreprocessing | None = None,
    *,
    expected_rate_hz: float | None = None,
    root: str | Path | None = None,
    allow_outside: bool = False,
) -> tuple[np.ndarray, float]:
    """One WFDB record as a model input (for batch prediction): checked, then `preprocess`-ed.

    Args:
        path: the record (``.hea``, its data file, or the name without extension).
        settings: the preprocessing; default `EcgPreprocessing()` (H-Tuning's 500 Hz, 6144 samples).
        expected_rate_hz: the rate the record must have; None accepts any the settings can filter.
        root, allow_outside: the data folder the header's data files must lie in, as `read_raw_record`.

    Returns:
        ``(signal (n_leads, n_samples) float32, sampling rate [Hz])``.

    Raises:
        BadRecordError: the same checks as `read_raw_record`, plus a rate or length the settings cannot use.
    """
    settings = settings or EcgPreprocessing()
    signal, fs, _ = _prepared(path, settings, expected_rate_hz, root, allow_outside)
    return signal, fs


def _prepared(path, settings: EcgPreprocessing, expected_rate_hz: float | None, root=None, allow_outside=False):
    raw = read_raw_record(
        path, leads=settings.leads, expected_rate_hz=expected_rate_hz, root=root, allow_outside=allow_outside
    )
    problem = settings.rate_problem(raw.fs_hz) or settings.length_problem(raw.signal_mv.shape[1], raw.fs_hz)
    if problem:
        raise BadRecordError(raw.record + ".hea", problem)
    try:
        signal, fs_out, n_real = preprocess(raw.signal_mv, raw.fs_hz, settings)
    except UserError as error:  # the preprocessing names the step, the record is named here
        raise BadRecordError(raw.record + ".hea", str(error)) from None
    return signal, fs_out, n_real


# ------------------------------------------------------------------------------------------- data sets
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


def _on_error(value: str | None, card: DataCard) -> str:
    value = value or card.content.get("on_bad_record", "skip")
    value = {"stop": "raise"}.get(value, value)
    if value not in ON_ERROR:
        raise UserError(f"on_error must be one of {ON_ERROR}, got {value!r}")
    return value


class _Collector:
    """Preprocessed records in order; skips or raises bad ones as ``on_error`` says. Data files named outside
    ``root`` (`workbench.paths.PathOutsideData`) are never skipped: they stop the read."""

    def __init__(self, settings: EcgPreprocessing, n_max: int, on_error: str, root: Path, allow_outside: bool):
        self.settings, self.on_error = settings, on_error
        self.root, self.allow_outside = root, allow_outside
        self.skipped = SkipReport()
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
        self.skipped.seen += 1
        try:
            if problem:
                raise BadRecordError(path, problem)
            signal, fs, n_real = _prepared(path, self.settings, expected_rate_hz, self.root, self.allow_outside)
        except BadRecordError as error:
            if where:
                error = BadRecordError(error.record, f"{error.problem} ({where})")
            if self.on_error == "raise":
                raise error from None
            log.warning("skipping %s", error)
            self.skipped.add(error.record, error.problem)
            return False
        if self.buffer is not None:
            self.buffer[len(self.kept)] = signal
        else:
            self.rows.append(signal)
        self.kept.append(position)
        self.lengths.append(n_real)
        self.rates.add(fs)
        return True

    def signals(self, source) -> np.ndarray:
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
        if self.settings.sampling_rate_hz is not None:
            return float(self.settings.sampling_rate_hz)
        if len(self.rates) > 1:
            raise UserError(
                f"{source}: the records have different rates {sorted(self.rates)} Hz; "
                "set EcgPreprocessing(sampling_rate_hz=...) to resample them to one"
            )
        return next(iter(self.rates), float("nan"))


def _multi_hot(label_lists: Sequence[Sequence[str]], classes: Sequence[str]) -> np.ndarray:
    labels = np.zeros((len(label_lists), len(classes)), np.float32)
    column = {name: j for j, name in enumerate(classes)}
    for i, names in enumerate(label_lists):
        for name in names:
            if name in column:
                labels[i, column[name]] = 1.0
    return labels


# ----------------------------------------------------------------------------------------------- PTB-XL
def ptbxl_superclasses(
    scp_codes: Sequence[Mapping[str, float]],
    statements,
    min_likelihood: float = 0.0,
    source: str | Path = "scp_statements.csv",
) -> list[list[str]]:
    """Superdiagnostic classes of each record: ``diagnostic_class`` of its diagnostic SCP codes.

    Args:
        scp_codes: per record, {SCP code: likelihood [%]} (``ptbxl_database.csv``'s column, parsed).
        statements: ``scp_statements.csv`` as a DataFrame indexed by SCP code.
        min_likelihood: ignore codes whose likelihood is below this [%]; 0 keeps every code, as the
            PTB-XL authors' example does.
        source: the statements' file, named in errors.

    Returns: one sorted list of distinct classes per record (empty when no code is diagnostic).
    """
    for column in ("diagnostic", "diagnostic_class"):
        if column not in statements.columns:
            raise UserError(f"{source}: column '{column}' missing (found {list(statements.columns)})")
    diagnostic = statements[statements["diagnostic"] == 1]
    to_class = {str(code): str(name) for code, name in diagnostic["diagnostic_class"].items() if isinstance(name, str)}
    return [
        sorted(
            {to_class[code] for code, likelihood in codes.items() if code in to_class and likelihood >= min_likelihood}
        )
        for codes in scp_codes
    ]


def _parse_scp_codes(path: Path, ecg_id, text) -> dict[str, float]:
    try:
        codes = ast.literal_eval(text) if isinstance(text, str) else None
        codes = {str(code): float(value) for code, value in codes.items()} if isinstance(codes, dict) else None
    except (ValueError, SyntaxError, TypeError, RecursionError):
        codes = None
    if codes is None:
        expected = f"a dict literal {{code: likelihood [%]}} for ecg_id {ecg_id}"
        raise field_error(path, "scp_codes", expected, repr(text)[:200])
    return codes


def read_ptbxl_tables(root: str | Path):
    """``(database, statements)``: ``ptbxl_database.csv`` (index ecg_id, ``scp_codes`` parsed to dicts) and
    ``scp_statements.csv`` (index SCP code), checked for the columns the reader needs."""
    import pandas as pd

    root = Path(root)
    tables = {}
    for name, index in (("ptbxl_database.csv", "ecg_id"), ("scp_statements.csv", 0)):
        path = root / name
        if not path.is_file():
            raise UserError(
                f"{path}: file missing; expected PTB-XL's layout (ptbxl_database.csv, scp_statements.csv, "
                "records100/, records500/) — see data card ptbxl"
            )
        try:
            tables[name] = pd.read_csv(path, index_col=index)
        except Exception as error:
            raise UserError(f"{path}: not a readable csv table ({error})") from None
    database, statements = tables["ptbxl_database.csv"], tables["scp_statements.csv"]
    path = root / "ptbxl_database.csv"
    if database.index.name != "ecg_id":
        raise field_error(path, "ecg_id", "an ecg_id column (the index)", f"columns {list(database.columns)[:6]}")
    for column in ("scp_codes", "strat_fold", "filename_lr", "filename_hr"):
        if column not in database.columns:
            raise field_error(path, column, "a column of PTB-XL's ptbxl_database.csv", "none")
    database = database.copy()
    folds = pd.to_numeric(database["strat_fold"], errors="coerce")
    bad = ~(np.isfinite(folds) & (folds == np.round(folds)))
    if bad.any():
        first = int(np.flatnonzero(bad.to_numpy())[0])
        ecg_id, found = database.index[first], repr(database["strat_fold"].iloc[first])
        raise field_error(path, "strat_fold", f"a whole fold number (1-10) for ecg_id {ecg_id}", found)
    database["strat_fold"] = folds.astype(np.int64)
    database["scp_codes"] = [_parse_scp_codes(path, i, text) for i, text in database["scp_codes"].items()]
    return database, statements


def read_ptbxl(
    root: str | Path,
    settings: EcgPreprocessing | None = None,
    *,
    resolution: str = "auto",
    classes: Sequence[str] = SUPERCLASSES,
    folds: Iterable[int] | None = None,
    on_error: str | None = None,
    unlabelled: str = "drop",
    min_likelihood: float = 0.0,
    card: str = "ptbxl",
    progress: bool = False,
    allow_outside: bool = False,
) -> EcgSet:
    """Read PTB-XL (or a set in its layout) with its superdiagnostic labels, folds and sites.

    Args:
        root: the folder holding ``ptbxl_database.csv``, ``scp_statements.csv``, ``records100/``, ``records500/``.
        settings: the preprocessing (default `EcgPreprocessing()`).
        resolution: which record of each row: ``"lr"`` (``filename_lr``, 100 Hz), ``"hr"`` (``filename_hr``,
            500 Hz), or ``"auto"``: ``hr`` when the model's rate is above 100 Hz (or unset), else ``lr``,
            and the other one for rows that have only that one.
        classes: the label columns (default NORM, MI, STTC, CD, HYP).
        folds: read only these ``strat_fold`` numbers (None: all).
        on_error: ``"skip"`` or ``"raise"`` for a bad record; None: the data card's ``on_bad_record``.
        unlabelled: ``"drop"`` records with no class among ``classes`` (PTB-XL benchmarks do) or ``"keep"``
            them as all-zero rows.
        min_likelihood: minimum likelihood [%] of an SCP code to count (0: every code, as PTB-XL's example).
        card: the data card naming the rates of the two columns and the default ``on_bad_record``.
        progress: show a progress bar.
        allow_outside: read records that ``filename_lr`` / ``filename_hr`` (or their headers) name outside ``root``
            (``--allow-paths-outside``); by default such a path stops the read (`workbench.paths.PathOutsideData`).
    """
    settings = settings or EcgPreprocessing()
    data_card = load_card(card)
    on_error = _on_error(on_error, data_card)
    if resolution not in RESOLUTIONS:
        raise UserError(f"resolution must be one of {RESOLUTIONS}, got {resolution!r}")
    if unlabelled not in UNLABELLED:
        raise UserError(f"unlabelled must be one of {UNLABELLED}, got {unlabelled!r}")
    root = Path(root)
    database, statements = read_ptbxl_tables(root)
    if folds is not None:
        database = database[database["strat_fold"].isin(list(folds))]
    database, label_lists, dropped = _ptbxl_labels(root, database, statements, classes, min_likelihood, unlabelled)
    rates = {key: float(value) for key, value in data_card.content.get("sampling_rates_hz", {}).items()}
    collector = _Collector(settings, len(database), on_error, root, allow_outside)
    order = _ptbxl_columns(resolution, settings)
    _read_ptbxl_records(collector, root, database, order, rates, progress, allow_outside)
    kept = collector.kept
    sites, patients = (_id_column(database, column, kept) for column in ("site", "patient_id"))
    return EcgSet(
        signals=collector.signals(root),
        labels=_multi_hot([label_lists[i] for i in kept], classes),
        classes=tuple(classes),
        record_ids=np.array([str(i) for i in database.index.to_numpy()[kept]], dtype=str),
        sampling_rate_hz=collector.rate(root),
        lengths=np.array(collector.lengths, dtype=np.int64),
        folds=database["strat_fold"].to_numpy()[kept].astype(np.int64),
        sites=sites,
        patients=patients,
        leads=settings.leads,
        skipped=collector.skipped,
        unlabelled=dropped,
        source=str(root),
    )


def _ptbxl_labels(
    root: Path, database, statements, classes: Sequence[str], min_likelihood: float, unlabelled: str
) -> tuple[Any, list[list[str]], tuple[str, ...]]:
    """``(database, superclasses per row, dropped ecg_ids)``; rows with no class among ``classes`` are dropped
    when ``unlabelled == "drop"``."""
    label_lists = ptbxl_superclasses(
        database["scp_codes"].tolist(), statements, min_likelihood, root / "scp_statements.csv"
    )
    has_label = np.array([any(name in classes for name in names) for names in label_lists], dtype=bool)
    dropped = tuple(str(i) for i in database.index[~has_label]) if unlabelled == "drop" else ()
    if unlabelled == "drop":
        database = database[has_label]
        label_lists = [names for names, keep in zip(label_lists, has_label) if keep]
    return database, label_lists, dropped


def _ptbxl_columns(resolution: str, settings: EcgPreprocessing) -> tuple[str, ...]:
    """The record columns to try, in order, for `read_ptbxl`'s ``resolution``."""
    order = ("filename_hr", "filename_lr")
    if resolution == "lr" or (resolution == "auto" and (settings.sampling_rate_hz or 500) <= 100):
        order = ("filename_lr", "filename_hr")
    if resolution != "auto":
        order = order[:1]
    return order


def _read_ptbxl_records(
    collector: _Collector,
    root: Path,
    database,
    order: tuple[str, ...],
    rates: Mapping[str, float],
    progress: bool,
    allow_outside: bool,
) -> None:
    """Add each row's record (the first non-empty column of ``order``) to ``collector``, in row order."""
    table = root / "ptbxl_database.csv"
    rows = database.itertuples()
    for position, row in enumerate(tqdm(rows, total=len(database), desc="PTB-XL records", disable=not progress)):
        column = next((name for name in order if isinstance(getattr(row, name), str) and getattr(row, name)), None)
        if column is None:
            problem = f"no record file in {' or '.join(order)}"
            collector.add(position, root / "ptbxl_database.csv", problem=problem, where=f"ecg_id {row.Index}")
            continue
        where = f"ecg_id {row.Index}, {column}"
        path = confined(getattr(row, column), root, f"{table} ({where})", allow_outside)
        collector.add(position, path, expected_rate_hz=rates.get(column), where=where)


def _id_column(database, column: str, rows: Sequence[int]) -> np.ndarray | None:
    """``column`` of the table's ``rows`` as text ids (`_id_text`); None when the table has no such column."""
    if column not in database.columns:
        return None
    return np.array([_id_text(value) for value in database[column].to_numpy()[rows]], dtype=str)


def _id_text(value) -> str:
    """An id of PTB-XL's table (``site``, ``patient_id``: float columns with gaps) as text: 2.0 -> "2", NaN -> ""."""
    if isinstance(value, (float, np.floating)):
        return "" if np.isnan(value) else (str(int(value)) if float(value).is_integer() else str(value))
    return str(value)


def read_embedded(settings: EcgPreprocessing | None = None, **options) -> EcgSet:
    """The shipped synthetic PTB-XL-style set (data card ``ptbxl-synthetic``); options as `read_ptbxl`."""
    if not (EMBEDDED_PTBXL / "ptbxl_database.csv").is_file():
        raise UserError(
            f"{EMBEDDED_PTBXL}: the embedded ECG data is missing; regenerate it with "
            "workbench.domains.ecg.generate.generate_ptbxl_synthetic"
        )
    options.setdefault("card", "ptbxl-synthetic")
    return read_ptbxl(EMBEDDED_PTBXL, settings, **options)


# ------------------------------------------------------------------------------------------ CinC 2021
def parse_dx(comments: Iterable[str]) -> list[str] | None:
    """The SNOMED CT codes of a header's ``# Dx:`` line (None when there is no such line)."""
    for comment in comments:
        key, sep, value = comment.lstrip("#").partition(":")
        if sep and key.strip().lower() == "dx":
            return [code.strip() for code in value.split(",") if code.strip()]
    return None


def load_label_map(path: str | Path) -> dict[str, str]:
    """A SNOMED CT → class map from a csv with columns ``snomed_ct`` and ``class`` (other columns ignored)."""
    import pandas as pd

    path = Path(path)
    try:
        table = pd.read_csv(path, dtype=str)
    except Exception as error:
        raise UserError(f"{path}: not a readable csv label map ({error})") from None
    for column in ("snomed_ct", "class"):
        if column not in table.columns:
            raise field_error(path, column, "columns snomed_ct and class", f"columns {list(table.columns)}")
    table = table.dropna(subset=["snomed_ct", "class"])
    return {code.strip(): name.strip() for code, name in zip(table["snomed_ct"], table["class"])}


def cinc_labels(codes: Iterable[str], label_map: Mapping[str, str], normal_class: str | None = "NORM") -> list[str]:
    """Classes of one record's SNOMED codes; ``normal_class`` is dropped when another class is present."""
    names = sorted({label_map[code] for code in codes if code in label_map})
    if normal_class is not None and normal_class in names and len(names) > 1:
        names.remove(normal_class)
    return names


def read_cinc2021(
    root: str | Path,
    settings: EcgPreprocessing | None = None,
    *,
    label_map: Mapping[str, str] | str | Path | None = None,
    classes: Sequence[str] | None = None,
    normal_class: str | None = "NORM",
    on_error: str | None = None,
    unlabelled: str = "drop",
    card: str = "cinc2021",
    progress: bool = False,
    allow_outside: bool = False,
) -> EcgSet:
    """Read PhysioNet/CinC 2021 style records (every ``*.hea`` below ``root``) with ``# Dx:`` labels.

    Args:
        root: a folder (searched recursively, records in sorted path order).
        settings: the preprocessing (default `EcgPreprocessing()`).
        label_map: SNOMED CT code → class: a dict, or a csv path (`load_label_map`); default
            `SNOMED_SUPERCLASSES` (PTB-XL's superclasses).
        classes: the label columns; default the map's classes in order of first appearance.
        normal_class: the class meaning "nothing else found" (sinus rhythm maps to NORM), dropped from a
            record that has another class; None keeps every mapped class.
        on_error: ``"skip"`` or ``"raise"`` for a bad record (a record without a ``# Dx:`` line is one);
            None: the data card's ``on_bad_record``.
        unlabelled: ``"drop"`` or ``"keep"`` records none of whose codes maps to ``classes``.
        card: the data card giving the default ``on_bad_record``.
        progress: show a progress bar.
        allow_outside: read data files that headers name outside ``root`` (``--allow-paths-outside``); by
            default such a header stops the read (`workbench.paths.PathOutsideData`).

    Sites are the first folder below ``root`` (``cpsc_2018``, ``georgia``, ...), or for records directly
    in ``root`` the letters their name starts with (A, E, HR, I, JS, Q, S).
    """
    settings = settings or EcgPreprocessing()
    on_error = _on_error(on_error, load_card(card))
    if unlabelled not in UNLABELLED:
        raise UserError(f"unlabelled must be one of {UNLABELLED}, got {unlabelled!r}")
    label_map = _cinc_label_map(label_map)
    classes = tuple(classes) if classes is not None else tuple(dict.fromkeys(label_map.values()))
    root = Path(root)
    headers = _cinc_headers(root)
    collector = _Collector(settings, len(headers), on_error, root, allow_outside)
    names, label_lists, sites, dropped = _read_cinc_records(
        collector, root, headers, label_map, classes, normal_class, unlabelled, progress
    )
    return EcgSet(
        signals=collector.signals(root),
        labels=_multi_hot(label_lists, classes),
        classes=classes,
        record_ids=np.array(names, dtype=str),
        sampling_rate_hz=collector.rate(root),
        lengths=np.array(collector.lengths, dtype=np.int64),
        folds=None,
        sites=np.array(sites, dtype=str),
        leads=settings.leads,
        skipped=collector.skipped,
        unlabelled=tuple(dropped),
        source=str(root),
    )


def _cinc_label_map(label_map: Mapping[str, str] | str | Path | None) -> dict[str, str]:
    """`read_cinc2021`'s ``label_map`` as a dict of stripped SNOMED CT code → class (default `SNOMED_SUPERCLASSES`)."""
    if label_map is None:
        label_map = SNOMED_SUPERCLASSES
    elif not isinstance(label_map, Mapping):
        label_map = load_label_map(label_map)
    return {str(code).strip(): str(name) for code, name in label_map.items()}


def _cinc_headers(root: Path) -> list[Path]:
    """Every ``*.hea`` below ``root`` in sorted path order; a UserError when there is none or no ``root``."""
    if not root.is_dir():
        raise UserError(f"{root}: no such folder; expected CinC 2021 records (<name>.hea + <name>.mat)")
    headers = sorted(root.rglob("*.hea"))
    if not headers:
        raise UserError(f"{root}: no WFDB header (*.hea) found in this folder or below")
    return headers


def _read_cinc_records(
    collector: _Collector,
    root: Path,
    headers: list[Path],
    label_map: Mapping[str, str],
    classes: tuple[str, ...],
    normal_class: str | None,
    unlabelled: str,
    progress: bool,
) -> tuple[list[str], list[list[str]], list[str], list[str]]:
    """Add each header's record to ``collector``; returns the kept records' names, class lists and sites, and
    the names of the unlabelled records dropped."""
    import wfdb

    label_lists: list[list[str]] = []
    names: list[str] = []
    sites: list[str] = []
    dropped: list[str] = []
    for header in tqdm(headers, desc="CinC records", disable=not progress):
        try:
            comments = wfdb.rdheader(str(header.with_suffix(""))).comments
        except Exception as error:
            collector.add(len(names), header, problem=f"unreadable WFDB header ({error})")
            continue
        codes = parse_dx(comments or ())
        if codes is None:
            collector.add(len(names), header, problem="no '# Dx:' line in the header (no labels)")
            continue
        labels = [name for name in cinc_labels(codes, label_map, normal_class) if name in classes]
        if not labels and unlabelled == "drop":
            dropped.append(header.stem)
            continue
        if collector.add(len(names), header):
            names.append(header.stem)
            label_lists.append(labels)
            sites.append(_cinc_site(root, header))
    return names, label_lists, sites, dropped


def _cinc_site(root: Path, header: Path) -> str:
    parts = header.relative_to(root).parts
    if len(parts) > 1:
        return parts[0]
    return "".join(char for char in header.stem if char.isalpha()) or header.stem

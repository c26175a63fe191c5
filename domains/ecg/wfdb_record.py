"""One 12-lead ECG record in WFDB format (wfdb), read and checked before it is used.

Signals are converted to physical units exactly as wfdb's ``p_signal``: ``(digital − baseline) / gain``
[mV], samples holding the format's missing-value code are NaN. Every record is checked before it is
used (files present, data size as the header implies, checksums, all 12 leads, no NaN, no flat lead,
expected rate); a bad record raises a `BadRecordError` (file, what is wrong), never zero-filled. Then `preprocess`
makes it a model input (`read_record`, `prepared_record`).

Shapes:
    `read_raw_record`: signal_mv (n_leads, n_samples) float64 [mV]; `read_record`: signal (n_leads, n_samples)
    float32.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from workbench.domains.ecg.preprocess import LEADS, EcgPreprocessing, preprocess

from workbench.core.errors import UserError
from workbench.core.paths import confined
from workbench.core.records import BadRecordError

# WFDB storage formats: bytes per sample (for the size check) and the digital value meaning "no sample".
_BYTES_PER_SAMPLE = {"8": 1, "16": 2, "24": 3, "32": 4, "61": 2, "80": 1, "160": 2, "212": 1.5, "310": 4 / 3,
                     "311": 4 / 3}
_MISSING_VALUE = {"16": -(2**15), "61": -(2**15), "160": -(2**15), "24": -(2**23), "32": -(2**31), "80": -(2**7)}
_MISSING_VALUE.update({"212": -(2**11), "310": -(2**9), "311": -(2**9)})
_UNITS_PER_MV = {"mv": 1.0, "uv": 1000.0, "μv": 1000.0, "µv": 1000.0, "v": 0.001, "nv": 1e6}


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
            unreadable file). `workbench.core.paths.PathOutsideData`: a data file named outside ``root``.
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
    _check_rate_field(header_path)
    _check_record_line(header_path, header)
    return header_path, header


def _check_rate_field(header_path: Path) -> None:
    """The record line's rate field as written (wfdb reads one it cannot parse, such as ``-100``, as its default of
    250 Hz): a positive finite number [Hz], optionally ``/counter(base)``."""
    with open(header_path, "rb") as handle:
        for raw in handle:
            words = raw.decode("ascii", "replace").split("#", 1)[0].split()
            if words:
                break
        else:
            return  # wfdb has refused a header without a record line already
    if len(words) < 3:
        raise BadRecordError(header_path, "record line: no sampling rate (the 3rd field); expected a positive number "
                             "[Hz] (wfdb would assume 250 Hz)")  # fmt: skip
    text = words[2].split("/")[0].split("(")[0]
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not (math.isfinite(rate) and rate > 0):
        raise BadRecordError(header_path, f"record line: sampling rate field (the 3rd) is {words[2]!r}; expected a "
                             "positive number [Hz]")  # fmt: skip


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
    signal, fs, _ = prepared_record(path, settings, expected_rate_hz, root, allow_outside)
    return signal, fs


def prepared_record(
    path, settings: EcgPreprocessing, expected_rate_hz: float | None, root=None, allow_outside=False
) -> tuple[np.ndarray, float, int]:
    """`read_raw_record`, then `preprocess`: ``(signal (n_leads, n_samples) float32, rate [Hz], real samples before
    any zero padding)``; a rate, length or preprocessing problem is a `BadRecordError` naming the header."""
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

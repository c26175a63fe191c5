"""Readers of EEG recordings into fixed-length labelled windows, through MNE (never a hand-parsed EDF or GDF).

Every reader returns `EegWindows`: windows of the model's channels, one integer label and one subject each,
plus a report of what was left out and why. The layouts (each with its data card):

* Sleep-EDF Expanded, sleep cassette (`read_sleep_edf`, card ``sleep-edf``; Kemp et al. 2000);
* BCI Competition IV 2a, GDF files and the BNCI/MOABB ``.mat`` files (`read_bci_iv_2a`, `read_bnci_2a_mat`,
  card ``bci-iv-2a``; Brunner et al. 2008);
* PhysioNet EEG Motor Movement/Imagery (`read_eegmmidb`, card ``eegmmidb``; Schalk et al. 2004);
* any folder of EDF/BDF/GDF/FIF/BrainVision recordings with a user-given {annotation: class} mapping
  (`read_eeg_folder`, card ``eeg-folder``) — defined here.

Signals go through the channel contract (`workbench.domains.eeg.channels.select_channels`) and are returned
in µV (MNE reads volts; the readers multiply by 1e6 at this boundary). A bad record (unreadable, a missing
channel, a rate the card does not allow, an annotation outside the mapping or past the end of the recording)
becomes a `RecordProblem` naming the file and is skipped or raised as ``on_error`` says (default: the card's
``on_bad_record``), never silently dropped; windows left out on purpose (unscored epochs, rejected trials,
windows past the end) are counted per reason in `EegWindows.excluded`.

Shapes:
    `EegWindows.signals_uv` (n_windows, n_chans, n_times) float32 [µV]; `labels`, `subjects`, `records`,
    `onsets_s` (n_windows,).
"""

from __future__ import annotations

import datetime
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from workbench.domains.eeg.channels import ChannelSelection, interpolation_sources, match_channels, select_channels

from workbench.core.datacard import load_card
from workbench.core.errors import UserError
from workbench.core.records import BadRecordError, Collector, SkipReport

ON_ERROR = ("skip", "raise")
UNKNOWN = ("error", "ignore")
#: Formats `mne.io.read_raw` reads for the generic folder reader (BrainVision by its ``.vhdr`` header).
EEG_EXTENSIONS = (".edf", ".bdf", ".gdf", ".fif", ".vhdr")
#: Formats whose channels may each have their own rate (MNE upsamples the slow ones when it reads them).
_PER_CHANNEL_RATES = (".edf", ".bdf", ".gdf")


# ---------------------------------------------------------------------------------------------- windows
@dataclass(frozen=True)
class EegWindows:
    """Fixed-length labelled windows of EEG with their subject and record.

    ``excluded`` counts the windows (or 30 s epochs) left out on purpose, per reason (``"Sleep stage ?"``,
    ``"rejected trial (1023)"``, ...); ``skipped`` lists the records that could not be used; ``notes`` the
    changes made to the data (interpolated channels, resampling), in words.

    Shapes:
        signals_uv (n_windows, n_chans, n_times) float32 [µV], channels in the order of ``ch_names``, at
        ``sfreq`` [Hz]; labels (n_windows,) int64 indices into ``classes``; subjects, records (n_windows,) str;
        onsets_s (n_windows,) float64 [s], the window's first sample from the start of its record.
    """

    signals_uv: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    subjects: np.ndarray
    records: np.ndarray
    onsets_s: np.ndarray
    ch_names: tuple[str, ...]
    sfreq: float
    source: str = ""
    excluded: dict[str, int] = field(default_factory=dict)
    skipped: SkipReport = field(default_factory=SkipReport)
    notes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def n_chans(self) -> int:
        return self.signals_uv.shape[1]

    @property
    def n_times(self) -> int:
        return self.signals_uv.shape[2]

    def subset(self, index) -> EegWindows:
        """The windows at ``index`` (a boolean mask or integer indices); the reports stay with the whole set."""
        index = np.asarray(index)
        if index.dtype == bool:
            if index.shape != self.labels.shape:
                raise UserError(f"subset: a mask of {index.shape[0]} entries for {len(self)} windows")
            index = np.flatnonzero(index)
        return replace(
            self,
            signals_uv=self.signals_uv[index],
            labels=self.labels[index],
            subjects=self.subjects[index],
            records=self.records[index],
            onsets_s=self.onsets_s[index],
        )

    def class_counts(self) -> dict[str, int]:
        """Windows per class, in the order of ``classes``."""
        counts = np.bincount(self.labels, minlength=len(self.classes))
        return {name: int(count) for name, count in zip(self.classes, counts)}

    def subject_counts(self) -> dict[str, int]:
        """Windows per subject."""
        return dict(sorted(Counter(self.subjects.tolist()).items()))

    def report(self) -> str:
        """What was read, what was left out and why, in a few lines."""
        lines = [
            f"{len(self)} windows of {self.n_chans} channels x {self.n_times} samples at {self.sfreq:g} Hz "
            f"from {len(set(self.records.tolist()))} record(s) of {len(set(self.subjects.tolist()))} subject(s) "
            f"({self.source})",
            "classes: " + ", ".join(f"{name} {count}" for name, count in self.class_counts().items()),
        ]
        if self.excluded:
            lines.append("excluded: " + ", ".join(f"{reason} {count}" for reason, count in self.excluded.items()))
        lines.extend(self.notes)
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------- EDF header
#: Formats whose fixed-width ASCII header is read directly (`read_edf_header`): EDF/EDF+ (2-byte samples), BDF (3).
_EDF_SUFFIXES = (".edf", ".bdf")
_START = re.compile(r"^(\d\d)\D(\d\d)\D(\d\d)(\d\d)\D(\d\d)\D(\d\d)$")


@dataclass(frozen=True)
class EdfHeader:
    """The fields of an EDF/EDF+/BDF header that say how large the file must be, and when it starts.

    The header is fixed-width ASCII: 256 bytes, then 256 per signal (Kemp et al. 1992, EDF+ 2003); read here
    directly because MNE only warns (and the readers silence MNE) when the file and its header disagree.

    Attributes:
        start: recording start from bytes 168-183 (``dd.mm.yyhh.mm.ss``; yy 85-99 -> 19yy, 00-84 -> 20yy), or
            None when the field is not a date and time.
        header_bytes: bytes 184-191, 256 x (1 + number of signals).
        n_records: bytes 236-243, the number of data records (-1: unknown, allowed only while recording).
        record_s: bytes 244-251, the duration of a data record [s].
        samples_per_record: per signal, its number of samples in each data record.
        bytes_per_sample: 2 (EDF) or 3 (BDF).
        labels: per signal, its label (bytes 256 + 16 i, stripped).
        ranges: per signal, its physical and digital (min, max, min, max) as written (stripped text).
    """

    start: datetime.datetime | None
    header_bytes: int
    n_records: int
    record_s: float
    samples_per_record: tuple[int, ...]
    bytes_per_sample: int
    labels: tuple[str, ...] = ()
    ranges: tuple[tuple[str, str, str, str], ...] = ()

    @property
    def record_bytes(self) -> int:
        """Bytes of one data record (every signal's samples)."""
        return self.bytes_per_sample * sum(self.samples_per_record)


def read_edf_header(path: str | Path) -> EdfHeader:
    """The header of an EDF/EDF+/BDF file, read directly; a `BadRecordError` naming the field that is not a number."""
    path = Path(path)
    with open(path, "rb") as handle:
        fixed = handle.read(256)
        if len(fixed) < 256:
            raise BadRecordError(path, f"{len(fixed)} bytes: shorter than an EDF header (256 bytes)")

        def number(start: int, stop: int, name: str, kind=int):
            text = fixed[start:stop].decode("ascii", "replace").strip()
            try:
                return kind(text)
            except ValueError:
                raise BadRecordError(
                    path, f"EDF header field {name!r} (bytes {start}-{stop - 1}) is {text!r}, expected a number"
                ) from None

        header_bytes = number(184, 192, "number of bytes in header record")
        n_records = number(236, 244, "number of data records")
        record_s = number(244, 252, "duration of a data record", float)
        n_signals = number(252, 256, "number of signals")
        if n_signals < 0 or header_bytes != 256 * (1 + n_signals):
            raise BadRecordError(
                path,
                f"EDF header field 'number of bytes in header record' (bytes 184-191) is {header_bytes}, expected "
                f"256 x (1 + {n_signals} signals) = {256 * (1 + n_signals)}",
            )
        if not (math.isfinite(record_s) and record_s >= 0):
            raise BadRecordError(
                path, f"EDF header field 'duration of a data record' (bytes 244-251) is {record_s:g}, expected a "
                "duration of 0 s or more",
            )
        # per signal: labels 16, transducer 80, dimension 8, physical min / max and digital min / max 8 each,
        # prefiltering 80, samples per data record 8, reserved 32
        signals = handle.read(256 * n_signals)
    if len(signals) < 256 * n_signals:
        raise BadRecordError(path, f"the header is cut: {n_signals} signals need {header_bytes} header bytes")

    def texts(start: int, width: int) -> list[str]:
        begin = start * n_signals
        return [signals[begin + width * i : begin + width * (i + 1)].decode("ascii", "replace").strip()
                for i in range(n_signals)]  # fmt: skip

    field = signals[216 * n_signals : 224 * n_signals]
    ranges = tuple(zip(*(texts(start, 8) for start in (104, 112, 120, 128))))
    samples = []
    for i in range(n_signals):
        text = field[8 * i : 8 * i + 8].decode("ascii", "replace").strip()
        if not text.isdigit():
            raise BadRecordError(path, f"EDF header: samples per data record of signal {i + 1} is {text!r}")
        samples.append(int(text))
    bytes_per_sample = 3 if fixed[:1] == b"\xff" else 2  # BDF's version is 0xFF "BIOSEMI"
    return EdfHeader(
        _edf_start(fixed[168:184]), header_bytes, n_records, record_s, tuple(samples), bytes_per_sample,
        tuple(texts(0, 16)), ranges,
    )  # fmt: skip


def check_calibration(path: str | Path, header: EdfHeader, channels: Sequence[str]) -> None:
    """A `BadRecordError` naming the file, the channel and the field when a channel to be read has a physical or
    digital range MNE cannot scale by: not numbers, digital maximum not above the minimum, or physical minimum equal
    to the maximum (a gain of 0 or infinity: a zero or non-finite signal)."""
    for label, (pmin, pmax, dmin, dmax) in zip(header.labels, header.ranges):
        if label not in channels:
            continue
        try:
            numbers = [float(text) for text in (pmin, pmax, dmin, dmax)]
        except ValueError:
            numbers = []
        if not (numbers and all(map(math.isfinite, numbers))):
            raise BadRecordError(
                path, f"EDF header: channel {label!r} has physical range {pmin!r} to {pmax!r} and digital range "
                f"{dmin!r} to {dmax!r}; expected four finite numbers",
            )
        if not numbers[3] > numbers[2] or numbers[0] == numbers[1]:
            raise BadRecordError(
                path, f"EDF header: channel {label!r} has physical range {pmin} to {pmax} and digital range {dmin} to "
                f"{dmax}; expected a digital maximum above the minimum and two different physical limits",
            )


def _edf_start(field: bytes) -> datetime.datetime | None:
    match = _START.match(field.decode("ascii", "replace").strip())
    if not match:
        return None
    day, month, year, hour, minute, second = (int(group) for group in match.groups())
    try:
        return datetime.datetime(year + (1900 if year >= 85 else 2000), month, day, hour, minute, second)
    except ValueError:
        return None


def check_edf_size(path: str | Path) -> EdfHeader:
    """The header of an EDF/EDF+/BDF file whose size is header + n_records x record size (`read_edf_header`).

    Raises:
        BadRecordError: a file shorter than its header says (truncated: fewer data records, or a record cut),
        or longer (bytes after the last record, or a wrong record count); with an unknown count (-1), a size
        that is not a whole number of records.
    """
    path = Path(path)
    header = read_edf_header(path)
    size = path.stat().st_size
    body, record = size - header.header_bytes, header.record_bytes
    whole = f"{body // record} whole data record(s)" if record and body >= 0 else "no whole data record"
    if header.n_records < 0:
        if record and body % record == 0:
            return header
        raise BadRecordError(
            path, f"{size} bytes: the header gives no record count (-1) and the data are not whole records of "
            f"{record} bytes ({whole})",
        )
    expected = header.header_bytes + header.n_records * record
    if size < expected:
        raise BadRecordError(
            path,
            f"truncated: the header says {header.n_records} data records of {record} bytes ({expected} bytes in all), "
            f"the file has {size} bytes ({whole})",
        )
    if size > expected:
        raise BadRecordError(
            path,
            f"{size} bytes, {size - expected} more than the header's {header.n_records} data records of {record} bytes "
            f"({expected} bytes in all): bytes were appended or the header's record count is wrong",
        )
    return header


# ----------------------------------------------------------------------------------------- one recording
def read_recording(
    path: str | Path,
    channels: Sequence[str],
    *,
    rename: Mapping[str, str] | None = None,
    allow_interpolation: bool = False,
    allowed_sfreqs: Sequence[float] | None = None,
    resample_to: float | None = None,
) -> ChannelSelection:
    """Read one recording with `mne.io.read_raw`, only the wanted channels, through the channel contract.

    EDF, BDF and GDF are read with ``include=`` the matched channels, so a slow channel the model does not ask
    for (Sleep-EDF's 1 Hz ``Temp rectal``) is never read nor upsampled; each wanted channel's own rate is read
    from the header (``include=[channel]``) and a slow one is refused. Other formats hold one rate.

    Returns:
        The `ChannelSelection`, whose ``raw`` holds the recording (preloaded, [V]) and its annotations.

    Raises:
        BadRecordError: a file MNE cannot read, or an EDF/BDF whose size is not what its header says
        (`check_edf_size`: truncated or padded). UserError: the channel contract (see `select_channels`).
    """
    import mne

    path = Path(path)
    edf = check_edf_size(path) if path.suffix.lower() in _EDF_SUFFIXES and path.is_file() else None
    with _mne_reading(path):
        header = mne.io.read_raw(path, preload=False, verbose="error")
    kinds = header.get_channel_types()
    found, missing = match_channels(
        header.ch_names, channels, source=str(path), kinds=kinds, rename=rename, allow_interpolation=allow_interpolation
    )
    include = list(found.values())
    helpers = [name for name in interpolation_sources(header.ch_names, kinds, rename).values() if name not in include]
    native = None
    with _mne_reading(path):
        if path.suffix.lower() in _PER_CHANNEL_RATES:
            native = {name: _native_sfreq(path, name, edf) for name in include}
            if missing:  # interpolate from the file's other 10-20 channels stored at the wanted channels' rate
                rate = max(native.values(), default=0.0)
                include += [name for name in helpers if _native_sfreq(path, name, edf) == rate]
            if edf is not None:
                check_calibration(path, edf, include)
            raw = mne.io.read_raw(path, include=include, preload=True, verbose="error")
        else:
            raw = header.pick(include + (helpers if missing else [])).load_data(verbose="error")
    finite = np.isfinite(raw.get_data()).all(axis=1)
    if not finite.all():
        bad = [name for name, ok in zip(raw.ch_names, finite) if not ok]
        raise BadRecordError(path, f"channel(s) {', '.join(bad)} hold samples that are not finite numbers (NaN or inf)")
    return select_channels(
        raw,
        channels,
        source=str(path),
        rename=rename,
        allow_interpolation=allow_interpolation,
        allowed_sfreqs=allowed_sfreqs,
        resample_to=resample_to,
        native_sfreqs=native,
    )


@contextmanager
def _mne_reading(path: Path):
    """Turn what MNE raises on a malformed file (many kinds) into a `BadRecordError` naming it; ours pass through."""
    try:
        yield
    except UserError:
        raise
    except Exception as error:
        raise BadRecordError(path, f"not a recording MNE can read ({type(error).__name__}: {error})") from None


def _native_sfreq(path: Path, channel: str, edf: EdfHeader | None = None) -> float:
    """The rate [Hz] at which ``channel`` is stored: from the EDF/BDF header ``edf`` (samples per data record / its
    duration) when it names the channel once, else from MNE reading the header with only that channel."""
    import mne

    if edf is not None and edf.record_s > 0 and edf.labels.count(channel) == 1:
        return edf.samples_per_record[edf.labels.index(channel)] / edf.record_s
    return float(mne.io.read_raw(path, include=[channel], preload=False, verbose="error").info["sfreq"])


def read_annotated_recording(path: str | Path, channels: Sequence[str], **options: Any):
    """`read_recording` (``options`` are its keywords) and the onsets [s] of its annotations from the recording's
    start, every annotation checked to start inside the recording (`check_annotations_in_recording`).

    Returns (`ChannelSelection`, onsets_s (n_annotations,)); the descriptions and durations are
    ``selection.raw.annotations``'.
    """
    selection = read_recording(path, channels, **options)
    onsets_s = annotation_onsets_s(selection.raw)
    descriptions = selection.raw.annotations.description
    check_annotations_in_recording(path, onsets_s, descriptions, selection.raw.n_times / selection.sfreq)
    return selection, onsets_s


def annotation_onsets_s(raw) -> np.ndarray:
    """Onsets [s] of ``raw.annotations`` from the recording's first sample (MNE counts them from ``meas_date``
    when the annotations have an ``orig_time``, so a FIF file cropped before saving has ``first_time`` > 0)."""
    onsets = np.asarray(raw.annotations.onset, float)
    return onsets - raw.first_time if raw.annotations.orig_time is not None else onsets


def check_annotations_in_recording(path: str | Path, onsets_s, descriptions, duration_s: float) -> None:
    """A `BadRecordError` naming the file, the annotation and its onset when one starts outside the recording.

    An annotation that starts before 0 s or at or after the end (``duration_s`` [s]) belongs to another
    recording (or the file is truncated). One that starts inside and runs past the end is the readers'
    business: they keep only windows that lie inside the recording and count the others.
    """
    for onset, description in zip(np.asarray(onsets_s, float), descriptions):
        if onset < 0 or onset >= duration_s:
            raise BadRecordError(
                path,
                f"annotation {str(description)!r} at {onset:g} s lies outside the recording (0 to {duration_s:g} s); "
                "the annotations do not belong to this recording, or the recording is truncated",
            )


def cut_windows(data: np.ndarray, starts: np.ndarray, n_times: int) -> np.ndarray:
    """Windows ``data[:, s : s + n_times]`` for each start sample ``s`` (all inside ``data``).

    Shapes: data (n_chans, n_samples) -> (len(starts), n_chans, n_times).
    """
    starts = np.asarray(starts, dtype=np.int64)
    if starts.size == 0:
        return np.zeros((0, data.shape[0], n_times), data.dtype)
    index = starts[:, None] + np.arange(n_times)[None, :]
    return np.ascontiguousarray(data[:, index].transpose(1, 0, 2))


def on_error_from_card(value: str | None, card_name: str) -> str:
    """``on_error`` as given, or the data card's ``on_bad_record``; checked against `ON_ERROR`."""
    value = value or load_card(card_name).content.get("on_bad_record", "skip")
    if value not in ON_ERROR:
        raise UserError(f"on_error must be one of {ON_ERROR}, got {value!r}")
    return value


def allowed_sfreqs_from_card(value: Sequence[float] | None, card_name: str) -> tuple[float, ...] | None:
    """``allowed_sfreqs`` as given, or the data card's ``allowed_sfreqs_hz`` (None: any rate)."""
    if value is None:
        value = load_card(card_name).content.get("allowed_sfreqs_hz")
    return None if value is None else tuple(float(rate) for rate in value)


class WindowCollector(Collector):
    """Windows of many records in reading order; a bad record is skipped (and reported under the path given to
    `record`) or raised."""

    def __init__(self, on_error: str, classes: Sequence[str]):
        super().__init__(on_error)
        self.classes = tuple(classes)
        self.excluded: Counter[str] = Counter()
        self.notes: list[str] = []
        self._parts: list[tuple[np.ndarray, np.ndarray, str, str, np.ndarray]] = []
        self._ch_names: tuple[str, ...] | None = None
        self._sfreq: float | None = None

    def exclude(self, reason: str, count: int = 1) -> None:
        """Count ``count`` windows (or epochs) left out for ``reason``."""
        if count:
            self.excluded[reason] += int(count)

    def add(
        self,
        path: str | Path,
        selection: ChannelSelection,
        windows_v: np.ndarray,
        labels: np.ndarray,
        onsets_s: np.ndarray,
        subject: str,
        record: str,
    ) -> None:
        """Keep one record's windows (given in volts, kept in µV); the rate must match the records before.

        Shapes: windows_v (n, n_chans, n_times) [V]; labels, onsets_s (n,).
        """
        if self._sfreq is not None and not math.isclose(selection.sfreq, self._sfreq, rel_tol=1e-9):
            raise BadRecordError(
                path,
                f"sampling rate {selection.sfreq:g} Hz differs from the first record's {self._sfreq:g} Hz; "
                "set resample_to to bring every record to one rate",
            )
        self._sfreq, self._ch_names = selection.sfreq, selection.ch_names
        self.notes.extend(selection.notes)
        signals_uv = (np.asarray(windows_v, np.float64) * 1e6).astype(np.float32)
        self._parts.append((signals_uv, np.asarray(labels, np.int64), subject, record, np.asarray(onsets_s, float)))

    def windows(self, source: str | Path) -> EegWindows:
        """All windows read, with the reports; a `UserError` when no record gave a window."""
        parts = [part for part in self._parts if len(part[1])]
        if not parts:
            raise UserError(f"{source}: no labelled window could be read\n{self.skipped.summary()}")
        lengths = {part[0].shape[2] for part in parts}
        if len(lengths) > 1:
            raise UserError(f"{source}: windows of different lengths {sorted(lengths)} samples; set resample_to")
        return EegWindows(
            signals_uv=np.concatenate([part[0] for part in parts]),
            labels=np.concatenate([part[1] for part in parts]),
            classes=self.classes,
            subjects=np.array([part[2] for part in parts for _ in part[1]], dtype=str),
            records=np.array([part[3] for part in parts for _ in part[1]], dtype=str),
            onsets_s=np.concatenate([part[4] for part in parts]),
            ch_names=tuple(self._ch_names or ()),
            sfreq=float(self._sfreq),
            source=str(source),
            excluded=dict(self.excluded),
            skipped=self.skipped,
            notes=tuple(self.notes),
        )


def event_windows(
    collector: WindowCollector,
    path: Path,
    selection: ChannelSelection,
    onsets_s: np.ndarray,
    labels: np.ndarray,
    *,
    tmin_s: float,
    window_s: float,
    subject: str,
    record: str,
) -> None:
    """Cut one window of ``window_s`` [s] from each onset + ``tmin_s`` [s] and hand them to ``collector``.

    Windows that do not lie wholly inside the recording are counted as "window past the end of the recording".
    """
    raw = selection.raw
    sfreq = selection.sfreq
    n_times = int(round(window_s * sfreq))
    starts = np.round((np.asarray(onsets_s, float) + tmin_s) * sfreq).astype(np.int64)
    inside = (starts >= 0) & (starts + n_times <= raw.n_times)
    collector.exclude("window past the end of the recording", int((~inside).sum()))
    windows = cut_windows(raw.get_data(), starts[inside], n_times)
    collector.add(path, selection, windows, np.asarray(labels)[inside], starts[inside] / sfreq, subject, record)


# ------------------------------------------------------------------------------------ any folder of files
def read_eeg_folder(
    root: str | Path,
    mapping: Mapping[str, str],
    *,
    channels: Sequence[str],
    window_s: float,
    tmin_s: float = 0.0,
    tile: bool = False,
    unknown: str = "error",
    extensions: Sequence[str] = EEG_EXTENSIONS,
    allowed_sfreqs: Sequence[float] | None = None,
    resample_to: float | None = None,
    allow_interpolation: bool = False,
    subject_of: Callable[[Path], str] | None = None,
    on_error: str | None = None,
) -> EegWindows:
    """Labelled windows from any folder (searched recursively) of EDF, BDF, GDF, FIF or BrainVision recordings.

    Each annotation whose description is a key of ``mapping`` gives a window of ``window_s`` seconds starting
    ``tmin_s`` after its onset (``tile=False``), or as many consecutive windows as fit in its duration
    (``tile=True``, for scored epochs such as sleep stages).

    Args:
        root: the folder (or one file).
        mapping: {annotation description: class name}; classes are numbered in order of first appearance.
        channels: the model's channels, in order (see `select_channels`).
        window_s: window length [s]. tmin_s: window start after the annotation onset [s] (``tile=False``).
        tile: cut each annotation's duration into windows instead of one window from its onset.
        unknown: ``"error"`` (default): an annotation outside ``mapping`` is a problem naming the file and the
            description; ``"ignore"``: such annotations are counted in the report and left out.
        extensions: the file kinds read (BrainVision by its ``.vhdr``).
        allowed_sfreqs: rates [Hz] accepted (None: any). resample_to: the rate [Hz] the model wants.
        allow_interpolation: interpolate missing 10-20 channels instead of refusing the record.
        subject_of: subject of a file; default the first folder under ``root`` (or the file's stem when the file
            lies directly in ``root``).
        on_error: ``"skip"`` or ``"raise"`` a bad record (default: the card ``eeg-folder``'s ``on_bad_record``).

    Returns: `EegWindows` in µV.

    Raises:
        UserError: no recording found, nothing readable, a bad option, or a bad record with ``on_error="raise"``.
    """
    _check_folder_options(mapping, unknown, window_s)
    on_error = on_error_from_card(on_error, "eeg-folder")
    allowed_sfreqs = allowed_sfreqs_from_card(allowed_sfreqs, "eeg-folder")
    root = Path(root)
    files = _recording_files(root, extensions)
    classes = tuple(dict.fromkeys(mapping.values()))
    label_of = {description: classes.index(name) for description, name in mapping.items()}
    collector = WindowCollector(on_error, classes)
    for path in files:
        with collector.record(path):
            selection, onsets_s = read_annotated_recording(
                path,
                channels,
                allow_interpolation=allow_interpolation,
                allowed_sfreqs=allowed_sfreqs,
                resample_to=resample_to,
            )
            annotations = selection.raw.annotations
            _check_mapped(collector, path, annotations.description, label_of, unknown)
            onsets, labels = _window_onsets(collector, onsets_s, annotations, label_of, tile, window_s, tmin_s)
            subject = subject_of(path) if subject_of else _default_subject(root, path)
            record = str(path.relative_to(root)) if path != root else path.name
            event_windows(
                collector,
                path,
                selection,
                np.array(onsets, float),
                np.array(labels, np.int64),
                tmin_s=0.0,
                window_s=window_s,
                subject=subject,
                record=record,
            )
    return collector.windows(root)


def _check_folder_options(mapping: Mapping[str, str], unknown: str, window_s: float) -> None:
    """`read_eeg_folder`'s options: a non-empty mapping, a known ``unknown`` policy, ``window_s`` > 0 [s]."""
    if not mapping:
        raise UserError("mapping is empty; give {annotation description: class name}")
    if unknown not in UNKNOWN:
        raise UserError(f"unknown must be one of {UNKNOWN}, got {unknown!r}")
    if not window_s > 0:
        raise UserError(f"window_s must be positive, got {window_s!r}")


def _recording_files(root: Path, extensions: Sequence[str]) -> list[Path]:
    """``root`` itself when it is a file, else its recordings (recursively, sorted); a UserError when none."""
    suffixes = {suffix.lower() for suffix in extensions}
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix.lower() in suffixes)
    if not files:
        raise UserError(f"{root}: no recording found (looked for {', '.join(sorted(suffixes))} files, recursively)")
    return files


def _check_mapped(
    collector: WindowCollector, path: Path, descriptions: Sequence[str], label_of: Mapping[str, int], unknown: str
) -> None:
    """Refuse (``unknown="error"``) or count as excluded the annotation descriptions outside ``label_of``."""
    outside = Counter(str(d) for d in descriptions if d not in label_of)
    if outside and unknown == "error":
        listed = ", ".join(f"{d!r} ({n}x)" for d, n in outside.items())
        raise BadRecordError(
            path,
            f"annotation(s) {listed} are not in the mapping ({', '.join(map(repr, label_of))}); add them "
            'to the mapping or pass unknown="ignore"',
        )
    for description, count in outside.items():
        collector.exclude(f"annotation {description!r} outside the mapping", count)


def _window_onsets(
    collector: WindowCollector,
    onsets_s: np.ndarray,
    annotations,
    label_of: Mapping[str, int],
    tile: bool,
    window_s: float,
    tmin_s: float,
) -> tuple[list[float], list[int]]:
    """Window starts [s] and class numbers of the mapped annotations: one per annotation at onset + ``tmin_s``,
    or (``tile``) as many consecutive ``window_s`` windows as fit in its duration."""
    onsets, labels = [], []
    for onset, duration, description in zip(onsets_s, annotations.duration, annotations.description):
        if description not in label_of:
            continue
        n = max(int(math.floor(duration / window_s + 1e-9)), 0) if tile else 1
        if tile and n == 0:
            collector.exclude(f"annotation shorter than {window_s:g} s", 1)
        first = onset if tile else onset + tmin_s
        onsets.extend(first + window_s * np.arange(n))
        labels.extend([label_of[description]] * n)
    return onsets, labels


def _default_subject(root: Path, path: Path) -> str:
    parts = () if path == root else path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else path.stem

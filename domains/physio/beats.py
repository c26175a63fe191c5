"""Heartbeats of annotated WFDB records: MIT-BIH Arrhythmia and any folder of records with beat annotations
(card ``mitbih``), read through wfdb, beat symbols mapped to the AAMI classes (ANSI/AAMI EC57).

A beat is a window of one lead around its annotated R peak (default MLII, 0.25 s before to 0.45 s after, at the
record's rate — no resampling), in mV. Classes (EC57; de Chazal, O'Dwyer & Reilly, IEEE TBME 51(7), 2004):

    ===  ========================================  ==========================================
    N    normal and bundle branch block beats       N, L, R, e (atrial escape), j (nodal escape)
    S    supraventricular ectopic beats             A, a, J, S
    V    ventricular ectopic beats                  V, E (ventricular escape)
    F    fusion of ventricular and normal           F
    Q    paced, fusion of paced and normal, unknown /, f, Q
    ===  ========================================  ==========================================

Every other annotation (rhythm changes ``+``, noise ``~``, artefacts ``|``, non-conducted P waves ``x``, flutter
waves ``!``, ...) is not a beat and is counted, not read. Beats whose window would leave the record are counted too.

Records are patients: each beat carries its record as its subject. (MIT-BIH's records 201 and 202 come from the
same man; de Chazal's inter-patient split, `DE_CHAZAL_SPLIT`, puts them on both sides, as published.) The paced
records 102, 104, 107 and 217 are left out of MIT-BIH by default, as EC57 and de Chazal do.

Shapes:
    `BeatSet.beats_mv` (n_beats, n_samples) float32 [mV]; labels, records, subjects, r_peaks (n_beats,)
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from workbench.domains.ecg import read_raw_record

from workbench.core.errors import UserError
from workbench.core.records import BadRecordError, SkipReport

log = logging.getLogger(__name__)

AAMI_CLASSES = ("N", "S", "V", "F", "Q")
#: MIT-BIH beat annotation symbol -> AAMI class.
AAMI_CLASS_OF = {
    **dict.fromkeys("NLRej", "N"),
    **dict.fromkeys("AaJS", "S"),
    **dict.fromkeys("VE", "V"),
    "F": "F",
    **dict.fromkeys("/fQ", "Q"),
}
#: MIT-BIH records with paced beats (left out of the AAMI evaluation).
PACED_RECORDS = ("102", "104", "107", "217")
#: de Chazal et al. (2004): DS1 (training) and DS2 (test) records of the inter-patient split.
DE_CHAZAL_SPLIT = {
    "DS1": ("101", "106", "108", "109", "112", "114", "115", "116", "118", "119", "122",
            "124", "201", "203", "205", "207", "208", "209", "215", "220", "223", "230"),
    "DS2": ("100", "103", "105", "111", "113", "117", "121", "123", "200", "202", "210",
            "212", "213", "214", "219", "221", "222", "228", "231", "232", "233", "234"),
}  # fmt: skip
#: MIT-BIH's sampling rate [Hz].
MITBIH_RATE_HZ = 360.0
_MITBIH_NAME = re.compile(r"^[12]\d\d$")


@dataclass
class BeatSet:
    """Beats of one or more records: windows around the R peaks, AAMI labels, and where each came from.

    ``excluded`` counts what was not read, by reason (non-beat annotations, beats at the record's edges, paced
    records); ``skipped`` the bad records left out (with ``on_error="skip"``).
    """

    beats_mv: np.ndarray
    labels: np.ndarray
    records: np.ndarray
    subjects: np.ndarray
    r_peaks: np.ndarray
    fs_hz: float
    lead: str
    before_s: float
    classes: tuple[str, ...] = AAMI_CLASSES
    excluded: dict[str, int] = field(default_factory=dict)
    skipped: SkipReport = field(default_factory=SkipReport)
    source: str = ""

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index) -> BeatSet:
        """The beats at ``index`` (a boolean mask or indices); counts and reports are kept."""
        return BeatSet(
            self.beats_mv[index], self.labels[index], self.records[index], self.subjects[index], self.r_peaks[index],
            self.fs_hz, self.lead, self.before_s, self.classes, dict(self.excluded), self.skipped, self.source,
        )  # fmt: skip

    def class_counts(self) -> dict[str, int]:
        """Beats per class, every class listed (0 for a class absent here)."""
        counts = np.bincount(self.labels, minlength=len(self.classes))
        return {name: int(count) for name, count in zip(self.classes, counts)}

    def split(self, groups: Mapping[str, Sequence[str]]) -> dict[str, BeatSet]:
        """The beats of each group of records (e.g. `DE_CHAZAL_SPLIT`); a group with no beat here is a UserError."""
        parts = {}
        for name, records in groups.items():
            mask = np.isin(self.records, list(records))
            if not mask.any():
                raise UserError(f"{self.source}: none of the records of {name} ({', '.join(records[:4])}, ...) is here")
            parts[name] = self.subset(mask)
        return parts

    def report(self) -> str:
        """Beats per class and record count, what was excluded and what was skipped."""
        lines = [
            f"{len(self)} beats of {len(set(self.records.tolist()))} record(s), lead {self.lead} at {self.fs_hz:g} Hz, "
            f"{self.beats_mv.shape[1]} samples each ({self.source})",
            "classes: " + ", ".join(f"{name} {count}" for name, count in self.class_counts().items()),
        ]
        if self.excluded:
            lines.append(
                "excluded: " + ", ".join(f"{reason} {count}" for reason, count in sorted(self.excluded.items()))
            )
        return "\n".join(lines)


@dataclass
class RecordBeats:
    """One record's beats (`read_annotated_beats`): windows ``beats_mv`` (n, n_samples) [mV]; ``labels``, ``r_peaks``
    (samples) and annotation ``symbols`` (n,); what was ``excluded``, by reason; the record's rate [Hz]."""

    beats_mv: np.ndarray
    labels: np.ndarray
    r_peaks: np.ndarray
    symbols: np.ndarray
    excluded: Counter
    fs_hz: float


def read_annotated_beats(
    path: str | Path,
    *,
    lead: str = "MLII",
    before_s: float = 0.25,
    after_s: float = 0.45,
    extension: str = "atr",
    expected_rate_hz: float | None = None,
    class_of: Mapping[str, str] = AAMI_CLASS_OF,
    classes: Sequence[str] = AAMI_CLASSES,
    root: str | Path | None = None,
    allow_outside: bool = False,
) -> RecordBeats:
    """One record's beats, each with its label, R-peak sample and annotation symbol (options: `read_beat_folder`'s;
    ``class_of`` maps symbols to classes, beats of a class not in ``classes`` are counted, not read; ``root`` the data
    folder the header's data files must lie in, default the header's own, unless ``allow_outside``).

    Raises:
        BadRecordError: the record's checks (`workbench.domains.ecg.read_raw_record`: missing or truncated
            file, missing lead, NaN, flat signal, unexpected rate), a missing or unreadable annotation file, an
            annotation file without any beat annotation (empty, or rhythm/noise annotations only), or an annotation
            outside the record.
    """
    import wfdb

    raw = read_raw_record(
        path, leads=(lead,), expected_rate_hz=expected_rate_hz, root=root, allow_outside=allow_outside
    )
    base = Path(raw.record)
    annotation_path = base.with_name(f"{base.name}.{extension}")
    if not annotation_path.is_file():
        raise BadRecordError(
            annotation_path, f"annotation file missing (the beats of a record are in its .{extension})"
        )
    _refuse_looping_notes(annotation_path)
    try:
        annotation = wfdb.rdann(str(base), extension)
    except Exception as error:  # wfdb raises many kinds for a damaged annotation file
        raise BadRecordError(annotation_path, f"unreadable WFDB annotation file ({error})") from None
    signal = raw.signal_mv[0]
    samples, symbols = np.asarray(annotation.sample, np.int64), list(annotation.symbol)
    if not any(class_of.get(symbol) for symbol in symbols):
        kinds = ", ".join(f"'{s}' {n}" for s, n in sorted(Counter(symbols).items())) or "none"
        raise BadRecordError(
            annotation_path,
            f"the annotation file holds no beat ({len(symbols)} annotation(s), of kinds {kinds}); "
            "expected beat annotations (N, L, R, V, A, ...)",
        )
    outside = (samples < 0) | (samples >= len(signal))
    if outside.any():
        first = int(np.flatnonzero(outside)[0])
        raise BadRecordError(
            annotation_path,
            f"annotation '{symbols[first]}' at sample {samples[first]} lies outside the record ({len(signal)} samples)",
        )
    before, after = round(before_s * raw.fs_hz), round(after_s * raw.fs_hz)
    excluded: Counter = Counter()
    beats, labels, peaks, kept = [], [], [], []
    for sample, symbol in zip(samples, symbols):
        name = class_of.get(symbol)
        if name is None or name not in classes:
            excluded["non-beat annotation" if name is None else f"class {name} not kept"] += 1
        elif sample < before or sample + after > len(signal):
            excluded["beat at the record's edge"] += 1
        else:
            beats.append(signal[sample - before : sample + after])
            labels.append(list(classes).index(name))
            peaks.append(sample)
            kept.append(symbol)
    window = before + after
    stacked = np.stack(beats).astype(np.float32) if beats else np.zeros((0, window), np.float32)
    return RecordBeats(stacked, np.array(labels, np.int64), np.array(peaks, np.int64), np.array(kept, dtype=str),
                       excluded, raw.fs_hz)  # fmt: skip


def _refuse_looping_notes(path: Path) -> None:
    """A `BadRecordError` for an annotation file on which ``wfdb.rdann`` would never return.

    wfdb 4.3 (``annotation.interpret_defintion_annotations``) reads the notes at sample 0 that start with ``## ``
    as the time resolution (``## time resolution: 360``) or label definitions; any other such note (a damaged
    ``## time resolution``, say) makes it loop forever. Its loop is replayed here on the parsed notes, without
    the bug, to refuse that file first.
    """
    from wfdb.io import annotation as ann

    try:
        pairs = ann.load_byte_pairs(str(path.with_suffix("")), path.suffix[1:], None)
        sample, label_store, _, _, _, notes = ann.proc_ann_bytes(pairs, None)
        definitions, _ = ann.get_special_inds(sample, label_store, notes)
    except Exception:  # a damaged file: wfdb.rdann says what is wrong with it
        return
    fs, i = None, 0
    while i < len(definitions):
        note = notes[i]
        if not isinstance(note, str) or not note.startswith("## "):
            i += 1  # wfdb moves on (or raises on a missing note)
        elif not fs and ann.rx_fs.findall(note):
            fs, i = float(ann.rx_fs.findall(note)[0]), i + 1
        elif note == "## annotation type definitions":
            end = next((j for j in range(i + 1, len(notes)) if notes[j] == "## end of definitions"), None)
            if end is None or not all(ann.rx_custom_label.findall(str(n)) for n in notes[i + 1 : end]):
                return  # wfdb raises on an unterminated or malformed definition
            i = end + 1
        else:
            raise BadRecordError(
                path,
                f"note {note[:40]!r} at sample 0: expected '## time resolution: <Hz>' or '## annotation type "
                "definitions' (a note starting with '## ' is a definition in WFDB annotation files)",
            )


def read_beat_folder(
    root: str | Path,
    *,
    lead: str = "MLII",
    before_s: float = 0.25,
    after_s: float = 0.45,
    extension: str = "atr",
    expected_rate_hz: float | None = None,
    exclude_records: Sequence[str] = (),
    on_error: str = "raise",
    progress: bool = False,
    allow_outside: bool = False,
) -> BeatSet:
    """The beats of every WFDB record under ``root`` (recursively), read from its ``.{extension}`` beat annotations.

    A bad record — one of `read_annotated_beats`' problems, a header without its ``.{extension}`` file, or a record
    none of whose beats can be cut (all at its edges) — is raised or, with ``on_error="skip"``, warned about and
    listed in ``skipped`` (whose ``seen`` counts every record looked at); it never disappears without a word.

    Args:
        root: the folder.
        lead: the signal to cut beats from (its name in the headers, case-insensitive).
        before_s, after_s: the window around each R peak [s].
        extension: the annotation files' extension (MIT-BIH's reference annotations: ``atr``).
        expected_rate_hz: the rate every record must have (None: the first record's; records at another rate are
            bad records — nothing is resampled).
        exclude_records: record names left out (counted under "record left out").
        on_error: ``"raise"`` (default) or ``"skip"`` a bad record (warned about and reported in ``skipped``).
        progress: a progress bar over the records.
        allow_outside: read data files that headers name outside ``root`` (``--allow-paths-outside``); by default
            such a header stops the read (`workbench.core.paths.PathOutsideData`, never a skipped record).

    Raises:
        UserError: no annotated record under ``root``, a bad option, no beat at all; with ``on_error="raise"`` the
            first bad record (`read_annotated_beats`).
    """
    from tqdm.auto import tqdm

    if on_error not in ("raise", "skip"):
        raise UserError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if not (before_s > 0 and after_s > 0):
        raise UserError(f"the beat window needs before_s > 0 and after_s > 0, got {before_s:g}, {after_s:g}")
    root = Path(root)
    headers, annotated = _annotated_headers(root, extension)
    skipped, excluded = SkipReport(), Counter()
    parts, rate = [], expected_rate_hz
    for header in tqdm(headers, desc="annotated records", unit="record", disable=not progress):
        record = header.stem
        if record in exclude_records:
            excluded["record left out"] += 1
            continue
        skipped.seen += 1
        try:
            one = _beats_of(header, header in annotated, lead, before_s, after_s, extension, rate, root, allow_outside)
        except BadRecordError as error:
            if on_error == "raise":
                raise
            log.warning("skipping %s", error)
            skipped.add(error.record, error.problem)
            continue
        rate = one.fs_hz
        excluded.update(one.excluded)
        parts.append((record, one.beats_mv, one.labels, one.r_peaks))
    if not parts or not sum(len(p[2]) for p in parts):
        raise UserError(f"{root}: no beat could be read ({skipped.summary()})")
    records = np.concatenate([np.full(len(labels), record) for record, _, labels, _ in parts])
    return BeatSet(
        beats_mv=np.concatenate([beats for _, beats, _, _ in parts]),
        labels=np.concatenate([labels for _, _, labels, _ in parts]),
        records=records,
        subjects=records.copy(),
        r_peaks=np.concatenate([peaks for _, _, _, peaks in parts]),
        fs_hz=float(rate),
        lead=lead,
        before_s=before_s,
        excluded=dict(excluded),
        skipped=skipped,
        source=str(root),
    )


def _annotated_headers(root: Path, extension: str) -> tuple[list[Path], list[Path]]:
    """``(every header under root, those with a .{extension} file)``, sorted; a UserError when none has one."""
    headers = sorted(root.rglob("*.hea")) if root.is_dir() else []
    annotated = [h for h in headers if h.with_suffix(f".{extension}").is_file()]
    if not annotated:
        raise UserError(f"{root}: no WFDB record with .{extension} beat annotations (x.hea + x.dat + x.{extension})")
    return headers, annotated


def _beats_of(
    header: Path,
    has_annotations: bool,
    lead: str,
    before_s: float,
    after_s: float,
    extension: str,
    rate: float | None,
    root: Path,
    allow_outside: bool,
) -> RecordBeats:
    """One record's beats (`read_annotated_beats`); a `BadRecordError` when it has no annotation file or no beat."""
    if not has_annotations:
        raise BadRecordError(
            header.with_suffix(f".{extension}"),
            f"annotation file missing (the header {header.name} is here; its beats would be in the .{extension})",
        )
    one = read_annotated_beats(
        header, lead=lead, before_s=before_s, after_s=after_s, extension=extension, expected_rate_hz=rate,
        root=root, allow_outside=allow_outside,
    )  # fmt: skip
    if not len(one.labels):
        raise BadRecordError(
            header.with_suffix(f".{extension}"),
            f"no beat could be cut from the record ({_counts(one.excluded)})",
        )
    return one


def _counts(counter: Mapping[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in sorted(counter.items())) or "nothing annotated"


def read_mitbih(root: str | Path, *, lead: str = "MLII", include_paced: bool = False, **options) -> BeatSet:
    """MIT-BIH Arrhythmia as PhysioNet publishes it (``100.hea``, ``100.dat``, ``100.atr``, ...; 360 Hz), the paced
    records left out unless ``include_paced``; ``options`` are `read_beat_folder`'s (window, on_error, progress).

    Lead MLII is the first signal of every record but 102 and 104 (paced, and without MLII)."""
    exclude = () if include_paced else PACED_RECORDS
    return read_beat_folder(root, lead=lead, expected_rate_hz=MITBIH_RATE_HZ, exclude_records=exclude, **options)


def has_mitbih_names(root: str | Path, extension: str = "atr") -> bool:
    """Whether ``root`` holds beat-annotated records and every one has a MIT-BIH record name (100–234)."""
    names = {path.stem for path in Path(root).rglob(f"*.{extension}")}
    return bool(names) and all(_MITBIH_NAME.match(name) for name in names)


def inter_patient_split(beats: BeatSet) -> dict[str, BeatSet] | None:
    """de Chazal's DS1 / DS2 when every record has a standard MIT-BIH name (``100``–``234``), else None."""
    names = set(beats.records.tolist())
    if not all(_MITBIH_NAME.match(name) for name in names):
        return None
    known = set(DE_CHAZAL_SPLIT["DS1"]) | set(DE_CHAZAL_SPLIT["DS2"])
    stray = sorted(names - known)
    if stray:
        log.info("records %s are in neither DS1 nor DS2 (paced or not in the split); left out of it", stray)
    present = {name: tuple(r for r in records if r in names) for name, records in DE_CHAZAL_SPLIT.items()}
    if not all(present.values()):
        return None
    return beats.split(present)

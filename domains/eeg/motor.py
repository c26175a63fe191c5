"""Readers of motor-imagery EEG: BCI Competition IV 2a (GDF and BNCI ``.mat``) and PhysioNet EEGMMIDB.

* BCI Competition IV 2a (Brunner et al. 2008; bbci.de/competition/iv, data set 2a): 9 subjects, two sessions
  each, ``A0sT.gdf`` (training) and ``A0sE.gdf`` (evaluation), 22 EEG + 3 EOG channels at 250 Hz. Events
  (GDF event codes, MNE annotations with the code as description): 768 trial start, 769 / 770 / 771 / 772
  cue left hand / right hand / feet / tongue, 783 cue of unknown class (E files; the classes are
  ``classlabel`` 1–4 of ``A0sE.mat`` beside the GDF, in cue order), 1023 rejected trial. The cue comes 2 s
  after the trial start; the window is cue + 0.5 s to cue + 2.5 s by default. Channels ``EEG-Fz``,
  ``EEG-0`` ... ``EEG-16``, ``EEG-C3`` ... are mapped to the 10-20 montage (`BCI2A_RENAME`); the EOG channels
  are never read.
* The same data as published by BNCI Horizon 2020 (``001-2014``, read by MOABB's ``BNCI2014_001``):
  ``A01T.mat`` / ``A01E.mat`` with a cell array ``data`` of runs, each a struct with ``X`` (samples × 25:
  the 22 EEG channels in montage order, then 3 EOG) [µV], ``trial`` (1-based sample of each trial start),
  ``y`` (1–4), ``fs``, ``classes``, ``artifacts`` (1: rejected trial). MOABB adds a stim channel holding
  ``y``; this reader never builds one: labels stay apart from the signals.
* PhysioNet EEG Motor Movement/Imagery (Schalk et al. 2004; physionet.org/content/eegmmidb): 109 subjects,
  ``S001/S001R01.edf`` ... ``S001R14.edf``, 64 channels at 160 Hz with dotted names (``Fc5.``, ``C3..``),
  annotations T0 (rest), T1, T2. Runs 3, 7, 11 (execution) and 4, 8, 12 (imagery): T1 left fist, T2 right
  fist; runs 5, 9, 13 (execution) and 6, 10, 14 (imagery): T1 both fists, T2 both feet. Runs 1 and 2 are
  baselines and never read.

Shapes:
    every reader -> `EegWindows.signals_uv` (n_trials, n_chans, window x sfreq) float32 [µV].
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from workbench.domains.eeg.channels import select_channels
from workbench.domains.eeg.readers import (
    BadRecordError,
    EegWindows,
    WindowCollector,
    allowed_sfreqs_from_card,
    event_windows,
    on_error_from_card,
    read_annotated_recording,
)

from workbench.core.errors import UserError, field_error

# ------------------------------------------------------------------------------- BCI Competition IV 2a
#: The 22 EEG channels of BCI IV 2a, in the order of the files (the 10-20 names of Brunner et al. 2008, Fig. 3).
BCI2A_CHANNELS: tuple[str, ...] = (
    "Fz", "FC3", "FC1", "FCz", "FC2", "FC4", "C5", "C3", "C1", "Cz", "C2",
    "C4", "C6", "CP3", "CP1", "CPz", "CP2", "CP4", "P1", "Pz", "P2", "POz",
)  # fmt: skip
_NAMED_IN_GDF = ("Fz", "C3", "Cz", "C4", "Pz")
#: GDF channel name -> 10-20 name (``EEG-Fz``, ``EEG-C3``, ``EEG-Cz``, ``EEG-C4``, ``EEG-Pz`` standardise alone).
BCI2A_RENAME: dict[str, str] = {
    f"EEG-{number}": name for number, name in enumerate(name for name in BCI2A_CHANNELS if name not in _NAMED_IN_GDF)
}
#: The three EOG channels (GDF names; the last 3 columns of the BNCI ``X``).
BCI2A_EOG: tuple[str, ...] = ("EOG-left", "EOG-central", "EOG-right")
BCI2A_CLASSES: tuple[str, ...] = ("left_hand", "right_hand", "feet", "tongue")
#: GDF event code -> class index; 783 is a cue of unknown class, 768 a trial start, 1023 a rejected trial.
BCI2A_CUES: dict[str, int] = {"769": 0, "770": 1, "771": 2, "772": 3}
BCI2A_UNKNOWN_CUE = "783"
BCI2A_TRIAL_START = "768"
BCI2A_REJECTED = "1023"
#: Seconds from trial start to cue (Brunner et al. 2008, Fig. 2).
BCI2A_CUE_AFTER_START_S = 2.0
REJECTED = "rejected trial"

_GDF = re.compile(r"^A(\d\d)([TE])\.gdf$", re.IGNORECASE)
_BNCI = re.compile(r"^A(\d\d)([TE])\.mat$", re.IGNORECASE)


def _window(tmin_s: float, tmax_s: float, channels: Sequence[str]) -> float:
    """The window length [s]; a `UserError` for an empty window or an EOG channel among ``channels``."""
    if not tmax_s > tmin_s:
        raise UserError(f"tmax_s ({tmax_s!r}) must be after tmin_s ({tmin_s!r})")
    eog = [
        name for name in channels if name.lower() in {e.lower() for e in BCI2A_EOG} or name.lower().startswith("eog")
    ]
    if eog:
        raise UserError(f"channels {', '.join(eog)}: BCI IV 2a's EOG channels are excluded from the model's input")
    return tmax_s - tmin_s


def _session_files(root: Path, pattern: re.Pattern, sessions: Sequence[str]) -> list[Path]:
    """Files under ``root`` (recursively) named by ``pattern`` (groups: subject, session) of the given sessions."""
    wanted = {session.upper() for session in sessions}
    matches = ((path, pattern.match(path.name)) for path in sorted(root.rglob("*")))
    return [path for path, match in matches if match and match.group(2).upper() in wanted]


def read_bci_iv_2a(
    root: str | Path,
    *,
    channels: Sequence[str] = BCI2A_CHANNELS,
    tmin_s: float = 0.5,
    tmax_s: float = 2.5,
    sessions: Sequence[str] = ("T", "E"),
    allowed_sfreqs: Sequence[float] | None = None,
    resample_to: float | None = None,
    allow_interpolation: bool = False,
    on_error: str | None = None,
) -> EegWindows:
    """Motor-imagery trials of BCI Competition IV 2a GDF files (``A0sT.gdf``, ``A0sE.gdf``).

    Args:
        root: the folder (searched recursively) of the GDF files, with ``A0sE.mat`` (``classlabel``) beside E files.
        channels: 10-20 names, in order (default the 22 EEG channels; EOG channels cannot be asked for).
        tmin_s, tmax_s: the window from the cue [s] (default 0.5 to 2.5 s: 500 samples at 250 Hz).
        sessions: ``"T"`` and/or ``"E"``.
        allowed_sfreqs: rates [Hz] accepted (default: the card's, 250 Hz). resample_to: the model's rate [Hz].
        allow_interpolation: see `select_channels`.
        on_error: ``"skip"`` or ``"raise"`` a bad record (default: the card ``bci-iv-2a``'s ``on_bad_record``).

    Returns:
        `EegWindows` [µV], classes left_hand, right_hand, feet, tongue; subjects ``A0s``, records ``A0sT``/``A0sE``;
        trials marked 1023 are left out and counted as "rejected trial".

    Raises:
        UserError: no file, a bad option, or (``on_error="raise"``) a bad record: an E file without its ``.mat``,
        ``classlabel`` not matching the cues, a missing channel, a rate the card does not allow.
    """
    window_s = _window(tmin_s, tmax_s, channels)
    on_error = on_error_from_card(on_error, "bci-iv-2a")
    allowed_sfreqs = allowed_sfreqs_from_card(allowed_sfreqs, "bci-iv-2a")
    root = Path(root)
    files = _session_files(root, _GDF, sessions)
    if not files:
        raise UserError(f"{root}: no BCI IV 2a GDF file (A0sT.gdf / A0sE.gdf, sessions {list(sessions)}) found")
    collector = WindowCollector(on_error, BCI2A_CLASSES)
    for path in files:
        with collector.record(path):
            selection, onsets_s = read_annotated_recording(
                path,
                channels,
                rename=BCI2A_RENAME,
                allow_interpolation=allow_interpolation,
                allowed_sfreqs=allowed_sfreqs,
                resample_to=resample_to,
            )
            annotations = selection.raw.annotations
            onsets, labels, rejected = bci_iv_2a_trials(path, onsets_s, annotations.description)
            collector.exclude(REJECTED, rejected)
            subject = "A" + _GDF.match(path.name).group(1)
            event_windows(
                collector,
                path,
                selection,
                onsets,
                labels,
                tmin_s=tmin_s,
                window_s=window_s,
                subject=subject,
                record=path.stem.upper(),
            )
    return collector.windows(root)


def bci_iv_2a_trials(path: Path, onsets_s, descriptions) -> tuple[np.ndarray, np.ndarray, int]:
    """Cue onsets [s] and class indices of the accepted trials of one BCI IV 2a recording, and the rejected count.

    A cue belongs to the trial whose start (event 768; without 768 events, 2 s before each cue) precedes it;
    a trial holding a 1023 event is rejected. Cues 783 take their class from ``classlabel`` of the ``.mat``
    file beside ``path`` (1-4, one per cue in order; a known cue must agree with it).

    Shapes: onsets_s, descriptions (n_events,) -> onsets (n_trials,), labels (n_trials,) int64.
    """
    onsets_s = np.asarray(onsets_s, float)
    descriptions = np.asarray([str(d) for d in descriptions])
    is_cue = np.isin(descriptions, [*BCI2A_CUES, BCI2A_UNKNOWN_CUE])
    cue_onsets, cue_codes = onsets_s[is_cue], descriptions[is_cue]
    if not len(cue_onsets):
        raise BadRecordError(path, f"no cue event ({', '.join([*BCI2A_CUES, BCI2A_UNKNOWN_CUE])}) in the file")
    labels = np.array([BCI2A_CUES.get(code, -1) for code in cue_codes], np.int64)
    if (labels < 0).any():
        labels = _labels_from_mat(path.with_suffix(".mat"), labels)
    starts = np.sort(onsets_s[descriptions == BCI2A_TRIAL_START])
    if not len(starts):
        starts = np.sort(cue_onsets - BCI2A_CUE_AFTER_START_S)
    rejected_trials = np.unique(np.searchsorted(starts, onsets_s[descriptions == BCI2A_REJECTED], side="right") - 1)
    cue_trials = np.searchsorted(starts, cue_onsets, side="right") - 1
    keep = ~np.isin(cue_trials, rejected_trials)
    return cue_onsets[keep], labels[keep], int((~keep).sum())


def _labels_from_mat(path: Path, labels: np.ndarray) -> np.ndarray:
    """Class indices of every cue: ``classlabel`` (1-4) of the competition's ``.mat``; -1 entries are 783 cues."""
    import scipy.io

    if not path.is_file():
        raise BadRecordError(
            path, "file missing: the GDF has cues of unknown class (783), whose classes are 'classlabel' of this file"
        )
    try:
        content = scipy.io.loadmat(path, squeeze_me=True)
    except Exception as error:  # scipy raises many kinds for a malformed file
        raise BadRecordError(path, f"not a MATLAB file scipy can read ({type(error).__name__}: {error})") from None
    if "classlabel" not in content:
        raise field_error(path, "classlabel", "the class (1-4) of each trial", f"only {sorted(content)}")
    classlabel = np.atleast_1d(np.asarray(content["classlabel"])).astype(np.int64).ravel()
    if classlabel.shape != labels.shape:
        raise field_error(path, "classlabel", f"{len(labels)} classes (one per cue of the GDF)", f"{len(classlabel)}")
    if not np.isin(classlabel, [1, 2, 3, 4]).all():
        raise field_error(path, "classlabel", "values 1-4", f"{sorted(set(classlabel.tolist()))}")
    known = labels >= 0
    if (labels[known] != classlabel[known] - 1).any():
        first = int(np.flatnonzero(known & (labels != classlabel - 1))[0])
        raise field_error(
            path, "classlabel", f"class {labels[first] + 1} of cue {first} (its GDF event)", f"{classlabel[first]}"
        )
    return classlabel - 1


def read_bnci_2a_mat(
    root: str | Path,
    *,
    channels: Sequence[str] = BCI2A_CHANNELS,
    tmin_s: float = 0.5,
    tmax_s: float = 2.5,
    sessions: Sequence[str] = ("T", "E"),
    allowed_sfreqs: Sequence[float] | None = None,
    resample_to: float | None = None,
    allow_interpolation: bool = False,
    on_error: str | None = None,
) -> EegWindows:
    """Motor-imagery trials of BCI IV 2a in the BNCI Horizon 2020 / MOABB layout (``A01T.mat``, ``A01E.mat``).

    Same arguments, classes and windows as `read_bci_iv_2a`; ``X`` is read as µV, the cue is 2 s after each
    ``trial`` sample, trials with ``artifacts == 1`` are left out and counted as "rejected trial". Runs without
    trials (the EOG calibration runs) give no window.

    Raises:
        UserError: no file, or (``on_error="raise"``) a file without ``data`` (for example the competition's
        label file ``A01E.mat``), a run with a wrong field, a missing channel, a rate the card does not allow.
    """
    window_s = _window(tmin_s, tmax_s, channels)
    on_error = on_error_from_card(on_error, "bci-iv-2a")
    allowed_sfreqs = allowed_sfreqs_from_card(allowed_sfreqs, "bci-iv-2a")
    root = Path(root)
    files = _session_files(root, _BNCI, sessions)
    if not files:
        raise UserError(f"{root}: no BNCI 2a file (A01T.mat / A01E.mat, sessions {list(sessions)}) found")
    collector = WindowCollector(on_error, BCI2A_CLASSES)
    for path in files:
        with collector.record(path):
            subject = "A" + _BNCI.match(path.name).group(1)
            for index, run in enumerate(_bnci_runs(path)):
                raw, trials = _bnci_run(path, index, run)
                if trials is None:
                    continue
                starts, y, artifacts = trials
                selection = select_channels(
                    raw,
                    channels,
                    source=f"{path} data{{{index + 1}}}",
                    allow_interpolation=allow_interpolation,
                    allowed_sfreqs=allowed_sfreqs,
                    resample_to=resample_to,
                )
                keep = artifacts == 0
                collector.exclude(REJECTED, int((~keep).sum()))
                event_windows(
                    collector,
                    path,
                    selection,
                    starts[keep] + BCI2A_CUE_AFTER_START_S,
                    y[keep] - 1,
                    tmin_s=tmin_s,
                    window_s=window_s,
                    subject=subject,
                    record=f"{path.stem.upper()}/run{index + 1}",
                )
    return collector.windows(root)


def _bnci_runs(path: Path) -> list:
    import scipy.io

    try:
        content = scipy.io.loadmat(path, squeeze_me=True, struct_as_record=False)
    except Exception as error:  # scipy raises many kinds for a malformed file
        raise BadRecordError(path, f"not a MATLAB file scipy can read ({type(error).__name__}: {error})") from None
    if "data" not in content:
        raise field_error(
            path, "data", "BNCI's cell array of runs (X, trial, y, fs, artifacts)", f"only {sorted(content)}"
        )
    runs = content["data"]
    return list(np.atleast_1d(runs)) if isinstance(runs, np.ndarray) else [runs]


def _bnci_run(path: Path, index: int, run):
    """One run as an `mne.io.RawArray` [V] (22 EEG + 3 EOG) and its trials ``(starts [s], y, artifacts)``, or None."""
    import mne

    where = f"data{{{index + 1}}}"
    for name in ("X", "trial", "y", "fs"):
        if not hasattr(run, name):
            raise field_error(path, f"{where}.{name}", "a field of BNCI's run struct", "none")
    x = _numbers(path, f"{where}.X", run.X)
    n_columns = len(BCI2A_CHANNELS) + len(BCI2A_EOG)
    if x.ndim != 2 or x.shape[1] != n_columns or not x.shape[0]:
        raise field_error(path, f"{where}.X", f"samples x {n_columns} (22 EEG + 3 EOG) [µV]", f"shape {x.shape}")
    if not np.isfinite(x).all():
        raise field_error(path, f"{where}.X", "finite samples [µV]", f"{int((~np.isfinite(x)).sum())} NaN or inf")
    fs = _numbers(path, f"{where}.fs", run.fs)
    if fs.size != 1 or not (np.isfinite(fs).all() and float(fs.ravel()[0]) > 0):
        raise field_error(path, f"{where}.fs", "one positive sampling rate [Hz]", f"{fs.ravel()[:4].tolist()}")
    fs = float(fs.ravel()[0])
    info = mne.create_info([*BCI2A_CHANNELS, *BCI2A_EOG], fs, ch_types=["eeg"] * 22 + ["eog"] * 3)
    raw = mne.io.RawArray(x.T * 1e-6, info, verbose="error")
    trial = _numbers(path, f"{where}.trial", run.trial).ravel()
    if not trial.size:
        return raw, None
    y = _numbers(path, f"{where}.y", run.y).ravel()
    artifacts = _numbers(path, f"{where}.artifacts", getattr(run, "artifacts", np.zeros_like(y))).ravel()
    if y.shape != trial.shape or artifacts.shape != trial.shape:
        found = f"y {y.size}, artifacts {artifacts.size}"
        raise field_error(path, f"{where}.y", f"{trial.size} entries (one per trial), artifacts too", found)
    if not np.isin(y, [1, 2, 3, 4]).all():
        raise field_error(path, f"{where}.y", "classes 1-4", f"{sorted(set(y.tolist()))[:8]}")
    if not np.isin(artifacts, [0, 1]).all():
        raise field_error(path, f"{where}.artifacts", "0 or 1 per trial", f"{sorted(set(artifacts.tolist()))[:8]}")
    if not np.isfinite(trial).all() or (trial < 1).any() or (trial > x.shape[0]).any():
        raise field_error(
            path, f"{where}.trial", f"1-based samples within 1..{x.shape[0]}", f"{trial.min():g}..{trial.max():g}"
        )
    return raw, ((trial - 1) / fs, y.astype(np.int64), artifacts.astype(np.int64))


def _numbers(path: Path, field: str, value) -> np.ndarray:
    """``value`` (a field of a BNCI run) as a float array (at least 1-D), or a `field_error` naming it."""
    try:
        return np.atleast_1d(np.asarray(value, dtype=float))
    except (TypeError, ValueError):
        found = type(value).__name__ if not isinstance(value, np.ndarray) else f"an array of {value.dtype}"
        raise field_error(path, field, "numbers", found) from None


# --------------------------------------------------------------------------------------------- EEGMMIDB
#: The 64 channels of EEGMMIDB, in file order, standardised from the file's dotted names (``Fc5.`` -> ``FC5``).
EEGMMIDB_CHANNELS: tuple[str, ...] = (
    "FC5", "FC3", "FC1", "FCz", "FC2", "FC4", "FC6", "C5", "C3", "C1", "Cz", "C2", "C4", "C6", "CP5", "CP3",
    "CP1", "CPz", "CP2", "CP4", "CP6", "Fp1", "Fpz", "Fp2", "AF7", "AF3", "AFz", "AF4", "AF8", "F7", "F5", "F3",
    "F1", "Fz", "F2", "F4", "F6", "F8", "FT7", "FT8", "T7", "T8", "T9", "T10", "TP7", "TP8", "P7", "P5", "P3",
    "P1", "Pz", "P2", "P4", "P6", "P8", "PO7", "PO3", "POz", "PO4", "PO8", "O1", "Oz", "O2", "Iz",
)  # fmt: skip
EEGMMIDB_CLASSES: tuple[str, ...] = ("left_fist", "right_fist", "both_fists", "both_feet")
#: Run number -> (execution or imagery, meaning of T1, meaning of T2).
EEGMMIDB_RUNS: dict[int, tuple[str, str, str]] = {
    **{run: ("execution", "left_fist", "right_fist") for run in (3, 7, 11)},
    **{run: ("imagery", "left_fist", "right_fist") for run in (4, 8, 12)},
    **{run: ("execution", "both_fists", "both_feet") for run in (5, 9, 13)},
    **{run: ("imagery", "both_fists", "both_feet") for run in (6, 10, 14)},
}
KINDS = ("imagery", "execution", "both")

_EEGMMIDB = re.compile(r"^S(\d{3})R(\d{2})\.edf$", re.IGNORECASE)


def read_eegmmidb(
    root: str | Path,
    *,
    kind: str = "imagery",
    rest: bool = False,
    channels: Sequence[str] = EEGMMIDB_CHANNELS,
    tmin_s: float = 0.0,
    tmax_s: float = 4.0,
    allowed_sfreqs: Sequence[float] | None = None,
    resample_to: float | None = None,
    allow_interpolation: bool = False,
    on_error: str | None = None,
) -> EegWindows:
    """Trials of PhysioNet EEG Motor Movement/Imagery (``S001/S001R04.edf``), labelled by run and T1/T2.

    Args:
        root: the folder (searched recursively) of ``SsssRrr.edf`` files.
        kind: ``"imagery"`` (runs 4, 6, 8, 10, 12, 14; default), ``"execution"`` (3, 5, 7, 9, 11, 13) or ``"both"``.
        rest: keep T0 windows as a class ``rest`` (default False: they are left out and counted).
        channels: 10-20 names, in order (default all 64, standardised from the dotted names).
        tmin_s, tmax_s: the window from the annotation onset [s] (default 0 to 4 s: 640 samples at 160 Hz).
        allowed_sfreqs: rates [Hz] accepted (default: the card's, 160 Hz; a few subjects were recorded at 128 Hz:
            allow 128 and set resample_to=160 to use them). resample_to: the model's rate [Hz].
        allow_interpolation: see `select_channels`.
        on_error: ``"skip"`` or ``"raise"`` a bad record (default: the card ``eegmmidb``'s ``on_bad_record``).

    Returns:
        `EegWindows` [µV], classes left_fist, right_fist, both_fists, both_feet (+ rest); subjects ``S001``,
        records ``S001R04``. Baseline runs 1, 2 and runs of the other kind are not read.

    Raises:
        UserError: no file, a bad option, or (``on_error="raise"``) an annotation other than T0/T1/T2, a missing
        channel, a rate the card does not allow.
    """
    if kind not in KINDS:
        raise UserError(f"kind must be one of {KINDS}, got {kind!r}")
    window_s = _window(tmin_s, tmax_s, ())
    on_error = on_error_from_card(on_error, "eegmmidb")
    allowed_sfreqs = allowed_sfreqs_from_card(allowed_sfreqs, "eegmmidb")
    root = Path(root)
    files = _eegmmidb_runs(root, kind)
    classes = EEGMMIDB_CLASSES + (("rest",) if rest else ())
    collector = WindowCollector(on_error, classes)
    for path, run in files:
        with collector.record(path):
            selection, onsets_s = read_annotated_recording(
                path,
                channels,
                allow_interpolation=allow_interpolation,
                allowed_sfreqs=allowed_sfreqs,
                resample_to=resample_to,
            )
            annotations = selection.raw.annotations
            _, meaning_t1, meaning_t2 = EEGMMIDB_RUNS[run]
            label_of = {"T1": classes.index(meaning_t1), "T2": classes.index(meaning_t2)}
            if rest:
                label_of["T0"] = classes.index("rest")
            descriptions = [str(d) for d in annotations.description]
            unknown = sorted(set(descriptions) - {"T0", "T1", "T2"})
            if unknown:
                raise BadRecordError(path, f"annotation(s) {', '.join(map(repr, unknown))}; expected T0, T1, T2")
            if not rest:
                collector.exclude("T0 rest (rest=False)", descriptions.count("T0"))
            keep = [i for i, d in enumerate(descriptions) if d in label_of]
            event_windows(
                collector,
                path,
                selection,
                onsets_s[keep],
                np.array([label_of[descriptions[i]] for i in keep], np.int64),
                tmin_s=tmin_s,
                window_s=window_s,
                subject="S" + _EEGMMIDB.match(path.name).group(1),
                record=path.stem.upper(),
            )
    return collector.windows(root)


def _eegmmidb_runs(root: Path, kind: str) -> list[tuple[Path, int]]:
    """``(file, run number)`` of each ``SsssRrr.edf`` below ``root`` whose run is of ``kind``, in sorted path order;
    a UserError when there is none."""
    files = []
    for path in sorted(root.rglob("*")):
        match = _EEGMMIDB.match(path.name)
        run = int(match.group(2)) if match else None
        if run in EEGMMIDB_RUNS and kind in (EEGMMIDB_RUNS[run][0], "both"):
            files.append((path, run))
    if not files:
        raise UserError(f"{root}: no EEGMMIDB {kind} run (S001/S001R04.edf, ...) found")
    return files

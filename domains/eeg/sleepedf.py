"""Reader of Sleep-EDF Expanded, sleep-cassette layout (Kemp et al. 2000; physionet.org/content/sleep-edfx).

Layout: a folder (searched recursively, e.g. ``sleep-cassette/``) of whole-night polysomnograms
``SC4ssNE0-PSG.edf`` and their hypnograms ``SC4ssNx-Hypnogram.edf`` (ss the subject 00–82, N the night 1 or 2,
x the scorer's letter), paired by their first 6 characters (``SC4001E0-PSG.edf`` ↔ ``SC4001EC-Hypnogram.edf``).
The PSG holds ``EEG Fpz-Cz``, ``EEG Pz-Oz``, ``EOG horizontal`` (100 Hz) and ``Resp oro-nasal``,
``EMG submental``, ``Temp rectal``, ``Event marker`` (1 Hz); the hypnogram is an annotation-only EDF+ file of
R&K stages ``Sleep stage W/1/2/3/4/R/?`` and ``Movement time``, read with `mne.read_annotations`.

Labels: AASM classes W, N1, N2, N3 (= R&K 3 + 4), REM on 30 s epochs; ``Sleep stage ?`` and ``Movement time``
are left out and counted. Wake is cropped to ``wake_margin_min`` minutes before the first and after the last
sleep epoch (30 min by default, as in Supratak et al. 2017 and MNE's sleep tutorial). Only the requested
channels are read (``include=``), so the 1 Hz channels are never upsampled into the input; asking for one is
refused.

A scored stage (W, 1, 2, 3, 4, R) that starts outside the recording is an error naming the hypnogram. The
published hypnograms end with a ``Sleep stage ?`` (unscored) annotation that may run past the end of the PSG
(MNE's sleep tutorial silences that warning): unscored and movement annotations are counted wherever they lie,
and scored epochs that do not lie wholly inside the recording are left out and counted.

Integrity (read from the EDF headers directly, `check_edf_size`, `check_same_night`): a PSG or hypnogram whose size
is not header + n_records x record size (a truncated download) is a bad record, and so is a hypnogram whose start
date and time (header bytes 168-183) differ from its PSG's: a hypnogram of another night.

Shapes:
    `read_sleep_edf` -> `EegWindows.signals_uv` (n_epochs, n_chans, 30 s x sfreq) float32 [µV].
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from workbench.domains.eeg.readers import (
    EegWindows,
    WindowCollector,
    allowed_sfreqs_from_card,
    check_annotations_in_recording,
    check_edf_size,
    cut_windows,
    on_error_from_card,
    read_edf_header,
    read_recording,
)

from workbench.core.errors import UserError
from workbench.core.records import BadRecordError

#: AASM classes, in label order.
SLEEP_CLASSES: tuple[str, ...] = ("W", "N1", "N2", "N3", "REM")
#: Hypnogram annotation -> class (R&K stages 3 and 4 are both N3).
SLEEP_STAGES: dict[str, str] = {
    "Sleep stage W": "W",
    "Sleep stage 1": "N1",
    "Sleep stage 2": "N2",
    "Sleep stage 3": "N3",
    "Sleep stage 4": "N3",
    "Sleep stage R": "REM",
}
#: Hypnogram annotations left out on purpose (counted in `EegWindows.excluded`).
SLEEP_EXCLUDED: tuple[str, ...] = ("Sleep stage ?", "Movement time")
#: The EEG derivations used for staging.
SLEEP_EDF_CHANNELS: tuple[str, ...] = ("EEG Fpz-Cz", "EEG Pz-Oz")
EPOCH_S = 30.0

_PSG = re.compile(r"^(SC4(\d\d)(\d))E0-PSG\.edf$", re.IGNORECASE)
_HYPNOGRAM = re.compile(r"^(SC4(\d\d)(\d))E[A-Z]-Hypnogram\.edf$", re.IGNORECASE)


def pair_sleep_edf(root: str | Path) -> tuple[list[tuple[Path, Path]], list[tuple[Path, str]]]:
    """PSG/hypnogram pairs under ``root`` (recursively), matched by the first 6 characters of the name.

    Returns:
        ``(pairs, problems)``: the (PSG, hypnogram) pairs sorted by name, and (file, problem) for every PSG
        without its hypnogram, hypnogram without its PSG, or key with several files.
    """
    root = Path(root)
    psgs: dict[str, list[Path]] = {}
    hypnograms: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*.edf"), key=lambda p: p.name):
        for pattern, found in ((_PSG, psgs), (_HYPNOGRAM, hypnograms)):
            match = pattern.match(path.name)
            if match:
                found.setdefault(match.group(1).upper(), []).append(path)
    pairs, problems = [], []
    for key in sorted(set(psgs) | set(hypnograms)):
        psg, hypnogram = psgs.get(key, []), hypnograms.get(key, [])
        if len(psg) > 1 or len(hypnogram) > 1:
            files = ", ".join(str(p) for p in psg + hypnogram)
            problems.append(((psg + hypnogram)[0], f"several files for recording {key} ({files}); keep one pair"))
        elif not hypnogram:
            problems.append(
                (psg[0], f"no hypnogram {key}E?-Hypnogram.edf beside this PSG (e.g. {key}EC-Hypnogram.edf)")
            )
        elif not psg:
            problems.append((hypnogram[0], f"no PSG {key}E0-PSG.edf for this hypnogram"))
        else:
            pairs.append((psg[0], hypnogram[0]))
    return pairs, problems


def read_sleep_edf(
    root: str | Path,
    *,
    channels: Sequence[str] = SLEEP_EDF_CHANNELS,
    wake_margin_min: float | None = 30.0,
    allowed_sfreqs: Sequence[float] | None = None,
    resample_to: float | None = None,
    allow_interpolation: bool = False,
    on_error: str | None = None,
) -> EegWindows:
    """30 s epochs of Sleep-EDF sleep-cassette recordings with their AASM stage (W, N1, N2, N3, REM).

    Args:
        root: the folder of ``SC4ssNE0-PSG.edf`` / ``SC4ssNx-Hypnogram.edf`` pairs (or any folder above it).
        channels: the PSG channels to read, in order (default ``EEG Fpz-Cz``, ``EEG Pz-Oz``; 100 Hz).
        wake_margin_min: keep wake epochs only within this many minutes [min] before the first and after the
            last sleep epoch; None keeps every wake epoch.
        allowed_sfreqs: rates [Hz] accepted (default: the card's, 100 Hz). resample_to: the model's rate [Hz].
        allow_interpolation: see `select_channels` (the bipolar derivations cannot be interpolated).
        on_error: ``"skip"`` or ``"raise"`` a bad record (default: the card ``sleep-edf``'s ``on_bad_record``).

    Returns:
        `EegWindows` [µV]; subjects the 2 digits ``ss``, records ``SC4ssN``; ``excluded`` counts epochs of
        ``Sleep stage ?``, ``Movement time``, wake outside the margin and epochs past the end of the PSG.

    Raises:
        UserError: no pair found, a bad option, or (``on_error="raise"``) a PSG without hypnogram (or the
        reverse), a file whose size is not what its EDF header says, a hypnogram that does not start when its PSG
        does, a missing channel, a slow (1 Hz) channel asked for, an annotation outside the recording or not a
        sleep stage.
    """
    if wake_margin_min is not None and wake_margin_min < 0:
        raise UserError(f"wake_margin_min must be >= 0 minutes or None, got {wake_margin_min!r}")
    on_error = on_error_from_card(on_error, "sleep-edf")
    allowed_sfreqs = allowed_sfreqs_from_card(allowed_sfreqs, "sleep-edf")
    root = Path(root)
    pairs, problems = pair_sleep_edf(root)
    if not pairs and not problems:
        raise UserError(f"{root}: no Sleep-EDF files (SC4ssNE0-PSG.edf + SC4ssNx-Hypnogram.edf) found, recursively")
    collector = WindowCollector(on_error, SLEEP_CLASSES)
    for path, problem in problems:
        with collector.record(path):
            raise BadRecordError(path, problem)
    for psg, hypnogram in pairs:
        with collector.record(psg):
            _read_pair(
                collector, psg, hypnogram, channels, wake_margin_min, allowed_sfreqs, resample_to, allow_interpolation
            )
    return collector.windows(root)


def _read_pair(collector, psg, hypnogram, channels, wake_margin_min, allowed_sfreqs, resample_to, interpolate):
    import mne

    selection = read_recording(
        psg, channels, allow_interpolation=interpolate, allowed_sfreqs=allowed_sfreqs, resample_to=resample_to
    )
    raw, sfreq = selection.raw, selection.sfreq
    check_same_night(psg, hypnogram)
    try:
        annotations = mne.read_annotations(hypnogram)
    except Exception as error:  # MNE raises many kinds for a malformed file
        raise BadRecordError(
            hypnogram, f"not an EDF+ hypnogram MNE can read ({type(error).__name__}: {error})"
        ) from None
    onsets = np.asarray(annotations.onset, float)  # from the hypnogram's start, which is the PSG's
    durations = np.asarray(annotations.duration, float)
    descriptions = [str(d) for d in annotations.description]
    duration_s = raw.n_times / sfreq
    scored = np.array([d not in SLEEP_EXCLUDED for d in descriptions], bool)
    check_annotations_in_recording(hypnogram, onsets[scored], np.asarray(descriptions)[scored], duration_s)
    unknown = sorted(set(descriptions) - set(SLEEP_STAGES) - set(SLEEP_EXCLUDED))
    if unknown:
        raise BadRecordError(
            hypnogram,
            f"annotation(s) {', '.join(map(repr, unknown))} are not sleep stages; expected "
            f"{', '.join(map(repr, list(SLEEP_STAGES) + list(SLEEP_EXCLUDED)))}",
        )
    epoch_onsets, epoch_labels = [], []
    for onset, duration, description in zip(onsets, durations, descriptions):
        n_epochs = int(round(duration / EPOCH_S))
        if description in SLEEP_EXCLUDED:
            collector.exclude(description, max(n_epochs, 1))
            continue
        if not np.isclose(n_epochs * EPOCH_S, duration, atol=1e-3) or n_epochs == 0:
            raise BadRecordError(
                hypnogram,
                f"annotation {description!r} at {onset:g} s lasts {duration:g} s, expected a multiple of {EPOCH_S:g} s",
            )
        epoch_onsets.extend(onset + EPOCH_S * np.arange(n_epochs))
        epoch_labels.extend([SLEEP_CLASSES.index(SLEEP_STAGES[description])] * n_epochs)
    epoch_onsets = np.array(epoch_onsets, float)
    epoch_labels = np.array(epoch_labels, np.int64)
    inside = epoch_onsets + EPOCH_S <= duration_s + 0.5 / sfreq
    collector.exclude("epoch past the end of the recording", int((~inside).sum()))
    epoch_onsets, epoch_labels = epoch_onsets[inside], epoch_labels[inside]
    if wake_margin_min is not None:
        keep = _wake_kept(epoch_onsets, epoch_labels, wake_margin_min * 60.0)
        collector.exclude(f"wake more than {wake_margin_min:g} min from sleep", int((~keep).sum()))
        epoch_onsets, epoch_labels = epoch_onsets[keep], epoch_labels[keep]
    n_times = int(round(EPOCH_S * sfreq))
    windows = cut_windows(raw.get_data(), np.round(epoch_onsets * sfreq).astype(np.int64), n_times)
    match = re.match(r"SC4(\d\d)(\d)", psg.name, re.IGNORECASE)
    collector.add(psg, selection, windows, epoch_labels, epoch_onsets, match.group(1), match.group(0).upper())


def check_same_night(psg: Path, hypnogram: Path) -> None:
    """A `BadRecordError` unless the hypnogram starts when its PSG does (both EDF headers' bytes 168-183,
    ``dd.mm.yyhh.mm.ss``, read directly: MNE gives an EDF+ hypnogram's annotations no ``orig_time``, so a
    hypnogram of another night would otherwise pair silently). The hypnogram's size is checked against its
    header (`check_edf_size`); the PSG's was checked when it was read."""
    psg_start = read_edf_header(psg).start
    hypnogram_start = check_edf_size(hypnogram).start
    for path, start in ((psg, psg_start), (hypnogram, hypnogram_start)):
        if start is None:
            raise BadRecordError(
                path, "no start date and time in the EDF header (bytes 168-183, expected 'dd.mm.yyhh.mm.ss'); "
                "a PSG and its hypnogram are paired by it"
            )
    if psg_start != hypnogram_start:
        raise BadRecordError(
            hypnogram,
            f"hypnogram {hypnogram.name} starts {hypnogram_start:%Y-%m-%d %H:%M:%S} but PSG {psg.name} starts "
            f"{psg_start:%Y-%m-%d %H:%M:%S} (EDF headers, bytes 168-183): they are not the same night",
        )


def _wake_kept(onsets_s: np.ndarray, labels: np.ndarray, margin_s: float) -> np.ndarray:
    """Mask of epochs kept: every sleep epoch, and wake epochs within ``margin_s`` [s] of the sleep period.

    Shapes: onsets_s, labels (n_epochs,) -> (n_epochs,) bool. Without any sleep epoch no wake epoch is kept.
    """
    wake = labels == SLEEP_CLASSES.index("W")
    if wake.all():
        return np.zeros_like(wake)
    first = onsets_s[~wake].min()
    last_end = onsets_s[~wake].max() + EPOCH_S
    return ~wake | ((onsets_s >= first - margin_s) & (onsets_s + EPOCH_S <= last_end + margin_s))

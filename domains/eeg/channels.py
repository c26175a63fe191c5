"""The channel contract: which of a file's channels reach a model, under which names, at which rate.

A model is built for a list of channels (its ``chs_info`` / ``ch_names``) and a sampling rate. Practitioners
lose accuracy silently when a loader zero-pads a missing channel, feeds a stim/label channel to the model
(label leakage), or lets MNE upsample a 1 Hz temperature channel to the EEG rate. `select_channels` is the
one place where a recording meets the model's channels, and it does none of that behind the user's back:

1. names are standardised (`standardize_channel_name`: PhysioNet's dotted ``C3..``/``Fc5.`` and prefixes such
   as ``EEG-Fz`` become the 10-20 spelling ``C3``, ``FC5``, ``Fz``; dataset-specific maps go in ``rename``);
2. a wanted channel that is a stim channel, or whose name says it holds events or labels (``STI 014``,
   ``Status``, ``Event marker``, ...), is refused: it never reaches the signals;
3. a wanted channel the file lacks is an error naming it and the file — interpolated from the standard 10-20
   montage (spherical splines, `mne.io.Raw.interpolate_bads`) only with ``allow_interpolation=True``, and
   then logged; never zero-filled;
4. a channel sampled below the others (``native_sfreqs``, given by the readers of EDF/BDF/GDF, whose
   channels may have their own rates) is refused: MNE would have upsampled it;
5. a rate outside ``allowed_sfreqs`` (the data card's) is an error naming the file and the rate; resampling
   happens only to ``resample_to`` and is logged.

Shapes:
    `select_channels` on a Raw: the returned ``raw`` holds ``(len(wanted), n_times)`` samples [V] at
    ``sfreq`` [Hz], channels in the order of ``wanted``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from workbench.core.errors import UserError

log = logging.getLogger(__name__)

#: Lower-case names of channels that carry events or labels rather than brain signals.
LABEL_CHANNEL_NAMES = frozenset(
    {"sti 014", "sti014", "stim", "status", "trigger", "triggers", "event marker", "events", "marker", "label"}
    | {"labels", "class", "classlabel", "annotations", "edf annotations", "bdf annotations"}
)
#: MNE channel types that carry events or labels.
LABEL_CHANNEL_TYPES = frozenset({"stim", "syst"})
#: The fewest present channels with known positions that interpolation needs.
MIN_CHANNELS_FOR_INTERPOLATION = 4


@lru_cache(maxsize=1)
def montage_name() -> str:
    """The standard 10-20 montage of the installed MNE (``colin27_1020`` from MNE 1.13, else ``standard_1020``)."""
    import mne

    builtin = {entry if isinstance(entry, str) else entry.name for entry in mne.channels.get_builtin_montages()}
    return "colin27_1020" if "colin27_1020" in builtin else "standard_1020"


@lru_cache(maxsize=1)
def _standard_names() -> dict[str, str]:
    """Lower-case name -> spelling of every electrode of the standard 10-20 montage (94 names)."""
    import mne

    return {name.lower(): name for name in mne.channels.make_standard_montage(montage_name()).ch_names}


def standardize_channel_name(name: str) -> str:
    """The 10-20 spelling of a channel name, or the name stripped of padding when it is not a 10-20 electrode.

    ``"C3.."`` -> ``"C3"``, ``"Fc5."`` -> ``"FC5"``, ``"EEG-Fz"`` / ``"EEG Fz"`` -> ``"Fz"``, ``"FP1"`` -> ``"Fp1"``;
    ``"EEG Fpz-Cz"`` (a bipolar derivation) stays ``"EEG Fpz-Cz"``.
    """
    stripped = name.strip().rstrip(".").strip()
    standard = _standard_names()
    if stripped.lower() in standard:
        return standard[stripped.lower()]
    for prefix in ("eeg-", "eeg ", "eeg_"):
        if stripped.lower().startswith(prefix) and stripped[len(prefix) :].lower() in standard:
            return standard[stripped[len(prefix) :].lower()]
    return stripped


def is_label_channel(name: str, kind: str | None = None) -> bool:
    """True for a channel holding events or labels: MNE type ``stim``/``syst``, or a name such as ``STI 014``."""
    return (kind is not None and kind in LABEL_CHANNEL_TYPES) or name.strip().lower() in LABEL_CHANNEL_NAMES


@dataclass(frozen=True)
class ChannelSelection:
    """What `select_channels` did: the channels kept, where each came from, what was interpolated or resampled.

    ``file_names[i]`` is the file's own name of ``ch_names[i]`` (None when interpolated); ``raw`` is the picked
    recording (None when `select_channels` was given names only); ``notes`` are the logged changes, in words.
    """

    ch_names: tuple[str, ...]
    file_names: tuple[str | None, ...]
    interpolated: tuple[str, ...] = ()
    sfreq: float | None = None
    resampled_from: float | None = None
    raw: object | None = None
    notes: tuple[str, ...] = ()


def match_channels(
    file_names: Sequence[str],
    wanted: Sequence[str],
    *,
    source: str,
    kinds: Sequence[str] | None = None,
    rename: Mapping[str, str] | None = None,
    allow_interpolation: bool = False,
) -> tuple[dict[str, str], list[str]]:
    """Match the model's channels to a file's by standardised name (case-insensitive).

    Args:
        file_names: the file's channel names, as stored.
        wanted: the model's channels (standardised the same way before matching).
        source: the file, for messages.
        kinds: the MNE channel type of each file channel (to refuse stim channels), or None.
        rename: dataset-specific file name -> name, applied before standardisation (``EEG-0`` -> ``FC3``).
        allow_interpolation: let wanted 10-20 channels be missing (they will be interpolated).

    Returns:
        ``({wanted name: file name}, [missing wanted names])``; the missing list is empty unless
        ``allow_interpolation``.

    Raises:
        UserError: a wanted channel missing (without interpolation) or not interpolable, a wanted channel that is
            a stim/label channel, two file channels with the same standardised name, or a duplicated wanted name.
    """
    rename = dict(rename or {})
    wanted_std = [standardize_channel_name(name) for name in wanted]
    duplicated = sorted({name for name in wanted_std if wanted_std.count(name) > 1})
    if duplicated:
        raise UserError(f"the channel list names {', '.join(duplicated)} more than once; name each channel once")
    by_key: dict[str, str] = {}
    kind_of: dict[str, str | None] = {}
    for index, name in enumerate(file_names):
        key = standardize_channel_name(rename.get(name, name)).lower()
        if key in by_key:
            if key in {w.lower() for w in wanted_std}:
                raise UserError(
                    f"{source}: channels {by_key[key]!r} and {name!r} both read as {key!r}; the file is ambiguous "
                    "for that channel — rename one of them"
                )
            continue
        by_key[key] = name
        kind_of[name] = None if kinds is None else kinds[index]
    found: dict[str, str] = {}
    missing: list[str] = []
    for name in wanted_std:
        file_name = by_key.get(name.lower())
        if file_name is None:
            missing.append(name)
            continue
        if is_label_channel(file_name, kind_of[file_name]) or is_label_channel(name):
            raise UserError(
                f"{source}: channel {file_name!r} holds events or labels (type {kind_of[file_name] or 'by its name'}); "
                "a stim or label channel never reaches the model — remove it from the channel list"
            )
        found[name] = file_name
    if missing:
        present = ", ".join(file_names) or "none"
        if not allow_interpolation:
            raise UserError(
                f"{source}: channel(s) {', '.join(missing)} missing (the file has: {present}); choose channels the "
                "file has, or set allow_interpolation=True to interpolate 10-20 channels from their neighbours "
                "(missing channels are never zero-filled)"
            )
        standard = _standard_names()
        unknown = [name for name in missing if name.lower() not in standard]
        if unknown:
            raise UserError(
                f"{source}: channel(s) {', '.join(unknown)} missing and not in the {montage_name()} montage, so they "
                f"cannot be interpolated (the file has: {present})"
            )
        positioned = interpolation_sources(file_names, kinds, rename)
        if len(positioned) < MIN_CHANNELS_FOR_INTERPOLATION:
            raise UserError(
                f"{source}: interpolating {', '.join(missing)} needs at least {MIN_CHANNELS_FOR_INTERPOLATION} "
                f"present 10-20 channels, the file has {len(positioned)} ({', '.join(positioned) or 'none'})"
            )
    return found, missing


def interpolation_sources(
    file_names: Sequence[str], kinds: Sequence[str] | None = None, rename: Mapping[str, str] | None = None
) -> dict[str, str]:
    """{standard name: file name} of the file's channels that have a 10-20 position and are not stim/label channels
    (the channels a missing one is interpolated from)."""
    rename = dict(rename or {})
    standard = _standard_names()
    sources: dict[str, str] = {}
    for index, name in enumerate(file_names):
        standard_name = standardize_channel_name(rename.get(name, name))
        kind = None if kinds is None else kinds[index]
        if standard_name.lower() in standard and not is_label_channel(name, kind) and kind in (None, "eeg"):
            sources.setdefault(standard_name, name)
    return sources


def check_sfreq(source: str, sfreq: float, allowed_sfreqs: Sequence[float] | None) -> None:
    """A `UserError` naming the file and the rate when ``sfreq`` [Hz] is not one of ``allowed_sfreqs``."""
    if allowed_sfreqs is not None and not any(math.isclose(sfreq, rate, rel_tol=1e-6) for rate in allowed_sfreqs):
        allowed = ", ".join(f"{rate:g}" for rate in allowed_sfreqs)
        raise UserError(
            f"{source}: sampling rate {sfreq:g} Hz is not one the data card allows ({allowed} Hz); "
            "pass allowed_sfreqs to accept it (and resample_to to bring it to the model's rate)"
        )


def select_channels(
    raw_or_names,
    wanted: Sequence[str],
    *,
    source: str | None = None,
    rename: Mapping[str, str] | None = None,
    allow_interpolation: bool = False,
    allowed_sfreqs: Sequence[float] | None = None,
    resample_to: float | None = None,
    native_sfreqs: Mapping[str, float] | None = None,
) -> ChannelSelection:
    """Apply the channel contract to a recording (an `mne.io.Raw`) or check it on a list of channel names.

    Args:
        raw_or_names: a loaded `mne.io.Raw` (not modified: the result holds a picked copy) or the file's
            channel names (then only names are checked, nothing is read).
        wanted: the model's channels, in the model's order; the result has them in this order, standardised.
        source: the file, for messages (default: the Raw's file name).
        rename: dataset-specific file name -> name applied before standardisation.
        allow_interpolation: interpolate missing 10-20 channels (spherical splines on the standard montage);
            default False: a missing channel is an error.
        allowed_sfreqs: the rates [Hz] the data card allows; None allows any.
        resample_to: the rate [Hz] the model wants; the recording is resampled (polyphase, MNE) when it differs.
            None keeps the file's rate.
        native_sfreqs: {file channel name: its own rate [Hz]} for formats with per-channel rates (EDF, BDF, GDF);
            a wanted channel slower than the recording was upsampled by MNE and is refused.

    Returns:
        A `ChannelSelection`; its ``raw`` is the picked, renamed, ordered (interpolated, resampled) copy.

    Raises:
        UserError: as `match_channels`, plus an upsampled slow channel and a rate outside ``allowed_sfreqs``.
    """
    names_only = isinstance(raw_or_names, (list, tuple))
    file_names = list(raw_or_names) if names_only else list(raw_or_names.ch_names)
    kinds = None if names_only else raw_or_names.get_channel_types()
    if source is None:
        filenames = () if names_only else tuple(raw_or_names.filenames or ())
        source = str(filenames[0]) if filenames and filenames[0] else "the recording"
    found, missing = match_channels(
        file_names, wanted, source=source, kinds=kinds, rename=rename, allow_interpolation=allow_interpolation
    )
    ch_names = tuple(standardize_channel_name(name) for name in wanted)
    file_of = tuple(found.get(name) for name in ch_names)
    if names_only:
        return ChannelSelection(ch_names, file_of, interpolated=tuple(missing))
    sfreq = float(raw_or_names.info["sfreq"])
    if native_sfreqs:
        _refuse_slow_channels(source, sfreq, found.values(), native_sfreqs)
    check_sfreq(source, sfreq, allowed_sfreqs)
    picked = dict(found)
    notes: list[str] = []
    if missing:
        helpers = interpolation_sources(file_names, kinds, rename)
        picked.update({name: file_name for name, file_name in helpers.items() if file_name not in found.values()})
    raw = raw_or_names.copy().pick(list(picked.values()))
    raw.rename_channels({file_name: name for name, file_name in picked.items() if file_name != name})
    if missing:
        raw = _interpolate(raw, missing)
        sources = [name for name in raw.ch_names if name not in missing]
        note = f"{source}: interpolated missing channel(s) {', '.join(missing)} from {', '.join(sources)}"
        log.warning(note)
        notes.append(note)
    raw.reorder_channels(list(ch_names))
    resampled_from = None
    if resample_to is not None and not math.isclose(sfreq, resample_to, rel_tol=1e-9):
        notes.append(_resample(raw, source, sfreq, resample_to))
        resampled_from = sfreq
    return ChannelSelection(
        ch_names,
        file_of,
        interpolated=tuple(missing),
        sfreq=float(raw.info["sfreq"]),
        resampled_from=resampled_from,
        raw=raw,
        notes=tuple(notes),
    )


def _refuse_slow_channels(
    source: str, sfreq: float, file_names: Iterable[str], native_sfreqs: Mapping[str, float]
) -> None:
    """A `UserError` naming the channels among ``file_names`` whose own rate [Hz] is below the recording's."""
    slow = {name: native_sfreqs[name] for name in file_names if native_sfreqs.get(name, sfreq) < sfreq}
    if slow:
        listed = ", ".join(f"{name!r} at {rate:g} Hz" for name, rate in slow.items())
        raise UserError(
            f"{source}: channel(s) {listed} are sampled slower than the other channels ({sfreq:g} Hz) and would "
            "be upsampled into the input; ask only for channels sampled at the EEG rate"
        )


def _resample(raw, source: str, sfreq: float, resample_to: float) -> str:
    """Resample ``raw`` in place from ``sfreq`` to ``resample_to`` [Hz] (polyphase, MNE); returns the note it logs."""
    raw.resample(resample_to, verbose="error")
    note = f"{source}: resampled from {sfreq:g} Hz to {resample_to:g} Hz"
    log.info(note)
    return note


def _interpolate(raw, missing: Sequence[str]):
    """``raw`` with ``missing`` channels added as bad EEG channels and interpolated on the standard montage."""
    import mne
    import numpy as np

    info = mne.create_info(list(missing), raw.info["sfreq"], ch_types="eeg")
    placeholder = mne.io.RawArray(np.zeros((len(missing), raw.n_times)), info, verbose="error")
    placeholder.set_meas_date(raw.info["meas_date"])
    standard = _standard_names()
    kinds = {name: "eeg" if name.lower() in standard else "misc" for name in raw.ch_names}
    raw.set_channel_types(kinds, on_unit_change="ignore", verbose="error")
    raw.add_channels([placeholder], force_update_info=True)
    raw.set_montage(montage_name(), on_missing="ignore", verbose="error")
    raw.info["bads"] = list(missing)
    return raw.interpolate_bads(reset_bads=True, mode="accurate", verbose="error")

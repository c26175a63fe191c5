"""Preprocessing of 12-lead ECGs as H-Tuning prepares them for a pretrained model (all steps configurable).

Source: H-Tuning (ICML 2025, github.com/KAZABANA/H-Tuning, ``datacollection.py``) on the PhysioNet/CinC 2021
WFDB sets: physical units, Butterworth 1–47 Hz band-pass applied forwards and backwards, per-lead z-score,
resampling to the model's 500 Hz, then the first 6144 samples, zero-padded at the end when shorter.

For one record ``x`` (n_leads, n) [mV] sampled at ``fs`` [Hz], `preprocess` computes, in this order, with the
shared signal functions of `workbench.domains.signal`:

1. band-pass (`bandpass`): ``sosfiltfilt(butter(order, [low, high], "bandpass", fs=fs, output="sos"), x)`` — zero phase,
   so the effective magnitude response is the design's squared (order ``2·order`` overall);
2. z-score per lead (`zscore`): ``(x − mean) / std`` over the record's own samples (population std; a flat lead is
   left at zero rather than divided by zero — the readers reject flat leads before this step);
3. resampling to ``sampling_rate_hz`` (`resample`): ``resample_poly(x, up, down)`` with ``up/down`` the reduced
   fraction ``fs_out/fs`` (its Kaiser-windowed FIR is the anti-aliasing filter);
4. crop to ``n_samples`` (`crop_or_pad`: from the start, or centred) or pad at the end as ``pad`` says (default
   zeros, H-Tuning's: the lead mean after step 2; ``pad=None`` rejects a shorter record instead); `preprocess`
   also returns how many samples are real.

Shapes:
    signal (n_leads, n_samples) [mV in, standard deviations out]; a batch is ``ecg (batch, 12, n_samples)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from workbench.domains.signal import (
    CROPS,
    PAD_MODES,
    bandpass,
    bandpass_min_samples,
    crop_or_pad,
    resample,
    resampled_length,
    zscore,
)

# The standard 12 leads in the order every reader returns them (PTB-XL's and CinC 2021's order): the models' order.
from workbench.models.ecg import LEADS  # noqa: E402

from workbench.core.errors import UserError


@dataclass(frozen=True)
class EcgPreprocessing:
    """How records become model inputs; the defaults are H-Tuning's (500 Hz, 6144 samples, 1–47 Hz).

    Args:
        sampling_rate_hz: the model's rate [Hz]; None keeps each record's own rate.
        n_samples: the model's length [samples at ``sampling_rate_hz``]; None keeps each record's length.
        bandpass_hz: (low, high) cut-offs [Hz] of the Butterworth band-pass; None skips filtering.
        filter_order: order of the Butterworth design (applied twice by ``sosfiltfilt``).
        zscore: subtract each lead's mean and divide by its standard deviation.
        crop: which part of a longer record to keep: ``"start"`` (H-Tuning) or ``"center"``.
        pad: how to fill a record shorter than ``n_samples`` at its end, one of `PAD_MODES`: ``"zeros"``
            (H-Tuning), ``"edge"`` or ``"reflect"``; None rejects such a record (a `length_problem`).
        leads: the leads to return, in this order (names matched case-insensitively: PTB-XL writes AVR).
    """

    sampling_rate_hz: float | None = 500.0
    n_samples: int | None = 6144
    bandpass_hz: tuple[float, float] | None = (1.0, 47.0)
    filter_order: int = 3
    zscore: bool = True
    crop: str = "start"
    pad: str | None = "zeros"
    leads: tuple[str, ...] = LEADS

    def __post_init__(self) -> None:
        if self.sampling_rate_hz is not None and not self.sampling_rate_hz > 0:
            raise UserError(
                f"EcgPreprocessing: sampling_rate_hz must be positive (or None), got {self.sampling_rate_hz}"
            )
        if self.n_samples is not None and (int(self.n_samples) != self.n_samples or self.n_samples < 1):
            raise UserError(f"EcgPreprocessing: n_samples must be a positive integer (or None), got {self.n_samples}")
        if self.bandpass_hz is not None:
            if len(self.bandpass_hz) != 2 or not 0 < self.bandpass_hz[0] < self.bandpass_hz[1]:
                raise UserError(
                    "EcgPreprocessing: bandpass_hz must be (low, high) with 0 < low < high [Hz], "
                    f"got {self.bandpass_hz}"
                )
            object.__setattr__(self, "bandpass_hz", (float(self.bandpass_hz[0]), float(self.bandpass_hz[1])))
        if int(self.filter_order) != self.filter_order or self.filter_order < 1:
            raise UserError(f"EcgPreprocessing: filter_order must be a positive integer, got {self.filter_order}")
        if self.crop not in CROPS:
            raise UserError(f"EcgPreprocessing: crop must be one of {CROPS}, got {self.crop!r}")
        if self.pad is not None and self.pad not in PAD_MODES:
            raise UserError(f"EcgPreprocessing: pad must be one of {PAD_MODES} or None, got {self.pad!r}")
        if not self.leads or len({lead.lower() for lead in self.leads}) != len(self.leads):
            raise UserError(f"EcgPreprocessing: leads must be distinct names, got {self.leads}")
        object.__setattr__(self, "leads", tuple(self.leads))

    def rate_problem(self, fs: float) -> str | None:
        """Why a record at ``fs`` [Hz] cannot go through these settings (None when it can)."""
        if not fs > 0:
            return f"sampling rate {fs} Hz is not positive"
        if self.bandpass_hz is not None and self.bandpass_hz[1] >= fs / 2:
            low, high = self.bandpass_hz
            return (
                f"sampling rate {fs:g} Hz is too low for the {low:g}–{high:g} Hz band-pass (needs more than "
                f"{2 * high:g} Hz); lower EcgPreprocessing.bandpass_hz or drop this record"
            )
        return None

    def length_problem(self, n: int, fs: float) -> str | None:
        """Why a record of ``n`` samples at ``fs`` [Hz] cannot be filtered or padded as asked (None when it can)."""
        if n < 1:
            return "no samples"
        if self.bandpass_hz is not None and n < bandpass_min_samples(self.filter_order):
            needed = bandpass_min_samples(self.filter_order) - 1
            return f"{n} samples, too short for the order-{self.filter_order} band-pass (needs more than {needed})"
        if self.pad is None and self.n_samples is not None:
            fs_out = fs if self.sampling_rate_hz is None else self.sampling_rate_hz
            n_out = resampled_length(n, fs, fs_out)
            if n_out < self.n_samples:
                return (
                    f"{n} samples at {fs:g} Hz make {n_out} at {fs_out:g} Hz, fewer than n_samples={self.n_samples}; "
                    "set EcgPreprocessing(pad=...) to pad short records, or drop this one"
                )
        return None


def preprocess(signal_mv: np.ndarray, fs: float, settings: EcgPreprocessing) -> tuple[np.ndarray, float, int]:
    """Band-pass, z-score, resample and crop/pad one record, as `EcgPreprocessing` says.

    The caller checks ``settings.rate_problem(fs)`` and ``settings.length_problem(n, fs)`` first (the readers
    do); here a record that fails them is a ``ValueError``.

    Returns:
        ``(signal (n_leads, n_out) float32, fs_out [Hz], n_real)`` — ``n_real`` samples are data, the rest
        (up to ``settings.n_samples``) padding as ``settings.pad`` says.
    """
    problem = settings.rate_problem(fs) or settings.length_problem(signal_mv.shape[-1], fs)
    if problem:
        raise ValueError(problem)
    x = np.asarray(signal_mv, dtype=np.float64)
    if settings.bandpass_hz is not None:
        x = bandpass(x, fs, settings.bandpass_hz, settings.filter_order)
    if settings.zscore:
        x = zscore(x)
    fs_out = fs if settings.sampling_rate_hz is None else float(settings.sampling_rate_hz)
    x = resample(x, fs, fs_out)
    n_real = x.shape[-1]
    if settings.n_samples is not None:
        x, n_real = crop_or_pad(x, int(settings.n_samples), settings.crop, settings.pad)
    return x.astype(np.float32), fs_out, n_real

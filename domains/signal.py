"""Preprocessing shared by the signal domains: band-pass, notch, resampling, crop/pad, per-channel z-score.

Every function works along the last axis (time) of ``signal (n_channels, n_samples)`` or
``(batch, n_channels, n_samples)`` and never modifies its input (a crop is a view of it). Rates are in Hz;
values keep the input's unit (e.g. mV or µV) except after `zscore` (standard deviations). Filters and
resampling compute in float64 (scipy.signal):

- `bandpass`: Butterworth design as second-order sections, run forwards and backwards
  (``sosfiltfilt``): zero phase, magnitude response the design's squared (order ``2·order`` overall);
- `notch`: ``iirnotch`` (a second-order notch at ``freq_hz`` with quality factor ``quality``, −3 dB width
  ``freq_hz / quality``) run forwards and backwards (``filtfilt``);
- `resample`: polyphase (``resample_poly``) by the reduced fraction ``up/down = fs_out/fs_in``; its
  Kaiser-windowed FIR is the anti-aliasing filter;
- `crop_or_pad`: cut to a length, or pad at the end — only when asked, with a named mode (`PAD_MODES`,
  e.g. a signal mirrored as many times as needed for ``"reflect"``); channels are never added or filled
  here: a missing channel is the caller's to report;
- `zscore`: each channel of each record minus its mean, divided by its population standard deviation.

Errors in the input (shape, rate, band, length) are `UserError` naming what to change. scipy is imported
when first needed (the signal domains' extras install it).

>>> import numpy as np
>>> t = np.arange(1000) / 250.0                               # 4 s at 250 Hz
>>> x = np.sin(2 * np.pi * 10 * t)[None]                      # (1 channel, 1000 samples)
>>> resample(bandpass(x, 250.0, (1.0, 40.0)), 250.0, 100.0).shape
(1, 400)
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from workbench.core.errors import UserError

#: Where `crop_or_pad` cuts a longer signal: keep its first samples, or the middle ones.
CROPS: tuple[str, ...] = ("start", "center")
#: How `crop_or_pad` fills a shorter signal at its end: zeros, the last sample repeated, or the signal
#: mirrored about its last sample (``numpy.pad``'s "edge" and "reflect").
PAD_MODES: tuple[str, ...] = ("zeros", "edge", "reflect")


def _as_signal(signal, function: str, finite: bool = True) -> np.ndarray:
    signal = np.asarray(signal)
    if signal.ndim not in (2, 3) or not np.issubdtype(signal.dtype, np.number):
        raise UserError(
            f"{function}: expected a numeric signal of shape (n_channels, n_samples) or (batch, n_channels, "
            f"n_samples), got {signal.dtype} {signal.shape}; for one channel use signal[None]"
        )
    if finite and not np.isfinite(signal).all():
        raise UserError(
            f"{function}: the signal holds {int((~np.isfinite(signal)).sum())} NaN or infinite samples; "
            "drop or repair those records first"
        )
    return signal


def _check_rate(fs_hz: float, name: str, function: str) -> float:
    try:
        value = float(fs_hz)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{function}: {name} must be a positive number of Hz, got {fs_hz!r}")
    return value


def _scipy_signal():
    try:
        import scipy.signal
    except ImportError:
        raise UserError(
            "workbench.domains.signal needs scipy for filtering and resampling: pip install scipy"
        ) from None
    return scipy.signal


def _check_frequency(freq_hz: float, fs_hz: float, what: str, function: str) -> None:
    if not freq_hz > 0:
        raise UserError(f"{function}: {what} must be above 0 Hz, got {freq_hz:g} Hz")
    if not freq_hz < fs_hz / 2:
        raise UserError(
            f"{function}: {what} {freq_hz:g} Hz is not between 0 and the Nyquist frequency {fs_hz / 2:g} Hz of a "
            f"{fs_hz:g} Hz signal; choose a frequency below {fs_hz / 2:g} Hz, or resample to a rate above "
            f"{2 * freq_hz:g} Hz first"
        )


def _check_length(signal: np.ndarray, needed: int, what: str, function: str) -> None:
    if signal.shape[-1] < needed:
        raise UserError(
            f"{function}: {signal.shape[-1]} samples, too short for {what} (needs at least {needed}); "
            "drop the shorter records or filter longer ones"
        )


# ---------------------------------------------------------------------------------------------- filters
def bandpass_min_samples(order: int) -> int:
    """The fewest samples `bandpass` filters: one more than ``sosfiltfilt``'s edge padding ``3·(2·order + 1)``."""
    return 3 * (2 * order + 1) + 1


def bandpass(signal, fs_hz: float, band_hz: tuple[float, float], order: int = 3) -> np.ndarray:
    """Zero-phase Butterworth band-pass: ``sosfiltfilt(butter(order, band_hz, "bandpass", fs=fs_hz), signal)``.

    Args:
        signal: the samples, any unit.
        fs_hz: the sampling rate [Hz].
        band_hz: ``(low, high)`` −3 dB cut-offs of the design [Hz], ``0 < low < high < fs_hz / 2``; after the
            forward-backward pass each cut-off attenuates by 6 dB.
        order: the Butterworth order (the design has ``order`` second-order sections; applied twice).

    Shapes:
        signal (n_channels, n_samples) or (batch, n_channels, n_samples), ``n_samples >=
        bandpass_min_samples(order)`` → the same shape, float64.
    """
    signal = _as_signal(signal, "bandpass")
    fs_hz = _check_rate(fs_hz, "fs_hz", "bandpass")
    try:
        low, high = (float(edge) for edge in band_hz)
    except (TypeError, ValueError):
        low = high = math.nan
    if not low < high:
        raise UserError(f"bandpass: band_hz must be (low, high) with low < high [Hz], got {band_hz!r}")
    _check_frequency(low, fs_hz, "the low band edge", "bandpass")
    _check_frequency(high, fs_hz, "the high band edge", "bandpass")
    if int(order) != order or order < 1:
        raise UserError(f"bandpass: order must be a positive integer, got {order}")
    order = int(order)
    _check_length(signal, bandpass_min_samples(order), f"the order-{order} band-pass", "bandpass")
    scipy_signal = _scipy_signal()
    sos = scipy_signal.butter(order, (low, high), btype="bandpass", fs=fs_hz, output="sos")
    return scipy_signal.sosfiltfilt(sos, signal.astype(np.float64, copy=False), axis=-1)


def notch(signal, fs_hz: float, freq_hz: float = 50.0, quality: float = 30.0) -> np.ndarray:
    """Zero-phase notch at ``freq_hz`` (mains: 50 Hz in Europe, 60 Hz in the Americas): ``iirnotch`` + ``filtfilt``.

    Args:
        signal: the samples, any unit.
        fs_hz: the sampling rate [Hz].
        freq_hz: the frequency to remove [Hz], below ``fs_hz / 2``. For harmonics call again (100 Hz, ...).
        quality: ``freq_hz`` over the notch's −3 dB width (30: 50 Hz ± 0.83 Hz); higher is narrower.

    Shapes:
        signal (n_channels, n_samples) or (batch, n_channels, n_samples), ``n_samples >= 10`` → the same
        shape, float64.
    """
    signal = _as_signal(signal, "notch")
    fs_hz = _check_rate(fs_hz, "fs_hz", "notch")
    _check_frequency(freq_hz, fs_hz, "the notch frequency", "notch")
    if not quality > 0:
        raise UserError(f"notch: quality must be positive, got {quality}")
    scipy_signal = _scipy_signal()
    b, a = scipy_signal.iirnotch(freq_hz, quality, fs=fs_hz)
    _check_length(signal, 3 * max(len(a), len(b)) + 1, "the notch filter", "notch")
    return scipy_signal.filtfilt(b, a, signal.astype(np.float64, copy=False), axis=-1)


# ------------------------------------------------------------------------------------------- resampling
def rate_fraction(fs_in_hz: float, fs_out_hz: float) -> tuple[int, int]:
    """``(up, down)``: the reduced fraction ``fs_out_hz / fs_in_hz``, both rates taken to 1 mHz."""
    millihertz = []
    for name, rate in (("fs_in_hz", fs_in_hz), ("fs_out_hz", fs_out_hz)):
        rounded = round(_check_rate(rate, name, "resample") * 1000)
        if rounded < 1:
            raise UserError(f"resample: {name} {rate!r} Hz is below 1 mHz, the resolution rates are taken to")
        millihertz.append(rounded)
    fraction = Fraction(millihertz[1], millihertz[0])
    return fraction.numerator, fraction.denominator


def resampled_length(n_samples: int, fs_in_hz: float, fs_out_hz: float) -> int:
    """Samples `resample` returns for ``n_samples`` input samples: ``ceil(n_samples · up / down)``."""
    up, down = rate_fraction(fs_in_hz, fs_out_hz)
    return -(-n_samples * up // down)


def resample(signal, fs_in_hz: float, fs_out_hz: float) -> np.ndarray:
    """Polyphase resampling from ``fs_in_hz`` to ``fs_out_hz`` [Hz] (``scipy.signal.resample_poly``).

    The rates' ratio is the reduced fraction `rate_fraction`; equal rates return a copy.

    Shapes:
        signal (n_channels, n) or (batch, n_channels, n) → (..., resampled_length(n, fs_in_hz, fs_out_hz)),
        float64.
    """
    signal = _as_signal(signal, "resample")
    up, down = rate_fraction(fs_in_hz, fs_out_hz)
    if up == down:
        return np.array(signal, dtype=np.float64)  # a copy, as resample_poly's result would be
    return _scipy_signal().resample_poly(signal.astype(np.float64, copy=False), up, down, axis=-1)


# ------------------------------------------------------------------------------------ length and scale
def crop_or_pad(signal, n_samples: int, crop: str = "start", pad: str | None = None) -> tuple[np.ndarray, int]:
    """The signal cut to ``n_samples`` or, when ``pad`` is given, padded at its end to ``n_samples``.

    Args:
        n_samples: the length wanted [samples].
        crop: which part of a longer signal to keep (`CROPS`): its first ``n_samples`` (``"start"``) or the
            middle ones (``"center"``, the extra sample of an odd surplus cut from the end).
        pad: how to fill a shorter signal at its end (`PAD_MODES`): ``"zeros"`` (after `zscore`, the channel
            mean), ``"edge"`` (the last sample repeated) or ``"reflect"`` (mirrored about the last sample);
            None refuses a shorter signal.

    Returns:
        ``(signal (..., n_samples), n_real)``, ``n_real`` the samples that come from the input (not padding);
        the dtype is the input's.

    Shapes:
        signal (n_channels, n) or (batch, n_channels, n) → (..., n_samples).
    """
    signal = _as_signal(signal, "crop_or_pad", finite=False)
    if int(n_samples) != n_samples or n_samples < 1:
        raise UserError(f"crop_or_pad: n_samples must be a positive integer, got {n_samples}")
    n_samples = int(n_samples)
    if crop not in CROPS:
        raise UserError(f"crop_or_pad: crop must be one of {CROPS}, got {crop!r}")
    if pad is not None and pad not in PAD_MODES:
        raise UserError(f"crop_or_pad: pad must be one of {PAD_MODES} or None, got {pad!r}")
    n = signal.shape[-1]
    if n >= n_samples:
        start = 0 if crop == "start" else (n - n_samples) // 2
        return signal[..., start : start + n_samples], n_samples
    if pad is None:
        raise UserError(
            f"crop_or_pad: the signal has {n} samples, fewer than n_samples={n_samples}; pass pad= one of "
            f"{PAD_MODES} to pad it at the end, or ask for fewer samples"
        )
    if pad == "zeros":
        padded = np.zeros(signal.shape[:-1] + (n_samples,), dtype=signal.dtype)
        padded[..., :n] = signal
    else:
        padded = np.pad(signal, [(0, 0)] * (signal.ndim - 1) + [(0, n_samples - n)], mode=pad)
    return padded, n


def zscore(signal) -> np.ndarray:
    """Each channel minus its mean, divided by its population standard deviation; a constant channel becomes 0.

    Statistics are per channel of each record, over its own samples.

    Shapes:
        signal (n_channels, n_samples) or (batch, n_channels, n_samples) → the same shape, float64
        [standard deviations].
    """
    signal = _as_signal(signal, "zscore").astype(np.float64, copy=False)
    mean = signal.mean(axis=-1, keepdims=True)
    std = signal.std(axis=-1, keepdims=True)
    return (signal - mean) / np.where(std > 0, std, 1.0)

"""Unit-RMS noise the EEG simulators build their signals from: 1/f background and band-limited rhythms.

* 1/f noise: ``pink(n) = irfft(rfft(w) · max(f, f₀)^(−β/2))`` of white noise w (Timmer & König 1995), f₀ = 0.5 Hz,
  scaled to unit RMS; its power spectrum falls as 1/f^β.
* band noise: ``band(f₁, f₂) = sosfiltfilt(butter(2, [f₁, f₂]), w)``, unit RMS — a rhythm whose spectral peak
  sits at ≈ √(f₁f₂).
"""

from __future__ import annotations

import numpy as np
from scipy.signal import butter, sosfiltfilt


def pink_noise(n: int, fs: float, exponent: float, rng: np.random.Generator, f_min_hz: float = 0.5) -> np.ndarray:
    """Unit-RMS 1/f^exponent noise (white noise shaped in the Fourier domain). Shapes: returns (n,)."""
    frequencies = np.fft.rfftfreq(n, 1.0 / fs)
    spectrum = np.fft.rfft(rng.standard_normal(n)) * np.maximum(frequencies, f_min_hz) ** (-exponent / 2)
    x = np.fft.irfft(spectrum, n)
    return x / x.std()


def band_noise(n: int, fs: float, low_hz: float, high_hz: float, rng: np.random.Generator) -> np.ndarray:
    """Unit-RMS band noise: white noise through a zero-phase order-2 Butterworth band-pass. Shapes: (n,)."""
    x = sosfiltfilt(butter(2, [low_hz, high_hz], btype="bandpass", fs=fs, output="sos"), rng.standard_normal(n))
    return x / x.std()

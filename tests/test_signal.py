"""workbench.domains.signal: what each filter keeps and removes (amplitude ratios), lengths, scipy equality, errors."""

from __future__ import annotations

import doctest
import sys

import numpy as np
import pytest

scipy_signal = pytest.importorskip("scipy.signal")
from workbench.domains import signal  # noqa: E402

from workbench.core.errors import UserError  # noqa: E402

FS = 250.0  # [Hz]


def sine(freq_hz, fs_hz=FS, seconds=8.0, amplitude=1.0, phase=0.0):
    t = np.arange(int(round(seconds * fs_hz))) / fs_hz
    return amplitude * np.sin(2 * np.pi * freq_hz * t + phase)


def amplitude_at(x, freq_hz, fs_hz=FS, margin_s=2.0):
    """Amplitude of the ``freq_hz`` component over the middle of ``x`` (last axis), edges cut by ``margin_s``."""
    n_margin = int(margin_s * fs_hz)
    middle = x[..., n_margin : x.shape[-1] - n_margin]
    t = np.arange(middle.shape[-1]) / fs_hz
    return 2 * np.abs(np.mean(middle * np.exp(-2j * np.pi * freq_hz * t), axis=-1))


# ---------------------------------------------------------------------------------------------- filters
def test_bandpass_keeps_in_band_and_removes_out_of_band_sines():
    # 20 s: the middle 16 s hold whole periods of every component (0.25 Hz: 4), so the projections do not leak
    x = np.stack(
        [sine(10, seconds=20) + sine(90, seconds=20), sine(15, seconds=20, amplitude=2) + sine(0.25, seconds=20)]
    )
    y = signal.bandpass(x, FS, (1.0, 40.0), order=3)
    assert y.shape == x.shape and y.dtype == np.float64
    assert amplitude_at(y[0], 10) / amplitude_at(x[0], 10) == pytest.approx(1.0, abs=0.01)
    assert amplitude_at(y[1], 15) / amplitude_at(x[1], 15) == pytest.approx(1.0, abs=0.01)
    assert amplitude_at(y[0], 90) / amplitude_at(x[0], 90) < 1e-3  # order 6 overall, more than an octave out
    assert amplitude_at(y[1], 0.25) / amplitude_at(x[1], 0.25) < 0.01
    # at a cut-off the design has −3 dB, forwards and backwards −6 dB: amplitude 1/2
    edge = signal.bandpass(sine(40.0, seconds=20)[None], FS, (1.0, 40.0))
    assert amplitude_at(edge[0], 40.0, margin_s=5) == pytest.approx(0.5, abs=0.01)


def test_bandpass_and_notch_are_scipy_and_work_on_batches():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4, 1000)).cumsum(axis=-1)  # (batch, n_channels, n_samples)
    sos = scipy_signal.butter(4, (0.5, 30.0), btype="bandpass", fs=FS, output="sos")
    np.testing.assert_array_equal(signal.bandpass(x, FS, (0.5, 30.0), 4), scipy_signal.sosfiltfilt(sos, x, axis=-1))
    b, a = scipy_signal.iirnotch(50.0, 30.0, fs=FS)
    np.testing.assert_array_equal(signal.notch(x, FS, 50.0), scipy_signal.filtfilt(b, a, x, axis=-1))
    # each record of a batch is filtered on its own
    np.testing.assert_allclose(signal.bandpass(x, FS, (0.5, 30.0), 4)[1], signal.bandpass(x[1], FS, (0.5, 30.0), 4))
    x32 = x.astype(np.float32)
    assert signal.bandpass(x32, FS, (0.5, 30.0)).dtype == np.float64 and x32.dtype == np.float32  # input untouched


@pytest.mark.parametrize("mains_hz", [50.0, 60.0])
def test_notch_removes_mains_and_keeps_the_rest(mains_hz):
    fs = 500.0
    x = (sine(10, fs) + sine(mains_hz, fs, amplitude=0.5) + sine(mains_hz + 20, fs))[None]
    y = signal.notch(x, fs, mains_hz)
    assert amplitude_at(y[0], mains_hz, fs) / 0.5 < 0.01
    assert amplitude_at(y[0], 10, fs) == pytest.approx(1.0, abs=0.01)
    assert amplitude_at(y[0], mains_hz + 20, fs) == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("order", range(1, 7))
def test_bandpass_min_samples_is_what_sosfiltfilt_accepts(order):
    n = signal.bandpass_min_samples(order)
    x = np.random.default_rng(order).normal(size=(2, n))
    assert signal.bandpass(x, FS, (1.0, 40.0), order).shape == (2, n)
    with pytest.raises(ValueError):  # scipy itself refuses one sample fewer
        sos = scipy_signal.butter(order, (1.0, 40.0), btype="bandpass", fs=FS, output="sos")
        scipy_signal.sosfiltfilt(sos, x[:, :-1], axis=-1)
    with pytest.raises(UserError, match=f"needs at least {n}"):  # and the workbench says so first
        signal.bandpass(x[:, :-1], FS, (1.0, 40.0), order)


# ------------------------------------------------------------------------------------------- resampling
@pytest.mark.parametrize("fs_in, fs_out, up_down", [(500.0, 100.0, (1, 5)), (500.0, 128.0, (32, 125)),
                                                    (257.0, 500.0, (500, 257)), (360.0, 360.0, (1, 1))])  # fmt: skip
def test_resample_keeps_a_sine_s_frequency_and_amplitude(fs_in, fs_out, up_down):
    x = np.stack([sine(7.0, fs_in, seconds=10), sine(3.0, fs_in, seconds=10, amplitude=2.0)])
    y = signal.resample(x, fs_in, fs_out)
    assert signal.rate_fraction(fs_in, fs_out) == up_down
    assert y.shape == (2, signal.resampled_length(x.shape[-1], fs_in, fs_out)) == (2, int(np.ceil(10 * fs_out)))
    spectrum = np.abs(np.fft.rfft(y[0, : int(10 * fs_out)]))
    assert np.fft.rfftfreq(int(10 * fs_out), 1 / fs_out)[spectrum.argmax()] == pytest.approx(7.0)
    assert amplitude_at(y[0], 7.0, fs_out) == pytest.approx(1.0, abs=0.01)
    assert amplitude_at(y[1], 3.0, fs_out) == pytest.approx(2.0, abs=0.02)
    np.testing.assert_array_equal(y, scipy_signal.resample_poly(x, *up_down, axis=-1) if up_down != (1, 1) else x)
    assert y is not x


def test_resampled_length_is_resample_poly_s():
    for n in (1, 7, 999, 1000, 1001):
        for fs_in, fs_out in ((500, 100), (100, 500), (257, 500), (500, 257)):
            assert signal.resampled_length(n, fs_in, fs_out) == signal.resample(np.ones((1, n)), fs_in, fs_out).shape[1]


# ------------------------------------------------------------------------------------ length and scale
def test_zscore_gives_mean_0_std_1_per_channel():
    rng = np.random.default_rng(2)
    x = rng.normal(loc=[[[5.0], [-3.0], [0.0]]], scale=[[[2.0], [0.1], [7.0]]], size=(2, 3, 500))
    x[1, 2] = 4.0  # a constant channel becomes 0, not a division by zero
    z = signal.zscore(x)
    assert z.shape == x.shape
    np.testing.assert_allclose(z.mean(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(z.std(axis=-1)[[0, 0, 0, 1, 1], [0, 1, 2, 0, 1]], 1, atol=1e-12)
    assert not z[1, 2].any()
    np.testing.assert_allclose(z[0, 1], (x[0, 1] - x[0, 1].mean()) / x[0, 1].std(), atol=1e-12)


def test_crop_or_pad_lengths_and_pad_modes():
    x = np.arange(2 * 10, dtype=np.float32).reshape(2, 10)
    cropped, n_real = signal.crop_or_pad(x, 4)
    assert n_real == 4 and np.array_equal(cropped, x[:, :4])
    cropped, n_real = signal.crop_or_pad(x, 5, crop="center")
    assert n_real == 5 and np.array_equal(cropped, x[:, 2:7])  # surplus 5: 2 cut before, 3 after
    same, n_real = signal.crop_or_pad(x, 10, pad=None)
    assert n_real == 10 and np.array_equal(same, x)
    with pytest.raises(UserError, match="fewer than n_samples=13; pass pad="):
        signal.crop_or_pad(x, 13)  # padding is never implicit
    zeros, n_real = signal.crop_or_pad(x, 13, pad="zeros")
    assert n_real == 10 and zeros.dtype == np.float32 and zeros.shape == (2, 13)
    assert np.array_equal(zeros[:, :10], x) and not zeros[:, 10:].any()
    edge, _ = signal.crop_or_pad(x, 13, pad="edge")
    assert np.array_equal(edge[:, 10:], np.repeat(x[:, -1:], 3, axis=1))
    reflect, _ = signal.crop_or_pad(x, 13, pad="reflect")
    assert np.array_equal(reflect[:, 10:], x[:, [8, 7, 6]])
    batch, n_real = signal.crop_or_pad(np.stack([x, x]), 12, pad="zeros")
    assert batch.shape == (2, 2, 12) and n_real == 10


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "call, words",
    [
        (lambda x: signal.bandpass(x, 100.0, (1.0, 60.0)), "high band edge 60 Hz is not between 0 and the Nyquist"),
        (lambda x: signal.bandpass(x, 100.0, (40.0, 10.0)), r"band_hz must be \(low, high\) with low < high"),
        (lambda x: signal.bandpass(x, 100.0, (0.0, 10.0)), "the low band edge must be above 0 Hz, got 0 Hz"),
        (lambda x: signal.bandpass(x, 100.0, (1.0, 10.0), order=0), "order must be a positive integer"),
        (lambda x: signal.bandpass(x, -5.0, (1.0, 10.0)), "fs_hz must be a positive number of Hz"),
        (lambda x: signal.notch(x, 100.0, 50.0), "notch frequency 50 Hz is not between 0 and the Nyquist"),
        (lambda x: signal.notch(x, 500.0, 50.0, quality=0), "quality must be positive"),
        (lambda x: signal.resample(x, 0.0, 100.0), "fs_in_hz must be a positive number of Hz"),
        (lambda x: signal.resample(x, 100.0, 1e-4), "below 1 mHz"),
        (lambda x: signal.crop_or_pad(x, 0), "n_samples must be a positive integer"),
        (lambda x: signal.crop_or_pad(x, 10, crop="end"), "crop must be one of"),
        (lambda x: signal.crop_or_pad(x, 500, pad="mean"), "pad must be one of"),
        (lambda x: signal.zscore(x[0]), r"shape \(n_channels, n_samples\).*got float64 \(400,\).*signal\[None\]"),
        (lambda x: signal.resample(x[None, None], 100.0, 50.0), r"got float64 \(1, 1, 3, 400\)"),
        (lambda x: signal.bandpass(np.where(x > 1, np.nan, x), 100.0, (1.0, 10.0)), "NaN or infinite"),
        (lambda x: signal.notch(x[:, :9], 100.0, 20.0), "9 samples, too short for the notch filter"),
    ],
)
def test_bad_input_is_a_user_error_that_names_the_fix(call, words):
    x = np.random.default_rng(3).normal(size=(3, 400))
    with pytest.raises(UserError, match=words):
        call(x)


def test_docstring_examples():
    assert doctest.testmod(signal).failed == 0


def test_missing_scipy_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.signal", None)  # makes `import scipy.signal` fail
    x = np.ones((1, 100))
    with pytest.raises(UserError, match="pip install scipy"):
        signal.resample(x, 100.0, 50.0)
    assert signal.crop_or_pad(x, 50)[0].shape == (1, 50) and signal.zscore(x).shape == (1, 100)  # numpy only

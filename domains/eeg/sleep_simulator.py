"""Synthetic Sleep-EDF nights (card sleep-edf-synthetic): the subjects' recipes and the PSG signals of a night.

A night is a sum of a few physiological generators on top of 1/f background noise (`workbench.domains.eeg.noise`);
amplitudes are in µV, times in s. Per-epoch gains are piecewise constant and ramp linearly over ±1 s around each
30 s boundary (`_epoch_gain`). `workbench.domains.eeg.generate` writes the nights as EDF files.

Sleep (Sleep-EDF Expanded, sleep-cassette; `simulate_night`), per 30 s epoch of stage W, 1, 2, 3, 4, R
(and ``?``, scored as W; ``M``, movement time)::

    EEG(t) = Σ_c g_c,ch · G_c(stage(t)) · A_c · band_c(t)            c ∈ alpha, beta, theta, delta background
             + B · pink(t) + spindles + K-complexes + slow waves + sawtooth waves + movement artefact

with the subject's amplitudes A_c [µV RMS] (`SleepSubject`), channel gains g (Fpz-Cz, Pz-Oz) and stage gains G:

    =========  ============  =====  =====  =====  =====  =====  =====
    component  band [Hz]     W      1      2      3      4      R
    =========  ============  =====  =====  =====  =====  =====  =====
    alpha      f_α ± 1       1      0.3    0.08   0.05   0.05   0.2     g = (0.35, 1)
    beta       15–30         1      0.6    0.4    0.3    0.3    0.7     g = (1, 0.8)
    theta      4–7           0.35   1      0.8    0.6    0.6    0.8     g = (1, 0.8)
    delta bg   0.5–2         0.3    0.5    0.8    1      1      0.4     g = (1, 0.6)
    =========  ============  =====  =====  =====  =====  =====  =====

* wake: alpha at the subject's peak f_α ∈ 8.5–11.5 Hz, strongest at Pz-Oz, plus beta; N1: theta, alpha fading;
* sleep spindles (N2: 2–5 per epoch; N3: 0–2): ``A_σ·u·sin²(π(t−t₀)/d)·sin(2πf(t−t₀)+φ)``, f = f_σ + N(0, 0.3)
  clipped to 11–15 Hz (f_σ ∈ 12–14 Hz per subject), d ∈ 0.5–2 s (waxing-waning), u ∈ 0.7–1.3; g = (1, 0.7);
* K-complexes (N2: 1–3 per epoch; stage 3: 0–1), biphasic, duration D ∈ 0.5–1 s:
  ``K(t) = A_K·v·[−exp(−(t−0.25D)²/2(0.1D)²) + 0.6·exp(−(t−0.6D)²/2(0.15D)²)]``, v ∈ 0.8–1.25 (≥ 75 µV
  peak-to-peak: A_K ≥ 60 µV), followed by a spindle with probability 0.3; g = (1, 0.4), EOG 0.3;
* slow waves (N3, and up to 10 % of an N2 epoch): whole cycles ``−(a/2)·sin(2π(t−t₀)/T)``, T ∈ 0.6–1.8 s
  (0.55–1.7 Hz), peak-to-peak a = A_δ·U(0.85, 1.4) ≥ 76 µV at Fpz-Cz, covering a fraction of the epoch drawn
  from 0.25–0.45 (stage 3, R&K: 20–50 %), 0.55–0.8 (stage 4, R&K: > 50 %), 0–0.1 (stage 2); g = (1, 0.5), EOG 0.3;
* REM: low-amplitude mixed activity (the table), 1–2 bursts of 3–6 sawtooth waves per epoch
  (``scipy.signal.sawtooth(2πft, 0.8)`` at f ∈ 2–5 Hz under a Hann window, A_saw peak), g = (1, 0.5);
* EOG horizontal: eye position p(t) as a sum of smooth steps ``s·½(1 + tanh((t − t₀)/τ))`` — wake saccades
  (every 0.8–3 s, s ∈ ±20–80 µV, τ = 15 ms), N1 slow eye movements (1–2 per epoch, excursions
  ``s·sin²(π(t−t₀)/d)``, d ∈ 2–6 s, s ∈ ±50–120 µV), REM rapid eye movements (1–3 bursts of 2–6 saccades
  0.3–1 s apart, s ∈ ±50–150 µV, τ = 15 ms) — AC-coupled as an amplifier is (first-order high-pass at
  0.16 Hz), plus frontal EEG leakage (slow waves, K-complexes, × 0.3) and 2 µV white noise;
* movement time: 60 µV band(0.5–3) + 15 µV band(20–45) on every 100 Hz channel;
* the 1 Hz channels (written at 1 Hz, as the real files): ``EMG submental`` [µV] the chin EMG's RMS, A_EMG ×
  (W 1, 1 0.7, 2 0.5, 3/4 0.45, R 0.15, M 4) × lognormal(0, 0.15) per sample; ``Resp oro-nasal`` a breathing
  sinusoid of 0.22–0.28 Hz sampled at 1 Hz (aliased, as the real channel is), amplitude 500 ± noise, no unit;
  ``Temp rectal`` [°C] 37.0–37.3 falling by 0.3 over the sleep; ``Event marker`` all zeros.

Cohort configurations (`SleepCohort`): a night's draws follow ``DEFAULT_SLEEP_COHORT`` (the ranges above, the
embedded set's) unless another is given — other ranges of the subjects' alpha and spindle frequencies and 1/f
exponent, amplitudes scaled, a per-subject gain of each derivation (montage), other amplifier noise, and ``cycles``
sleep cycles per night (N2 → 3 → 4 → N2 → REM repeated, for longer nights). ``SOURCE_SLEEP_COHORT`` is the other
configuration a benchmark backbone is pretrained on.

Deterministic: subject k uses ``numpy.random.SeedSequence([seed, 1, k, 0])`` for its recipe and ``[seed, 1, k, 1]``
for its signals.

Shapes: a night (n_epochs · 3000,) per 100 Hz channel, (n_epochs · 30,) per 1 Hz channel [µV, °C].
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.signal import butter, sawtooth, sosfilt
from workbench.domains.eeg.noise import band_noise, pink_noise

from workbench.core.errors import UserError

PSG_RATE_HZ = 100
EPOCH_S = 30
#: Hypnogram letter -> annotation text in the real files' ``SC4ssNx-Hypnogram.edf``.
STAGE_TEXT = {
    "W": "Sleep stage W",
    "1": "Sleep stage 1",
    "2": "Sleep stage 2",
    "3": "Sleep stage 3",
    "4": "Sleep stage 4",
    "R": "Sleep stage R",
    "?": "Sleep stage ?",
    "M": "Movement time",
}
#: Scorer letters of the hypnogram file names, cycled over subjects (the real set mixes C, H, J, V, ...).
SCORERS = "CHJVWM"
#: Stage gains G of the continuous rhythms (module docstring table); ``?`` is scored as wake, ``M`` as wake.
STAGE_GAINS: dict[str, dict[str, float]] = {
    "alpha": {"W": 1.0, "1": 0.3, "2": 0.08, "3": 0.05, "4": 0.05, "R": 0.2},
    "beta": {"W": 1.0, "1": 0.6, "2": 0.4, "3": 0.3, "4": 0.3, "R": 0.7},
    "theta": {"W": 0.35, "1": 1.0, "2": 0.8, "3": 0.6, "4": 0.6, "R": 0.8},
    "delta": {"W": 0.3, "1": 0.5, "2": 0.8, "3": 1.0, "4": 1.0, "R": 0.4},
}
BANDS_HZ = {"beta": (15.0, 30.0), "theta": (4.0, 7.0), "delta": (0.5, 2.0)}
#: Channel gains (Fpz-Cz, Pz-Oz) of each generator.
CHANNEL_GAINS = {
    "alpha": (0.35, 1.0),
    "beta": (1.0, 0.8),
    "theta": (1.0, 0.8),
    "delta": (1.0, 0.6),
    "spindle": (1.0, 0.7),
    "kcomplex": (1.0, 0.4),
    "slow_wave": (1.0, 0.5),
    "sawtooth": (1.0, 0.5),
}
#: Fraction of the epoch covered by slow waves (uniform range) per stage.
SLOW_WAVE_COVERAGE = {"2": (0.0, 0.1), "3": (0.25, 0.45), "4": (0.55, 0.8)}
EMG_STAGE_GAIN = {"W": 1.0, "?": 1.0, "1": 0.7, "2": 0.5, "3": 0.45, "4": 0.45, "R": 0.15, "M": 4.0}
#: The compressed night: (stage, (fewest, most) epochs) blocks; W → N1 → N2 → N3 → N2 → REM → N1 → W.
NIGHT_BLOCKS = (("W", (2, 3)), ("1", (1, 2)), ("2", (3, 3)), ("3", (1, 2)), ("4", (2, 2)), ("2", (2, 2)),
                ("R", (3, 4)), ("1", (1, 1)), ("W", (2, 2)))  # fmt: skip


@dataclass(frozen=True)
class SleepSubject:
    """One sleep-cassette subject's night: its hypnogram and the amplitudes of its generators.

    Args:
        subject: Sleep-EDF subject number ss (file ``SC4ssNE0-PSG.edf``); night: N (1 or 2).
        hypnogram: one letter per 30 s epoch, W 1 2 3 4 R ? M (`STAGE_TEXT`).
        scorer: the hypnogram file's letter x (``SC4ssNx-Hypnogram.edf``).
        alpha_hz: wake alpha peak [Hz]; spindle_hz: mean spindle frequency [Hz].
        alpha_uv, beta_uv, theta_uv, delta_uv, background_uv: RMS of alpha, beta, theta, delta background and
            1/f background at channel gain 1 [µV]; background_exponent: β of the 1/f^β background.
        spindle_uv: spindle peak amplitude [µV]; kcomplex_uv: K-complex negative peak A_K [µV];
        slow_wave_uv: slow-wave peak-to-peak scale A_δ [µV]; sawtooth_uv: sawtooth peak amplitude [µV].
        emg_uv: wake chin-EMG RMS [µV]; temperature_c: rectal temperature at lights off [°C];
        breathing_hz: respiration rate [Hz]; start: recording start (date, time) as ISO strings.
        channel_gains: the montage's gain of each EEG derivation (Fpz-Cz, Pz-Oz), multiplying its whole signal;
            sensor_noise_uv: RMS of each derivation's amplifier white noise [µV] (defaults: the embedded set's).
    """

    subject: int
    night: int
    hypnogram: str
    scorer: str
    alpha_hz: float
    spindle_hz: float
    alpha_uv: float
    beta_uv: float
    theta_uv: float
    delta_uv: float
    background_uv: float
    background_exponent: float
    spindle_uv: float
    kcomplex_uv: float
    slow_wave_uv: float
    sawtooth_uv: float
    emg_uv: float
    temperature_c: float
    breathing_hz: float
    start: tuple[str, str]
    channel_gains: tuple[float, float] = (1.0, 1.0)
    sensor_noise_uv: float = 0.5


@dataclass(frozen=True)
class SleepCohort:
    """How a cohort's nights are drawn (`draw_sleep_subjects`): the subjects' spectra, the montage and night length.

    Args:
        alpha_hz, spindle_hz, background_exponent: (low, high) of the uniform draw of each subject's wake alpha peak
            [Hz], mean spindle frequency [Hz] and 1/f^β background exponent.
        amplitude_scale: multiplies every rhythm's and transient's amplitude range (alpha, beta, theta, delta,
            background, spindle, K-complex, slow wave, sawtooth).
        channel_gain_sd: SD of log of each derivation's montage gain, drawn per subject (0: gain 1).
        sensor_noise_uv: amplifier white noise RMS [µV].
        cycles: sleep cycles per night: the blocks N2 → N3 (stages 3, 4) → N2 → REM of `NIGHT_BLOCKS` repeated
            (1: the compressed night of ≈ 20 epochs, ≈ 10 min; each cycle adds 11–13 epochs).

    The defaults are the embedded set's (`DEFAULT_SLEEP_COHORT`); `SOURCE_SLEEP_COHORT` is another configuration.
    """

    alpha_hz: tuple[float, float] = (8.5, 11.5)
    spindle_hz: tuple[float, float] = (12.0, 14.0)
    background_exponent: tuple[float, float] = (0.9, 1.3)
    amplitude_scale: float = 1.0
    channel_gain_sd: float = 0.0
    sensor_noise_uv: float = 0.5
    cycles: int = 1

    def __post_init__(self) -> None:
        for name in ("alpha_hz", "spindle_hz", "background_exponent"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise UserError(f"SleepCohort.{name}={getattr(self, name)}: expected (low, high) with 0 < low <= high")
        if self.amplitude_scale <= 0 or self.channel_gain_sd < 0 or self.sensor_noise_uv < 0 or self.cycles < 1:
            raise UserError(
                "SleepCohort: expected amplitude_scale > 0, channel_gain_sd >= 0, sensor_noise_uv >= 0, cycles >= 1; "
                f"got {self.amplitude_scale}, {self.channel_gain_sd}, {self.sensor_noise_uv}, {self.cycles}"
            )


#: The embedded set's configuration.
DEFAULT_SLEEP_COHORT = SleepCohort()
#: Another configuration (the pretraining corpus of the benchmark's backbone): slower alpha and spindles, a steeper
#: background, amplitudes × 1.25, derivation gains varying ±25 % between subjects, 3 µV amplifier noise.
SOURCE_SLEEP_COHORT = SleepCohort(
    alpha_hz=(7.5, 10.0),
    spindle_hz=(11.0, 13.0),
    background_exponent=(1.3, 1.8),
    amplitude_scale=1.25,
    channel_gain_sd=0.25,
    sensor_noise_uv=3.0,
)


def _night_blocks(cycles: int) -> tuple[tuple[str, tuple[int, int]], ...]:
    """`NIGHT_BLOCKS` with its cycle (N2, stage 3, stage 4, N2, REM) repeated ``cycles`` times."""
    return NIGHT_BLOCKS[:2] + NIGHT_BLOCKS[2:7] * cycles + NIGHT_BLOCKS[7:]


def draw_sleep_subjects(
    n_subjects: int, seed: int, cohort: SleepCohort = DEFAULT_SLEEP_COHORT
) -> tuple[SleepSubject, ...]:
    """The recipes of subjects 0 … n_subjects − 1 (subject k from ``SeedSequence([seed, 1, k, 0])``), drawn as
    ``cohort`` says (default: the embedded set's configuration).

    The night follows `NIGHT_BLOCKS` (its cycle repeated ``cohort.cycles`` times) with block lengths drawn in their
    ranges; even subjects get one ``Movement time`` epoch inside the first N2 block, odd subjects one unscored
    ``Sleep stage ?`` epoch at the end.
    """
    if n_subjects < 1 or n_subjects > 83:
        raise UserError(f"subjects={n_subjects}: expected 1-83 (Sleep-EDF Expanded's cassette numbers subjects 00-82)")
    recipes = []
    a, gain_sd = cohort.amplitude_scale, cohort.channel_gain_sd
    for k in range(n_subjects):
        rng = np.random.default_rng(np.random.SeedSequence([seed, 1, k, 0]))
        blocks = [stage * int(rng.integers(low, high + 1)) for stage, (low, high) in _night_blocks(cohort.cycles)]
        if k % 2 == 0:
            blocks[2] = blocks[2][:1] + "M" + blocks[2][1:]
        hypnogram = "".join(blocks) + ("?" if k % 2 else "")
        lights_off = datetime.timedelta(days=int(k), minutes=int(rng.integers(0, 90)))
        start = datetime.datetime(1989, 4, 24, 22, 0) + lights_off
        recipes.append(
            SleepSubject(
                subject=k,
                night=1,
                hypnogram=hypnogram,
                scorer=SCORERS[k % len(SCORERS)],
                alpha_hz=round(float(rng.uniform(*cohort.alpha_hz)), 2),
                spindle_hz=round(float(rng.uniform(*cohort.spindle_hz)), 2),
                alpha_uv=round(float(rng.uniform(10.0 * a, 16.0 * a)), 2),
                beta_uv=round(float(rng.uniform(2.0 * a, 4.0 * a)), 2),
                theta_uv=round(float(rng.uniform(6.0 * a, 10.0 * a)), 2),
                delta_uv=round(float(rng.uniform(6.0 * a, 10.0 * a)), 2),
                background_uv=round(float(rng.uniform(4.0 * a, 7.0 * a)), 2),
                background_exponent=round(float(rng.uniform(*cohort.background_exponent)), 2),
                spindle_uv=round(float(rng.uniform(18.0 * a, 30.0 * a)), 2),
                kcomplex_uv=round(float(rng.uniform(60.0 * a, 90.0 * a)), 2),
                slow_wave_uv=round(float(rng.uniform(90.0 * a, 120.0 * a)), 2),
                sawtooth_uv=round(float(rng.uniform(15.0 * a, 25.0 * a)), 2),
                emg_uv=round(float(rng.uniform(8.0, 20.0)), 2),
                temperature_c=round(float(rng.uniform(37.0, 37.3)), 2),
                breathing_hz=round(float(rng.uniform(0.22, 0.28)), 3),
                start=(start.date().isoformat(), start.time().isoformat()),
                # drawn last, so that the draws above are the embedded set's under the default configuration
                channel_gains=tuple(round(float(g), 3) for g in np.exp(gain_sd * rng.standard_normal(2))),
                sensor_noise_uv=cohort.sensor_noise_uv,
            )
        )
    return tuple(recipes)


def _epoch_gain(values: Sequence[float], fs: float, ramp_s: float = 1.0) -> np.ndarray:
    """Per-epoch values as a per-sample gain, ramping linearly over ±ramp_s around each boundary. Shapes: (n,)."""
    knots_t, knots_v = [], []
    for k, value in enumerate(values):
        knots_t += [k * EPOCH_S + ramp_s, (k + 1) * EPOCH_S - ramp_s]
        knots_v += [value, value]
    t = np.arange(len(values) * EPOCH_S * int(fs)) / fs
    return np.interp(t, knots_t, knots_v)


def _add_at(x: np.ndarray, start: int, wave: np.ndarray) -> None:
    """x[start : start + len(wave)] += wave, cut at x's end."""
    stop = min(len(x), start + len(wave))
    if start < stop:
        x[start:stop] += wave[: stop - start]


def _smooth_steps(n: int, fs: float, times_s: Sequence[float], sizes: Sequence[float], tau_s: float) -> np.ndarray:
    """Σ s·½(1 + tanh((t − t₀)/τ)): an eye position that jumps by s at each t₀. Shapes: returns (n,)."""
    t = np.arange(n) / fs
    position = np.zeros(n)
    for t0, size in zip(times_s, sizes):
        lo, hi = int(max(0, (t0 - 10 * tau_s) * fs)), int(min(n, (t0 + 10 * tau_s) * fs))
        position[lo:hi] += size * 0.5 * (1 + np.tanh((t[lo:hi] - t0) / tau_s))
        position[hi:] += size
    return position


def _slow_waves(epoch_s: float, coverage: float, scale_uv: float, fs: float, rng: np.random.Generator) -> np.ndarray:
    """Whole delta cycles (0.6–1.8 s, ≥ 0.85·scale_uv peak-to-peak) covering ``coverage`` of an epoch. Shapes: (n,)."""
    x = np.zeros(int(epoch_s * fs))
    on_s = coverage * epoch_s
    if on_s < 0.6:
        return x
    n_segments = 1 if on_s < 8 else 2
    gaps = rng.dirichlet(np.ones(n_segments + 1)) * (epoch_s - on_s)
    t = gaps[0]
    for segment in range(n_segments):
        end = t + on_s / n_segments
        while True:
            period = rng.uniform(0.6, 1.8)
            if t + period > end + 0.3:
                break
            wave_t = np.arange(int(period * fs)) / fs
            _add_at(x, int(t * fs), -0.5 * scale_uv * rng.uniform(0.85, 1.4) * np.sin(2 * np.pi * wave_t / period))
            t += period
        t = end + gaps[segment + 1]
    return x


def _spindle(subject: SleepSubject, fs: float, rng: np.random.Generator) -> np.ndarray:
    duration = rng.uniform(0.5, 2.0)
    t = np.arange(int(duration * fs)) / fs
    frequency = float(np.clip(subject.spindle_hz + rng.normal(0, 0.3), 11.0, 15.0))
    envelope = np.sin(np.pi * t / duration) ** 2
    amplitude = subject.spindle_uv * rng.uniform(0.7, 1.3)
    return amplitude * envelope * np.sin(2 * np.pi * frequency * t + rng.uniform(0, 6.3))


def _kcomplex(subject: SleepSubject, fs: float, rng: np.random.Generator) -> np.ndarray:
    duration = rng.uniform(0.5, 1.0)
    t = np.arange(int(duration * fs)) / fs
    shape = -np.exp(-((t - 0.25 * duration) ** 2) / (2 * (0.1 * duration) ** 2)) + 0.6 * np.exp(
        -((t - 0.6 * duration) ** 2) / (2 * (0.15 * duration) ** 2)
    )
    return subject.kcomplex_uv * rng.uniform(0.8, 1.25) * shape


def _sawtooth_burst(subject: SleepSubject, fs: float, rng: np.random.Generator) -> np.ndarray:
    frequency = rng.uniform(2.0, 5.0)
    t = np.arange(int(rng.integers(3, 7) / frequency * fs)) / fs
    return subject.sawtooth_uv * np.hanning(len(t)) * sawtooth(2 * np.pi * frequency * t, 0.8)


def simulate_night(subject: SleepSubject, seed: int) -> dict[str, np.ndarray]:
    """The PSG of one subject's night (module docstring), channel label -> samples at the channel's rate.

    Shapes: 100 Hz channels (n_epochs · 3000,) [µV]; 1 Hz channels (n_epochs · 30,) [µV, °C, a.u.].
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1, subject.subject, 1]))
    fs, stages = PSG_RATE_HZ, subject.hypnogram
    scored = ["W" if stage in "?M" else stage for stage in stages]
    n = len(stages) * EPOCH_S * fs
    eeg = _rhythms(subject, scored, fs, n, rng)
    transients, eye_times, eye_sizes, eye_excursions = _transients(subject, stages, fs, n, rng)
    names = ("spindle", "kcomplex", "slow_wave", "sawtooth")
    for ch in range(2):
        eeg[ch] += sum(CHANNEL_GAINS[name][ch] * transients[i] for i, name in enumerate(names))
    position = _smooth_steps(n, fs, eye_times, eye_sizes, tau_s=0.015) + eye_excursions
    eog = sosfilt(butter(1, 0.16, btype="highpass", fs=fs, output="sos"), position)
    eog += 0.3 * (transients[1] + transients[2]) + rng.normal(0.0, 2.0, n)
    movement = _epoch_gain([1.0 if stage == "M" else 0.0 for stage in stages], fs, ramp_s=0.5)
    if movement.any():
        artefact = [
            60.0 * band_noise(n, fs, 0.5, 3.0, rng) + 15.0 * band_noise(n, fs, 20.0, 45.0, rng) for _ in range(3)
        ]
        eeg += movement * np.stack(artefact[:2])
        eog += movement * artefact[2]
    eeg *= np.asarray(subject.channel_gains, float)[:, None]  # the montage's gain of each derivation
    eeg += rng.normal(0.0, subject.sensor_noise_uv, eeg.shape)  # amplifier noise

    seconds = np.arange(len(stages) * EPOCH_S)
    per_second = np.repeat(list(stages), EPOCH_S)
    emg = subject.emg_uv * np.array([EMG_STAGE_GAIN[s] for s in per_second]) * rng.lognormal(0, 0.15, len(seconds))
    breathing = 500.0 * np.sin(2 * np.pi * subject.breathing_hz * seconds + rng.uniform(0, 6.3))
    asleep = np.cumsum([s not in "W?M" for s in per_second]) / max(1, sum(s not in "W?M" for s in per_second))
    temperature = subject.temperature_c - 0.3 * asleep + rng.normal(0.0, 0.01, len(seconds))
    signals = {"EEG Fpz-Cz": eeg[0], "EEG Pz-Oz": eeg[1], "EOG horizontal": eog}
    signals |= {"Resp oro-nasal": breathing + rng.normal(0.0, 40.0, len(seconds)), "EMG submental": emg}
    signals |= {"Temp rectal": temperature, "Event marker": np.zeros(len(seconds))}
    return signals


def _rhythms(subject: SleepSubject, scored: Sequence[str], fs: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """The two EEG derivations' band rhythms, gained per scored stage, plus pink background: (2, n) [µV]."""
    eeg = np.zeros((2, n))
    amplitudes = {"alpha": subject.alpha_uv, "beta": subject.beta_uv, "theta": subject.theta_uv}
    amplitudes["delta"] = subject.delta_uv
    bands = dict(BANDS_HZ, alpha=(subject.alpha_hz - 1.0, subject.alpha_hz + 1.0))
    for name, amplitude in amplitudes.items():
        gain = amplitude * _epoch_gain([STAGE_GAINS[name][s] for s in scored], fs)
        shared = band_noise(n, fs, *bands[name], rng)
        for ch in range(2):
            # alpha is one posterior generator seen by both derivations; the others are local to each
            rhythm = shared if name == "alpha" else band_noise(n, fs, *bands[name], rng)
            eeg[ch] += CHANNEL_GAINS[name][ch] * gain * rhythm
    for ch in range(2):
        eeg[ch] += subject.background_uv * pink_noise(n, fs, subject.background_exponent, rng)
    return eeg


def _transients(
    subject: SleepSubject, stages: str, fs: float, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, list[float], list[float], np.ndarray]:
    """Epoch by epoch: ``transients`` (4, n) [µV] (spindles, K-complexes, slow waves, sawtooth waves), eye movement
    step times [s] and sizes [µV], and slow eye excursions (n,) [µV]."""
    transients = np.zeros((4, n))  # spindles, K-complexes, slow waves, sawtooth waves (channel gain 1)
    eye_times, eye_sizes, eye_excursions = [], [], np.zeros(n)
    for k, stage in enumerate(stages):
        start, epoch = k * EPOCH_S, slice(k * EPOCH_S * fs, (k + 1) * EPOCH_S * fs)
        n_spindles = {"2": (2, 5), "3": (0, 2), "4": (0, 2)}.get(stage, (0, 0))
        for _ in range(int(rng.integers(n_spindles[0], n_spindles[1] + 1))):
            _add_at(transients[0], int((start + rng.uniform(0.5, EPOCH_S - 2.5)) * fs), _spindle(subject, fs, rng))
        n_kcomplexes = {"2": (1, 3), "3": (0, 1)}.get(stage, (0, 0))
        for _ in range(int(rng.integers(n_kcomplexes[0], n_kcomplexes[1] + 1))):
            t0 = start + rng.uniform(0.5, EPOCH_S - 3.5)
            wave = _kcomplex(subject, fs, rng)
            _add_at(transients[1], int(t0 * fs), wave)
            if rng.random() < 0.3:
                _add_at(transients[0], int((t0 + len(wave) / fs) * fs), _spindle(subject, fs, rng))
        if stage in SLOW_WAVE_COVERAGE:
            coverage = rng.uniform(*SLOW_WAVE_COVERAGE[stage])
            transients[2, epoch] += _slow_waves(EPOCH_S, coverage, subject.slow_wave_uv, fs, rng)
        if stage == "R":
            for _ in range(int(rng.integers(1, 3))):
                t0 = start + rng.uniform(0.5, EPOCH_S - 3.5)
                _add_at(transients[3], int(t0 * fs), _sawtooth_burst(subject, fs, rng))
            for _ in range(int(rng.integers(1, 4))):  # bursts of rapid eye movements
                t0 = start + rng.uniform(0.5, EPOCH_S - 6.5)
                for _ in range(int(rng.integers(2, 7))):
                    eye_times.append(t0)
                    eye_sizes.append(rng.choice([-1, 1]) * rng.uniform(50.0, 150.0))
                    t0 += rng.uniform(0.3, 1.0)
        elif stage in "W?":
            t0 = start + rng.uniform(0.0, 1.0)
            while t0 < start + EPOCH_S - 0.2:  # waking saccades
                eye_times.append(t0)
                eye_sizes.append(rng.choice([-1, 1]) * rng.uniform(20.0, 80.0))
                t0 += rng.uniform(0.8, 3.0)
        elif stage == "1":
            for _ in range(int(rng.integers(1, 3))):  # slow eye movements
                duration = rng.uniform(2.0, 6.0)
                t = np.arange(int(duration * fs)) / fs
                size = rng.choice([-1, 1]) * rng.uniform(50.0, 120.0)
                t0 = start + rng.uniform(0.0, EPOCH_S - duration)
                _add_at(eye_excursions, int(t0 * fs), size * np.sin(np.pi * t / duration) ** 2)
    return transients, eye_times, eye_sizes, eye_excursions

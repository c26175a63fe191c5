"""Generated sleep cohorts of other configurations (`workbench.domains.eeg.sleep_simulator.SleepCohort`): longer
nights for benchmarks whose folds score hundreds of windows, and another configuration (spectra, montage) for a backbone
pretrained apart from its test cohort (card eeg-lbm-lora-cohorts, benchmarks/eeg_lbm_lora.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import welch
from workbench.domains.eeg import sleep_simulator

from workbench.core.errors import UserError

FS = sleep_simulator.PSG_RATE_HZ
EPOCH = sleep_simulator.EPOCH_S * FS


def scored_epochs(hypnogram: str) -> int:
    """Epochs the Sleep-EDF reader keeps as W/N1/N2/N3/REM (not ``?`` nor movement time)."""
    return sum(stage in "W1234R" for stage in hypnogram)


def test_the_benchmark_cohort_has_30_subjects_of_at_least_50_scored_epochs():
    """30 nights of 5 cycles: 3 folds of 10 test subjects score ≥ 500 windows each."""
    subjects = sleep_simulator.draw_sleep_subjects(30, seed=11, cohort=sleep_simulator.SleepCohort(cycles=5))
    assert len(subjects) == 30 and len({s.subject for s in subjects}) == 30
    counts = [scored_epochs(s.hypnogram) for s in subjects]
    assert min(counts) >= 60, counts
    one_cycle = [scored_epochs(s.hypnogram) for s in sleep_simulator.draw_sleep_subjects(30, seed=11)]
    assert max(one_cycle) < 25  # the embedded configuration's compressed night
    # every cycle passes through N2, N3 (stages 3 and 4) and REM
    assert all(s.hypnogram.count("R") >= 5 * 3 and s.hypnogram.count("4") == 5 * 2 for s in subjects)


def test_the_default_configuration_draws_the_embedded_recipes():
    explicit = sleep_simulator.draw_sleep_subjects(6, seed=2026, cohort=sleep_simulator.SleepCohort())
    assert explicit == sleep_simulator.draw_sleep_subjects(6, seed=2026)
    assert all(s.channel_gains == (1.0, 1.0) and s.sensor_noise_uv == 0.5 for s in explicit)


def alpha_peak_hz(subject: sleep_simulator.SleepSubject) -> float:
    """The Pz-Oz spectral peak in 6–13 Hz over the subject's wake epochs, from the simulated night [Hz]."""
    night = simulate(subject)["EEG Pz-Oz"]
    wake = np.concatenate([night[k * EPOCH : (k + 1) * EPOCH] for k, s in enumerate(subject.hypnogram) if s == "W"])
    f, p = welch(wake, fs=FS, nperseg=8 * FS)
    band = (f >= 6) & (f <= 13)
    return float(f[band][np.argmax(p[band])])


def simulate(subject: sleep_simulator.SleepSubject) -> dict[str, np.ndarray]:
    """One short night (wake and N2 only) of ``subject``: its signals at seed 3."""
    from dataclasses import replace

    return sleep_simulator.simulate_night(replace(subject, hypnogram="WWWWWW2222"), seed=3)


def test_the_source_configuration_has_other_spectra_and_montage():
    """`SOURCE_SLEEP_COHORT` (the benchmark backbone's pretraining corpus) differs from the test cohort's in the
    simulated signals, not only in the recipes: slower wake alpha, more high-frequency amplifier noise, derivation
    gains that vary between subjects."""
    default = sleep_simulator.draw_sleep_subjects(4, seed=7)
    source = sleep_simulator.draw_sleep_subjects(4, seed=7, cohort=sleep_simulator.SOURCE_SLEEP_COHORT)
    peaks_default = [alpha_peak_hz(s) for s in default]
    peaks_source = [alpha_peak_hz(s) for s in source]
    assert np.mean(peaks_source) < np.mean(peaks_default) - 0.5, (peaks_source, peaks_default)
    assert max(peaks_source) <= 10.5 and min(peaks_default) >= 8.0
    # 40-49 Hz (above the rhythms' peaks): the 3 µV amplifier noise of the source configuration (0.18 µV²/Hz) lifts
    # a floor that the default's 1/f background and rhythm tails hold at ~0.08 µV²/Hz
    high = {}
    for name, subjects in (("default", default), ("source", source)):
        f, p = welch(np.stack([simulate(s)["EEG Fpz-Cz"] for s in subjects]), fs=FS, nperseg=2 * FS)
        high[name] = p[:, (f >= 40) & (f < 49)].mean()
    assert high["source"] > 2 * high["default"], high
    gains = np.array([s.channel_gains for s in source])
    assert gains.std() > 0.05 and not np.allclose(gains, 1.0)


def test_a_bad_cohort_is_refused_with_the_field_named():
    with pytest.raises(UserError, match="cycles"):
        sleep_simulator.SleepCohort(cycles=0)
    with pytest.raises(UserError, match="alpha_hz"):
        sleep_simulator.SleepCohort(alpha_hz=(11.0, 9.0))

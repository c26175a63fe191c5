"""Synthetic EEGMMIDB motor-imagery runs (card motor-imagery-synthetic): the subjects' recipes and a run's EEG.

A run is a sum of sensorimotor rhythms on top of 1/f background noise (`workbench.domains.eeg.noise`); amplitudes
are in µV, times in s. `workbench.domains.eeg.generate` writes the runs as EDF files.

Motor imagery (PhysioNet EEGMMIDB, runs 4/8/12: T1 left fist, T2 right fist; 6/10/14: T1 both fists, T2 both
feet; `simulate_run`): three sensorimotor sources (C3: right hand, C4: left hand, Cz: feet) carry a mu rhythm
band(f_μ ± 1) (f_μ ∈ 9–12.5 Hz per subject; Cz × 0.6) and a beta rhythm band(f_β ± 3) (f_β ∈ 17–23 Hz, × 0.4),
slowly modulated by exp(0.25·z(t)) (z: unit-RMS band noise of 0.02–0.2 Hz). During an imagery trial (cue at t_c, 4.1 s)
a source's rhythm power drops by d·r(t) — event-related desynchronisation (ERD) —

    amplitude × √(1 − d·r(t)),   r: 0 until t_c + 0.3 s, rising linearly to 1 at t_c + 1 s, 1 until the trial
                                 ends, back to 0 within 1 s;  beta: d × 0.8, then a rebound × (1 + 0.4·Hann)
                                 over 0.3–1.8 s after the trial,

where d = depth per trial: contralateral hand area full depth, ipsilateral 0.3 × (left fist → C4, right fist → C3);
both fists → C3 and C4; both feet → Cz, with a surround ERS (d = −0.2) at C3 and C4. Per trial
d = D_s · U(0.5, 1.5) clipped to 0.95, and 0 in a lapse (the subject did not imagine; probability L_s). Every
one of 9 source sites (the channel positions) adds its own 1/f background (5 µV), and a posterior alpha source
(at Pz, f_μ − 0.5 ± 1 Hz, 3–8 µV, unrelated to the task) mixes in. Volume conduction: channel i sees source j
with weight exp(−‖x_i − x_j‖²/2λ²) (positions x [cm]: `POSITIONS_CM`, MNE's standard_1020; λ ∈ 2–3.2 cm per
subject). Then each channel adds its own 1/f noise N_s and 0.5 µV white noise. ``difficulty`` ∈ [0, 1] sets
the mean ERD depth 0.75 − 0.6·difficulty and the sensor noise 2·(1 + 2·difficulty) µV (subject factors
lognormal(0, 0.3) and lognormal(0, 0.2)); `DEFAULT_DIFFICULTY` is tuned so that log mu/beta band power at every
channel + logistic regression, cross-validated across subjects, is well below 100 % on left vs right fist.

Deterministic: subject k uses ``numpy.random.SeedSequence([seed, 2, k, 0])`` for its recipe and
``[seed, 2, k, run]`` for the signals of each run.

Shapes: a run (9, n_seconds · 160) [µV].
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from workbench.domains.eeg.noise import band_noise, pink_noise

from workbench.core.errors import UserError

MI_RATE_HZ = 160
#: The written subset of EEGMMIDB's 64 channels (their spelling and order): the 3 × 3 grid around C3, Cz, C4.
#: Positions [cm] of the grid (and of Pz, the posterior alpha source) in MNE's standard_1020 montage.
POSITIONS_CM = {
    "FC3": (-6.02, 2.27, 5.55), "FCz": (0.04, 2.74, 8.87), "FC4": (6.23, 2.37, 5.56),
    "C3": (-6.54, -1.16, 6.44), "Cz": (0.04, -0.92, 10.02), "C4": (6.71, -1.09, 6.36),
    "CP3": (-6.36, -4.70, 6.56), "CPz": (0.04, -4.73, 9.94), "CP4": (6.66, -4.66, 6.56),
    "Pz": (0.03, -8.11, 8.26),
}  # fmt: skip
REST_S, TRIAL_S = 4.2, 4.1
#: EEGMMIDB imagery runs: T1 and T2 meaning per run.
RUN_TASKS = {
    run: ({"T1": "left fist", "T2": "right fist"} if run in (4, 8, 12) else {"T1": "both fists", "T2": "both feet"})
    for run in (4, 6, 8, 10, 12, 14)
}
#: ERD depth factor per (imagined movement, source C3 / C4 / Cz); negative: event-related synchronisation.
ERD_PATTERN = {
    "left fist": (0.3, 1.0, 0.0),
    "right fist": (1.0, 0.3, 0.0),
    "both fists": (1.0, 1.0, 0.0),
    "both feet": (-0.2, -0.2, 1.0),
}
DEFAULT_DIFFICULTY = 0.35


@dataclass(frozen=True)
class MotorImagerySubject:
    """One EEGMMIDB subject's rhythms, ERD and noise (module docstring).

    Args:
        subject: PhysioNet subject number (``S001`` is 1); runs: the imagery runs written (4, 6, 8, 10, 12, 14).
        trials_per_run: imagery trials per run (even: half T1, half T2; the real runs have 15).
        mu_hz, beta_hz: mu and beta peak frequencies [Hz]; mu_uv: mu RMS at the hand sources [µV].
        erd_depth: mean power drop D_s of a performed imagery trial (0–0.95); lapse_rate: share of trials with
            no ERD; spread_cm: volume-conduction length λ [cm]; noise_uv: sensor 1/f noise RMS N_s [µV];
        distractor_uv: posterior alpha RMS [µV]; start: first run's start (date, time) as ISO strings.
    """

    subject: int
    runs: tuple[int, ...]
    trials_per_run: int
    mu_hz: float
    beta_hz: float
    mu_uv: float
    erd_depth: float
    lapse_rate: float
    spread_cm: float
    noise_uv: float
    distractor_uv: float
    start: tuple[str, str]


def draw_motor_imagery_subjects(
    n_subjects: int,
    seed: int,
    *,
    runs: Sequence[int] = (4, 6),
    trials_per_run: int = 6,
    difficulty: float = DEFAULT_DIFFICULTY,
) -> tuple[MotorImagerySubject, ...]:
    """The recipes of subjects 1 … n_subjects (subject k from ``SeedSequence([seed, 2, k, 0])``).

    ``difficulty`` only rescales the same draws: ERD depth (0.75 − 0.6·difficulty)·lognormal(0, 0.3) clipped to
    0.05–0.95, sensor noise 2·(1 + 2·difficulty)·lognormal(0, 0.2) µV.
    """
    if not 0.0 <= difficulty <= 1.0:
        raise UserError(f"difficulty={difficulty}: expected a number in [0, 1] (0 easiest, 1 hardest)")
    if set(runs) - set(RUN_TASKS) or not runs:
        raise UserError(f"runs={tuple(runs)}: expected imagery runs among {sorted(RUN_TASKS)}")
    if trials_per_run < 2 or trials_per_run % 2:
        raise UserError(f"trials_per_run={trials_per_run}: expected an even number ≥ 2 (half T1, half T2)")
    if n_subjects < 1 or n_subjects > 109:
        raise UserError(f"subjects={n_subjects}: expected 1-109 (EEGMMIDB's subjects S001-S109)")
    recipes = []
    for k in range(1, n_subjects + 1):
        rng = np.random.default_rng(np.random.SeedSequence([seed, 2, k, 0]))
        depth_z, noise_z = rng.standard_normal(2)
        session = datetime.timedelta(days=int(k), minutes=int(rng.integers(0, 480)))
        start = datetime.datetime(2009, 8, 12, 9, 0) + session
        recipes.append(
            MotorImagerySubject(
                subject=k,
                runs=tuple(sorted(runs)),
                trials_per_run=trials_per_run,
                mu_hz=round(float(rng.uniform(9.0, 12.5)), 2),
                beta_hz=round(float(rng.uniform(17.0, 23.0)), 2),
                mu_uv=round(float(rng.uniform(6.0, 11.0)), 2),
                erd_depth=round(float(np.clip((0.75 - 0.6 * difficulty) * np.exp(0.3 * depth_z), 0.05, 0.95)), 3),
                lapse_rate=round(float(rng.uniform(0.0, 0.25)), 3),
                spread_cm=round(float(rng.uniform(2.0, 3.2)), 2),
                noise_uv=round(float(2.0 * (1 + 2 * difficulty) * np.exp(0.2 * noise_z)), 2),
                distractor_uv=round(float(rng.uniform(3.0, 8.0)), 2),
                start=(start.date().isoformat(), start.time().isoformat(timespec="seconds")),
            )
        )
    return tuple(recipes)


def _erd_ramp(t: np.ndarray, cue_s: float) -> np.ndarray:
    """r(t): 0 until cue + 0.3 s, 1 from cue + 1 s to the trial's end, back to 0 within 1 s. Shapes: like t."""
    end = cue_s + TRIAL_S
    return np.interp(t, [cue_s + 0.3, cue_s + 1.0, end, end + 1.0], [0.0, 1.0, 1.0, 0.0])


def simulate_run(
    subject: MotorImagerySubject, run: int, seed: int
) -> tuple[np.ndarray, list[tuple[float, float, str]]]:
    """One imagery run (module docstring): the EEG of the 3 × 3 grid of `POSITIONS_CM` (the file's channels
    `workbench.domains.eeg.generate.MI_CHANNELS`, in this order) and its annotations.

    Returns:
        eeg (9, n_seconds · 160) [µV] and (onset [s], duration [s], "T0" | "T1" | "T2") for each segment:
        T0 rest 4.2 s and imagery 4.1 s alternating, starting with rest; the file ends at the next whole second.
    """
    if run not in RUN_TASKS:
        raise UserError(f"run {run}: expected an imagery run among {sorted(RUN_TASKS)}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 2, subject.subject, run]))
    fs, n_trials = MI_RATE_HZ, subject.trials_per_run
    codes = rng.permutation(["T1"] * (n_trials // 2) + ["T2"] * (n_trials // 2))
    annotations = []
    for k, code in enumerate(codes):
        t0 = k * (REST_S + TRIAL_S)
        annotations += [(round(t0, 3), REST_S, "T0"), (round(t0 + REST_S, 3), TRIAL_S, str(code))]
    n = int(math.ceil(n_trials * (REST_S + TRIAL_S) - 1e-9)) * fs
    t = np.arange(n) / fs

    # amplitude and power factors of the C3, C4 and Cz rhythms
    mu_depth, beta_depth, rebound = np.zeros((3, n)), np.zeros((3, n)), np.zeros((3, n))
    for onset, _, code in annotations:
        if code == "T0":
            continue
        depth = 0.0 if rng.random() < subject.lapse_rate else min(0.95, subject.erd_depth * rng.uniform(0.5, 1.5))
        ramp = _erd_ramp(t, onset)
        bump = np.sin(np.pi * np.clip((t - onset - TRIAL_S - 0.3) / 1.5, 0.0, 1.0)) ** 2  # Hann, 0.3-1.8 s after
        for source, factor in enumerate(ERD_PATTERN[RUN_TASKS[run][code]]):
            mu_depth[source] += depth * factor * ramp
            beta_depth[source] += 0.8 * depth * factor * ramp
            rebound[source] += 0.4 * depth * max(factor, 0.0) * bump

    names = [name for name in POSITIONS_CM if name != "Pz"]
    sources = np.stack([5.0 * pink_noise(n, fs, 1.0, rng) for _ in names])  # local background at each site
    for source, (name, scale) in enumerate((("C3", 1.0), ("C4", 1.0), ("Cz", 0.6))):
        slow = np.exp(0.25 * band_noise(n, fs, 0.02, 0.2, rng))
        mu = subject.mu_uv * scale * slow * band_noise(n, fs, subject.mu_hz - 1.0, subject.mu_hz + 1.0, rng)
        beta = 0.4 * subject.mu_uv * scale * slow * band_noise(n, fs, subject.beta_hz - 3.0, subject.beta_hz + 3.0, rng)
        sources[names.index(name)] += mu * np.sqrt(1.0 - mu_depth[source])
        sources[names.index(name)] += beta * np.sqrt(1.0 - beta_depth[source]) * (1.0 + rebound[source])
    alpha_hz = subject.mu_hz - 0.5
    distractor = subject.distractor_uv * np.exp(0.4 * band_noise(n, fs, 0.02, 0.2, rng))
    distractor *= band_noise(n, fs, alpha_hz - 1.0, alpha_hz + 1.0, rng)

    positions = {name: np.array(xyz) for name, xyz in POSITIONS_CM.items()}
    eeg = np.zeros((len(names), n))
    for i, channel in enumerate(names):
        for j, source in enumerate(names + ["Pz"]):
            squared = float(((positions[channel] - positions[source]) ** 2).sum())
            weight = math.exp(-squared / (2 * subject.spread_cm**2))
            eeg[i] += weight * (sources[j] if source != "Pz" else distractor)
        eeg[i] += subject.noise_uv * pink_noise(n, fs, 1.0, rng) + rng.normal(0.0, 0.5, n)
    return eeg, annotations

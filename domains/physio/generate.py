"""Synthetic multi-site ambulatory ECG with annotated beats, written as WFDB records (card ``physio-synthetic``).

Each site is a recording setting — its own sampling rate, noise, baseline wander, heart rates, RR irregularity,
ectopic-beat rates — and each subject one record of lead MLII with reference beat annotations (``.atr``), in
MIT-BIH's layout so that `workbench.domains.physio.read_beat_folder` reads it unchanged.

Beat shapes come from ECGSYN (McSharry et al., IEEE TBME 50(3), 2003, through neurokit2's ``ecg_simulate``), whose
five Gaussian waves P, Q, R, S, T are set per beat type by their angles ``ti`` [°], heights ``ai`` and widths
``bi``:

    ====  ===============================================  =========================================
    type  morphology (changes from the normal beat)         timing
    ====  ===============================================  =========================================
    N     ti (−70, −15, 0, 15, 100), ai (1.2, −5, 30,       the subject's RR process
          −7.5, 0.75), bi (0.25, 0.1, 0.1, 0.1, 0.4),
          heights × U(0.85, 1.15) per subject
    S     ectopic P: inverted (ai_P −0.6), earlier           premature: RR × U(0.62, 0.8); the next
          (ti_P −55); normal QRS and T                       interval resets (non-compensatory)
    V     no P; QRS 2.5–3× wider (bi_Q,R,S 0.25–0.3),        premature: RR × U(0.6, 0.75); a full
          deep S; discordant inverted T (ai_T −2.2)          compensatory pause (RR_before + RR_after
                                                             = 2 RR)
    F     half N, half V (fusion of the two activations)     RR × U(0.9, 1.0)
    ====  ===============================================  =========================================

One template per type and subject (ECGSYN at 60 bpm, no noise, its R peak found on the signal, the baseline
between its ends removed, R scaled to the subject's amplitude in mV) is placed at every R peak of the record:
RR intervals from an AR(1) process around the subject's mean rate (sd ``rr_irregularity`` of the mean RR), beat
amplitudes modulated by respiration (± 8 % at 0.2–0.3 Hz) and by 4 % beat-to-beat noise. Then the site's
recording: baseline wander (three sinusoids of 0.1–0.5 Hz, the site's ``wander_mv`` in all), muscle noise (white
Gaussian, the site's ``noise_mv`` RMS) and mains hum (50 or 60 Hz, ``hum_mv`` peak), digitised as MIT-BIH is
(format 212, 200 adu/mV, baseline 1024: 11 bits over ±5.12 mV).

Annotation symbols are MIT-BIH's: ``N``, ``A`` (atrial premature, AAMI S), ``V``, ``F``. ``generator.json`` keeps
every recipe; a record depends only on the seed and its recipe.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from workbench.core.checkpoint import atomic_folder
from workbench.core.errors import UserError

#: ECGSYN's normal beat (neurokit2's defaults): angles [°], heights and widths of P, Q, R, S, T.
NORMAL_WAVES = {
    "ti": (-70.0, -15.0, 0.0, 15.0, 100.0),
    "ai": (1.2, -5.0, 30.0, -7.5, 0.75),
    "bi": (0.25, 0.1, 0.1, 0.1, 0.4),
}
#: Beat type -> MIT-BIH annotation symbol.
SYMBOLS = {"N": "N", "S": "A", "V": "V", "F": "F"}
#: Template window around the R peak [s].
TEMPLATE_BEFORE_S, TEMPLATE_AFTER_S = 0.4, 0.6
ADC_GAIN, ADC_BASELINE = 200.0, 1024


@dataclass(frozen=True)
class Site:
    """A recording site: rate [Hz], noise RMS, baseline wander and mains hum [mV], mains frequency [Hz], the range
    of its subjects' mean heart rates [bpm], RR irregularity (sd of RR over its mean), ectopic-beat rates per beat
    (S, V, F; each subject's drawn around them) and the record length [s]."""

    name: str
    fs_hz: float
    noise_mv: float
    wander_mv: float
    hum_mv: float
    mains_hz: float
    heart_rate_bpm: tuple[float, float]
    rr_irregularity: float
    ectopic_rates: tuple[float, float, float]
    duration_s: float = 120.0


#: The embedded sites: a Holter lab (MIT-BIH-like), an ambulance monitor, a cardiology ward at 500 Hz, a
#: wearable patch at 250 Hz. Sites differ in everything a new hospital's data differs in.
SITES = (
    Site("A", 360.0, 0.02, 0.15, 0.01, 60.0, (60, 85), 0.04, (0.03, 0.05, 0.01)),
    Site("B", 250.0, 0.06, 0.35, 0.03, 50.0, (75, 105), 0.06, (0.06, 0.02, 0.005)),
    Site("C", 500.0, 0.015, 0.1, 0.005, 50.0, (55, 80), 0.03, (0.02, 0.10, 0.02)),
    Site("D", 250.0, 0.08, 0.5, 0.02, 60.0, (65, 95), 0.12, (0.08, 0.04, 0.005)),
)


@dataclass(frozen=True)
class Subject:
    """One subject's record: site, number k within the site, id (the record name), mean heart rate [bpm], R
    amplitude [mV], wave-height factors of P, Q, R, S, T (× ECGSYN's), its ectopic rates (S, V, F) per beat and
    respiration rate [Hz]."""

    site: str
    number: int
    subject: str
    heart_rate_bpm: float
    r_mv: float
    wave_factors: tuple[float, float, float, float, float]
    ectopic_rates: tuple[float, float, float]
    respiration_hz: float


def _rng(seed: int, site: str, k: int, stream: int) -> np.random.Generator:
    """Subject k of ``site``: stream 0 draws its recipe, stream 1 its record."""
    return np.random.default_rng(np.random.SeedSequence([seed, *site.encode(), k, stream]))


def draw_subjects(site: Site, n_subjects: int, seed: int) -> tuple[Subject, ...]:
    """The recipes of a site's subjects (subject k from ``SeedSequence([seed, *site name bytes, k, 0])``)."""
    subjects = []
    for k in range(n_subjects):
        rng = _rng(seed, site.name, k, 0)
        rates = tuple(round(float(r * rng.lognormal(0.0, 0.5)), 4) for r in site.ectopic_rates)
        subjects.append(
            Subject(
                site=site.name,
                number=k,
                subject=f"{site.name}{k + 1:02d}",
                heart_rate_bpm=round(float(rng.uniform(*site.heart_rate_bpm)), 1),
                r_mv=round(float(rng.uniform(0.9, 1.6)), 3),
                wave_factors=tuple(round(float(f), 3) for f in rng.uniform(0.85, 1.15, 5)),
                ectopic_rates=rates,
                respiration_hz=round(float(rng.uniform(0.2, 0.3)), 3),
            )
        )
    return tuple(subjects)


def _waves(kind: str, factors: Sequence[float]) -> dict[str, tuple[float, ...]]:
    """ECGSYN's wave parameters of a beat type (see the module docstring)."""
    ti, ai, bi = (list(NORMAL_WAVES[k]) for k in ("ti", "ai", "bi"))
    ai = [a * f for a, f in zip(ai, factors)]
    if kind == "S":
        ti[0], ai[0] = -55.0, -0.6
    elif kind == "V":
        ti, ai, bi = [-70.0, -20.0, 0.0, 25.0, 110.0], [0.0, -4.0, 24.0, -14.0, -2.2], [0.25, 0.25, 0.28, 0.25, 0.5]
    return {"ti": tuple(ti), "ai": tuple(ai), "bi": tuple(bi)}


def beat_templates(subject: Subject, fs_hz: float, seed: int) -> dict[str, np.ndarray]:
    """One template per beat type, ``TEMPLATE_BEFORE_S`` before to ``TEMPLATE_AFTER_S`` after its R peak [mV]."""
    import neurokit2 as nk

    before, after = round(TEMPLATE_BEFORE_S * fs_hz), round(TEMPLATE_AFTER_S * fs_hz)
    shapes = {}
    for kind in ("N", "S", "V"):
        ecg = nk.ecg_simulate(duration=6, sampling_rate=fs_hz, heart_rate=60, heart_rate_std=0, noise=0,
                              method="ecgsyn", random_state=seed, **_waves(kind, subject.wave_factors))  # fmt: skip
        middle = slice(int(2 * fs_hz), int(4 * fs_hz))
        r = middle.start + int(np.argmax(np.abs(ecg[middle] - np.median(ecg))))
        beat = ecg[r - before : r + after]
        ends = np.r_[beat[: max(2, len(beat) // 40)], beat[-max(2, len(beat) // 40) :]].mean()
        shapes[kind] = beat - ends
    scale = subject.r_mv / shapes["N"][before]
    templates = {kind: shape * scale for kind, shape in shapes.items()}
    templates["V"] = templates["V"] * 1.4  # ventricular beats: larger than normal ones
    templates["F"] = 0.5 * (templates["N"] + templates["V"])
    return templates


def beat_sequence(subject: Subject, site: Site, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """R-peak times [s] and beat types over the record (see the module docstring's timing column)."""
    mean_rr = 60.0 / subject.heart_rate_bpm
    p_s, p_v, p_f = subject.ectopic_rates
    times, kinds, t, state, pause = [], [], 0.5, 0.0, None
    while t < site.duration_s - TEMPLATE_AFTER_S - 0.1:
        state = 0.8 * state + np.sqrt(1 - 0.8**2) * rng.normal()
        normal_rr = mean_rr * (1 + site.rr_irregularity * state)
        draw = rng.random()
        if pause is not None:
            kind, rr, pause = "N", pause, None
        elif draw < p_s:
            kind, rr = "S", normal_rr * rng.uniform(0.62, 0.8)
        elif draw < p_s + p_v:
            kind, rr = "V", normal_rr * rng.uniform(0.6, 0.75)
            pause = 2 * normal_rr - rr  # full compensatory pause
        elif draw < p_s + p_v + p_f:
            kind, rr = "F", normal_rr * rng.uniform(0.9, 1.0)
        else:
            kind, rr = "N", normal_rr
        t += rr
        times.append(t)
        kinds.append(kind)
    return np.array(times[:-1]), kinds[:-1]


def simulate_record(subject: Subject, site: Site, seed: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(MLII [mV] (n_samples,), R-peak samples (n_beats,), beat types) of one subject's record."""
    rng = _rng(seed, site.name, subject.number, 1)
    templates = beat_templates(subject, site.fs_hz, seed)
    times, kinds = beat_sequence(subject, site, rng)
    return render_record(templates, times, kinds, subject, site, rng)


def render_record(
    templates: dict[str, np.ndarray], times: np.ndarray, kinds: list[str], subject, site, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(MLII [mV] (n_samples,), R-peak samples (n_beats,), beat types): each beat type's template (``TEMPLATE_BEFORE_S``
    before its R peak) placed at its R-peak time [s], modulated by respiration (``subject.respiration_hz``) and
    beat-to-beat noise, plus the ``site``'s baseline wander, mains hum and muscle noise (``fs_hz``, ``duration_s``,
    ``wander_mv``, ``hum_mv``, ``mains_hz``, ``noise_mv``), every random draw from ``rng``."""
    fs = site.fs_hz
    n = int(round(site.duration_s * fs))
    before = round(TEMPLATE_BEFORE_S * fs)
    t = np.arange(n) / fs
    breathing = 1 + 0.08 * np.sin(2 * np.pi * subject.respiration_hz * t + rng.uniform(0, 2 * np.pi))
    ecg = np.zeros(n)
    peaks = np.round(times * fs).astype(np.int64)
    taper = np.hanning(2 * max(2, round(0.05 * fs)))
    for peak, kind in zip(peaks, kinds):
        beat = templates[kind] * breathing[peak] * (1 + 0.04 * rng.normal())
        start = peak - before
        window = np.ones(len(beat))
        window[: len(taper) // 2], window[-(len(taper) // 2) :] = taper[: len(taper) // 2], taper[len(taper) // 2 :]
        lo, hi = max(start, 0), min(start + len(beat), n)
        ecg[lo:hi] += (beat * window)[lo - start : hi - start]
    wander = sum(
        site.wander_mv / 3 * np.sin(2 * np.pi * rng.uniform(0.1, 0.5) * t + rng.uniform(0, 2 * np.pi)) for _ in range(3)
    )
    hum = site.hum_mv * np.sin(2 * np.pi * site.mains_hz * t + rng.uniform(0, 2 * np.pi))
    ecg = ecg + wander + hum + site.noise_mv * rng.normal(size=n)
    return np.clip(ecg, -5.0, 5.0), peaks, kinds


def _write_record(folder: Path, subject: Subject, site: Site, seed: int) -> dict[str, int]:
    return write_wfdb(folder, subject.subject, site.name, site.fs_hz, *simulate_record(subject, site, seed))


def write_wfdb(
    folder: Path, record: str, site_name: str, fs_hz: float, ecg: np.ndarray, peaks: np.ndarray, kinds: list[str]
) -> dict[str, int]:
    """Write one record (lead MLII [mV], format 212) and its beat annotations; returns the beats of each type."""
    import wfdb

    digital = np.clip(np.round(ecg * ADC_GAIN) + ADC_BASELINE, 0, 2047).astype(np.int64)[:, None]
    comments = [f"subject: {record}", f"site: {site_name}", "synthetic (workbench physio generator)"]
    wfdb.wrsamp(record, fs=fs_hz, units=["mV"], sig_name=["MLII"], d_signal=digital, fmt=["212"],
                adc_gain=[ADC_GAIN], baseline=[ADC_BASELINE], comments=comments, write_dir=str(folder))  # fmt: skip
    wfdb.wrann(record, "atr", peaks, symbol=[SYMBOLS[k] for k in kinds], fs=fs_hz, write_dir=str(folder))
    return {kind: kinds.count(kind) for kind in SYMBOLS}


def generate_physio_sites(
    out_dir: str | Path,
    *,
    seed: int = 2026,
    subjects_per_site: int = 6,
    sites: Sequence[Site] = SITES,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write the synthetic sites (``<site>/<subject>.hea|.dat|.atr``, ``generator.json``) to ``out_dir``.

    Args:
        out_dir: the folder to create.
        seed: the one seed of every random choice.
        subjects_per_site: records (= subjects) per site (6 × 4 sites × 2 min: about 1.7 MB).
        sites: the recording sites (default `SITES`).
        overwrite: replace an existing ``out_dir``.
        progress: a progress bar.
    """
    import neurokit2
    import wfdb

    if subjects_per_site < 1:
        raise UserError(f"subjects_per_site must be at least 1, got {subjects_per_site}")
    recipes = {site.name: draw_subjects(site, subjects_per_site, seed) for site in sites}
    summary = {
        "generator": "workbench.domains.physio.generate.generate_physio_sites",
        "seed": seed,
        "neurokit2": neurokit2.__version__,
        "wfdb": wfdb.__version__,
        "numpy": np.__version__,
        "sites": [asdict(site) for site in sites],
        "subjects": [],
    }
    with atomic_folder(out_dir, overwrite) as work:
        jobs = [(site, subject) for site in sites for subject in recipes[site.name]]
        for site, subject in tqdm(jobs, desc="synthetic ECG records", unit="record", disable=not progress):
            folder = work / f"site-{site.name}"
            folder.mkdir(exist_ok=True)
            counts = _write_record(folder, subject, site, seed)
            summary["subjects"].append({**asdict(subject), "beats": counts})
        (work / "generator.json").write_text(json.dumps(summary, indent=2) + "\n")
    return Path(out_dir)


def sites_from_json(path: str | Path) -> tuple[int, tuple[Site, ...]]:
    """The seed and sites of a set's ``generator.json`` (to regenerate it or part of it)."""
    recipe = json.loads(Path(path).read_text())
    sites = tuple(
        Site(**dict(site, heart_rate_bpm=tuple(site["heart_rate_bpm"]), ectopic_rates=tuple(site["ectopic_rates"])))
        for site in recipe["sites"]
    )
    return recipe["seed"], sites

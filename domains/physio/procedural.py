"""Procedural ECG sites drawn from continuous morphology and recording parameters (card ``physio-procedural``).

PhysioPFM's problem needs sites whose beats differ in *shape*, not only in noise and rate: the embedded sites
(`workbench.domains.physio.generate`) share one set of ECGSYN waves, so after z-scoring the best bank entry is
already right. Here every site is a point in a parameter space (`RANGES`) and every patient draws its own
morphology around its site's (`PATIENT_SPREAD`):

    ================  ==========================================================  ==================
    parameter         meaning (ECGSYN waves P, Q, R, S, T of McSharry et al. 2003)  range
    ================  ==========================================================  ==================
    axis_deg          frontal electrical axis [°]; lead II (+60°) sees R × (0.3 +   -30 .. 110
                      0.7 c) and S × (1 + 1.5 (1 − c)), c = cos(axis − 60°)
    qrs_width         width factor of Q, R, S (narrow → bundle-branch-like)         0.8 .. 1.7
    p_height          P-wave height factor                                          0.3 .. 1.6
    p_width           P-wave width factor (P mitrale when wide)                     0.8 .. 1.6
    t_height          T-wave height factor (flat → tall)                            0.3 .. 1.5
    v_width           width factor of the ventricular ectopic QRS                   0.8 .. 1.3
    fusion            share of the ventricular activation in a fusion beat          0.35 .. 0.65
    rate S, V, F      ectopic beats per beat (each patient's lognormal around)      S, V 0.03 .. 0.09;
                                                                                    F 0.025 .. 0.05
    heart_rate_bpm    mean heart rate [bpm]                                         55 .. 105
    rr_irregularity   sd of RR over its mean                                        0.02 .. 0.12
    noise_mv          muscle noise RMS [mV]                                         0.01 .. 0.10
    wander_mv         baseline wander [mV]                                          0.05 .. 0.45
    fs_hz             sampling rate [Hz]                                            250, 360, 500
    ================  ==========================================================  ==================

Bank sites lie on a grid (`grid_sites`: axis × QRS width × P height × T height, 3 × 3 × 2 × 2 = 36 sites; their
other parameters drawn from `RANGES`); target sites (`target_sites`) are drawn uniformly from `RANGES` and kept only
when every gridded parameter is at least `OFF_GRID_GAP` grid steps away from every grid value (off the grid).
Each patient's record is long enough (``duration_s``, default 150 s) and its beat sequence redrawn (next random
stream) until it holds at least `MIN_ECTOPIC` beats of each of S, V, F — so every pair of patients holds all four
classes with at least 2 × `MIN_ECTOPIC` F beats. Beat placement, respiration, noise and digitisation are the
embedded generator's (`workbench.domains.physio.generate.render_record`, `write_wfdb`).

Shapes: a record (n_samples,) [mV]; R peaks (n_beats,) [samples].
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm
from workbench.domains.physio.generate import (
    NORMAL_WAVES,
    TEMPLATE_AFTER_S,
    TEMPLATE_BEFORE_S,
    beat_sequence,
    render_record,
    write_wfdb,
)

from workbench.core.checkpoint import atomic_folder
from workbench.core.errors import UserError

#: Every site parameter's range (continuous ones: low, high; ``fs_hz``: the rates drawn from).
RANGES = {
    "axis_deg": (-30.0, 110.0),
    "qrs_width": (0.8, 1.7),
    "p_height": (0.3, 1.6),
    "p_width": (0.8, 1.6),
    "t_height": (0.3, 1.5),
    "v_width": (0.8, 1.3),
    "fusion": (0.35, 0.65),
    "rate_s": (0.03, 0.09),
    "rate_v": (0.03, 0.09),
    "rate_f": (0.025, 0.05),
    "heart_rate_bpm": (55.0, 105.0),
    "rr_irregularity": (0.02, 0.12),
    "noise_mv": (0.01, 0.10),
    "wander_mv": (0.05, 0.45),
}
SAMPLING_RATES_HZ = (250.0, 360.0, 500.0)
#: The bank's grid: values of the gridded parameters (the others drawn per site).
GRID = {
    "axis_deg": (-10.0, 45.0, 95.0),
    "qrs_width": (0.9, 1.25, 1.6),
    "p_height": (0.5, 1.35),
    "t_height": (0.5, 1.3),
}
#: A target's gridded parameters keep at least this share of the grid step from every grid value.
OFF_GRID_GAP = 0.2
#: A patient's spread around its site: (kind, scale) — "add": + N(0, scale); "mul": × exp(N(0, scale)).
PATIENT_SPREAD = {
    "axis_deg": ("add", 8.0),
    "qrs_width": ("mul", 0.06),
    "p_height": ("mul", 0.12),
    "p_width": ("mul", 0.06),
    "t_height": ("mul", 0.12),
    "v_width": ("mul", 0.05),
    "fusion": ("add", 0.04),
    "rate_s": ("mul", 0.3),
    "rate_v": ("mul", 0.3),
    "rate_f": ("mul", 0.3),
    "heart_rate_bpm": ("add", 6.0),
}
#: Beats of each of S, V, F every patient's record holds at least.
MIN_ECTOPIC = 3
SEED = 2027


@dataclass(frozen=True)
class ProceduralSite:
    """A site: its name, rate [Hz], record length [s], mains [Hz] and hum [mV], and its parameters (`RANGES`)."""

    name: str
    fs_hz: float
    params: dict
    duration_s: float = 150.0
    mains_hz: float = 50.0
    hum_mv: float = 0.01

    # the attributes `generate.beat_sequence` and `generate.render_record` read
    @property
    def rr_irregularity(self) -> float:
        return self.params["rr_irregularity"]

    @property
    def noise_mv(self) -> float:
        return self.params["noise_mv"]

    @property
    def wander_mv(self) -> float:
        return self.params["wander_mv"]


@dataclass(frozen=True)
class Patient:
    """One patient: record name, number within its site, own parameters (drawn around the site's), R amplitude
    [mV], respiration [Hz]."""

    subject: str
    number: int
    params: dict
    r_mv: float
    respiration_hz: float

    @property
    def heart_rate_bpm(self) -> float:
        return self.params["heart_rate_bpm"]

    @property
    def ectopic_rates(self) -> tuple[float, float, float]:
        return (self.params["rate_s"], self.params["rate_v"], self.params["rate_f"])


def _draw_site(name: str, rng: np.random.Generator, fixed: dict, duration_s: float) -> ProceduralSite:
    params = {key: round(float(rng.uniform(low, high)), 4) for key, (low, high) in RANGES.items()}
    params.update(fixed)
    return ProceduralSite(name, float(rng.choice(SAMPLING_RATES_HZ)), params, duration_s,
                          float(rng.choice((50.0, 60.0))), round(float(rng.uniform(0.0, 0.03)), 4))  # fmt: skip


def grid_sites(seed: int = SEED, duration_s: float = 150.0) -> tuple[ProceduralSite, ...]:
    """The bank's 36 sites ``G01``..``G36``: every combination of `GRID`, the other parameters drawn from `RANGES`."""
    names = list(GRID)
    sites = []
    for number, values in enumerate(itertools.product(*GRID.values())):
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0, number]))
        sites.append(_draw_site(f"G{number + 1:02d}", rng, dict(zip(names, values)), duration_s))
    return tuple(sites)


def is_off_grid(params: dict) -> bool:
    """Whether every gridded parameter keeps `OFF_GRID_GAP` grid steps from every grid value."""
    for key, values in GRID.items():
        step = min(np.diff(sorted(values)))
        if min(abs(params[key] - v) for v in values) < OFF_GRID_GAP * step:
            return False
    return True


def target_sites(n_sites: int = 4, seed: int = SEED, duration_s: float = 150.0) -> tuple[ProceduralSite, ...]:
    """``n_sites`` target sites ``T1``.. drawn uniformly from `RANGES` and off the grid (`is_off_grid`)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    sites = []
    while len(sites) < n_sites:
        site = _draw_site(f"T{len(sites) + 1}", rng, {}, duration_s)
        if is_off_grid(site.params):
            sites.append(site)
    return tuple(sites)


def draw_patients(site: ProceduralSite, n_patients: int, seed: int = SEED) -> tuple[Patient, ...]:
    """The site's patients (record names ``<site><k>``, k = 1..), each parameter spread by `PATIENT_SPREAD` and
    clipped to `RANGES`."""
    patients = []
    for k in range(n_patients):
        rng = np.random.default_rng(np.random.SeedSequence([seed, 2, *site.name.encode(), k]))
        params = dict(site.params)
        for key, (kind, scale) in PATIENT_SPREAD.items():
            value = params[key] + rng.normal(0, scale) if kind == "add" else params[key] * np.exp(rng.normal(0, scale))
            params[key] = round(float(np.clip(value, *RANGES[key])), 4)
        patients.append(Patient(f"{site.name}{k + 1:02d}", k, params, round(float(rng.uniform(0.9, 1.6)), 3),
                                round(float(rng.uniform(0.2, 0.3)), 3)))  # fmt: skip
    return tuple(patients)


def waves(kind: str, params: dict) -> dict[str, tuple[float, ...]]:
    """ECGSYN's angles ``ti`` [°], heights ``ai`` and widths ``bi`` of P, Q, R, S, T for a beat type (N, S, V) of a
    patient with ``params`` (see the module docstring)."""
    ti, ai, bi = (list(NORMAL_WAVES[k]) for k in ("ti", "ai", "bi"))
    lead = np.cos(np.radians(params["axis_deg"] - 60.0))
    ai[0] *= params["p_height"]
    bi[0] *= params["p_width"]
    ai[1] *= 1 + 0.5 * (1 - lead)
    ai[2] *= 0.3 + 0.7 * lead
    ai[3] *= 1 + 1.5 * (1 - lead)
    ai[4] *= params["t_height"]
    for i in (1, 2, 3):
        bi[i] *= params["qrs_width"]
    if kind == "S":  # ectopic atrial focus: inverted, earlier P
        ti[0], ai[0] = -55.0, -0.5 * params["p_height"]
    elif kind == "V":  # no P, wide QRS, deep S, discordant T
        w = params["v_width"]
        ti, ai = [-70.0, -20.0, 0.0, 25.0, 110.0], [0.0, -4.0, 24.0 * (0.5 + 0.5 * lead), -14.0, -2.2]
        bi = [0.25, 0.25 * w, 0.28 * w, 0.25 * w, 0.5]
    return {"ti": tuple(ti), "ai": tuple(ai), "bi": tuple(bi)}


def templates_of(patient: Patient, fs_hz: float, seed: int = SEED) -> dict[str, np.ndarray]:
    """One template [mV] per beat type (N, S, V, F), ``TEMPLATE_BEFORE_S`` before to ``TEMPLATE_AFTER_S`` after R."""
    import neurokit2 as nk

    before, after = round(TEMPLATE_BEFORE_S * fs_hz), round(TEMPLATE_AFTER_S * fs_hz)
    shapes = {}
    for kind in ("N", "S", "V"):
        ecg = nk.ecg_simulate(duration=6, sampling_rate=fs_hz, heart_rate=60, heart_rate_std=0, noise=0,
                              method="ecgsyn", random_state=seed, **waves(kind, patient.params))  # fmt: skip
        middle = slice(int(2 * fs_hz), int(4 * fs_hz))
        r = middle.start + int(np.argmax(np.abs(ecg[middle] - np.median(ecg))))
        beat = ecg[r - before : r + after]
        edge = max(2, len(beat) // 40)
        shapes[kind] = beat - np.r_[beat[:edge], beat[-edge:]].mean()
    scale = patient.r_mv / max(abs(shapes["N"][before]), 1e-3)
    templates = {kind: shape * scale for kind, shape in shapes.items()}
    templates["V"] = templates["V"] * 1.4
    f = patient.params["fusion"]
    templates["F"] = (1 - f) * templates["N"] + f * templates["V"]
    return templates


def simulate_patient(site: ProceduralSite, patient: Patient, seed: int = SEED):
    """(MLII [mV] (n_samples,), R-peak samples (n_beats,), beat types, attempts): the beat sequence redrawn (random
    stream 0, 1, ...) until it holds `MIN_ECTOPIC` beats of each of S, V, F.

    Raises:
        UserError: no such sequence in 200 attempts (a record too short for its ectopic rates).
    """
    templates = templates_of(patient, site.fs_hz, seed)
    for attempt in range(200):
        rng = np.random.default_rng(np.random.SeedSequence([seed, 3, *site.name.encode(), patient.number, attempt]))
        times, kinds = beat_sequence(patient, site, rng)
        if all(kinds.count(kind) >= MIN_ECTOPIC for kind in "SVF"):
            return (*render_record(templates, times, kinds, patient, site, rng), attempt)
    raise UserError(f"site {site.name}, patient {patient.subject}: no {site.duration_s:g}-s record with "
                    f"{MIN_ECTOPIC} beats of each of S, V, F in 200 draws (lengthen duration_s)")  # fmt: skip


def generate_procedural_sites(
    out_dir: str | Path,
    sites: Sequence[ProceduralSite],
    patients_per_site: int,
    *,
    seed: int = SEED,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write ``site-<name>/<record>.hea|.dat|.atr`` for every site and ``generator.json`` (every site's and
    patient's parameters, beat counts, redraws) to ``out_dir``, in the embedded sites' WFDB layout."""
    import neurokit2
    import wfdb

    if patients_per_site < 2:
        raise UserError(f"patients_per_site must be at least 2 (a labelled pair), got {patients_per_site}")
    summary = {"generator": "workbench.domains.physio.procedural.generate_procedural_sites", "seed": seed,
               "neurokit2": neurokit2.__version__, "wfdb": wfdb.__version__, "numpy": np.__version__,
               "ranges": RANGES, "grid": GRID, "sites": [], "patients": []}  # fmt: skip
    with atomic_folder(out_dir, overwrite) as work:
        jobs = [(site, patient) for site in sites for patient in draw_patients(site, patients_per_site, seed)]
        for site, patient in tqdm(jobs, desc="procedural ECG records", unit="record", disable=not progress):
            folder = work / f"site-{site.name}"
            folder.mkdir(exist_ok=True)
            ecg, peaks, kinds, attempt = simulate_patient(site, patient, seed)
            counts = write_wfdb(folder, patient.subject, site.name, site.fs_hz, ecg, peaks, kinds)
            summary["patients"].append({"site": site.name, **asdict(patient), "beats": counts, "redraws": attempt})
        summary["sites"] = [asdict(site) for site in sites]
        (work / "generator.json").write_text(json.dumps(summary, indent=2) + "\n")
    return Path(out_dir)


#: The shipped target sites (``domains/physio/procedural_sites``): `target_sites` (4) × 6 patients.
TARGETS = Path(__file__).resolve().parent / "procedural_sites"
TARGET_PATIENTS = 6


def generate_targets(out_dir: str | Path = TARGETS, overwrite: bool = False, progress: bool = False) -> Path:
    """The shipped target sites (card ``physio-procedural``)."""
    return generate_procedural_sites(out_dir, target_sites(), TARGET_PATIENTS, overwrite=overwrite,
                                     progress=progress)  # fmt: skip


__all__ = ["GRID", "RANGES", "ProceduralSite", "Patient", "grid_sites", "target_sites", "draw_patients",
           "is_off_grid", "generate_procedural_sites", "generate_targets"]  # fmt: skip

"""A synthetic 12-lead ECG set in PTB-XL's layout, with class morphology and site shifts (data card ptbxl-synthetic).

Heartbeats come from neurokit2's 12-lead simulator (``nk.ecg_simulate(method="multileads")``): the ECGSYN
model of McSharry et al. (2003), where the phase θ runs round a limit cycle at ω = 2π/RR(t) and

    dz/dt = −Σ_{i∈P,Q,R,S,T} a_i Δθ_i exp(−Δθ_i² / 2 b_i²) − (z − z₀),      Δθ_i = θ − θ_i,

so each wave i is a bump at angle θ_i (``ti``, degrees) of width b_i (``bi``, rad) and size ∝ a_i b_i²
(``ai``); neurokit scales a_i per lead by a fixed 12×5 matrix and rescales every lead to −0.4…1.2 mV
(here then shifted so that each lead's median, its isoelectric line, is 0 mV).
Defaults: ti (−70, −15, 0, 15, 100)°, ai (1.2, −5, 30, −7.5, 0.75), bi (0.25, 0.1, 0.1, 0.1, 0.4) rad.

Classes (PTB-XL superclasses; a record may carry two) change that model — `draw_morphology`:

* NORM — the defaults with small per-record jitter (every record gets it);
* CD, wide QRS (intraventricular conduction delay, SCP IVCD): Q, R, S widths ``bi`` × 1.9–2.5, their
  ``ai`` ÷ width^1.5 (so the QRS widens more than it grows), S 8–15° later: QRS ≳ 120 ms;
* HYP, high R amplitude (LVH voltage criteria, SCP LVH): R ``ai`` × 1.8–2.5 and S ``ai`` × 1.4–2.0, then
  each lead × (1 + (R factor − 1) · QRS share of its range) to undo neurokit's per-lead range
  normalisation where the QRS sets the range (`qrs_dominance`; R reaches 2–3 mV there);
* STTC, ST-T change (SCP NDT/ISC_): T inversion (T ``ai`` → −0.4…−0.75) and/or ischaemic ST depression:
  a plateau of −0.08…−0.2 mV from the J point to the T peak in I, II, aVF, V4–V6, +0.6× that in aVR;
* MI, pathological Q waves in one territory (inferior II/III/aVF → IMI, anterior V1–V4 → AMI, lateral
  I/aVL/V5/V6 → LMI): a Gaussian dip of 0.3–0.6 mV, σ 10–14 ms, just before R in those leads; in 40 %
  of them acute injury: ST elevation +0.15…0.3 mV there and reciprocal depression (0.4×) opposite.

The plateaus and Q waves are added per beat after simulation at 500 Hz, timed from the detected R peaks
and the model's own wave angles (θ/2π · RR). Sites (`SiteRecipe`) then differ in what a recording adds:
sampling rate (downsampling with ``resample_poly``), amplifier calibration, white noise, baseline wander,
50 Hz mains, the recorder's own low-pass filter, ADC gain/baseline/format — and in their patients: heart
rate, class mix and how pronounced the pathologies are (``severity``) — a source → target shift.

Every record is written with ``wfdb.wrsamp`` as PTB-XL ships them (``records100/00000/00001_lr`` or
``records500/00000/00001_hr``, lead names I … AVR … V6), with ``ptbxl_database.csv`` and
``scp_statements.csv``. The folder is written beside its destination and moved in at the end (atomic).
Deterministic: record k of site s uses ``numpy.random.SeedSequence([seed, s, k])``.

Shapes: clean (12, n_samples) [mV]; records (n_samples, 12) in the WFDB files.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.signal import butter, find_peaks, resample_poly, sosfilt
from tqdm import tqdm
from workbench.domains.ecg.preprocess import LEADS

from workbench.core.checkpoint import atomic_folder

#: neurokit2's ECGSYN wave parameters (P, Q, R, S, T): angles [deg], amplitudes, widths [rad].
NK_TI_DEG = (-70.0, -15.0, 0.0, 15.0, 100.0)
NK_AI = (1.2, -5.0, 30.0, -7.5, 0.75)
NK_BI = (0.25, 0.1, 0.1, 0.1, 0.4)
P, Q, R, S, T = range(5)

#: Lead names as PTB-XL's headers write them.
PTBXL_LEAD_NAMES = ("I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6")

SIMULATION_RATE_HZ = 500
LEAD_IN_S = 1.0  # simulated before the record starts, so the model's start-up transient is not recorded

#: MI territory -> (leads with Q waves / ST elevation, reciprocal leads), and its SCP code.
TERRITORIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "inferior": (("II", "III", "aVF"), ("I", "aVL")),
    "anterior": (("V1", "V2", "V3", "V4"), ("II", "III", "aVF")),
    "lateral": (("I", "aVL", "V5", "V6"), ("II", "III", "aVF")),
}
MI_CODES = {"inferior": "IMI", "anterior": "AMI", "lateral": "LMI"}
ST_DEPRESSION_LEADS = ("I", "II", "aVF", "V4", "V5", "V6")
CLASSES = ("NORM", "MI", "STTC", "CD", "HYP")

#: The rows of scp_statements.csv: code -> (description, diagnostic, form, rhythm, class, subclass).
SCP_STATEMENTS: dict[str, tuple[str, float, float, float, str, str]] = {
    "NORM": ("normal ECG", 1, math.nan, math.nan, "NORM", "NORM"),
    "IMI": ("inferior myocardial infarction", 1, math.nan, math.nan, "MI", "IMI"),
    "AMI": ("anterior myocardial infarction", 1, math.nan, math.nan, "MI", "AMI"),
    "LMI": ("lateral myocardial infarction", 1, math.nan, math.nan, "MI", "LMI"),
    "NDT": ("non-diagnostic T abnormalities", 1, 1, math.nan, "STTC", "STTC"),
    "ISC_": ("non-specific ischemic", 1, math.nan, math.nan, "STTC", "ISC_"),
    "IVCD": ("non-specific intraventricular conduction disturbance (block)", 1, math.nan, math.nan, "CD", "IVCD"),
    "LVH": ("left ventricular hypertrophy", 1, math.nan, math.nan, "HYP", "LVH"),
    "SR": ("sinus rhythm", math.nan, math.nan, 1, "", ""),
    "INVT": ("inverted T-waves", math.nan, 1, math.nan, "", ""),
    "STD_": ("non-specific ST depression", math.nan, 1, math.nan, "", ""),
    "STE_": ("non-specific ST elevation", math.nan, 1, math.nan, "", ""),
    "QWAVE": ("Q waves present", math.nan, 1, math.nan, "", ""),
    "VCLVH": ("voltage criteria (QRS) for left ventricular hypertrophy", math.nan, 1, math.nan, "", ""),
    "ABQRS": ("abnormal QRS", math.nan, 1, math.nan, "", ""),
}


@dataclass(frozen=True)
class SiteRecipe:
    """What one recording site adds to the clean ECGs, and which patients it sees.

    Args:
        site: PTB-XL's ``site`` number; name/device: text for ``ptbxl_database.csv``'s ``device``.
        n_records: records at this site.
        sampling_rate_hz: 100 (``records100/``, ``filename_lr``) or 500 (``records500/``, ``filename_hr``).
        wfdb_format / adc_gain / adc_baseline: storage: WFDB format, ADC units per mV, ADC zero.
        amplitude_scale: the amplifier's true calibration error (× every lead; per lead ×lognormal(0, 0.05)).
        noise_mv: standard deviation of white (EMG-like) noise at the site's rate [mV].
        wander_mv: amplitude of the baseline wander (two sinusoids of 0.05–0.5 Hz) [mV].
        powerline_mv: amplitude of 50 Hz mains interference [mV] (needs a rate above 100 Hz).
        heart_rate_bpm: (mean, standard deviation) of the heart rate, clipped to 45–130 bpm.
        class_mix: probability of each primary class; p_second: chance of a second, different pathology.
        severity: how pronounced the pathologies are (1: the ranges of the module docstring; 0.6: every
            change 0.6× as far from normal — earlier disease, borderline findings).
        device_lowpass_hz: the recorder's own low-pass ("muscle filter"; order-2 Butterworth applied causally,
            as a device does, to everything recorded) [Hz]; None: none.
    """

    site: int
    name: str
    device: str
    n_records: int
    sampling_rate_hz: int
    wfdb_format: str
    adc_gain: float
    adc_baseline: int
    amplitude_scale: float
    noise_mv: float
    wander_mv: float
    powerline_mv: float
    heart_rate_bpm: tuple[float, float]
    class_mix: dict[str, float] = field(default_factory=dict)
    p_second: float = 0.2
    severity: float = 1.0
    device_lowpass_hz: float | None = None


#: The shipped set's four sites: A is the clean, NORM-rich source; B, C, D are shifted targets.
DEFAULT_SITES: tuple[SiteRecipe, ...] = (
    SiteRecipe(
        site=0, name="A", device="synthetic-A 100 Hz outpatient clinic", n_records=80, sampling_rate_hz=100,
        wfdb_format="16", adc_gain=1000.0, adc_baseline=0, amplitude_scale=1.0, noise_mv=0.01, wander_mv=0.05,
        powerline_mv=0.0, heart_rate_bpm=(68, 10), p_second=0.15,
        class_mix={"NORM": 0.40, "MI": 0.15, "STTC": 0.15, "CD": 0.15, "HYP": 0.15},
    ),
    SiteRecipe(
        site=1, name="B", device="synthetic-B 100 Hz ambulance monitor", n_records=64, sampling_rate_hz=100,
        wfdb_format="212", adc_gain=200.0, adc_baseline=0, amplitude_scale=0.85, noise_mv=0.06, wander_mv=0.2,
        powerline_mv=0.0, heart_rate_bpm=(88, 15), p_second=0.25, device_lowpass_hz=35.0,
        class_mix={"NORM": 0.20, "MI": 0.30, "STTC": 0.25, "CD": 0.10, "HYP": 0.15},
    ),
    SiteRecipe(
        site=2, name="C", device="synthetic-C 500 Hz cardiology department", n_records=20, sampling_rate_hz=500,
        wfdb_format="212", adc_gain=400.0, adc_baseline=0, amplitude_scale=1.15, noise_mv=0.02, wander_mv=0.1,
        powerline_mv=0.04, heart_rate_bpm=(72, 10), p_second=0.2, severity=1.2,
        class_mix={"NORM": 0.25, "MI": 0.10, "STTC": 0.15, "CD": 0.20, "HYP": 0.30},
    ),
    SiteRecipe(
        site=3, name="D", device="synthetic-D 100 Hz screening ward", n_records=64, sampling_rate_hz=100,
        wfdb_format="16", adc_gain=1000.0, adc_baseline=512, amplitude_scale=1.0, noise_mv=0.025, wander_mv=0.45,
        powerline_mv=0.0, heart_rate_bpm=(92, 14), p_second=0.2, severity=0.6,
        class_mix={"NORM": 0.30, "MI": 0.15, "STTC": 0.30, "CD": 0.15, "HYP": 0.10},
    ),
)  # fmt: skip


@dataclass
class Morphology:
    """One record's heartbeat model: ECGSYN parameters plus the per-lead additions of its classes.

    Shapes: ti_deg, ai, bi (5,) for P, Q, R, S, T; st_shift_mv, q_depth_mv (12,) [mV] in `LEADS` order.
    """

    classes: tuple[str, ...]
    ti_deg: np.ndarray
    ai: np.ndarray
    bi: np.ndarray
    voltage_factor: float = 1.0
    st_shift_mv: np.ndarray = field(default_factory=lambda: np.zeros(12))
    q_depth_mv: np.ndarray = field(default_factory=lambda: np.zeros(12))
    q_sigma_s: float = 0.012
    scp_codes: dict[str, float] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)


def _lead_mask(names) -> np.ndarray:
    mask = np.zeros(12)
    mask[[LEADS.index(name) for name in names]] = 1.0
    return mask


def draw_morphology(classes: tuple[str, ...], rng: np.random.Generator, severity: float = 1.0) -> Morphology:
    """The ECGSYN parameters and per-lead changes of a record of these classes (see the module docstring).

    ``severity`` scales every change's distance from normal: a factor f becomes 1 + severity·(f − 1), an
    added amplitude a becomes severity·a (T inversion keeps its sign).
    """

    def factor(low: float, high: float) -> float:
        return 1.0 + severity * (rng.uniform(low, high) - 1.0)

    def amount(low: float, high: float) -> float:
        return severity * rng.uniform(low, high)

    ti = np.array(NK_TI_DEG) + rng.normal(0.0, [2.0, 1.0, 0.0, 1.0, 4.0])
    ai = np.array(NK_AI) * rng.lognormal(0.0, 0.08, 5)
    bi = np.array(NK_BI) * rng.lognormal(0.0, 0.05, 5)
    m = Morphology(tuple(classes), ti, ai, bi)
    if classes == ("NORM",):
        m.scp_codes = {"NORM": 100.0, "SR": 0.0}
    if "CD" in classes:
        width = factor(1.9, 2.5)
        m.bi[[Q, R, S]] *= width
        m.ai[[Q, R, S]] /= width**1.5
        m.ti_deg[S] += amount(8.0, 15.0)
        m.scp_codes.update({"IVCD": 100.0, "ABQRS": 0.0})
        m.findings.append(f"QRS widened x{width:.2f}")
    if "HYP" in classes:
        r_factor, s_factor = factor(1.8, 2.5), factor(1.4, 2.0)
        m.ai[R] *= r_factor
        m.ai[S] *= s_factor
        m.voltage_factor = r_factor
        m.scp_codes.update({"LVH": 100.0, "VCLVH": 0.0})
        m.findings.append(f"R x{r_factor:.2f}, S x{s_factor:.2f}")
    if "STTC" in classes:
        kind = rng.choice(["T inversion", "ST depression", "both"], p=[0.5, 0.3, 0.2])
        if kind in ("T inversion", "both"):
            m.ai[T] = -amount(0.4, 0.75)
            m.scp_codes.update({"NDT": 100.0, "INVT": 0.0})
            m.findings.append("T inverted")
        if kind in ("ST depression", "both"):
            depth = amount(0.08, 0.2)
            m.st_shift_mv += -depth * _lead_mask(ST_DEPRESSION_LEADS) + 0.6 * depth * _lead_mask(["aVR"])
            m.scp_codes.update({"ISC_": 100.0, "STD_": 0.0})
            m.findings.append(f"ST depression {depth:.2f} mV")
    if "MI" in classes:
        territory = str(rng.choice(list(TERRITORIES)))
        leads, reciprocal = TERRITORIES[territory]
        m.q_depth_mv = amount(0.3, 0.6) * _lead_mask(leads)
        m.q_sigma_s = rng.uniform(0.010, 0.014)
        m.scp_codes.update({MI_CODES[territory]: 100.0, "QWAVE": 0.0})
        m.findings.append(f"{territory} Q waves {m.q_depth_mv.max():.2f} mV")
        if rng.random() < 0.4:
            height = amount(0.15, 0.3)
            m.st_shift_mv += height * _lead_mask(leads) - 0.4 * height * _lead_mask(reciprocal)
            m.scp_codes["STE_"] = 0.0
            m.findings.append(f"{territory} ST elevation {height:.2f} mV")
    return m


def simulate_clean(morphology: Morphology, heart_rate_bpm: float, duration_s: float, seed: int) -> np.ndarray:
    """A noise-free 12-lead record at `SIMULATION_RATE_HZ` [mV]: neurokit2's multilead ECGSYN + the class additions.

    Shapes: returns (12, round(duration_s · 500)).
    """
    import neurokit2 as nk

    fs = SIMULATION_RATE_HZ
    n_total = int(round((duration_s + LEAD_IN_S) * fs))
    frame = nk.ecg_simulate(
        duration=duration_s + LEAD_IN_S,
        sampling_rate=fs,
        noise=0,
        heart_rate=heart_rate_bpm,
        method="multileads",
        random_state=seed,
        ti=tuple(morphology.ti_deg),
        ai=tuple(morphology.ai),
        bi=tuple(morphology.bi),
    )
    ecg = frame[list(LEADS)].to_numpy().T.astype(np.float64)
    if ecg.shape[1] < n_total:
        raise RuntimeError(f"neurokit2 returned {ecg.shape[1]} samples, expected {n_total}")
    ecg -= np.median(ecg, axis=1, keepdims=True)  # neurokit's −0.4…1.2 mV range -> isoelectric line near 0
    peaks = r_peaks(ecg, fs)
    if len(peaks) < 2:
        raise RuntimeError(f"found {len(peaks)} QRS complexes in a simulated record; expected one per beat")
    if morphology.voltage_factor != 1.0:
        ecg *= 1.0 + (morphology.voltage_factor - 1.0) * qrs_dominance(ecg, peaks, fs)[:, None]
    if morphology.st_shift_mv.any() or morphology.q_depth_mv.any():
        ecg += _regional_waves(ecg, peaks, morphology, heart_rate_bpm, fs)
    start = int(round(LEAD_IN_S * fs))
    return ecg[:, start : start + int(round(duration_s * fs))]


def r_peaks(ecg: np.ndarray, fs: float, min_rr_s: float = 0.35) -> np.ndarray:
    """QRS positions [samples] of a clean multilead record: peaks of the summed squared slope (40 ms smoothing)."""
    energy = np.square(np.diff(ecg, axis=1)).sum(axis=0)
    width = max(1, int(round(0.04 * fs)))
    energy = np.convolve(energy, np.ones(width) / width, mode="same")
    peaks, _ = find_peaks(energy, distance=int(min_rr_s * fs), height=0.2 * np.percentile(energy, 99.5))
    return peaks


def qrs_dominance(ecg: np.ndarray, peaks: np.ndarray, fs: float, half_width_s: float = 0.08) -> np.ndarray:
    """Per lead, the QRS's share of the lead's range: median peak-to-peak within ±80 ms of each R / range.

    neurokit rescales each lead to a fixed range, so a taller R shrinks every other wave of a lead whose
    range the QRS sets (share near 1) and nothing in a lead whose P or T sets it (small share).
    Shapes: ecg (12, n) → (12,).
    """
    half = int(round(half_width_s * fs))
    windows = [ecg[:, max(0, p - half) : p + half] for p in peaks]
    qrs = np.median([w.max(axis=1) - w.min(axis=1) for w in windows], axis=0)
    return np.clip(qrs / np.ptp(ecg, axis=1), 0.0, 1.0)


def _regional_waves(ecg: np.ndarray, peaks: np.ndarray, m: Morphology, heart_rate_bpm: float, fs: float) -> np.ndarray:
    """ST plateaus and Q dips of every beat, timed by ECGSYN's wave angles at the local RR interval."""
    hrfact = math.sqrt(heart_rate_bpm / 60.0)  # ECGSYN's rate scaling of angles and widths
    angle = np.radians(m.ti_deg) * np.array([math.sqrt(hrfact), hrfact, 1.0, hrfact, math.sqrt(hrfact)])
    width = m.bi * hrfact
    j_angle, t_peak, t_end = angle[S] + 2 * width[S], angle[T], angle[T] + 1.5 * width[T]
    q_angle = angle[Q]
    t = np.arange(ecg.shape[1]) / fs
    st = np.zeros_like(t)
    q = np.zeros_like(t)
    rr = np.diff(peaks) / fs
    for k, peak in enumerate(peaks):
        beat_rr = rr[min(k, len(rr) - 1)]
        t_r = peak / fs
        j, top, end = (t_r + a / (2 * np.pi) * beat_rr for a in (j_angle, t_peak, t_end))
        rise = _smoothstep((t - (j - 0.02)) / 0.02)
        fall = 1.0 - _smoothstep((t - top) / max(end - top, 1e-3))
        st = np.maximum(st, rise * fall)
        q += np.exp(-0.5 * ((t - (t_r + q_angle / (2 * np.pi) * beat_rr)) / m.q_sigma_s) ** 2)
    return m.st_shift_mv[:, None] * st[None, :] - m.q_depth_mv[:, None] * q[None, :]


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def record_acquisition(clean: np.ndarray, site: SiteRecipe, rng: np.random.Generator) -> np.ndarray:
    """What the site's recorder makes of a clean 500 Hz record: rate, calibration, wander, noise, mains, filter [mV].

    Shapes: clean (12, n) at 500 Hz → (12, n · site rate / 500).
    """
    fs = site.sampling_rate_hz
    x = clean if fs == SIMULATION_RATE_HZ else resample_poly(clean, fs, SIMULATION_RATE_HZ, axis=1)
    x = x * site.amplitude_scale * rng.lognormal(0.0, 0.05, (12, 1))
    t = np.arange(x.shape[1]) / fs
    for _ in range(2):  # respiration / movement: shared by all leads with lead-specific weights
        frequency, phase = rng.uniform(0.05, 0.5), rng.uniform(0, 2 * np.pi)
        weights = rng.normal(1.0, 0.4, (12, 1))
        x = x + site.wander_mv * weights * np.sin(2 * np.pi * frequency * t + phase)[None, :]
    x = x + rng.normal(0.0, site.noise_mv, x.shape)
    if site.powerline_mv:
        phases = rng.uniform(0, 2 * np.pi, (12, 1))
        x = x + site.powerline_mv * np.sin(2 * np.pi * 50.0 * t[None, :] + phases)
    if site.device_lowpass_hz:
        x = sosfilt(butter(2, site.device_lowpass_hz, btype="lowpass", fs=fs, output="sos"), x, axis=1)
    return x


def _digitize(signal_mv: np.ndarray, site: SiteRecipe) -> np.ndarray:
    """ADC units ``round(x · gain) + baseline`` as (n_samples, 12) int; an out-of-range sample is an error."""
    digital = np.round(signal_mv * site.adc_gain).astype(np.int64) + site.adc_baseline
    low, high = {"16": (-32767, 32767), "212": (-2047, 2047)}[site.wfdb_format]
    if digital.min() < low or digital.max() > high:
        raise RuntimeError(f"site {site.name}: a sample is out of format {site.wfdb_format}'s range; lower adc_gain")
    return digital.T


def _draw_classes(site: SiteRecipe, rng: np.random.Generator) -> tuple[str, ...]:
    names = list(site.class_mix)
    primary = str(rng.choice(names, p=np.array([site.class_mix[n] for n in names]) / sum(site.class_mix.values())))
    if primary == "NORM" or rng.random() >= site.p_second:
        return (primary,)
    second = str(rng.choice([name for name in CLASSES if name not in ("NORM", primary)]))
    return tuple(name for name in CLASSES if name in (primary, second))


def generate_ptbxl_synthetic(
    out_dir: str | Path,
    *,
    seed: int = 2026,
    sites: tuple[SiteRecipe, ...] = DEFAULT_SITES,
    duration_s: float = 10.0,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write the synthetic set in PTB-XL's layout to ``out_dir`` (deterministic for a seed) and return it.

    Args:
        out_dir: the folder to create (``ptbxl_database.csv``, ``scp_statements.csv``, ``records100/``,
            ``records500/``, ``generator.json``).
        seed: the one seed of every random choice.
        sites: the recording sites (`DEFAULT_SITES`: 228 records, ~6 MB).
        duration_s: length of each record [s] (PTB-XL's: 10).
        overwrite: replace an existing ``out_dir``.
        progress: show a progress bar.
    """
    out_dir = Path(out_dir)
    with atomic_folder(out_dir, overwrite) as work:
        jobs = [(site, k) for site in sites for k in range(site.n_records)]
        rows = []
        for ecg_id, (site, k) in enumerate(tqdm(jobs, desc="synthetic ECGs", unit="record", disable=not progress), 1):
            rows.append(_write_record(work, site, k, ecg_id, seed, duration_s))
        _write_tables(work, rows, seed, duration_s, sites)
    return out_dir


def _write_record(work: Path, site: SiteRecipe, k: int, ecg_id: int, seed: int, duration_s: float) -> dict[str, Any]:
    """Draw record ``k`` of ``site`` (its own generator, ``SeedSequence([seed, site, k])``), write its WFDB files
    under ``work`` and return its ``ptbxl_database.csv`` row (plus ``_fold_key``)."""
    import wfdb

    rng = np.random.default_rng(np.random.SeedSequence([seed, site.site, k]))
    classes = _draw_classes(site, rng)
    morphology = draw_morphology(classes, rng, site.severity)
    mean, sd = site.heart_rate_bpm
    heart_rate = float(np.clip(rng.normal(mean, sd), 45, 130))
    clean = simulate_clean(morphology, heart_rate, duration_s, int(rng.integers(2**31 - 1)))
    digital = _digitize(record_acquisition(clean, site, rng), site)
    suffix, folder = ("lr", "records100") if site.sampling_rate_hz == 100 else ("hr", "records500")
    relative = f"{folder}/{(ecg_id // 1000) * 1000:05d}/{ecg_id:05d}_{suffix}"
    (work / relative).parent.mkdir(parents=True, exist_ok=True)
    wfdb.wrsamp(
        Path(relative).name,
        fs=site.sampling_rate_hz,
        units=["mV"] * 12,
        sig_name=list(PTBXL_LEAD_NAMES),
        d_signal=digital,
        fmt=[site.wfdb_format] * 12,
        adc_gain=[site.adc_gain] * 12,
        baseline=[site.adc_baseline] * 12,
        write_dir=str((work / relative).parent),
    )
    return {
        "ecg_id": ecg_id,
        "patient_id": float(10000 + ecg_id),
        "age": float(rng.integers(20, 90)),
        "sex": int(rng.integers(0, 2)),
        "site": float(site.site),
        "device": site.device,
        "scp_codes": repr(morphology.scp_codes),
        "heart_rate_bpm": round(heart_rate, 1),
        "findings": "; ".join(morphology.findings) or "normal",
        "synthetic_classes": "+".join(classes),
        "filename_lr": relative if suffix == "lr" else "",
        "filename_hr": relative if suffix == "hr" else "",
        "_fold_key": (site.site, classes, rng.random()),
    }


def _write_tables(
    work: Path, rows: list[dict[str, Any]], seed: int, duration_s: float, sites: tuple[SiteRecipe, ...]
) -> None:
    """Write ``ptbxl_database.csv`` (one row per record, folds assigned), ``scp_statements.csv`` and
    ``generator.json`` into ``work``."""
    import neurokit2 as nk
    import pandas as pd
    import wfdb

    database = pd.DataFrame(rows)
    database["strat_fold"] = _stratified_folds(database["_fold_key"].tolist())
    database = database.drop(columns="_fold_key").set_index("ecg_id")
    columns = ["patient_id", "age", "sex", "site", "device", "scp_codes", "heart_rate_bpm", "findings",
               "synthetic_classes", "strat_fold", "filename_lr", "filename_hr"]  # fmt: skip
    database[columns].to_csv(work / "ptbxl_database.csv")
    statements = pd.DataFrame.from_dict(
        SCP_STATEMENTS,
        orient="index",
        columns=["description", "diagnostic", "form", "rhythm", "diagnostic_class", "diagnostic_subclass"],
    )
    statements.to_csv(work / "scp_statements.csv")
    recipe = {
        "generator": "workbench.domains.ecg.generate.generate_ptbxl_synthetic",
        "seed": seed,
        "duration_s": duration_s,
        "neurokit2": nk.__version__,
        "wfdb": wfdb.__version__,
        "sites": [asdict(site) for site in sites],
    }
    (work / "generator.json").write_text(json.dumps(recipe, indent=2) + "\n")


def _stratified_folds(keys: list[tuple]) -> list[int]:
    """Folds 1–10 dealt round-robin within each site over records sorted by class set (then at random)."""
    folds = [0] * len(keys)
    by_site: dict[int, list[int]] = {}
    for index, key in enumerate(keys):
        by_site.setdefault(key[0], []).append(index)
    for indices in by_site.values():
        for position, index in enumerate(sorted(indices, key=lambda i: (keys[i][1], keys[i][2]))):
            folds[index] = position % 10 + 1
    return folds

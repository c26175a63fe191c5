"""Do conformal sets keep their coverage at a new site? Split vs weighted conformal under a generated covariate
shift with a known answer, sets from service-size batches, and the shift alarms' size and power (issues 40, 54).

The shift: heartbeats of the physio generator (`workbench.domains.physio.generate`, the Holter site "A" recipe,
``DURATION_S`` per subject), each subject recorded either clean (muscle noise `CLEAN_MV` RMS) or noisy (`NOISY_MV`).
The source site records `SOURCE_NOISY` of its subjects noisy, the target site `TARGET_NOISY`: the subjects are drawn
from one population and the noise is chosen apart from them, so ``p(class | beat)`` is the same at both sites and
only ``p(beat)`` moves — a covariate shift, and the true classes of every target beat are known.

One unit (seed): fresh subjects — `SUBJECTS` for training, calibration, the target and the alarm's pool (all but
the target from the source site). Model: the physio task's shipped backbone, frozen (its head's input: 64 features
per beat), and a logistic regression on the training subjects' features (scikit-learn, multinomial): the class
probabilities. At nominal 90 % (α = 0.1), on every target beat:

* split: `workbench.clinical.conformal.split_quantile` of the calibration beats' scores ``1 − p_y``;
* weighted (logistic DRE, KLIEP): `weighted_quantiles` with ``w = p_target / p_source`` estimated by the
  workbench's own estimators (methods ``dre-logistic`` and ``dre-kliep``, `ESTIMATORS`) between the calibration and
  the target beats' features (`density_ratio_weights`). uLSIF is left out: on these 64 features its
  cross-validation chose flat weights (all ≈ 1) in development runs (seeds 2–3) and took ~90 s per unit;
* weighted (known groups): the same with the true ratio of the noise groups (``TARGET_NOISY / SOURCE_NOISY`` for a
  noisy subject's beats, its complement for a clean one's) — the reference the estimate is meant to reach.

Each row also gives the share of empty sets. Weights at service size: `SERVICE_BATCHES` batches of each size in
`SERVICE_SIZES` random target beats, each weighted by the registered ``density-ratio`` method's estimator (what the
service uses) fitted between the calibration beats and that batch alone (no rolling window).

Shift alarm (reference: 500 training beats' features), at `shift_alarm.ALPHA`:

* beat-level (`shift_alarm.mmd_test`): `BATCHES` batches of `BATCH` beats drawn from the training subjects' other
  beats (exchangeable with the reference: the size), from new subjects of the source site (the calibration
  subjects: no new site, but other people than the reference's), and from the target (the power);
* patient-level (`shift_alarm.patient_test`, null from the pool's held-out source subjects): `PATIENT_BATCHES`
  batches of `BATCH` random beats and of `GROUPED` (subjects × beats) from the new source subjects and from the
  target, with the beat-level test on the same grouped batches beside it; and, on the new source subjects' batches,
  the same test calibrated on `SMALL_POOL` of the pool's subjects only.

Coverage is a mean over a unit's target beats; the table gives the mean over units with a t interval (95 %) over
units (an alarm rate: the union of that and the exact interval of the pooled batches). The coverage claim holds
when the weighted (logistic DRE) interval lies within 2 points of nominal and the split interval lies wholly more
than 2 points from it; "no verdict" when either interval straddles its bound. The alarm claim (`PATIENT_CLAIM`:
patient-level false alarms on grouped batches of new source subjects ≤ α) holds when its interval's upper end is
≤ α and does not hold when its lower end is above α.

``python benchmarks/conformal_shift.py`` (seeds 210–214) writes ``results/conformal_shift.json``; ``--dev`` runs
seeds 0–1 and writes nothing; ``--refresh`` recomputes the summary from the units the results file holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any, Sequence

import numpy as np
import torch
from claims import RESULTS, conformal_shift_summary
from scipy.stats import beta
from scipy.stats import t as student_t
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from workbench.domains.physio.generate import SITES, draw_subjects, simulate_record
from workbench.domains.physio.task import AFTER_S, BEFORE_S, model_inputs

from workbench.clinical import conformal, shift_alarm
from workbench.clinical.predictor import DENSITY_RATIO
from workbench.core.checkpoint import write_text
from workbench.core.registry import role, tasks

NAME = "conformal_shift"
#: Seeds 200–204 measured the alarm before the batch's own patients joined its null's draw (they informed that
#: change; their results are in git history), so the reported units are fresh.
SEEDS = tuple(range(210, 215))
DEV_SEEDS = (0, 1)
CLASSES = ("N", "S", "V", "F")
#: Muscle-noise RMS of a clean and of a noisy recording [mV].
CLEAN_MV, NOISY_MV = 0.02, 0.25
#: Share of noisy subjects at the source and at the target site.
SOURCE_NOISY, TARGET_NOISY = 0.2, 0.8
#: Subjects per set: training, calibration and the alarm's pool are source subjects, never shared.
SUBJECTS = {"train": 10, "calibration": 20, "target": 10, "pool": 60}
#: Subjects of the smaller pool the patient-level alarm is also calibrated on (how the pool's size matters).
SMALL_POOL = 20
SMALL = f"patient-level, pool of {SMALL_POOL}"
DURATION_S = 180.0
#: The registered weighting methods whose density-ratio estimators weigh the calibration beats (`make_estimator`).
ESTIMATORS = {"weighted (logistic DRE)": "dre-logistic", "weighted (KLIEP)": "dre-kliep"}
ALPHA = 0.1
#: Batches per unit and beats per batch of the shift alarm's size and power.
BATCHES, BATCH = 20, 32
#: Batches per unit of each patient-level alarm row, and the subjects × beats of a grouped batch.
PATIENT_BATCHES, GROUPED = 100, (4, 8)
#: The alarm row of the claim "patient-level false alarms ≤ 5 %".
PATIENT_CLAIM = (f"patient-level | no shift: new subjects of the source site | {GROUPED[0]} subjects × {GROUPED[1]} "
                 "beats")  # fmt: skip
#: Beats per batch a service sees (weights estimated from that batch alone), and batches per unit of each size.
SERVICE_SIZES, SERVICE_BATCHES = (20, 50, 200), 20
#: Half-width of the target band around nominal coverage [coverage units].
BAND = 0.02


def _beats(seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Per pool: model inputs (n, 175), classes (n,), noisy flag (n,) of one unit's generated subjects."""
    site = dataclasses.replace(SITES[0], duration_s=DURATION_S)
    subjects = draw_subjects(site, sum(SUBJECTS.values()), seed)
    rng = np.random.default_rng(seed)
    pools, start = {}, 0
    for pool, count in SUBJECTS.items():
        share = TARGET_NOISY if pool == "target" else SOURCE_NOISY
        noisy = np.zeros(count, bool)
        noisy[rng.permutation(count)[: round(share * count)]] = True
        inputs, labels, flags, ids = [], [], [], []
        for index, (subject, is_noisy) in enumerate(zip(subjects[start : start + count], noisy)):
            recording = dataclasses.replace(site, noise_mv=NOISY_MV if is_noisy else CLEAN_MV)
            ecg, peaks, kinds = simulate_record(subject, recording, seed)
            before, after = round(BEFORE_S * site.fs_hz), round(AFTER_S * site.fs_hz)
            keep = [i for i, p in enumerate(peaks) if p - before >= 0 and p + after <= len(ecg)]
            inputs.append(model_inputs(np.stack([ecg[peaks[i] - before : peaks[i] + after] for i in keep]), site.fs_hz))
            labels.append(np.array([CLASSES.index(kinds[i]) for i in keep]))
            flags.append(np.full(len(keep), is_noisy))
            ids.append(np.full(len(keep), index))
        pools[pool] = {"inputs": np.concatenate(inputs), "labels": np.concatenate(labels),
                       "noisy": np.concatenate(flags), "subject": np.concatenate(ids)}  # fmt: skip
        start += count
    return pools


def unit(seed: int, model: torch.nn.Module) -> dict[str, Any]:
    """One unit's coverages, set sizes and alarm rates."""
    started = time.perf_counter()
    pools = _beats(seed)
    for pool in pools.values():
        _, pool["features"] = shift_alarm.model_features(model, lambda: model(torch.as_tensor(pool["inputs"])))
    scaler = StandardScaler().fit(pools["train"]["features"])
    classifier = LogisticRegression(max_iter=2000).fit(scaler.transform(pools["train"]["features"]),
                                                       pools["train"]["labels"])  # fmt: skip

    def probabilities(pool: dict[str, np.ndarray]) -> np.ndarray:
        p = np.zeros((len(pool["labels"]), len(CLASSES)))
        p[:, classifier.classes_] = classifier.predict_proba(scaler.transform(pool["features"]))
        return p

    cal, target = pools["calibration"], pools["target"]
    p_cal, p_target = probabilities(cal), probabilities(target)
    scores = conformal.true_scores(p_cal, cal["labels"], multilabel=False)
    quantiles = {"split": np.full(len(p_target), conformal.split_quantile(scores, ALPHA))}
    for name, method in ESTIMATORS.items():
        estimator = conformal.density_ratio_estimator(method, seed)
        w_cal, w_target = conformal.density_ratio_weights(cal["features"], target["features"], estimator)
        quantiles[name] = conformal.weighted_quantiles(scores, w_cal, w_target, ALPHA)
    ratio = {True: TARGET_NOISY / SOURCE_NOISY, False: (1 - TARGET_NOISY) / (1 - SOURCE_NOISY)}
    quantiles["weighted (known groups)"] = conformal.weighted_quantiles(
        scores, np.vectorize(ratio.get)(cal["noisy"]), np.vectorize(ratio.get)(target["noisy"]), ALPHA)
    rows = {name: _set_facts(p_target, q, target["labels"]) for name, q in quantiles.items()}
    source_sets = conformal.prediction_sets(p_cal, conformal.split_quantile(scores, ALPHA), False)
    service, timings = _service_size(seed, cal, scores, target, p_target)
    alarms, alarm_batches, alarm_timings = _alarms(seed, pools)
    return {"seed": seed, "beats": {pool: int(len(p["labels"])) for pool, p in pools.items()},
            "target_error_rate": float(np.mean(p_target.argmax(axis=1) != target["labels"])),
            "calibration_error_rate": float(np.mean(p_cal.argmax(axis=1) != cal["labels"])),
            "calibration_coverage_in_sample": conformal.coverage(source_sets, cal["labels"], False),
            "coverage": rows, "service_size": service, "alarm_rate": alarms, "alarm_batches": alarm_batches,
            "seconds": {**timings, **alarm_timings, "unit": round(time.perf_counter() - started, 1)}}  # fmt: skip


def _set_facts(probabilities: np.ndarray, q: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Coverage, mean set size and share of empty sets of the sets at quantiles ``q`` (n,) or a scalar."""
    sets = conformal.prediction_sets(probabilities, q, multilabel=False)
    return {"coverage": conformal.coverage(sets, labels, False), "mean_set_size": float(sets.sum(axis=1).mean()),
            "empty_set_rate": float(np.mean(~sets.any(axis=1)))}  # fmt: skip


def _service_size(seed: int, cal: dict[str, np.ndarray], scores: np.ndarray, target: dict[str, np.ndarray],
                  p_target: np.ndarray) -> tuple[dict[str, dict[str, float]], dict[str, float]]:  # fmt: skip
    """Weighted conformal sets as a service computes them: for each size in `SERVICE_SIZES`, `SERVICE_BATCHES`
    batches of random target beats, each weighted by the density ratio of the registered `density-ratio` method
    fitted between the calibration beats and that batch alone; coverage, set size and empty sets over the batches'
    beats, and the mean seconds per batch (weights, quantiles and sets)."""
    rng = np.random.default_rng(seed + 2)
    method = role(DENSITY_RATIO)
    facts, seconds = {}, {}
    for size in SERVICE_SIZES:
        found, clock = [], time.perf_counter()
        for _ in range(SERVICE_BATCHES):
            index = rng.permutation(len(target["labels"]))[:size]
            estimator = conformal.density_ratio_estimator(method, seed)
            w_cal, w_batch = conformal.density_ratio_weights(cal["features"], target["features"][index], estimator)
            q = conformal.weighted_quantiles(scores, w_cal, w_batch, ALPHA)
            found.append(_set_facts(p_target[index], q, target["labels"][index]))
        facts[str(size)] = {key: float(np.mean([f[key] for f in found])) for key in found[0]}
        seconds[f"weights_per_batch_{size}"] = round((time.perf_counter() - clock) / SERVICE_BATCHES, 3)
    return facts, seconds


def _alarms(seed: int, pools: dict[str, dict[str, np.ndarray]]
            ) -> tuple[dict[str, float], dict[str, int], dict[str, float]]:  # fmt: skip
    """Alarm rates at `shift_alarm.ALPHA`, keyed ``"test | data | batch"``: the beat-level `mmd_test` and the
    patient-level `patient_test` (null: the pool's held-out source subjects), on batches of `BATCH` random beats
    and of `GROUPED` (subjects × beats); the batches behind each rate; the mean seconds per test."""
    rng = np.random.default_rng(seed + 1)
    train, pool = pools["train"]["features"], pools["pool"]
    in_reference = np.zeros(len(train), bool)
    in_reference[rng.permutation(len(train))[: shift_alarm.MAX_REFERENCE]] = True
    reference = train[in_reference]
    small = _small_pool(pool)
    alarms, counts, clocks = {}, {}, {"beat-level": [], "patient-level": [], SMALL: []}

    def verdict(test: str, index: np.ndarray, data: dict[str, np.ndarray], b: int) -> bool:
        clock = time.perf_counter()
        if test == "beat-level":
            result = shift_alarm.mmd_test(reference, data["features"][index], seed=seed * 1000 + b)
        else:
            null = pool if test == "patient-level" else small
            result = shift_alarm.patient_test(reference, data["features"][index], data["subject"][index],
                                              null["features"], null["subject"], seed=seed * 1000 + b)  # fmt: skip
        clocks[test].append(time.perf_counter() - clock)
        return result["verdict"] == "shift"

    random_beats = f"{BATCH} random beats"
    others = {"features": train[~in_reference]}
    for name, data in (("no shift: other beats of the training subjects", others),
                       ("no shift: new subjects of the source site", pools["calibration"]),
                       ("shift: the target site", pools["target"])):  # fmt: skip
        flagged = [verdict("beat-level", rng.permutation(len(data["features"]))[:BATCH], data, b)
                   for b in range(BATCHES)]  # fmt: skip
        alarms[f"beat-level | {name} | {random_beats}"] = float(np.mean(flagged))
        counts[f"beat-level | {name} | {random_beats}"] = len(flagged)
    subjects, beats = GROUPED
    grouped = f"{subjects} subjects × {beats} beats"
    for name, data in (("no shift: new subjects of the source site", pools["calibration"]),
                       ("shift: the target site", pools["target"])):  # fmt: skip
        cells = [("patient-level", random_beats), ("beat-level", grouped), ("patient-level", grouped)]
        if name.startswith("no shift"):
            cells += [(SMALL, random_beats), (SMALL, grouped)]
        flagged = {cell: [] for cell in cells}
        for b in range(PATIENT_BATCHES):
            batches = {random_beats: rng.permutation(len(data["features"]))[:BATCH]}
            chosen = rng.permutation(np.unique(data["subject"]))[:subjects]
            batches[grouped] = np.concatenate([rng.permutation(np.flatnonzero(data["subject"] == s))[:beats]
                                               for s in chosen])  # fmt: skip
            for test, batch in cells:
                flagged[test, batch].append(verdict(test, batches[batch], data, b))
        for (test, batch), found in flagged.items():
            alarms[f"{test} | {name} | {batch}"] = float(np.mean(found))
            counts[f"{test} | {name} | {batch}"] = len(found)
    return alarms, counts, {f"{test}_per_test": round(float(np.mean(c)), 3) for test, c in clocks.items()}


def _small_pool(pool: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The beats of `SMALL_POOL` of the pool's subjects, `SOURCE_NOISY` of them noisy (the lowest-numbered)."""
    noisy = sorted({int(s) for s in np.unique(pool["subject"][pool["noisy"]])})
    clean = sorted({int(s) for s in np.unique(pool["subject"][~pool["noisy"]])})
    wanted = round(SOURCE_NOISY * SMALL_POOL)
    keep = np.isin(pool["subject"], noisy[:wanted] + clean[: SMALL_POOL - wanted])
    return {key: value[keep] for key, value in pool.items()}


def interval(values: Sequence[float]) -> dict[str, float]:
    """Mean and 95 % t interval over units."""
    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return {"mean": mean, "low": float("nan"), "high": float("nan")}
    half = float(student_t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))
    return {"mean": mean, "low": mean - half, "high": mean + half}


def _rate(values: Sequence[float]) -> dict[str, float]:
    """`interval` of a rate, kept within [0, 1]."""
    return {key: min(max(value, 0.0), 1.0) for key, value in interval(values).items()}


def _alarm_interval(units: list[dict[str, Any]], name: str) -> dict[str, float]:
    """An alarm rate's mean over units and the union of two 95 % intervals: the t interval over units (batches of
    a unit share its reference and pool) and the exact (Clopper–Pearson) interval of the pooled batches (which stays
    wide where every unit gives the same rate)."""
    over_units = _rate([u["alarm_rate"][name] for u in units])
    batches = sum(u["alarm_batches"][name] for u in units)
    alarms = round(sum(u["alarm_rate"][name] * u["alarm_batches"][name] for u in units))
    low = float(beta.ppf(0.025, alarms, batches - alarms + 1)) if alarms else 0.0
    high = float(beta.ppf(0.975, alarms + 1, batches - alarms)) if alarms < batches else 1.0
    return {"mean": over_units["mean"], "low": min(low, over_units["low"]), "high": max(high, over_units["high"]),
            "alarms": alarms, "batches": batches}  # fmt: skip


def summarise(units: list[dict[str, Any]]) -> dict[str, Any]:
    """Intervals over units of each coverage, set size, empty-set rate and alarm rate, and the claims' verdicts."""
    names = list(units[0]["coverage"])
    coverage = {name: interval([u["coverage"][name]["coverage"] for u in units]) for name in names}
    sizes = {name: interval([u["coverage"][name]["mean_set_size"] for u in units]) for name in names}
    empty = {name: _rate([u["coverage"][name]["empty_set_rate"] for u in units]) for name in names}
    service = {size: {"coverage": interval([u["service_size"][size]["coverage"] for u in units]),
                      "mean_set_size": interval([u["service_size"][size]["mean_set_size"] for u in units]),
                      "empty_set_rate": _rate([u["service_size"][size]["empty_set_rate"] for u in units])}
               for size in units[0]["service_size"]}  # fmt: skip
    alarms = {name: _alarm_interval(units, name) for name in units[0]["alarm_rate"]}
    nominal = 1 - ALPHA
    weighted, split = coverage["weighted (logistic DRE)"], coverage["split"]
    within = nominal - BAND <= weighted["low"] and weighted["high"] <= nominal + BAND
    outside_weighted = weighted["high"] < nominal - BAND or weighted["low"] > nominal + BAND
    misses = split["high"] < nominal - BAND or split["low"] > nominal + BAND
    inside_split = nominal - BAND <= split["low"] and split["high"] <= nominal + BAND
    if within and misses:
        verdict = "holds"
    elif outside_weighted or inside_split:
        verdict = "does not hold"
    else:
        verdict = "no verdict"
    false_alarms = alarms[PATIENT_CLAIM]
    if false_alarms["high"] <= shift_alarm.ALPHA:
        patient_verdict = "holds"
    elif false_alarms["low"] > shift_alarm.ALPHA:
        patient_verdict = "does not hold"
    else:
        patient_verdict = "no verdict"
    return {"coverage": coverage, "set_size": sizes, "empty_set_rate": empty, "service_size": service,
            "alarm_rate": alarms, "verdict": verdict, "patient_claim": PATIENT_CLAIM,
            "patient_verdict": patient_verdict}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="split vs weighted conformal coverage under a generated shift")
    parser.add_argument("--dev", action="store_true", help="development seeds 0-1 (no results file)")
    parser.add_argument("--refresh", action="store_true",
                        help="recompute the results file's summary from its units (no new units)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.refresh:
        result = json.loads((RESULTS / f"{NAME}.json").read_text())
        result["summary"] = summarise(result["units"])
        write_text(RESULTS / f"{NAME}.json", json.dumps(result, indent=1) + "\n")
        print(conformal_shift_summary(result))
        return 0
    seeds = DEV_SEEDS if args.dev else SEEDS
    torch.set_num_threads(1)
    model = tasks.get("physio")().load_model(None).eval()
    started, units = time.perf_counter(), []
    for seed in seeds:
        units.append(unit(seed, model))
        print(json.dumps(units[-1]), file=sys.stderr, flush=True)
    result = {"benchmark": NAME, "script": "conformal_shift.py", "seeds": list(seeds), "alpha": ALPHA, "band": BAND,
              "source_noisy": SOURCE_NOISY, "target_noisy": TARGET_NOISY,
              "noise_mv": {"clean": CLEAN_MV, "noisy": NOISY_MV}, "subjects": SUBJECTS, "duration_s": DURATION_S,
              "batch": BATCH, "batches": BATCHES, "patient_batches": PATIENT_BATCHES, "grouped": list(GROUPED),
              "alarm_alpha": shift_alarm.ALPHA, "permutations": shift_alarm.PERMUTATIONS,
              "service_sizes": list(SERVICE_SIZES), "service_batches": SERVICE_BATCHES,
              "density_ratio": role(DENSITY_RATIO), "units": units, "summary": summarise(units),
              "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    if not args.dev:
        RESULTS.mkdir(exist_ok=True)
        write_text(RESULTS / f"{NAME}.json", json.dumps(result, indent=1) + "\n")
    print(conformal_shift_summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

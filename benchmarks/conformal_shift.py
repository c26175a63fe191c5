"""Do conformal sets keep their coverage at a new site? Split vs weighted conformal under a generated covariate
shift with a known answer, and the shift alarm's size and power (issue 40).

The shift: heartbeats of the physio generator (`workbench.domains.physio.generate`, the Holter site "A" recipe,
``DURATION_S`` per subject), each subject recorded either clean (muscle noise `CLEAN_MV` RMS) or noisy (`NOISY_MV`).
The source site records `SOURCE_NOISY` of its subjects noisy, the target site `TARGET_NOISY`: the subjects are drawn
from one population and the noise is chosen apart from them, so ``p(class | beat)`` is the same at both sites and
only ``p(beat)`` moves — a covariate shift, and the true classes of every target beat are known.

One unit (seed): fresh subjects — `SUBJECTS` each for training, calibration (both source) and the target. Model:
the physio task's shipped backbone, frozen (its head's input: 64 features per beat), and a logistic regression on the
training subjects' features (scikit-learn, multinomial): the class probabilities. At nominal 90 % (α = 0.1), on
every target beat:

* split: `workbench.clinical.conformal.split_quantile` of the calibration beats' scores ``1 − p_y``;
* weighted (logistic DRE, KLIEP): `weighted_quantiles` with ``w = p_target / p_source`` estimated by the
  workbench's own estimators (methods ``dre-logistic`` and ``dre-kliep``, `ESTIMATORS`) between the calibration and
  the target beats' features (`density_ratio_weights`). uLSIF is left out: on these 64 features its
  cross-validation chose flat weights (all ≈ 1) in development runs (seeds 2–3) and took ~90 s per unit;
* weighted (known groups): the same with the true ratio of the noise groups (``TARGET_NOISY / SOURCE_NOISY`` for a
  noisy subject's beats, its complement for a clean one's) — the reference the estimate is meant to reach.

Shift alarm (`workbench.clinical.shift_alarm.mmd_test`, reference: 500 training beats' features): `BATCHES`
batches of `BATCH` beats drawn from the training subjects' other beats (no shift, exchangeable with the reference:
the size), from new subjects of the source site (no shift in the site, but other people than the reference's), and
from the target (the power).

Coverage is a mean over a unit's target beats; the table gives the mean over units with a t interval (95 %) over
units. The claim holds when the weighted (logistic DRE) interval lies within 2 points of nominal and the split
interval lies wholly more than 2 points from it; "no verdict" when either interval straddles its bound.

``python benchmarks/conformal_shift.py`` (seeds 200–204) writes ``results/conformal_shift.json``; ``--dev`` runs
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
from scipy.stats import t as student_t
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from workbench.domains.physio.generate import SITES, draw_subjects, simulate_record
from workbench.domains.physio.task import AFTER_S, BEFORE_S, model_inputs

from workbench.clinical import conformal, shift_alarm
from workbench.core.registry import tasks

NAME = "conformal_shift"
SEEDS = tuple(range(200, 205))
DEV_SEEDS = (0, 1)
CLASSES = ("N", "S", "V", "F")
#: Muscle-noise RMS of a clean and of a noisy recording [mV].
CLEAN_MV, NOISY_MV = 0.02, 0.25
#: Share of noisy subjects at the source and at the target site.
SOURCE_NOISY, TARGET_NOISY = 0.2, 0.8
SUBJECTS = {"train": 10, "calibration": 20, "target": 10}
DURATION_S = 180.0
#: The registered weighting methods whose density-ratio estimators weigh the calibration beats (`make_estimator`).
ESTIMATORS = {"weighted (logistic DRE)": "dre-logistic", "weighted (KLIEP)": "dre-kliep"}
ALPHA = 0.1
#: Batches per unit and beats per batch of the shift alarm's size and power.
BATCHES, BATCH = 20, 32
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
        inputs, labels, flags = [], [], []
        for subject, is_noisy in zip(subjects[start : start + count], noisy):
            recording = dataclasses.replace(site, noise_mv=NOISY_MV if is_noisy else CLEAN_MV)
            ecg, peaks, kinds = simulate_record(subject, recording, seed)
            before, after = round(BEFORE_S * site.fs_hz), round(AFTER_S * site.fs_hz)
            keep = [i for i, p in enumerate(peaks) if p - before >= 0 and p + after <= len(ecg)]
            inputs.append(model_inputs(np.stack([ecg[peaks[i] - before : peaks[i] + after] for i in keep]), site.fs_hz))
            labels.append(np.array([CLASSES.index(kinds[i]) for i in keep]))
            flags.append(np.full(len(keep), is_noisy))
        pools[pool] = {"inputs": np.concatenate(inputs), "labels": np.concatenate(labels),
                       "noisy": np.concatenate(flags)}  # fmt: skip
        start += count
    return pools


def unit(seed: int, model: torch.nn.Module) -> dict[str, Any]:
    """One unit's coverages, set sizes and alarm rates."""
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
    rows = {}
    for name, q in quantiles.items():
        sets = conformal.prediction_sets(p_target, q, multilabel=False)
        rows[name] = {"coverage": conformal.coverage(sets, target["labels"], False),
                      "mean_set_size": float(sets.sum(axis=1).mean())}  # fmt: skip
    source_sets = conformal.prediction_sets(p_cal, conformal.split_quantile(scores, ALPHA), False)
    rng = np.random.default_rng(seed + 1)
    train = pools["train"]["features"]
    in_reference = np.zeros(len(train), bool)
    in_reference[rng.permutation(len(train))[: shift_alarm.MAX_REFERENCE]] = True
    reference = train[in_reference]
    alarms = {}
    for name, features in (("no shift: other beats of the training subjects", train[~in_reference]),
                           ("no shift: new subjects of the source site", cal["features"]),
                           ("shift: the target site", target["features"])):  # fmt: skip
        verdicts = [shift_alarm.mmd_test(reference, features[rng.permutation(len(features))[:BATCH]],
                                         seed=seed * 100 + b)["verdict"] for b in range(BATCHES)]  # fmt: skip
        alarms[name] = verdicts.count("shift") / BATCHES
    return {"seed": seed, "beats": {pool: int(len(p["labels"])) for pool, p in pools.items()},
            "target_error_rate": float(np.mean(p_target.argmax(axis=1) != target["labels"])),
            "calibration_error_rate": float(np.mean(p_cal.argmax(axis=1) != cal["labels"])),
            "calibration_coverage_in_sample": conformal.coverage(source_sets, cal["labels"], False),
            "coverage": rows, "alarm_rate": alarms}  # fmt: skip


def interval(values: Sequence[float]) -> dict[str, float]:
    """Mean and 95 % t interval over units."""
    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return {"mean": mean, "low": float("nan"), "high": float("nan")}
    half = float(student_t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))
    return {"mean": mean, "low": mean - half, "high": mean + half}


def summarise(units: list[dict[str, Any]]) -> dict[str, Any]:
    """Intervals over units of each coverage and alarm rate, and the claim's verdict."""
    names = list(units[0]["coverage"])
    coverage = {name: interval([u["coverage"][name]["coverage"] for u in units]) for name in names}
    sizes = {name: interval([u["coverage"][name]["mean_set_size"] for u in units]) for name in names}
    alarms = {name: {key: min(max(value, 0.0), 1.0) for key, value in  # a rate's interval stays in [0, 1]
                     interval([u["alarm_rate"][name] for u in units]).items()} for name in units[0]["alarm_rate"]}
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
    return {"coverage": coverage, "set_size": sizes, "alarm_rate": alarms, "verdict": verdict}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="split vs weighted conformal coverage under a generated shift")
    parser.add_argument("--dev", action="store_true", help="development seeds 0-1 (no results file)")
    parser.add_argument("--refresh", action="store_true",
                        help="recompute the results file's summary from its units (no new units)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.refresh:
        result = json.loads((RESULTS / f"{NAME}.json").read_text())
        result["summary"] = summarise(result["units"])
        (RESULTS / f"{NAME}.json").write_text(json.dumps(result, indent=1) + "\n")
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
              "batch": BATCH, "batches": BATCHES, "units": units, "summary": summarise(units),
              "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    if not args.dev:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{NAME}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(conformal_shift_summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

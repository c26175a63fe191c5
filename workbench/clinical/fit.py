"""What a finished classification run keeps for clinical use, fitted at the end of ``workbench adapt``.

Written into the run folder before its seal (so the seal covers them; each file written atomically):

    clinical.json     temperatures, ECE before/after, the conformal level and its test-split coverage, the shift
                      alarm's settings and its check on the test split (`fit_run` says how each was made)
    clinical.npz      reference_features (≤ 500, d): training items' penultimate features (the shift alarm's
                      reference); calibration_features (n_cal, d), calibration_probabilities (n_cal, K) calibrated,
                      calibration_truth (n_cal,) or (n_cal, K): the conformal calibration half
    reliability.png   the reliability diagram before/after temperature scaling

The validation split serves twice, so it is cut in two disjoint random halves (seeded by the run's seed): the
temperatures are fitted on the first, the conformal scores and the ECE are taken on the second (held out from the
fit). The test split is used only to report coverage, set size and the alarm's verdict on data like the training
data (expected: "no shift").
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from workbench.clinical import calibration, conformal, shift_alarm
from workbench.core.checkpoint import atomic_path, write_json
from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.npz import load_npz
from workbench.core.task import Task, TaskData

log = logging.getLogger("workbench")

CLINICAL_JSON = "clinical.json"
CLINICAL_NPZ = "clinical.npz"
RELIABILITY_PNG = "reliability.png"
FORMAT = "workbench-clinical/1"
#: Nominal miscoverage of the conformal sets (90 % coverage).
ALPHA = 0.1
#: Temperatures are kept within [1 / TEMPERATURE_LIMIT, TEMPERATURE_LIMIT] (a class seen with one label only in the
#: fitting half keeps T = 1: its NLL falls without bound).
TEMPERATURE_LIMIT = 20.0
#: Fewest items a temperature is fitted on; below, T = 1 (on the embedded ECG and EEG sets, 6 and 9 items gave
#: T ≈ 0.06–0.12, and the held-out ECE of the EEG run rose from 0.07 to 0.28).
MIN_FIT_ITEMS = 30


def _scored(task: Task, model: nn.Module, samples: Any, device: torch.device) -> tuple[np.ndarray, np.ndarray,
                                                                                       np.ndarray] | None:  # fmt: skip
    """(probabilities, truth, features) of ``samples``; None when the task's evaluation gives no per-item
    probabilities and labels, or its features cannot be matched to the items."""
    evaluation, features = shift_alarm.model_features(model, lambda: task.evaluate(model, samples, device))
    probabilities = evaluation.predictions.get("probabilities")
    truth = evaluation.predictions.get("truth")
    if probabilities is None or truth is None or len(probabilities) != len(samples) or len(features) < len(samples):
        return None
    return np.asarray(probabilities, np.float64), np.asarray(truth), features[-len(samples):]  # the last scored


def fit_run(task: Task, model: nn.Module, data: TaskData, out_dir: Path, seed: int) -> dict[str, Any] | None:
    """Fit temperatures, conformal calibration and the alarm's reference for the merged ``model``; write them into
    ``out_dir``. Returns what ``clinical.json`` holds (None, writing nothing, for a task whose evaluation gives no
    probabilities, or a validation split of fewer than 4 items)."""
    device = device_of(model)
    model.eval()
    if len(data.val) < 4:
        log.warning("clinical calibration: %d validation item(s), fewer than 4: no calibration", len(data.val))
        return None
    val = _scored(task, model, data.val, device)
    test = _scored(task, model, data.test, device)
    if val is None or test is None:
        return None
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(data.val))
    fit_half, cal_half = np.sort(order[: len(order) // 2]), np.sort(order[len(order) // 2 :])
    (p_val, y_val, f_val), (p_test, y_test, f_test) = val, test
    multilabel = y_val.ndim == 2
    temperatures, unfitted = _temperatures(p_val[fit_half], y_val[fit_half], multilabel)
    p_cal = calibration.apply_temperature(p_val[cal_half], temperatures, multilabel)
    ece_before = calibration.expected_calibration_error(p_val[cal_half], y_val[cal_half], multilabel)
    ece_after = calibration.expected_calibration_error(p_cal, y_val[cal_half], multilabel)
    calibration.reliability_diagram(p_val[cal_half], p_cal, y_val[cal_half], multilabel, out_dir / RELIABILITY_PNG,
                                    (ece_before, ece_after))  # fmt: skip
    scores = conformal.true_scores(p_cal, y_val[cal_half], multilabel)
    quantiles = (np.array([conformal.split_quantile(scores[:, k], ALPHA) for k in range(scores.shape[1])])
                 if multilabel else np.array(conformal.split_quantile(scores, ALPHA)))  # fmt: skip
    p_test_cal = calibration.apply_temperature(p_test, temperatures, multilabel)
    sets = conformal.prediction_sets(p_test_cal, quantiles, multilabel)
    train_items = [data.train[i] for i in np.sort(rng.permutation(len(data.train))[: shift_alarm.MAX_REFERENCE])]
    train = _scored(task, model, train_items, device)
    if train is None:
        return None
    reference = shift_alarm.reference_sample(train[2], seed)
    check = shift_alarm.mmd_test(reference, f_test, seed=seed)
    summary = {
        "format": FORMAT,
        "multilabel": bool(multilabel),
        "split": (f"the validation split ({len(data.val)} items) in two disjoint random halves (seed {seed}): "
                  f"temperatures fitted on {len(fit_half)}, conformal scores and ECE on the other {len(cal_half)}"),
        "calibration": {
            "method": "temperature scaling, " + ("one temperature per class (sigmoid)" if multilabel else
                                                 "one temperature (softmax)") + ", NLL minimised by L-BFGS on log T",
            "temperatures": [float(t) for t in np.atleast_1d(temperatures)],
            "unfitted_classes": unfitted,
            "min_fit_items": MIN_FIT_ITEMS,
            "fit_items": int(len(fit_half)),
            "ece_bins": f"{calibration.N_BINS} equal-width bins of [0, 1]",
            "ece_items": int(len(cal_half)),
            "ece_before": ece_before,
            "ece_after": ece_after,
        },
        "conformal": {
            "alpha": ALPHA,
            "kind": "split conformal, score 1 − p (calibrated)" + (", per class" if multilabel else "")
                    + "; weighted (Tibshirani et al. 2019) at predict time when the batch allows",
            "calibration_items": int(len(cal_half)),
            "quantiles": [float(q) if np.isfinite(q) else None for q in np.atleast_1d(quantiles)],  # None: +inf
            "test_items": int(len(p_test)),
            "test_coverage": conformal.coverage(sets, y_test, multilabel),
            "test_mean_set_size": float(sets[..., 1].sum(axis=1).mean() if multilabel else sets.sum(axis=1).mean()),
        },
        "shift": {
            "test": (f"MMD² (Gaussian kernel, median heuristic) on the head's input features, permutation p-value "
                     f"({shift_alarm.PERMUTATIONS} relabellings), verdict at α = {shift_alarm.ALPHA}"),
            "reference_items": int(len(reference)),
            "test_split": check,
        },
    }  # fmt: skip
    with atomic_path(out_dir / CLINICAL_NPZ) as temporary:
        np.savez(temporary, reference_features=reference, calibration_features=f_val[cal_half].astype(np.float32),
                 calibration_probabilities=p_cal, calibration_truth=y_val[cal_half])  # fmt: skip
    write_json(out_dir / CLINICAL_JSON, summary)
    return summary


def _temperatures(probabilities: np.ndarray, truth: np.ndarray, multilabel: bool) -> tuple[np.ndarray, list[int]]:
    """Fitted temperatures within the limits; the classes kept at T = 1 (all of them under `MIN_FIT_ITEMS` items;
    multi-label: those seen with one label value only)."""
    n_classes = truth.shape[1] if multilabel else 1
    if len(truth) < MIN_FIT_ITEMS:
        return np.ones(n_classes), list(range(n_classes))
    temperatures = np.clip(calibration.fit_temperature(probabilities, truth, multilabel), 1 / TEMPERATURE_LIMIT,
                           TEMPERATURE_LIMIT)  # fmt: skip
    unfitted = []
    if multilabel:
        unfitted = [k for k in range(truth.shape[1]) if len(np.unique(truth[:, k])) < 2]
        temperatures[unfitted] = 1.0
    elif len(np.unique(truth)) < 2:
        unfitted, temperatures = [0], np.ones(1)
    return temperatures, unfitted


def read_artifacts(run: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """(clinical.json, clinical.npz arrays) of a finished run; None for a run without them (older, or a task
    without probabilities). A damaged file is a `UserError` naming it."""
    path = Path(run) / CLINICAL_JSON
    if not path.is_file():
        return None
    import json

    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UserError(f"{path}: not readable JSON ({error}); the run's calibration cannot be used") from None
    if not isinstance(summary, Mapping) or summary.get("format") != FORMAT:
        raise UserError(f"{path}: not a workbench clinical record (expected format {FORMAT!r})")
    return dict(summary), load_npz(Path(run) / CLINICAL_NPZ)

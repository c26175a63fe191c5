"""What a finished classification run keeps for clinical use, fitted at the end of ``workbench adapt``.

Written into the run folder before its seal (so the seal covers them; each file written atomically):

    clinical.json     temperatures, ECE before/after, the conformal level and its test-split coverage, the shift
                      alarm's settings and its check on the test split (`fit_run` says how each was made)
    clinical.npz      reference_features (≤ 500, d): training items' penultimate features (the shift alarm's
                      reference); pool_features (≤ 500, d) and pool_groups (≤ 500,): the validation split's, held-out
                      patients whose pseudo-batches calibrate the alarm's null (`shift_check`);
                      calibration_features (n_cal, d), calibration_probabilities (n_cal, K) calibrated,
                      calibration_truth (n_cal,) or (n_cal, K): the conformal calibration half
    reliability.png   the reliability diagram before/after temperature scaling

The validation split serves twice, so it is cut in two disjoint random halves (seeded by the run's seed): the
temperatures are fitted on the first, the conformal scores and the ECE are taken on the second (held out from the
fit). The test split is used only to report coverage, set size and the alarm's verdict on data like the training
data (expected: "no shift").

`fit_layer` does the fitting from three scored parts and a reference: `fit_run` with the validation halves, the
test split and training items; ``workbench calibrate`` (`workbench.clinical.site_calibration`) with three parts of a
site's own records, written to a sealed layer outside the run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, NamedTuple

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


#: Fewest held-out patients (groups) in the pool from which the alarm's null is calibrated on them
#: (`shift_alarm.patient_test`); below, the relabelling test (`shift_alarm.mmd_test`), whose null is "more items of
#: the reference's patients".
MIN_POOL_GROUPS = 10


class Scored(NamedTuple):
    """A task's items scored by a model: probabilities (n, K), truth (n,) or (n, K) multi-hot, features (n, d),
    groups (n,) as text: each item's patient (subject, record: the task's `Evaluation.groups`)."""

    probabilities: np.ndarray
    truth: np.ndarray
    features: np.ndarray
    groups: np.ndarray

    def take(self, index: np.ndarray) -> "Scored":
        """The items at ``index`` (n_taken,)."""
        return Scored(self.probabilities[index], self.truth[index], self.features[index], self.groups[index])


def score_items(task: Task, model: nn.Module, samples: Any, device: torch.device) -> Scored | None:
    """``samples`` scored by ``model`` through the task's evaluation (`Scored`): every item, or those the evaluation
    names in ``probabilities_item`` (n,) when its probabilities cover some items only (closed questions among open
    ones, say); None when it gives no per-item probabilities and labels, or its features cannot
    be matched to the items (the features of the last ``n`` head calls are taken)."""
    evaluation, features = shift_alarm.model_features(model, lambda: task.evaluate(model, samples, device))
    probabilities = evaluation.predictions.get("probabilities")
    truth = evaluation.predictions.get("truth")
    items = evaluation.predictions.get("probabilities_item")
    n = len(samples) if items is None else len(items)
    if probabilities is None or truth is None or n == 0 or len(probabilities) != n or len(features) < n:
        return None
    groups = evaluation.groups
    groups = np.arange(len(samples)) if groups is None or len(groups) != len(samples) else np.asarray(groups)
    groups = groups if items is None else groups[np.asarray(items)]
    return Scored(np.asarray(probabilities, np.float64), np.asarray(truth), features[-n:],  # the last n scored
                  groups.astype(str))  # fmt: skip


def fit_run(task: Task, model: nn.Module, data: TaskData, out_dir: Path, seed: int) -> dict[str, Any] | None:
    """Fit temperatures, conformal calibration and the alarm's reference for the merged ``model``; write them into
    ``out_dir``. Returns what ``clinical.json`` holds (None, writing nothing, for a task whose evaluation gives no
    probabilities, or a validation split of fewer than 4 items)."""
    device = device_of(model)
    model.eval()
    if len(data.val) < 4:
        log.warning("clinical calibration: %d validation item(s), fewer than 4: no calibration", len(data.val))
        return None
    val = score_items(task, model, data.val, device)
    test = score_items(task, model, data.test, device)
    if val is None or test is None:
        return None
    if len(val.truth) < 4:
        log.warning("clinical calibration: %d scored validation item(s), fewer than 4: no calibration", len(val.truth))
        return None
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(val.truth))
    fit_half, cal_half = np.sort(order[: len(order) // 2]), np.sort(order[len(order) // 2 :])
    train_items = [data.train[i] for i in np.sort(rng.permutation(len(data.train))[: shift_alarm.MAX_REFERENCE])]
    train = score_items(task, model, train_items, device)
    if train is None:
        return None
    scored = "" if len(val.truth) == len(data.val) else f", {len(val.truth)} of them scored by probabilities"
    split = (f"the validation split ({len(data.val)} items{scored}) in two disjoint random halves (seed {seed}): "
             f"temperatures fitted on {len(fit_half)}, conformal scores and ECE on the other {len(cal_half)}")
    return fit_layer(out_dir, val.take(fit_half), val.take(cal_half), test, train.features, seed, split=split,
                     reference_kind="training items", pool=val)


def fit_layer(out_dir: Path, fitting: Scored, calibrating: Scored, checking: Scored, reference_features: np.ndarray,
              seed: int, *, split: str, reference_kind: str, pool: Scored) -> dict[str, Any]:  # fmt: skip
    """Fit a clinical layer and write it into ``out_dir`` (`CLINICAL_JSON`, `CLINICAL_NPZ`, `RELIABILITY_PNG`, each
    atomically): temperatures on ``fitting`` (`MIN_FIT_ITEMS` rule, `_temperatures`), the ECE before/after and the
    split conformal quantiles at `ALPHA` on ``calibrating``, coverage, set sizes and the shift alarm's verdict on
    ``checking`` (held out from both), the alarm's reference drawn from ``reference_features`` (n, d) (at most
    `shift_alarm.MAX_REFERENCE`, seeded by ``seed``) and its null from ``pool``'s patients (at most
    `shift_alarm.MAX_REFERENCE` items; patients neither in the reference nor in ``checking``: `shift_check`).
    ``split`` says in words how the parts were made,
    ``reference_kind`` what the reference items are. Returns what ``clinical.json`` holds.

    The run's own layer (`fit_run`) and a site's (`workbench.clinical.site_calibration`) are both made here."""
    multilabel = fitting.truth.ndim == 2
    temperatures, unfitted = _temperatures(fitting.probabilities, fitting.truth, multilabel)
    p_cal = calibration.apply_temperature(calibrating.probabilities, temperatures, multilabel)
    y_cal = calibrating.truth
    ece_before = calibration.expected_calibration_error(calibrating.probabilities, y_cal, multilabel)
    ece_after = calibration.expected_calibration_error(p_cal, y_cal, multilabel)
    calibration.reliability_diagram(calibrating.probabilities, p_cal, y_cal, multilabel, out_dir / RELIABILITY_PNG,
                                    (ece_before, ece_after))  # fmt: skip
    scores = conformal.true_scores(p_cal, y_cal, multilabel)
    quantiles = (np.array([conformal.split_quantile(scores[:, k], ALPHA) for k in range(scores.shape[1])])
                 if multilabel else np.array(conformal.split_quantile(scores, ALPHA)))  # fmt: skip
    p_check = calibration.apply_temperature(checking.probabilities, temperatures, multilabel)
    sets = conformal.prediction_sets(p_check, quantiles, multilabel)
    named = sets[..., 1] if multilabel else sets  # (n, K): the classes each set names
    reference = shift_alarm.reference_sample(reference_features, seed)
    kept = np.sort(np.random.default_rng(seed).permutation(len(pool.truth))[: shift_alarm.MAX_REFERENCE])
    pool_features, pool_groups = pool.features[kept].astype(np.float32), pool.groups[kept]
    check = shift_check(reference, checking.features, checking.groups, pool_features, pool_groups, seed)
    summary = {
        "format": FORMAT,
        "multilabel": bool(multilabel),
        "split": split,
        "calibration": {
            "method": "temperature scaling, " + ("one temperature per class (sigmoid)" if multilabel else
                                                 "one temperature (softmax)") + ", NLL minimised by L-BFGS on log T",
            "temperatures": [float(t) for t in np.atleast_1d(temperatures)],
            "unfitted_classes": unfitted,
            "min_fit_items": MIN_FIT_ITEMS,
            "fit_items": int(len(fitting.truth)),
            "ece_bins": f"{calibration.N_BINS} equal-width bins of [0, 1]",
            "ece_items": int(len(y_cal)),
            "ece_before": ece_before,
            "ece_after": ece_after,
        },
        "conformal": {
            "alpha": ALPHA,
            "kind": "split conformal, score 1 − p (calibrated)" + (", per class" if multilabel else "")
                    + "; weighted (Tibshirani et al. 2019) at predict time when the batch allows",
            "calibration_items": int(len(y_cal)),
            "quantiles": [float(q) if np.isfinite(q) else None for q in np.atleast_1d(quantiles)],  # None: +inf
            "test_items": int(len(p_check)),
            "test_coverage": conformal.coverage(sets, checking.truth, multilabel),
            "test_mean_set_size": float(named.sum(axis=1).mean()),
            "test_set_frequency": [float(share) for share in named.mean(axis=0)],  # per class: share of sets naming it
        },
        "shift": {
            "test": shift_test_text(len(np.unique(pool_groups))),
            "reference_items": int(len(reference)),
            "reference_kind": reference_kind,
            "pool_items": int(len(pool_features)),
            "pool_patients": int(len(np.unique(pool_groups))),
            "test_split": check,
        },
    }  # fmt: skip
    with atomic_path(out_dir / CLINICAL_NPZ) as temporary:
        np.savez(temporary, reference_features=reference, calibration_features=calibrating.features.astype(np.float32),
                 calibration_probabilities=p_cal, calibration_truth=y_cal, pool_features=pool_features,
                 pool_groups=pool_groups)  # fmt: skip
    write_json(out_dir / CLINICAL_JSON, summary)
    return summary


def shift_check(reference: np.ndarray, batch: np.ndarray, batch_groups: np.ndarray, pool: np.ndarray | None,
                pool_groups: np.ndarray | None, seed: int) -> dict[str, Any]:  # fmt: skip
    """The shift alarm's verdict on ``batch`` (m, d) with its items' patients ``batch_groups`` (m,): against
    ``reference`` (n, d), its null calibrated on pseudo-batches of the held-out patients of ``pool`` (p, d) /
    ``pool_groups`` (p,) when they are at least `MIN_POOL_GROUPS` (`shift_alarm.patient_test`: new patients of the
    source site are its null, so "shift" means more than new patients), else the relabelling test
    (`shift_alarm.mmd_test`, whose "shift" new patients alone can raise). The result's ``null`` says which."""
    if pool is not None and pool_groups is not None and len(np.unique(pool_groups)) >= MIN_POOL_GROUPS:
        return shift_alarm.patient_test(reference, batch, batch_groups, pool, pool_groups, seed=seed)
    return {**shift_alarm.mmd_test(reference, batch, seed=seed), "null": "reference items (relabelled)"}


def shift_test_text(pool_patients: int) -> str:
    """In words, the test `shift_check` makes with a pool of ``pool_patients`` held-out patients."""
    statistic = "MMD² (Gaussian kernel, median heuristic) on the head's input features"
    if pool_patients >= MIN_POOL_GROUPS:
        return (f"{statistic}, its null from {shift_alarm.PERMUTATIONS} pseudo-batches drawn from the batch's "
                f"patients and {pool_patients} held-out ones with the batch's items per patient (a permutation of "
                f"patients: new patients of the source site are no shift), verdict at α = "
                f"{shift_alarm.ALPHA}")  # fmt: skip
    return (f"{statistic}, permutation p-value ({shift_alarm.PERMUTATIONS} relabellings: the null is more items of the "
            f"reference's patients, so new patients alone can raise it; {pool_patients} held-out patient(s), fewer "
            f"than {MIN_POOL_GROUPS}, cannot calibrate it), verdict at α = {shift_alarm.ALPHA}")  # fmt: skip


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

"""The alarm a served run uses (`workbench.clinical.fit.shift_check`): its null calibrated on the held-out patients
the clinical layer keeps (`workbench.clinical.shift_alarm.patient_test`) when they are enough, the relabelling test
otherwise; and the run's layer and the predictor's answers say which null they used."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_clinical_predictor import ecg_run, records  # noqa: F401 (module fixtures: a ptbxl run and 6 records)

from workbench.clinical.fit import CLINICAL_JSON, MIN_POOL_GROUPS, shift_check
from workbench.clinical.predictor import ClinicalPredictor
from workbench.clinical.shift_alarm import mmd_test, model_features, patient_test
from workbench.core.npz import load_npz


def _patients(rng: np.random.Generator, count: int, items: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` patients of ``items`` items each in 8 dimensions: a patient mean (sd 1, moved by ``shift``) plus
    item noise (sd 0.5); (features (count·items, 8), patient ids)."""
    means = rng.normal(shift, 1.0, (count, 8))
    features = np.repeat(means, items, axis=0) + rng.normal(0, 0.5, (count * items, 8))
    return features, np.repeat([f"p{rng.integers(1 << 30)}-{i}" for i in range(count)], items)


def test_enough_held_out_patients_calibrate_the_null_and_too_few_fall_back_to_relabelling():
    rng = np.random.default_rng(0)
    reference, _ = _patients(rng, 30, 10)
    pool, pool_groups = _patients(rng, 40, 10)
    batch, batch_groups = _patients(rng, 3, 10)  # new patients of the same site
    calibrated = shift_check(reference, batch, batch_groups, pool, pool_groups, seed=3)
    assert calibrated["null"] == "held-out patients" and calibrated["pool_patients"] == 40
    assert calibrated == patient_test(reference, batch, batch_groups, pool, pool_groups, seed=3)
    few = np.isin(pool_groups, np.unique(pool_groups)[: MIN_POOL_GROUPS - 1])
    fallback = shift_check(reference, batch, batch_groups, pool[few], pool_groups[few], seed=3)
    assert fallback == {**mmd_test(reference, batch, seed=3), "null": "reference items (relabelled)"}
    assert shift_check(reference, batch, batch_groups, None, None, seed=3)["null"] == "reference items (relabelled)"


def test_the_run_keeps_its_validation_patients_and_the_served_answers_use_them(ecg_run, records):  # noqa: F811
    summary = json.loads((ecg_run / CLINICAL_JSON).read_text())
    arrays = load_npz(ecg_run / "clinical.npz")
    patients = len(np.unique(arrays["pool_groups"]))
    assert summary["shift"]["pool_patients"] == patients and len(arrays["pool_features"]) == len(arrays["pool_groups"])
    assert arrays["pool_features"].shape[1] == arrays["reference_features"].shape[1]
    assert patients == 12  # the embedded validation split's 12 records, each its own patient
    null = "held-out patients"
    assert summary["shift"]["test_split"]["null"] == null
    predictor = ClinicalPredictor.load(ecg_run, shift_window=4)
    first, second = predictor.answer(records, caller="a")[0]["shift"], predictor.answer(records, caller="a")[0]["shift"]
    assert first["null"] == null and first["batch"] == 6 and first["window"] == 6
    assert second["window"] == 10 and 0 < second["p_value"] <= 1  # the window's 4 earlier records join the batch
    # the first answer is the test of the batch's own features, its records as its patients, seeded by batch 0
    predictions, features = model_features(predictor.model, lambda: predictor.task.predict_folder(
        predictor.model, records, predictor.state))  # fmt: skip
    groups = np.array([row["record"] for row in predictions.rows])
    expected = shift_check(arrays["reference_features"], features, groups, arrays["pool_features"],
                           arrays["pool_groups"], 0)  # fmt: skip
    assert first["p_value"] == expected["p_value"] and first["statistic"] == pytest.approx(expected["statistic"])
    with pytest.raises(ValueError, match="one id per item"):
        patient_test(arrays["reference_features"], arrays["pool_features"][:3], np.array(["a"]),
                     arrays["pool_features"], arrays["pool_groups"])  # fmt: skip

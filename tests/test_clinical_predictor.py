"""End to end on the embedded data: an adapt run keeps its calibration, conformal calibration and shift reference
(sealed), ``workbench predict`` adds calibrated probabilities, sets and the batch's shift verdict, and
`ClinicalPredictor` answers the same from several threads."""

from __future__ import annotations

import csv
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("wfdb")

from workbench.domains.ecg.readers import EMBEDDED_PTBXL  # noqa: E402

import workbench  # noqa: E402
from workbench.clinical import calibration  # noqa: E402
from workbench.clinical.fit import CLINICAL_JSON, CLINICAL_NPZ, RELIABILITY_PNG  # noqa: E402
from workbench.clinical.predictor import ClinicalPredictor  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.core.seal import verify  # noqa: E402

CLASSES = ["NORM", "MI", "STTC", "CD", "HYP"]


@pytest.fixture(scope="module")
def ecg_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("clinical") / "run"
    workbench.adapt("ptbxl", "lora", out=str(out), epochs=1, baselines=[], quiet=True)
    return out


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    for header in sorted((Path(EMBEDDED_PTBXL) / "records100" / "00000").glob("*.hea"))[:6]:
        for suffix in (".hea", ".dat"):
            shutil.copy(header.with_suffix(suffix), folder / header.with_suffix(suffix).name)
    return folder


def test_the_run_keeps_its_clinical_files_sealed_and_reports_them(ecg_run):
    summary = json.loads((ecg_run / CLINICAL_JSON).read_text())
    assert summary["multilabel"] is True and len(summary["calibration"]["temperatures"]) == len(CLASSES)
    assert summary["calibration"]["fit_items"] < 30  # 12 validation records: no temperature is fitted on 6
    assert summary["calibration"]["unfitted_classes"] == list(range(len(CLASSES)))
    assert summary["calibration"]["temperatures"] == [1.0] * len(CLASSES)
    assert summary["conformal"]["alpha"] == 0.1
    assert summary["shift"]["test_split"]["verdict"] in ("shift", "no shift")
    files = json.loads((ecg_run / "seal.json").read_text())["files"]
    assert {CLINICAL_JSON, CLINICAL_NPZ, RELIABILITY_PNG} <= set(files)
    assert verify(ecg_run).ok
    report = (ecg_run / "report.md").read_text()
    assert "## Calibration, conformal sets and shift check" in report and "(reliability.png)" in report
    arrays = np.load(ecg_run / CLINICAL_NPZ)
    assert arrays["reference_features"].shape[0] <= 500
    assert arrays["calibration_probabilities"].shape == (summary["conformal"]["calibration_items"], len(CLASSES))


def test_predict_writes_calibrated_probabilities_sets_and_the_batch_shift(ecg_run, records, tmp_path):
    output = tmp_path / "p.csv"
    workbench.predict(ecg_run, records, output)
    rows = list(csv.DictReader(output.open()))
    assert len(rows) == 6 and all(row["status"] == "ok" for row in rows)
    temperatures = np.array(json.loads((ecg_run / CLINICAL_JSON).read_text())["calibration"]["temperatures"])
    raw = np.array([[float(row[f"p_{c}"]) for c in CLASSES] for row in rows])
    calibrated = np.array([[float(row[f"calibrated_p_{c}"]) for c in CLASSES] for row in rows])
    assert np.allclose(calibrated, calibration.apply_temperature(raw, temperatures, True), atol=2e-6)
    assert all(set(filter(None, row["conformal_set"].split("|"))) <= set(CLASSES) for row in rows)
    record = json.loads(output.with_suffix(".json").read_text())["clinical"]
    assert record["shift"]["batch"] == 6 and record["shift"]["verdict"] in ("shift", "no shift")
    assert 0 < record["shift"]["p_value"] <= 1 and record["conformal_kind"] == "split"  # 6 items: no weights


def test_the_predictor_describes_the_run_and_answers_from_several_threads(ecg_run, records):
    predictor = ClinicalPredictor.load(ecg_run, shift_window=16)
    described = predictor.describe()
    json.dumps(described)  # JSON-able
    assert described["task"] == "ptbxl" and described["method"] == "lora"
    assert len(described["adapter_sha256"]) == 64 and described["conformal"]["calibration_size"] > 0
    assert described["shift"]["window"] == 16 and described["intended_use"] is None
    with ThreadPoolExecutor(4) as pool:
        batches = list(pool.map(predictor.answer, [records] * 8))
    first = batches[0]
    assert len(first) == 6 and all(a["status"] == "ok" for a in first)
    for answers in batches:  # every thread got the same probabilities and sets for the same records
        assert [a["probabilities"] for a in answers] == [a["probabilities"] for a in first]
        assert [a["record"] for a in answers] == [a["record"] for a in first]
        json.dumps(answers)
    windows = sorted(answers[0]["shift"]["window"] for answers in batches)
    assert windows[0] == 6 and windows[-1] == 6 + 16  # the rolling window fills to its limit, one batch at a time
    one = predictor.answer(records)[0]
    assert set(one) >= {"record", "status", "labels", "probabilities", "conformal_set", "shift"}
    assert set(one["probabilities"]) == set(CLASSES)


def test_a_single_record_is_a_batch_of_one_and_a_bad_record_says_why(ecg_run, records, tmp_path):
    predictor = ClinicalPredictor.load(ecg_run, shift_window=0)
    folder = tmp_path / "one"
    folder.mkdir()
    header = sorted(records.glob("*.hea"))[0]
    for suffix in (".hea", ".dat"):
        shutil.copy(header.with_suffix(suffix), folder / header.with_suffix(suffix).name)
    (folder / "broken.hea").write_text("broken 12 100 1000\n")
    answers = {a["record"]: a for a in predictor.answer(folder)}
    good = answers[header.stem]
    assert good["status"] == "ok" and good["shift"]["verdict"] == "too few" and good["shift"]["batch"] == 1
    assert answers["broken"]["status"].startswith("error") and answers["broken"]["probabilities"] == {}


def test_a_changed_clinical_file_is_refused(ecg_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ecg_run, copy)
    summary = json.loads((copy / CLINICAL_JSON).read_text())
    summary["calibration"]["temperatures"] = [1.0] * len(CLASSES)
    (copy / CLINICAL_JSON).write_text(json.dumps(summary))
    with pytest.raises(UserError, match=CLINICAL_JSON):
        ClinicalPredictor.load(copy)


def test_a_softmax_run_fits_its_temperature_and_answers_per_beat_with_class_sets(tmp_path):
    from workbench.domains.physio.task import EMBEDDED

    run = tmp_path / "physio"
    workbench.adapt("physio", "readout", out=str(run), epochs=1, train_size=64, val_size=128, batch_size=32,
                    baselines=[], quiet=True)  # fmt: skip
    summary = json.loads((run / CLINICAL_JSON).read_text())
    assert summary["multilabel"] is False and summary["calibration"]["fit_items"] >= 30
    assert summary["calibration"]["unfitted_classes"] == [] and len(summary["calibration"]["temperatures"]) == 1
    folder = tmp_path / "incoming"
    folder.mkdir()
    for suffix in (".hea", ".dat", ".atr"):
        shutil.copy((EMBEDDED / "site-D" / "D01").with_suffix(suffix), folder / f"D01{suffix}")
    answers = ClinicalPredictor.load(run).answer(folder)
    assert len(answers) > 20 and all(a["status"] == "ok" for a in answers)
    assert {"sample", "time_s", "annotation"} <= set(answers[0]["where"])
    assert all(set(a["conformal_set"]) <= {"N", "S", "V", "F"} for a in answers)
    assert answers[0]["conformal_kind"].startswith("weighted") and answers[0]["shift"]["batch"] == len(answers)
    assert all(sum(a["probabilities"].values()) == pytest.approx(1.0, abs=1e-5) for a in answers)  # one softmax

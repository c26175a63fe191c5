"""``workbench calibrate``: a ptbxl run's clinical layer fitted on a generated site's labelled records, and its use
by ``predict``, ``serve`` (`ClinicalPredictor.load`) and ``card`` (``--calibration LAYER``).

The site: 75 records of the generator's ambulance-monitor recipe (the run's target site) drawn with seed 200, so new
patients of that site; its patients are dealt 30 / 22 / 23 into temperature fit, conformal calibration and the
held-out report (enough fitting items for temperatures: `workbench.clinical.fit.MIN_FIT_ITEMS` is 30). Generating
them takes ~1.4 s a record (neurokit2's simulator, about 2 min for the module), paid once: the layer's coverage,
its record and predict's use of it run in the default suite; the other uses of the layer are marked ``slow``.
"""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("wfdb")
pytest.importorskip("neurokit2")
from conftest import cli, one_line_error  # noqa: E402
from scipy.stats import binomtest  # noqa: E402

from workbench.clinical import fit  # noqa: E402
from workbench.clinical.site_calibration import LAYER_JSON, PARTS, deal_groups  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.core.seal import SEAL, sha256_file, verify_seal  # noqa: E402

N_RECORDS = 75
CLASSES = ("NORM", "MI", "STTC", "CD", "HYP")


def _adapt(out: Path, seed: str) -> Path:
    result = cli("adapt", "--domain", "ptbxl", "--method", "readout", "--epochs", "1", "--baselines", "", "--quiet",
                 "--seed", seed, "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return _adapt(tmp_path_factory.mktemp("calibrate") / "run", "0")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """75 labelled records of a new draw of the run's target site, in PTB-XL's layout."""
    from workbench.domains.ecg.generate import DEFAULT_SITES, generate_ptbxl_synthetic

    recipe = replace(DEFAULT_SITES[1], n_records=N_RECORDS)  # the ambulance monitor, as the embedded target site
    return generate_ptbxl_synthetic(tmp_path_factory.mktemp("site") / "records", seed=200, sites=(recipe,))


@pytest.fixture(scope="module")
def layer(run_dir, site):
    """(the layer folder, the command's stdout)."""
    out = run_dir.parent / "layer"
    result = cli("calibrate", "--run", str(run_dir), "--data", str(site), "--out", str(out), "--seed", "200")
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def _report(layer_dir: Path) -> dict:
    return json.loads((layer_dir / fit.CLINICAL_JSON).read_text())


def test_the_site_layer_gives_narrow_sets_and_its_coverage_interval_is_the_exact_one(layer, site):
    layer_dir, stdout = layer
    summary = _report(layer_dir)
    report = summary["site_report"]
    patients = {str(int(float(row["patient_id"]))) for row in csv.DictReader((site / "ptbxl_database.csv").open())}
    record = json.loads((layer_dir / LAYER_JSON).read_text())
    parts = {name: set(part["groups"]) for name, part in record["parts"].items()}
    assert set(parts) == {name for name, _ in PARTS}
    assert set.union(*parts.values()) == patients and sum(map(len, parts.values())) == len(patients)  # disjoint
    assert report["items"] == len(parts["report"]) == record["parts"]["report"]["items"]  # one record per patient
    assert summary["calibration"]["fit_items"] == record["parts"]["temperature"]["items"] >= fit.MIN_FIT_ITEMS
    fitted = [t for k, t in enumerate(summary["calibration"]["temperatures"])
              if k not in summary["calibration"]["unfitted_classes"]]  # a class with one label only keeps T = 1
    assert len(fitted) >= 3 and any(abs(t - 1) > 0.05 for t in fitted)
    # non-trivial sets: the embedded run's own layer holds every class in every set
    assert report["mean_set_size"] < len(CLASSES) and report["all_classes_rate"] < 1
    assert report["mean_set_size"] == pytest.approx(sum(report["set_frequency"].values()))
    assert all(q is not None for q in summary["conformal"]["quantiles"])
    # the interval is scipy's exact one of the counts reported
    assert report["trials"] == report["items"] * len(CLASSES)
    assert report["coverage"] == pytest.approx(report["covered"] / report["trials"])
    exact = binomtest(report["covered"], report["trials"]).proportion_ci(confidence_level=0.95, method="exact")
    assert report["coverage_interval"] == pytest.approx([exact.low, exact.high], abs=1e-12)
    for name, c in report["per_class_coverage"].items():
        exact = binomtest(c["covered"], report["items"]).proportion_ci(method="exact")
        assert c["interval"] == pytest.approx([exact.low, exact.high], abs=1e-12), name
        assert c["interval"][1] >= 0.75, name  # every class's interval reaches near nominal (0.90)
    # held-out coverage against nominal: the exact interval reaches it, the estimate within 0.1 of it
    assert report["coverage_interval"][1] >= report["nominal_coverage"]
    assert report["coverage"] >= report["nominal_coverage"] - 0.1
    assert 0 <= report["empty_rate"] <= 1 and 0 <= report["empty_label_sets"] <= 1
    assert f"coverage {report['coverage']:.3f} [{report['coverage_interval'][0]:.3f}" in stdout
    assert all(f"  {name:<10}" in stdout for name in CLASSES)


def test_the_layer_is_sealed_outside_the_run_and_records_its_run_and_data(layer, run_dir, site):
    layer_dir, _ = layer
    assert verify_seal(layer_dir) == []
    content = json.loads((layer_dir / SEAL).read_text())
    assert content["kind"] == "calibration"
    assert {"clinical.json", "clinical.npz", "reliability.png", LAYER_JSON} <= set(content["files"])
    record = json.loads((layer_dir / LAYER_JSON).read_text())
    assert record["run"]["adapter_sha256"] == sha256_file(run_dir / "adapter.safetensors")
    assert record["run"]["seal_sha256"] == sha256_file(run_dir / SEAL)
    assert record["data"]["files"] == sum(1 for path in site.rglob("*") if path.is_file())
    assert verify_seal(run_dir) == []  # nothing was written into the run


def test_groups_are_dealt_into_disjoint_parts_of_at_least_one():
    parts = deal_groups([f"p{i}" for i in range(10)], seed=200)
    assert [len(parts[name]) for name, _ in PARTS] == [4, 3, 3]
    assert sorted(sum(parts.values(), [])) == sorted(f"p{i}" for i in range(10))
    assert [len(part) for part in deal_groups(["a", "b", "c"], seed=200).values()] == [1, 1, 1]
    with pytest.raises(UserError, match="needs at least 3"):
        deal_groups(["a", "b"], seed=200)


def test_a_layer_inside_a_run_or_over_another_folder_is_refused(run_dir, tmp_path):
    site = tmp_path / "records"  # refused before any record is read
    site.mkdir()
    for out in (run_dir / "layer", run_dir / "results" / "layer"):
        one_line_error(cli("calibrate", "--run", str(run_dir), "--data", str(site), "--out", str(out)),
                       f"--out {out}", "inside the run folder")  # fmt: skip
    one_line_error(cli("calibrate", "--run", str(run_dir), "--data", str(site), "--out", str(run_dir), "--overwrite"),
                   "not a calibration layer")  # fmt: skip
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    one_line_error(cli("calibrate", "--run", str(run_dir), "--data", str(site), "--out", str(tmp_path / "notes"),
                       "--overwrite"), "not a calibration layer")  # fmt: skip
    assert [path.name for path in (tmp_path / "notes").iterdir()] == ["keep.txt"]
    assert verify_seal(run_dir) == []


@pytest.mark.slow
def test_an_earlier_layer_is_replaced_only_with_overwrite(run_dir, site, layer):
    one_line_error(cli("calibrate", "--run", str(run_dir), "--data", str(site), "--out", str(layer[0])),
                   "already exists", "--overwrite")  # fmt: skip
    assert verify_seal(layer[0]) == []


def test_a_wrong_data_folder_is_one_line_naming_it(run_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(cli("calibrate", "--run", str(run_dir), "--data", str(empty), "--out", str(tmp_path / "layer")),
                   str(empty), "PTB-XL's layout")  # fmt: skip
    one_line_error(cli("calibrate", "--run", str(run_dir), "--data", str(tmp_path / "nothing"), "--out",
                       str(tmp_path / "layer")), "--data", "no such folder")  # fmt: skip
    assert not (tmp_path / "layer").exists()


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def test_predict_with_the_layer_uses_its_temperatures_and_sets(run_dir, layer, site, tmp_path):
    layer_dir, _ = layer
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for path in sorted((site / "records100" / "00000").glob("0000[1-8]_lr.*")):
        shutil.copy(path, inputs / path.name)
    assert cli("predict", "--run", str(run_dir), "--input", str(inputs), "--output",
               str(tmp_path / "own.csv")).returncode == 0  # fmt: skip
    result = cli("predict", "--run", str(run_dir), "--input", str(inputs), "--output", str(tmp_path / "site.csv"),
                 "--calibration", str(layer_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"clinical layer: {layer_dir.resolve()}" in result.stdout
    own, site_rows = _rows(tmp_path / "own.csv"), _rows(tmp_path / "site.csv")
    temperatures = np.array(_report(layer_dir)["calibration"]["temperatures"])
    raw = np.array([[float(row[f"p_{c}"]) for c in CLASSES] for row in site_rows])
    expected = 1 / (1 + np.exp(-np.log(raw / (1 - raw)) / temperatures))  # sigmoid(logit(p) / T), per class
    calibrated = np.array([[float(row[f"calibrated_p_{c}"]) for c in CLASSES] for row in site_rows])
    assert calibrated == pytest.approx(expected, abs=2e-6)  # the CSV keeps 6 decimals
    assert raw == pytest.approx(np.array([[float(row[f"p_{c}"]) for c in CLASSES] for row in own]))
    run_calibrated = np.array([[float(row[f"calibrated_p_{c}"]) for c in CLASSES] for row in own])
    assert np.abs(run_calibrated - calibrated).max() > 1e-3  # the run's own layer fitted no temperature
    record = json.loads((tmp_path / "site.json").read_text())
    assert record["clinical"]["layer"]["source"] == "site calibration layer"
    assert record["clinical"]["calibration"]["temperatures"] == pytest.approx(temperatures.tolist())
    assert json.loads((tmp_path / "own.json").read_text())["clinical"]["layer"]["source"] == "run"


@pytest.mark.slow
def test_a_tampered_layer_or_another_runs_layer_is_refused(run_dir, layer, site, tmp_path):
    from workbench.clinical.predictor import ClinicalPredictor

    layer_dir, _ = layer
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for path in (site / "records100" / "00000").glob("00001_lr.*"):
        shutil.copy(path, inputs / path.name)
    tampered = tmp_path / "tampered"
    shutil.copytree(layer_dir, tampered)
    summary = _report(tampered)
    summary["calibration"]["temperatures"] = [1.0] * len(CLASSES)
    (tampered / fit.CLINICAL_JSON).write_text(json.dumps(summary))
    one_line_error(cli("predict", "--run", str(run_dir), "--input", str(inputs), "--output", str(tmp_path / "t.csv"),
                       "--calibration", str(tampered)), str(tampered / fit.CLINICAL_JSON))  # fmt: skip
    assert not (tmp_path / "t.csv").exists()
    other = _adapt(tmp_path / "other-run", "1")
    line = one_line_error(cli("predict", "--run", str(other), "--input", str(inputs), "--output",
                              str(tmp_path / "o.csv"), "--calibration", str(layer_dir)),
                          str(layer_dir / LAYER_JSON), "run.adapter_sha256", "another run")  # fmt: skip
    assert str(run_dir.resolve()) in line
    one_line_error(cli("card", str(other), "--calibration", str(layer_dir), "--output", str(tmp_path / "c.md")),
                   "run.adapter_sha256")  # fmt: skip
    one_line_error(cli("predict", "--run", str(run_dir), "--input", str(inputs), "--output", str(tmp_path / "r.csv"),
                       "--calibration", str(run_dir)), "field kind is 'run'")  # fmt: skip
    with pytest.raises(UserError, match="run.adapter_sha256"):
        ClinicalPredictor.load(other, calibration=layer_dir)


@pytest.mark.slow
def test_serve_and_the_card_name_the_site_layer_and_its_report(run_dir, layer, tmp_path, monkeypatch):
    import workbench.core.seal as seal
    from workbench.cli.parser import parse
    from workbench.clinical.predictor import ClinicalPredictor

    layer_dir, _ = layer
    assert parse(["serve", "--run", str(run_dir), "--calibration", str(layer_dir)]).calibration == str(layer_dir)
    verified, verify = [], seal.verify_seal

    def counted(folder, *args, **kwargs):  # the real check, counted
        verified.append(Path(folder))
        return verify(folder, *args, **kwargs)

    monkeypatch.setattr(seal, "verify_seal", counted)
    described = ClinicalPredictor.load(run_dir, calibration=layer_dir).describe()  # what serve's /model says
    assert verified.count(Path(layer_dir)) == 1  # the layer's seal is checked once, before the model loads
    monkeypatch.undo()
    report = _report(layer_dir)["site_report"]
    assert described["clinical_layer"]["source"] == "site calibration layer"
    assert described["clinical_layer"]["site_report"] == report
    assert described["calibration"]["temperatures"] == _report(layer_dir)["calibration"]["temperatures"]
    assert ClinicalPredictor.load(run_dir).describe()["clinical_layer"]["source"] == "run"  # the default
    result = cli("card", str(run_dir), "--calibration", str(layer_dir), "--output", str(tmp_path / "card.md"))
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "card.md").read_text()
    low, high = report["coverage_interval"]
    assert "## Site calibration" in text and "fitted on the site's own labelled records" in text
    assert f"coverage {report['coverage']:.3f} [{low:.3f}, {high:.3f}]" in text
    for name, c in report["per_class_coverage"].items():
        assert f"| {name} | {report['set_frequency'][name]:.3f} | {c['coverage']:.3f} [" in text
    own = (tmp_path / "own.md")
    assert cli("card", str(run_dir), "--output", str(own)).returncode == 0
    own_text = own.read_text()
    assert "## Site calibration" not in own_text
    frequency = json.loads((run_dir / fit.CLINICAL_JSON).read_text())["conformal"]["test_set_frequency"]
    assert "How often each class is in a set on the test split: " + ", ".join(
        f"{name} {share:.3f}" for name, share in zip(CLASSES, frequency)) in own_text  # fmt: skip

"""The ``ptbxl`` task end to end through the CLI: adapt on the embedded data, re-score, batch prediction."""

from __future__ import annotations

import csv
import json
import shutil

import pandas as pd
import pytest
from workbench.domains.ecg.readers import EMBEDDED_PTBXL

import workbench
from workbench.cli import main
from workbench.core.metrics import choose_thresholds

RECORDS = EMBEDDED_PTBXL / "records100" / "00000"


def cli(argv, capsys):
    """(exit code, stdout, stderr) of ``workbench argv`` run in this process."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ptbxl") / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["adapt", "--domain", "ptbxl", "--epochs", "2", "--quiet", "--out", str(out)])
    assert exit_info.value.code == 0
    return out


@pytest.mark.slow
def test_adapt_writes_metrics_costs_and_report(run_dir):
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["method"] == "htuning" and set(metrics["baselines"]) == {"full", "lora", "distill"}
    for scores in (metrics["before"], metrics["after"], *metrics["baselines"].values()):
        for key in ("macro_auroc", "macro_average_precision", "macro_f1"):
            assert 0.0 <= scores[key] <= 1.0, key
    for name in ("htuning", "full", "lora", "distill"):
        cost = metrics["costs"][name]
        assert cost["peak_memory_bytes"] > 0 and cost["train_seconds"] > 0
        assert 0 < cost["trainable_parameters"] <= cost["total_parameters"]
    assert metrics["costs"]["htuning"]["trainable_parameters"] < metrics["costs"]["full"]["trainable_parameters"]
    # the run's own training memory (tensor bytes of one step, batch 8): 12.3 MiB for full, 4.0 for H-Tuning
    step_bytes = {name: metrics["costs"][name]["training_step_bytes"] for name in ("htuning", "full", "lora")}
    assert step_bytes["full"] > 2.5 * step_bytes["htuning"] > 0 and step_bytes["lora"] > step_bytes["htuning"]
    assert metrics["costs"]["distill"]["total_parameters"] * 19 < metrics["costs"]["full"]["total_parameters"]
    assert metrics["costs"]["distill"]["epochs"] == 3 * 2  # the student trains epochs_factor × --epochs
    for name in ("report.md", "roc_curves.png", "confusion_tables.png", "adapter.safetensors"):
        assert (run_dir / name).is_file(), name
    state = json.loads((run_dir / "adapter.json").read_text())["task_state"]
    assert state["classes"] == ["NORM", "MI", "STTC", "CD", "HYP"] and len(state["thresholds"]) == 5


@pytest.mark.slow
def test_reloaded_run_scores_as_recorded(run_dir):
    after = json.loads((run_dir / "metrics.json").read_text())["after"]
    again = workbench.evaluate(run_dir)
    for key in ("macro_auroc", "macro_average_precision", "macro_f1"):
        assert again[key] == pytest.approx(after[key], abs=1e-6), key


@pytest.mark.slow
def test_predict_reports_a_corrupt_record_and_scores_the_rest(run_dir, tmp_path, capsys):
    folder = tmp_path / "records"
    folder.mkdir()
    for suffix in (".hea", ".dat"):
        shutil.copy(RECORDS / f"00001_lr{suffix}", folder / f"00001_lr{suffix}")
        shutil.copy(RECORDS / f"00002_lr{suffix}", folder / f"00002_lr{suffix}")
    data = (folder / "00002_lr.dat").read_bytes()
    (folder / "00002_lr.dat").write_bytes(data[: len(data) // 3])  # truncated
    output = tmp_path / "out" / "predictions.csv"
    code, out, err = cli(["predict", "--run", run_dir, "--input", folder, "--output", output], capsys)
    assert code == 0, err
    rows = list(csv.DictReader(output.open()))
    assert [row["record"] for row in rows] == ["00001_lr", "00002_lr"]
    assert rows[0]["status"] == "ok" and 0.0 <= float(rows[0]["p_NORM"]) <= 1.0 and rows[0]["label_NORM"] in "01"
    assert rows[1]["status"].startswith("error:") and "truncated" in rows[1]["status"] and rows[1]["p_NORM"] == ""
    sidecar = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert sidecar["records"] == 2 and sidecar["failed"] == 1 and len(sidecar["thresholds"]) == 5
    assert sidecar["workbench_version"] == workbench.__version__
    hashes = sidecar["sha256"]
    assert set(hashes["adapter"]) == {"adapter.safetensors", "adapter.json"}
    assert len(hashes["base_model"]) == 2 and "ptbxl-synthetic" in hashes["data_cards"]


@pytest.mark.slow
def test_predict_bad_input_is_a_clear_error(run_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["--run", tmp_path / "nothing", "--input", empty], "not a finished run"),
        (["--run", run_dir, "--input", tmp_path / "missing"], "no such folder"),
        (["--run", run_dir, "--input", empty], "no WFDB record"),
    ]
    for arguments, message in cases:
        code, _, err = cli(["predict", *arguments, "--output", tmp_path / "p.csv"], capsys)
        assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.slow
def test_distilled_student_from_a_finished_run_reloads_and_predicts(run_dir, tmp_path, capsys):
    from workbench.models.ecg import ECGStudent

    out = tmp_path / "student"
    argv = ["adapt", "--domain", "ptbxl", "--method", "distill", "--teacher", run_dir, "--n-leads", "3"]
    code, _, err = cli([*argv, "--baselines", "", "--epochs", "2", "--quiet", "--out", out], capsys)
    assert code == 0, err
    assert "teacher = the adapted model of" in (out / "log.txt").read_text()
    run = workbench.Run.load(out)
    assert isinstance(run.model, ECGStudent) and run.model.architecture["n_chans"] == 3
    again = workbench.evaluate(out)
    assert again["macro_auroc"] == pytest.approx(run.metrics["after"]["macro_auroc"], abs=1e-6)
    folder = tmp_path / "records"
    folder.mkdir()
    for suffix in (".hea", ".dat"):
        shutil.copy(RECORDS / f"00001_lr{suffix}", folder / f"00001_lr{suffix}")
    code, _, err = cli(["predict", "--run", out, "--input", folder, "--output", tmp_path / "p.csv"], capsys)
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert rows[0]["status"] == "ok" and json.loads((tmp_path / "p.json").read_text())["method"] == "distill"
    # the student is self-contained: it reloads after its teacher's run is gone
    shutil.copytree(run_dir, tmp_path / "teacher")
    shutil.rmtree(run_dir)
    try:
        assert isinstance(workbench.Run.load(out).model, ECGStudent)
    finally:
        shutil.copytree(tmp_path / "teacher", run_dir)


@pytest.mark.slow
def test_data_in_the_published_ptbxl_layout_uses_its_recommended_folds(tmp_path, capsys):
    """``--data FOLDER``: the embedded set is itself in PTB-XL's layout; every site is the target then."""
    out = tmp_path / "run"
    argv = ["adapt", "--domain", "ptbxl", "--data", EMBEDDED_PTBXL, "--baselines", "", "--epochs", "1"]
    code, _, err = cli([*argv, "--quiet", "--out", out], capsys)
    assert code == 0, err
    metrics = json.loads((out / "metrics.json").read_text())
    folds = pd.read_csv(EMBEDDED_PTBXL / "ptbxl_database.csv")["strat_fold"]
    expected = {"train": int((folds <= 8).sum()), "val": int((folds == 9).sum()), "test": int((folds == 10).sum())}
    assert metrics["samples"] == expected and metrics["data"] == str(EMBEDDED_PTBXL)


@pytest.mark.slow
def test_resume_reruns_an_unfinished_student_from_the_saved_teacher(run_dir, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    finished = json.loads((copy / "metrics.json").read_text())
    for name in ("metrics.json", "results/distill.json", "results/distill.predictions.safetensors"):
        (copy / name).unlink()
    argv = ["adapt", "--domain", "ptbxl", "--epochs", "2", "--quiet", "--out", copy, "--resume"]
    code, _, err = cli(argv, capsys)
    assert code == 0, err
    resumed = json.loads((copy / "metrics.json").read_text())
    for name in ("full", "lora", "distill"):  # reused, reused, retrained from the htuning adapter: the same numbers
        assert resumed["baselines"][name] == finished["baselines"][name], name


def test_distill_refuses_a_teacher_that_is_not_a_run(tmp_path, capsys):
    argv = ["adapt", "--domain", "ptbxl", "--method", "distill", "--teacher", tmp_path, "--out", tmp_path / "r"]
    code, _, err = cli(argv, capsys)
    assert code == 2 and "not a finished run directory" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_adapt_refuses_the_source_site(tmp_path, capsys):
    code, _, err = cli(["adapt", "--domain", "ptbxl", "--target-site", "0", "--out", tmp_path / "r"], capsys)
    assert code == 2 and "source site" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_thresholds_maximise_validation_f1():
    import numpy as np

    truth = np.array([[1, 0], [1, 0], [0, 0], [0, 1]], dtype=float)
    probabilities = np.array([[0.9, 0.2], [0.3, 0.1], [0.2, 0.4], [0.1, 0.35]])
    thresholds = choose_thresholds(truth, probabilities)
    assert thresholds[0] == pytest.approx(0.3)  # both positives above, the negatives below
    assert thresholds[1] == pytest.approx(0.35)  # the one positive ranks second: F1 2/3

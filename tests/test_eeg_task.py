"""The EEG tasks ``sleepedf`` and ``motor-imagery`` end to end on the embedded EDF files: run directories with their
metrics and split manifest, subject-disjoint splits, prediction on a folder (a corrupt file reported, never
dropped), and the bad inputs that must stop a run before its directory appears (exit code 2 on the command line).
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("braindecode")
edfio = pytest.importorskip("edfio")

from workbench.domains.eeg.task import EMBEDDED_SLEEP  # noqa: E402
from workbench.domains.eeg.window_task import LBM_LORA, scale_windows  # noqa: E402
from workbench.domains.splits import split_subjects  # noqa: E402

import workbench  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.core.registry import tasks  # noqa: E402

pytestmark = pytest.mark.slow

TINY = {"epochs": 1, "train_size": 12, "val_size": 6, "batch_size": 6, "baselines": [], "quiet": True}
SLEEP_KEYS = {"balanced_accuracy", "cohen_kappa", "macro_f1", "accuracy", "f1_W", "f1_N1", "f1_N2", "f1_N3", "f1_REM"}
PSG = EMBEDDED_SLEEP / "sleep-cassette" / "SC4001E0-PSG.edf"
HYPNOGRAM = EMBEDDED_SLEEP / "sleep-cassette" / "SC4001EC-Hypnogram.edf"


@pytest.fixture(scope="module")
def sleep_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sleep") / "run"
    workbench.adapt("sleepedf", "lora", out=str(out), **TINY)
    return out


def test_sleepedf_end_to_end_writes_a_run_with_the_metrics_and_the_split_manifest(sleep_run):
    metrics = json.loads((sleep_run / "metrics.json").read_text())
    assert metrics["task"] == "sleepedf" and metrics["method"] == "lora"
    assert set(metrics["after"]) == SLEEP_KEYS and set(metrics["before"]) == SLEEP_KEYS
    assert all(np.isfinite(value) for value in metrics["after"].values())
    summary = metrics["data_summary"]
    assert sorted(sum(summary["split"].values(), [])) == ["00", "01", "02", "03", "04", "05"]
    assert [len(summary["split"][name]) for name in ("train", "val", "test")] == [4, 1, 1]
    assert summary["channels"] == ["EEG Fpz-Cz", "EEG Pz-Oz"] and summary["sfreq_hz"] == 100.0
    assert summary["channel_map"] == {"EEG Fpz-Cz": "FPZ", "EEG Pz-Oz": "PZ"}  # the reported approximation
    assert summary["excluded"] == {"Movement time": 3, "Sleep stage ?": 3}
    assert summary["model_load"]["missing"] == ["final_layer.weight", "final_layer.bias"]  # the shipped backbone
    config = yaml.safe_load((sleep_run / "config.yaml").read_text())
    study = {**LBM_LORA, "head": "train", "compute": "weight"}  # the LBM study's LoRA; the other options: defaults
    assert {name: config["method_options"][name] for name in study} == study
    for name in ("config.yaml", "adapter.safetensors", "adapter.json", "confusion_matrices.png", "hypnograms.png"):
        assert (sleep_run / name).is_file(), name
    assert "hypnograms.png" in (sleep_run / "report.md").read_text()


def test_motor_imagery_end_to_end_with_four_classes(tmp_path):
    out = tmp_path / "run"
    workbench.adapt("motor-imagery", "full", out=str(out), class_set="all", scaling="zscore", **TINY)
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"balanced_accuracy", "cohen_kappa", "macro_f1", "accuracy"} <= set(metrics["after"])
    summary = metrics["data_summary"]
    assert set(summary["class_counts"]["test"]) == {"left_fist", "right_fist", "both_fists", "both_feet"}
    assert [len(summary["split"][name]) for name in ("train", "val", "test")] == [6, 1, 1]
    assert summary["scaling"] == "zscore" and (out / "confusion_matrices.png").is_file()


@pytest.mark.parametrize("name", ["sleepedf", "motor-imagery"])
def test_splits_are_subject_disjoint_for_every_seed(name):
    task = tasks.get(name)(val_subjects=2, test_subjects=2)
    task.progress = False
    for seed in range(4):
        raw = task.read(None, seed)
        split = raw.split
        sets = [set(split[part]) for part in ("train", "val", "test")]
        assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
        assert set().union(*sets) == set(raw.windows.subjects.tolist())
        data, _ = task.prepare(task.load_model(None), raw, 10_000, 10_000, seed)
        for part, samples in (("train", data.train), ("val", data.val), ("test", data.test)):
            assert {s.subject for s in samples} == set(split[part]), part


def test_split_needs_a_training_subject_and_the_label_changes_with_the_seed():
    with pytest.raises(UserError, match="leaves none to train on"):
        split_subjects(["a", "b"], 1, 1, 0)
    tests = {tuple(split_subjects(list("abcdefgh"), 1, 1, seed)["test"]) for seed in range(8)}
    assert len(tests) > 1


def test_scaling_keeps_microvolts_over_100_or_standardises_each_channel():
    x = np.stack([np.linspace(-100, 100, 50), np.full(50, 7.0)])[None]
    np.testing.assert_allclose(scale_windows(x, "uv100")[0, 0, [0, -1]], [-1.0, 1.0], rtol=1e-6)
    z = scale_windows(x, "zscore")
    np.testing.assert_allclose(z[0, 0].std(), 1.0, rtol=1e-5)
    assert np.all(z[0, 1] == 0)  # a flat channel stays flat, never divided by zero
    with pytest.raises(UserError, match="scaling"):
        scale_windows(x, "volts")


def test_predict_gives_a_row_per_window_and_reports_a_corrupt_file(sleep_run, tmp_path):
    folder = tmp_path / "incoming"
    folder.mkdir()
    for name in ("SC4001E0-PSG.edf", "SC4001EC-Hypnogram.edf", "SC4011E0-PSG.edf"):
        shutil.copy(EMBEDDED_SLEEP / "sleep-cassette" / name, folder / name)
    (folder / "broken.edf").write_bytes(b"0       this is not an EDF header")
    record = workbench.predict(sleep_run, folder, tmp_path / "stages.csv")
    rows = list(csv.DictReader((tmp_path / "stages.csv").open()))
    expected = {}
    for name in ("SC4001E0-PSG.edf", "SC4011E0-PSG.edf"):
        expected[name] = int(edfio.read_edf(folder / name).duration // 30)
        mine = [row for row in rows if row["record"] == name]
        assert len(mine) == expected[name] and all(row["status"] == "ok" for row in mine)
        assert [float(row["onset_s"]) for row in mine] == [30.0 * k for k in range(expected[name])]
        assert all(row["predicted"] in ("W", "N1", "N2", "N3", "REM") for row in mine)
        p = np.array([[float(row[f"p_{c}"]) for c in ("W", "N1", "N2", "N3", "REM")] for row in mine])
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-4)
    broken = [row for row in rows if row["record"] == "broken.edf"]
    assert len(broken) == 1 and broken[0]["status"] == "error: 33 bytes: shorter than an EDF header (256 bytes)"
    assert not any("Hypnogram" in row["record"] for row in rows)
    assert record["failed"] == 1 and record["per_record"]["SC4011E0-PSG.edf"]["windows"] == expected["SC4011E0-PSG.edf"]
    assert record["per_record"]["broken.edf"]["status"].startswith("error:")


# ------------------------------------------------------------------------------------------- bad input
def _night(folder: Path, psg: bool = True, hypnogram: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if psg:
        shutil.copy(PSG, folder / PSG.name)
    if hypnogram:
        shutil.copy(HYPNOGRAM, folder / HYPNOGRAM.name)
    return folder


def _refused(tmp_path: Path, data: Path, match: str, **options) -> None:
    out = tmp_path / "run"
    with pytest.raises(UserError, match=match):
        workbench.adapt("sleepedf", "lora", data=str(data), out=str(out), on_bad_record="raise", **TINY, **options)
    assert not out.exists()


def test_a_psg_without_its_hypnogram_stops_the_run(tmp_path):
    _refused(tmp_path, _night(tmp_path / "d", hypnogram=False), r"SC4001E0-PSG\.edf: no hypnogram")


def test_a_missing_required_channel_is_named(tmp_path):
    folder = _night(tmp_path / "d", psg=False)
    edf = edfio.read_edf(PSG)
    edf.drop_signals(["EEG Pz-Oz"])
    edf.write(folder / PSG.name)
    _refused(tmp_path, folder, r"SC4001E0-PSG\.edf: channel\(s\) EEG Pz-Oz missing")


def test_a_sampling_rate_the_card_does_not_allow_is_named(tmp_path):
    folder = _night(tmp_path / "d", psg=False)
    edf = edfio.read_edf(PSG)
    signals = [
        edfio.EdfSignal(np.repeat(s.data, 2), 200, label=s.label, physical_dimension=s.physical_dimension,
                        physical_range=(s.physical_min, s.physical_max))
        for s in edf.signals if s.label.startswith("EEG")
    ]  # fmt: skip
    edfio.Edf(signals, starttime=edf.starttime, recording=edf.recording, data_record_duration=30).write(
        folder / PSG.name
    )
    _refused(tmp_path, folder, r"SC4001E0-PSG\.edf: sampling rate 200 Hz is not one the data card allows")


def test_annotations_past_the_end_of_the_recording_are_named(tmp_path):
    folder = _night(tmp_path / "d", hypnogram=False)
    hypnogram = edfio.read_edf(HYPNOGRAM)
    late = edfio.EdfAnnotation(edfio.read_edf(PSG).duration + 60, 30, "Sleep stage 2")
    annotations = [*hypnogram.annotations, late]
    edfio.Edf([], recording=hypnogram.recording, starttime=hypnogram.starttime, annotations=annotations).write(
        folder / HYPNOGRAM.name
    )
    _refused(tmp_path, folder, r"SC4001EC-Hypnogram\.edf: annotation 'Sleep stage 2' .* lies outside the recording")


def test_a_model_built_for_other_windows_is_refused(tmp_path):
    from workbench.models.eeg import save_eeg_model

    from workbench.core.registry import models

    model = models.get("labram")().load(
        n_chans=2,
        n_outputs=5,
        n_times=1500,
        sfreq=100.0,
        chs_info=({"ch_name": "EEG Fpz-Cz"}, {"ch_name": "EEG Pz-Oz"}),
        channel_map={"EEG Fpz-Cz": "FPZ", "EEG Pz-Oz": "PZ"},
    )
    save_eeg_model(model, tmp_path / "short.safetensors")
    out = tmp_path / "run"
    with pytest.raises(UserError, match="n_times"):
        workbench.adapt("sleepedf", "lora", model=str(tmp_path / "short.safetensors"), out=str(out), **TINY)
    assert not out.exists()


def test_the_command_line_exits_2_without_a_traceback_or_a_run_directory(tmp_path):
    folder = _night(tmp_path / "d", hypnogram=False)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "workbench", "adapt", "--domain", "sleepedf", "--data", str(folder)]
    result = subprocess.run(command + ["--out", str(out), "--epochs", "1"], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "SC4001E0-PSG.edf: no hypnogram" in result.stderr
    assert not out.exists()


def test_lora_runs_in_the_lbm_setting_and_the_users_flags_win():
    from workbench.core.config import RunRequest, resolve_config

    config, _ = resolve_config(RunRequest(domain="motor-imagery"))
    assert config.method == "lora" and {k: config.method_options[k] for k in LBM_LORA} == LBM_LORA
    given = {"targets": "fc", "dropout": 0.0}
    config, _ = resolve_config(RunRequest(domain="sleepedf", method_options=given))
    assert config.method_options["targets"] == "fc" and config.method_options["dropout"] == 0.0
    assert config.method_options["alpha"] == LBM_LORA["alpha"]  # what the user did not give stays the task's
    assert resolve_config(RunRequest(domain="sleepedf", method="full"))[0].method_options == {}

"""The ``physio`` task end to end: a run on an embedded site with its split manifest, subject-disjoint splits,
de Chazal's DS1/DS2 on MIT-BIH-named records (the real excerpt of record 100), beats resampled to the backbone's
rate, and the bad inputs that stop a run before its directory appears (exit code 2 on the command line)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import cli

pytest.importorskip("wfdb")
pytest.importorskip("neurokit2")

from workbench.domains.physio.task import BEAT_SAMPLES, CLASSES, EMBEDDED, model_inputs  # noqa: E402

import workbench  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.core.registry import tasks  # noqa: E402

MITBIH = Path(__file__).parent / "data" / "real" / "physio" / "mitdb"
TINY = {"epochs": 1, "train_size": 32, "val_size": 16, "batch_size": 16, "baselines": [], "quiet": True}


def mitbih_named(folder: Path, names=("100", "101", "106")) -> Path:
    """The real excerpt of record 100 under MIT-BIH record names (DS2: 100; DS1: 101, 106)."""
    folder.mkdir(parents=True)
    for name in names:
        for suffix in (".dat", ".atr"):
            shutil.copy(MITBIH / f"100{suffix}", folder / f"{name}{suffix}")
        header = (MITBIH / "100.hea").read_text().replace("100.dat", f"{name}.dat")
        (folder / f"{name}.hea").write_text(header.replace("100", name, 1))
    return folder


@pytest.mark.slow
def test_a_run_on_an_embedded_site_writes_metrics_and_the_split_manifest(tmp_path):
    out = tmp_path / "run"
    workbench.adapt("physio", "lora", out=str(out), target_site="B", **TINY)
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["after"]) == set(tasks.get("physio").metrics)
    summary = metrics["data_summary"]
    split = summary["split"]
    assert [len(split[k]) for k in ("train", "val", "test")] == [3, 1, 2]
    assert sorted(sum(split.values(), [])) == [f"B0{k}" for k in range(1, 7)]
    assert summary["sfreq_hz"] == 250 and summary["notes"] == []  # site B records at the backbone's rate
    assert (out / "confusion_matrices.png").is_file()


def test_splits_are_subject_disjoint_and_need_two_labelled_classes():
    task = tasks.get("physio")(val_subjects=1, test_subjects=2)
    task.progress = False
    for seed in range(3):
        split = task.read(None, seed).split
        sets = [set(split[k]) for k in ("train", "val", "test")]
        assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    with pytest.raises(UserError, match="leaves none to train on"):
        tasks.get("physio")(test_subjects=5).read(None, 0)


def test_mitbih_names_give_de_chazals_split_and_beats_are_resampled(tmp_path):
    task = tasks.get("physio")()
    task.progress = False
    raw = task.read(mitbih_named(tmp_path / "mitdb"), seed=0)
    assert raw.split["test"] == ["100"] and sorted(raw.split["train"] + raw.split["val"]) == ["101", "106"]
    data, _ = task.prepare(task.load_model(None), raw, 10_000, 10_000, 0)
    assert data.summary["notes"] == ["beats resampled from 360 Hz to the backbone's 250 Hz"]
    assert data.summary["absent_classes"] == ["F"] and data.train[0].beat.shape == (BEAT_SAMPLES,)


def test_model_inputs_resample_and_standardise_each_beat():
    t = np.arange(252) / 360
    beats = np.stack([np.sin(2 * np.pi * 5 * t), 3 + 2 * np.cos(2 * np.pi * 5 * t)])
    x = model_inputs(beats, 360.0)
    assert x.shape == (2, BEAT_SAMPLES) == (2, 175) and x.dtype == np.float32
    np.testing.assert_allclose(x.mean(axis=1), 0, atol=1e-5)
    np.testing.assert_allclose(x.std(axis=1), 1, rtol=1e-4)
    at_rate = beats[:, :175]  # already at 250 Hz: only standardised
    expected = (at_rate - at_rate.mean(axis=1, keepdims=True)) / at_rate.std(axis=1, keepdims=True)
    np.testing.assert_allclose(model_inputs(at_rate, 250.0), expected, rtol=1e-4, atol=1e-5)


def test_one_labelled_class_and_a_missing_folder_stop_the_run_with_exit_code_2(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    for name in ("s1", "s2", "s3", "s4"):  # every beat normal
        for suffix in (".dat", ".hea"):
            shutil.copy(EMBEDDED / "site-A" / f"A01{suffix}", site / f"{name}{suffix}")
        (site / f"{name}.hea").write_text((EMBEDDED / "site-A" / "A01.hea").read_text().replace("A01", name))
    import wfdb

    annotation = wfdb.rdann(str(EMBEDDED / "site-A" / "A01"), "atr")
    for name in ("s1", "s2", "s3", "s4"):
        wfdb.wrann(name, "atr", annotation.sample, symbol=["N"] * len(annotation.sample), write_dir=str(site))
    out = tmp_path / "run"
    with pytest.raises(UserError, match=r"have beats of \['N'\] class only"):
        workbench.adapt("physio", "lora", data=str(site), out=str(out), **TINY)
    assert not out.exists()
    result = cli("adapt", "--domain", "physio", "--data", str(tmp_path / "nothing"), "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr and "no such folder" in result.stderr
    assert not out.exists()
    assert CLASSES == ("N", "S", "V", "F")

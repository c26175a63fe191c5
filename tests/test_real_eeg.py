"""The EEG tasks on real published files (``tests/data/real/eeg``, sources and checksums in its README): PhysioNet
EEGMMIDB imagery runs of subject S001 (``data check``, a 1-epoch ``adapt``, ``predict``), the EDF integrity checks on
real files cut in a temporary copy, and a real Sleep-EDF hypnogram refused beside a PSG of another night.

No real Sleep-EDF PSG is here (each is 30-50 MB; see the README), so the hypnogram is paired with the embedded
synthetic PSGs.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("braindecode")
pytest.importorskip("edfio")

from workbench.domains.eeg.readers import check_edf_size, read_edf_header  # noqa: E402
from workbench.domains.eeg.task import EMBEDDED_SLEEP  # noqa: E402

import workbench  # noqa: E402
from workbench.cli import main  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.core.registry import tasks  # noqa: E402

REAL = Path(__file__).parent / "data" / "real" / "eeg"
MMIDB = REAL / "eegmmidb"
HYPNOGRAM = REAL / "sleep-edf" / "SC4001EC-Hypnogram.edf"
#: sha256 of the files as PhysioNet publishes them (eegmmidb: MNE's eegbci_checksums.txt; sleep-edfx: SHA256SUMS.txt).
PUBLISHED_SHA256 = {
    MMIDB / "S001" / "S001R04.edf": "3d161f88e1c00632585287d2ce584c2bc0f08862438eb255ea8723e00fac693d",
    HYPNOGRAM: "a4cf67694ade1b52a0ddd06d5817fd45d2d3e8bac5302f640f3e9cfbbf12a996",
}
TINY = ["--epochs", "1", "--batch-size", "8", "--baselines", "", "--quiet"]


def _cli(capsys, *argv: str) -> tuple[int, str]:
    """``workbench ARGV`` in this process: (exit code, stdout + stderr)."""
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return exit_.value.code, captured.out + captured.err


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "eegmmidb"
    shutil.copytree(MMIDB, folder)
    return folder


def test_the_files_are_the_published_ones_or_cut_from_them_record_by_record():
    for path, sha256 in PUBLISHED_SHA256.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256, path
    whole = read_edf_header(MMIDB / "S001" / "S001R04.edf")
    assert whole.n_records == 125 and whole.samples_per_record == (160,) * 64 + (80,)
    for name in ("S001R08.edf", "S001R12.edf"):  # the first 90 of 125 one-second data records, header kept
        cut = check_edf_size(MMIDB / "S001" / name)
        assert cut.n_records == 90 and cut.samples_per_record == whole.samples_per_record
        assert cut.start == whole.start
    assert str(read_edf_header(HYPNOGRAM).start) == "1989-04-24 16:13:00"


def test_data_check_on_the_real_eegmmidb_runs_is_ok(capsys):
    code, out = _cli(capsys, "data", "check", "motor-imagery", "--data", MMIDB)
    assert code == 0, out
    assert "35 windows of 9 channels x 640 samples at 160 Hz from 3 record(s) of 1 subject(s)" in out
    assert "classes: left_fist 18, right_fist 17" in out
    assert "no record skipped" in out and f"ok: {MMIDB}" in out


def test_one_subject_cannot_be_split_by_subject_and_the_error_names_the_way_out():
    task = tasks.get("motor-imagery")()
    task.progress = False
    with pytest.raises(UserError, match=r"needs 3 subjects, the data have 1 \(S001\); the 3 record\(s\) can be held "
                       r"out instead with --split-by record"):
        task.read(str(MMIDB), 0)


@pytest.fixture(scope="module")
def mmidb_run(tmp_path_factory) -> Path:
    """The default method (LoRA on the shipped LaBraM), one epoch, the three runs of S001 held out run-wise."""
    out = tmp_path_factory.mktemp("mmidb") / "run"
    with pytest.raises(SystemExit) as exit_:
        main(["adapt", "--domain", "motor-imagery", "--data", str(MMIDB), "--split-by", "record", "--out", str(out)]
             + TINY)  # fmt: skip
    assert exit_.value.code == 0
    return out


def test_a_one_epoch_default_adapt_on_the_real_runs_holds_out_whole_runs(mmidb_run):
    metrics = json.loads((mmidb_run / "metrics.json").read_text())
    assert metrics["method"] == "lora"
    summary = metrics["data_summary"]
    assert summary["split_by"] == "record"
    assert sorted(sum(summary["split"].values(), [])) == ["S001R04", "S001R08", "S001R12"]
    assert sum(summary["windows"].values()) == 35
    assert summary["model_load"]["missing"] == ["final_layer.weight", "final_layer.bias"]  # the shipped backbone
    assert metrics["skipped_records"] == {"skipped": 0, "seen": 3, "records": []}
    assert 0.0 <= metrics["after"]["balanced_accuracy"] <= 1.0


def test_predict_on_the_real_runs_gives_a_row_per_window(mmidb_run, tmp_path, capsys):
    output = tmp_path / "predictions.csv"
    code, out = _cli(capsys, "predict", "--run", mmidb_run, "--input", MMIDB, "--output", output)
    assert code == 0, out
    rows = list(csv.DictReader(output.open()))
    per_record = {name: [r for r in rows if r["record"] == f"S001/{name}.edf"] for name in ("S001R04", "S001R08")}
    assert len(per_record["S001R04"]) == 31 and len(per_record["S001R08"]) == 22  # 125 s and 90 s in 4 s windows
    assert all(r["status"] == "ok" and r["predicted"] in ("left_fist", "right_fist") for r in rows)
    assert len(rows) == 31 + 22 + 22


def test_predict_reports_a_truncated_real_edf_in_its_row(mmidb_run, tmp_path):
    folder = _copy(tmp_path)
    cut = folder / "S001" / "S001R04.edf"
    cut.write_bytes(cut.read_bytes()[:100_000])
    record = workbench.predict(mmidb_run, folder, tmp_path / "predictions.csv")
    assert record["failed"] == 1
    assert record["per_record"]["S001/S001R04.edf"]["status"].startswith(
        "error: truncated: the header says 125 data records"
    )


def test_a_truncated_real_edf_is_a_skipped_record_and_refused_with_raise(tmp_path, capsys):
    folder = _copy(tmp_path)
    cut = folder / "S001" / "S001R12.edf"
    cut.write_bytes(cut.read_bytes()[:-30_000])  # as an interrupted download leaves it
    code, out = _cli(capsys, "data", "check", "motor-imagery", "--data", folder)
    assert code == 1, out
    assert "not ok: 1 of 3 record(s) skipped" in out
    assert "S001R12.edf: truncated: the header says 90 data records of 20640 bytes (1874496 bytes in all)" in out
    assert "the file has 1844496 bytes (88 whole data record(s))" in out
    assert out.count("S001R12.edf: truncated") == 1, out  # listed once (the task's info and the check both did)

    out_dir = tmp_path / "run"
    code, out = _cli(
        capsys, "adapt", "--domain", "motor-imagery", "--data", folder, "--split-by", "record", "--on-bad-record",
        "raise", "--out", out_dir, *TINY,
    )  # fmt: skip
    assert code == 2 and "S001R12.edf: truncated" in out and "Traceback" not in out
    assert not out_dir.exists()


def test_bytes_after_the_last_record_or_a_cut_header_are_bad_records(tmp_path):
    padded = tmp_path / "S001R04.edf"
    padded.write_bytes((MMIDB / "S001" / "S001R04.edf").read_bytes() + b"\0" * 100)
    with pytest.raises(UserError, match="100 more than the header's 125 data records"):
        check_edf_size(padded)
    padded.write_bytes((MMIDB / "S001" / "S001R04.edf").read_bytes()[:200])
    with pytest.raises(UserError, match="200 bytes: shorter than an EDF header"):
        check_edf_size(padded)


def _nights_with_the_real_hypnogram(tmp_path: Path) -> Path:
    """The embedded synthetic nights, SC4001's hypnogram replaced by the real SC4001EC (another night)."""
    folder = tmp_path / "sleep"
    shutil.copytree(EMBEDDED_SLEEP / "sleep-cassette", folder)
    shutil.copy(HYPNOGRAM, folder / HYPNOGRAM.name)
    return folder


def test_a_hypnogram_of_another_night_is_a_bad_record(tmp_path, capsys):
    folder = _nights_with_the_real_hypnogram(tmp_path)
    task = tasks.get("sleepedf")()
    task.progress = False
    task.info(str(folder))
    assert task.skipped.headline() == "1 of 6 record(s) skipped"
    [problem] = task.skipped
    assert problem.record.endswith("SC4001E0-PSG.edf")
    assert problem.problem.startswith(
        "hypnogram SC4001EC-Hypnogram.edf starts 1989-04-24 16:13:00 but PSG SC4001E0-PSG.edf starts 1989-04-24 22:07:00"
    )
    out_dir = tmp_path / "run"
    with pytest.raises(UserError, match=r"SC4001EC-Hypnogram\.edf: hypnogram SC4001EC-Hypnogram\.edf starts 1989-04-24"):
        workbench.adapt("sleepedf", "lora", data=str(folder), out=str(out_dir), on_bad_record="raise", epochs=1)
    assert not out_dir.exists()


def test_data_check_fails_on_the_real_hypnogram_alone(capsys):
    code, out = _cli(capsys, "data", "check", "sleepedf", "--data", HYPNOGRAM.parent)
    assert code == 2 and "no PSG SC4001E0-PSG.edf for this hypnogram" in out


@pytest.mark.slow
def test_the_default_motor_imagery_run_at_default_settings_on_the_real_runs(tmp_path, capsys):
    """LoRA and the four default baselines at the task's settings (20 epochs, patience 8), S001's three runs held out
    run-wise (one subject only). The batch is 8, not the default 16: one run holds 15 left/right trials at most (10
    in the cut runs), and a training set smaller than one batch is refused."""
    out = tmp_path / "run"
    code, text = _cli(capsys, "adapt", "--domain", "motor-imagery", "--data", MMIDB, "--split-by", "record",
                      "--batch-size", "8", "--out", out)  # fmt: skip
    assert code == 0, text
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["baselines"]) == {"full", "readout", "full@eegnet", "full@shallow"}
    assert metrics["skipped_records"]["seen"] == 3

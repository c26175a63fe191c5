"""The ``physio`` task on a real MIT-BIH record (tests/data/real/physio/README.md): ``data check``, a short default
``adapt``, ``predict``, and the bad-record policy on damaged copies of it (annotation emptied, data truncated).

Only record 100 is here, so the folders below hold that one real record under MIT-BIH record names of both sides of
de Chazal's split (100 DS2; 101, 106 DS1) for the split to run: a smoke test of reading real files as PhysioNet ships
them, not a measure of generalisation across patients.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

wfdb = pytest.importorskip("wfdb")
pytest.importorskip("neurokit2")

from workbench.cli import main  # noqa: E402

MITDB = Path(__file__).parent / "data" / "real" / "physio" / "mitdb"
TINY = ["--epochs", "1", "--train-size", "64", "--val-size", "32", "--batch-size", "32", "--quiet"]


def named_copy(folder: Path, name: str) -> Path:
    """Record 100 (all three files) copied to ``folder`` as record ``name``; returns the header path."""
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in (".dat", ".atr"):
        shutil.copy(MITDB / f"100{suffix}", folder / f"{name}{suffix}")
    header = (MITDB / "100.hea").read_text().replace("100.dat", f"{name}.dat")
    (folder / f"{name}.hea").write_text(header.replace("100", name, 1))
    return folder / f"{name}.hea"


def real_site(folder: Path) -> Path:
    for name in ("100", "101", "106"):
        named_copy(folder, name)
    return folder


def cli(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out + captured.err


def test_data_check_on_the_real_record_is_ok(tmp_path, capsys):
    code, out = cli(["data", "check", "physio", "--data", str(real_site(tmp_path / "mitdb"))], capsys)
    assert code == 0, out
    assert "1113 beats of 3 record(s), lead MLII at 360 Hz" in out  # 371 N/S/V beats per copy (Q: none)
    assert "no record skipped" in out and "ok:" in out


def test_an_emptied_annotation_and_a_truncated_record_are_reported_not_dropped(tmp_path, capsys):
    folder = real_site(tmp_path / "mitdb")
    named_copy(folder, "105")  # DS2: its annotation file emptied (rhythm annotations only: no beat)
    annotation = wfdb.rdann(str(MITDB / "100"), "atr")
    wfdb.wrann("105", "atr", annotation.sample[:2], symbol=["+", "~"], aux_note=["(N", ""], write_dir=str(folder))
    named_copy(folder, "103")  # DS2: its data cut in half
    data = folder / "103.dat"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])

    code, out = cli(["data", "check", "physio", "--data", str(folder)], capsys)
    assert code == 1, out
    assert "not ok: 2 of 5 record(s) skipped" in out
    assert "105.atr: the annotation file holds no beat (2 annotation(s), of kinds '+' 1, '~' 1)" in out
    assert "103.dat: truncated data file: 162000 bytes, the header implies 324000" in out

    out_dir = tmp_path / "run"
    code, out = cli(["adapt", "--domain", "physio", "--data", str(folder), "--on-bad-record", "raise",
                     "--out", str(out_dir), *TINY], capsys)  # fmt: skip
    assert code == 2 and "workbench: error:" in out and "103.dat: truncated data file" in out
    assert not out_dir.exists()


@pytest.mark.slow  # PhysioPFM and its six baselines, one epoch each: minutes on 2 shared cores
def test_default_adapt_then_predict_on_the_real_record(tmp_path, capsys):
    folder = real_site(tmp_path / "mitdb")
    named_copy(folder, "105")
    (folder / "105.atr").write_bytes(b"")  # an empty annotation file: skipped with a warning, counted
    out_dir = tmp_path / "run"
    code, out = cli(["adapt", "--domain", "physio", "--data", str(folder), "--out", str(out_dir), *TINY], capsys)
    assert code == 0, out
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["method"] == "physiopfm" and metrics["data_summary"]["split"]["test"] == ["100"]
    assert metrics["skipped_records"]["skipped"] == 1 and metrics["skipped_records"]["seen"] == 4
    assert metrics["skipped_records"]["records"][0]["record"].endswith("105.atr")
    assert "1 of 4 record(s) skipped" in (out_dir / "report.md").read_text()

    predictions = tmp_path / "beats.csv"
    code, out = cli(["predict", "--run", str(out_dir), "--input", str(MITDB), "--output", str(predictions)], capsys)
    assert code == 0, out
    with predictions.open() as file:
        rows = list(csv.DictReader(file))
    annotation = wfdb.rdann(str(MITDB / "100"), "atr")
    assert len(rows) == 371 == len(annotation.sample) - 1  # every N/S/V beat but the one at the record's edge
    assert {row["status"] for row in rows} == {"ok"} and {row["annotation"] for row in rows} == {"N", "A", "V"}


@pytest.mark.slow
def test_default_method_at_default_settings_on_the_real_record(tmp_path, capsys):
    out_dir = tmp_path / "run"
    folder = real_site(tmp_path / "mitdb")
    code, out = cli(["adapt", "--domain", "physio", "--data", str(folder), "--out", str(out_dir), "--quiet"], capsys)
    assert code == 0, out
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert set(metrics["baselines"]) and metrics["skipped_records"] == {"skipped": 0, "seen": 3, "records": []}

"""The ``ptbxl`` task on real published records: 20 PhysioNet/CinC Challenge 2021 records (PTB-XL, Georgia and
Chapman-Shaoxing/Ningbo partitions, ``.hea`` + ``.mat`` as the Challenge ships them) in tests/data/real/ecg/cinc2021,
and one real record with three flat leads (tests/data/real/ecg/cinc2021-flat-leads; sources in the README there).

Twenty records are a smoke test of reading, labelling, training and prediction, not a benchmark.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import scipy.io

pytest.importorskip("wfdb")

from workbench.cli import main  # noqa: E402

REAL = Path(__file__).parent / "data" / "real" / "ecg"
CINC = REAL / "cinc2021"
RECORDS = sorted(path.stem for path in CINC.glob("*.hea"))
TINY = ["--epochs", "1", "--baselines", "", "--quiet"]


def cli(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exit_info.value.code, out + err


def copy_with_truncated(tmp_path: Path, record: str = "HR06003") -> Path:
    """The real folder with one ``.mat`` cut to its first 60,000 bytes."""
    folder = tmp_path / "cinc2021"
    shutil.copytree(CINC, folder)
    mat = folder / f"{record}.mat"
    mat.write_bytes(mat.read_bytes()[:60_000])
    return folder


def test_the_real_files_are_the_published_signals():
    """Each ``.mat`` is MATLAB v4 ``val`` (12, n) int16 with the header's sample count (a CRLF-damaged copy is not)."""
    assert len(RECORDS) == 20
    for name in RECORDS:
        first = (CINC / f"{name}.hea").read_text().splitlines()[0].split()
        n_leads, n_samples = int(first[1]), int(first[3])
        val = scipy.io.loadmat(CINC / f"{name}.mat")["val"]
        assert val.shape == (n_leads, n_samples) == (12, 5000) and val.dtype.name == "int16", name


def test_data_check_reads_every_record_and_counts_the_unlabelled_one(capsys):
    code, out = cli(["data", "check", "ptbxl", "--data", CINC], capsys)
    assert code == 0, out
    assert "records: 19 × 12 leads × 1000 samples at 100 Hz" in out
    assert "classes: {'NORM': 7, 'MI': 0, 'STTC': 6, 'CD': 3, 'HYP': 5}" in out
    assert "sites: {'E': 4, 'HR': 10, 'JS': 5}" in out
    assert "without a superclass (not used): 1 (E07502)" in out
    assert "split at random by record" in out and "ok:" in out


def test_a_real_record_with_flat_leads_is_a_bad_record(capsys):
    code, out = cli(["data", "check", "ptbxl", "--data", REAL], capsys)
    assert code == 1, out
    assert "not ok: 1 of 20 record(s) skipped" in out
    assert "JS20004.hea: flat lead(s) V2, V4, V6" in out


def test_a_truncated_mat_is_skipped_and_counted_or_refused(tmp_path, capsys):
    folder = copy_with_truncated(tmp_path)
    code, out = cli(["data", "check", "ptbxl", "--data", folder], capsys)
    assert code == 1, out
    assert "not ok: 1 of 19 record(s) skipped" in out and "HR06003.mat: truncated data file: 60000 bytes" in out
    out_dir = tmp_path / "raise"
    code, out = cli(
        ["adapt", "--domain", "ptbxl", "--data", folder, "--on-bad-record", "raise", "--out", out_dir, *TINY], capsys
    )
    assert code == 2 and "HR06003.mat: truncated data file" in out and not out_dir.exists(), out


def test_one_epoch_adapt_and_predict_on_the_real_records(tmp_path, capsys):
    run = tmp_path / "run"
    code, out = cli(["adapt", "--domain", "ptbxl", "--data", CINC, "--out", run, *TINY], capsys)
    assert code == 0, out
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["data_summary"]["records"] == {"train": 11, "val": 4, "test": 4}
    assert "split at random by record with seed 0" in metrics["data_summary"]["data"]
    assert metrics["skipped_records"] == {"skipped": 0, "seen": 19, "records": []}
    assert 0.0 <= metrics["after"]["macro_auroc"] <= 1.0

    folder = copy_with_truncated(tmp_path)
    output = tmp_path / "predictions.csv"
    code, out = cli(["predict", "--run", run, "--input", folder, "--output", output], capsys)
    assert code == 0, out
    rows = {row["record"]: row for row in csv.DictReader(output.open())}
    assert sorted(rows) == RECORDS  # one row per record, the unlabelled E07502 included
    assert rows["HR06003"]["status"].startswith("error: truncated data file") and rows["HR06003"]["p_NORM"] == ""
    for name in set(RECORDS) - {"HR06003"}:
        assert rows[name]["status"] == "ok" and 0.0 <= float(rows[name]["p_NORM"]) <= 1.0


@pytest.mark.slow
def test_the_default_run_on_the_real_records(tmp_path, capsys):
    """The default method (H-Tuning) and the default baselines (full, LoRA, distilled student) at default settings."""
    run = tmp_path / "run"
    code, out = cli(["adapt", "--domain", "ptbxl", "--data", CINC, "--out", run, "--quiet"], capsys)
    assert code == 0, out
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["method"] == "htuning" and set(metrics["baselines"]) == {"full", "lora", "distill"}
    for scores in [metrics["after"], *metrics["baselines"].values()]:
        assert 0.0 <= scores["macro_auroc"] <= 1.0

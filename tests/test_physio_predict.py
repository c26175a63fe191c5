"""``workbench predict`` for the ``physio`` task: one row per annotated N/S/V/F beat with the run's preprocessing
(the test patients' scores equal the run's own), a broken record reported in one row while the others go on, paced
(Q) beats left out and counted, the real MIT-BIH excerpt (360 Hz, resampled), and a folder without records an
exit code 2 on the command line."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # every test uses a (short) run

pytest.importorskip("wfdb")
pytest.importorskip("neurokit2")

from workbench.domains.physio.beats import AAMI_CLASS_OF, read_beat_folder  # noqa: E402
from workbench.domains.physio.task import AFTER_S, BEFORE_S, CLASSES, EMBEDDED  # noqa: E402

import workbench  # noqa: E402
from workbench.cli import main  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.core.registry import tasks  # noqa: E402

SITE = EMBEDDED / "site-D"
MITBIH = Path(__file__).parent / "data" / "real" / "physio" / "mitdb"
PROBABILITIES = [f"p_{c}" for c in CLASSES]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("physio") / "run"
    workbench.adapt("physio", "readout", out=str(out), epochs=1, train_size=64, val_size=32, batch_size=32,
                    baselines=[], quiet=True)  # fmt: skip
    return out


def copy_record(source: Path, folder: Path, name: str, suffixes=(".hea", ".dat", ".atr")) -> None:
    for suffix in suffixes:
        shutil.copy(source.with_suffix(suffix), folder / f"{name}{suffix}")
    (folder / f"{name}.hea").write_text(source.with_suffix(".hea").read_text().replace(source.name, name))


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as file:
        return list(csv.DictReader(file))


def reader_beats(folder: Path, lead: str = "MLII"):
    """The N/S/V/F beats the training reader finds in ``folder`` (bad records skipped)."""
    beats = read_beat_folder(folder, lead=lead, before_s=BEFORE_S, after_s=AFTER_S, on_error="skip")
    return beats.subset(beats.labels < len(CLASSES))


def test_a_row_per_beat_a_broken_record_in_one_row_and_paced_beats_left_out(run, tmp_path):
    import wfdb

    folder = tmp_path / "incoming"
    folder.mkdir()
    copy_record(SITE / "D01", folder, "D01")
    (folder / "later").mkdir()
    copy_record(SITE / "D02", folder / "later", "D02")  # recursive
    copy_record(SITE / "D03", folder, "broken")
    data = (folder / "broken.dat").read_bytes()
    (folder / "broken.dat").write_bytes(data[: len(data) // 2])  # truncated
    copy_record(SITE / "D04", folder, "paced", suffixes=(".hea", ".dat"))
    annotation = wfdb.rdann(str(SITE / "D04"), "atr")
    symbols = ["/"] * 5 + list(annotation.symbol[5:])
    wfdb.wrann("paced", "atr", annotation.sample, symbol=symbols, write_dir=str(folder))
    copy_record(SITE / "D05", folder, "unannotated", suffixes=(".hea", ".dat"))

    record = workbench.predict(run, folder, tmp_path / "out" / "beats.csv")
    rows = read_rows(tmp_path / "out" / "beats.csv")
    assert list(rows[0]) == ["record", "sample", "time_s", "annotation", "status", *PROBABILITIES, "predicted",
                             *[f"calibrated_{p}" for p in PROBABILITIES], "conformal_set"]  # workbench.clinical's
    expected = reader_beats(folder)
    assert [str(p) for p in expected.skipped] and expected.skipped.records[0].endswith("broken.dat")
    for name, reader_name in (("D01", "D01"), ("later/D02", "D02"), ("paced", "paced")):
        mine = [row for row in rows if row["record"] == name]
        peaks = expected.r_peaks[expected.records == reader_name]
        labels = expected.labels[expected.records == reader_name]
        assert len(mine) == len(peaks) > 100 and all(row["status"] == "ok" for row in mine)
        assert [int(row["sample"]) for row in mine] == peaks.tolist()
        assert [AAMI_CLASS_OF[row["annotation"]] for row in mine] == [CLASSES[k] for k in labels]
        assert [float(row["time_s"]) for row in mine] == pytest.approx((peaks / 250).tolist(), abs=1e-4)
        p = np.array([[float(row[c]) for c in PROBABILITIES] for row in mine])
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-5)
        assert [row["predicted"] for row in mine] == [CLASSES[k] for k in p.argmax(axis=1)]
    paced = [row for row in rows if row["record"] == "paced"]
    assert len(paced) == (annotation.sample.size - 5) - sum(s not in AAMI_CLASS_OF for s in annotation.symbol[5:])
    broken = [row for row in rows if row["record"] == "broken"]
    assert len(broken) == 1 and broken[0]["status"].startswith("error: truncated data file")
    assert all(broken[0][key] == "" for key in ("sample", "annotation", *PROBABILITIES, "predicted"))
    assert not any(row["record"] == "unannotated" for row in rows)

    sidecar = json.loads((tmp_path / "out" / "beats.json").read_text())
    assert sidecar == record and sidecar["task"] == "physio" and sidecar["failed"] == 1
    assert sidecar["classes"] == list(CLASSES) and sidecar["lead"] == "MLII" and sidecar["backbone_rate_hz"] == 250
    assert sidecar["window_s"] == {"before_r_peak": BEFORE_S, "after_r_peak": AFTER_S}
    assert sidecar["beats"] == len(expected) == len(rows) - 1
    assert sidecar["annotated_records"] == 4 and sidecar["bad_records"] == 1
    assert sidecar["skipped_records"][0].startswith("broken: truncated data file")
    assert sidecar["excluded"]["class Q not kept"] == 5 and sidecar["not_annotated"] == ["unannotated"]
    assert sidecar["record_rates_hz"] == [250.0]


def test_the_test_patients_scores_are_the_runs_own(run, tmp_path):
    """Same lead, window and preprocessing as training: prediction on the site equals the run's evaluation."""
    workbench.predict(run, SITE, tmp_path / "site.csv")
    rows = read_rows(tmp_path / "site.csv")
    task = tasks.get("physio")()
    task.progress = False
    loaded = workbench.Run.load(run)
    raw = task.read(None, loaded.config.seed)
    evaluation = task.evaluate(loaded.model, task.test_samples(loaded.model, raw), "cpu")
    mine = [row for row in rows if row["record"] in raw.split["test"]]
    p = np.array([[float(row[c]) for c in PROBABILITIES] for row in mine])
    np.testing.assert_allclose(p, evaluation.predictions["probabilities"], atol=2e-6)


def test_the_real_mitbih_excerpt_is_resampled_and_predicted(run, tmp_path):
    record = workbench.predict(run, MITBIH, tmp_path / "100.csv")
    rows = read_rows(tmp_path / "100.csv")
    expected = reader_beats(MITBIH)
    assert len(rows) == len(expected) > 300 and all(row["status"] == "ok" for row in rows)
    assert [int(row["sample"]) for row in rows] == expected.r_peaks.tolist()
    assert float(rows[-1]["time_s"]) == pytest.approx(expected.r_peaks[-1] / 360, abs=1e-4)
    assert record["record_rates_hz"] == [360.0] and record["failed"] == 0 and record["bad_records"] == 0


def test_a_folder_without_records_is_a_clear_error_with_exit_code_2(run, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no records here")
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--run", str(run), "--input", str(empty), "--output", str(tmp_path / "p.csv")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert f"{empty}: no WFDB record (*.hea)" in err
    assert not (tmp_path / "p.csv").exists()
    unannotated = tmp_path / "unannotated"
    unannotated.mkdir()
    copy_record(SITE / "D01", unannotated, "D01", suffixes=(".hea", ".dat"))
    with pytest.raises(UserError, match="no WFDB record with .atr beat annotations"):
        workbench.predict(run, unannotated, tmp_path / "p.csv")

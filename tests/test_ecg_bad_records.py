"""The bad-record policy of the ``ptbxl`` task (issue 22) on a folder in PTB-XL's layout: ``data check`` opens every
record, reports "N of M record(s) skipped" with exit code 1; a run skips and lists the bad record; ``--on-bad-record
raise`` stops with exit code 2 before the run directory appears.

No real PTB-XL record could be had in this environment (see tests/data/real/README or the issue note): the folder is
cut from the embedded *synthetic* PTB-XL (same layout and reader), two records per fold.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("wfdb")

from workbench.domains.ecg.readers import EMBEDDED_PTBXL  # noqa: E402

from workbench.cli import main  # noqa: E402

TINY = ["--epochs", "1", "--batch-size", "8", "--baselines", "", "--quiet"]


def ptbxl_cut(folder: Path, per_fold: int = 2) -> Path:
    """``per_fold`` labelled records of each strat_fold of the embedded set, in PTB-XL's layout."""
    database = pd.read_csv(EMBEDDED_PTBXL / "ptbxl_database.csv", index_col="ecg_id")
    database = database[database["filename_lr"].notna()]
    rows = database.groupby("strat_fold", group_keys=False).head(per_fold).sort_index()
    folder.mkdir(parents=True)
    rows.to_csv(folder / "ptbxl_database.csv")
    shutil.copy(EMBEDDED_PTBXL / "scp_statements.csv", folder / "scp_statements.csv")
    for name in rows["filename_lr"]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        for suffix in (".hea", ".dat"):
            shutil.copy(EMBEDDED_PTBXL / f"{name}{suffix}", folder / f"{name}{suffix}")
    return folder


def cli(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exit_info.value.code, out + err


def test_data_check_counts_every_record_and_a_truncated_one_fails_it(tmp_path, capsys):
    folder = ptbxl_cut(tmp_path / "ptbxl")
    n = len(pd.read_csv(folder / "ptbxl_database.csv"))
    code, out = cli(["data", "check", "ptbxl", "--data", folder], capsys)
    assert code == 0 and "no record skipped" in out and "ok:" in out, out
    first = pd.read_csv(folder / "ptbxl_database.csv")["filename_lr"].iloc[0]
    data = folder / f"{first}.dat"
    data.write_bytes(data.read_bytes()[:1000])
    code, out = cli(["data", "check", "ptbxl", "--data", folder], capsys)
    assert code == 1, out
    assert f"not ok: 1 of {n} record(s) skipped" in out and f"{Path(first).name}.dat: truncated data file" in out


@pytest.mark.slow
def test_a_run_skips_and_lists_a_truncated_record_or_stops_before_its_directory(tmp_path, capsys):
    folder = ptbxl_cut(tmp_path / "ptbxl")
    n = len(pd.read_csv(folder / "ptbxl_database.csv"))
    data = folder / f"{pd.read_csv(folder / 'ptbxl_database.csv')['filename_lr'].iloc[0]}.dat"
    data.write_bytes(data.read_bytes()[:1000])
    out_dir = tmp_path / "raise"
    code, out = cli(["adapt", "--domain", "ptbxl", "--data", folder, "--on-bad-record", "raise", "--out", out_dir,
                     *TINY], capsys)  # fmt: skip
    assert code == 2 and "truncated data file" in out and not out_dir.exists()

    out_dir = tmp_path / "skip"
    code, out = cli(["adapt", "--domain", "ptbxl", "--data", folder, "--out", out_dir, *TINY], capsys)
    assert code == 0, out
    skipped = json.loads((out_dir / "metrics.json").read_text())["skipped_records"]
    assert skipped["skipped"] == 1 and skipped["seen"] == n and skipped["records"][0]["record"].endswith(".dat")

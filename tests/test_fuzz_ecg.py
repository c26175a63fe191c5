"""Fuzzed ECG readers (issue 23, item 5): WFDB headers, signal files and PTB-XL's tables, mutated byte by byte and
field by field, are read or refused with a `UserError` naming the file — never a traceback, a hang or a blow-up.

Seeds: the real CinC 2021 record ``HR06000`` (``.hea`` + ``.mat``, ``16x1+24``) and the embedded PTB-XL-style set
(``.hea`` + ``.dat``, ``ptbxl_database.csv``, ``scp_statements.csv``). Each file kind is mutated alone. Each reader
entry point has one default-suite test (`fuzzing.fuzz` examples over all its file kinds) and one slow deep test per
file kind (`fuzzing.deep` examples): `fuzz_signals.entry_point`; outcome counts as `fuzz_signals` says.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pandas as pd
import pytest
from fuzz_signals import ABSURD, data_length, entry_point, tallies, wfdb_header  # noqa: F401 (tallies: a fixture)
from fuzzing import check_read_or_refused, mutated
from hypothesis import strategies as st

pytest.importorskip("wfdb")

from workbench.domains.ecg.readers import EMBEDDED_PTBXL, read_cinc2021, read_ptbxl  # noqa: E402
from workbench.domains.ecg.task import PREPROCESSING  # noqa: E402
from workbench.domains.ecg.wfdb_record import read_record  # noqa: E402

from workbench.core.errors import UserError  # noqa: E402
from workbench.core.records import BadRecordError  # noqa: E402

CINC = Path(__file__).parent / "data" / "real" / "ecg" / "cinc2021"
PTBXL_RECORD = EMBEDDED_PTBXL / "records100" / "00000" / "00001_lr"


def copy_record(source: Path, folder: Path) -> Path:
    """The record ``source`` (path without extension: every file ``source.*``) copied into ``folder``."""
    for path in source.parent.glob(source.name + ".*"):
        shutil.copy(path, folder / path.name)
    return folder / source.name


def record_files(base: Path) -> list[Path]:
    """The names an error about record ``base`` may give: its files, or its folder (a data file its header names)."""
    return [base.with_suffix(suffix) for suffix in (".hea", ".mat", ".dat")] + [base.parent]


# --------------------------------------------------------------------------------------- one record
CINC_HEADER = (CINC / "HR06000.hea").read_bytes()
PTBXL_HEADER = PTBXL_RECORD.with_suffix(".hea").read_bytes()
SOURCES = {"cinc": CINC / "HR06000", "ptbxl": PTBXL_RECORD}


def _read_record(folder: Path, kind: str, data: bytes):
    """`read_record` (as ``predict`` calls it) of a record whose file ``kind`` (``<source>_<suffix>_...``) is the
    example: the CinC record ``HR06000`` or the PTB-XL-style ``00001_lr``."""
    source, suffix = kind.split("_")[:2]
    base = copy_record(SOURCES[source], folder)
    base.with_name(f"{base.name}.{suffix}").write_bytes(data)
    return check_read_or_refused(lambda: read_record(base.with_name(base.name + ".hea")), *record_files(base))


globals().update(
    entry_point(
        "read_record",
        _read_record,
        cinc_hea_bytes=mutated(CINC_HEADER),
        cinc_hea_fields=wfdb_header(CINC_HEADER.decode()),
        cinc_mat_bytes=mutated((CINC / "HR06000.mat").read_bytes()),
        ptbxl_hea_fields=wfdb_header(PTBXL_HEADER.decode()),
        ptbxl_dat_length=data_length(PTBXL_RECORD.with_suffix(".dat").read_bytes()),
    )
)


# ------------------------------------------------------------------------------ a bad record among good ones
CINC_GOOD = ("HR06001", "E07500")


def _read_cinc2021(folder: Path, kind: str, data: bytes):
    """Two good CinC records and ``HR06000`` whose header or signal file (``kind``) is the example: ``skip`` reads
    the good ones and either reads the mutated one or lists it as skipped; ``raise`` then raises naming it."""
    for name in CINC_GOOD:
        copy_record(CINC / name, folder)
    bad = copy_record(CINC / "HR06000", folder)
    bad.with_suffix("." + kind.split("_")[0]).write_bytes(data)
    records = check_read_or_refused(lambda: read_cinc2021(folder, PREPROCESSING, on_error="skip"), folder)
    assert records is not None, "only a path outside the folder may stop the read, and none is named here"
    assert set(CINC_GOOD) <= set(records.record_ids.tolist()), records.skipped.summary()
    mutated_read = "HR06000" in records.record_ids.tolist()
    skipped = [Path(record).stem for record in records.skipped.records]
    unlabelled = "HR06000" in records.unlabelled  # a damaged '# Dx:' line left no code: dropped and listed
    assert mutated_read or skipped == ["HR06000"] or unlabelled, f"HR06000 lost: {records.skipped.summary()}"
    if skipped:
        with pytest.raises(BadRecordError, match="HR06000"):
            read_cinc2021(folder, PREPROCESSING, on_error="raise")
    return records if mutated_read else None


globals().update(
    entry_point(
        "read_cinc2021",
        _read_cinc2021,
        hea_bytes=mutated(CINC_HEADER),
        hea_fields=wfdb_header(CINC_HEADER.decode()),
        mat_bytes=mutated((CINC / "HR06000.mat").read_bytes()),
    )
)


# ------------------------------------------------------------------------------------------ PTB-XL tables
def ptbxl_folder(folder: Path, n: int = 6) -> Path:
    """The first ``n`` labelled records of the embedded set with its two tables, in PTB-XL's layout."""
    database = pd.read_csv(EMBEDDED_PTBXL / "ptbxl_database.csv", index_col="ecg_id")
    rows = database[database["filename_lr"].notna()].head(n)
    rows.to_csv(folder / "ptbxl_database.csv")
    shutil.copy(EMBEDDED_PTBXL / "scp_statements.csv", folder / "scp_statements.csv")
    for name in rows["filename_lr"]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        copy_record(EMBEDDED_PTBXL / name, (folder / name).parent)
    return folder


def _small_database() -> bytes:
    database = pd.read_csv(EMBEDDED_PTBXL / "ptbxl_database.csv", index_col="ecg_id")
    return database[database["filename_lr"].notna()].head(6).to_csv().encode()


DATABASE = _small_database()
STATEMENTS = (EMBEDDED_PTBXL / "scp_statements.csv").read_bytes()
CELLS = ABSURD + ("../../etc/x", "/etc/passwd", "records100/00000/none_lr", "{'NORM': nan}", "{1: 'x'}", "[", "é€")


@st.composite
def csv_cells(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` (a csv table) with 1-3 cells replaced by absurd values, paths outside, broken literals."""
    table = pd.read_csv(io.BytesIO(original), dtype=str, keep_default_na=False)
    for _ in range(draw(st.integers(1, 3))):
        row = draw(st.integers(0, len(table) - 1))
        column = draw(st.sampled_from(list(table.columns)))
        table.loc[row, column] = draw(st.sampled_from(CELLS))
    return table.to_csv(index=False).encode()


def _read_ptbxl(folder: Path, kind: str, data: bytes):
    """`read_ptbxl` of 6 records whose ``ptbxl_database.csv`` or ``scp_statements.csv`` (``kind``) is the example."""
    ptbxl_folder(folder)
    name = {"database": "ptbxl_database.csv", "statements": "scp_statements.csv"}[kind.split("_")[0]]
    (folder / name).write_bytes(data)
    return check_read_or_refused(lambda: read_ptbxl(folder, PREPROCESSING, on_error="skip"), folder)


globals().update(
    entry_point(
        "read_ptbxl",
        _read_ptbxl,
        database_bytes=mutated(DATABASE),
        database_cells=csv_cells(DATABASE),
        statements_bytes=mutated(STATEMENTS),
        statements_cells=csv_cells(STATEMENTS),
    )
)


# --------------------------------------------------------------------------- confined paths (issue 23, item 3)
def cli(capsys, *argv) -> tuple[int, str]:
    from workbench.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exit_info.value.code, out + err


def test_a_ptbxl_row_naming_a_record_outside_the_folder_stops_the_read_unless_allowed(tmp_path, capsys):
    (tmp_path / "ptbxl").mkdir()
    folder = ptbxl_folder(tmp_path / "ptbxl", n=4)
    (tmp_path / "outside").mkdir()
    database = pd.read_csv(folder / "ptbxl_database.csv", index_col="ecg_id")
    first = database.index[0]
    copy_record(EMBEDDED_PTBXL / database.loc[first, "filename_lr"], tmp_path / "outside")
    database.loc[first, "filename_lr"] = "../outside/" + Path(database.loc[first, "filename_lr"]).name
    database.to_csv(folder / "ptbxl_database.csv")
    code, out = cli(capsys, "data", "check", "ptbxl", "--data", folder)
    assert code == 2 and "Traceback" not in out, out
    assert f"ptbxl_database.csv (ecg_id {first}, filename_lr): names '../outside/" in out
    assert "outside the data folder" in out and "--allow-paths-outside" in out
    code, out = cli(capsys, "data", "check", "ptbxl", "--data", folder, "--allow-paths-outside")
    assert code == 0 and "no record skipped" in out, out
    database.loc[first, "filename_lr"] = str(tmp_path / "outside" / "00001_lr")  # an absolute path
    database.to_csv(folder / "ptbxl_database.csv")
    code, out = cli(capsys, "data", "check", "ptbxl", "--data", folder)
    assert code == 2 and "outside the data folder" in out and "Traceback" not in out, out


def test_a_wfdb_header_whose_data_file_links_outside_stops_the_read_unless_allowed(tmp_path, capsys):
    """WFDB's header syntax allows no '/' in a data file's name, so a header reaches outside through a link."""
    folder, outside = tmp_path / "cinc", tmp_path / "outside"
    folder.mkdir(), outside.mkdir()
    for name in ("HR06000", "HR06001", "HR06002", "HR06003", "HR06004"):
        copy_record(CINC / name, folder)
    (folder / "HR06000.mat").rename(outside / "HR06000.mat")
    (folder / "HR06000.mat").symlink_to(outside / "HR06000.mat")
    code, out = cli(capsys, "data", "check", "ptbxl", "--data", folder)
    assert code == 2 and "Traceback" not in out, out
    assert "HR06000.hea: names " in out and "outside the data folder" in out
    code, out = cli(capsys, "data", "check", "ptbxl", "--data", folder, "--allow-paths-outside")
    assert code == 0 and "no record skipped" in out, out
    with pytest.raises(UserError, match="HR06000.hea: names .* outside the data folder"):
        read_cinc2021(folder, PREPROCESSING, on_error="skip")  # never a skipped record

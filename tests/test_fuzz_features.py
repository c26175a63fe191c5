"""Fuzzed feature-table reader: every mutated source/target pair (CSV, npz, parquet) is read or refused with a
`UserError` naming the file (tests/fuzzing.py's contract).

Seeds: the real diabetes-by-age CSVs (tests/data/real/features), and the same rows written as npz and parquet (a
conversion, for the two binary layouts). Byte mutations of the files, and structure-aware ones: CSV text with ragged
rows, unicode, huge numbers, missing or extra columns; npz fields with wrong dtypes, shapes, NaN/inf, pickles and lying
headers (tests/fuzz_arrays.py); parquet columns of other types. Counts print with ``pytest -s``.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fuzz_arrays import fuzz_reader, npz_examples, write_npz
from fuzzing import deep, fuzz, mutated
from hypothesis import strategies as st
from workbench.domains.features.readers import read_feature_pair

from workbench.core.errors import UserError

REAL = Path(__file__).parent / "data" / "real" / "features" / "diabetes-by-age"
FIRST_GATE = ("not a readable",)
N_ROWS = 40  # rows kept in the structure-aware seeds
TABLES = {stem: pd.read_csv(REAL / f"{stem}.csv") for stem in ("source", "target")}


def _pair(folder: Path, files: dict[str, bytes]) -> tuple:
    """``folder`` holding exactly ``files`` (name -> bytes); the read and the names its errors may cite."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return (lambda: read_feature_pair(folder)), [folder]


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    return buffer.getvalue()


def _npz_bytes(arrays, lie=None, folder: Path | None = None) -> bytes:
    path = folder / "tmp.npz"
    write_npz(path, arrays, lie)
    data = path.read_bytes()
    path.unlink()
    return data


def _arrays(stem: str) -> dict[str, np.ndarray]:
    frame = TABLES[stem].head(N_ROWS)
    return {"features": frame.drop(columns="label").to_numpy(np.float64), "labels": frame["label"].to_numpy()}


# -- byte mutations --------------------------------------------------------------------------------------------------
SEEDS = {
    "csv": {stem: (REAL / f"{stem}.csv").read_bytes() for stem in TABLES},
    "parquet": {stem: _parquet_bytes(frame) for stem, frame in TABLES.items()},
}


def _fuzz_bytes(tmp_path, settings_, ext: str):
    strategy = st.tuples(
        st.sampled_from(["source", "target"]), mutated(SEEDS[ext]["source"]), mutated(SEEDS[ext]["target"])
    )

    def write(example):
        which, source, target = example
        files = {f"{stem}.{ext}": SEEDS[ext][stem] for stem in TABLES}
        files[f"{which}.{ext}"] = source if which == "source" else target
        return _pair(tmp_path / "f", files)

    tally = fuzz_reader(settings_, strategy, write, FIRST_GATE, f"features {ext} bytes")
    assert sum(tally.counts.values()) >= 1


# -- CSV text --------------------------------------------------------------------------------------------------------
CELL = st.sampled_from(["", "nan", "inf", "-inf", "1e999", "-1e999", "9" * 400, "abc", "é", "能量", "1,5", '"', "\x00",
                        "True", "0x1F", "1_000", " 3 ", "NA", "-"])  # fmt: skip
HEADER = st.sampled_from(["label", "é", "能量", "", "age", "Unnamed: 0", "label.1", "🙂", " label"])


@st.composite
def csv_texts(draw: st.DrawFn, stem: str) -> str:
    """The first rows of a real CSV after 1..3 edits: a cell, a header, a ragged row, a deleted or added line."""
    lines = (REAL / f"{stem}.csv").read_text().splitlines()[: N_ROWS + 1]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["cell", "cell", "header", "ragged+", "ragged-", "delete", "blank", "bom", "sep"]))
        row = draw(st.integers(1, len(lines) - 1)) if len(lines) > 1 else 0
        cells = lines[row].split(",")
        if kind == "cell":
            cells[draw(st.integers(0, len(cells) - 1))] = draw(CELL)
        elif kind == "header":
            header = lines[0].split(",")
            header[draw(st.integers(0, len(header) - 1))] = draw(HEADER)
            lines[0] = ",".join(header)
            continue
        elif kind == "ragged+":
            cells.append(draw(CELL))
        elif kind == "ragged-" and len(cells) > 1:
            del cells[draw(st.integers(0, len(cells) - 1))]
        elif kind == "delete":
            del lines[draw(st.integers(0, len(lines) - 1)) :]
            if not lines:
                return ""
            continue
        elif kind == "blank":
            lines.insert(row, "")
            continue
        elif kind == "bom":
            lines[0] = "\ufeff" + lines[0]
            continue
        elif kind == "sep":
            cells = [";".join(cells)]
        lines[row] = ",".join(cells)
    return "\n".join(lines) + "\n"


def _fuzz_csv_text(tmp_path, settings_):
    strategy = st.tuples(st.sampled_from(["source", "target"]), csv_texts("source"), csv_texts("target"))

    def write(example):
        which, source, target = example
        files = {f"{stem}.csv": (REAL / f"{stem}.csv").read_bytes() for stem in TABLES}
        files[f"{which}.csv"] = (source if which == "source" else target).encode()
        return _pair(tmp_path / "f", files)

    tally = fuzz_reader(settings_, strategy, write, FIRST_GATE, "features csv text")
    assert tally.counts["read"] and tally.counts["refused deeper"], tally


# -- npz fields ------------------------------------------------------------------------------------------------------
def _fuzz_npz_fields(tmp_path, settings_):
    strategy = st.tuples(
        st.sampled_from(["source", "target"]), npz_examples(_arrays("source")), npz_examples(_arrays("target"))
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)

    def write(example):
        which, source, target = example
        files = {f"{stem}.npz": _npz_bytes(_arrays(stem), folder=scratch) for stem in TABLES}
        files[f"{which}.npz"] = _npz_bytes(*(source if which == "source" else target), folder=scratch)
        return _pair(tmp_path / "f", files)

    tally = fuzz_reader(settings_, strategy, write, FIRST_GATE, "features npz fields")
    assert tally.counts["read"] and tally.counts["refused deeper"], tally


# -- parquet columns -------------------------------------------------------------------------------------------------
@st.composite
def parquet_frames(draw: st.DrawFn, stem: str) -> bytes:
    """The first rows of a real table as parquet after 1..3 column edits: another type, a unicode name, a missing
    label, NaN/inf/huge values, no rows."""
    frame = TABLES[stem].head(N_ROWS).copy()
    for _ in range(draw(st.integers(1, 3))):
        column = draw(st.sampled_from(list(frame.columns) or ["label"]))
        kind = draw(
            st.sampled_from(["str", "bool", "category", "datetime", "Int64", "rename", "drop", "value", "empty"])
        )
        numeric = column in frame.columns and frame[column].dtype.kind == "f" and len(frame) > 0
        if kind in ("rename", "drop", "empty") and column in frame.columns:
            if kind == "rename":
                frame = frame.rename(columns={column: draw(HEADER)})
                frame = frame.loc[:, ~frame.columns.duplicated()]
            elif kind == "drop":
                frame = frame.drop(columns=column)
            else:
                frame = frame.iloc[:0]
        elif not numeric:
            continue
        elif kind == "str":
            frame[column] = frame[column].astype(str) + draw(st.sampled_from(["", "é", "x"]))
        elif kind == "bool":
            frame[column] = frame[column] > 0
        elif kind == "category":
            frame[column] = frame[column].astype("category")
        elif kind == "datetime":
            frame[column] = pd.Timestamp("2020-01-01")
        elif kind == "Int64":
            frame[column] = pd.array([pd.NA] + list(range(len(frame) - 1)), dtype="Int64")
        elif kind == "value":
            where = (draw(st.integers(0, len(frame) - 1)), frame.columns.get_loc(column))
            frame.iloc[where] = draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e308, -1.0, 0.5]))
    return _parquet_bytes(frame)


def _fuzz_parquet_columns(tmp_path, settings_):
    strategy = st.tuples(st.sampled_from(["source", "target"]), parquet_frames("source"), parquet_frames("target"))

    def write(example):
        which, source, target = example
        files = {f"{stem}.parquet": SEEDS["parquet"][stem] for stem in TABLES}
        files[f"{which}.parquet"] = source if which == "source" else target
        return _pair(tmp_path / "f", files)

    tally = fuzz_reader(settings_, strategy, write, FIRST_GATE, "features parquet columns")
    assert tally.counts["read"] and tally.counts["refused deeper"], tally


# -- the tests: default suite (fuzz) and slow (deep), one body each --------------------------------------------------
@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_fuzz_feature_bytes(tmp_path, ext):
    _fuzz_bytes(tmp_path, fuzz, ext)


def test_fuzz_feature_csv_text(tmp_path):
    _fuzz_csv_text(tmp_path, fuzz)


def test_fuzz_feature_npz_fields(tmp_path):
    _fuzz_npz_fields(tmp_path, fuzz)


def test_fuzz_feature_parquet_columns(tmp_path):
    _fuzz_parquet_columns(tmp_path, fuzz)


@pytest.mark.slow
def test_deep_fuzz_features(tmp_path):
    for ext in ("csv", "parquet"):
        _fuzz_bytes(tmp_path, deep, ext)
    _fuzz_csv_text(tmp_path, deep)
    _fuzz_npz_fields(tmp_path, deep)
    _fuzz_parquet_columns(tmp_path, deep)


def test_an_npz_holding_an_object_array_is_refused_naming_the_file(tmp_path):
    """An object array in an npz is a pickle: refused, never unpickled."""
    arrays = _arrays("source")
    arrays["labels"] = np.array([{"x": 1}] * N_ROWS, dtype=object)
    (tmp_path / "scratch").mkdir()
    read, _ = _pair(
        tmp_path / "f",
        {
            "source.npz": _npz_bytes(arrays, folder=tmp_path / "scratch"),
            "target.npz": _npz_bytes(_arrays("target"), folder=tmp_path / "scratch"),
        },
    )
    with pytest.raises(UserError, match="pickle") as refused:
        read()
    assert str(tmp_path / "f" / "source.npz") in str(refused.value)

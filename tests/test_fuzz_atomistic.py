"""Fuzzed atomistic readers: every mutated rMD17 npz, sGDML npz, extended XYZ or ase database is read or refused with
a `UserError` naming the file (tests/fuzzing.py's contract), never a traceback, a hang or an unchecked allocation.

Two kinds of input per reader: byte mutations of the real files (tests/data/real/atomistic, the embedded rMD17
layout), which mostly die at the container's first check (a zip CRC, an sqlite page), and structure-aware ones (a
valid container with mutated content: tests/fuzz_arrays.py for npz fields, line edits for extxyz, cell edits for the
database) that reach the reader's own checks. Each test prints how many examples were read and refused
(``pytest -s``); the ``slow`` variants run `fuzzing.DEEP_EXAMPLES` of the same bodies.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from fuzz_arrays import fuzz_reader, npz_examples, write_npz
from fuzzing import deep, fuzz, mutated
from hypothesis import strategies as st

pytest.importorskip("mace")
from workbench.domains.atomistic.readers import BadFrames, read_ase_set, read_rmd17, read_sgdml  # noqa: E402

from workbench.core.errors import UserError  # noqa: E402

REAL = Path(__file__).parent / "data" / "real" / "atomistic"
SGDML = REAL / "md17_ethanol_first300.npz"
XYZ = REAL / "ethanol_sampledata_first60.xyz"
DB = REAL / "test_ethanol.db"
EMBEDDED = Path(__file__).parent.parent / "domains" / "atomistic" / "embedded" / "rmd17"
RMD17 = EMBEDDED / "npz_data" / "rmd17_ethanol.npz"
FIRST_GATE = ("not a readable npz", "not a readable ase database", "not a file ase can read")
N_FRAMES = 12  # frames kept in the structure-aware npz seeds (enough for the split and the units check)


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)  # skipped-frame warnings, once per example
    yield
    logging.disable(logging.NOTSET)


def _arrays(path: Path, n_frames: int = N_FRAMES) -> dict[str, np.ndarray]:
    with np.load(path) as content:
        return {key: content[key][:n_frames] if content[key].ndim > 1 or key == "energies" else content[key]
                for key in content.files}  # fmt: skip


def _skipped(read_with):
    """A read under the skip policy that returns how many frames it skipped (what the tally counts)."""

    def read() -> int:
        bad = BadFrames(policy="skip")
        read_with(bad)
        return len(bad.report)

    return read


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


# -- rMD17 npz + splits ----------------------------------------------------------------------------------------------
SPLIT_TEXT = st.sampled_from(["0\n1\n2\n3\n4\n5\n", "", "-1\n", "999999999999\n", "1e999\n", "é\n", "0,1\n2\n",
                              "0\n0\n", "3\n4\n5\n6\n7\n8\n9\n10\n11\n", "nan\n", "9" * 40 + "\n"])  # fmt: skip


def _rmd17_layout(root: Path, npz: bytes | None, arrays=None, lie=None, train: str | None = None,
                  test: str | None = None) -> tuple:  # fmt: skip
    root = _fresh(root)
    (root / "npz_data").mkdir()
    (root / "splits").mkdir()
    npz_path = root / "npz_data" / "rmd17_ethanol.npz"
    if npz is not None:
        npz_path.write_bytes(npz)
        shutil.copy(EMBEDDED / "splits" / "index_train_01.csv", root / "splits")
        shutil.copy(EMBEDDED / "splits" / "index_test_01.csv", root / "splits")
    else:
        write_npz(npz_path, arrays, lie)
        (root / "splits" / "index_train_01.csv").write_text(train if train is not None else "0\n1\n2\n3\n4\n5\n")
        (root / "splits" / "index_test_01.csv").write_text(test if test is not None else "6\n7\n8\n9\n10\n11\n")
    return _skipped(lambda bad: read_rmd17(root, "ethanol", 1, card="rmd17-embedded", bad=bad)), [
        root / "npz_data",
        root / "splits",
    ]


def _fuzz_rmd17_bytes(tmp_path, settings_):
    tally = fuzz_reader(settings_, mutated(RMD17.read_bytes()), lambda data: _rmd17_layout(tmp_path / "r", data),
                        FIRST_GATE, "rmd17 npz bytes")  # fmt: skip
    assert sum(tally.counts.values()) >= 1


def _fuzz_rmd17_fields(tmp_path, settings_):
    strategy = st.tuples(
        npz_examples(_arrays(RMD17)), st.one_of(st.none(), SPLIT_TEXT), st.one_of(st.none(), SPLIT_TEXT)
    )
    tally = fuzz_reader(
        settings_, strategy,
        lambda ex: _rmd17_layout(tmp_path / "r", None, ex[0][0], ex[0][1], ex[1], ex[2]), FIRST_GATE, "rmd17 fields",
    )  # fmt: skip
    assert tally.counts["read"] and tally.counts["refused deeper"], tally


# -- sGDML npz -------------------------------------------------------------------------------------------------------
def _sgdml_file(folder: Path, npz: bytes | None, arrays=None, lie=None) -> tuple:
    path = _fresh(folder) / "md17_ethanol.npz"
    if npz is not None:
        path.write_bytes(npz)
    else:
        write_npz(path, arrays, lie)
    return _skipped(lambda bad: read_sgdml(path, bad=bad)), [path]


def _fuzz_sgdml_bytes(tmp_path, settings_):
    tally = fuzz_reader(settings_, mutated(SGDML.read_bytes()), lambda data: _sgdml_file(tmp_path / "s", data),
                        FIRST_GATE, "sgdml npz bytes")  # fmt: skip
    assert sum(tally.counts.values()) >= 1


def _fuzz_sgdml_fields(tmp_path, settings_):
    tally = fuzz_reader(settings_, npz_examples(_arrays(SGDML)), lambda ex: _sgdml_file(tmp_path / "s", None, *ex),
                        FIRST_GATE, "sgdml fields")  # fmt: skip
    assert tally.counts["read"] and tally.counts["refused deeper"], tally


# -- extended XYZ ----------------------------------------------------------------------------------------------------
XYZ_LINES = XYZ.read_text().splitlines()[: 6 * 11]  # the first six frames, unchanged
COUNT_LINE = st.sampled_from(["1000000000000", "-1", "0", "abc", "3.5", "9" * 30, "", "1e12", "10"])
TOKEN = st.sampled_from(["nan", "inf", "-inf", "1e999", "abc", "é", "", "9" * 400, "0x10", "Xx", "0"])
NUMBER = st.sampled_from(["nan", "inf", "-inf", "1e308", "-0", "1e-320", "0", "-1e5"])  # tokens ase parses
COMMENT = st.sampled_from([
    'Properties=species:S:1:pos:R:3:forces:R:2 energy=1 pbc="F F F"',
    "Properties=species:S:1:pos:R:1000000000000 energy=1",
    "Properties=species:S:1:pos:R:3:forces:R:3 energy=abc",
    "Properties=species:S:1:pos:R:3:forces:R:3 energy=nan",
    "Properties=species:S:1:pos:R:3:forces:R:3 energy=é能量",
    'Properties=species:S:1:pos:R:3:forces:R:3 energy=1 Lattice="1 2"',
    'Properties=species:S:1:pos:R:3:forces:R:3 energy=1 pbc="T T T"',
    "Properties=species:S:-1:pos:R:3 energy=1",
    "energy=1 = = ==",
    "",
])  # fmt: skip


@st.composite
def xyz_texts(draw: st.DrawFn) -> str:
    """The six-frame extxyz after 1..3 line edits: the atom-count line, a comment line, a token, a column, a line, or a
    number ase parses (NaN/inf/huge: a bad frame, skipped)."""
    lines = list(XYZ_LINES)
    for _ in range(draw(st.integers(1, 3))):
        frame = draw(st.integers(0, 5))
        kind = draw(st.sampled_from(["count", "comment", "token", "column", "delete", "duplicate", "unicode", "number",
                                     "number", "number"]))  # fmt: skip
        atom = frame * 11 + 2 + draw(st.integers(0, 8))
        if kind == "count":
            lines[frame * 11] = draw(COUNT_LINE)
        elif kind == "comment":
            lines[frame * 11 + 1] = draw(COMMENT)
        elif kind in ("token", "column") and atom < len(lines):
            tokens = lines[atom].split()
            at = draw(st.integers(0, max(len(tokens) - 1, 0)))
            if kind == "token" and tokens:
                tokens[at] = draw(TOKEN)
            elif tokens:
                del tokens[at]
            lines[atom] = " ".join(tokens)
        elif kind == "number" and atom < len(lines) and len(lines[atom].split()) == 7:
            tokens = lines[atom].split()
            tokens[draw(st.integers(1, 6))] = draw(NUMBER)
            lines[atom] = " ".join(tokens)
        elif kind == "delete" and atom < len(lines):
            del lines[atom]
        elif kind == "duplicate" and atom < len(lines):
            lines.insert(atom, lines[atom])
        elif kind == "unicode" and atom < len(lines):
            lines[atom] = "能 " + lines[atom][2:]
    return "\n".join(lines) + "\n"


def _xyz_file(folder: Path, data: bytes) -> tuple:
    path = _fresh(folder) / "frames.xyz"
    path.write_bytes(data)
    return _skipped(lambda bad: read_ase_set(path, units="kcal/mol", bad=bad)), [path]


def _fuzz_xyz_bytes(tmp_path, settings_, seed: bytes):
    tally = fuzz_reader(settings_, mutated(seed), lambda data: _xyz_file(tmp_path / "x", data), FIRST_GATE,
                        "extxyz bytes")  # fmt: skip
    assert sum(tally.counts.values()) >= 1


def _fuzz_xyz_lines(tmp_path, settings_):
    tally = fuzz_reader(settings_, xyz_texts(), lambda text: _xyz_file(tmp_path / "x", text.encode()), FIRST_GATE,
                        "extxyz lines")  # fmt: skip
    assert tally.counts["read, records skipped"] and tally.counts["refused deeper"], tally


# -- ase database ----------------------------------------------------------------------------------------------------
CELL = st.sampled_from([b"", b"\x00" * 7, b"\xff" * 72, 10**12, -1, 0, 2**63 - 1, "é能量", "{", "null", 1.5,
                        float("nan"), None, '{"energy": "abc"}',
                        '{"x": {"__ndarray__": [[1000000000000, 3], "float64", 16]}}',
                        "lie-data", "lie-data-neg"])  # fmt: skip
COLUMNS = ["numbers", "positions", "cell", "pbc", "natoms", "energy", "forces", "data", "key_value_pairs",
           "calculator", "calculator_parameters", "momenta", "masses", "constraints", "unique_id"]  # fmt: skip


@st.composite
def db_edits(draw: st.DrawFn) -> list[tuple]:
    """1..3 (row id, column, value) edits of the `systems` table; a value may also be the row's ``data`` blob with
    its array shape rewritten to a huge count (ase's binary JSON keeps shapes in text)."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        column = draw(st.sampled_from(COLUMNS))
        value = draw(CELL)
        edits.append((draw(st.integers(1, 20)), column, value))
    return edits


def _db_file(folder: Path, data: bytes | None, edits=()) -> tuple:
    path = _fresh(folder) / "frames.db"
    path.write_bytes(data if data is not None else DB.read_bytes())
    if edits:
        with sqlite3.connect(path) as connection:
            for row, column, value in edits:
                if value in ("lie-data", "lie-data-neg"):
                    (blob,) = connection.execute("SELECT data FROM systems WHERE id=?", (row,)).fetchone()
                    if not isinstance(blob, bytes):
                        continue
                    count = b"1000000000000" if value == "lie-data" else b"-5"
                    value = blob.replace(b"[[9,3]", b"[[" + count + b",3]").replace(b"[[1]", b"[[" + count + b"]")
                try:
                    connection.execute(f"UPDATE systems SET {column}=? WHERE id=?", (value, row))
                except sqlite3.IntegrityError:  # a second row with that unique_id: sqlite refuses the edit itself
                    pass
        connection.close()
    return _skipped(lambda bad: read_ase_set(path, units="kcal/mol", bad=bad)), [path]


def _fuzz_db_bytes(tmp_path, settings_):
    tally = fuzz_reader(settings_, mutated(DB.read_bytes()), lambda data: _db_file(tmp_path / "d", data), FIRST_GATE,
                        "ase db bytes")  # fmt: skip
    assert sum(tally.counts.values()) >= 1


def _fuzz_db_cells(tmp_path, settings_):
    tally = fuzz_reader(settings_, db_edits(), lambda edits: _db_file(tmp_path / "d", None, edits), FIRST_GATE,
                        "ase db cells")  # fmt: skip
    assert tally.counts["read, records skipped"] and tally.counts["refused at the container"], tally


# -- the tests: default suite (fuzz) and slow (deep), one body each --------------------------------------------------
def test_fuzz_rmd17_bytes(tmp_path):
    _fuzz_rmd17_bytes(tmp_path, fuzz)


def test_fuzz_rmd17_fields(tmp_path):
    _fuzz_rmd17_fields(tmp_path, fuzz)


def test_fuzz_sgdml_bytes(tmp_path):
    _fuzz_sgdml_bytes(tmp_path, fuzz)


def test_fuzz_sgdml_fields(tmp_path):
    _fuzz_sgdml_fields(tmp_path, fuzz)


def test_fuzz_xyz_bytes(tmp_path):
    _fuzz_xyz_bytes(tmp_path, fuzz, ("\n".join(XYZ_LINES) + "\n").encode())


def test_fuzz_xyz_lines(tmp_path):
    _fuzz_xyz_lines(tmp_path, fuzz)


def test_fuzz_db_bytes(tmp_path):
    _fuzz_db_bytes(tmp_path, fuzz)


def test_fuzz_db_cells(tmp_path):
    _fuzz_db_cells(tmp_path, fuzz)


@pytest.mark.slow
def test_deep_fuzz_rmd17(tmp_path):
    _fuzz_rmd17_bytes(tmp_path, deep)
    _fuzz_rmd17_fields(tmp_path, deep)


@pytest.mark.slow
def test_deep_fuzz_sgdml(tmp_path):
    _fuzz_sgdml_bytes(tmp_path, deep)
    _fuzz_sgdml_fields(tmp_path, deep)


@pytest.mark.slow
def test_deep_fuzz_xyz(tmp_path):
    _fuzz_xyz_bytes(tmp_path, deep, XYZ.read_bytes())
    _fuzz_xyz_lines(tmp_path, deep)


@pytest.mark.slow
def test_deep_fuzz_db(tmp_path):
    _fuzz_db_bytes(tmp_path, deep)
    _fuzz_db_cells(tmp_path, deep)


# -- pickles are never read ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["sgdml", "rmd17"])
def test_an_npz_holding_an_object_array_is_refused_naming_the_file(tmp_path, layout):
    """An object array in an npz is a pickle: refused, never unpickled (np.load with allow_pickle=False)."""
    if layout == "sgdml":
        arrays = _arrays(SGDML)
        arrays["R"] = np.array([{"__reduce__": "os.system"}] * N_FRAMES, dtype=object)
        read, names = _sgdml_file(tmp_path / "s", None, arrays)
    else:
        arrays = _arrays(RMD17)
        arrays["coords"] = np.array([None] * N_FRAMES, dtype=object)
        read, names = _rmd17_layout(tmp_path / "r", None, arrays)
    with pytest.raises(UserError, match="pickle") as refused:
        read()
    assert str(names[0]) in str(refused.value)

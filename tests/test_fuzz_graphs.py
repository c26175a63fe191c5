"""Fuzzed graph readers: every mutated citation ``.mat`` (ACDNE/ASN layout), UDAGCN/PyGDA text layout, struc2vec
airport layout or PyG ``.pt`` is read or refused with a `UserError` naming the file (tests/fuzzing.py's contract).

Seeds: the real DBLPv7 file (tests/data/real/graphs) — whole in the slow test, and in the default suite a cut of it
(the 200-odd papers of its first citations, written with scipy's savemat in the published layout: dense uint8
``attrb`` and ``group``, sparse ``network``), since each read of the whole file costs about 2 s. The text and PyG
layouts have no published file here; their seeds are the same cut written in those layouts. Structure-aware inputs:
.mat fields of other dtypes, shapes, sparse/dense, NaN/inf, huge values, missing or extra (scipy.io.savemat); text
lines with huge, negative or non-numeric ids and ragged rows; PyG tensors of other dtypes and shapes.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse
import torch
from fuzz_arrays import fuzz_reader, mutated_arrays
from fuzzing import deep, fuzz, mutated
from hypothesis import assume
from hypothesis import strategies as st
from workbench.domains.graphs.readers import read_graph

REAL = Path(__file__).parent / "data" / "real" / "graphs" / "dblpv7.mat"
FIRST_GATE = ("not a readable MATLAB", "not loadable as a PyG Data")


def _cut() -> dict[str, np.ndarray]:
    """attrb (n, 6775) uint8, network (n, n) sparse, group (n, 5) uint8 of the papers of DBLPv7's first 150 edges."""
    content = scipy.io.loadmat(REAL)
    network = scipy.sparse.coo_matrix(content["network"])
    nodes = np.unique(np.concatenate([network.row[:150], network.col[:150]]))
    return {
        "attrb": np.asarray(content["attrb"])[nodes],
        "network": scipy.sparse.csc_matrix(content["network"])[nodes][:, nodes],
        "group": np.asarray(content["group"])[nodes],
    }


CUT = _cut()


def _mat_bytes(fields: dict) -> bytes:
    buffer = io.BytesIO()
    scipy.io.savemat(buffer, fields, do_compression=True)
    return buffer.getvalue()


def _one_file(folder: Path, name: str, data: bytes) -> tuple:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data)
    return (lambda: read_graph(folder / name)), [folder / name]


# -- .mat ------------------------------------------------------------------------------------------------------------
def _fuzz_mat_bytes(tmp_path, settings_, seed: bytes):
    write = lambda data: _one_file(tmp_path / "g", "dblpv7.mat", data)  # noqa: E731
    tally = fuzz_reader(settings_, mutated(seed), write, FIRST_GATE,
                        "graph mat bytes")  # fmt: skip
    assert sum(tally.counts.values()) >= 1


@st.composite
def mat_fields(draw: st.DrawFn) -> dict:
    """The cut's fields after field mutations (tests/fuzz_arrays.py), each then written dense or sparse; or a field
    replaced by a sparse matrix with an absurd number of rows (a count the reader must not densify blindly)."""
    dense = {key: (value.toarray() if scipy.sparse.issparse(value) else value) for key, value in CUT.items()}
    fields = draw(mutated_arrays(dense))
    out = {}
    for key, value in fields.items():
        value = np.asarray(value)
        sparse = draw(st.booleans()) if key != "network" else draw(st.integers(0, 4)) > 0
        out[key] = (
            scipy.sparse.csc_matrix(value)
            if sparse and value.ndim == 2 and value.dtype.kind in "biufc" and value.dtype != np.float16
            else value
        )
    if draw(st.integers(0, 4)) == 0:
        key = draw(st.sampled_from(["attrb", "network", "group"]))
        rows = draw(st.sampled_from([10**9, 2**31 - 1, 10**6]))  # CSC stores one pointer per column: keep those few
        out[key] = scipy.sparse.csc_matrix((np.ones(1), ([0], [0])), shape=(rows, draw(st.sampled_from([5, 6775]))))
    return out


def _fuzz_mat_fields(tmp_path, settings_):
    def write(fields):
        try:
            data = _mat_bytes(fields)
        except Exception:  # a combination savemat cannot write (not the reader's concern)
            assume(False)
        return _one_file(tmp_path / "g", "dblpv7.mat", data)

    tally = fuzz_reader(settings_, mat_fields(), write, FIRST_GATE, "graph mat fields")
    assert tally.counts["read"] and tally.counts["refused deeper"], tally


# -- text layouts ----------------------------------------------------------------------------------------------------
def _text_seed() -> dict[str, str]:
    network = scipy.sparse.coo_matrix(CUT["network"])
    labels = CUT["group"].argmax(1)
    docs = CUT["attrb"][:, :40]  # the first 40 words: enough for a feature row
    return {
        "cut_edgelist.txt": "".join(f"{u},{v}\n" for u, v in zip(network.row, network.col)),
        "cut_labels.txt": "".join(f"{label}\n" for label in labels),
        "cut_docs.txt": "".join(",".join(map(str, row)) + "\n" for row in docs),
        "usa-airports.edgelist": "".join(f"{1000 + u} {1000 + v}\n" for u, v in zip(network.row, network.col)),
        "labels-usa-airports.txt": "node label\n" + "".join(f"{1000 + i} {label}\n" for i, label in enumerate(labels)),
    }


TEXT = _text_seed()
LAYOUTS = {"udagcn": ("cut_edgelist.txt", "cut_labels.txt", "cut_docs.txt"),
           "struc2vec": ("usa-airports.edgelist", "labels-usa-airports.txt")}  # fmt: skip
TOKEN = st.sampled_from(["-1", "0", "1000000000000", "9" * 30, "1e999", "nan", "abc", "é", "", "3.5", "0x10", "1 2 3"])


@st.composite
def text_edits(draw: st.DrawFn, layout: str) -> dict[str, bytes]:
    """The layout's files, one of them after 1..3 line edits (a token, a ragged row, a deleted or added line) or byte
    mutations."""
    files = {name: TEXT[name] for name in LAYOUTS[layout]}
    name = draw(st.sampled_from(LAYOUTS[layout]))
    if draw(st.integers(0, 3)) == 0:
        return {**{k: v.encode() for k, v in files.items()}, name: draw(mutated(files[name].encode()))}
    lines = files[name].splitlines()
    for _ in range(draw(st.integers(1, 3))):
        row = draw(st.integers(0, len(lines) - 1)) if lines else 0
        kind = draw(st.sampled_from(["token", "token", "ragged", "delete", "insert", "empty"]))
        if not lines:
            break
        tokens = lines[row].replace(",", " ").split()
        if kind == "token" and tokens:
            tokens[draw(st.integers(0, len(tokens) - 1))] = draw(TOKEN)
        elif kind == "ragged":
            tokens = tokens[:-1] if tokens and draw(st.booleans()) else tokens + [draw(TOKEN)]
        elif kind == "delete":
            del lines[row]
            continue
        elif kind == "insert":
            lines.insert(row, draw(TOKEN))
            continue
        elif kind == "empty":
            lines = []
            continue
        lines[row] = ("," if name.endswith("_docs.txt") or name.endswith("_edgelist.txt") else " ").join(tokens)
    files[name] = "\n".join(lines) + ("\n" if lines else "")
    return {key: value.encode() if isinstance(value, str) else value for key, value in files.items()}


def _text_files(folder: Path, files: dict[str, bytes]) -> tuple:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    first = folder / next(iter(files))
    return (lambda: read_graph(first)), [folder]


def _fuzz_text(tmp_path, settings_, layout: str):
    tally = fuzz_reader(settings_, text_edits(layout), lambda files: _text_files(tmp_path / "t", files), FIRST_GATE,
                        f"graph {layout} text")  # fmt: skip
    assert tally.counts["read"] and tally.counts["refused deeper"], tally


# -- PyG .pt ---------------------------------------------------------------------------------------------------------
def _pyg_arrays() -> dict[str, np.ndarray]:
    network = scipy.sparse.coo_matrix(CUT["network"])
    edges = np.stack([network.row, network.col]).astype(np.int64)
    return {"x": CUT["attrb"][:, :40].astype(np.float32), "edge_index": edges,
            "y": CUT["group"].argmax(1).astype(np.int64)}  # fmt: skip


def _pt_bytes(arrays: dict) -> bytes:
    content = {}
    for key, value in arrays.items():
        try:
            content[key] = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            content[key] = value  # a numpy array of text or objects: weights_only refuses it
    buffer = io.BytesIO()
    torch.save(content, buffer)
    return buffer.getvalue()


def _fuzz_pyg(tmp_path, settings_):
    strategy = st.one_of(mutated(_pt_bytes(_pyg_arrays())), mutated_arrays(_pyg_arrays()).map(_pt_bytes))
    tally = fuzz_reader(settings_, strategy, lambda data: _one_file(tmp_path / "p", "cut.pt", data), FIRST_GATE,
                        "graph pyg")  # fmt: skip
    assert tally.counts["read"] and tally.counts["refused deeper"], tally


# -- the tests: default suite (fuzz) and slow (deep), one body each --------------------------------------------------
def test_fuzz_mat_bytes(tmp_path):
    _fuzz_mat_bytes(tmp_path, fuzz, _mat_bytes(CUT))


def test_fuzz_mat_fields(tmp_path):
    _fuzz_mat_fields(tmp_path, fuzz)


@pytest.mark.parametrize("layout", ["udagcn", "struc2vec"])
def test_fuzz_text_layouts(tmp_path, layout):
    _fuzz_text(tmp_path, fuzz, layout)


def test_fuzz_pyg(tmp_path):
    _fuzz_pyg(tmp_path, fuzz)


@pytest.mark.slow
def test_deep_fuzz_graphs(tmp_path):
    _fuzz_mat_bytes(tmp_path, deep, REAL.read_bytes())
    _fuzz_mat_fields(tmp_path, deep)
    for layout in LAYOUTS:
        _fuzz_text(tmp_path, deep, layout)
    _fuzz_pyg(tmp_path, deep)

"""Helpers of the signal readers' fuzz tests (``test_fuzz_ecg``, ``test_fuzz_physio``, ``test_fuzz_eeg``): the
quick/deep test pair, outcome tallies, and structure-aware mutations of WFDB headers and EDF/EDF+ files (the byte
mutations are `fuzzing.mutated`).

Tallies: each example's outcome (read / refused) is counted per test; a module using `tallies` (an autouse
fixture) prints them when it ends (``-s``) and appends them as JSON lines to ``$WORKBENCH_FUZZ_COUNTS``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest
from fuzzing import deep, fuzz
from hypothesis import given
from hypothesis import strategies as st

#: Outcomes per test in this process: test name -> Counter(read=..., refused=...).
OUTCOMES: dict[str, Counter] = {}


def tally(test: str, result: Any) -> None:
    """Count one example's outcome (`fuzzing.check_read_or_refused` returns None for a refusal)."""
    OUTCOMES.setdefault(test, Counter())["refused" if result is None else "read"] += 1


@pytest.fixture(scope="module")
def tallies(request):
    """Print the module's outcome counts when it ends and append them to ``$WORKBENCH_FUZZ_COUNTS``."""
    yield
    module = Path(request.module.__file__).stem
    target = os.environ.get("WORKBENCH_FUZZ_COUNTS")
    for test, counts in sorted(OUTCOMES.items()):
        print(f"\n{module}::{test}: read {counts['read']}, refused {counts['refused']}", end="")
        if target:
            with open(target, "a") as handle:
                handle.write(json.dumps({"test": f"{module}::{test}", **counts}) + "\n")
    OUTCOMES.clear()


def entry_point(name: str, body: Callable[[Path, str, Any], Any], **kinds: st.SearchStrategy) -> dict[str, Any]:
    """The fuzz tests of one reader entry point, as ``{test name: test}`` for a module's ``globals().update``.

    ``body(folder, kind, example)`` reads a fresh folder holding ``example`` as its file of ``kind`` and returns what
    `fuzzing.check_read_or_refused` returned. ``test_<name>``: `fuzzing.fuzz` examples drawn from every kind (the
    default suite); ``test_<name>_<kind>_deep``: `fuzzing.deep` examples of one kind each, marked ``slow``. Each
    example's outcome is tallied under the test's name.
    """

    def make(profile, label, strategy):
        @pytest.mark.usefixtures("tallies")
        def run(tmp_path_factory, data):
            kind, example = data
            tally(label, body(tmp_path_factory.mktemp("fuzz"), kind, example))

        run.__name__ = f"test_{label}"
        return profile(given(data=strategy)(run))

    tagged = {kind: st.tuples(st.just(kind), strategy) for kind, strategy in kinds.items()}
    tests = {f"test_{name}": make(fuzz, name, st.one_of(*tagged.values()))}
    for kind, strategy in tagged.items():
        tests[f"test_{name}_{kind}_deep"] = pytest.mark.slow(make(deep, f"{name}_{kind}_deep", strategy))
    return tests


# --------------------------------------------------------------------------------- WFDB header mutations
#: Values that break a header's numbers: zero, negative, not a number, overflow, 10^12, not ASCII.
ABSURD = ("0", "-1", "-500", "nan", "inf", "1e308", "1e-308", "999999999999", "x", "٣")
#: Data-file names a header could give: another file, unicode, outside the folder, absolute, the folder.
FILE_NAMES = ("other.dat", "é€😀.dat", "../../etc/x.dat", "/etc/passwd", "sub/x.dat", ".")
#: Storage formats: others, unknown, absurd samples per frame or byte offsets.
FORMATS = ("8", "212", "310", "24", "0", "999", "16x999999999999", "16x0", "16x1+999999999999", "16x1+-24", "16+nan")


@st.composite
def wfdb_header(draw: st.DrawFn, text: str) -> bytes:
    """``text`` (a WFDB header) after 1-3 field-level changes: the record line's signal count, rate or sample count
    absurd; a signal line's file name, format, gain / baseline / units, or a later field (resolution, zero, initial
    value, checksum, block size, name) absurd or unicode; a signal line dropped or duplicated; a unicode record
    name."""
    lines = text.splitlines()
    rows = [i for i, line in enumerate(lines[1:], 1) if line and not line.startswith("#")]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["record", "name", "file", "format", "gain", "field", "drop", "duplicate"]))
        record = lines[0].split()
        if kind == "record":
            record[draw(st.integers(1, min(3, len(record) - 1)))] = draw(st.sampled_from(ABSURD))
            lines[0] = " ".join(record)
            continue
        if kind == "name":
            name = draw(st.text(st.characters(blacklist_categories=("Z", "C")), min_size=1, max_size=12))
            lines[0] = " ".join([name, *record[1:]])
            continue
        if not rows:
            continue
        row = draw(st.sampled_from(rows))
        if kind == "drop":
            del lines[row]
            rows = [i if i < row else i - 1 for i in rows if i != row]
            continue
        if kind == "duplicate":
            lines.insert(row, lines[row])
            rows.append(max(rows) + 1)
            continue
        fields = lines[row].split()
        if kind == "file":
            fields[0] = draw(st.sampled_from(FILE_NAMES))
        elif kind == "format" and len(fields) > 1:
            fields[1] = draw(st.sampled_from(FORMATS))
        elif kind == "gain" and len(fields) > 2:
            gain = draw(st.sampled_from(ABSURD))
            baseline = draw(st.sampled_from(("0", "-99999999999999", "nan", "1024")))
            units = draw(st.sampled_from(("mV", "uV", "V", "km", "µV")))
            fields[2] = f"{gain}({baseline})/{units}"
        elif kind == "field" and len(fields) > 3:
            fields[draw(st.integers(3, len(fields) - 1))] = draw(st.sampled_from(ABSURD + ("é€", "I", "V6")))
        lines[row] = " ".join(fields)
    return ("\n".join(lines) + "\n").encode("utf-8")


def data_length(original: bytes) -> st.SearchStrategy[bytes]:
    """``original`` cut short or extended at its end (a data file shorter or longer than its header says)."""
    shorter = st.integers(0, len(original) - 1).map(lambda n: original[:n])
    longer = st.binary(min_size=1, max_size=64).map(lambda extra: original + extra)
    return st.one_of(shorter, longer)

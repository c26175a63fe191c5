"""Fuzzed EEG readers (issue 23, item 5): EDF / EDF+ headers and annotations (Sleep-EDF PSG + hypnogram pairs,
EEGMMIDB runs), GDF (BCI IV 2a) and BNCI ``.mat`` files, each file kind mutated alone byte by byte and field by
field, are read or refused with a `UserError` naming the file — never a traceback, a hang or a blow-up; among good
records a mutated one is read or skipped as a bad record.

Seeds (small, MNE is slow to read): the real EEGMMIDB run ``S001R04`` cut to its first 10 one-second data records
(the header's record count rewritten, as tests/data/real/eeg/README.md cuts R08 and R12), the embedded Sleep-EDF pair
``SC4001`` and the real hypnogram ``SC4001EC-Hypnogram.edf``, MNE's real one-channel GDF with a BCI IV 2a event table
(`test_eeg_readers.gdf_with_events`), and a BNCI run written by scipy. One default-suite test per reader entry point,
one slow deep test per file kind (`fuzz_signals.entry_point`).
"""

from __future__ import annotations

import io
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from fuzz_signals import ABSURD, data_length, entry_point, tallies  # noqa: F401 (tallies: a fixture)
from fuzzing import check_read_or_refused, mutated
from hypothesis import strategies as st

pytest.importorskip("mne")
scipy_io = pytest.importorskip("scipy.io")

from test_eeg_readers import T_EVENTS, _bnci_run, gdf_with_events  # noqa: E402
from workbench.domains.eeg.motor import read_bci_iv_2a, read_bnci_2a_mat, read_eegmmidb  # noqa: E402
from workbench.domains.eeg.sleepedf import read_sleep_edf  # noqa: E402

from workbench.core.errors import UserError  # noqa: E402

REAL = Path(__file__).parent / "data" / "real" / "eeg"
EMBEDDED_SLEEP = Path(__file__).parents[1] / "domains" / "eeg" / "embedded" / "sleep-edf" / "sleep-cassette"


# ----------------------------------------------------------------------------------------------- EDF layout
FIXED = {  # field -> (first byte, width) of the 256-byte fixed header
    "version": (0, 8), "patient": (8, 80), "recording": (88, 80), "start date": (168, 8), "start time": (176, 8),
    "header bytes": (184, 8), "reserved": (192, 44), "records": (236, 8), "record duration": (244, 8),
    "signals": (252, 4),
}  # fmt: skip
PER_SIGNAL = {  # field -> width, in the order of the per-signal header (each field for every signal in turn)
    "label": 16, "transducer": 80, "dimension": 8, "physical min": 8, "physical max": 8, "digital min": 8,
    "digital max": 8, "prefiltering": 80, "samples": 8, "reserved": 32,
}  # fmt: skip


def n_signals(data: bytes) -> int:
    return int(data[252:256])


def signal_field(data: bytes, name: str, index: int) -> tuple[int, int]:
    """(first byte, width) of field ``name`` of signal ``index`` in an EDF header."""
    ns, start = n_signals(data), 256
    for field, width in PER_SIGNAL.items():
        if field == name:
            return start + index * width, width
        start += ns * width
    raise KeyError(name)


def annotation_ranges(data: bytes) -> list[tuple[int, int]]:
    """Byte ranges (start, stop) of the 'EDF Annotations' signal in every data record of an EDF+ file."""
    ns = n_signals(data)
    labels = [data[signal_field(data, "label", i)[0] :][:16].strip() for i in range(ns)]
    samples = [int(data[slice(*_span(signal_field(data, "samples", i)))]) for i in range(ns)]
    index = labels.index(b"EDF Annotations")
    before, record = 2 * sum(samples[:index]), 2 * sum(samples)
    n_records, header = int(data[236:244]), 256 * (1 + ns)
    return [(header + r * record + before, header + r * record + before + 2 * samples[index]) for r in range(n_records)]


def _span(field: tuple[int, int]) -> tuple[int, int]:
    return field[0], field[0] + field[1]


def put(data: bytearray, field: tuple[int, int], value: bytes) -> None:
    """Write ``value`` into a fixed-width field, space-padded or cut to its width."""
    start, width = field
    data[start : start + width] = value[:width].ljust(width, b" ")


#: Values for EDF's ASCII number fields: absurd, negative, not a number, overflowing, not ASCII.
EDF_NUMBERS = tuple(value.encode() for value in ABSURD) + (b"99999999", b"-30", b"1e-300", b"\xe9\xff", b"")


@st.composite
def edf_fields(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` (an EDF/EDF+ file) with 1-3 header fields changed: a fixed field (record count, record duration,
    signal count, header size, start date and time, version, ids) absurd or not ASCII; a signal's physical or digital
    range absurd, empty (min == max) or reversed; its samples per record absurd; its label unicode."""
    data = bytearray(original)
    ns = n_signals(original)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["fixed", "number", "equal range", "reversed range", "label"]))
        index = draw(st.integers(0, ns - 1))
        if kind == "fixed":
            field = FIXED[draw(st.sampled_from(list(FIXED)))]
            put(data, field, draw(st.sampled_from(EDF_NUMBERS + (b"31.02.99", b"25.61.99", "é".encode()))))
        elif kind == "number":
            name = draw(st.sampled_from(["physical min", "physical max", "digital min", "digital max", "samples"]))
            put(data, signal_field(original, name, index), draw(st.sampled_from(EDF_NUMBERS)))
        elif kind in ("equal range", "reversed range"):
            low, high = draw(st.sampled_from([("physical min", "physical max"), ("digital min", "digital max")]))
            low_field, high_field = signal_field(original, low, index), signal_field(original, high, index)
            low_value, high_value = bytes(data[slice(*_span(low_field))]), bytes(data[slice(*_span(high_field))])
            put(data, high_field, low_value)
            if kind == "reversed range":
                put(data, low_field, high_value)
        else:
            label = draw(st.sampled_from(["é€😀", "EDF Annotations", ""]))
            put(data, signal_field(original, "label", index), label.encode())
    return bytes(data)


#: Replacements for a TAL's onset / duration numbers and texts (EDF+ 2003, section 2.2).
TAL_NUMBERS = (b"+nan", b"+inf", b"+1e308", b"-5", b"+999999999999", b"+", b"4.2", b"+-1", b"+1\x15-30")
TAL_TEXTS = ("é€😀".encode(), b"\xff\xfe", b"", b"T1\x14T2", b"\x00\x00", b"x" * 40)


@st.composite
def tal_mutations(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` (an EDF+ file) with its annotations (time-stamped annotation lists, TALs) changed in 1-3 places: an
    onset or duration absurd, a text unicode or invalid UTF-8, separators lost, or bytes of one record's annotation
    block mutated (`fuzzing.mutated`, cut or padded back to the block's size)."""
    data = bytearray(original)
    ranges = annotation_ranges(original)
    for _ in range(draw(st.integers(1, 3))):
        start, stop = draw(st.sampled_from(ranges))
        block = bytes(data[start:stop])
        kind = draw(st.sampled_from(["number", "text", "bytes"]))
        numbers = list(re.finditer(rb"[+-][0-9.]+", block))
        texts = list(re.finditer(rb"\x14([^\x14\x00]+)\x14", block))
        if kind == "number" and numbers:
            match = draw(st.sampled_from(numbers))
            block = block[: match.start()] + draw(st.sampled_from(TAL_NUMBERS)) + block[match.end() :]
        elif kind == "text" and texts:
            match = draw(st.sampled_from(texts))
            block = block[: match.start(1)] + draw(st.sampled_from(TAL_TEXTS)) + block[match.end(1) :]
        else:
            block = draw(mutated(block))
        data[start:stop] = block[: stop - start].ljust(stop - start, b"\x00")
    return bytes(data)


def header_of(original: bytes) -> st.SearchStrategy[bytes]:
    """`fuzzing.mutated` on the EDF header alone (256 x (1 + signals) bytes), the data records kept."""
    size = 256 * (1 + n_signals(original))
    return mutated(original[:size]).map(lambda header: header + original[size:])


# ---------------------------------------------------------------------------------------------- EEGMMIDB
def edf_cut(source: Path, n_records: int) -> bytes:
    """The first ``n_records`` data records of an EDF+ file, its record count rewritten (every other byte kept)."""
    data = bytearray(source.read_bytes())
    ns = n_signals(data)
    samples = sum(int(data[slice(*_span(signal_field(data, "samples", i)))]) for i in range(ns))
    put(data, FIXED["records"], str(n_records).encode())
    return bytes(data[: 256 * (1 + ns) + n_records * 2 * samples])


#: EEGMMIDB S001R04, 10 s: T0 at 0 s, T2 at 4.2 s (one 4 s window), T0 at 8.3 s.
MMIDB = edf_cut(REAL / "eegmmidb" / "S001" / "S001R04.edf", 10)


def _read_eegmmidb(folder: Path, kind: str, data: bytes):
    """`read_eegmmidb` of a folder holding the example as run ``S001R04.edf`` beside the good run ``S001R08.edf``:
    the mutated run is read, or skipped as a bad record (and raised naming it with ``on_error="raise"``)."""
    (folder / "S001").mkdir()
    (folder / "S001" / "S001R04.edf").write_bytes(data)
    (folder / "S001" / "S001R08.edf").write_bytes(MMIDB)
    windows = check_read_or_refused(lambda: read_eegmmidb(folder, on_error="skip"), folder)
    assert windows is not None and "S001R08" in windows.records.tolist()
    if "S001R04" in windows.records.tolist():
        return windows
    skipped = [Path(record).name for record in windows.skipped.records]
    assert skipped in ([], ["S001R04.edf"]), skipped  # [] : read, but no window of it inside the recording
    if skipped:
        with pytest.raises(UserError, match="S001R04"):
            read_eegmmidb(folder, on_error="raise")
        return None
    return windows


globals().update(
    entry_point(
        "read_eegmmidb",
        _read_eegmmidb,
        edf_fields=edf_fields(MMIDB),
        edf_header_bytes=header_of(MMIDB),
        edf_length=data_length(MMIDB),
        annotations=tal_mutations(MMIDB),
    )
)


# --------------------------------------------------------------------------------------------- Sleep-EDF
PSG = (EMBEDDED_SLEEP / "SC4001E0-PSG.edf").read_bytes()
HYPNOGRAM = (EMBEDDED_SLEEP / "SC4001EC-Hypnogram.edf").read_bytes()
REAL_HYPNOGRAM = (REAL / "sleep-edf" / "SC4001EC-Hypnogram.edf").read_bytes()


def _real_night(psg: bytes) -> bytes:
    """``psg`` dated as the real hypnogram (24.04.89 16.13.00), so that the pair is the same night."""
    data = bytearray(psg)
    put(data, FIXED["start date"], REAL_HYPNOGRAM[168:176])
    put(data, FIXED["start time"], REAL_HYPNOGRAM[176:184])
    return bytes(data)


def _read_sleep_edf(folder: Path, kind: str, data: bytes):
    """`read_sleep_edf` of the pair SC4001 whose PSG or hypnogram (``kind``) is the example. ``real_hypnogram_...``:
    the real hypnogram beside the embedded PSG dated as it is (MNE parses the real annotations; its scored stages
    run past the 10-minute PSG, so even the unmutated pair is refused: 'outside the recording')."""
    psg, hypnogram = (data, HYPNOGRAM) if kind.startswith("psg") else (PSG, data)
    if kind.startswith("real"):
        psg = _real_night(PSG)
    (folder / "SC4001E0-PSG.edf").write_bytes(psg)
    (folder / "SC4001EC-Hypnogram.edf").write_bytes(hypnogram)
    names = (folder / "SC4001E0-PSG.edf", folder / "SC4001EC-Hypnogram.edf", folder)  # folder: no window at all
    return check_read_or_refused(lambda: read_sleep_edf(folder, on_error="skip"), *names)


globals().update(
    entry_point(
        "read_sleep_edf",
        _read_sleep_edf,
        psg_fields=edf_fields(PSG),
        psg_header_bytes=header_of(PSG),
        psg_length=data_length(PSG),
        hypnogram_bytes=mutated(HYPNOGRAM),
        hypnogram_fields=edf_fields(HYPNOGRAM),
        hypnogram_annotations=tal_mutations(HYPNOGRAM),
        real_hypnogram_bytes=mutated(REAL_HYPNOGRAM),
        real_hypnogram_annotations=tal_mutations(REAL_HYPNOGRAM),
    )
)


# ------------------------------------------------------------------------------------- BCI IV 2a: GDF, .mat
def _gdf_seed_bytes() -> bytes:
    """MNE's one-channel GDF (150 Hz, 30 s) with channel EEG-C3 and 4 BCI IV 2a trials (`gdf_with_events`)."""
    with tempfile.TemporaryDirectory() as folder:
        gdf_with_events(Path(folder) / "A01T.gdf", "EEG-C3", T_EVENTS)
        return (Path(folder) / "A01T.gdf").read_bytes()


def _read_bci_iv_2a(folder: Path, kind: str, data: bytes):
    (folder / "A01T.gdf").write_bytes(data)
    return check_read_or_refused(
        lambda: read_bci_iv_2a(folder, channels=("C3",), allowed_sfreqs=(150,), on_error="skip"),
        folder / "A01T.gdf",
        folder,
    )


GDF = _gdf_seed_bytes()
globals().update(entry_point("read_bci_iv_2a", _read_bci_iv_2a, gdf_bytes=mutated(GDF), gdf_length=data_length(GDF)))


def bnci_bytes(run: dict) -> bytes:
    """A BNCI ``A01T.mat`` of one run, as scipy writes it."""
    runs = np.empty((1, 1), dtype=object)
    runs[0, 0] = run
    buffer = io.BytesIO()
    scipy_io.savemat(buffer, {"data": runs})
    return buffer.getvalue()


#: Two trials at 250 Hz (the second rejected), ``X`` in float32 to keep the file at 0.5 MB.
BNCI_RUN = {**_bnci_run(2), "X": _bnci_run(2)["X"].astype(np.float32)}
#: Wrong shapes and values for a BNCI run's fields.
BNCI_VALUES = {
    "X": (
        np.zeros(10),
        np.zeros((40, 24)),
        np.zeros((0, 25)),
        np.array(["x"]),
        np.full((5000, 25), np.nan, np.float32),
    ),
    "trial": (np.zeros((0, 1)), np.array([[1, 2], [3, 4]]), np.array([[-5], [1e12], [np.nan]]), np.array(["a"])),
    "y": (np.array([[9], [1]]), np.zeros((0, 1)), np.array([[1]]), np.array(["left"]), np.array([[np.nan]] * 2)),
    "fs": (0.0, -250.0, np.nan, np.inf, 1e308, 1e-300, np.array([250.0, 250.0]), "250"),
    "artifacts": (np.array([[1]]), np.array(["x"]), np.full((2, 1), 7)),
}


@st.composite
def bnci_fields(draw: st.DrawFn) -> bytes:
    """A BNCI file whose run has 1-2 fields of a wrong shape, type or value, or a field missing."""
    run = dict(BNCI_RUN)
    for _ in range(draw(st.integers(1, 2))):
        name = draw(st.sampled_from(list(BNCI_VALUES)))
        if draw(st.integers(0, 5)) == 0:
            run.pop(name, None)
        else:
            run[name] = draw(st.sampled_from(BNCI_VALUES[name]))
    return bnci_bytes(run)


def _read_bnci_2a_mat(folder: Path, kind: str, data: bytes):
    (folder / "A01T.mat").write_bytes(data)
    return check_read_or_refused(lambda: read_bnci_2a_mat(folder, on_error="skip"), folder / "A01T.mat", folder)


globals().update(
    entry_point(
        "read_bnci_2a_mat", _read_bnci_2a_mat, mat_fields=bnci_fields(), mat_bytes=mutated(bnci_bytes(BNCI_RUN))
    )
)

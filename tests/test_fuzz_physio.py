"""Fuzzed beat readers (issue 23, item 5): MIT-BIH style WFDB records (``.hea`` + ``.dat`` format 212 + ``.atr``
beat annotations), each file mutated alone byte by byte and field by field, are read or refused with a `UserError`
naming the file; among good records a mutated one is read or skipped as a bad record, never a traceback.

Seeds: the real MIT-BIH excerpt ``100`` (tests/data/real/physio/mitdb) and the embedded site-A records. One
default-suite test per reader entry point, one slow deep test per file kind (`fuzz_signals.entry_point`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fuzz_signals import data_length, entry_point, tallies, wfdb_header  # noqa: F401 (tallies: a fixture)
from fuzzing import check_read_or_refused, mutated
from hypothesis import strategies as st

pytest.importorskip("wfdb")

from workbench.domains.physio.beats import read_annotated_beats, read_beat_folder  # noqa: E402
from workbench.domains.physio.task import EMBEDDED  # noqa: E402

from workbench.core.errors import UserError  # noqa: E402
from workbench.core.records import BadRecordError  # noqa: E402

MITDB = Path(__file__).parent / "data" / "real" / "physio" / "mitdb"
HEADER = (MITDB / "100.hea").read_bytes()
ANNOTATIONS = (MITDB / "100.atr").read_bytes()


def _word(code: int, value: int) -> bytes:
    """One MIT-format annotation word: 6-bit code, 10-bit value, little-endian."""
    return ((code << 10) | (value & 0x3FF)).to_bytes(2, "little")


#: MIT-format annotation words that break a reader: a SKIP of 2^31 - 1 or -1 samples, an AUX string that claims
#: 1023 bytes, undefined codes, a NUM / SUB / CHN with absurd values, an early end, a beat at interval 1023.
ANNOTATION_WORDS = (
    _word(59, 0) + b"\xff\x7f\xff\xff",
    _word(59, 0) + b"\xff\xff\xff\xff",
    _word(63, 1023),
    _word(63, 3) + "é".encode() + b"\x00",
    _word(50, 7),
    _word(0, 5),
    _word(60, 1023),
    _word(61, 1023),
    _word(62, 1023),
    _word(0, 0),
    _word(1, 1023),
)


@st.composite
def annotation_words(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` (an MIT-format annotation file) with 1-3 absurd annotation words inserted or overwritten at
    word boundaries."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 3))):
        at = 2 * draw(st.integers(0, len(data) // 2))
        word = draw(st.sampled_from(ANNOTATION_WORDS))
        if draw(st.booleans()):
            data[at:at] = word
        else:
            data[at : at + len(word)] = word
    return bytes(data)


def copy_record(source: Path, folder: Path) -> Path:
    """Every file ``source.*`` copied into ``folder``; the header's path there."""
    for path in source.parent.glob(source.name + ".*"):
        shutil.copy(path, folder / path.name)
    return folder / (source.name + ".hea")


def _read_annotated_beats(folder: Path, kind: str, data: bytes):
    """`read_annotated_beats` (as ``predict`` calls it) of record 100 whose file ``kind`` (``hea_...``, ``dat_...``,
    ``atr_...``) is the example."""
    header = copy_record(MITDB / "100", folder)
    header.with_suffix("." + kind.split("_")[0]).write_bytes(data)
    names = [header.with_suffix(s) for s in (".hea", ".dat", ".atr")] + [folder]
    return check_read_or_refused(lambda: read_annotated_beats(header), *names)


SIGNAL = (MITDB / "100.dat").read_bytes()
globals().update(
    entry_point(
        "read_annotated_beats",
        _read_annotated_beats,
        hea_bytes=mutated(HEADER),
        hea_fields=wfdb_header(HEADER.decode()),
        dat_bytes=mutated(SIGNAL),
        dat_length=data_length(SIGNAL),
        atr_bytes=mutated(ANNOTATIONS),
        atr_words=annotation_words(ANNOTATIONS),
    )
)


# ------------------------------------------------------------------------------ a bad record among good ones
SITE = EMBEDDED / "site-A"
FILES = {suffix: (SITE / f"A03.{suffix}").read_bytes() for suffix in ("hea", "dat", "atr")}


def _read_beat_folder(folder: Path, kind: str, data: bytes):
    """Records A01, A02 and A03 of site A, A03's file ``kind`` the example: ``skip`` keeps A01 and A02 and either
    reads A03 or lists it as skipped; ``raise`` then raises naming it."""
    for name in ("A01", "A02", "A03"):
        copy_record(SITE / name, folder)
    (folder / f"A03.{kind.split('_')[0]}").write_bytes(data)
    beats = check_read_or_refused(lambda: read_beat_folder(folder, on_error="skip"), folder)
    assert beats is not None, "only a path outside the folder may stop the read, and none is named here"
    assert {"A01", "A02"} <= set(beats.records.tolist()), beats.skipped.summary()
    skipped = [Path(record).stem for record in beats.skipped.records]
    assert "A03" in beats.records.tolist() or skipped == ["A03"], beats.skipped.summary()
    if skipped:
        with pytest.raises(BadRecordError, match="A03"):
            read_beat_folder(folder, on_error="raise")
        return None
    return beats


globals().update(
    entry_point(
        "read_beat_folder",
        _read_beat_folder,
        hea_bytes=mutated(FILES["hea"]),
        hea_fields=wfdb_header(FILES["hea"].decode()),
        dat_bytes=mutated(FILES["dat"]),
        atr_bytes=mutated(FILES["atr"]),
        atr_words=annotation_words(FILES["atr"]),
    )
)


# --------------------------------------------------------------------------- confined paths (issue 23, item 3)
def test_a_header_whose_data_file_links_outside_the_folder_stops_the_read_unless_allowed(tmp_path, capsys):
    """A site-A folder whose A01.dat is a link to a file outside it: ``data check`` exits 2 naming the record (never
    a skipped record, nor a traceback); ``--allow-paths-outside`` reads it."""
    from workbench.cli import main

    folder, outside = tmp_path / "site", tmp_path / "outside"
    shutil.copytree(SITE, folder)
    outside.mkdir()
    (folder / "A01.dat").rename(outside / "A01.dat")
    (folder / "A01.dat").symlink_to(outside / "A01.dat")

    def cli(*argv) -> tuple[int, str]:
        with pytest.raises(SystemExit) as exit_info:
            main(["data", "check", "physio", "--data", str(folder), *argv])
        out, err = capsys.readouterr()
        return exit_info.value.code, out + err

    code, out = cli()
    assert code == 2 and "Traceback" not in out, out
    assert "A01.hea: names " in out and "outside the data folder" in out and "--allow-paths-outside" in out
    code, out = cli("--allow-paths-outside")
    assert code == 0 and "no record skipped" in out, out
    with pytest.raises(UserError, match="A01.hea: names .* outside the data folder"):
        read_beat_folder(folder, on_error="skip")

"""Beats of annotated WFDB records (workbench.domains.physio.beats): a real MIT-BIH excerpt (record 100, from
wfdb-python's sample data; tests/data/real/physio/mitdb/LICENSE) read against wfdb itself, the AAMI classes, de Chazal's
inter-patient split, and the bad records that must be named (file and problem), raised or skipped and reported."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

wfdb = pytest.importorskip("wfdb")

from workbench.domains.physio import (  # noqa: E402
    AAMI_CLASS_OF,
    DE_CHAZAL_SPLIT,
    PACED_RECORDS,
    has_mitbih_names,
    inter_patient_split,
    read_beat_folder,
    read_mitbih,
)

from workbench.core.errors import UserError  # noqa: E402

MITBIH = Path(__file__).parent / "data" / "real" / "physio" / "mitdb"


def copy_record(folder: Path, name: str = "100", source: str = "100") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in (".dat", ".atr"):
        shutil.copy(MITBIH / f"{source}{suffix}", folder / f"{name}{suffix}")
    header = (MITBIH / f"{source}.hea").read_text().replace(f"{source}.dat", f"{name}.dat")
    (folder / f"{name}.hea").write_text(header.replace(source, name, 1))
    return folder


def write_record(folder: Path, name: str, fs: float, signal_mv: np.ndarray, samples, symbols, names=("MLII", "V5")):
    folder.mkdir(parents=True, exist_ok=True)
    units, formats = ["mV"] * len(names), ["16"] * len(names)
    wfdb.wrsamp(name, fs=fs, units=units, sig_name=list(names), p_signal=signal_mv, fmt=formats, write_dir=str(folder))
    wfdb.wrann(name, "atr", np.asarray(samples), symbol=list(symbols), write_dir=str(folder))


def test_real_mitbih_excerpt_beats_are_wfdbs_samples_around_its_annotations():
    beats = read_mitbih(MITBIH)
    reference = wfdb.rdrecord(str(MITBIH / "100"), channel_names=["MLII"]).p_signal[:, 0]
    annotation = wfdb.rdann(str(MITBIH / "100"), "atr")
    assert beats.fs_hz == 360 and beats.beats_mv.shape == (371, 90 + 162)  # 0.25 s before, 0.45 s after
    assert beats.class_counts() == {"N": 362, "S": 8, "V": 1, "F": 0, "Q": 0}
    assert beats.excluded == {"beat at the record's edge": 1}
    expected = Counter(AAMI_CLASS_OF[s] for s in annotation.symbol)
    assert expected == {"N": 363, "S": 8, "V": 1}  # the edge beat is an N
    for k in (0, 100, int(np.flatnonzero(beats.labels == 2)[0])):
        peak = beats.r_peaks[k]
        np.testing.assert_allclose(beats.beats_mv[k], reference[peak - 90 : peak + 162], rtol=0, atol=1e-6)
        assert peak in annotation.sample
    assert set(beats.subjects) == set(beats.records) == {"100"}  # records are patients


def test_aami_classes_follow_ec57():
    expected = {"N": "NLRej", "S": "AaJS", "V": "VE", "F": "F", "Q": "/fQ"}
    assert AAMI_CLASS_OF == {symbol: name for name, symbols in expected.items() for symbol in symbols}
    for symbol in '+~|x!"[]':  # rhythm, noise, artefact, non-conducted P, flutter wave, comments: not beats
        assert symbol not in AAMI_CLASS_OF


def test_non_beat_annotations_are_counted_and_nothing_is_resampled(tmp_path):
    fs, n = 250.0, 2500
    t = np.arange(n) / fs
    signal = np.stack([np.sin(2 * np.pi * 1.2 * t), np.cos(2 * np.pi * 1.2 * t)], axis=1)
    write_record(tmp_path / "site", "s01", fs, signal, [10, 300, 600, 900, 1200, 2490], ["N", "+", "V", "~", "F", "N"])
    beats = read_beat_folder(tmp_path / "site", lead="mlii")
    assert beats.fs_hz == 250 and beats.beats_mv.shape == (2, round(0.25 * fs) + round(0.45 * fs))
    assert beats.class_counts() == {"N": 0, "S": 0, "V": 1, "F": 1, "Q": 0}  # both N beats lie at the edges
    assert beats.excluded == {"non-beat annotation": 2, "beat at the record's edge": 2}
    with pytest.raises(UserError, match=r"s01\.hea: sampling rate 250 Hz, expected 360 Hz"):
        read_mitbih(tmp_path / "site")


def test_inter_patient_split_and_paced_records(tmp_path):
    for name in ("100", "101", "102"):
        copy_record(tmp_path / "mitbih", name)
    beats = read_mitbih(tmp_path / "mitbih")
    assert beats.excluded["record left out"] == 1 and "102" in PACED_RECORDS  # paced: left out, counted
    split = inter_patient_split(beats)
    assert set(split["DS1"].records) == {"101"} and set(split["DS2"].records) == {"100"}
    assert not set(DE_CHAZAL_SPLIT["DS1"]) & set(DE_CHAZAL_SPLIT["DS2"])
    assert len(DE_CHAZAL_SPLIT["DS1"]) == len(DE_CHAZAL_SPLIT["DS2"]) == 22
    assert set(read_mitbih(tmp_path / "mitbih", include_paced=True).records) == {"100", "101", "102"}
    copy_record(tmp_path / "other", "patient-a")
    assert inter_patient_split(read_beat_folder(tmp_path / "other")) is None  # not MIT-BIH names: no DS1/DS2
    assert has_mitbih_names(tmp_path / "mitbih") and not has_mitbih_names(tmp_path / "other")


def test_bad_records_are_named_raised_or_skipped_and_reported(tmp_path):
    folder = copy_record(tmp_path / "bad", "100")
    copy_record(folder, "101")
    data = folder / "101.dat"
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(UserError, match=r"101\.dat: truncated data file"):
        read_mitbih(folder)
    beats = read_mitbih(folder, on_error="skip")
    assert set(beats.records) == {"100"} and "truncated" in beats.skipped.summary()

    copy_record(tmp_path / "lead", "100")
    with pytest.raises(UserError, match=r"100\.hea: missing lead\(s\) V1 \(the header has MLII, V5\)"):
        read_beat_folder(tmp_path / "lead", lead="V1")

    fs, n = 360.0, 3600
    signal = np.stack([np.sin(np.arange(n) / 30), np.cos(np.arange(n) / 30)], axis=1)
    write_record(tmp_path / "late", "200", fs, signal, [500, 3599 + 40], ["N", "N"])
    with pytest.raises(UserError, match=r"200\.atr: annotation 'N' at sample 3639 lies outside the record"):
        read_mitbih(tmp_path / "late")

    (tmp_path / "none").mkdir()
    shutil.copy(MITBIH / "100.hea", tmp_path / "none" / "100.hea")
    with pytest.raises(UserError, match=r"no WFDB record with \.atr beat annotations"):
        read_mitbih(tmp_path / "none")

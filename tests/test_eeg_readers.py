"""The EEG readers and the channel contract, on small real files written here with MNE and edfio (EDF, EDF+
hypnograms, FIF, BrainVision is not written), a real GDF from MNE's testing data (tests/data/eeg, see its
LICENSE) given a GDF 2 event table with the BCI IV 2a codes, and hand-made BNCI ``.mat`` files."""

from __future__ import annotations

import datetime
import shutil
import struct
from pathlib import Path

import edfio
import mne
import numpy as np
import pytest
import scipy.io
from workbench.domains.eeg import (
    BCI2A_CHANNELS,
    EegWindows,
    read_bci_iv_2a,
    read_bnci_2a_mat,
    read_eeg_folder,
    read_eegmmidb,
    read_recording,
    read_sleep_edf,
    select_channels,
    standardize_channel_name,
)
from workbench.domains.eeg.motor import bci_iv_2a_trials

from workbench.core.errors import UserError

GDF_1CH = Path(__file__).parent / "data" / "eeg" / "test_1ch.gdf"
START = datetime.datetime(1989, 4, 24, 22, 0, 0, tzinfo=datetime.timezone.utc)


# ------------------------------------------------------------------------------------------------ writers
def _ramp_uv(n: int, low: float = -200.0, high: float = 200.0) -> np.ndarray:
    return np.linspace(low, high, n)


def write_psg(path: Path, duration_s: int) -> None:
    """A sleep-cassette-like PSG: 3 channels at 100 Hz (EEG Fpz-Cz a ramp, to check alignment), 3 at 1 Hz."""
    n = duration_s * 100
    rng = np.random.default_rng(0)
    uv, slow = {"physical_dimension": "uV", "physical_range": (-250, 250)}, {"physical_range": (-10, 40)}
    signals = [
        edfio.EdfSignal(_ramp_uv(n), 100, label="EEG Fpz-Cz", **uv),
        edfio.EdfSignal(rng.normal(0, 20, n), 100, label="EEG Pz-Oz", **uv),
        edfio.EdfSignal(rng.normal(0, 20, n), 100, label="EOG horizontal", **uv),
        edfio.EdfSignal(37 + rng.normal(0, 0.1, duration_s), 1, label="Temp rectal", **slow),
        edfio.EdfSignal(rng.normal(0, 1, duration_s), 1, label="Event marker", **slow),
        edfio.EdfSignal(rng.normal(0, 1, duration_s), 1, label="Resp oro-nasal", **slow),
    ]
    recording = edfio.Recording(startdate=START.date())
    edfio.Edf(signals, recording=recording, starttime=START.time(), data_record_duration=30).write(path)


def write_hypnogram(path: Path, stages: list[tuple[float, float, str]]) -> None:
    """An annotation-only EDF+ hypnogram (edfio: no signals, only annotations), as Sleep-EDF ships them."""
    annotations = [edfio.EdfAnnotation(onset, duration, text) for onset, duration, text in stages]
    recording = edfio.Recording(startdate=START.date())
    edfio.Edf([], recording=recording, starttime=START.time(), annotations=annotations).write(path)


def write_edf(path: Path, ch_names, sfreq, duration_s, annotations, ch_types="eeg", seed=0) -> None:
    """A single-rate recording written by MNE itself (mne.export.export_raw through edfio)."""
    rng = np.random.default_rng(seed)
    info = mne.create_info(list(ch_names), sfreq, ch_types=ch_types)
    raw = mne.io.RawArray(rng.normal(0, 20e-6, (len(ch_names), int(duration_s * sfreq))), info, verbose="error")
    raw.set_meas_date(START)
    onsets, durations, descriptions = zip(*annotations) if annotations else ((), (), ())
    raw.set_annotations(mne.Annotations(onsets, durations, descriptions, orig_time=START))
    path.parent.mkdir(parents=True, exist_ok=True)
    mne.export.export_raw(path, raw, fmt="edf", overwrite=True, verbose="error")


def gdf_with_events(path: Path, label: str, events: list[tuple[float, int]]) -> None:
    """MNE's 1-channel GDF 2.10 test file (150 Hz, 30 s) with its channel relabelled and a GDF 2 event table
    (mode 1: number of events as 3 bytes, event rate float32, 1-based uint32 positions, uint16 types) appended."""
    content = bytearray(GDF_1CH.read_bytes())
    assert content[:8] == b"GDF 2.10" and content[256:259] == b"ECG"
    content[256:272] = label.encode().ljust(16, b"\0")  # first channel's label, in the variable header
    positions = np.array([round(onset * 150) + 1 for onset, _ in events], "<u4")
    codes = np.array([code for _, code in events], "<u2")
    content += bytes([1]) + len(events).to_bytes(3, "little") + struct.pack("<f", 150.0)
    content += positions.tobytes() + codes.tobytes()
    path.write_bytes(bytes(content))


# Hypnogram of SC4001: 30 epochs wake, then N1, N2 x2, stage 3, stage 4, REM x2, ?, movement, and 22 wake
# epochs, the last of which runs past the end of the 1800 s PSG (as the published hypnograms' last entry may).
STAGES_4001 = [
    (0, 900, "Sleep stage W"),
    (900, 30, "Sleep stage 1"),
    (930, 60, "Sleep stage 2"),
    (990, 30, "Sleep stage 3"),
    (1020, 30, "Sleep stage 4"),
    (1050, 60, "Sleep stage R"),
    (1110, 30, "Sleep stage ?"),
    (1140, 30, "Movement time"),
    (1170, 660, "Sleep stage W"),
]


@pytest.fixture(scope="module")
def sleep_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sleep-cassette")
    write_psg(root / "SC4001E0-PSG.edf", 1800)
    write_hypnogram(root / "SC4001EC-Hypnogram.edf", STAGES_4001)
    (root / "night2").mkdir()
    write_psg(root / "night2" / "SC4012E0-PSG.edf", 180)
    write_hypnogram(
        root / "night2" / "SC4012EA-Hypnogram.edf",
        [(0, 60, "Sleep stage W"), (60, 60, "Sleep stage 2"), (120, 60, "Sleep stage W")],
    )
    return root


# ------------------------------------------------------------------------------------------- Sleep-EDF
def test_hypnogram_written_by_edfio_reads_back_with_mne(sleep_root):
    annotations = mne.read_annotations(sleep_root / "SC4001EC-Hypnogram.edf")
    assert list(annotations.description) == [text for _, _, text in STAGES_4001]
    np.testing.assert_allclose(annotations.duration, [d for _, d, _ in STAGES_4001])


def test_sleep_edf_pairs_maps_stages_and_counts_exclusions(sleep_root):
    windows = read_sleep_edf(sleep_root, wake_margin_min=None)
    assert isinstance(windows, EegWindows)
    assert windows.classes == ("W", "N1", "N2", "N3", "REM")
    assert windows.signals_uv.shape == (len(windows), 2, 3000) and windows.signals_uv.dtype == np.float32
    first = windows.subset(windows.records == "SC4001")
    assert first.class_counts() == {"W": 30 + 21, "N1": 1, "N2": 2, "N3": 2, "REM": 2}  # N3 = stage 3 + stage 4
    assert set(windows.subjects.tolist()) == {"00", "01"} and set(windows.records.tolist()) == {"SC4001", "SC4012"}
    assert windows.subset(windows.records == "SC4012").class_counts() == {"W": 4, "N1": 0, "N2": 2, "N3": 0, "REM": 0}
    assert windows.excluded == {"Sleep stage ?": 1, "Movement time": 1, "epoch past the end of the recording": 1}
    # each epoch's first sample is the Fpz-Cz ramp at its onset: windows are where the hypnogram says
    expected = -200 + 400 * first.onsets_s * 100 / (1800 * 100 - 1)
    np.testing.assert_allclose(first.signals_uv[:, 0, 0], expected, atol=0.05)
    assert windows.ch_names == ("EEG Fpz-Cz", "EEG Pz-Oz") and windows.sfreq == 100.0


def test_sleep_edf_wake_is_cropped_to_the_margin(sleep_root):
    windows = read_sleep_edf(sleep_root, wake_margin_min=5)
    first = windows.subset(windows.records == "SC4001")
    # sleep from 900 s to 1110 s: wake kept from 600 s (10 epochs) and up to 1410 s (1170..1380 s: 8 epochs)
    assert first.class_counts() == {"W": 18, "N1": 1, "N2": 2, "N3": 2, "REM": 2}
    wake = first.onsets_s[first.labels == 0]
    assert wake.min() == 600 and wake.max() == 1380
    assert windows.excluded["wake more than 5 min from sleep"] == 20 + 13  # SC4012's wake is within 5 min


def test_sleep_edf_never_upsamples_1hz_channels_and_refuses_them(sleep_root):
    raw = mne.io.read_raw_edf(sleep_root / "SC4001E0-PSG.edf", verbose="error")
    assert "Temp rectal" in raw.ch_names and raw.info["sfreq"] == 100.0  # MNE would upsample the 1 Hz channels
    windows = read_sleep_edf(sleep_root)
    assert windows.ch_names == ("EEG Fpz-Cz", "EEG Pz-Oz") and windows.sfreq == 100.0 and windows.n_times == 3000
    with pytest.raises(UserError, match=r"SC4001E0-PSG\.edf.*'Temp rectal' at 1 Hz.*upsampled"):
        read_sleep_edf(sleep_root, channels=("EEG Fpz-Cz", "Temp rectal"), on_error="raise")
    with pytest.raises(UserError, match=r"'Event marker' holds events or labels"):
        read_sleep_edf(sleep_root, channels=("EEG Fpz-Cz", "Event marker"), on_error="raise")


def test_sleep_edf_psg_without_hypnogram_is_an_error_or_a_reported_skip(sleep_root, tmp_path):
    shutil.copytree(sleep_root, tmp_path, dirs_exist_ok=True)
    shutil.copy(sleep_root / "SC4001E0-PSG.edf", tmp_path / "SC4021E0-PSG.edf")
    with pytest.raises(UserError, match=r"SC4021E0-PSG\.edf: no hypnogram SC4021E\?-Hypnogram\.edf"):
        read_sleep_edf(tmp_path, on_error="raise")
    windows = read_sleep_edf(tmp_path, on_error="skip")
    assert [Path(p).name for p in windows.skipped.records] == ["SC4021E0-PSG.edf"]
    assert "SC4021" not in set(windows.records.tolist())


def test_sleep_edf_annotation_past_the_end_is_an_error(tmp_path):
    write_psg(tmp_path / "SC4001E0-PSG.edf", 180)
    stages = [(0, 60, "Sleep stage W"), (60, 60, "Sleep stage 2"), (180, 60, "Sleep stage ?")]
    write_hypnogram(tmp_path / "SC4001EC-Hypnogram.edf", stages)  # an unscored tail past the end is counted
    assert read_sleep_edf(tmp_path, wake_margin_min=None).excluded == {"Sleep stage ?": 2}
    write_hypnogram(tmp_path / "SC4001EC-Hypnogram.edf", [*stages, (1900, 30, "Sleep stage 2")])
    with pytest.raises(UserError, match=r"SC4001EC-Hypnogram\.edf: annotation 'Sleep stage 2' at 1900 s lies outside"):
        read_sleep_edf(tmp_path, on_error="raise")


def test_sleep_edf_disallowed_rate_is_refused_and_resampling_is_logged(sleep_root):
    with pytest.raises(UserError, match=r"SC4001E0-PSG\.edf: sampling rate 100 Hz is not one the data card allows"):
        read_sleep_edf(sleep_root, allowed_sfreqs=(200,), on_error="raise")
    windows = read_sleep_edf(sleep_root, resample_to=50)
    assert windows.sfreq == 50.0 and windows.n_times == 1500
    assert any("resampled from 100 Hz to 50 Hz" in note for note in windows.notes)


# ------------------------------------------------------------------------------------------- EEGMMIDB
MMIDB_NAMES = ["Fc5.", "C3..", "Cz..", "C4..", "Fp1.", "Afz."]


@pytest.fixture(scope="module")
def mmidb_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eegmmidb")
    events = [(0.0, 4.1, "T0"), (4.2, 4.1, "T1"), (8.4, 4.1, "T0"), (12.6, 4.1, "T2"), (16.8, 4.1, "T1")]
    for run in (3, 4, 6, 1):
        write_edf(root / "S001" / f"S001R{run:02d}.edf", MMIDB_NAMES, 160, 22, events if run > 1 else [], seed=run)
    return root


def test_eegmmidb_names_are_standardised_and_t1_t2_mean_what_the_run_says(mmidb_root):
    assert mne.io.read_raw_edf(mmidb_root / "S001" / "S001R04.edf", verbose="error").ch_names == MMIDB_NAMES
    assert [standardize_channel_name(name) for name in MMIDB_NAMES] == ["FC5", "C3", "Cz", "C4", "Fp1", "AFz"]
    windows = read_eegmmidb(mmidb_root, channels=("C3", "Cz", "C4", "FC5"))
    assert windows.ch_names == ("C3", "Cz", "C4", "FC5") and windows.sfreq == 160.0 and windows.n_times == 640
    assert set(windows.records.tolist()) == {"S001R04", "S001R06"}  # imagery only; R03 execution, R01 baseline
    r04, r06 = (windows.subset(windows.records == name) for name in ("S001R04", "S001R06"))
    classes = windows.classes
    assert [classes[i] for i in r04.labels] == ["left_fist", "right_fist", "left_fist"]
    assert [classes[i] for i in r06.labels] == ["both_fists", "both_feet", "both_fists"]
    assert windows.excluded == {"T0 rest (rest=False)": 4}
    assert set(windows.subjects.tolist()) == {"S001"}
    execution = read_eegmmidb(mmidb_root, kind="execution", rest=True, channels=("C3",))
    assert set(execution.records.tolist()) == {"S001R03"}
    assert execution.class_counts() == {"left_fist": 2, "right_fist": 1, "both_fists": 0, "both_feet": 0, "rest": 2}
    # the window is the file's samples from the annotation onset, in µV
    raw = mne.io.read_raw_edf(mmidb_root / "S001" / "S001R03.edf", verbose="error", preload=True)
    start = int(round(4.2 * 160))
    np.testing.assert_allclose(
        execution.signals_uv[1, 0], raw.get_data(picks=["C3.."])[0, start : start + 640] * 1e6, rtol=1e-5, atol=1e-3
    )


def test_eegmmidb_disallowed_rate_names_the_file(tmp_path):
    write_edf(tmp_path / "S088" / "S088R04.edf", MMIDB_NAMES, 128, 10, [(0.0, 4.1, "T1")])
    with pytest.raises(UserError, match=r"S088R04\.edf: sampling rate 128 Hz is not one the data card allows"):
        read_eegmmidb(tmp_path, channels=("C3",), on_error="raise")
    windows = read_eegmmidb(tmp_path, channels=("C3",), allowed_sfreqs=(128, 160), resample_to=160)
    assert windows.sfreq == 160.0 and windows.n_times == 640


# ------------------------------------------------------------------------------------ BCI IV 2a (GDF)
def test_real_gdf_reads_through_the_contract_and_its_rate_is_checked():
    selection = read_recording(GDF_1CH, ["ECG"])
    assert selection.raw.ch_names == ["ECG"] and selection.sfreq == 150.0 and selection.raw.n_times == 4500
    with pytest.raises(UserError, match=r"test_1ch\.gdf: sampling rate 150 Hz is not one the data card allows"):
        read_recording(GDF_1CH, ["ECG"], allowed_sfreqs=(250,))


def test_bci_iv_2a_gdf_missing_channels_name_them_and_the_file(tmp_path):
    shutil.copy(GDF_1CH, tmp_path / "A01T.gdf")
    with pytest.raises(UserError, match=r"A01T\.gdf: channel\(s\) Fz, FC3, .*POz missing \(the file has: ECG\)"):
        read_bci_iv_2a(tmp_path)


T_EVENTS = [
    (0.5, 768), (2.5, 769),  # trial 1: left hand
    (8.5, 768), (8.5, 1023), (10.5, 770),  # trial 2: rejected
    (16.5, 768), (18.5, 772),  # trial 3: tongue
    (23.0, 768), (25.0, 771),  # trial 4: feet
]  # fmt: skip


def test_bci_iv_2a_gdf_events_rejected_trials_and_e_labels(tmp_path):
    gdf_with_events(tmp_path / "A01T.gdf", "EEG-C3", T_EVENTS)
    e_events = [(onset, 783 if code in (769, 770, 771, 772) else code) for onset, code in T_EVENTS]
    gdf_with_events(tmp_path / "A01E.gdf", "EEG-C3", e_events)
    scipy.io.savemat(tmp_path / "A01E.mat", {"classlabel": np.array([[2], [3], [4], [1]], np.uint8)})
    windows = read_bci_iv_2a(tmp_path, channels=("C3",), allowed_sfreqs=(150,))
    assert windows.ch_names == ("C3",) and windows.n_times == 300  # 0.5 to 2.5 s after the cue at 150 Hz
    t, e = windows.subset(windows.records == "A01T"), windows.subset(windows.records == "A01E")
    assert [windows.classes[i] for i in t.labels] == ["left_hand", "tongue", "feet"]
    assert [windows.classes[i] for i in e.labels] == ["right_hand", "tongue", "left_hand"]  # 2, (3: rejected), 4, 1
    np.testing.assert_allclose(t.onsets_s, [3.0, 19.0, 25.5])
    assert windows.excluded == {"rejected trial": 2}
    assert set(windows.subjects.tolist()) == {"A01"}
    raw = mne.io.read_raw_gdf(tmp_path / "A01T.gdf", verbose="error", preload=True)
    np.testing.assert_allclose(t.signals_uv[0, 0], raw.get_data()[0, 450:750] * 1e6, rtol=1e-6)


def test_bci_iv_2a_gdf_numbered_channels_map_to_10_20_names(tmp_path):
    gdf_with_events(tmp_path / "A03T.gdf", "EEG-5", T_EVENTS)
    windows = read_bci_iv_2a(tmp_path, channels=("C5",), allowed_sfreqs=(150,))
    assert windows.ch_names == ("C5",) and len(windows) == 3
    with pytest.raises(UserError, match=r"A03T\.gdf: channel\(s\) C1 missing \(the file has: EEG-5\)"):
        read_bci_iv_2a(tmp_path, channels=("C1",), allowed_sfreqs=(150,))
    with pytest.raises(UserError, match=r"EOG-left: BCI IV 2a's EOG channels are excluded"):
        read_bci_iv_2a(tmp_path, channels=("C5", "EOG-left"), allowed_sfreqs=(150,))


def test_bci_iv_2a_e_file_needs_its_mat_and_matching_classlabel(tmp_path):
    gdf_with_events(tmp_path / "A02E.gdf", "EEG-C3", [(0.5, 768), (2.5, 783), (8.5, 768), (10.5, 783)])
    with pytest.raises(UserError, match=r"A02E\.mat: file missing: .*783"):
        read_bci_iv_2a(tmp_path, channels=("C3",), allowed_sfreqs=(150,))
    scipy.io.savemat(tmp_path / "A02E.mat", {"classlabel": np.array([1, 2, 3])})
    with pytest.raises(UserError, match=r"A02E\.mat: field 'classlabel': expected 2 classes .* found 3"):
        read_bci_iv_2a(tmp_path, channels=("C3",), allowed_sfreqs=(150,))


def test_bci_iv_2a_trial_logic_without_trial_start_events():
    onsets = [2.0, 8.0, 9.0, 14.0]
    labels = bci_iv_2a_trials(Path("A03T.gdf"), onsets, ["769", "1023", "770", "772"])
    np.testing.assert_allclose(labels[0], [2.0, 14.0])  # the trial of the 770 cue starts 2 s before it: rejected
    assert labels[1].tolist() == [0, 3] and labels[2] == 1


# ------------------------------------------------------------------------------------ BCI IV 2a (BNCI)
def _bnci_run(n_trials: int, fs: float = 250.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = int(fs * (8 * n_trials + 4))
    x = rng.normal(0, 10, (n, 25))
    x[:, 22:] += 1000  # EOG far off: a leak into the EEG windows would show
    trial = (np.arange(n_trials) * 8 * fs + 1).astype(np.int32).reshape(-1, 1)
    y = (np.arange(n_trials) % 4 + 1).astype(np.uint8).reshape(-1, 1)
    artifacts = np.zeros((n_trials, 1), np.uint8)
    if n_trials:
        artifacts[1] = 1
    classes = np.array(["left hand", "right hand", "feet", "tongue"], dtype=object)
    return {"X": x, "trial": trial, "y": y, "fs": fs, "classes": classes, "artifacts": artifacts, "age": 30}


def test_bnci_mat_reader_reads_runs_drops_artifacts_and_never_the_eog(tmp_path):
    runs = np.empty((1, 2), dtype=object)
    runs[0, 0] = _bnci_run(0)  # an EOG calibration run: no trials
    runs[0, 0]["trial"] = np.zeros((0, 1))
    runs[0, 0]["y"] = np.zeros((0, 1))
    runs[0, 0]["artifacts"] = np.zeros((0, 1))
    runs[0, 1] = _bnci_run(5)
    scipy.io.savemat(tmp_path / "A01T.mat", {"data": runs})
    windows = read_bnci_2a_mat(tmp_path)
    assert windows.ch_names == BCI2A_CHANNELS and windows.signals_uv.shape == (4, 22, 500)
    assert windows.labels.tolist() == [0, 2, 3, 0] and windows.excluded == {"rejected trial": 1}
    assert windows.records.tolist() == ["A01T/run2"] * 4 and set(windows.subjects.tolist()) == {"A01"}
    assert np.abs(windows.signals_uv).max() < 100  # µV as stored, EOG (offset 1000 µV) excluded
    x = runs[0, 1]["X"]
    start = int(2.5 * 250)  # trial start + 2 s cue + 0.5 s
    np.testing.assert_allclose(windows.signals_uv[0], x[start : start + 500, :22].T, rtol=1e-5, atol=1e-4)


def test_bnci_mat_reader_names_the_file_and_field_of_a_bad_file(tmp_path):
    scipy.io.savemat(tmp_path / "A01E.mat", {"classlabel": np.array([1, 2])})  # the competition's label file
    with pytest.raises(UserError, match=r"A01E\.mat: field 'data': expected BNCI's cell array of runs"):
        read_bnci_2a_mat(tmp_path)


# --------------------------------------------------------------------------------------- generic folder
def test_folder_reader_maps_annotations_and_refuses_unknown_ones(tmp_path):
    names = ["C3", "Cz", "C4", "Pz"]
    write_edf(tmp_path / "sub-01" / "a.edf", names, 100, 20, [(1.0, 0, "left"), (5.0, 0, "right"), (9.0, 0, "rest")])
    write_edf(tmp_path / "sub-02" / "b.edf", names, 100, 20, [(2.0, 0, "right"), (6.0, 0, "blink")], seed=1)
    mapping = {"left": "left_hand", "right": "right_hand"}
    with pytest.raises(UserError, match=r"a\.edf: annotation\(s\) 'rest' \(1x\) are not in the mapping"):
        read_eeg_folder(tmp_path, mapping, channels=["C3", "C4"], window_s=2.0)
    windows = read_eeg_folder(tmp_path, mapping, channels=["C4", "C3"], window_s=2.0, tmin_s=0.5, unknown="ignore")
    assert windows.classes == ("left_hand", "right_hand") and windows.ch_names == ("C4", "C3")
    assert windows.labels.tolist() == [0, 1, 1] and windows.subjects.tolist() == ["sub-01", "sub-01", "sub-02"]
    np.testing.assert_allclose(windows.onsets_s, [1.5, 5.5, 2.5])
    assert windows.excluded == {"annotation 'rest' outside the mapping": 1, "annotation 'blink' outside the mapping": 1}
    assert windows.signals_uv.shape == (3, 2, 200)


def test_folder_reader_tiles_long_annotations_and_reads_fif(tmp_path):
    info = mne.create_info(["Fz", "Cz"], 100.0, "eeg")
    raw = mne.io.RawArray(np.random.default_rng(0).normal(0, 1e-5, (2, 3000)), info, verbose="error")
    raw.set_meas_date(START)
    raw.set_annotations(mne.Annotations([1, 11], [10, 5], ["awake", "asleep"], orig_time=START))
    raw.crop(tmin=1.0).save(tmp_path / "night_raw.fif", verbose="error")  # first_time 1 s: onsets count from it
    windows = read_eeg_folder(tmp_path, {"awake": "W", "asleep": "S"}, channels=["Fz"], window_s=2.5, tile=True)
    assert windows.labels.tolist() == [0, 0, 0, 0, 1, 1] and windows.subjects.tolist() == ["night_raw"] * 6
    np.testing.assert_allclose(windows.onsets_s, [0, 2.5, 5, 7.5, 10, 12.5])


# ----------------------------------------------------------------------------------- channel contract
def _raw(names, sfreq=100.0, types="eeg", n=1000):
    info = mne.create_info(names, sfreq, types)
    data = np.random.default_rng(0).normal(0, 1e-5, (len(names), n))
    return mne.io.RawArray(data, info, verbose="error")


def test_missing_channel_is_an_error_naming_it_and_the_file():
    with pytest.raises(UserError, match=r"rec\.edf: channel\(s\) Oz missing \(the file has: C3, Cz, C4\)"):
        select_channels(["C3", "Cz", "C4"], ["C3", "Oz"], source="rec.edf")
    with pytest.raises(UserError, match=r"rec\.edf: channel\(s\) Oz missing"):
        select_channels(_raw(["C3", "Cz", "C4"]), ["C3", "Oz"], source="rec.edf")


def test_interpolation_only_when_asked_and_logged_never_zeros():
    raw = _raw(["Fz", "C3", "C4", "Pz", "O1", "O2"])
    with pytest.raises(UserError, match="missing"):
        select_channels(raw, ["C3", "Cz", "C4"], source="rec.edf")
    selection = select_channels(raw, ["C3", "Cz", "C4"], source="rec.edf", allow_interpolation=True)
    assert selection.interpolated == ("Cz",) and selection.raw.ch_names == ["C3", "Cz", "C4"]
    assert selection.file_names == ("C3", None, "C4")
    assert any("interpolated missing channel(s) Cz" in note for note in selection.notes)
    cz = selection.raw.get_data(picks=["Cz"])[0]
    assert np.all(np.isfinite(cz)) and np.abs(cz).max() > 0  # interpolated, not zero-filled
    np.testing.assert_array_equal(selection.raw.get_data(picks=["C3"])[0], raw.get_data(picks=["C3"])[0])
    assert raw.ch_names == ["Fz", "C3", "C4", "Pz", "O1", "O2"]  # the input is not modified
    with pytest.raises(UserError, match="not in the .* montage"):
        select_channels(raw, ["C3", "EEG Fpz-Cz"], source="rec.edf", allow_interpolation=True)


def test_readers_interpolate_from_the_files_other_channels_only_when_asked(tmp_path):
    names = ["Fz", "C3", "C4", "Pz", "O1", "O2"]
    write_edf(tmp_path / "sub-01" / "a.edf", names, 100, 10, [(1.0, 0, "go")])
    with pytest.raises(UserError, match=r"a\.edf: channel\(s\) Cz missing"):
        read_eeg_folder(tmp_path, {"go": "go"}, channels=["C3", "Cz"], window_s=1.0)
    windows = read_eeg_folder(tmp_path, {"go": "go"}, channels=["C3", "Cz"], window_s=1.0, allow_interpolation=True)
    assert windows.ch_names == ("C3", "Cz") and np.abs(windows.signals_uv[:, 1]).max() > 0
    (note,) = windows.notes
    assert note.startswith(f"{tmp_path / 'sub-01' / 'a.edf'}: interpolated missing channel(s) Cz from ")
    assert set(note.rsplit(" from ", 1)[1].split(", ")) == {"Fz", "C3", "C4", "Pz", "O1", "O2"}


def test_stim_channels_never_reach_the_signals(tmp_path):
    raw = _raw(["C3", "Cz", "STI 014"], types=["eeg", "eeg", "stim"])
    selection = select_channels(raw, ["Cz", "C3"])
    assert selection.raw.ch_names == ["Cz", "C3"] and "stim" not in selection.raw.get_channel_types()
    with pytest.raises(UserError, match=r"'STI 014' holds events or labels \(type stim\)"):
        select_channels(raw, ["C3", "STI 014"])
    labelled = _raw(["C3", "Cz", "label"], types=["eeg", "eeg", "misc"])  # a misc channel carrying labels
    with pytest.raises(UserError, match=r"'label' holds events or labels"):
        select_channels(labelled, ["C3", "label"])
    # a file with a stim channel: the reader's windows hold only the EEG channels asked for
    write_edf(tmp_path / "s1" / "rec.edf", ["C3", "Cz", "Status"], 100, 10, [(1.0, 0, "go")])
    assert "stim" in mne.io.read_raw_edf(tmp_path / "s1" / "rec.edf", verbose="error").get_channel_types()
    windows = read_eeg_folder(tmp_path, {"go": "go"}, channels=["C3", "Cz"], window_s=1.0)
    assert windows.ch_names == ("C3", "Cz") and windows.n_chans == 2


def test_disallowed_rate_is_refused_and_resampling_only_when_asked():
    raw = _raw(["C3", "C4"], sfreq=512.0)
    with pytest.raises(UserError, match=r"rec\.bdf: sampling rate 512 Hz is not one the data card allows \(250 Hz\)"):
        select_channels(raw, ["C3"], source="rec.bdf", allowed_sfreqs=(250,))
    kept = select_channels(raw, ["C3"], source="rec.bdf")
    assert kept.sfreq == 512.0 and kept.resampled_from is None and not kept.notes
    resampled = select_channels(raw, ["C3"], source="rec.bdf", allowed_sfreqs=(256, 512), resample_to=256)
    assert resampled.sfreq == 256.0 and resampled.resampled_from == 512.0 and resampled.raw.n_times == 500
    assert resampled.notes == ("rec.bdf: resampled from 512 Hz to 256 Hz",)


def test_channel_names_are_standardised_and_ambiguity_is_an_error():
    assert standardize_channel_name("EEG-Fz") == "Fz" and standardize_channel_name("FP1") == "Fp1"
    assert standardize_channel_name("EEG Fpz-Cz") == "EEG Fpz-Cz"
    assert select_channels(["Fc5.", "c3.."], ["C3", "FC5"]).file_names == ("c3..", "Fc5.")
    with pytest.raises(UserError, match="both read as 'c3'"):
        select_channels(["C3", "C3.."], ["C3"], source="rec.edf")


def test_windows_subset_keeps_reports():
    windows = EegWindows(
        signals_uv=np.zeros((3, 1, 4), np.float32),
        labels=np.array([0, 1, 0]),
        classes=("a", "b"),
        subjects=np.array(["s1", "s2", "s2"]),
        records=np.array(["r1", "r2", "r3"]),
        onsets_s=np.array([0.0, 1.0, 2.0]),
        ch_names=("Cz",),
        sfreq=100.0,
        excluded={"why": 2},
    )
    part = windows.subset(windows.subjects == "s2")
    assert part.records.tolist() == ["r2", "r3"] and part.excluded == {"why": 2} and len(part) == 2
    assert "excluded: why 2" in windows.report()


def test_the_readers_read_the_embedded_sets():
    """The embedded data is in the published layouts: the same readers as for real downloads read it unchanged."""
    from workbench.domains.eeg import read_eegmmidb, read_sleep_edf

    embedded = Path(__file__).resolve().parents[1] / "domains" / "eeg" / "embedded"
    sleep = read_sleep_edf(embedded / "sleep-edf")
    assert sleep.signals_uv.shape[1:] == (2, 3000) and sleep.sfreq == 100
    assert set(sleep.class_counts()) == {"W", "N1", "N2", "N3", "REM"} and len(sleep.subject_counts()) == 6
    assert sleep.excluded == {"Movement time": 3, "Sleep stage ?": 3}
    motor = read_eegmmidb(embedded / "eegmmidb", channels=["FC3", "FCz", "FC4", "C3", "Cz", "C4", "CP3", "CPz", "CP4"])
    assert motor.signals_uv.shape[1:] == (9, 640) and motor.sfreq == 160 and len(motor.subject_counts()) == 8
    assert set(motor.class_counts().values()) == {24}

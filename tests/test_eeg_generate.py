"""Tests of the synthetic EEG generator: layouts, the physiology by band power, the motor-imagery baseline,
reproducibility and the shipped files (cards sleep-edf-synthetic, motor-imagery-synthetic).

Every file is read back with MNE (``mne.io.read_raw_edf``, ``mne.read_annotations``); edfio's reader only checks
the per-signal rates in the file, which MNE hides by upsampling.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import edfio
import mne
import numpy as np
import pytest
from scipy.signal import butter, sosfiltfilt, welch
from workbench.domains.eeg import generate, motor_simulator, sleep_simulator

from workbench.core.errors import UserError

EMBEDDED = Path(generate.__file__).parent / "embedded"
SLEEP = EMBEDDED / "sleep-edf"
IMAGERY = EMBEDDED / "eegmmidb"
FS = sleep_simulator.PSG_RATE_HZ
EPOCH = sleep_simulator.EPOCH_S * FS


def read_night(root: Path, subject: dict) -> tuple[dict[str, np.ndarray], mne.Annotations, mne.io.BaseRaw]:
    """The 100 Hz channels [µV] of one subject's PSG, its hypnogram annotations and the raw object."""
    stem = f"SC4{subject['subject']:02d}{subject['night']}"
    raw = mne.io.read_raw_edf(root / "sleep-cassette" / f"{stem}E0-PSG.edf", verbose="error")
    annotations = mne.read_annotations(root / "sleep-cassette" / f"{stem}E{subject['scorer']}-Hypnogram.edf")
    names = ["EEG Fpz-Cz", "EEG Pz-Oz", "EOG horizontal"]
    return dict(zip(names, raw.get_data(picks=names) * 1e6)), annotations, raw


def band_power(x: np.ndarray, low_hz: float, high_hz: float, fs: float) -> np.ndarray:
    """Welch power in [low_hz, high_hz) [µV²] along the last axis (4 s segments at 100 Hz, 1 s at 160 Hz)."""
    f, p = welch(x, fs, nperseg=int(4 * fs) if fs == FS else int(fs))
    band = (f >= low_hz) & (f < high_hz)
    return p[..., band].sum(-1) * (f[1] - f[0])


def stage_power(x: np.ndarray, hypnogram: str, stages: str, low_hz: float, high_hz: float) -> float:
    """Mean band power [µV²] over the epochs of these stages."""
    epochs = [k for k, stage in enumerate(hypnogram) if stage in stages]
    return float(np.mean([band_power(x[k * EPOCH : (k + 1) * EPOCH], low_hz, high_hz, FS) for k in epochs]))


@pytest.fixture(scope="module")
def sleep_recipe() -> dict:
    return json.loads((SLEEP / "generator.json").read_text())


@pytest.fixture(scope="module")
def imagery_recipe() -> dict:
    return json.loads((IMAGERY / "generator.json").read_text())


# ---------------------------------------------------------------- sleep


def test_sleep_layout_channels_and_units(sleep_recipe):
    names = sorted(p.name for p in (SLEEP / "sleep-cassette").iterdir())
    expected = []
    for s in sleep_recipe["subjects"]:
        stem = f"SC4{s['subject']:02d}{s['night']}"
        expected += [f"{stem}E0-PSG.edf", f"{stem}E{s['scorer']}-Hypnogram.edf"]
    assert names == sorted(expected) and len(sleep_recipe["subjects"]) == 6
    assert len({s["scorer"] for s in sleep_recipe["subjects"]}) > 1  # hypnograms pair by SC4ssN, not by letter
    _, _, raw = read_night(SLEEP, sleep_recipe["subjects"][0])
    assert raw.ch_names == list(generate.PSG_CHANNELS) and raw.info["sfreq"] == 100
    edf = edfio.read_edf(SLEEP / "sleep-cassette" / "SC4001E0-PSG.edf")
    units = {signal.label: signal.physical_dimension for signal in edf.signals}
    assert units["EEG Fpz-Cz"] == units["EEG Pz-Oz"] == units["EOG horizontal"] == units["EMG submental"] == "uV"
    assert units["Temp rectal"] == "DegC" and edf.data_record_duration == 30


def test_sleep_one_hz_channels_are_one_hz_in_the_file(sleep_recipe):
    for s in sleep_recipe["subjects"]:
        path = SLEEP / "sleep-cassette" / f"SC4{s['subject']:02d}{s['night']}E0-PSG.edf"
        rates = {signal.label: signal.sampling_frequency for signal in edfio.read_edf(path).signals}
        assert rates == {label: rate for label, (rate, _, _) in generate.PSG_CHANNELS.items()}
        assert [rates[name] for name in ("Resp oro-nasal", "EMG submental", "Temp rectal", "Event marker")] == [1] * 4
        raw = mne.io.read_raw_edf(path, verbose="error")
        assert list(raw._raw_extras[0]["n_samps"]) == [3000, 3000, 3000, 30, 30, 30, 30]  # per 30 s record


def test_hypnograms_cover_the_recording_in_30_s_multiples(sleep_recipe):
    texts = set()
    for s in sleep_recipe["subjects"]:
        _, annotations, raw = read_night(SLEEP, s)
        np.testing.assert_allclose(annotations.onset[1:], (annotations.onset + annotations.duration)[:-1])
        assert annotations.onset[0] == 0 and (annotations.onset + annotations.duration)[-1] == raw.times[-1] + 0.01
        assert np.all(annotations.duration % 30 == 0) and np.all(annotations.duration > 0)
        letters = {text: letter for letter, text in sleep_simulator.STAGE_TEXT.items()}
        epochs = "".join(letters[t] * int(d // 30) for t, d in zip(annotations.description, annotations.duration))
        assert epochs == s["hypnogram"]
        assert all(stage in epochs for stage in "W1234R")
        texts |= set(annotations.description)
    assert texts == set(sleep_simulator.STAGE_TEXT.values())  # every stage, "Sleep stage ?" and "Movement time"


def test_wake_alpha_peaks_at_the_subjects_frequency_and_fades_in_deep_sleep(sleep_recipe):
    for s in sleep_recipe["subjects"]:
        x, _, _ = read_night(SLEEP, s)
        hyp = s["hypnogram"]
        wake_alpha = stage_power(x["EEG Pz-Oz"], hyp, "W", 8, 12)
        assert wake_alpha > 10 * stage_power(x["EEG Pz-Oz"], hyp, "34", 8, 12)
        assert wake_alpha > 3 * stage_power(x["EEG Fpz-Cz"], hyp, "W", 8, 12)  # posterior maximum
        wake = np.concatenate([x["EEG Pz-Oz"][k * EPOCH : (k + 1) * EPOCH] for k, c in enumerate(hyp) if c == "W"])
        f, p = welch(wake, FS, nperseg=800)
        band = (f >= 6) & (f <= 14)
        peak_hz = f[band][np.argmax(p[band])]
        assert 8 <= peak_hz <= 12 and abs(peak_hz - s["alpha_hz"]) <= 1.0, (peak_hz, s["alpha_hz"])


def test_n2_spindles_raise_sigma_power_above_n1(sleep_recipe):
    for s in sleep_recipe["subjects"]:
        x, _, _ = read_night(SLEEP, s)
        n1, n2 = (stage_power(x["EEG Fpz-Cz"], s["hypnogram"], stage, 11, 15) for stage in "12")
        assert n2 > 3 * n1, (n1, n2)


def test_n3_delta_power_and_slow_waves_of_75_uv(sleep_recipe):
    sos = butter(4, [0.5, 2.0], btype="bandpass", fs=FS, output="sos")
    for s in sleep_recipe["subjects"]:
        x, _, _ = read_night(SLEEP, s)
        hyp = s["hypnogram"]
        delta = {stage: stage_power(x["EEG Fpz-Cz"], hyp, stage, 0.5, 2) for stage in "W12R34"}
        assert delta["4"] > delta["3"] > 2 * max(delta[stage] for stage in "W12R"), delta
        slow = sosfiltfilt(sos, x["EEG Fpz-Cz"])
        for k in [k for k, stage in enumerate(hyp) if stage in "34"]:
            assert np.ptp(slow[k * EPOCH : (k + 1) * EPOCH]) >= 75


def test_rem_eog_has_more_rapid_eye_movement_power_than_n2(sleep_recipe):
    for s in sleep_recipe["subjects"]:
        x, _, _ = read_night(SLEEP, s)
        rem, n2 = (stage_power(x["EOG horizontal"], s["hypnogram"], stage, 0.5, 5) for stage in "R2")
        assert rem > 5 * n2, (rem, n2)
        # and REM EEG is low-amplitude: below N2's and N3's
        rms = {st: stage_power(x["EEG Fpz-Cz"], s["hypnogram"], st, 0.5, 45) for st in "R23"}
        assert rms["R"] < rms["2"] < rms["3"]


def test_sleep_generator_is_deterministic_for_a_seed(tmp_path):
    (recipe,) = sleep_simulator.draw_sleep_subjects(1, seed=5)
    recipe = replace(recipe, hypnogram="W2R")
    generate.generate_sleep_edf(tmp_path / "a", seed=5, subjects=[recipe])
    generate.generate_sleep_edf(tmp_path / "b", seed=5, subjects=[recipe])
    generate.generate_sleep_edf(tmp_path / "c", seed=6, subjects=[recipe])
    for name in ("SC4001E0-PSG.edf", "SC4001EC-Hypnogram.edf"):
        a, b, c = ((tmp_path / d / "sleep-cassette" / name).read_bytes() for d in "abc")
        assert a == b
        assert (a != c) == name.endswith("PSG.edf")
    recorded = json.loads((tmp_path / "a" / "generator.json").read_text())
    assert recorded["seed"] == 5 and recorded["subjects"][0]["hypnogram"] == "W2R" and "edfio" in recorded


def test_shipped_night_equals_a_regeneration_from_its_recipe(tmp_path, sleep_recipe):
    seed, subjects = generate.sleep_subjects_from_json(SLEEP / "generator.json")
    assert subjects == sleep_simulator.draw_sleep_subjects(len(subjects), seed)
    generate.generate_sleep_edf(tmp_path / "again", seed=seed, subjects=subjects[:1])
    shipped, shipped_annotations, _ = read_night(SLEEP, sleep_recipe["subjects"][0])
    again, again_annotations, _ = read_night(tmp_path / "again", sleep_recipe["subjects"][0])
    assert list(again_annotations.description) == list(shipped_annotations.description)
    np.testing.assert_array_equal(again_annotations.duration, shipped_annotations.duration)
    for name in shipped:
        assert np.abs(again[name] - shipped[name]).max() < 1.0  # µV; robust to rounding anywhere upstream
        for low, high in ((0.5, 2), (4, 7), (8, 12), (11, 15)):
            powers = [band_power(x[name], low, high, FS) for x in (again, shipped)]
            np.testing.assert_allclose(*powers, rtol=0.01)


# ---------------------------------------------------------------- motor imagery


def read_trials(root: Path, run: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Imagery trials of one run number: (x (n_trials, 9, 560) [µV] 0.5–4 s after the cue, codes, subjects, names)."""
    x, codes, subjects = [], [], []
    for path in sorted(root.glob(f"S*/S*R{run:02d}.edf")):
        raw = mne.io.read_raw_edf(path, verbose="error")
        data, fs = raw.get_data() * 1e6, raw.info["sfreq"]
        for onset, code in zip(raw.annotations.onset, raw.annotations.description):
            if code != "T0":
                x.append(data[:, int((onset + 0.5) * fs) : int((onset + 4.0) * fs)])
                codes.append(code)
                subjects.append(path.parent.name)
    return np.array(x), np.array(codes), np.array(subjects), raw.ch_names


def baseline_accuracy(root: Path, run: int) -> float:
    """Log mu (8–13 Hz) and beta (15–25 Hz) power at every channel + logistic regression, leave-one-subject-out."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import LeaveOneGroupOut, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, codes, subjects, _ = read_trials(root, run)
    features = np.log(np.concatenate([band_power(x, 8, 13, 160), band_power(x, 15, 25, 160)], axis=1))
    model = make_pipeline(StandardScaler(), LogisticRegression())
    return float(cross_val_score(model, features, codes, groups=subjects, cv=LeaveOneGroupOut()).mean())


def test_imagery_layout_names_rate_and_annotations(imagery_recipe):
    assert len(imagery_recipe["subjects"]) == 8
    for s in imagery_recipe["subjects"]:
        assert s["runs"] == [4, 6]
        for run in s["runs"]:
            path = IMAGERY / f"S{s['subject']:03d}" / f"S{s['subject']:03d}R{run:02d}.edf"
            raw = mne.io.read_raw_edf(path, verbose="error")
            assert raw.ch_names == list(generate.MI_CHANNELS) == imagery_recipe["channels"]
            assert raw.info["sfreq"] == 160
            assert {signal.physical_dimension for signal in edfio.read_edf(path).signals} == {"uV"}
            a = raw.annotations
            assert list(a.description[::2]) == ["T0"] * 6 and sorted(a.description[1::2]) == ["T1"] * 3 + ["T2"] * 3
            np.testing.assert_allclose(a.duration, [4.2, 4.1] * 6)
            np.testing.assert_allclose(a.onset[1:], (a.onset + a.duration)[:-1], atol=1e-6)
            assert (a.onset + a.duration)[-1] <= raw.times[-1] + 1 / 160


def test_imagery_desynchronises_the_contralateral_mu_rhythm():
    x, codes, _, names = read_trials(IMAGERY, 4)
    mu = np.log(band_power(x, 8, 13, 160))
    c3, cz, c4 = names.index("C3.."), names.index("Cz.."), names.index("C4..")
    left, right = mu[codes == "T1"].mean(0), mu[codes == "T2"].mean(0)
    assert left[c4] < right[c4] - 0.15 and right[c3] < left[c3] - 0.15, (left, right)
    x, codes, _, names = read_trials(IMAGERY, 6)
    mu = np.log(band_power(x, 8, 13, 160))
    fists, feet = mu[codes == "T1"].mean(0), mu[codes == "T2"].mean(0)
    assert feet[cz] < fists[cz] - 0.15 and fists[c3] < feet[c3] - 0.15 and fists[c4] < feet[c4] - 0.15


def test_band_power_baseline_is_well_below_100_percent(tmp_path):
    """At the default difficulty, on 10 subjects × 20 left/right trials: 60–85 %; easier at difficulty 0."""
    generate.generate_motor_imagery(tmp_path / "default", subjects=10, runs=(4,), trials_per_run=20)
    generate.generate_motor_imagery(tmp_path / "easy", subjects=10, runs=(4,), trials_per_run=20, difficulty=0.0)
    default, easy = baseline_accuracy(tmp_path / "default", 4), baseline_accuracy(tmp_path / "easy", 4)
    assert 0.6 <= default <= 0.85, default
    assert easy > default + 0.05, (easy, default)
    # the shipped set (8 subjects × 6 trials per run): above chance, far from perfect
    for run in (4, 6):
        assert 0.55 <= baseline_accuracy(IMAGERY, run) <= 0.9


def test_imagery_generator_is_deterministic_and_shipped_run_regenerates(tmp_path, imagery_recipe):
    (recipe,) = motor_simulator.draw_motor_imagery_subjects(1, seed=3, runs=(4,), trials_per_run=2)
    for folder, seed in (("a", 3), ("b", 3), ("c", 4)):
        generate.generate_motor_imagery(tmp_path / folder, seed=seed, subjects=[recipe])
    a, b, c = ((tmp_path / d / "S001" / "S001R04.edf").read_bytes() for d in "abc")
    assert a == b and a != c

    seed, subjects = generate.motor_imagery_subjects_from_json(IMAGERY / "generator.json")
    assert subjects == motor_simulator.draw_motor_imagery_subjects(
        len(subjects), seed, difficulty=imagery_recipe["difficulty"]
    )
    generate.generate_motor_imagery(tmp_path / "again", seed=seed, subjects=subjects[:1])
    for run in (4, 6):
        shipped = mne.io.read_raw_edf(IMAGERY / "S001" / f"S001R{run:02d}.edf", verbose="error")
        again = mne.io.read_raw_edf(tmp_path / "again" / "S001" / f"S001R{run:02d}.edf", verbose="error")
        assert list(again.annotations.description) == list(shipped.annotations.description)
        np.testing.assert_allclose(again.annotations.onset, shipped.annotations.onset)
        x, y = again.get_data() * 1e6, shipped.get_data() * 1e6
        assert np.abs(x - y).max() < 1.0
        for low, high in ((8, 13), (15, 25)):
            np.testing.assert_allclose(band_power(x, low, high, 160), band_power(y, low, high, 160), rtol=0.01)


# ---------------------------------------------------------------- both


def test_existing_folder_and_bad_options_are_user_errors(tmp_path):
    (tmp_path / "exists").mkdir()
    with pytest.raises(UserError, match="already exists"):
        generate.generate_sleep_edf(tmp_path / "exists", subjects=1)
    with pytest.raises(UserError, match="already exists"):
        generate.generate_motor_imagery(tmp_path / "exists", subjects=1)
    with pytest.raises(UserError, match="difficulty"):
        motor_simulator.draw_motor_imagery_subjects(1, 0, difficulty=1.5)
    with pytest.raises(UserError, match="imagery runs"):
        motor_simulator.draw_motor_imagery_subjects(1, 0, runs=(3,))
    with pytest.raises(UserError, match="even"):
        motor_simulator.draw_motor_imagery_subjects(1, 0, trials_per_run=5)
    (recipe,) = sleep_simulator.draw_sleep_subjects(1, 0)
    with pytest.raises(UserError, match="hypnogram letters"):
        generate.generate_sleep_edf(tmp_path / "bad", subjects=[replace(recipe, hypnogram="WN2")])
    assert not (tmp_path / "bad").exists() and list(tmp_path.iterdir()) == [tmp_path / "exists"]


def test_embedded_sets_fit_in_5_mb():
    sizes = [p.stat().st_size for p in EMBEDDED.rglob("*") if p.is_file()]
    assert sum(sizes) <= 5_000_000, sum(sizes)

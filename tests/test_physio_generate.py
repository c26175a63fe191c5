"""The synthetic multi-site ECG (workbench.domains.physio.generate): WFDB layout read back by the beat reader,
the physiology of each beat type (P waves, QRS width, prematurity, compensatory pauses, heart rates), sites that
differ as the card says, determinism, and the shipped set."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

wfdb = pytest.importorskip("wfdb")
pytest.importorskip("neurokit2")

from workbench.domains.physio import generate, read_beat_folder  # noqa: E402

from workbench.core.errors import UserError  # noqa: E402

EMBEDDED = Path(generate.__file__).parent / "embedded"
SHORT = tuple(replace(site, duration_s=40.0) for site in generate.SITES)


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    return generate.generate_physio_sites(tmp_path_factory.mktemp("physio") / "sites", subjects_per_site=3, sites=SHORT)


def half_max_width_s(beat: np.ndarray, centre: int, fs: float) -> float:
    """Samples within ±0.15 s of the R peak where |beat − its median| exceeds half its maximum [s]."""
    around = np.abs(beat - np.median(beat))[centre - round(0.15 * fs) : centre + round(0.15 * fs)]
    return float((around > 0.5 * around.max()).sum() / fs)


def test_sites_are_wfdb_records_at_their_rates_with_the_recorded_beats(sites):
    recipe = json.loads((sites / "generator.json").read_text())
    for site in SHORT:
        beats = read_beat_folder(sites / f"site-{site.name}")
        assert beats.fs_hz == site.fs_hz
        header = wfdb.rdheader(str(sites / f"site-{site.name}" / f"{site.name}01"))
        assert header.fmt == ["212"] and header.sig_name == ["MLII"] and f"subject: {site.name}01" in header.comments
        written = [s for s in recipe["subjects"] if s["site"] == site.name]
        assert sorted(set(beats.subjects)) == [s["subject"] for s in written]  # every beat carries its subject
        expected = {k: sum(s["beats"][k] for s in written) for k in ("N", "S", "V", "F")}
        assert beats.class_counts() == {**expected, "Q": 0}


def test_beat_types_have_their_morphology():
    (subject,) = generate.draw_subjects(generate.SITES[0], 1, seed=1)
    fs = 360.0
    templates = generate.beat_templates(subject, fs, seed=1)
    r = round(generate.TEMPLATE_BEFORE_S * fs)
    p_wave = slice(r - round(0.25 * fs), r - round(0.1 * fs))
    assert templates["N"][p_wave].max() > 0.1  # an upright P wave before the normal QRS
    assert templates["S"][p_wave].min() < -0.03 and templates["S"][p_wave].max() < 0.05  # ectopic, inverted P
    assert np.abs(templates["V"][p_wave]).max() < 0.05  # no P before a ventricular beat
    assert half_max_width_s(templates["V"], r, fs) > 1.8 * half_max_width_s(templates["N"], r, fs)  # wide QRS
    t_wave = slice(r + round(0.2 * fs), r + round(0.4 * fs))
    assert templates["N"][t_wave].max() > 0.2 and templates["V"][t_wave].min() < -0.2  # discordant T after V
    np.testing.assert_allclose(templates["F"], 0.5 * (templates["N"] + templates["V"]))
    assert templates["N"][r] == pytest.approx(subject.r_mv)


def test_rhythm_heart_rate_prematurity_and_compensatory_pauses(sites):
    recipe = {s["subject"]: s for s in json.loads((sites / "generator.json").read_text())["subjects"]}
    premature, pauses = [], []
    for site in SHORT:
        for path in sorted((sites / f"site-{site.name}").glob("*.atr")):
            annotation = wfdb.rdann(str(path.with_suffix("")), "atr")
            rr = np.diff(annotation.sample) / site.fs_hz
            symbols = annotation.symbol[1:]
            normal = np.array([a == "N" and b == "N" for a, b in zip(annotation.symbol[:-1], symbols)])
            rate = 60 / np.median(rr[normal])
            assert rate == pytest.approx(recipe[path.stem]["heart_rate_bpm"], rel=0.12)
            median = np.median(rr[normal])
            for k, symbol in enumerate(symbols):
                if symbol in ("A", "V"):
                    premature.append(rr[k] / median)
                if symbol == "V" and k + 1 < len(rr) and symbols[k + 1] == "N":
                    pauses.append((rr[k] + rr[k + 1]) / (2 * median))
    assert premature and max(premature) < 0.9  # S and V beats come early
    assert pauses and abs(np.median(pauses) - 1) < 0.1  # a V beat is followed by a full compensatory pause


def test_sites_differ_in_noise_and_rate(sites):
    def noise_mv(site) -> float:
        signal = wfdb.rdrecord(str(sites / f"site-{site.name}" / f"{site.name}01")).p_signal[:, 0]
        return float(np.std(np.diff(signal)) / np.sqrt(2))  # white noise dominates sample-to-sample steps

    quiet, noisy = SHORT[2], SHORT[3]  # site C (0.015 mV) and D (0.08 mV)
    assert noise_mv(noisy) > 2.5 * noise_mv(quiet)
    assert len({site.fs_hz for site in SHORT}) == 3


def test_generation_is_deterministic_and_the_shipped_set_regenerates(tmp_path):
    site = replace(generate.SITES[1], duration_s=10.0)
    for folder, seed in (("a", 3), ("b", 3), ("c", 4)):
        generate.generate_physio_sites(tmp_path / folder, seed=seed, subjects_per_site=1, sites=[site])
    a, b, c = ((tmp_path / d / "site-B" / "B01.dat").read_bytes() for d in "abc")
    assert a == b and a != c

    seed, sites = generate.sites_from_json(EMBEDDED / "generator.json")
    assert tuple(sites) == generate.SITES
    generate.generate_physio_sites(tmp_path / "again", seed=seed, subjects_per_site=1, sites=sites[:1])
    for suffix in (".dat", ".atr"):
        assert (tmp_path / "again" / "site-A" / f"A01{suffix}").read_bytes() == (
            EMBEDDED / "site-A" / f"A01{suffix}"
        ).read_bytes()
    assert sum(p.stat().st_size for p in EMBEDDED.rglob("*") if p.is_file()) <= 2_000_000


def test_bad_options_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="subjects_per_site"):
        generate.generate_physio_sites(tmp_path / "x", subjects_per_site=0)
    (tmp_path / "exists").mkdir()
    with pytest.raises(UserError, match="already exists"):
        generate.generate_physio_sites(tmp_path / "exists", subjects_per_site=1)

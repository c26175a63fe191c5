"""The procedural ECG sites (card ``physio-procedural``): every labelled pair holds all four classes, parameters stay
in the card's ranges, the targets lie off the bank's grid, and the shipped target records are the generator's."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

pytest.importorskip("wfdb")
pytest.importorskip("neurokit2")

from workbench.domains.physio import procedural  # noqa: E402
from workbench.domains.physio.beats import read_beat_folder  # noqa: E402
from workbench.domains.physio.task import AFTER_S, BEFORE_S, CLASSES  # noqa: E402

from workbench.core.datacard import load_card  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402

SHIPPED = procedural.TARGETS


def test_every_pair_of_a_target_sites_patients_holds_all_four_classes_with_at_least_4_F_beats():
    sites = sorted(SHIPPED.glob("site-*"))
    assert [s.name for s in sites] == ["site-T1", "site-T2", "site-T3", "site-T4"]
    for folder in sites:
        beats = read_beat_folder(folder, before_s=BEFORE_S, after_s=AFTER_S)  # the task's windows
        patients = sorted(set(beats.subjects.tolist()))
        assert len(patients) == procedural.TARGET_PATIENTS
        for pair in itertools.combinations(patients, 2):
            counts = np.bincount(beats.labels[np.isin(beats.subjects, pair)], minlength=len(CLASSES))
            assert counts[: len(CLASSES)].min() >= 4, (folder.name, pair, counts)
            assert counts[CLASSES.index("F")] >= 4


def test_site_and_patient_parameters_lie_in_the_data_cards_ranges():
    card = load_card("physio-procedural").content
    assert {k: tuple(v) for k, v in card["parameter_ranges"].items()} == procedural.RANGES
    assert {k: tuple(v) for k, v in card["grid"].items()} == procedural.GRID
    shipped = json.loads((SHIPPED / "generator.json").read_text())
    grid = procedural.grid_sites()
    drawn = [s["params"] for s in shipped["sites"]] + [p["params"] for p in shipped["patients"]]
    drawn += [s.params for s in grid] + [p.params for s in grid[:6] for p in procedural.draw_patients(s, 4)]
    for params in drawn:
        for key, (low, high) in card["parameter_ranges"].items():
            assert low <= params[key] <= high, (key, params[key])
    rates = {s["fs_hz"] for s in shipped["sites"]} | {s.fs_hz for s in grid}
    assert rates <= set(card["sampling_rates_hz"])


def test_the_targets_lie_off_the_grid_and_the_grid_holds_every_combination():
    grid = procedural.grid_sites()
    keys = list(procedural.GRID)
    points = {tuple(s.params[k] for k in keys) for s in grid}
    assert points == set(itertools.product(*procedural.GRID.values())) and len(grid) == 36
    assert not any(procedural.is_off_grid(s.params) for s in grid)
    targets = procedural.target_sites()
    assert len(targets) >= 4
    for target in targets:
        assert procedural.is_off_grid(target.params)
        assert tuple(target.params[k] for k in keys) not in points
        assert all(target.params != s.params for s in grid)


def test_the_shipped_target_records_are_what_the_generator_writes(tmp_path):
    site = procedural.target_sites()[0]
    out = procedural.generate_procedural_sites(tmp_path / "again", [site], 2)
    for record in ("T101", "T102"):
        for suffix in (".dat", ".atr"):
            shipped = (SHIPPED / "site-T1" / f"{record}{suffix}").read_bytes()
            assert (out / "site-T1" / f"{record}{suffix}").read_bytes() == shipped, record + suffix


def test_a_beat_sequence_is_redrawn_until_it_holds_the_minimum_ectopic_beats_and_a_too_short_record_is_refused():
    site = procedural.grid_sites()[0]
    short = procedural.ProceduralSite("X", 250.0, {**site.params, "rate_f": 0.025, "rate_s": 0.03}, duration_s=40.0)
    patient = procedural.draw_patients(short, 1)[0]
    _, _, kinds, attempts = procedural.simulate_patient(short, patient)
    assert attempts > 0 and all(kinds.count(k) >= procedural.MIN_ECTOPIC for k in "SVF")
    with pytest.raises(UserError, match="no 3-s record with 3 beats of each of S, V, F"):
        procedural.simulate_patient(procedural.ProceduralSite("Y", 250.0, site.params, duration_s=3.0), patient)

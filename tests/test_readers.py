"""Readers: rMD17 units and splits as published, extended XYZ, and what a bad file gets told."""

from __future__ import annotations

import ase.io
import numpy as np
import pytest
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from conftest import small_mace, write_rmd17_layout
from workbench.domains.atomistic.readers import BadFrames, read_ase, read_ase_set, read_rmd17
from workbench.domains.atomistic.task import Rmd17
from workbench.domains.atomistic.units import EV_PER_KCAL_PER_MOL

from workbench.core.errors import UserError


def test_kcal_per_mol_constant():
    assert EV_PER_KCAL_PER_MOL == pytest.approx(0.0433641, rel=1e-6)  # 4184 J / (N_A · e)


def test_rmd17_units_converted_to_ev(tiny_rmd17):
    with np.load(tiny_rmd17 / "npz_data" / "rmd17_ethanol.npz") as raw:
        energies_kcal, forces_kcal, coords = raw["energies"], raw["forces"], raw["coords"]
    data = read_rmd17(tiny_rmd17, "ethanol")
    assert len(data.frames) == 60
    frame = data.frames[7]
    assert frame.energy_ev == pytest.approx(energies_kcal[7] * 0.0433641, rel=1e-6)
    np.testing.assert_allclose(frame.forces_ev_per_a, forces_kcal[7] * 0.0433641, rtol=1e-6)
    np.testing.assert_array_equal(frame.positions_a, coords[7])  # Å stays Å


def test_folder_npz_data_or_file_all_work(tiny_rmd17):
    for path in (tiny_rmd17, tiny_rmd17 / "npz_data", tiny_rmd17 / "npz_data" / "rmd17_ethanol.npz"):
        assert len(read_rmd17(path, "ethanol").frames) == 60
    with pytest.raises(UserError, match="--molecule"):
        read_rmd17(tiny_rmd17, "aspirin")


def test_split_files_honoured(tiny_rmd17):
    train = np.array([3, 5, 8, 13, 21, 34, 2, 9, 11, 17, 19, 23, 29, 31])
    test = np.array([40, 41, 44, 50, 59])
    np.savetxt(tiny_rmd17 / "splits" / "index_train_01.csv", train, fmt="%d")
    np.savetxt(tiny_rmd17 / "splits" / "index_test_01.csv", test, fmt="%d")
    raw = read_rmd17(tiny_rmd17, "ethanol")
    np.testing.assert_array_equal(raw.train_indices, train)
    np.testing.assert_array_equal(raw.test_indices, test)
    data, _ = Rmd17().prepare(small_mace(), raw, train_size=8, val_size=4, seed=0)
    allowed = {tuple(raw.frames[i].positions_a.ravel()[:3]) for i in train}
    for graph in [*data.train, *data.val]:
        assert tuple(graph.positions.numpy().ravel()[:3]) in allowed
    test_positions = [tuple(raw.frames[i].positions_a.ravel()[:3]) for i in test]
    assert [tuple(g.positions.numpy().ravel()[:3]) for g in data.test] == test_positions


def test_bad_splits(tiny_rmd17):
    np.savetxt(tiny_rmd17 / "splits" / "index_test_01.csv", [1, 2, 99], fmt="%d")
    with pytest.raises(UserError, match=r"index_test_01.csv.*indices in \[0, 60\)"):
        read_rmd17(tiny_rmd17, "ethanol")
    np.savetxt(tiny_rmd17 / "splits" / "index_test_01.csv", [1, 2], fmt="%d")
    with pytest.raises(UserError, match="disjoint"):
        read_rmd17(tiny_rmd17, "ethanol")
    (tiny_rmd17 / "splits" / "index_test_01.csv").unlink()
    with pytest.raises(UserError, match="split file missing"):
        read_rmd17(tiny_rmd17, "ethanol")


@pytest.mark.parametrize(
    "replace, field, expected",
    [
        ({"forces": None}, "forces", "a field 'forces'"),
        ({"coords": np.zeros((60, 8, 3))}, "coords", "n_atoms = 9"),
        ({"energies": np.arange(60)}, "energies", "dtype float"),
    ],
)
def test_bad_npz_fields(tmp_path, replace, field, expected):
    root = write_rmd17_layout(tmp_path / "bad", **replace)
    with pytest.raises(UserError, match=rf"rmd17_ethanol.npz: field '{field}': expected .*{expected}"):
        read_rmd17(root, "ethanol")


def _atoms(energy=-5.0, calculator=False):
    atoms = Atoms("OH2", positions=[[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]])
    forces = np.arange(9, dtype=float).reshape(3, 3) / 10
    if calculator:
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
    else:
        if energy is not None:
            atoms.info["REF_energy"] = energy
        atoms.arrays["REF_forces"] = forces
    return atoms


def test_extxyz_mace_keys_and_calculator(tmp_path):
    ase.io.write(tmp_path / "ref.xyz", [_atoms(-5.0), _atoms(-6.0)], format="extxyz")
    frames, notes = read_ase(tmp_path / "ref.xyz")
    assert [f.energy_ev for f in frames] == [-5.0, -6.0]
    assert "energy from info 'REF_energy', forces from arrays 'REF_forces'" in notes[0]
    np.testing.assert_allclose(frames[1].forces_ev_per_a, np.arange(9).reshape(3, 3) / 10)
    ase.io.write(tmp_path / "calc.xyz", [_atoms(-7.0, calculator=True)], format="extxyz")
    frames, notes = read_ase(tmp_path / "calc.xyz")
    assert frames[0].energy_ev == -7.0 and "calculator results 'energy'" in notes[0]


def test_a_frame_without_energy_is_a_bad_record(tmp_path):
    ase.io.write(tmp_path / "ref.xyz", [_atoms(-5.0), _atoms(None)], format="extxyz")
    with pytest.raises(UserError, match=r"ref.xyz \[frame 1\]: no energy 'energy'"):
        read_ase(tmp_path / "ref.xyz")
    bad = BadFrames(policy="skip")
    frames, _ = read_ase(tmp_path / "ref.xyz", bad=bad)
    assert len(frames) == 1 and bad.report.records == [f"{tmp_path / 'ref.xyz'} [frame 1]"] and bad.report.seen == 2


def test_a_frame_with_nan_energy_is_a_bad_record(tmp_path):
    energies = np.load(write_rmd17_layout(tmp_path / "ok") / "npz_data" / "rmd17_ethanol.npz")["energies"].copy()
    energies[3] = np.nan
    root = write_rmd17_layout(tmp_path / "bad", energies=energies)
    with pytest.raises(UserError, match=r"rmd17_ethanol.npz \[frame 3\]: field 'energies': expected a finite energy"):
        read_rmd17(root, "ethanol")
    bad = BadFrames(policy="skip")
    data = read_rmd17(root, "ethanol", bad=bad)
    assert len(data.frames) == 59 and len(bad.report) == 1 and bad.report.seen == 60
    assert len(data.train_indices) == 39 and len(data.test_indices) == 20  # frame 3 left the training split


def test_extxyz_set_splits(tmp_path):
    ase.io.write(tmp_path / "all.xyz", [_atoms(-float(i)) for i in range(10)], format="extxyz")
    data = read_ase_set(tmp_path / "all.xyz", seed=1)
    assert sorted([*data.train_indices, *data.test_indices]) == list(range(10))
    (tmp_path / "folder").mkdir()
    ase.io.write(tmp_path / "folder" / "train.xyz", [_atoms(-1.0)] * 3, format="extxyz")
    ase.io.write(tmp_path / "folder" / "test.xyz", [_atoms(-2.0)] * 2, format="extxyz")
    data = read_ase_set(tmp_path / "folder")
    assert list(data.test_indices) == [3, 4]

"""Tests of the atomistic data generator (GFN2-xTB MD, xTB and DFT labels, rMD17 and extxyz writers).

Every number comes from tblite or pyscf on a water molecule; the whole file runs in well under a minute.
"""

import ase.io
import numpy as np
import pytest
from ase import Atoms
from ase.build import molecule
from threadpoolctl import threadpool_limits
from workbench.domains.atomistic import generate
from workbench.domains.atomistic.units import EV_PER_KCAL_PER_MOL

#: Central finite-difference step [Å]. Truncation error h²/6·|∂³E| is ~1e-5 eV/Å for water.
STEP_A = 1e-3


@pytest.fixture(scope="module")
def water() -> Atoms:
    """Water, displaced off its symmetric g2 geometry so that every force component is non-zero."""
    atoms = molecule("H2O")
    atoms.positions += [[0.02, -0.03, 0.01], [0.05, 0.0, -0.04], [-0.03, 0.02, 0.06]]
    return atoms


@pytest.fixture(scope="module")
def water_frames() -> list[Atoms]:
    return generate.sample_md_frames(molecule("H2O"), 2, 500.0, equilibration_fs=5.0, interval_fs=5.0, seed=7)


def minus_central_difference(label, atoms: Atoms, components) -> tuple[np.ndarray, np.ndarray]:
    """Forces of ``label`` at ``atoms`` and minus the central difference of its energies, per component."""
    frames = [atoms.copy()]
    for atom, axis in components:
        for sign in (1.0, -1.0):
            displaced = atoms.copy()
            displaced.positions[atom, axis] += sign * STEP_A
            frames.append(displaced)
    energies_ev, forces_ev_per_a = label(frames)
    analytic = np.array([forces_ev_per_a[0, atom, axis] for atom, axis in components])
    numeric = -(energies_ev[1::2] - energies_ev[2::2]) / (2 * STEP_A)
    return analytic, numeric


def test_build_molecule_from_g2_and_from_smiles():
    ethanol = generate.build_molecule("ethanol")
    assert ethanol.get_chemical_formula() == "C2H6O"
    np.testing.assert_array_equal(ethanol.positions, molecule("CH3CH2OH").positions)
    assert generate.build_molecule("CH3CH2OH").get_chemical_formula() == "C2H6O"

    malonaldehyde = generate.build_molecule("malonaldehyde")
    assert malonaldehyde.get_chemical_formula() == "C3H4O2"
    distances = malonaldehyde.get_all_distances()[np.triu_indices(len(malonaldehyde), 1)]
    assert 0.9 < distances.min() < 1.2  # an embedded structure: O-H / C-H bonds, no overlapping atoms


def test_build_molecule_unknown_name_lists_accepted_names():
    with pytest.raises(ValueError, match="malonaldehyde.*CH3CH2OH"):
        generate.build_molecule("unobtainium")


def test_default_corpus_molecules_are_closed_shell_hcno():
    names = generate.default_corpus_molecules()
    assert len(names) == 58 and "CH3CH2OH" in names and "H2O" in names
    assert not {"OH", "CH3", "CO", "NO2", "CH2_s3B1d"} & set(names)  # radicals, triplets, diatomics


def test_sample_md_frames_is_deterministic_for_a_seed(water_frames):
    again = generate.sample_md_frames(molecule("H2O"), 2, 500.0, equilibration_fs=5.0, interval_fs=5.0, seed=7)
    other = generate.sample_md_frames(molecule("H2O"), 2, 500.0, equilibration_fs=5.0, interval_fs=5.0, seed=8)
    assert len(water_frames) == 2
    for frame, same, different in zip(water_frames, again, other):
        np.testing.assert_array_equal(frame.positions, same.positions)
        assert not np.allclose(frame.positions, different.positions)
        assert frame.calc is None and "momenta" not in frame.arrays
    assert not np.allclose(water_frames[0].positions, water_frames[1].positions)


def test_xtb_forces_are_minus_the_energy_gradient(water):
    # Tolerance 1e-3 eV/Å: h² truncation ~1e-5 eV/Å; tblite's SCF convergence noise divided by 2h is
    # a few 1e-5 eV/Å (measured max 5e-5). A sign or unit error would be off by ~1 eV/Å.
    components = [(atom, axis) for atom in range(3) for axis in range(3)]
    analytic, numeric = minus_central_difference(generate.label_xtb, water, components)
    np.testing.assert_allclose(analytic, numeric, atol=1e-3)
    assert np.abs(analytic).max() > 0.1


def test_dft_forces_are_minus_the_energy_gradient(water):
    # Tolerance 2e-3 eV/Å: pyscf's analytic gradient leaves out the integration-grid response (measured
    # 1.5e-4 eV/Å here); conv_tol 1e-9 Hartree adds at most 1.4e-5 eV/Å; h² truncation ~1e-5 eV/Å.
    components = [(0, 0), (1, 1), (2, 2)]
    with threadpool_limits(limits=1, user_api="openmp"):  # water is too small for threads to pay off
        analytic, numeric = minus_central_difference(generate.label_dft, water, components)
    np.testing.assert_allclose(analytic, numeric, atol=2e-3)
    assert np.abs(analytic).max() > 0.1


def test_label_rejects_open_shell_and_mixed_frames(water):
    with pytest.raises(ValueError, match="odd number of electrons"):
        generate.label_dft([Atoms("OH", positions=[[0, 0, 0], [0, 0, 0.97]])])
    with pytest.raises(ValueError, match="one molecule at a time"):
        generate.label_xtb([water, molecule("NH3")])


def test_write_rmd17_round_trip(tmp_path, water_frames):
    energies_ev, forces_ev_per_a = generate.label_xtb(water_frames)
    coords_a = np.stack([frame.positions for frame in water_frames])
    path = generate.write_rmd17(tmp_path, "water", water_frames[0].numbers, coords_a, energies_ev, forces_ev_per_a)

    assert path == tmp_path / "npz_data" / "rmd17_water.npz"
    assert [p.name for p in path.parent.iterdir()] == ["rmd17_water.npz"]  # no temporary file left
    with np.load(path) as data:
        assert sorted(data.files) == ["coords", "energies", "forces", "nuclear_charges"]
        assert data["nuclear_charges"].dtype == np.int64
        assert all(data[key].dtype == np.float64 for key in ("coords", "energies", "forces"))
        np.testing.assert_array_equal(data["nuclear_charges"], [8, 1, 1])
        np.testing.assert_array_equal(data["coords"], coords_a)
        np.testing.assert_allclose(data["energies"], energies_ev / EV_PER_KCAL_PER_MOL, rtol=1e-15)
        np.testing.assert_allclose(data["forces"], forces_ev_per_a / EV_PER_KCAL_PER_MOL, rtol=1e-15)
        assert -3200 < data["energies"].mean() < -3100  # GFN2-xTB water ~ -137.9 eV ~ -3180 kcal/mol

    with pytest.raises(ValueError, match="forces_ev_per_a has shape"):
        generate.write_rmd17(tmp_path, "water", [8, 1, 1], coords_a, energies_ev, forces_ev_per_a[:, :2])


def test_splits_are_disjoint_sorted_and_cover_all_frames(tmp_path):
    train_path, test_path = generate.write_rmd17_splits(tmp_path, n_frames=50, n_train=20, seed=3)
    assert (train_path.name, test_path.name) == ("index_train_01.csv", "index_test_01.csv")
    train = np.loadtxt(train_path, dtype=int)
    test = np.loadtxt(test_path, dtype=int)
    assert len(train) == 20 and len(test) == 30
    assert not set(train) & set(test)
    assert sorted(set(train) | set(test)) == list(range(50))
    assert (np.diff(train) > 0).all() and (np.diff(test) > 0).all()
    assert not np.array_equal(train, np.arange(20))  # shuffled, not the first frames

    again, _ = generate.write_rmd17_splits(tmp_path / "again", n_frames=50, n_train=20, seed=3)
    assert again.read_text() == train_path.read_text()
    with pytest.raises(ValueError, match="n_train"):
        generate.write_rmd17_splits(tmp_path, n_frames=10, n_train=10, seed=3)


def test_generate_rmd17_at_xtb_level(tmp_path):
    (path,) = generate.generate_rmd17(tmp_path, ["H2O"], 4, level="xtb", progress=False)
    with np.load(path) as data:
        assert data["coords"].shape == (4, 3, 3) and data["forces"].shape == (4, 3, 3)
    assert len(np.loadtxt(tmp_path / "splits" / "index_train_01.csv", dtype=int)) == 2
    with pytest.raises(ValueError, match="level"):
        generate.generate_rmd17(tmp_path, ["H2O"], 4, level="ccsd")
    with pytest.raises(ValueError, match="n_train"):  # checked before any MD runs
        generate.generate_rmd17(tmp_path, ["H2O"], 4, level="xtb", n_train=4)


def test_foundation_corpus_reads_back_with_isolated_atoms(tmp_path):
    path = generate.generate_foundation_corpus(
        tmp_path / "corpus.extxyz",
        ["H2O"],
        frames_per_molecule=2,
        temperatures_k=(300.0, 500.0),
        equilibration_fs=5.0,
        interval_fs=5.0,
        progress=False,
    )
    frames = ase.io.read(path, ":")
    md = [frame for frame in frames if frame.info["config_type"] == "g2_xtb_md"]
    atoms = {frame.get_chemical_formula(): frame for frame in frames if frame.info["config_type"] == "IsolatedAtom"}

    assert len(md) == 2 and sorted(atoms) == ["C", "H", "N", "O"]
    assert [frame.info["temperature_k"] for frame in md] == [300.0, 500.0]
    for frame in md:
        assert frame.info["molecule"] == "H2O" and frame.calc is None
        assert frame.arrays["REF_forces"].shape == (3, 3)
        energy_ev, forces_ev_per_a = generate.label_xtb([frame])
        np.testing.assert_allclose(frame.info["REF_energy"], energy_ev[0], atol=1e-6)
        np.testing.assert_allclose(frame.arrays["REF_forces"], forces_ev_per_a[0], atol=1e-6)
    # A bound molecule lies below its free atoms.
    assert md[0].info["REF_energy"] < atoms["O"].info["REF_energy"] + 2 * atoms["H"].info["REF_energy"]
    np.testing.assert_allclose(atoms["N"].arrays["REF_forces"], 0.0, atol=1e-12)


def test_isolated_hydrogen_dft_energy_is_near_the_exact_one():
    """PBE/def2-SVP's H atom lies within 0.5 % of the exact −0.5 Hartree (−13.606 eV)."""
    energies = generate.isolated_atom_energies_dft(["H"])
    assert energies["H"] == pytest.approx(-0.5 * 27.211386, rel=5e-3)

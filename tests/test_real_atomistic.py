"""The rmd17 task on real published files (tests/data/real/atomistic, see its README): MD17 ethanol as an sGDML npz,
schnetpack's MD17 ethanol ase database, and MD17 ethanol frames as extended XYZ; all in kcal/mol."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mace")
import ase.io  # noqa: E402
from ase.calculators.singlepoint import SinglePointCalculator  # noqa: E402
from workbench.domains.atomistic.readers import BadFrames, read_ase, read_sgdml  # noqa: E402
from workbench.domains.atomistic.units import EV_PER_KCAL_PER_MOL  # noqa: E402

from workbench.cli import main, run  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402

REAL = Path(__file__).parent / "data" / "real" / "atomistic"
NPZ = REAL / "md17_ethanol_first300.npz"
DB = REAL / "test_ethanol.db"
XYZ = REAL / "ethanol_sampledata_first60.xyz"


def _exit_code(argv) -> int:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code


@pytest.mark.parametrize("path, options", [(NPZ, []), (DB, ["--units", "kcal/mol"]), (XYZ, ["--units", "kcal/mol"])])
def test_data_check_ok_on_real_files(path, options, capsys):
    assert run(["data", "check", "rmd17", "--data", str(path), *options]) == 0
    out = capsys.readouterr().out
    assert f"ok: {path}" in out and "atoms per frame: 9" in out
    assert "energy unit kcal/mol" in out


def test_sgdml_npz_read_in_kcal_per_mol():
    data = read_sgdml(NPZ)
    with np.load(NPZ) as raw:
        np.testing.assert_allclose(data.frames[7].energy_ev, raw["E"][7, 0] * EV_PER_KCAL_PER_MOL)
        np.testing.assert_allclose(data.frames[7].forces_ev_per_a, raw["F"][7] * EV_PER_KCAL_PER_MOL)
        np.testing.assert_array_equal(data.frames[7].positions_a, raw["R"][7])
    assert len(data.train_indices) + len(data.test_indices) == 300 - 20  # in time blocks: a 20-frame purge


def test_sgdml_units_and_metadata_from_the_file(tmp_path):
    """sGDML's metadata fields and ``e_unit`` / ``r_unit`` are read (the real frames with the fields added)."""
    with np.load(NPZ) as raw:
        arrays = dict(raw)
    bohr = 0.52917721067
    arrays.update(R=arrays["R"] / bohr, F=arrays["F"] * bohr, e_unit=np.array("kcal/mol"), r_unit=np.array("bohr"),
                  name=np.array("ethanol"), theory=np.array("PBE+TS"), type=np.array("d"), md5=np.array("x"))  # fmt: skip
    np.savez(tmp_path / "md17_ethanol.npz", **arrays)
    data = read_sgdml(tmp_path / "md17_ethanol.npz")
    reference = read_sgdml(NPZ)
    np.testing.assert_allclose(data.frames[0].positions_a, reference.frames[0].positions_a, rtol=1e-6)
    np.testing.assert_allclose(data.frames[0].forces_ev_per_a, reference.frames[0].forces_ev_per_a, rtol=1e-6)
    assert "name 'ethanol', theory 'PBE+TS'" in data.notes[0] and "from the file's field 'e_unit'" in data.notes[1]


def test_units_check_refuses_mis_scaled_energies(tmp_path, capsys):
    """Energies converted to eV while the forces stay in kcal/mol/Å: the energy-force check names field 'E'."""
    with np.load(NPZ) as raw:
        arrays = dict(raw)
    arrays["E"] = arrays["E"] * EV_PER_KCAL_PER_MOL
    np.savez(tmp_path / "mixed.npz", **arrays)
    assert _exit_code(["data", "check", "rmd17", "--data", str(tmp_path / "mixed.npz")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"mixed.npz: field 'E': energy changes between neighbouring frames are 0\.04\d+ times", err)
    assert "the energies look like eV" in err


def test_units_check_refuses_a_wrong_unit_and_says_which_it_looks_like(tmp_path, capsys):
    with np.load(NPZ) as raw:
        arrays = dict(raw, e_unit=np.array("eV"))  # a file that claims eV but holds kcal/mol
    np.savez(tmp_path / "claims_ev.npz", **arrays)
    assert _exit_code(["data", "check", "rmd17", "--data", str(tmp_path / "claims_ev.npz")]) == 2
    err = capsys.readouterr().err
    assert "claims_ev.npz: field 'F': forces read in eV/Å (from the file's field 'e_unit')" in err
    assert "look like kcal/mol/Å: give --units kcal/mol" in err
    assert run(["data", "check", "rmd17", "--data", str(tmp_path / "claims_ev.npz"), "--units", "kcal/mol"]) == 0
    # schnetpack's database states no unit: read as ase's eV, refused, naming the unit the numbers look like
    assert _exit_code(["data", "check", "rmd17", "--data", str(DB)]) == 2
    assert "test_ethanol.db: field 'forces'" in capsys.readouterr().err


def _xyz_with_a_frame_without_energy(tmp_path) -> Path:
    frames = ase.io.read(XYZ, index=":")
    del frames[5].calc.results["energy"]
    path = tmp_path / "one_bad.xyz"
    ase.io.write(path, frames, format="extxyz")
    return path


def test_bad_frame_in_extxyz_skipped_and_counted(tmp_path, capsys):
    path = _xyz_with_a_frame_without_energy(tmp_path)
    assert run(["data", "check", "rmd17", "--data", str(path), "--units", "kcal/mol"]) == 1
    out = capsys.readouterr().out
    assert f"{path} [frame 5]: no energy 'energy'" in out
    assert "not ok: 1 of 60 record(s) skipped" in out


def test_bad_frame_with_raise_stops_before_the_run_directory(tmp_path, capsys):
    path, out = _xyz_with_a_frame_without_energy(tmp_path), tmp_path / "run"
    argv = ["adapt", "--domain", "rmd17", "--data", str(path), "--units", "kcal/mol", "--on-bad-record", "raise",
            "--epochs", "1", "--train-size", "4", "--batch-size", "2", "--baselines", "", "--out", str(out), "--quiet"]  # fmt: skip
    assert _exit_code(argv) == 2
    assert "[frame 5]: no energy 'energy'" in capsys.readouterr().err
    assert not out.exists()


def test_db_and_traj_with_named_keys(tmp_path):
    """Labels under the user's names: an ase .db with key-value/data labels and a .traj with calculator results,
    written with ase from the real extxyz frames."""
    import ase.db

    frames = ase.io.read(XYZ, index=":8")
    with ase.db.connect(tmp_path / "named.db") as database:
        for atoms in frames:
            plain = atoms.copy()
            database.write(plain, key_value_pairs={"dft_energy": atoms.get_potential_energy()},
                           data={"dft_forces": atoms.get_forces()})  # fmt: skip
    bad = BadFrames(policy="skip")
    with pytest.raises(UserError, match="no frame with an energy and forces .* name the labels with --energy-key"):
        read_ase(tmp_path / "named.db", units="kcal/mol", bad=bad)
    assert bad.report.seen == 8 and len(bad.report) == 8
    with pytest.raises(UserError, match=r"named.db \[frame 0\]: no energy 'energy' and no forces 'forces'"):
        read_ase(tmp_path / "named.db", units="kcal/mol")
    read, notes = read_ase(tmp_path / "named.db", energy_key="dft_energy", forces_key="dft_forces", units="kcal/mol")
    assert "energy from row key-value pairs 'dft_energy', forces from row data 'dft_forces' (8 frames)" in notes[0]
    np.testing.assert_allclose(read[3].energy_ev, frames[3].get_potential_energy() * EV_PER_KCAL_PER_MOL)
    for atoms in frames:
        atoms.calc = SinglePointCalculator(atoms, energy=atoms.get_potential_energy(), forces=atoms.get_forces())
    ase.io.write(tmp_path / "frames.traj", frames)
    read, notes = read_ase(tmp_path / "frames.traj", units="kcal/mol")
    np.testing.assert_allclose(read[3].forces_ev_per_a, frames[3].get_forces() * EV_PER_KCAL_PER_MOL)
    assert "calculator results 'energy'" in notes[0]


def test_short_adapt_and_evaluate_on_the_real_sgdml_npz(tmp_path, capsys):
    out = tmp_path / "run"
    run(["adapt", "--domain", "rmd17", "--data", str(NPZ), "--epochs", "1", "--train-size", "8", "--val-size", "4",
         "--batch-size", "4", "--baselines", "", "--out", str(out), "--quiet"])  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["skipped_records"] == {"skipped": 0, "seen": 300, "records": []}
    assert metrics["data_summary"]["frames"] == {"train": 8, "val": 4, "test": 150}
    capsys.readouterr()
    assert run(["evaluate", "--run", str(out), "--data", str(NPZ), "--out", str(tmp_path / "evaluations")]) == 0
    printed = capsys.readouterr().out
    assert "forces_mae_mev_per_a" in printed
    evaluation = json.loads((tmp_path / "evaluations" / f"{out.name}-{NPZ.stem}.json").read_text())  # outside the run
    assert evaluation["test_samples"] == 150 and evaluation["metrics"]["forces_mae_mev_per_a"] > 0


@pytest.mark.slow
def test_default_method_at_default_settings_on_the_real_sgdml_npz(tmp_path):
    """``workbench adapt --domain rmd17 --data <real MD17 npz>``: ELoRA and the default baselines, default settings."""
    out = tmp_path / "run"
    run(["adapt", "--domain", "rmd17", "--data", str(NPZ), "--out", str(out), "--quiet"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["skipped_records"]["seen"] == 300
    assert metrics["method"] == "elora"


def test_an_npz_of_neither_layout_is_refused_naming_both(tmp_path, capsys):
    np.savez(tmp_path / "other.npz", positions=np.zeros((2, 3, 3)), energy=np.zeros(2))
    assert _exit_code(["data", "check", "rmd17", "--data", str(tmp_path / "other.npz")]) == 2
    err = capsys.readouterr().err
    assert "other.npz: fields ['energy', 'positions'] are neither rMD17's" in err and "sGDML's (R, E, F, z)" in err

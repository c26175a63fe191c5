"""Readers of labelled molecular data in the layouts their publishers ship; units converted here only.

* rMD17 (Christensen & von Lilienfeld 2020): ``rmd17/npz_data/rmd17_<molecule>.npz`` with
  ``nuclear_charges``, ``coords`` [Å], ``energies`` [kcal/mol], ``forces`` [kcal/mol/Å], and the
  official splits ``rmd17/splits/index_{train,test}_0K.csv`` (one frame index per line).
* extended XYZ (ase), with MACE's keys ``REF_energy`` / ``REF_forces`` or a calculator's results.

Every file is checked against its data card; a bad file is a `UserError` naming the file and field.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from workbench.domains.atomistic.frames import Frame
from workbench.domains.atomistic.units import EV_PER_KCAL_PER_MOL

from workbench.datacard import check_fields, load_card
from workbench.errors import UserError, field_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LabelledSet:
    """Frames with the publisher's train/test split (indices into ``frames``)."""

    frames: list[Frame]
    train_indices: np.ndarray
    test_indices: np.ndarray
    source: str
    #: Isolated-atom energies at the data's level of theory {element symbol: eV}, when its card gives them.
    isolated_atom_energies_ev: dict[str, float] = field(default_factory=dict)


def find_rmd17_npz(path: str | Path, molecule: str) -> Path:
    """The npz of ``molecule`` given the npz itself, the ``npz_data`` folder or the rMD17 root."""
    path = Path(path)
    if path.is_file():
        return path
    for candidate in (path / f"rmd17_{molecule}.npz", path / "npz_data" / f"rmd17_{molecule}.npz"):
        if candidate.is_file():
            return candidate
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    found = sorted(p.name for p in [*path.glob("rmd17_*.npz"), *path.glob("npz_data/rmd17_*.npz")])
    raise UserError(
        f"{path}: no rmd17_{molecule}.npz here or in npz_data/ (found: {found or 'none'}); "
        "choose the molecule with --molecule"
    )


def read_rmd17(path: str | Path, molecule: str = "ethanol", split: int = 1, card: str = "rmd17") -> LabelledSet:
    """Read one rMD17 molecule and its official split, converting to eV and eV/Å.

    Args:
        path: ``rmd17_<molecule>.npz``, its ``npz_data`` folder, or the rMD17 root folder.
        molecule: used when ``path`` is a folder.
        split: which ``index_{train,test}_0<split>.csv`` pair to use (rMD17 ships 1 to 5).
        card: the data card the file is checked against.
    """
    npz_path = find_rmd17_npz(path, molecule)
    try:
        with np.load(npz_path) as content:
            arrays = {key: content[key] for key in content.files}
    except Exception as error:
        raise UserError(f"{npz_path}: not a readable npz file ({error})") from None
    data_card = load_card(card)
    sizes = check_fields(data_card, npz_path, arrays)
    numbers = arrays["nuclear_charges"].astype(np.int64)
    energies_ev = arrays["energies"].astype(np.float64) * EV_PER_KCAL_PER_MOL
    forces_ev_per_a = arrays["forces"].astype(np.float64) * EV_PER_KCAL_PER_MOL
    frames = [
        Frame(numbers, arrays["coords"][i].astype(np.float64), float(energies_ev[i]), forces_ev_per_a[i])
        for i in range(sizes["n_frames"])
    ]
    splits_dir = npz_path.parent.parent / "splits"
    train = _read_split(splits_dir / f"index_train_{split:02d}.csv", len(frames))
    test = _read_split(splits_dir / f"index_test_{split:02d}.csv", len(frames))
    overlap = np.intersect1d(train, test)
    if overlap.size:
        raise field_error(
            splits_dir,
            f"index_test_{split:02d}.csv",
            "indices disjoint from the training split",
            f"{overlap.size} shared, e.g. {overlap[:3].tolist()}",
        )
    return LabelledSet(
        frames,
        train,
        test,
        source=str(npz_path),
        isolated_atom_energies_ev=dict(data_card.content.get("isolated_atom_energies_ev", {})),
    )


def _read_split(path: Path, n_frames: int) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"{path}: split file missing; rMD17 ships splits/index_{{train,test}}_0K.csv beside npz_data/")
    try:
        indices = np.loadtxt(path, dtype=np.int64, ndmin=1)
    except ValueError as error:
        raise field_error(path, "index", "one integer frame index per line", str(error)) from None
    if indices.size == 0 or indices.min() < 0 or indices.max() >= n_frames:
        raise field_error(
            path,
            "index",
            f"indices in [0, {n_frames})",
            f"range [{indices.min() if indices.size else '-'}, {indices.max() if indices.size else '-'}]",
        )
    return indices


def read_extxyz(path: str | Path, energy_key: str = "REF_energy", forces_key: str = "REF_forces") -> list[Frame]:
    """Read labelled frames from an extended-XYZ file (MACE's keys, or a calculator's results) [eV, eV/Å]."""
    import ase.io

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        structures = ase.io.read(path, index=":")
    except Exception as error:
        raise UserError(f"{path}: not a readable extended-XYZ file ({error})") from None
    frames = [frame_from_atoms(atoms, path, index, energy_key, forces_key) for index, atoms in enumerate(structures)]
    if not frames:
        raise UserError(f"{path}: holds no frames")
    return frames


def frame_from_atoms(
    atoms, path: str | Path, index: int, energy_key: str = "REF_energy", forces_key: str = "REF_forces"
) -> Frame:
    """A labelled `Frame` from an ``ase.Atoms`` read from ``path`` (frame ``index``), checked."""
    energy, forces = atoms.info.get(energy_key), atoms.arrays.get(forces_key)
    if (energy is None or forces is None) and atoms.calc is not None:
        energy = energy if energy is not None else atoms.calc.results.get("energy")
        forces = forces if forces is not None else atoms.calc.results.get("forces")
    if energy is None:
        raise field_error(
            path, energy_key, f"an energy [eV] in frame {index} (info '{energy_key}' or a calculator energy)", "none"
        )
    if forces is None:
        raise field_error(
            path, forces_key, f"forces [eV/Å] in frame {index} (arrays '{forces_key}' or calculator forces)", "none"
        )
    forces = np.asarray(forces, dtype=np.float64)
    if not np.isfinite(energy):
        raise field_error(path, energy_key, f"a finite energy in frame {index}", str(energy))
    if not np.isfinite(forces).all():
        raise field_error(path, forces_key, f"finite forces in frame {index}", "NaN or inf")
    return Frame(atoms.get_atomic_numbers(), atoms.get_positions(), float(energy), forces)


def read_extxyz_set(path: str | Path, seed: int = 0) -> LabelledSet:
    """A folder with MACE's ``train.xyz`` + ``test.xyz``, or one file split at random in half (seeded)."""
    path = Path(path)
    if path.is_dir():
        train_file, test_file = path / "train.xyz", path / "test.xyz"
        if not (train_file.is_file() and test_file.is_file()):
            raise UserError(f"{path}: expected train.xyz and test.xyz in this folder (or give one .xyz file)")
        train, test = read_extxyz(train_file), read_extxyz(test_file)
        return LabelledSet(
            train + test, np.arange(len(train)), np.arange(len(train), len(train) + len(test)), str(path)
        )
    frames = read_extxyz(path)
    if len(frames) < 4:
        raise UserError(f"{path}: {len(frames)} frames are too few to split into train and test")
    order = np.random.default_rng(seed).permutation(len(frames))
    half = len(frames) // 2
    log.warning(
        "%s has no split: %d frames for training and %d for testing, at random (seed %d)",
        path,
        half,
        len(frames) - half,
        seed,
    )
    return LabelledSet(frames, np.sort(order[:half]), np.sort(order[half:]), str(path))

"""Atomistic data from real physics: GFN2-xTB molecular dynamics, labelled with xTB or DFT.

The recipe (the one that produced the shipped rMD17-style reference frames):

1. **Structure** — `build_molecule`: a name from ase's ``g2`` collection, or an rMD17 molecule name
   (ethanol from the ``g2`` geometry, the others embedded from SMILES with RDKit's ETKDG, seed 0, then
   MMFF-relaxed).
2. **Sampling** — `sample_md_frames`: Langevin MD (ase) driven by GFN2-xTB (tblite); Maxwell–Boltzmann
   initial velocities and the Langevin noise come from one ``numpy.random.default_rng(seed)``; after
   ``equilibration_fs`` one frame is kept every ``interval_fs``. Defaults: 0.5 fs step, friction 0.01
   (ase's inverse time unit), 200 fs equilibration, 10 fs between frames.
3. **Labels** — `label_xtb` (GFN2-xTB, tblite) or `label_dft` (pyscf restricted Kohn–Sham, PBE/def2-SVP,
   no density fitting, ``conv_tol`` 1e-9; forces are minus the analytic nuclear gradient).
4. **Files** — `write_rmd17` / `write_rmd17_splits` write rMD17's own layout and units
   (``npz_data/rmd17_<molecule>.npz`` in Å, kcal/mol, kcal/mol/Å; ``splits/index_{train,test}_0K.csv``);
   `generate_foundation_corpus` writes a MACE-style extended-XYZ pretraining corpus (eV, eV/Å) with
   the isolated-atom energies as ``IsolatedAtom`` frames.

Internally lengths are Å, energies eV and forces eV/Å; kcal/mol appears only in the rMD17 files.
Every write is atomic: a temporary file in the target folder, then `os.replace`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

import ase.io
import ase.units
import numpy as np
from ase import Atoms
from ase.build import molecule as g2_molecule
from ase.collections import g2
from ase.md.langevin import Langevin
from threadpoolctl import threadpool_limits
from tqdm import tqdm
from workbench.domains.atomistic.units import EV_PER_KCAL_PER_MOL

from workbench.core.checkpoint import atomic_path

try:  # ase >= 3.29; older versions only have the (same) MaxwellBoltzmannDistribution
    from ase.md.velocitydistribution import thermalize_momenta
except ImportError:  # pragma: no cover - depends on the installed ase
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

    def thermalize_momenta(atoms, temperature_K, *, rng):  # noqa: N803 - ase's spelling
        MaxwellBoltzmannDistribution(atoms, temperature_K=temperature_K, rng=rng)


log = logging.getLogger(__name__)

#: rMD17 molecule name (as in its file names) -> ("g2", g2 name) or ("smiles", SMILES).
RMD17_MOLECULES: dict[str, tuple[str, str]] = {
    "ethanol": ("g2", "CH3CH2OH"),
    "malonaldehyde": ("smiles", "O=CC=CO"),  # the enol form, as in rMD17
    "benzene": ("g2", "C6H6"),
    "aspirin": ("smiles", "CC(=O)Oc1ccccc1C(=O)O"),
    "uracil": ("smiles", "O=c1cc[nH]c(=O)[nH]1"),
    "toluene": ("smiles", "Cc1ccccc1"),
    "naphthalene": ("smiles", "c1ccc2ccccc2c1"),
    "salicylic": ("smiles", "OC(=O)c1ccccc1O"),
    "paracetamol": ("smiles", "CC(=O)Nc1ccc(O)cc1"),
    "azobenzene": ("smiles", "c1ccc(cc1)/N=N/c1ccccc1"),
}

#: Spin multiplicity of the isolated-atom ground states (Hund's rule): H 2S, C 3P, N 4S, O 3P.
ATOM_MULTIPLICITY: dict[str, int] = {"H": 2, "C": 3, "N": 4, "O": 3}

_XTB_METHOD = "GFN2-xTB"


def build_molecule(name: str) -> Atoms:
    """The starting geometry of a molecule, in Å, without calculator.

    Atoms are in g2's or the SMILES' order (with hydrogens last), not necessarily rMD17's.

    Args:
        name: an rMD17 molecule name (``RMD17_MOLECULES``: ethanol, malonaldehyde, aspirin, ...) or a
            name of ase's ``g2`` collection (e.g. ``"CH3CH2OH"``).

    Raises:
        ValueError: the name is neither; the message lists the accepted names.
    """
    if name in RMD17_MOLECULES:
        kind, spec = RMD17_MOLECULES[name]
        return g2_molecule(spec) if kind == "g2" else _embed_smiles(spec)
    if name in g2.names:
        return g2_molecule(name)
    raise ValueError(
        f"unknown molecule '{name}': use an rMD17 name ({', '.join(RMD17_MOLECULES)}) "
        f"or one of ase's g2 collection ({', '.join(sorted(g2.names))})"
    )


def _embed_smiles(smiles: str) -> Atoms:
    """3D structure of a SMILES string: RDKit ETKDG embedding (seed 0) with hydrogens, MMFF-relaxed."""
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
    if AllChem.EmbedMolecule(mol, randomSeed=0) != 0:
        raise RuntimeError(f"RDKit could not embed SMILES '{smiles}' in 3D")
    AllChem.MMFFOptimizeMolecule(mol)
    numbers = [atom.GetAtomicNum() for atom in mol.GetAtoms()]
    return Atoms(numbers=numbers, positions=mol.GetConformer().GetPositions())


def _xtb_calculator(**parameters):
    from tblite.ase import TBLite

    return TBLite(method=_XTB_METHOD, verbosity=0, **parameters)


def _one_openmp_thread():
    """Run tblite on one OpenMP thread: for molecules of a few dozen atoms, threads only add a barrier
    per SCF step, which made MD ~900x slower when the cores were shared with another process
    (measured: 110 water MD steps in 0.1 s on one thread, 94 s on two)."""
    return threadpool_limits(limits=1, user_api="openmp")


def sample_md_frames(
    atoms: Atoms,
    n_frames: int,
    temperature_k: float,
    *,
    timestep_fs: float = 0.5,
    friction: float = 0.01,
    equilibration_fs: float = 200.0,
    interval_fs: float = 10.0,
    seed: int,
) -> list[Atoms]:
    """Frames of a GFN2-xTB Langevin trajectory, deterministic for a given ``seed``.

    The momenta are drawn from Maxwell–Boltzmann at ``temperature_k``, the trajectory runs
    ``equilibration_fs`` and then keeps one frame every ``interval_fs`` (both rounded to whole steps).
    Like `label_xtb`, the MD uses the lowest spin of the electron count (singlet or doublet), whatever
    magnetic moments ``atoms`` carries.

    Args:
        atoms: the starting structure (not modified).
        n_frames: number of frames to return.
        temperature_k: thermostat and initial-velocity temperature [K].
        timestep_fs: integration step [fs].
        friction: Langevin friction in ase's inverse time unit (0.01 ≈ 1/(1 ps)).
        equilibration_fs: time run before the first kept frame [fs].
        interval_fs: time between kept frames [fs].
        seed: seeds the initial velocities and the thermostat noise.

    Returns:
        ``n_frames`` new `Atoms` with the atomic numbers and positions [Å] only (no momenta, no
        calculator).
    """
    if n_frames < 1:
        raise ValueError(f"n_frames must be at least 1, got {n_frames}")
    steps_between = round(interval_fs / timestep_fs)
    steps_equilibration = round(equilibration_fs / timestep_fs)
    if steps_between < 1 or steps_equilibration < 0:
        raise ValueError(
            f"interval_fs ({interval_fs}) must be at least one timestep ({timestep_fs} fs) "
            f"and equilibration_fs ({equilibration_fs}) non-negative"
        )
    rng = np.random.default_rng(seed)
    system = Atoms(numbers=atoms.numbers, positions=atoms.positions)
    system.calc = _xtb_calculator()
    thermalize_momenta(system, temperature_k, rng=rng)
    # fixcm=True (ase's long-standing default, deprecated since ase 3.28) keeps the published frames
    # reproducible; its small bias of the NVT ensemble does not matter for sampling training frames.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*fixcm", category=FutureWarning)
        dynamics = Langevin(
            system, timestep_fs * ase.units.fs, temperature_K=temperature_k, friction=friction, fixcm=True, rng=rng
        )
    frames = []
    with _one_openmp_thread():
        dynamics.run(steps_equilibration)
        for _ in range(n_frames):
            dynamics.run(steps_between)
            frames.append(Atoms(numbers=system.numbers, positions=system.positions))
    return frames


def _stack_frames(frames: Sequence[Atoms]) -> np.ndarray:
    """Atomic numbers shared by all frames (n_atoms,); raises if the frames are not one molecule."""
    if not frames:
        raise ValueError("no frames to label")
    numbers = frames[0].numbers
    for index, frame in enumerate(frames):
        if not np.array_equal(frame.numbers, numbers):
            raise ValueError(
                f"frame {index} has atoms {frame.get_chemical_formula()}, "
                f"frame 0 has {frames[0].get_chemical_formula()}: label one molecule at a time"
            )
    return numbers


def label_xtb(frames: Sequence[Atoms], *, progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """GFN2-xTB (tblite) energies and forces of frames of one molecule, neutral and in its lowest spin.

    Only atomic numbers and positions are read; initial charges and magnetic moments are ignored.

    Returns:
        ``energies_ev`` (n_frames,) [eV] and ``forces_ev_per_a`` (n_frames, n_atoms, 3) [eV/Å].
    """
    numbers = _stack_frames(frames)
    energies = np.empty(len(frames))
    forces = np.empty((len(frames), len(numbers), 3))
    calc = _xtb_calculator()
    with _one_openmp_thread():
        for index, frame in enumerate(tqdm(frames, desc="GFN2-xTB", unit="frame", disable=not progress)):
            system = Atoms(numbers=frame.numbers, positions=frame.positions)
            system.calc = calc
            energies[index] = system.get_potential_energy()
            forces[index] = system.get_forces()
    return energies, forces


def label_dft(
    frames: Sequence[Atoms],
    *,
    xc: str = "PBE",
    basis: str = "def2-SVP",
    conv_tol: float = 1e-9,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Kohn–Sham DFT (pyscf, restricted, no density fitting) energies and forces of one molecule's frames.

    Forces are minus pyscf's analytic nuclear gradient (without integration-grid response).

    Args:
        frames: neutral closed-shell structures [Å] of one molecule.
        xc: exchange-correlation functional (pyscf name).
        basis: basis set (pyscf name).
        conv_tol: SCF energy convergence threshold [Hartree].

    Returns:
        ``energies_ev`` (n_frames,) [eV] and ``forces_ev_per_a`` (n_frames, n_atoms, 3) [eV/Å].

    Raises:
        ValueError: odd electron count (restricted Kohn–Sham needs a closed shell).
        RuntimeError: an SCF did not converge (the message names the frame).
    """
    from pyscf import dft, gto

    numbers = _stack_frames(frames)
    if int(numbers.sum()) % 2:
        raise ValueError(
            f"{frames[0].get_chemical_formula()} has an odd number of electrons; "
            "label_dft runs restricted Kohn-Sham on neutral closed-shell molecules only"
        )
    energies = np.empty(len(frames))
    forces = np.empty((len(frames), len(numbers), 3))
    for index, frame in enumerate(tqdm(frames, desc=f"{xc}/{basis}", unit="frame", disable=not progress)):
        mol = gto.M(
            atom=list(zip(frame.numbers.tolist(), frame.positions.tolist())),
            unit="Angstrom",
            basis=basis,
            charge=0,
            spin=0,
            verbose=0,
        )
        mf = dft.RKS(mol, xc=xc)
        mf.conv_tol = conv_tol
        energy_hartree = mf.kernel()
        if not mf.converged:
            raise RuntimeError(
                f"{xc}/{basis} SCF of frame {index} ({frame.get_chemical_formula()}) did not "
                f"converge in {mf.max_cycle} cycles (conv_tol {conv_tol})"
            )
        gradient_hartree_per_bohr = mf.nuc_grad_method().kernel()
        energies[index] = energy_hartree * ase.units.Hartree
        forces[index] = -gradient_hartree_per_bohr * (ase.units.Hartree / ase.units.Bohr)
    return energies, forces


def isolated_atom_energies_dft(
    symbols: Sequence[str] = tuple(ATOM_MULTIPLICITY),
    *,
    xc: str = "PBE",
    basis: str = "def2-SVP",
    conv_tol: float = 1e-9,
) -> dict[str, float]:
    """Isolated-atom energies [eV] at a DFT level of theory: unrestricted Kohn–Sham (pyscf) in each atom's
    ground-state multiplicity (`ATOM_MULTIPLICITY`). They are the physical E0s of that level of theory.
    """
    from pyscf import dft, gto

    energies = {}
    for symbol in symbols:
        mol = gto.M(atom=f"{symbol} 0 0 0", basis=basis, spin=ATOM_MULTIPLICITY[symbol] - 1, verbose=0)
        mf = dft.UKS(mol, xc=xc)
        mf.conv_tol = conv_tol
        energy_hartree = mf.kernel()
        if not mf.converged:
            raise RuntimeError(f"{xc}/{basis} SCF of the isolated {symbol} atom did not converge")
        energies[symbol] = float(energy_hartree * ase.units.Hartree)
    return energies


def write_rmd17(
    out_dir: str | Path,
    molecule: str,
    atomic_numbers: np.ndarray,
    coords_a: np.ndarray,
    energies_ev: np.ndarray,
    forces_ev_per_a: np.ndarray,
) -> Path:
    """Write ``out_dir/npz_data/rmd17_<molecule>.npz`` in rMD17's layout and units.

    Args:
        atomic_numbers: (n_atoms,) nuclear charges.
        coords_a: (n_frames, n_atoms, 3) positions [Å].
        energies_ev: (n_frames,) energies [eV], written in kcal/mol.
        forces_ev_per_a: (n_frames, n_atoms, 3) forces [eV/Å], written in kcal/mol/Å.

    Returns:
        The path written. Keys: ``nuclear_charges`` int64, ``coords``, ``energies``, ``forces`` float64.
    """
    numbers = np.asarray(atomic_numbers, dtype=np.int64)
    coords = np.asarray(coords_a, dtype=np.float64)
    energies = np.asarray(energies_ev, dtype=np.float64)
    forces = np.asarray(forces_ev_per_a, dtype=np.float64)
    n_frames, n_atoms = len(energies), len(numbers)
    expected = {
        "atomic_numbers": (numbers, (n_atoms,)),
        "coords_a": (coords, (n_frames, n_atoms, 3)),
        "energies_ev": (energies, (n_frames,)),
        "forces_ev_per_a": (forces, (n_frames, n_atoms, 3)),
    }
    for name, (array, shape) in expected.items():
        if array.shape != shape:
            raise ValueError(
                f"write_rmd17({molecule}): {name} has shape {array.shape}, expected {shape} "
                f"(n_frames={n_frames} from energies_ev, n_atoms={n_atoms} from atomic_numbers)"
            )
        if not np.isfinite(array).all():
            raise ValueError(f"write_rmd17({molecule}): {name} has non-finite values")
    path = Path(out_dir) / "npz_data" / f"rmd17_{molecule}.npz"
    with atomic_path(path) as temporary, open(temporary, "wb") as stream:
        np.savez(
            stream,
            nuclear_charges=numbers,
            coords=coords,
            energies=energies / EV_PER_KCAL_PER_MOL,
            forces=forces / EV_PER_KCAL_PER_MOL,
        )
    return path


def write_rmd17_splits(
    out_dir: str | Path, n_frames: int, n_train: int, seed: int, split_id: int = 1
) -> tuple[Path, Path]:
    """Write ``out_dir/splits/index_{train,test}_<split_id:02d>.csv`` as rMD17 ships them.

    One integer frame index per line, no header, ascending. The train indices are ``n_train`` frames
    drawn without replacement (``numpy.random.default_rng(seed)``); the test indices are all the rest.

    Returns:
        The train and test file paths.
    """
    if not 0 < n_train < n_frames:
        raise ValueError(f"n_train must be between 1 and n_frames - 1 = {n_frames - 1}, got {n_train}")
    order = np.random.default_rng(seed).permutation(n_frames)
    paths = []
    for part, indices in (("train", order[:n_train]), ("test", order[n_train:])):
        path = Path(out_dir) / "splits" / f"index_{part}_{split_id:02d}.csv"
        with atomic_path(path) as temporary:
            temporary.write_text("".join(f"{index}\n" for index in np.sort(indices)))
        paths.append(path)
    return paths[0], paths[1]


def generate_rmd17(
    out_dir: str | Path,
    molecules: Sequence[str],
    n_frames: int,
    *,
    level: str = "dft",
    temperature_k: float = 500.0,
    seed: int = 2026,
    n_train: int | None = None,
    progress: bool = True,
) -> list[Path]:
    """rMD17-style data: xTB Langevin MD, labelled at ``level``, written in rMD17's layout.

    Each molecule gets ``n_frames`` frames from `sample_md_frames` (default timing, the same ``seed``
    for every molecule), labels from `label_dft` (``level="dft"``, PBE/def2-SVP) or `label_xtb`
    (``level="xtb"``), and one ``npz_data/rmd17_<molecule>.npz``; one split set (``splits/*_01.csv``,
    ``n_train`` = half the frames by default) serves all molecules, as in rMD17.

    Returns:
        The npz paths written, in the order of ``molecules``.
    """
    labellers = {"dft": label_dft, "xtb": label_xtb}
    if level not in labellers:
        raise ValueError(f"level must be one of {sorted(labellers)}, got '{level}'")
    n_train = n_frames // 2 if n_train is None else n_train
    if not 0 < n_train < n_frames:
        raise ValueError(f"n_train must be between 1 and n_frames - 1 = {n_frames - 1}, got {n_train}")
    paths = []
    for name in molecules:
        atoms = build_molecule(name)
        log.info("%s: sampling %d frames of GFN2-xTB MD at %g K", name, n_frames, temperature_k)
        frames = sample_md_frames(atoms, n_frames, temperature_k, seed=seed)
        log.info("%s: labelling %d frames at level %s", name, n_frames, level)
        energies, forces = labellers[level](frames, progress=progress)
        coords = np.stack([frame.positions for frame in frames])
        paths.append(write_rmd17(out_dir, name, atoms.numbers, coords, energies, forces))
        log.info("wrote %s", paths[-1])
    write_rmd17_splits(out_dir, n_frames, n_train, seed)
    return paths


def default_corpus_molecules() -> list[str]:
    """Names in ase's g2 collection made of H, C, N, O only, closed-shell, with at least 3 atoms.

    Closed shell: even electron count and no initial magnetic moments in g2 (58 molecules).
    """
    names = []
    for name in g2.names:
        atoms = g2[name]
        if (
            set(atoms.get_chemical_symbols()) <= set(ATOM_MULTIPLICITY)
            and len(atoms) >= 3
            and int(atoms.numbers.sum()) % 2 == 0
            and not atoms.get_initial_magnetic_moments().any()
        ):
            names.append(name)
    return names


def isolated_atom_frames(symbols: Sequence[str] = tuple(ATOM_MULTIPLICITY)) -> list[Atoms]:
    """GFN2-xTB energies of isolated atoms in their ground-state multiplicity, as MACE ``IsolatedAtom`` frames.

    Each frame carries ``info["REF_energy"]`` [eV], ``arrays["REF_forces"]`` (1, 3) [eV/Å],
    ``info["molecule"]`` (the element) and ``info["config_type"] = "IsolatedAtom"``.
    """
    frames = []
    for symbol in symbols:
        if symbol not in ATOM_MULTIPLICITY:
            raise ValueError(f"no ground-state multiplicity known for '{symbol}'; known: {list(ATOM_MULTIPLICITY)}")
        atom = Atoms(symbol)
        atom.calc = _xtb_calculator(multiplicity=ATOM_MULTIPLICITY[symbol])
        with _one_openmp_thread():
            energy, forces = atom.get_potential_energy(), atom.get_forces()
        frame = Atoms(symbol)
        frame.info.update(REF_energy=energy, molecule=symbol, config_type="IsolatedAtom")
        frame.arrays["REF_forces"] = forces
        frames.append(frame)
    return frames


def generate_foundation_corpus(
    out_path: str | Path,
    molecules: Sequence[str] | None = None,
    frames_per_molecule: int = 45,
    temperatures_k: Sequence[float] = (300.0, 500.0, 800.0),
    seed: int = 2026,
    *,
    equilibration_fs: float = 500.0,
    interval_fs: float = 200.0,
    progress: bool = True,
) -> Path:
    """The GFN2-xTB pretraining corpus of a small foundation potential, as one extended-XYZ file.

    Molecule ``i`` gets one `sample_md_frames` trajectory per temperature ``temperatures_k[j]``, seeded
    with ``SeedSequence((seed, i, j))``; its ``frames_per_molecule`` frames are shared out over the
    temperatures as evenly as possible (the first temperatures take any remainder) and labelled with
    `label_xtb`. The file holds the molecules in order, each one's trajectories in temperature order,
    and ends with the isolated-atom energies of H, C, N, O (`isolated_atom_frames`). A name ending in
    ``.gz`` is compressed.

    Frames carry ``info["REF_energy"]`` [eV], ``arrays["REF_forces"]`` (n_atoms, 3) [eV/Å],
    ``info["molecule"]`` (g2 name), ``info["temperature_k"]`` [K] and
    ``info["config_type"] = "g2_xtb_md"``; positions are in Å; no calculator results are stored.

    Args:
        molecules: g2 or rMD17 names (default: `default_corpus_molecules`).
        frames_per_molecule: frames per molecule over all temperatures.
        temperatures_k: MD temperatures [K].
        seed: root seed of all trajectories.
        equilibration_fs, interval_fs: passed to `sample_md_frames` [fs].

    Returns:
        ``out_path``.
    """
    names = default_corpus_molecules() if molecules is None else list(molecules)
    if frames_per_molecule < len(temperatures_k):
        raise ValueError(
            f"frames_per_molecule ({frames_per_molecule}) must be at least the number of "
            f"temperatures ({len(temperatures_k)})"
        )
    corpus = []
    for i, name in enumerate(tqdm(names, desc="g2 xTB corpus", unit="molecule", disable=not progress)):
        atoms = build_molecule(name)
        for j, temperature in enumerate(temperatures_k):
            n_frames = len(range(j, frames_per_molecule, len(temperatures_k)))
            trajectory_seed = int(np.random.SeedSequence((seed, i, j)).generate_state(1)[0])
            frames = sample_md_frames(
                atoms,
                n_frames,
                temperature,
                equilibration_fs=equilibration_fs,
                interval_fs=interval_fs,
                seed=trajectory_seed,
            )
            energies, forces = label_xtb(frames)
            for frame, energy, force in zip(frames, energies, forces):
                frame.info.update(
                    REF_energy=float(energy), molecule=name, temperature_k=float(temperature), config_type="g2_xtb_md"
                )
                frame.arrays["REF_forces"] = force
            corpus.extend(frames)
        log.info("%s: %d frames", name, frames_per_molecule)
    corpus.extend(isolated_atom_frames())
    path = Path(out_path)
    with atomic_path(path) as temporary:
        ase.io.write(temporary, corpus, format="extxyz")
    log.info("wrote %d frames to %s", len(corpus), path)
    return path

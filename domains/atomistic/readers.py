"""Readers of labelled molecular data in the layouts their publishers ship; units converted here only.

* rMD17 (Christensen & von Lilienfeld 2020): ``rmd17/npz_data/rmd17_<molecule>.npz`` with
  ``nuclear_charges``, ``coords`` [Å], ``energies`` [kcal/mol], ``forces`` [kcal/mol/Å], and the
  official splits ``rmd17/splits/index_{train,test}_0K.csv`` (one frame index per line).
* sGDML npz, as sGDML ships MD17 and MD22: ``R`` (frames, atoms, 3), ``E`` (frames,) or (frames, 1), ``F``
  (frames, atoms, 3), ``z`` (atoms,), metadata (``name``, ``theory``, ``type``, ``md5``) and sometimes ``e_unit`` /
  ``r_unit``; energies in kcal/mol unless the file or ``--units`` says otherwise.
* anything ase reads with energies and forces: extended XYZ (MACE's ``REF_energy`` / ``REF_forces`` or a
  calculator's results), ase ``.db`` (labels as calculator results, key-value pairs or, as schnetpack keeps MD17,
  in ``row.data``), ``.traj``; energies in eV unless the file (schnetpack's unit metadata) or ``--units`` says.

Records are frames. A frame without an energy or forces, or with NaN/inf in them, is a bad record: skipped into a
`workbench.core.records.SkipReport` with a warning, or raised, as the ``on_bad_record`` policy says. A file whose
structure is wrong (a missing field, mismatched shapes) is a `UserError` naming the file and field. Units are
checked for plausibility: the force magnitudes must look like a molecule's, and where consecutive frames are close,
energy differences must match the work of the forces; otherwise the reader says which unit the numbers look like.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from workbench.domains.atomistic.frames import Frame
from workbench.domains.atomistic.trajectory import TIME_FIELDS, FrameSplit, split_frames, time_order
from workbench.domains.atomistic.unit_checks import check_units, resolve_energy_unit
from workbench.domains.atomistic.units import (
    ANGSTROM_PER_LENGTH_UNIT,
    EV_PER_ENERGY_UNIT,
    EV_PER_KCAL_PER_MOL,
    length_unit,
)

from workbench.core.datacard import check_fields, load_card
from workbench.core.errors import UserError, field_error
from workbench.core.npz import load_npz
from workbench.core.records import BadRecordError, SkipReport

log = logging.getLogger(__name__)

#: File suffixes read through ase.
ASE_SUFFIXES = (".xyz", ".extxyz", ".db", ".traj")

#: Atomic numbers of the known elements (H to Og).
ELEMENTS = (1, 118)


@dataclass(frozen=True)
class LabelledSet:
    """Frames in the file's order (bad frames left out) with the publisher's train/test split (indices into
    ``frames``)."""

    frames: list[Frame]
    train_indices: np.ndarray
    test_indices: np.ndarray
    source: str
    #: Isolated-atom energies at the data's level of theory {element symbol: eV}, when its card gives them.
    isolated_atom_energies_ev: dict[str, float] = field(default_factory=dict)
    #: What the reader decided and the user should know (units and where they came from, which labels were used).
    notes: tuple[str, ...] = ()
    #: Validation frames a fold chose (`workbench.domains.atomistic.task.Rmd17.hold_out`); None: validation frames
    #: are drawn from ``train_indices``.
    val_indices: np.ndarray | None = None
    #: How the train/test split was made, as ``metrics.json``'s ``data_summary.split`` records it (the publisher's
    #: files, blocks with their size and purge, random with its seed; `workbench.domains.atomistic.trajectory`).
    split: dict[str, Any] = field(default_factory=dict)


class BadFrames:
    """Where a reader sends a bad frame: raised as `BadRecordError` (``policy`` "raise") or added to ``report`` with
    a warning ("skip")."""

    def __init__(self, report: SkipReport | None = None, policy: str = "raise"):
        self.report = SkipReport() if report is None else report
        self.policy = policy

    def __call__(self, record: str, problem: str) -> None:
        if self.policy == "raise":
            raise BadRecordError(record, problem)
        self.report.add(record, problem)
        log.warning("skipped %s: %s", record, problem)


def _record(path: Path, index: int) -> str:
    return f"{path} [frame {index}]"


def _label_problem(energy: Any, forces: np.ndarray, positions: np.ndarray, fields: tuple[str, str, str]) -> str | None:
    """Why a frame's labels cannot be used, or None."""
    e_field, f_field, r_field = fields
    if not np.isfinite(energy):
        return f"field '{e_field}': expected a finite energy, found {energy}"
    if forces.shape != positions.shape:
        return f"field '{f_field}': expected forces of shape {list(positions.shape)}, found {list(forces.shape)}"
    if not np.isfinite(forces).all():
        return f"field '{f_field}': expected finite forces, found {int((~np.isfinite(forces)).sum())} NaN/inf"
    if not np.isfinite(positions).all():
        return f"field '{r_field}': expected finite positions, found NaN/inf"
    return None


def _ase_labels(energy: Any, forces: Any, n_atoms: int, fields: tuple[str, str]) -> tuple[float, np.ndarray] | str:
    """(energy, forces (n_atoms, 3)) as floats from whatever an ase file held, or why they are not numbers."""
    e_field, f_field = fields
    energy_value, forces_value = _numbers(energy), _numbers(forces)
    if energy_value is None or energy_value.size != 1:
        return f"field '{e_field}': expected one number, found {_shown(energy)}"
    if forces_value is None or forces_value.size != n_atoms * 3:
        return f"field '{f_field}': expected {n_atoms} x 3 numbers (one vector per atom), found {_shown(forces)}"
    return float(energy_value.reshape(-1)[0]), forces_value.reshape(n_atoms, 3)


def _numbers(value: Any) -> np.ndarray | None:
    """``value`` as a float64 array, or None when it holds anything but real numbers (text, objects, complex)."""
    try:
        array = np.asarray(value)
    except ValueError:  # ragged nested sequences
        return None
    return array.astype(np.float64) if array.dtype.kind in "biuf" else None


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _element_problem(numbers: np.ndarray, field_name: str = "numbers") -> str | None:
    """Why ``numbers`` are not all atomic numbers of known elements, or None."""
    low, high = ELEMENTS
    unknown = numbers[(numbers < low) | (numbers > high)]
    if unknown.size:
        return (
            f"field '{field_name}': expected atomic numbers of elements ({low} to {high}), found {unknown[:3].tolist()}"
        )
    return None


def _atomic_numbers(path: Path, field_name: str, numbers: np.ndarray) -> np.ndarray:
    """``numbers`` as int64 when every one is a known element's; a `UserError` naming the file and field otherwise."""
    problem = _element_problem(numbers, field_name)
    if problem:
        raise UserError(f"{path}: {problem}")
    return numbers.astype(np.int64)


def _require_frames(frames: list[Frame], path: Path) -> None:
    if not frames:
        raise UserError(f"{path}: no usable frame (every frame is bad, see above)")


def _text(value: np.ndarray) -> str:
    item = np.asarray(value).item() if np.asarray(value).size == 1 else np.asarray(value).tolist()
    return item.decode(errors="replace") if isinstance(item, bytes) else str(item)


# -- rMD17 ---------------------------------------------------------------------------------------------------------
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


def read_rmd17(
    path: str | Path, molecule: str = "ethanol", split: int = 1, card: str = "rmd17", bad: BadFrames | None = None,
    frame_split: FrameSplit | None = None,
) -> LabelledSet:
    """Read one rMD17 molecule and its official split, converting to eV and eV/Å.

    Args:
        path: ``rmd17_<molecule>.npz``, its ``npz_data`` folder, or the rMD17 root folder.
        molecule: used when ``path`` is a folder.
        split: which ``index_{train,test}_0<split>.csv`` pair to use (rMD17 ships 1 to 5).
        card: the data card the file is checked against.
        bad: where bad frames go (default: raised); their indices leave the split.
        frame_split: how to split an npz without rMD17's ``splits/`` folder beside its ``npz_data/`` (a trajectory in
            the file's order; default: blocks, `workbench.domains.atomistic.trajectory`).
    """
    bad = bad or BadFrames()
    npz_path = find_rmd17_npz(path, molecule)
    arrays = load_npz(npz_path)
    data_card = load_card(card)
    sizes = check_fields(data_card, npz_path, arrays)
    numbers = _atomic_numbers(npz_path, "nuclear_charges", arrays["nuclear_charges"])
    energies_ev = arrays["energies"].astype(np.float64) * EV_PER_KCAL_PER_MOL
    forces_ev_per_a = arrays["forces"].astype(np.float64) * EV_PER_KCAL_PER_MOL
    kept: dict[int, int] = {}  # file frame index -> index in frames
    frames = []
    bad.report.seen += sizes["n_frames"]
    for i in range(sizes["n_frames"]):
        positions = arrays["coords"][i].astype(np.float64)
        problem = _label_problem(energies_ev[i], forces_ev_per_a[i], positions, ("energies", "forces", "coords"))
        if problem:
            bad(_record(npz_path, i), problem)
            continue
        kept[i] = len(frames)
        frames.append(Frame(numbers, positions, float(energies_ev[i]), forces_ev_per_a[i]))
    _require_frames(frames, npz_path)
    splits_dir = npz_path.parent.parent / "splits"
    isolated = dict(data_card.content.get("isolated_atom_energies_ev", {}))
    notes = ("energy unit kcal/mol (rMD17 as published)",)
    if not splits_dir.is_dir():
        return _no_split(frames, npz_path, notes, frame_split, isolated_atom_energies_ev=isolated)
    train = _read_split(splits_dir / f"index_train_{split:02d}.csv", sizes["n_frames"])
    test = _read_split(splits_dir / f"index_test_{split:02d}.csv", sizes["n_frames"])
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
        np.array([kept[i] for i in train if i in kept], dtype=np.int64),
        np.array([kept[i] for i in test if i in kept], dtype=np.int64),
        source=str(npz_path),
        isolated_atom_energies_ev=isolated,
        notes=notes,
        split={"kind": "the publisher's", "files": [f"index_{part}_{split:02d}.csv" for part in ("train", "test")]},
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


# -- sGDML npz -----------------------------------------------------------------------------------------------------
def is_sgdml(arrays: Mapping[str, np.ndarray]) -> bool:
    return {"R", "z", "F"} <= set(arrays)


def read_sgdml(
    path: str | Path, units: str = "", seed: int = 0, bad: BadFrames | None = None, split: FrameSplit | None = None
) -> LabelledSet:
    """Read an sGDML dataset npz (MD17, MD22, ...) into eV, Å and eV/Å: one trajectory in the file's order, split as
    ``split`` says (default: contiguous blocks with a purge gap; ``seed`` for a random split when none is given).

    Shapes in the file: ``R`` (n_frames, n_atoms, 3) [``r_unit``, default Å], ``E`` (n_frames,) or (n_frames, 1)
    [``e_unit``, default kcal/mol: sGDML's published datasets], ``F`` (n_frames, n_atoms, 3) [e_unit/r_unit],
    ``z`` (n_atoms,). ``units`` (``--units``) overrides the energy unit.
    """
    bad = bad or BadFrames()
    path = Path(path)
    arrays = load_npz(path)
    sizes = check_fields(load_card("sgdml"), path, arrays, names=["z", "R", "F"])
    if "E" not in arrays:
        raise field_error(
            path, "E", "a field 'E' (energies, shape [n_frames] or [n_frames, 1])", f"only {sorted(arrays)}"
        )
    energies = np.asarray(arrays["E"])
    if energies.dtype.kind != "f" or energies.shape not in ((sizes["n_frames"],), (sizes["n_frames"], 1)):
        raise field_error(
            path, "E", f"float energies of shape [{sizes['n_frames']}] or [{sizes['n_frames']}, 1]",
            f"{energies.dtype} of shape {list(energies.shape)}",
        )  # fmt: skip
    unit, origin, chosen = resolve_energy_unit(
        path, "e_unit", _text(arrays["e_unit"]) if "e_unit" in arrays else None, units, "kcal/mol",
        "sGDML's datasets' convention: the file has no 'e_unit'",
    )  # fmt: skip
    r_unit = length_unit(_text(arrays["r_unit"]), f"{path}: field 'r_unit'") if "r_unit" in arrays else "Ang"
    to_a, to_ev = ANGSTROM_PER_LENGTH_UNIT[r_unit], EV_PER_ENERGY_UNIT[unit]
    numbers = _atomic_numbers(path, "z", arrays["z"])
    frames = []
    bad.report.seen += sizes["n_frames"]
    for i in range(sizes["n_frames"]):
        positions = arrays["R"][i].astype(np.float64) * to_a
        energy = float(energies.reshape(-1)[i]) * to_ev
        forces = arrays["F"][i].astype(np.float64) * (to_ev / to_a)
        problem = _label_problem(energy, forces, positions, ("E", "F", "R"))
        if problem:
            bad(_record(path, i), problem)
            continue
        frames.append(Frame(numbers, positions, energy, forces))
    _require_frames(frames, path)
    check_units(frames, path, ("E", "F"), unit, origin, chosen)
    described = ", ".join(f"{key} {_text(arrays[key])!r}" for key in ("name", "theory") if key in arrays)
    notes = (f"sGDML dataset{f' ({described})' if described else ''}", f"energy unit {unit} ({origin})",
             f"length unit {r_unit}")  # fmt: skip
    return _no_split(frames, path, notes, split or FrameSplit(seed=seed))


def _no_split(
    frames: list[Frame], path: Path, notes: tuple[str, ...], how: FrameSplit | None, timed: bool = True,
    **fields: Any,
) -> LabelledSet:  # fmt: skip
    """``frames`` of a file without a split, split as ``how`` says (default: ``auto``): ``timed``, a trajectory in
    the file's order; else time-ordered by the frames' time field where every frame has one, else not time-ordered
    (`workbench.domains.atomistic.trajectory.split_frames`)."""
    found = (np.arange(len(frames)), "the file's frame order") if timed else time_order([f.time for f in frames])
    order, ordered_by = found or (None, "the file's frame order")
    train, test, record = split_frames(len(frames), path, how or FrameSplit(), order, ordered_by)
    return LabelledSet(frames, train, test, str(path), notes=notes, split=record, **fields)


# -- files ase reads -----------------------------------------------------------------------------------------------
def _check_xyz_counts(path: Path) -> None:
    """Refuse an (extended) XYZ file whose counts ase would believe before reading: an atom-count line claiming more
    atoms than lines follow it (or fewer than none), or a ``Properties=`` comment declaring more columns per atom than
    its first atom line holds."""
    lines = path.read_bytes().splitlines()
    at = 0
    while at < len(lines):
        try:
            count = int(lines[at])
        except ValueError:
            return  # not a count line: ase's parser says what is wrong
        left = len(lines) - at - 2  # lines after the count and comment lines
        if not 0 <= count <= left:
            raise UserError(
                f"{path}, line {at + 1}: the atom-count line says {count}; expected a count from 0 to {max(left, 0)} "
                "(the atom lines left in the file)"
            )
        declared = re.search(rb"Properties=[\"']?([^\s\"']+)", lines[at + 1])
        if declared and count:
            columns = declared.group(1).split(b":")[2::3]
            held = len(lines[at + 2].split())
            if not all(c.isdigit() for c in columns) or sum(int(c) for c in columns) > held:
                raise UserError(
                    f"{path}, line {at + 2}: 'Properties={declared.group(1).decode(errors='replace')}' declares "
                    f"more columns per atom than the {held} on line {at + 3}"
                )
        at += count + 2


def _check_db_arrays(path: Path) -> None:
    """Refuse an ase database whose cells declare an array (ase's ``__ndarray__`` JSON, in text or binary form) with
    more elements than the cell has bytes: ase allocates the declared shape before filling it."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
            connection.text_factory = bytes  # text cells as stored: a damaged one is never decoded here
            rows = connection.execute("SELECT * FROM systems").fetchall()
    except sqlite3.Error:
        return  # not a database ase reads: ase says what is wrong
    except UnicodeDecodeError as error:  # sqlite3 decodes the schema's text (and its own messages) as UTF-8
        raise UserError(f"{path}: not a readable ase database (its schema holds bytes that are not UTF-8: "
                        f"{error.reason} at byte {error.start}); expected a database written by ase.db") from None
    for row in rows:
        for cell in row:
            data = cell.encode(errors="replace") if isinstance(cell, str) else cell
            if not isinstance(data, bytes) or b"__ndarray__" not in data:
                continue
            for declared in re.finditer(rb'"__ndarray__":\s*[\[(]\s*\[([^\]]*)\]', data):
                shape = [int(size) for size in re.findall(rb"-?\d+", declared.group(1))]
                if any(size < 0 for size in shape) or math.prod(shape) > len(data):
                    raise UserError(f"{path}: row {row[0]}: an array of shape {shape} is declared in a cell of "
                                    f"{len(data)} bytes; expected no more elements than bytes stored")  # fmt: skip


def _find_label(atoms, extras: Mapping[str, Mapping[str, Any]], key: str, kind: str) -> tuple[Any, str | None]:
    """(value, where it was found) of the energy (``kind`` "energy") or forces of one frame, or (None, None).

    With ``key`` "" the calculator's results come first, then MACE's ``REF_energy`` / ``REF_forces``, then an ase
    database row's ``data`` (schnetpack's layout); with a key, that name in the frame's info/arrays, the row's
    key-value pairs and data, and the calculator's results.
    """
    results = atoms.calc.results if atoms.calc is not None else {}
    per_frame = atoms.info if kind == "energy" else atoms.arrays
    per_frame_name = "info" if kind == "energy" else "arrays"
    if key:
        places = [(per_frame_name, per_frame, key), *((name, table, key) for name, table in extras.items()),
                  ("calculator results", results, key)]  # fmt: skip
    else:
        ref = "REF_energy" if kind == "energy" else "REF_forces"
        places = [("calculator results", results, kind), (per_frame_name, per_frame, ref),
                  *((name, table, kind) for name, table in extras.items())]  # fmt: skip
    for name, table, label in places:
        if label in table and table[label] is not None:
            return table[label], f"{name} '{label}'"
    return None, None


def _ase_frames(path: Path):
    """(atoms, extra label tables, file units {"energy": ..., "length": ...}) of every frame of ``path``."""
    if path.suffix == ".db":
        import ase.db

        _check_db_arrays(path)
        try:  # ase decodes rows and their blobs lazily: every decode happens here
            database = ase.db.connect(path, type="db")
            metadata = database.metadata
            units = {"energy": dict(metadata.get("_property_unit_dict", {})).get("energy"),
                     "length": metadata.get("_distance_unit")}  # fmt: skip
            items = [(row.toatoms(), {"row key-value pairs": dict(row.key_value_pairs),
                                      "row data": dict(row.data or {})})
                     for row in database.select()]  # fmt: skip
        except Exception as error:
            raise UserError(f"{path}: not a readable ase database ({type(error).__name__}: {error})") from None
        return items, units
    import ase.io

    if path.suffix in (".xyz", ".extxyz"):
        _check_xyz_counts(path)
    try:
        structures = ase.io.read(path, index=":")
    except Exception as error:
        raise UserError(f"{path}: not a file ase can read ({error})") from None
    return [(atoms, {}) for atoms in structures], {"energy": None, "length": None}


def read_ase(
    path: str | Path,
    energy_key: str = "",
    forces_key: str = "",
    units: str = "",
    bad: BadFrames | None = None,
) -> tuple[list[Frame], tuple[str, ...]]:
    """Labelled frames [eV, Å, eV/Å] of a file ase reads (extxyz, ``.db``, ``.traj``), and notes saying which labels
    and units were used. ``energy_key`` / ``forces_key`` name the labels (default: see `_find_label`); energies are
    in eV (ase's convention) unless the file's unit metadata or ``units`` says otherwise."""
    bad = bad or BadFrames()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    items, file_units = _ase_frames(path)
    unit, origin, chosen = resolve_energy_unit(
        path, "_property_unit_dict", file_units["energy"], units, "eV", "ase's convention: the file states no unit"
    )
    to_a = ANGSTROM_PER_LENGTH_UNIT[length_unit(file_units["length"], str(path))] if file_units["length"] else 1.0
    to_ev = EV_PER_ENERGY_UNIT[unit]
    frames, used = [], Counter()
    bad.report.seen += len(items)
    for index, (atoms, extras) in enumerate(items):
        energy, e_from = _find_label(atoms, extras, energy_key, "energy")
        forces, f_from = _find_label(atoms, extras, forces_key, "forces")
        e_field, f_field = energy_key or "energy", forces_key or "forces"
        if energy is None or forces is None:
            missing = [
                name
                for name, value in ((f"energy '{e_field}'", energy), (f"forces '{f_field}'", forces))
                if value is None
            ]
            bad(_record(path, index), f"no {' and no '.join(missing)} (looked in {_looked(energy_key, forces_key)})")
            continue
        positions = atoms.get_positions() * to_a
        labels = _ase_labels(energy, forces, len(positions), (e_field, f_field))
        problem = (
            labels if isinstance(labels, str) else _label_problem(*labels, positions, (e_field, f_field, "positions"))
        )
        if problem is None:
            problem = _element_problem(atoms.get_atomic_numbers())
        if problem:
            bad(_record(path, index), problem)
            continue
        energy, forces = labels[0] * to_ev, labels[1] * (to_ev / to_a)
        used[(e_from, f_from)] += 1
        frames.append(Frame(atoms.get_atomic_numbers(), positions, energy, forces, _time_of(atoms, extras)))
    if not frames:
        raise UserError(f"{path}: no frame with an energy and forces ({_looked(energy_key, forces_key)}); "
                        "name the labels with --energy-key / --forces-key")  # fmt: skip
    check_units(frames, path, (energy_key or "energy", forces_key or "forces"), unit, origin, chosen)
    labels = "; ".join(f"energy from {e}, forces from {f} ({n} frames)" for (e, f), n in used.items())
    return frames, (f"labels: {labels}", f"energy unit {unit} ({origin})")


def _time_of(atoms, extras: Mapping[str, Mapping[str, Any]]) -> tuple[str, float] | None:
    """(field, value) of the first `TIME_FIELDS` field the frame's ``info`` or its database row holds as a number."""
    for table in (atoms.info, *extras.values()):
        for name in TIME_FIELDS:
            if isinstance(table.get(name), (int, float, np.integer, np.floating)) and not isinstance(table[name], bool):
                return name, float(table[name])
    return None


def _looked(energy_key: str, forces_key: str) -> str:
    if energy_key or forces_key:
        return f"keys --energy-key {energy_key or '(auto)'} / --forces-key {forces_key or '(auto)'}"
    return "calculator results, MACE's REF_energy/REF_forces, ase database row data"


def frame_from_atoms(atoms, path: str | Path, index: int) -> Frame:
    """A labelled `Frame` from an ``ase.Atoms`` read from ``path`` (frame ``index``) in eV; a bad frame raises."""
    energy, _ = _find_label(atoms, {}, "", "energy")
    forces, _ = _find_label(atoms, {}, "", "forces")
    if energy is None or forces is None:
        raise BadRecordError(
            _record(Path(path), index), "no energy or forces (calculator results or REF_energy/REF_forces)"
        )
    labels = _ase_labels(energy, forces, len(atoms), ("energy", "forces"))
    problem = (
        labels
        if isinstance(labels, str)
        else _label_problem(*labels, atoms.get_positions(), ("energy", "forces", "positions"))
    )
    if problem:
        raise BadRecordError(_record(Path(path), index), problem)
    return Frame(atoms.get_atomic_numbers(), atoms.get_positions(), *labels)


def read_ase_set(
    path: str | Path, seed: int = 0, energy_key: str = "", forces_key: str = "", units: str = "",
    bad: BadFrames | None = None, split: FrameSplit | None = None,
) -> LabelledSet:  # fmt: skip
    """A folder with MACE's ``train.xyz`` + ``test.xyz``, or one file ase reads, split as ``split`` says (default:
    blocks with a purge gap where the frames have a time or step field, else at random in half, seeded with
    ``seed``; `workbench.domains.atomistic.trajectory`)."""
    path = Path(path)
    keys = dict(energy_key=energy_key, forces_key=forces_key, units=units, bad=bad)
    if path.is_dir():
        train_file, test_file = path / "train.xyz", path / "test.xyz"
        if not (train_file.is_file() and test_file.is_file()):
            raise UserError(f"{path}: expected train.xyz and test.xyz in this folder (or give one file)")
        (train, notes), (test, _) = read_ase(train_file, **keys), read_ase(test_file, **keys)
        return LabelledSet(
            train + test, np.arange(len(train)), np.arange(len(train), len(train) + len(test)), str(path), notes=notes,
            split={"kind": "the folder's", "files": ["train.xyz", "test.xyz"]},
        )
    frames, notes = read_ase(path, **keys)
    return _no_split(frames, path, notes, split or FrameSplit(seed=seed), timed=False)

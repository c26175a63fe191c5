"""Plausibility checks of a data file's energy unit: where the unit comes from (``--units``, the file, the format's
convention), and whether the labels look like that unit (force magnitudes, energy changes against the forces' work).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from workbench.domains.atomistic.frames import Frame
from workbench.domains.atomistic.units import EV_PER_ENERGY_UNIT, PLAUSIBLE_FORCE_RMS_EV_PER_A, energy_unit

from workbench.core.errors import UserError

log = logging.getLogger(__name__)


def resolve_energy_unit(
    path: Path, field_name: str, in_file: str | None, given: str, default: str, why: str
) -> tuple[str, str, bool]:
    """(unit, where it came from, whether the user chose it) of a file's energies.

    The user's ``--units`` wins (with a warning when the file says otherwise); then the file's own statement; then
    the format's convention ``default`` (``why`` says whose).
    """
    stated = energy_unit(in_file, f"{path}: field '{field_name}'") if in_file else None
    if given and given != "auto":
        unit = energy_unit(given, "--units")
        if stated and stated != unit:
            log.warning(
                "%s: the file says its energies are in %s; reading them in %s as --units says", path, stated, unit
            )
        return unit, "from --units", True
    if stated:
        return stated, f"from the file's field '{field_name}'", False
    return default, why, False


def check_units(frames: list[Frame], path: Path, fields: tuple[str, str], unit: str, origin: str, chosen: bool) -> None:
    """Refuse labels whose unit looks wrong (``chosen``: the user gave ``--units``, so only warn).

    Two checks on the converted frames: the RMS force component must lie in `PLAUSIBLE_FORCE_RMS_EV_PER_A`; and where
    consecutive frames are close (every atom within 0.05 Å), the energy change must match the trapezoid estimate of
    the forces' work, ``ΔE ≈ -½ Σ (F_i + F_j)·(R_j - R_i)`` (least-squares ratio within 0.5 to 2).
    """
    e_field, f_field = fields
    forces = np.concatenate([f.forces_ev_per_a.reshape(-1) for f in frames])
    rms = float(np.sqrt(np.mean(forces**2)))
    low, high = PLAUSIBLE_FORCE_RMS_EV_PER_A
    problem = None
    if rms > high or 0 < rms < low:
        guess = _guess(rms / EV_PER_ENERGY_UNIT[unit], 1.0)
        problem = (
            f"{path}: field '{f_field}': forces read in {unit}/Å ({origin}) have an RMS component of {rms:.3g} eV/Å; "
            f"molecules show about {low:g} to {high:g} eV/Å. The numbers look like {guess}/Å: give --units {guess}"
        )
    ratio = _energy_force_ratio(frames)
    if problem is None and ratio is not None and not 0.5 < ratio < 2.0:
        problem = (
            f"{path}: field '{e_field}': energy changes between neighbouring frames are {ratio:.3g} times the work of "
            f"the forces (field '{f_field}', read in {unit}/Å, {origin}); "
        )
        if 0 < ratio < np.inf:
            guess = _guess(EV_PER_ENERGY_UNIT[unit] / ratio, 1.0, per_unit=True)
            problem += f"the energies look like {guess} while the forces are in {unit}/Å: convert one of them"
        else:
            problem += (
                "expected about 1: the energies do not follow the forces (check that both fields belong together)"
            )
    if problem is None:
        return
    if chosen:
        log.warning("%s (kept: --units given)", problem)
        return
    raise UserError(f"{problem} (or --units {unit} if {unit} is right)")


def _guess(value: float, target: float, per_unit: bool = False) -> str:
    """The energy unit in which raw numbers of size ``value`` come closest to ``target`` eV (``per_unit``: the unit
    closest to being worth ``value`` eV)."""
    if per_unit:
        scores = {u: abs(np.log(ev / value)) for u, ev in EV_PER_ENERGY_UNIT.items()}
    else:
        scores = {u: abs(np.log(value * ev / target)) for u, ev in EV_PER_ENERGY_UNIT.items()}
    return min(scores, key=scores.get)


def _energy_force_ratio(frames: list[Frame], max_step_a: float = 0.05, min_pairs: int = 5) -> float | None:
    """Least-squares ratio of ΔE to the trapezoid work estimate over close consecutive frames, or None (too few)."""
    de, work = [], []
    for a, b in zip(frames[:-1], frames[1:]):
        if len(a.atomic_numbers) != len(b.atomic_numbers) or (a.atomic_numbers != b.atomic_numbers).any():
            continue
        step = b.positions_a - a.positions_a
        if np.abs(step).max() >= max_step_a:
            continue
        de.append(b.energy_ev - a.energy_ev)
        work.append(-0.5 * float(((a.forces_ev_per_a + b.forces_ev_per_a) * step).sum()))
    de, work = np.array(de), np.array(work)
    if len(de) < min_pairs or not (work**2).sum() > 0:
        return None
    return float((de * work).sum() / (work**2).sum())

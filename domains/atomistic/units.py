"""Unit constants of the atomistic domain; conversions happen only at a reader's or writer's boundary.

Internally every length is in Å, every energy in eV and every force in eV/Å (MACE's units).
"""

from __future__ import annotations

import ase.units

from workbench.core.errors import UserError

#: 1 kcal/mol in eV (ase's CODATA value, 0.0433641 eV).
EV_PER_KCAL_PER_MOL = ase.units.kcal / ase.units.mol

#: Energy units a data file may be in, as eV per unit (``--units`` takes these names).
EV_PER_ENERGY_UNIT = {
    "eV": 1.0,
    "meV": 1e-3,
    "kcal/mol": EV_PER_KCAL_PER_MOL,
    "kJ/mol": ase.units.kJ / ase.units.mol,
    "hartree": ase.units.Hartree,
}
#: Length units, as Å per unit.
ANGSTROM_PER_LENGTH_UNIT = {"Ang": 1.0, "bohr": ase.units.Bohr}

_ENERGY_ALIASES = {"ev": "eV", "mev": "meV", "kcal/mol": "kcal/mol", "kj/mol": "kJ/mol", "hartree": "hartree",
                   "ha": "hartree", "eh": "hartree", "au": "hartree", "a.u.": "hartree"}  # fmt: skip
_LENGTH_ALIASES = {"ang": "Ang", "angstrom": "Ang", "å": "Ang", "a": "Ang", "bohr": "bohr", "au": "bohr", "a.u.": "bohr"}

#: Typical root-mean-square force component of molecules in MD or near equilibrium [eV/Å]: about 1 at 300-500 K,
#: down to ~0.01 near a minimum, up to a few eV/Å for strained frames. Outside this band the unit is suspect.
PLAUSIBLE_FORCE_RMS_EV_PER_A = (1e-3, 10.0)


def energy_unit(name: str, where: str) -> str:
    """The canonical name of energy unit ``name`` (e.g. "kcal/mol"); ``where`` says who gave it, for the error."""
    canonical = _ENERGY_ALIASES.get(str(name).strip().lower())
    if canonical is None:
        raise UserError(f"{where}: energy unit '{name}' is not known; use one of {list(EV_PER_ENERGY_UNIT)}")
    return canonical


def length_unit(name: str, where: str) -> str:
    """The canonical name of length unit ``name`` ("Ang" or "bohr")."""
    canonical = _LENGTH_ALIASES.get(str(name).strip().lower())
    if canonical is None:
        raise UserError(f"{where}: length unit '{name}' is not known; use one of {list(ANGSTROM_PER_LENGTH_UNIT)}")
    return canonical

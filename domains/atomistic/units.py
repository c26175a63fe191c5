"""Unit constants of the atomistic domain; conversions happen only at a reader's or writer's boundary.

Internally every length is in Å, every energy in eV and every force in eV/Å (MACE's units).
"""

import ase.units

#: 1 kcal/mol in eV (ase's CODATA value, 0.0433641 eV).
EV_PER_KCAL_PER_MOL = ase.units.kcal / ase.units.mol

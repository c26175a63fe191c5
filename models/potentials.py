"""What the atomistic task asks of an interatomic potential, whatever its family (MACE, SevenNet).

A potential of the workbench has ``atomic_numbers`` (the elements it knows, in the order of its one-hot
``node_attrs``), ``r_max`` (its neighbour cutoff [Å]) and per-element reference energies E0
(``atomic_energies_fn.atomic_energies`` [eV], one per element of ``atomic_numbers``) added to what its network
predicts. This module imports no model library, so the task runs in either family's environment.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from workbench.core.errors import UserError


def atomic_numbers_of(model: nn.Module) -> list[int]:
    """The elements a potential knows, in the order of its one-hot embedding."""
    return [int(z) for z in model.atomic_numbers]


def set_atomic_energies(model: nn.Module, e0s_ev: Mapping[int, float]) -> None:
    """Replace the potential's isolated-atom energies E0 (eV per element) in place."""
    zs = atomic_numbers_of(model)
    missing = [z for z in zs if z not in e0s_ev]
    if missing:
        raise UserError(f"E0s are missing for atomic number(s) {missing}")
    buffer = model.atomic_energies_fn.atomic_energies
    values = torch.tensor([[e0s_ev[z] for z in zs]], dtype=buffer.dtype, device=buffer.device)
    buffer.copy_(values.reshape(buffer.shape))

"""Molecular frames in the workbench's units, and their conversion to MACE graphs.

Shapes and units:
    atomic_numbers (n_atoms,) · positions_a (n_atoms, 3) [Å] · energy_ev () [eV] ·
    forces_ev_per_a (n_atoms, 3) [eV/Å]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from mace import data as mace_data
from mace.tools import AtomicNumberTable
from mace.tools.torch_geometric import Batch
from torch import nn
from workbench.models.mace import default_dtype

from workbench.errors import UserError


@dataclass(frozen=True)
class Frame:
    """One labelled configuration of a molecule (energy/forces may be absent for prediction)."""

    atomic_numbers: np.ndarray
    positions_a: np.ndarray
    energy_ev: float | None = None
    forces_ev_per_a: np.ndarray | None = None


def check_elements(frames: Sequence[Frame], known: Sequence[int], source: str) -> None:
    """Every element in ``frames`` must be one the model knows."""
    present = sorted({int(z) for frame in frames for z in frame.atomic_numbers})
    unknown = [z for z in present if z not in set(known)]
    if unknown:
        raise UserError(
            f"{source}: field 'atomic numbers': the model knows elements {list(known)}, "
            f"found {unknown}; use a model trained on these elements (--model)"
        )


def to_graphs(
    frames: Sequence[Frame], atomic_numbers: Sequence[int], r_max: float, dtype: torch.dtype = torch.float64
) -> list[mace_data.AtomicData]:
    """MACE graphs (neighbour lists within ``r_max`` Å) of ``frames`` in ``dtype``, labels included when present."""
    table = AtomicNumberTable(list(atomic_numbers))
    graphs = []
    for frame in frames:
        config = mace_data.Configuration(
            atomic_numbers=np.asarray(frame.atomic_numbers),
            positions=np.asarray(frame.positions_a, dtype=np.float64),
            properties={"energy": frame.energy_ev, "forces": frame.forces_ev_per_a},
            property_weights={
                "energy": float(frame.energy_ev is not None),
                "forces": float(frame.forces_ev_per_a is not None),
            },
            pbc=(False, False, False),
            cell=np.zeros((3, 3)),
        )
        with default_dtype(dtype):
            graphs.append(mace_data.AtomicData.from_config(config, z_table=table, cutoff=r_max))
    return graphs


def collate(graphs: Sequence[mace_data.AtomicData], device: torch.device | str = "cpu") -> Batch:
    """One batch of graphs on ``device``."""
    return Batch.from_data_list(list(graphs)).to(device)


def predict(
    model: nn.Module, graphs: Sequence[mace_data.AtomicData], batch_size: int = 32, device: torch.device | str = "cpu"
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Energies ``(n_frames,)`` [eV] and forces (a list of ``(n_atoms, 3)`` [eV/Å]) predicted by ``model``."""
    model.eval()
    energies, forces = [], []
    for start in range(0, len(graphs), batch_size):
        batch = collate(graphs[start : start + batch_size], device)
        out = model(batch.to_dict(), training=False, compute_force=True)
        energies.append(out["energy"].detach().cpu().numpy())
        split = batch.ptr.cpu().numpy()
        f = out["forces"].detach().cpu().numpy()
        forces.extend(f[split[i] : split[i + 1]] for i in range(len(split) - 1))
    return np.concatenate(energies), forces

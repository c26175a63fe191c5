"""Molecular frames in the workbench's units, and their conversion to graphs in MACE's layout.

Shapes and units:
    atomic_numbers (n_atoms,) · positions_a (n_atoms, 3) [Å] · energy_ev () [eV] ·
    forces_ev_per_a (n_atoms, 3) [eV/Å]

Graphs are mace-torch's ``AtomicData`` where mace-torch is installed (the ``atomistic`` extra). In an environment
without it (the ``sevennet`` extra: sevenn and mace-torch pin incompatible e3nn releases) they are PyTorch Geometric
``Data`` with the same fields, built by `plain_graphs` (tested equal to mace-torch's graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from workbench.core.device import device_of
from workbench.core.errors import UserError

try:  # mace-torch is the atomistic extra's; SevenNet's environment has PyTorch Geometric instead
    from mace import data as mace_data
    from mace.tools import AtomicNumberTable
    from mace.tools.torch_geometric import Batch
except ImportError:
    mace_data = None
    from torch_geometric.data import Batch


@dataclass(frozen=True)
class Frame:
    """One labelled configuration of a molecule (energy/forces may be absent for prediction)."""

    atomic_numbers: np.ndarray
    positions_a: np.ndarray
    energy_ev: float | None = None
    forces_ev_per_a: np.ndarray | None = None
    #: (field, value) of the frame's place in time where the file gives one (``time`` or ``step``: what orders a
    #: trajectory's frames, `workbench.domains.atomistic.trajectory`); None where it gives none.
    time: tuple[str, float] | None = None


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
) -> list[Any]:
    """MACE graphs (neighbour lists within ``r_max`` Å) of ``frames`` in ``dtype``, labels included when present;
    without mace-torch, `plain_graphs`."""
    if mace_data is None:
        return plain_graphs(frames, atomic_numbers, r_max, dtype)
    from workbench.models.mace import default_dtype

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


def plain_graphs(
    frames: Sequence[Frame], atomic_numbers: Sequence[int], r_max: float, dtype: torch.dtype = torch.float64
) -> list[Any]:
    """`to_graphs`' graphs as PyTorch Geometric ``Data``, without mace-torch: the fields of mace-torch's
    ``AtomicData`` that a potential and the loss read, for molecules (no periodic cell).

    An edge ``(sender, receiver)`` joins two distinct atoms closer than ``r_max`` Å (every such ordered pair),
    ``shifts`` are zero; ``node_attrs`` is one-hot over ``atomic_numbers``; ``weight``, ``energy_weight`` and
    ``forces_weight`` are 1, or 0 for an absent label (whose value is then 0).
    """
    from torch_geometric.data import Data

    index = {int(z): i for i, z in enumerate(atomic_numbers)}
    graphs = []
    for frame in frames:
        positions = np.asarray(frame.positions_a, dtype=np.float64)
        distance = np.linalg.norm(positions[:, None] - positions[None], axis=-1)
        sender, receiver = np.nonzero((distance < r_max) & ~np.eye(len(positions), dtype=bool))
        n_atoms, n_edges = len(positions), len(sender)
        one_hot = np.zeros((n_atoms, len(index)))
        one_hot[np.arange(n_atoms), [index[int(z)] for z in frame.atomic_numbers]] = 1.0
        has_energy, has_forces = frame.energy_ev is not None, frame.forces_ev_per_a is not None
        forces = frame.forces_ev_per_a if has_forces else np.zeros((n_atoms, 3))

        def tensor(values: Any) -> torch.Tensor:
            return torch.as_tensor(np.asarray(values, dtype=np.float64)).to(dtype)

        graphs.append(
            Data(
                num_nodes=n_atoms,
                edge_index=torch.as_tensor(np.stack([sender, receiver]), dtype=torch.int64),
                positions=tensor(positions),
                shifts=tensor(np.zeros((n_edges, 3))),
                node_attrs=tensor(one_hot),
                weight=tensor(1.0),
                energy_weight=tensor(float(has_energy)),
                forces_weight=tensor(float(has_forces)),
                energy=tensor(frame.energy_ev if has_energy else 0.0),
                forces=tensor(forces),
            )
        )
    return graphs


def collate(graphs: Sequence[Any], device: torch.device | str) -> Batch:
    """One batch of graphs on ``device``."""
    return Batch.from_data_list(list(graphs)).to(device)


def predict(model: nn.Module, graphs: Sequence[Any], batch_size: int = 32) -> tuple[np.ndarray, list[np.ndarray]]:
    """Energies ``(n_frames,)`` [eV] and forces (a list of ``(n_atoms, 3)`` [eV/Å]) predicted by ``model``, on the
    device it is on."""
    device = device_of(model)
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

"""SevenNet foundation potentials as their authors ship them, inside the ``sevenn`` package (extra ``sevennet``).

Paper: Park et al., "Scalable Parallel Algorithm for Graph Neural Network Interatomic Potentials in Molecular Dynamics
Simulations", J. Chem. Theory Comput. 20, 4857 (2024). SevenNet is a NequIP-style e3nn network: ``o3.Linear`` node
updates (``IrrepsLinear``, the self-connections), tensor-product convolutions whose weights come from a radial MLP
(``FullyConnectedNet``), gates.

The weights are read from the installed package's ``pretrained_potentials/`` folder, never from the network:

- ``sevennet-0``: SevenNet-0 (11 July 2024), trained on MPtrj (PBE/PBE+U), 89 elements, 842,623 parameters;
- ``sevennet-mf-0``: SevenNet-MF-0, one network for two fidelities (PBE and r²SCAN); the workbench uses its PBE
  fidelity, the level of theory of rMD17's labels (PBE/def2-SVP);
- ``sevennet-l3i5``: SevenNet-l3i5 (l_max 3, 5 interaction layers), MPtrj.

sevenn's own reader unpickles its checkpoints in full (``torch.load(weights_only=False)``); here they are read with
torch's weights-only unpickler, allowing numpy arrays (the config's per-element shift and scale) and nothing else.

The workbench's model (`SevenNetPotential`) speaks the calling convention of the atomistic task (MACE's: a batch
dictionary of ``positions``, ``edge_index``, ``shifts``, ``node_attrs``, ``batch``, ``ptr``; ``{"energy", "forces"}``
out) and adds per-element reference energies E0 (``atomic_energies_fn.atomic_energies``, zero as loaded: the energies
are then SevenNet's own), which the task fits to the data's level of theory.

sevenn needs e3nn >= 0.5 and mace-torch 0.3 pins e3nn == 0.4.4: the ``sevennet`` extra cannot share an environment
with the ``atomistic`` extra. Without sevenn this module does not import, and ``workbench list`` says so.

Units: positions Å, energies eV, forces eV/Å.
"""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.model import ModelFamily, ModelSpec
from workbench.core.registry import models

#: Why this family cannot load without its extra (the registry shows it in ``workbench list`` and in the refusal of
#: ``--model sevennet-0``).
NOT_INSTALLED = (
    "No module named 'sevenn' (SevenNet's package, the sevennet extra; it cannot share an environment with the "
    "atomistic extra: mace-torch pins e3nn 0.4.4, sevenn needs e3nn >= 0.5)"
)
if importlib.util.find_spec("sevenn") is None:
    raise ModuleNotFoundError(NOT_INSTALLED, name="sevenn")

#: What a SevenNet model declares to the methods: its readout MLP (two ``IrrepsLinear`` of scalars) is the head.
SPEC = ModelSpec(family="sevennet", head="readout")

#: Registered name -> (the checkpoint's folder and file under sevenn's ``pretrained_potentials/``, the fidelity used
#: by a multi-fidelity network, or None).
CHECKPOINTS = {
    "sevennet-0": ("SevenNet_0__11Jul2024/checkpoint_sevennet_0.pth", None),
    "sevennet-mf-0": ("SevenNet_MF_0/checkpoint_sevennet_mf_0.pth", "PBE"),
    "sevennet-l3i5": ("SevenNet_l3i5/checkpoint_l3i5.pth", None),
}
#: The modules of sevenn's network that make its readout (atom features -> one scaled energy per atom).
READOUT = ("reduce_input_to_hidden", "reduce_hidden_to_energy")
#: The modules after the readout that the workbench's model replaces: sevenn's energy sum and its forces (taken here
#: by differentiating the energy with respect to the positions, as MACE does).
REPLACED = ("reduce_total_enegy", "force_output")


def checkpoint_path(name: str) -> Path:
    """The shipped checkpoint of the registered model ``name`` inside the installed sevenn package."""
    import sevenn

    path = Path(sevenn.__file__).parent / "pretrained_potentials" / CHECKPOINTS[name][0]
    if not path.is_file():
        raise UserError(f"{path}: the installed sevenn package lacks {name}'s weights; reinstall sevenn==0.13.0")
    return path


@contextmanager
def _weights_only_reads() -> Iterator[None]:
    """Within the block sevenn's checkpoint reader uses torch's weights-only unpickler (numpy arrays allowed)."""
    import sevenn.checkpoint

    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray  # numpy 2 / numpy 1
    allowed = [
        (multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),  # how the files name it
        np.ndarray,
        np.dtype,
        *(type(np.dtype(kind)) for kind in (np.float32, np.float64, np.int64)),
    ]

    def read(path, weights_only: bool = True, map_location=None):  # sevenn passes weights_only=False: not taken
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, weights_only=True, map_location=map_location)

    before = sevenn.checkpoint.torch_load
    sevenn.checkpoint.torch_load = read
    try:
        yield
    finally:
        sevenn.checkpoint.torch_load = before


def load_network(name: str, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, dict[str, Any]]:
    """sevenn's network (``AtomGraphSequential``, eval mode) in ``dtype`` and its config for the registered ``name``.

    e3nn computes its constants (Clebsch-Gordan coefficients, masks) in torch's default dtype when a module is built,
    and casting a built model does not make them exact again: a float32-built SevenNet-0 cast to float64 is
    rotation-invariant to 6e-9 only. So a float64 network is built in float64 (sevenn's builder, as its checkpoint
    reader calls it) and takes the float32 network's parameters, keeping its own constants (every buffer).
    """
    from sevenn.checkpoint import SevenNetCheckpoint
    from sevenn.model_build import build_E3_equivariant_model

    path = checkpoint_path(name)
    with _weights_only_reads():
        try:
            checkpoint = SevenNetCheckpoint(str(path))
            network, config = checkpoint.build_model(), checkpoint.config
        except Exception as error:
            raise UserError(
                f"{path}: cannot be read as a SevenNet checkpoint ({type(error).__name__}: {error})"
            ) from None
    if dtype == torch.float64:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:  # the two keys sevenn's build_model sets before it builds (no FlashTP, no OpenEquivariance)
            exact = build_E3_equivariant_model({**config, "_flash_lammps": False, "use_oeq": False})
        finally:
            torch.set_default_dtype(previous)
        exact.load_state_dict({**exact.state_dict(), **dict(network.named_parameters())})
        network = exact
    return network.to(dtype).eval(), config


class AtomicEnergies(nn.Module):
    """Per-element reference energies E0 [eV] added to SevenNet's energy (``atomic_energies`` (n_elements,), in
    the order of the model's ``atomic_numbers``)."""

    def __init__(self, n_elements: int):
        super().__init__()
        self.register_buffer("atomic_energies", torch.zeros(n_elements))


class OneHotInModelDtype(nn.Module):
    """sevenn's ``OnehotEmbedding`` with its one-hot vectors in the model's dtype (sevenn makes them float32, which
    a float64 model cannot take); ``like`` is an empty buffer that follows the model's ``.to(dtype)``."""

    def __init__(self, embedding: nn.Module):
        super().__init__()
        self.embedding = embedding
        self.register_buffer("like", torch.zeros(0))

    def forward(self, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        data = self.embedding(data)
        for key in {self.embedding.key_output, self.embedding.key_additional_output} - {None}:
            data[key] = data[key].to(self.like.dtype)
        return data


class SevenNetPotential(nn.Module):
    """A SevenNet network in the atomistic task's calling convention (module doc).

    Args:
        network: sevenn's ``AtomGraphSequential`` as built from a checkpoint (taken apart: its body and `READOUT`
            are kept as submodules ``body`` and ``readout``, its per-element rescale as ``rescale``).
        type_map: atomic number -> SevenNet's element index.
        cutoff: neighbour cutoff [Å] (``r_max``).
        modality: the fidelity index of a multi-fidelity network (None: single fidelity).

    Shapes:
        ``positions (n_atoms, 3)`` [Å], ``edge_index (2, n_edges)`` (sender, receiver), ``shifts (n_edges, 3)`` [Å],
        ``node_attrs (n_atoms, n_elements)`` one-hot in ``atomic_numbers`` order, ``batch (n_atoms,)``,
        ``ptr (n_graphs + 1,)`` -> ``energy (n_graphs,)`` [eV], ``forces (n_atoms, 3)`` [eV/Å].
    """

    workbench_spec = SPEC

    def __init__(self, network: nn.Module, type_map: dict[int, int], cutoff: float, modality: int | None = None):
        super().__init__()
        parts = OrderedDict(network.named_children())
        missing = [key for key in ("onehot_idx_to_onehot", *READOUT, "rescale_atomic_energy", *REPLACED)
                   if key not in parts]  # fmt: skip
        if missing:
            raise UserError(f"this SevenNet network has no {missing} modules: not a layout the workbench knows")
        self.readout = nn.Sequential(OrderedDict((key, parts.pop(key)) for key in READOUT))
        self.rescale = parts.pop("rescale_atomic_energy")
        for key in REPLACED:
            parts.pop(key)
        parts["onehot_idx_to_onehot"] = OneHotInModelDtype(parts["onehot_idx_to_onehot"])
        self.body = nn.Sequential(parts)
        for module in self.modules():
            if hasattr(module, "_is_batch_data"):
                module._is_batch_data = True  # batches of graphs (sevenn's set_is_batch_data)
        zs = sorted(int(z) for z in type_map)
        self.register_buffer("atomic_numbers", torch.tensor(zs, dtype=torch.int64))
        self.register_buffer("element_index", torch.tensor([type_map[z] for z in zs], dtype=torch.int64))
        self.r_max = float(cutoff)
        self.modality = modality
        self.atomic_energies_fn = AtomicEnergies(len(zs))

    def forward(self, data: dict[str, torch.Tensor], training: bool = False, compute_force: bool = True):
        import sevenn._keys as KEY

        positions = data["positions"]
        if compute_force:
            positions.requires_grad_(True)
        sender, receiver = data["edge_index"]
        element = data["node_attrs"].argmax(dim=-1)
        graph = {
            KEY.NODE_FEATURE: self.element_index[element],
            KEY.ATOMIC_NUMBERS: self.atomic_numbers[element],
            KEY.POS: positions,
            KEY.EDGE_IDX: data["edge_index"],
            KEY.EDGE_VEC: positions[receiver] - positions[sender] + data["shifts"],
            KEY.BATCH: data["batch"],
        }
        n_graphs = data["ptr"].numel() - 1
        if self.modality is not None:
            graph[KEY.MODAL_TYPE] = torch.full((n_graphs,), self.modality, dtype=torch.int64, device=positions.device)
        graph = self.rescale(self.readout(self.body(graph)))
        per_atom = graph[KEY.ATOMIC_ENERGY].reshape(-1) + data["node_attrs"] @ self.atomic_energies_fn.atomic_energies
        energy = torch.zeros(n_graphs, dtype=per_atom.dtype, device=per_atom.device).index_add(0, data["batch"],
                                                                                             per_atom)  # fmt: skip
        out = {"energy": energy, "node_energy": per_atom}
        if compute_force:
            gradient = torch.autograd.grad(energy.sum(), positions, create_graph=training)[0]
            out["forces"] = -gradient
        return out


def load_sevennet(name: str, dtype: torch.dtype = torch.float32) -> SevenNetPotential:
    """The registered SevenNet ``name`` (`CHECKPOINTS`) as a `SevenNetPotential` in ``dtype``, eval mode."""
    if name not in CHECKPOINTS:
        raise UserError(f"unknown SevenNet model '{name}'; known: {', '.join(CHECKPOINTS)}")
    network, config = load_network(name, dtype)
    fidelity = CHECKPOINTS[name][1]
    modal_map = config.get("_modal_map") or {}
    if (fidelity is None) != (not modal_map) or (fidelity is not None and fidelity not in modal_map):
        raise UserError(f"{checkpoint_path(name)}: fidelities {sorted(modal_map)}; the workbench expects {fidelity}")
    modality = None if fidelity is None else int(modal_map[fidelity])
    model = SevenNetPotential(network, config["_type_map"], config["cutoff"], modality)
    return model.to(dtype).eval()


def calculator(model: nn.Module, device: str | torch.device | None = None):
    """An ASE calculator (energy [eV], forces [eV/Å]) that drives MD with a plain (merged) `SevenNetPotential` on
    ``device`` (default: where the model is)."""
    from ase.calculators.calculator import Calculator, all_changes
    from ase.neighborlist import neighbor_list

    device = device_of(model) if device is None else torch.device(device)

    class WorkbenchSevenNet(Calculator):
        implemented_properties = ["energy", "free_energy", "forces"]

        def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
            super().calculate(atoms, properties, system_changes)
            dtype = next(model.parameters()).dtype
            sender, receiver, shift = neighbor_list("ijS", self.atoms, model.r_max)
            known = model.atomic_numbers.cpu().tolist()
            unknown = sorted(set(self.atoms.numbers.tolist()) - set(known))
            if unknown:
                raise UserError(f"the SevenNet model knows no element {unknown}")
            one_hot = np.eye(len(known))[[known.index(int(z)) for z in self.atoms.numbers]]
            n = len(self.atoms)
            data = {
                "positions": torch.tensor(self.atoms.positions, dtype=dtype, device=device),
                "edge_index": torch.tensor(np.stack([sender, receiver]), dtype=torch.int64, device=device),
                "shifts": torch.tensor(shift @ np.asarray(self.atoms.cell), dtype=dtype, device=device),
                "node_attrs": torch.tensor(one_hot, dtype=dtype, device=device),
                "batch": torch.zeros(n, dtype=torch.int64, device=device),
                "ptr": torch.tensor([0, n], dtype=torch.int64, device=device),
            }
            out = model.to(device)(data, training=False, compute_force=True)
            energy = float(out["energy"][0].detach())
            self.results = {"energy": energy, "free_energy": energy, "forces": out["forces"].detach().cpu().numpy()}

    return WorkbenchSevenNet()


class _SevenNet(ModelFamily):
    """A shipped SevenNet checkpoint (`CHECKPOINTS`); no other source."""

    card = None

    def load(self, source=None, *, trust_checkpoint=False, **sizes) -> nn.Module:
        if source is not None:
            raise UserError(
                f"--model {self.name} loads the checkpoint shipped in the sevenn package; it takes no file ({source})"
            )
        return load_sevennet(self.name, torch.float64)  # the rmd17 task's first precision (float32: cast)

    def files(self, source=None) -> list[Path]:
        return [checkpoint_path(self.name)]


@models.register
class SevenNet0(_SevenNet):
    name = "sevennet-0"
    description = "SevenNet-0 (11Jul2024): e3nn NequIP-style universal potential, MPtrj PBE, 89 elements (sevenn)"


@models.register
class SevenNetMF0(_SevenNet):
    name = "sevennet-mf-0"
    description = "SevenNet-MF-0: multi-fidelity universal potential (PBE and r2SCAN), used at PBE (sevenn)"


@models.register
class SevenNetL3i5(_SevenNet):
    name = "sevennet-l3i5"
    description = "SevenNet-l3i5: universal potential with l_max 3 and 5 interaction layers, MPtrj PBE (sevenn)"

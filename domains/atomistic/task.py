"""The ``rmd17`` task: fine-tune a foundation interatomic potential on DFT frames of one molecule.

The situation it models: a MACE model pretrained on GFN2-xTB data meets PBE/def2-SVP DFT, rMD17's
level of theory. Before training, the isolated-atom energies E0 are re-fitted to the new level of
theory (least squares of the reference energies minus the model's interaction energies over the
training frames), so that "before" measures the model, not an arbitrary energy zero.

Loss (MACE's ``WeightedEnergyForcesLoss``, `energy_forces_loss`)::

    L = w_E · mean_graphs((ΔE / n_atoms)²) + w_F · mean_components(ΔF²)     [eV², (eV/Å)²]

with ``w_E = 1``, ``w_F = 1000`` by default (the ELoRA authors' weights); ``--energy-loss total`` takes the total
energy's error instead of the per-atom one, ``mean_graphs(ΔE²)`` (the ELoRA authors' loss; n_atoms² times stronger,
81× for ethanol).

The model is a potential of any family that speaks MACE's calling convention (`workbench.models.potentials`): MACE
(the ``atomistic`` extra, the default) or a published SevenNet (``--model sevennet-0``, the ``sevennet`` extra, in an
environment without mace-torch: nothing here imports mace-torch at module level).

Grouped folds (``workbench compare``): the group is a *trajectory block*, ``--fold-block`` consecutive frames in the
file's order (``block0`` = frames 0..B-1, ``block1`` = B..2B-1, ...; the last block holds what is left; frames are the
usable ones, bad frames left out). Frames of one MD trajectory are correlated in time, so a test frame whose
neighbours (10 fs away on the embedded data) were trained on measures interpolation along the trajectory, not the
model: a fold holds out whole blocks, and replaces the publisher's train/test index split (`Rmd17.hold_out`). The
default, 40 frames, is 400 fs on the embedded data (one frame every 10 fs, card ``rmd17-embedded``; 10 blocks of
each molecule): there the forces of two frames are uncorrelated from 20 frames (200 fs) apart, and frames 40 apart
differ by 90-94 % of the coordinate RMSD of frames 60 apart. What a block is elsewhere:

- rMD17 / sGDML npz (MD17, MD22): one molecule's trajectory per file; blocks follow the file's frame order, which
  the readers keep (rMD17's 100,000 frames per molecule were taken from a longer MD17 run, each one's MD17 frame in
  the unread field ``old_indices``). Set ``--fold-block`` so that a block spans more than the trajectory's
  correlation time;
- files ase reads: consecutive frames of the file (a folder's ``train.xyz`` then ``test.xyz``). A file of several
  molecules or of independent configurations has no time correlation to keep apart; its blocks are then simply
  contiguous chunks (mostly one molecule each when the file lists molecule by molecule).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from workbench.domains.atomistic import plots
from workbench.domains.atomistic.frames import check_elements, collate, predict, to_graphs
from workbench.domains.atomistic.readers import (
    ASE_SUFFIXES,
    BadFrames,
    LabelledSet,
    is_sgdml,
    read_ase_set,
    read_rmd17,
    read_sgdml,
)
from workbench.domains.atomistic.trajectory import FRAME_SPLITS, FrameSplit, frames_beyond_gap
from workbench.domains.atomistic.units import EV_PER_ENERGY_UNIT
from workbench.models.potentials import atomic_numbers_of, set_atomic_energies

from workbench.core import resampled_metrics
from workbench.core.errors import UserError
from workbench.core.options import Option
from workbench.core.records import SkipReport
from workbench.core.registry import tasks
from workbench.core.task import Evaluation, Task, TaskData, held_out_groups

log = logging.getLogger(__name__)

EMBEDDED = Path(__file__).parent / "embedded" / "rmd17"
_ELEMENT_NUMBERS = {"H": 1, "C": 6, "N": 7, "O": 8, "F": 9, "P": 15, "S": 16, "Cl": 17}


def fit_atomic_energies(model: nn.Module, graphs: Sequence[Any], prior_ev: Mapping[int, float]) -> dict[int, float]:
    """E0 per element [eV]: ``prior + Δ``, Δ the least-squares fit of ``E_ref − E_interaction(model) − Σ prior``.

    ``graphs`` are labelled MACE graphs. Δ is the minimum-norm solution over element counts, so when the
    frames share one composition (a single rMD17 molecule, where only the sum over the molecule is
    determined) the E0s stay as close as possible to the prior — the isolated-atom energies of the data's
    level of theory when its card gives them. Elements absent from ``graphs`` keep their prior.
    """
    zs = atomic_numbers_of(model)
    e0_now = model.atomic_energies_fn.atomic_energies.detach().cpu().numpy().reshape(-1)
    prior = np.array([prior_ev.get(z, float(e0)) for z, e0 in zip(zs, e0_now)])
    counts = np.stack([g["node_attrs"].sum(dim=0).numpy() for g in graphs])  # one-hot rows in the model's z order
    predicted, _ = predict(model, graphs)
    reference = np.array([float(g.energy) for g in graphs])
    residual = reference - (predicted - counts @ e0_now) - counts @ prior
    present = counts.sum(axis=0) > 0
    correction = np.zeros(len(zs))
    correction[present] = np.linalg.lstsq(counts[:, present], residual, rcond=None)[0]
    return {z: float(e) for z, e in zip(zs, prior + correction)}


#: ``--energy-loss`` values: the energy error per atom (MACE's ``WeightedEnergyForcesLoss``) or in total.
ENERGY_LOSSES = ("per-atom", "total")


def energy_forces_loss(ref: Any, pred: Mapping[str, torch.Tensor], energy_weight: float, forces_weight: float,
                       energy_loss: str = "per-atom") -> torch.Tensor:  # fmt: skip
    """MACE's ``WeightedEnergyForcesLoss`` (module doc) of a batch ``ref`` and a potential's output ``pred``: each
    graph's and each atom's terms weighted by the graph's ``weight`` and its label weights, then averaged;
    ``energy_loss`` "total" squares the total energy's error instead of the per-atom one.

    Shapes: ``pred["energy"] (n_graphs,)`` [eV], ``pred["forces"] (n_atoms, 3)`` [eV/Å] -> () [eV²].
    """
    n_atoms = ref.ptr[1:] - ref.ptr[:-1]
    per = n_atoms if energy_loss == "per-atom" else torch.ones_like(n_atoms)
    energy = ref.weight * ref.energy_weight * torch.square((ref["energy"] - pred["energy"]) / per)
    per_atom_weight = torch.repeat_interleave(ref.weight * ref.forces_weight, n_atoms).unsqueeze(-1)
    forces = per_atom_weight * torch.square(ref["forces"] - pred["forces"])
    return energy_weight * torch.mean(energy) + forces_weight * torch.mean(forces)


def read_e0s_file(path: str | Path, needed: Sequence[int]) -> dict[int, float]:
    """E0s [eV] from a JSON object keyed by element symbol or atomic number; all ``needed`` must be there."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such E0s file (give --e0s fit, or a JSON file of isolated-atom energies in eV)")
    try:
        content = json.loads(path.read_text())
        e0s = {(_ELEMENT_NUMBERS[k] if k in _ELEMENT_NUMBERS else int(k)): float(v) for k, v in content.items()}
    except (json.JSONDecodeError, ValueError, AttributeError) as error:
        raise UserError(f"{path}: expected a JSON object {{element: E0 in eV}} ({error})") from None
    missing = [z for z in needed if z not in e0s]
    if missing:
        raise UserError(f"{path}: E0s are missing for atomic number(s) {missing}; add them or use --e0s fit")
    return e0s


def _npz_layout(path: Path) -> str:
    """"sgdml" or "rmd17": which published layout the npz at ``path`` has (by its fields)."""
    try:
        with np.load(path, allow_pickle=False) as content:
            fields = set(content.files)
    except Exception as error:
        raise UserError(f"{path}: not a readable npz file ({error})") from None
    if is_sgdml(dict.fromkeys(fields)):
        return "sgdml"
    if "nuclear_charges" in fields:
        return "rmd17"
    raise UserError(
        f"{path}: fields {sorted(fields)} are neither rMD17's (nuclear_charges, coords, energies, forces) nor "
        "sGDML's (R, E, F, z)"
    )


@tasks.register
class Rmd17(Task):
    """rMD17-style fine-tuning of a MACE foundation potential (energies and forces)."""

    name = "rmd17"
    description = "Fine-tune a MACE foundation potential (GFN2-xTB) on PBE/def2-SVP frames of a molecule, rMD17 layout"
    card = "rmd17-embedded"
    reads = ("rmd17", "sgdml", "ase-frames")
    requires = ("e3nn", "ase")  # mace-torch: the mace model's (the default); sevenn: the sevennet models'
    extra = "atomistic"
    default_model = "mace"
    default_method = "elora"
    #: mace-torch's LoRA where mace-torch is installed (it adapts MACE only; SevenNet's environment has no mace-torch)
    baselines = ("full", "readout", *(("mace-lora",) if importlib.util.find_spec("mace") else ()))
    capabilities = frozenset({"folds"})
    group_kind = "trajectory block"
    item_kind = "frame"
    metrics = (
        "forces_mae_mev_per_a",
        "forces_rmse_mev_per_a",
        "energy_mae_mev",
        "energy_rmse_mev",
        "energy_mae_mev_per_atom",
    )
    lower_is_better = frozenset(metrics)  # all of them are errors
    defaults = {"epochs": 40, "batch_size": 5, "train_size": 50, "patience": 15}
    precisions = ("float64", "float32")  # MACE-OFF trains in float64; float32 is MACE-MP's and faster on GPUs
    examples = (
        "workbench adapt --domain rmd17                          # ELoRA + baselines on the embedded DFT data",
        "workbench adapt --domain rmd17 --data ~/rmd17 --molecule aspirin --model MACE-OFF23_medium.model "
        "--trust-checkpoint",
        "workbench evaluate --run runs/x --data ~/rmd17/npz_data/rmd17_ethanol.npz",
        "workbench adapt --domain rmd17 --data ~/md17/md17_ethanol.npz          # sGDML npz (MD17, MD22), kcal/mol",
        "workbench data check rmd17 --data frames.db --energy-key energy --units kcal/mol   # ase .db / .traj / extxyz",
        "workbench data generate rmd17 --out my_rmd17 --molecules ethanol --frames 20 --level dft",
    )
    options = (
        Option("molecule", str, "ethanol", "molecule of the rMD17 folder to adapt to"),
        Option("split", int, 1, "which rMD17 split (index_{train,test}_0K.csv, K = 1..5)"),
        Option(
            "fold_block",
            int,
            40,
            "frames per trajectory block, the group a fold of workbench compare holds out whole (consecutive frames "
            "in the file's order)",
        ),
        Option(
            "fold_gap",
            int,
            0,
            "training frames left out on each side of a held-out test block in workbench compare "
            "(a purge: at least the trajectory's correlation time, 20 frames = 200 fs on the embedded data)",
        ),
        Option("frame_split", str, "auto", "how to split frames that come without a train/test split (an sGDML npz, an "
               "rMD17 npz without its splits/ folder, one file ase reads): blocks (contiguous blocks in time order, "
               "training frames near a test frame purged), random (optimistic on a trajectory: near-duplicate "
               "neighbouring frames), or auto (blocks for time-ordered frames: npz trajectories, ase frames with a "
               "time or step field; random for others)", choices=FRAME_SPLITS),  # fmt: skip
        Option("frame_block", int, 0, "frames per block of --frame-split blocks, blocks alternating train and test "
               "(0: half the frames: the first half trains, the second tests)"),  # fmt: skip
        Option("frame_gap", int, -1, "training frames left out on each side of a test block with --frame-split blocks "
               "(a purge: at least the trajectory's correlation time, a few hundred frames at MD17's 0.5 fs; -1: 20 "
               "frames, 200 fs on the embedded data, at most a quarter of a block)"),  # fmt: skip
        Option(
            "units",
            str,
            "auto",
            "energy unit of the data's energies and forces (forces in unit/Å), for sGDML npz and files ase reads: "
            "auto is the file's own statement, else kcal/mol for sGDML npz and eV for ase files; a unit given here "
            "overrides the file and the plausibility check of the force magnitudes",
            choices=("auto", *EV_PER_ENERGY_UNIT),
        ),
        Option(
            "energy_key",
            str,
            "",
            "name of the energy label in an extxyz / .db / .traj file (default: the calculator's energy, then "
            "REF_energy, then a database row's data 'energy')",
        ),
        Option(
            "forces_key",
            str,
            "",
            "name of the forces label in an extxyz / .db / .traj file (default: the calculator's forces, then "
            "REF_forces, then a database row's data 'forces')",
        ),
        Option(
            "e0s",
            str,
            "fit",
            "isolated-atom energies E0 at the new level of theory: 'fit' (the data "
            "card's isolated-atom energies corrected by least squares on the training frames) or a JSON "
            "file {element: eV} used as is",
        ),
        Option("energy_weight", float, 1.0, "weight of the energy error in the loss"),
        Option("energy_loss", str, "per-atom", "the energy error the loss squares: per-atom (MACE's) or total (the "
               "ELoRA authors')", choices=ENERGY_LOSSES),
        Option("forces_weight", float, 1000.0, "weight of the force error in the loss"),
        Option(
            "backend",
            str,
            "e3nn",
            "tensor products: e3nn, or cueq (cuEquivariance: CUDA kernels on a GPU, its PyTorch fallback on a CPU; "
            "the cueq extra)",
            choices=("e3nn", "cueq"),
        ),
    )
    generate_options = (
        Option("molecules", str, "", "comma-separated molecules (default: ethanol; for --corpus the G2 set)"),
        Option("frames", int, 20, "frames per molecule"),
        Option("level", str, "dft", "labels: PBE/def2-SVP or GFN2-xTB", choices=("dft", "xtb")),
        Option("temperature", float, 500.0, "MD temperature [K]"),
        Option("corpus", bool, False, "write the GFN2-xTB pretraining corpus (one extxyz file) instead of target data"),
    )

    def __init__(self, **options: Any):
        super().__init__(**options)
        if self.config["fold_block"] < 1:
            raise UserError(f"--fold-block must be at least 1 frame, got {self.config['fold_block']}")
        if self.config["fold_gap"] < 0:
            raise UserError(f"--fold-gap must be 0 or more frames, got {self.config['fold_gap']}")
        FrameSplit(self.config["frame_split"], self.config["frame_block"], self.config["frame_gap"])  # checks them

    # -- data and model --------------------------------------------------------------------------
    def load_model(self, source: str | Path | None, trust_checkpoint: bool = False) -> nn.Module:
        model = super().load_model(source, trust_checkpoint)
        if self.config["backend"] != "cueq":
            return model
        from workbench.models.mace import to_cueq

        return to_cueq(model)

    def read(self, data: str | Path | None, seed: int = 0) -> LabelledSet:
        """Read labelled frames: the embedded default, an rMD17 folder or npz, an sGDML npz, or a file ase reads
        (``.xyz``, ``.extxyz``, ``.db``, ``.traj``; a folder with ``train.xyz`` + ``test.xyz``). Records are frames;
        ``self.skipped`` holds the bad ones and counts every frame looked at."""
        self.skipped = SkipReport()
        bad = BadFrames(self.skipped, self.config["on_bad_record"])
        units, keys = self.config["units"], {k: self.config[k] for k in ("energy_key", "forces_key")}
        split = FrameSplit(self.config["frame_split"], self.config["frame_block"], self.config["frame_gap"], seed)
        if data is None:
            raw = read_rmd17(EMBEDDED, self.config["molecule"], self.config["split"], card="rmd17-embedded", bad=bad)
        else:
            path = Path(data)
            if path.suffix.lower() in ASE_SUFFIXES or (path.is_dir() and (path / "train.xyz").is_file()):
                raw = read_ase_set(path, seed, units=units, bad=bad, split=split, **keys)
            elif path.suffix.lower() == ".npz" and path.is_file() and _npz_layout(path) == "sgdml":
                raw = read_sgdml(path, units=units, seed=seed, bad=bad, split=split)
            else:
                if units not in ("auto", "kcal/mol"):
                    raise UserError(f"{path}: rMD17 files are in kcal/mol as published; --units {units} does not apply")
                raw = read_rmd17(path, self.config["molecule"], self.config["split"], bad=bad, frame_split=split)
        for note in raw.notes:
            log.info("%s: %s", raw.source, note)
        return raw

    def default_data(self, seed: int) -> Path:
        """The embedded rMD17 folder (every molecule's frames and the splits)."""
        return EMBEDDED

    def split_groups(self, raw: LabelledSet) -> list[str]:
        """The trajectory blocks of ``raw``: ``block<k>`` holds frames ``k·B`` to ``(k+1)·B − 1`` (B =
        ``--fold-block``), in block order."""
        return [f"block{k}" for k in range(-(-len(raw.frames) // self.config["fold_block"]))]

    def hold_out(self, raw: LabelledSet, split: Mapping[str, Sequence[str]]) -> LabelledSet:
        """``raw`` with the publisher's split replaced by blocks: the frames of ``split["test"]`` blocks are the test
        split, those of ``split["val"]`` blocks the validation frames (when it names none, validation frames are
        drawn from the training blocks), and every other block's frames the training split. Training frames at most
        ``--fold-gap`` frames from a test frame are left out (a purge between what is trained on and what is scored:
        frames closer in time than the correlation time are near copies); validation blocks are kept whole (they
        choose the epoch for every method alike, and a purge could empty them)."""
        parts = held_out_groups(self.split_groups(raw), split, raw.source, self.group_kind)
        block = np.arange(len(raw.frames)) // self.config["fold_block"]

        def frames_of(name: str) -> np.ndarray:
            return np.flatnonzero(np.isin(block, [int(group.removeprefix("block")) for group in parts[name]]))

        test = frames_of("test")
        train = np.intersect1d(frames_of("train"), frames_beyond_gap(len(raw.frames), test, self.config["fold_gap"]))
        val = frames_of("val") if parts["val"] else None
        record = {"kind": "fold blocks", **{f"{name}_frames": self.config[f"fold_{name}"] for name in ("block", "gap")}}
        return dataclasses.replace(raw, train_indices=train, test_indices=test, val_indices=val, split=record)

    def prepare(
        self, model: nn.Module, raw: LabelledSet, train_size: int, val_size: int, seed: int
    ) -> tuple[TaskData, dict[str, Any]]:
        """``train_size`` training frames drawn (seeded) from the training split, and ``val_size`` validation frames
        drawn from the rest of it, or, after `hold_out` with validation blocks, from those blocks' frames (all of
        them when they hold fewer)."""
        check_elements(raw.frames, atomic_numbers_of(model), raw.source)
        available = len(raw.train_indices)
        needed = train_size + (val_size if raw.val_indices is None else 0)
        if needed > available:
            also = f" plus {val_size} validation frames" if raw.val_indices is None else ""
            raise UserError(
                f"{raw.source}: the training split has {available} frames; --train-size {train_size}{also} "
                "do not fit (lower --train-size)"
            )
        rng = np.random.default_rng(seed)
        order = rng.permutation(raw.train_indices)
        train = [raw.frames[i] for i in order[:train_size]]
        if raw.val_indices is None:
            val = [raw.frames[i] for i in order[train_size : train_size + val_size]]
        else:
            val = [raw.frames[i] for i in rng.permutation(raw.val_indices)[:val_size]]
        test = [raw.frames[i] for i in raw.test_indices]
        zs, r_max = atomic_numbers_of(model), float(model.r_max)
        dtype = next(model.parameters()).dtype  # --precision: the samples in the model's dtype
        train_graphs = to_graphs(train, zs, r_max, dtype)
        if self.config["e0s"] == "fit":
            prior = {_ELEMENT_NUMBERS[k]: v for k, v in raw.isolated_atom_energies_ev.items()}
            e0s = fit_atomic_energies(model, train_graphs, prior)
        else:
            needed = sorted({int(z) for f in raw.frames for z in f.atomic_numbers})
            e0s = read_e0s_file(self.config["e0s"], needed)
            e0s = {z: e0s.get(z, float(e)) for z, e in zip(zs, model.atomic_energies_fn.atomic_energies.reshape(-1))}
        set_atomic_energies(model, e0s)
        summary = {
            "source": raw.source,
            "molecule": self.config["molecule"] if Path(raw.source).name.startswith("rmd17_") else None,
            "frames": {"train": len(train), "val": len(val), "test": len(test)},
            "split": {key: value for key, value in raw.split.items() if key != "caveat"},
            **({"caveat": raw.split["caveat"]} if "caveat" in raw.split else {}),
        }
        test_graphs = self._with_blocks(to_graphs(test, zs, r_max, dtype), raw.test_indices)
        data = TaskData(train_graphs, to_graphs(val, zs, r_max, dtype), test_graphs, raw.source, summary)
        return data, {"e0s_ev": {str(z): e for z, e in e0s.items()}}

    def refit(self, model: nn.Module, data: TaskData) -> dict[str, Any] | None:
        """With ``--e0s fit``, re-fit the E0s on the training frames after training.

        A force-dominated loss leaves the energy zero almost unconstrained, so training lets it drift;
        the same least-squares fit as before training (now starting from the current E0s) puts it back.
        """
        if self.config["e0s"] != "fit":
            return None
        current = atomic_numbers_of(model), model.atomic_energies_fn.atomic_energies.detach().reshape(-1).tolist()
        e0s = fit_atomic_energies(model, data.train, dict(zip(*current)))
        set_atomic_energies(model, e0s)
        return {"e0s_ev": {str(z): e for z, e in e0s.items()}}

    def test_samples(self, model: nn.Module, raw: LabelledSet) -> list[Any]:
        check_elements(raw.frames, atomic_numbers_of(model), raw.source)
        frames = [raw.frames[i] for i in raw.test_indices]
        graphs = to_graphs(frames, atomic_numbers_of(model), float(model.r_max), next(model.parameters()).dtype)
        return self._with_blocks(graphs, raw.test_indices)

    def _with_blocks(self, graphs: list[Any], indices: np.ndarray) -> list[Any]:
        """``graphs`` of the frames ``indices``, each told its trajectory block (``trajectory_block``, the group
        `evaluate` hands to `rescore`)."""
        for graph, index in zip(graphs, indices):
            graph.trajectory_block = torch.tensor([int(index) // self.config["fold_block"]])
        return graphs

    def restore(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        set_atomic_energies(model, {int(z): float(e) for z, e in state["e0s_ev"].items()})

    # -- training and scoring --------------------------------------------------------------------
    def collate(self, samples, device):
        return collate(samples, device)

    def loss(self, model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        out = model(batch.to_dict(), training=training, compute_force=True)
        return energy_forces_loss(batch, out, self.config["energy_weight"], self.config["forces_weight"],
                                  self.config["energy_loss"])

    def evaluate(self, model: nn.Module, samples: Sequence[Any], device) -> Evaluation:
        """Energy [meV, meV/atom] and force-component [meV/Å] errors on ``samples``; the frames are the items, grouped
        by trajectory block (each frame its own group where the samples do not say their block)."""
        energies, forces = predict(model, samples)
        ref_energies = np.array([float(g.energy) for g in samples])
        ref_forces = np.concatenate([g.forces.numpy() for g in samples])
        n_atoms = np.array([g.num_nodes for g in samples])
        forces = np.concatenate(forces)
        blocks = [getattr(g, "trajectory_block", None) for g in samples]
        groups = np.arange(len(samples)) if None in blocks else np.array([int(b) for b in blocks])
        de, df = (energies - ref_energies) * 1000, (forces - ref_forces) * 1000
        metrics = {
            "forces_mae_mev_per_a": float(np.abs(df).mean()),
            "forces_rmse_mev_per_a": float(np.sqrt((df**2).mean())),
            "energy_mae_mev": float(np.abs(de).mean()),
            "energy_rmse_mev": float(np.sqrt((de**2).mean())),
            "energy_mae_mev_per_atom": float(np.abs(de / n_atoms).mean()),
        }
        return Evaluation(
            metrics,
            {
                "energy_ref_ev": ref_energies,
                "energy_pred_ev": energies,
                "forces_ref_ev_per_a": ref_forces,
                "forces_pred_ev_per_a": forces,
                "forces_frame": np.repeat(np.arange(len(samples)), n_atoms),  # (n_atoms_total,) the frame of each atom
            },
            groups,
        )

    def rescore(self, predictions: Mapping[str, np.ndarray], counts: np.ndarray) -> dict[str, np.ndarray]:
        """`evaluate`'s errors over resampled frames; a frame drawn brings all its atoms' forces."""
        counts = np.asarray(counts, np.float64)
        frame = predictions["forces_frame"]
        n_frames = counts.shape[1]
        df = (predictions["forces_pred_ev_per_a"] - predictions["forces_ref_ev_per_a"]) * 1000
        n_atoms = np.bincount(frame, minlength=n_frames).astype(np.float64)
        components = counts @ (3 * n_atoms)
        de = (predictions["energy_pred_ev"] - predictions["energy_ref_ev"]) * 1000
        absolute, squared = (counts @ np.bincount(frame, v.sum(axis=1), n_frames) for v in (np.abs(df), df**2))
        with np.errstate(divide="ignore", invalid="ignore"):
            return {
                "forces_mae_mev_per_a": absolute / components,
                "forces_rmse_mev_per_a": np.sqrt(squared / components),
                "energy_mae_mev": resampled_metrics.mean(np.abs(de), counts),
                "energy_rmse_mev": np.sqrt(resampled_metrics.mean(de**2, counts)),
                "energy_mae_mev_per_atom": resampled_metrics.mean(np.abs(de / n_atoms), counts),
            }

    def figures(self, evaluations: Mapping[str, Evaluation], out_dir: Path) -> list[tuple[str, str]]:
        return [plots.parity(evaluations, out_dir)]

    # -- data commands ---------------------------------------------------------------------------
    def info(self, data: str | Path | None) -> str:
        raw = self.read(data)
        frames = raw.frames
        energies = np.array([f.energy_ev for f in frames])
        forces = np.concatenate([f.forces_ev_per_a for f in frames])
        counts = {}
        for z in frames[0].atomic_numbers:
            counts[int(z)] = counts.get(int(z), 0) + 1
        lines = [
            f"source: {raw.source}",
            *raw.notes,
            f"frames: {len(frames)} usable of {self.skipped.seen} read (train split {len(raw.train_indices)}, "
            f"test split {len(raw.test_indices)}); {len(self.split_groups(raw))} trajectory blocks of "
            f"{self.config['fold_block']} frames for grouped folds (--fold-block)",
            f"atoms per frame: {len(frames[0].atomic_numbers)} (first frame; atomic numbers {counts})",
            f"energy: mean {energies.mean():.4f} eV, spread (std) {energies.std() * 1000:.1f} meV",
            f"forces: mean |F| component {np.abs(forces).mean() * 1000:.1f} meV/Å, max {np.abs(forces).max():.3f} eV/Å",
        ]
        return "\n".join(lines)

    def pretrain(self, out: Path, **kwargs: Any) -> str:
        from workbench.domains.atomistic.pretrain import pretrain

        errors = pretrain(out, **kwargs)
        return f"wrote {out} (+ {Path(out).with_suffix('.json').name}); validation errors {errors}"

    def generate(
        self,
        out: Path,
        seed: int | None = None,
        molecules: str = "",
        frames: int = 20,
        level: str = "dft",
        temperature: float = 500.0,
        corpus: bool = False,
    ) -> str:
        """rMD17-layout target data (xTB MD at ``temperature`` K, labels at ``level``), or with ``corpus`` the xTB
        pretraining corpus; ``molecules`` comma-separated."""
        from workbench.domains.atomistic import generate

        seed = 2026 if seed is None else seed
        names = [name for name in molecules.split(",") if name] or None
        if corpus:
            generate.generate_foundation_corpus(out, molecules=names, frames_per_molecule=frames, seed=seed)
            return f"wrote the GFN2-xTB corpus to {out}"
        generate.generate_rmd17(out, names or ["ethanol"], frames, level=level, temperature_k=temperature, seed=seed)
        return f"wrote rMD17-layout data ({level}) to {out}"

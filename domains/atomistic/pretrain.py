"""How the shipped foundation model is made: a small MACE trained from scratch on the GFN2-xTB corpus.

Recipe (MACE's own from-scratch defaults where they fit a CPU): E0s from the corpus' isolated-atom
frames; interaction energies shifted by their mean per atom and scaled by the RMS force; loss
``1 · (ΔE/n)² + 100 · ΔF²``; Adam (AMSGrad) lr 0.01, batch 10, EMA 0.99, plateau schedule, early
stopping on a 5 % validation split.
"""

from __future__ import annotations

import logging
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mace import __version__ as mace_version
from mace.modules import WeightedEnergyForcesLoss, compute_avg_num_neighbors, compute_mean_rms_energy_forces
from workbench.domains.atomistic.frames import Frame, collate, predict, to_graphs
from workbench.domains.atomistic.readers import frame_from_atoms
from workbench.models.mace import FOUNDATION_ARCHITECTURE, build_mace, save_mace

from workbench.core.device import place, resolve
from workbench.core.errors import UserError
from workbench.core.trainer import Trainer, TrainSettings

log = logging.getLogger(__name__)

CORPUS = Path(__file__).parent / "embedded" / "g2_xtb_corpus.extxyz"


def read_corpus(path: Path) -> tuple[list[Frame], dict[int, float]]:
    """Molecular frames and E0 per element [eV] (frames with ``config_type = IsolatedAtom``, MACE's convention)."""
    import ase.io

    frames, e0s = [], {}
    for index, atoms in enumerate(ase.io.read(path, index=":")):
        if atoms.info.get("config_type") == "IsolatedAtom":
            e0s[int(atoms.numbers[0])] = float(atoms.info["REF_energy"])
        else:
            frames.append(frame_from_atoms(atoms, path, index))
    return frames, e0s


def pretrain(
    out: Path,
    corpus: Path = CORPUS,
    epochs: int = 100,
    seed: int = 0,
    device: str = "auto",
    quiet: bool = False,
    val_fraction: float = 0.05,
    batch_size: int = 10,
    learning_rate: float = 0.01,
) -> dict[str, Any]:
    """Train `FOUNDATION_ARCHITECTURE` on ``corpus``; write ``out`` (.safetensors + .json); return val errors."""
    out = Path(out)
    if out.suffix != ".safetensors":
        raise UserError(f"{out}: the checkpoint must end in .safetensors (its hyper-parameters go to {out.stem}.json)")
    device = resolve(device)
    frames, e0s = read_corpus(corpus)
    zs = FOUNDATION_ARCHITECTURE["atomic_numbers"]
    missing = [z for z in zs if z not in e0s]
    if missing:
        raise UserError(f"{corpus}: field 'config_type': no IsolatedAtom frame for atomic number(s) {missing}")
    graphs = to_graphs(frames, zs, FOUNDATION_ARCHITECTURE["r_max"])
    order = np.random.default_rng(seed).permutation(len(graphs))
    n_val = max(1, int(val_fraction * len(graphs)))
    train, val = [graphs[i] for i in order[n_val:]], [graphs[i] for i in order[:n_val]]

    hparams = _hyper_parameters(train, e0s, zs)
    torch.manual_seed(seed)
    model = place(build_mace(hparams), device)
    loss_fn = WeightedEnergyForcesLoss(energy_weight=1.0, forces_weight=100.0)

    def loss(m, batch, training):
        return loss_fn(ref=batch, pred=m(batch.to_dict(), training=training, compute_force=True))

    settings = TrainSettings(
        epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, seed=seed, patience=max(10, epochs // 5)
    )
    trainer = Trainer(model, loss, collate, train, val, settings, progress=not quiet, label="pretrain")
    history = trainer.fit()
    errors = _validation_errors(model, val, len(train))
    provenance = {
        "corpus": corpus.name,
        "epochs_run": len(history),
        "best_epoch": trainer.best["epoch"],
        "settings": {
            "epochs": epochs,
            "seed": seed,
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "energy_weight": 1.0,
            "forces_weight": 100.0,
            "val_fraction": val_fraction,
        },
        "errors": errors,
        "software": {
            "mace-torch": mace_version,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
        },
        "command": f"workbench pretrain --domain rmd17 --out {out.name} --epochs {epochs} --seed {seed}",
    }
    save_mace(model.cpu(), hparams, out, provenance)
    log.info("pretrained on %d frames: %s", len(train), errors)
    return errors


def _hyper_parameters(train: list, e0s: dict[int, float], zs) -> dict[str, Any]:
    """`FOUNDATION_ARCHITECTURE` plus what the training graphs give: E0s [eV] in ``zs`` order, the mean number of
    neighbours, and the interaction energy shift [eV/atom] and scale (RMS force [eV/Å]), MACE's statistics."""
    batches = [collate(train[i : i + 50], "cpu") for i in range(0, len(train), 50)]  # statistics: on the host
    atomic_energies = np.array([e0s[z] for z in zs])
    shift, scale = compute_mean_rms_energy_forces(batches, atomic_energies)
    return {
        **FOUNDATION_ARCHITECTURE,
        "atomic_energies": atomic_energies.tolist(),
        "avg_num_neighbors": float(compute_avg_num_neighbors(batches)),
        "atomic_inter_scale": float(np.asarray(scale).reshape(-1)[0]),
        "atomic_inter_shift": float(np.asarray(shift).reshape(-1)[0]),
    }


def _validation_errors(model: torch.nn.Module, val: list, n_train: int) -> dict[str, Any]:
    """Energy MAE [meV/atom] and force MAE [meV/Å] of ``model`` on the validation graphs, with both split sizes."""
    energies, forces = predict(model, val)
    de = (energies - np.array([float(g.energy) for g in val])) * 1000
    df = (np.concatenate(forces) - np.concatenate([g.forces.numpy() for g in val])) * 1000
    return {
        "val_energy_mae_mev_per_atom": float(np.mean(np.abs(de) / np.array([g.num_nodes for g in val]))),
        "val_forces_mae_mev_per_a": float(np.abs(df).mean()),
        "val_frames": len(val),
        "train_frames": n_train,
    }

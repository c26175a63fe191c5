"""Seconds per epoch: ``workbench adapt --method full`` vs ``mace_run_train`` fine-tuning the same model.

Both fine-tune every parameter of the shipped foundation model, in this process, on the same training
and validation frames of the embedded DFT data, with the same batch size, loss weights (energy 1,
forces 1000), float64, AMSGrad, EMA and a validation pass every epoch. The time of one epoch is
``(wall(E2 epochs) − wall(E1 epochs)) / (E2 − E1)``, so start-up work (reading, E0s, neighbour lists,
final evaluations, writing models) cancels; the two tools alternate, ``--repeats`` times each.

    python benchmarks/speed_vs_mace_run_train.py                 # 50 training frames, 2 and 17 epochs
    python benchmarks/speed_vs_mace_run_train.py --train-size 200 --repeats 3

Target: ratio workbench / mace_run_train <= 1.0.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import ase.io
import numpy as np
import torch
from ase import Atoms
from workbench.domains.atomistic.task import Rmd17
from workbench.models.mace import load_mace

import workbench


def write_extxyz(frames, path: Path) -> None:
    structures = []
    for frame in frames:
        atoms = Atoms(numbers=frame.atomic_numbers, positions=frame.positions_a)
        atoms.info["REF_energy"] = frame.energy_ev
        atoms.arrays["REF_forces"] = frame.forces_ev_per_a
        structures.append(atoms)
    ase.io.write(path, structures, format="extxyz")


def time_workbench(epochs: int, args, scratch: Path, tag: str) -> float:
    start = time.perf_counter()
    workbench.adapt(
        domain="rmd17",
        method="full",
        baselines=[],
        model=args.model,
        train_size=args.train_size,
        val_size=args.val_size,
        epochs=epochs,
        patience=10_000,
        batch_size=args.batch_size,
        seed=0,
        device="cpu",
        out=str(scratch / f"workbench-{tag}-{epochs}"),
        quiet=True,
    )
    return time.perf_counter() - start


def time_mace(epochs: int, args, scratch: Path, tag: str) -> float:
    from mace.cli.run_train import run
    from mace.tools import build_default_arg_parser

    work = scratch / f"mace-{tag}-{epochs}"
    argv = [
        "--name",
        "bench",
        "--work_dir",
        str(work),
        "--foundation_model",
        str(scratch / "foundation.model"),
        "--multiheads_finetuning",
        "False",
        "--train_file",
        str(scratch / "train.xyz"),
        "--valid_file",
        str(scratch / "valid.xyz"),
        "--energy_key",
        "REF_energy",
        "--forces_key",
        "REF_forces",
        "--E0s",
        "foundation",
        "--loss",
        "weighted",
        "--energy_weight",
        "1.0",
        "--forces_weight",
        "1000.0",
        "--batch_size",
        str(args.batch_size),
        "--valid_batch_size",
        str(args.batch_size),
        "--max_num_epochs",
        str(epochs),
        "--lr",
        "1e-3",
        "--amsgrad",
        "--ema",
        "--ema_decay",
        "0.99",
        "--patience",
        "10000",
        "--eval_interval",
        "1",
        "--default_dtype",
        "float64",
        "--device",
        "cpu",
        "--seed",
        "0",
        "--num_workers",
        "0",
        "--log_level",
        "WARNING",
    ]
    start = time.perf_counter()
    run(build_default_arg_parser().parse_args(argv))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-size", type=int, default=50)
    parser.add_argument("--val-size", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=5)
    parser.add_argument("--epochs", type=int, nargs=2, default=[2, 17], metavar=("E1", "E2"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", help="workbench MACE checkpoint (default: the shipped foundation model)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        # The frames workbench selects (Rmd17.prepare: a seeded permutation of the training split).
        raw = Rmd17().read(None)
        order = np.random.default_rng(0).permutation(raw.train_indices)
        write_extxyz([raw.frames[i] for i in order[: args.train_size]], scratch / "train.xyz")
        write_extxyz(
            [raw.frames[i] for i in order[args.train_size : args.train_size + args.val_size]], scratch / "valid.xyz"
        )
        torch.save(load_mace(args.model), scratch / "foundation.model")  # the same model as a MACE .model file

        per_epoch = {"workbench": [], "mace_run_train": []}
        e1, e2 = args.epochs
        for repeat in range(args.repeats):
            for name, timer in (("workbench", time_workbench), ("mace_run_train", time_mace)):
                short, long = timer(e1, args, scratch, str(repeat)), timer(e2, args, scratch, str(repeat))
                per_epoch[name].append((long - short) / (e2 - e1))
                print(f"repeat {repeat}: {name:15} {per_epoch[name][-1]:.3f} s/epoch", flush=True)

    rows = {name: np.array(values) for name, values in per_epoch.items()}
    print(
        f"\n{args.train_size} training frames, {args.val_size} validation frames, batch {args.batch_size}, "
        f"float64, {torch.get_num_threads()} threads; per-epoch time from {e2} − {e1} epochs"
    )
    print(f"{'tool':16}{'s/epoch (median)':>18}{'min':>8}{'max':>8}")
    for name, values in rows.items():
        print(f"{name:16}{np.median(values):18.3f}{values.min():8.3f}{values.max():8.3f}")
    paired = rows["workbench"] / rows["mace_run_train"]
    print(
        f"ratio workbench / mace_run_train per repeat: {', '.join(f'{r:.3f}' for r in paired)}; "
        f"median {np.median(paired):.3f} (target <= 1.0)"
    )


if __name__ == "__main__":
    main()

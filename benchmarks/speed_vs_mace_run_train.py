"""Seconds per epoch: ``workbench adapt --method full`` vs ``mace_run_train`` fine-tuning the same model.

Both fine-tune every parameter of the shipped foundation model, in this process, on the same training
and validation frames of the embedded DFT data, with the same batch size, loss weights (energy 1,
forces 1000), float64, AMSGrad, EMA, gradient clipping at 10 and a validation pass every epoch. The time
of one epoch is ``(time(E2 epochs) − time(E1 epochs)) / (E2 − E1)``, so start-up work (reading, E0s,
neighbour lists, final evaluations, writing models) cancels; each tool first runs once untimed (the first
call in a process pays imports and e3nn's code generation), then the two alternate, ``--repeats`` times
each, and the ratio is the median of the paired per-repeat ratios. Every time is taken twice: wall
seconds, and this process's CPU seconds, which a machine shared with other jobs disturbs far less
(with ``--threads 1`` they come close to the wall time of an idle machine).

Where the time goes: during every run the functions both tools share are wrapped with a clock, the
outermost wrapped call owning the time (a forward pass inside a validation counts as validation), and
each phase gets the same ``(E2 − E1)`` difference per epoch:

    collate      Batch.from_data_list, Data.to; the DataLoader's __next__ (mace); Trainer._epoch_batches
    forward      the MACE forward pass (energies, and forces by autograd with create_graph while training)
    loss         WeightedEnergyForcesLoss
    backward     loss.backward()
    clip         torch.nn.utils.clip_grad_norm_
    optimizer    Adam.step and Optimizer.zero_grad
    ema          the EMA update (workbench.core.ema / torch_ema)
    validation   the whole validation pass (Trainer.validation_loss / mace.tools.train.evaluate; mace
                 collates the validation set again every epoch and sets requires_grad=False on the
                 parameters meanwhile, the workbench collates it once)
    checkpoint   workbench: Trainer._state, the best-weights copy, save_checkpoint (every epoch);
                 mace: CheckpointHandler.save (only in epochs whose validation loss improves)
    logging      mace: MetricsLogger.log (a JSON line per step) and valid_err_log
    other        the rest of the epoch: the loops, the EMA swap around validation, loss.item(), schedulers

The clocks cost a few microseconds per wrapped call (tens per step), the same for both tools.

    python benchmarks/speed_vs_mace_run_train.py              # 50 training frames, 1 and 6 epochs, 3 repeats
    python benchmarks/speed_vs_mace_run_train.py --quick      # 20 frames, 1 and 3 epochs, 1 repeat (smoke test)
    python benchmarks/speed_vs_mace_run_train.py --threads 1  # on a busy machine: CPU seconds stay meaningful
    python benchmarks/speed_vs_mace_run_train.py --train-size 200 --repeats 5

Writes ``benchmarks/results/speed_vs_mace_run_train.json`` (``--json PATH`` elsewhere, ``--json ''`` not at
all). Target: ratio workbench / mace_run_train <= 0.9.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import logging
import os
import platform
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import ase.io
import numpy as np
import torch
from ase import Atoms
from workbench.domains.atomistic.task import Rmd17
from workbench.models.mace import load_mace

import workbench

RESULTS = Path(__file__).parent / "results" / "speed_vs_mace_run_train.json"
TARGET = 0.9
PHASES = ("collate", "forward", "loss", "backward", "clip", "optimizer", "ema", "validation", "checkpoint", "logging")


class PhaseClock:
    """Seconds spent in each of `PHASES`, from wrappers around the functions both tools call.

    A wrapped call made while another wrapped call is running is not timed on its own: the outermost
    owns the time, so phases never overlap and their sum is at most the wall time.
    """

    def __init__(self):
        self.reset()
        self._running = False

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)  # wall
        self.cpu_seconds = dict.fromkeys(PHASES, 0.0)  # this process's CPU time (all threads)

    def timed(self, phase: str, function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if self._running:
                return function(*args, **kwargs)
            self._running = True
            start, cpu_start = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start
                self.cpu_seconds[phase] += time.process_time() - cpu_start
                self._running = False

        return wrapper

    @contextmanager
    def installed(self) -> Iterator["PhaseClock"]:
        """Wrap the functions of `targets` for the duration of the block."""
        saved = []
        for owner, name, phase in targets():
            original = owner.__dict__[name]
            if isinstance(original, classmethod):
                replacement = classmethod(self.timed(phase, original.__func__))
            else:
                replacement = self.timed(phase, original)
            saved.append((owner, name, original))
            setattr(owner, name, replacement)
        try:
            yield self
        finally:
            for owner, name, original in reversed(saved):
                setattr(owner, name, original)


def targets() -> list[tuple[Any, str, str]]:
    """(owner, attribute, phase) of every wrapped function."""
    import torch_ema
    from mace.modules import WeightedEnergyForcesLoss
    from mace.modules.models import MACE, ScaleShiftMACE
    from mace.tools.checkpoint import CheckpointHandler
    from mace.tools.torch_geometric.batch import Batch
    from mace.tools.torch_geometric.data import Data
    from mace.tools.utils import MetricsLogger
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    import workbench.core.ema
    import workbench.core.trainer
    from workbench.core.trainer import Trainer

    mace_train = importlib.import_module("mace.tools.train")  # `mace.tools.train` is also a function's name
    return [
        (Batch, "from_data_list", "collate"),
        (Data, "to", "collate"),
        (_BaseDataLoaderIter, "__next__", "collate"),
        (Trainer, "_epoch_batches", "collate"),
        (MACE, "forward", "forward"),
        (ScaleShiftMACE, "forward", "forward"),
        (WeightedEnergyForcesLoss, "forward", "loss"),
        (torch.Tensor, "backward", "backward"),
        (torch.nn.utils, "clip_grad_norm_", "clip"),
        (torch.optim.Adam, "step", "optimizer"),
        (torch.optim.Optimizer, "zero_grad", "optimizer"),
        (workbench.core.ema.ExponentialMovingAverage, "update", "ema"),
        (torch_ema.ExponentialMovingAverage, "update", "ema"),
        (Trainer, "validation_loss", "validation"),
        (mace_train, "evaluate", "validation"),
        (Trainer, "_state", "checkpoint"),
        (Trainer, "_trainable_values", "checkpoint"),
        (workbench.core.trainer, "save_checkpoint", "checkpoint"),
        (CheckpointHandler, "save", "checkpoint"),
        (MetricsLogger, "log", "logging"),
        (mace_train, "valid_err_log", "logging"),
    ]


def write_extxyz(frames, path: Path) -> None:
    structures = []
    for frame in frames:
        atoms = Atoms(numbers=frame.atomic_numbers, positions=frame.positions_a)
        atoms.info["REF_energy"] = frame.energy_ev
        atoms.arrays["REF_forces"] = frame.forces_ev_per_a
        structures.append(atoms)
    ase.io.write(path, structures, format="extxyz")


def run_workbench(epochs: int, args, scratch: Path, tag: str) -> None:
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


def run_mace(epochs: int, args, scratch: Path, tag: str) -> None:
    from mace.cli.run_train import run
    from mace.tools import build_default_arg_parser

    work = scratch / f"mace-{tag}-{epochs}"
    argv = [
        "--name", "bench",
        "--work_dir", str(work),
        "--foundation_model", str(scratch / "foundation.model"),
        "--multiheads_finetuning", "False",
        "--train_file", str(scratch / "train.xyz"),
        "--valid_file", str(scratch / "valid.xyz"),
        "--energy_key", "REF_energy",
        "--forces_key", "REF_forces",
        "--E0s", "foundation",
        "--loss", "weighted",
        "--energy_weight", "1.0",
        "--forces_weight", "1000.0",
        "--batch_size", str(args.batch_size),
        "--valid_batch_size", str(args.batch_size),
        "--max_num_epochs", str(epochs),
        "--lr", "1e-3",
        "--amsgrad",
        "--ema",
        "--ema_decay", "0.99",
        "--clip_grad", "10.0",
        "--patience", "10000",
        "--eval_interval", "1",
        "--default_dtype", "float64",
        "--device", "cpu",
        "--seed", "0",
        "--num_workers", "0",
        "--log_level", "WARNING",
    ]  # fmt: skip
    run(build_default_arg_parser().parse_args(argv))


TOOLS = {"workbench": run_workbench, "mace_run_train": run_mace}


CLOCKS = {"wall": "wall", "cpu": "CPU (this process, all threads)"}


def timed_run(clock: PhaseClock, run: Callable, epochs: int, args, scratch: Path, tag: str) -> dict[str, Any]:
    """Wall and CPU seconds of one run, and of each phase in it."""
    clock.reset()
    start, cpu_start = time.perf_counter(), time.process_time()
    run(epochs, args, scratch, tag)
    return {
        "wall": time.perf_counter() - start,
        "cpu": time.process_time() - cpu_start,
        "wall_phases": dict(clock.seconds),
        "cpu_phases": dict(clock.cpu_seconds),
    }


def per_epoch(short: dict[str, Any], long: dict[str, Any], epochs: int) -> dict[str, Any]:
    """``(long − short) / epochs`` of every total and phase of two `timed_run` results."""
    result = {}
    for kind in CLOCKS:
        result[kind] = (long[kind] - short[kind]) / epochs
        phases = {p: (long[f"{kind}_phases"][p] - short[f"{kind}_phases"][p]) / epochs for p in PHASES}
        result[f"{kind}_phases"] = {**phases, "other": result[kind] - sum(phases.values())}
    return result


def summary(repeats: dict[str, list[dict[str, Any]]], kind: str) -> dict[str, Any]:
    """Medians over repeats of one clock's per-epoch totals and phases, and the paired ratios."""
    totals = {name: np.array([r[kind] for r in runs]) for name, runs in repeats.items()}
    paired = totals["workbench"] / totals["mace_run_train"]
    return {
        "seconds_per_epoch": {name: [float(v) for v in values] for name, values in totals.items()},
        "seconds_per_epoch_median": {name: float(np.median(values)) for name, values in totals.items()},
        "phases_median": {
            name: {p: float(np.median([r[f"{kind}_phases"][p] for r in runs])) for p in (*PHASES, "other")}
            for name, runs in repeats.items()
        },
        "ratio_per_repeat": [float(r) for r in paired],
        "ratio_median": float(np.median(paired)),
    }


def breakdown_table(result: dict[str, Any]) -> list[str]:
    """The per-epoch table of one clock: a row per phase (medians over repeats), 'other', the total, shares."""
    names = list(result["seconds_per_epoch_median"])
    totals = result["seconds_per_epoch_median"]
    lines = [
        f"{'phase [s/epoch]':16}" + "".join(f"{name:>16}" for name in names) + f"{'ratio':>8}"
        + "".join(f"{'% ' + name[:9]:>12}" for name in names)
    ]  # fmt: skip
    rows = [(phase, [result["phases_median"][name][phase] for name in names]) for phase in (*PHASES, "other")]
    rows.append(("total", [totals[name] for name in names]))
    for phase, values in rows:
        ratio = f"{values[0] / values[1]:8.2f}" if abs(values[1]) > 1e-4 else f"{'-':>8}"
        shares = "".join(f"{100 * v / totals[name]:12.1f}" for v, name in zip(values, names))
        lines.append(f"{phase:16}" + "".join(f"{v:16.4f}" for v in values) + ratio + shares)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-size", type=int, default=50, help="training frames (default 50)")
    parser.add_argument("--val-size", type=int, default=10, help="validation frames (default 10)")
    parser.add_argument("--batch-size", type=int, default=5, help="frames per batch, both tools (default 5)")
    parser.add_argument(
        "--epochs", type=int, nargs=2, default=[1, 6], metavar=("E1", "E2"), help="the two run lengths (default 1 6)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two tools (default 3)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own)")
    parser.add_argument("--model", help="workbench MACE checkpoint (default: the shipped foundation model)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 20 frames, 1 and 3 epochs, 1 repeat")
    parser.add_argument("--json", default=str(RESULTS), help=f"where to write the results (default {RESULTS}; '' none)")
    args = parser.parse_args()
    if args.quick:
        args.train_size, args.epochs, args.repeats = 20, [1, 3], 1
    e1, e2 = args.epochs
    if not 0 < e1 < e2:
        parser.error(f"--epochs E1 E2 needs 0 < E1 < E2, got {e1} {e2}")
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    repeats: dict[str, list[dict[str, Any]]] = {name: [] for name in TOOLS}
    clock = PhaseClock()
    with tempfile.TemporaryDirectory() as folder, clock.installed():
        scratch = Path(folder)
        # The frames workbench selects (Rmd17.prepare: a seeded permutation of the training split).
        raw = Rmd17().read(None)
        order = np.random.default_rng(0).permutation(raw.train_indices)
        write_extxyz([raw.frames[i] for i in order[: args.train_size]], scratch / "train.xyz")
        write_extxyz(
            [raw.frames[i] for i in order[args.train_size : args.train_size + args.val_size]], scratch / "valid.xyz"
        )
        torch.save(load_mace(args.model), scratch / "foundation.model")  # the same model as a MACE .model file
        for run in TOOLS.values():  # untimed: first calls pay one-time costs (imports, e3nn code generation)
            run(e1, args, scratch, "warm-up")
        for repeat in range(args.repeats):
            for name, run in TOOLS.items():
                short, long = (timed_run(clock, run, epochs, args, scratch, str(repeat)) for epochs in (e1, e2))
                repeats[name].append(per_epoch(short, long, e2 - e1))
                last = repeats[name][-1]
                print(f"repeat {repeat}: {name:15} {last['wall']:.3f} s/epoch wall, {last['cpu']:.3f} CPU", flush=True)

    results = {kind: summary(repeats, kind) for kind in CLOCKS}
    print(
        f"\n{args.train_size} training frames, {args.val_size} validation frames, batch {args.batch_size}, "
        f"float64, {torch.get_num_threads()} threads; per-epoch time from {e2} − {e1} epochs, {args.repeats} repeats"
    )
    for kind, label in CLOCKS.items():
        result = results[kind]
        print(f"\n{label} seconds per epoch (medians; 'other' = the total less the phases):")
        print("\n".join(breakdown_table(result)))
        print(
            f"ratio workbench / mace_run_train per repeat: {', '.join(f'{r:.3f}' for r in result['ratio_per_repeat'])}"
            f"; median {result['ratio_median']:.3f} (target <= {TARGET})"
        )
    if args.json:
        import mace

        content = {
            "benchmark": "speed_vs_mace_run_train",
            "settings": {
                "train_size": args.train_size,
                "val_size": args.val_size,
                "batch_size": args.batch_size,
                "epochs": [e1, e2],
                "repeats": args.repeats,
                "threads": torch.get_num_threads(),
                "dtype": "float64",
                "model": args.model or "shipped foundation model",
            },
            # Other jobs' load: above the core count, wall times mostly measure waiting; read the CPU seconds.
            "machine": {
                "cpu_count": os.cpu_count(),
                "load_average_1min": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
            },
            "versions": {"torch": torch.__version__, "mace": mace.__version__, "python": platform.python_version()},
            "target": TARGET,
            **results,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(content, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

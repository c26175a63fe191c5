"""The GPU check: one script, run where a GPU is at hand, each figure measured side by side in this process.

1. MACE + ELoRA training step (forward, forces by autograd, backward, Adam), cuEquivariance over e3nn, in float32
   and float64: the shipped MACE (``--backend cueq``, `workbench.models.mace.to_cueq`), a batch of embedded
   ethanol frames; the two steps alternate, median of ``--rounds``.
2. Entropic partial OT (`workbench.adaptation.warmpot.partial_plan`), GPU over CPU, at n = 8192 (float32): the
   partial-DA features, a fixed number of iterations on both (``tol = 0``), so the ratio is per iteration; the
   plans' largest difference is printed beside it.
3. Training memory of H-Tuning and full fine-tuning in the run's own figures (``training_step_bytes``: on a GPU
   ``torch.cuda.max_memory_allocated`` over training steps) at batch 32: ``workbench adapt --domain ptbxl``.
4. Seconds per epoch of each domain's default method on its embedded data (2 epochs, no baselines), in float32
   and, where the task offers it, bf16 (``--precision``).

Prints one table per part and writes ``benchmarks/results/gpu_check.json``. ``--smoke`` runs the same code on the
CPU with tiny inputs (a small MACE, n = 256, batch 4, two fast domains, 1 epoch) — the tests run it so that the
GPU run does not fail on a code path; its numbers mean nothing.

    python benchmarks/gpu_check.py                 # on one GPU: under 8 minutes
    python benchmarks/gpu_check.py --smoke --json /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from workbench.adaptation import elora
from workbench.adaptation.warmpot import partial_plan
from workbench.domains.atomistic.task import Rmd17
from workbench.domains.features.partial_da import make_partial_da
from workbench.models.mace import FOUNDATION_ARCHITECTURE, build_mace, load_mace, to_cueq

import workbench

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_check.json"
DOMAINS = ("rmd17", "ptbxl", "csbm", "features", "sleepedf", "motor-imagery", "physio", "medvl")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step: Callable[[], Any], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    return time.perf_counter() - start


def small_mace() -> torch.nn.Module:
    """A MACE of the foundation's architecture with 8 channels (the smoke run)."""
    torch.manual_seed(0)
    return build_mace(
        dict(
            FOUNDATION_ARCHITECTURE,
            hidden_irreps="8x0e + 8x1o",
            atomic_energies=[-13.6, -1029.0, -1485.0, -2042.0],
            avg_num_neighbors=8.0,
            atomic_inter_scale=1.0,
            atomic_inter_shift=0.0,
        )
    )


def mace_step(device: torch.device, dtype: torch.dtype, smoke: bool, rounds: int, frames: int) -> dict[str, float]:
    """Seconds of one ELoRA training step on the e3nn and the cuEquivariance MACE (median over ``rounds``)."""
    base = (small_mace() if smoke else load_mace()).to(dtype)
    task = Rmd17()
    data, _ = task.prepare(base, task.read(None, 0), frames, 5, 0)
    batch = task.collate(data.train[:frames], device)
    models = {"e3nn": base, "cueq": to_cueq(base)}
    steps = {}
    for name, model in models.items():
        adapted = elora.apply(copy.deepcopy(model).to(device), rank=16, alpha=16.0)
        optimizer = torch.optim.Adam([p for p in adapted.parameters() if p.requires_grad], lr=1e-3)

        def step(adapted=adapted, optimizer=optimizer):
            optimizer.zero_grad(set_to_none=True)
            task.loss(adapted, batch, True).backward()
            optimizer.step()

        step()  # warm-up: kernel selection, autograd graph set-up
        steps[name] = step
    seconds = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            seconds[name].append(timed(step, device))
    e3nn, cueq = (statistics.median(seconds[name]) for name in ("e3nn", "cueq"))
    return {"e3nn_s": e3nn, "cueq_s": cueq, "cueq_over_e3nn": cueq / e3nn}


def partial_ot(device: torch.device, n: int, iterations: int) -> dict[str, float]:
    """Seconds of ``iterations`` entropic partial-OT iterations at ``n × n`` on ``device`` and on the CPU."""
    problem = make_partial_da(n_source=n, n_target=n, seed=0)
    xs = torch.as_tensor(problem.source_x, dtype=torch.float32)
    xt = torch.as_tensor(problem.target_x, dtype=torch.float32)
    plans, seconds = {}, {}
    for where in (torch.device("cpu"), device):
        cost = torch.cdist(xs.to(where), xt.to(where)) ** 2
        cost = cost / cost.max()
        a = torch.full((n,), 1.0 / n, device=where)

        def solve(cost=cost, a=a, where=where):
            plans[where.type] = partial_plan(cost, a, a, 0.5, reg=0.05, max_iter=iterations, tol=0.0)

        solve()  # warm-up
        seconds[where.type] = timed(solve, where)
    difference = float((plans["cpu"] - plans[device.type].cpu()).abs().max())
    return {
        "cpu_s": seconds["cpu"],
        "device_s": seconds[device.type],
        "cpu_over_device": seconds["cpu"] / seconds[device.type],
        "max_plan_difference": difference,
        "largest_plan_entry": float(plans["cpu"].max()),
    }


def htuning_memory(device: torch.device, batch_size: int, runs: Path, smoke: bool) -> dict[str, Any]:
    """``training_step_bytes`` of H-Tuning and of full fine-tuning in one ptbxl run [bytes]."""
    settings = dict(epochs=1, train_size=8, val_size=4) if smoke else dict(epochs=2)
    run = workbench.adapt(
        domain="ptbxl", method="htuning", baselines=["full"], batch_size=batch_size, device=device.type,
        out=str(runs / "ptbxl-memory"), quiet=True, **settings,
    )  # fmt: skip
    costs = run.metrics["costs"]
    full, htuning = costs["full"]["training_step_bytes"], costs["htuning"]["training_step_bytes"]
    return {"batch_size": batch_size, "full_bytes": full, "htuning_bytes": htuning, "full_over_htuning": full / htuning}


def epoch_seconds(device: torch.device, domains: tuple[str, ...], runs: Path, epochs: int) -> list[dict[str, Any]]:
    """Seconds per epoch of each domain's default method (2 epochs; smoke: 1), no baselines, per offered precision."""
    from workbench.registry import tasks

    rows = []
    for domain in domains:
        offered = tasks.get(domain).precisions
        for precision in [p for p in ("float32", "bf16") if p in offered] or [offered[0]]:
            start = time.perf_counter()
            run = workbench.adapt(
                domain=domain, baselines=[], device=device.type, precision=precision, quiet=True,
                out=str(runs / f"{domain}-{precision}"), epochs=epochs,
            )  # fmt: skip
            cost = run.metrics["costs"][run.metrics["method"]]
            rows.append(
                {
                    "domain": domain,
                    "method": run.metrics["method"],
                    "precision": precision,
                    "seconds_per_epoch": cost["seconds_per_epoch"],
                    "run_seconds": time.perf_counter() - start,
                }
            )
            print(f"  {domain:14s} {rows[-1]['method']:10s} {precision:8s} {cost['seconds_per_epoch']:8.2f} s/epoch")
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="the same code paths on the CPU, tiny inputs")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per MACE step (default 10; smoke 1)")
    parser.add_argument("--json", default=str(RESULTS))
    args = parser.parse_args(argv)
    smoke = args.smoke
    if not smoke and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device is visible to torch (use --smoke to try the code paths on the CPU)")
    device = torch.device("cpu" if smoke else "cuda")
    rounds = args.rounds or (1 if smoke else 10)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "smoke": smoke,
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every part: a part that fails leaves the earlier ones written
        out.write_text(json.dumps(results, indent=2) + "\n")

    print(f"device: {results['device']} (torch {results['torch']}){' — smoke run' if smoke else ''}")
    print("\nMACE + ELoRA training step, cueq / e3nn")
    results["mace_step"] = {}
    for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
        row = mace_step(device, dtype, smoke, rounds, frames=2 if smoke else 10)
        results["mace_step"][name] = row
        print(f"  {name}: e3nn {row['e3nn_s'] * 1e3:8.1f} ms  cueq {row['cueq_s'] * 1e3:8.1f} ms  "
              f"cueq/e3nn {row['cueq_over_e3nn']:.2f}×")  # fmt: skip
        save()
    n = 256 if smoke else 8192
    print(f"\nentropic partial OT, n = {n}, float32, fixed iterations")
    results["partial_ot"] = dict(n=n, **partial_ot(device, n, iterations=20 if smoke else 200))
    row = results["partial_ot"]
    print(f"  cpu {row['cpu_s']:.3f} s  {device.type} {row['device_s']:.3f} s  cpu/{device.type} "
          f"{row['cpu_over_device']:.1f}×  max |Δplan| {row['max_plan_difference']:.2e}")  # fmt: skip
    save()
    with tempfile.TemporaryDirectory() as scratch:
        runs = Path(scratch)
        print("\nH-Tuning vs full fine-tuning, training step memory in the run (ptbxl)")
        results["htuning_memory"] = htuning_memory(device, 4 if smoke else 32, runs, smoke)
        row = results["htuning_memory"]
        print(f"  batch {row['batch_size']}: full {row['full_bytes'] / 2**20:.1f} MiB  htuning "
              f"{row['htuning_bytes'] / 2**20:.1f} MiB  full/htuning {row['full_over_htuning']:.1f}×")  # fmt: skip
        save()
        print("\nseconds per epoch of each domain's default method")
        results["epochs"] = epoch_seconds(device, ("features", "ptbxl") if smoke else DOMAINS, runs, 1 if smoke else 2)
        save()
    print(f"\nwritten: {out}")
    return results


if __name__ == "__main__":
    main()

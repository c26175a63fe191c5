"""The GPU check: every command on one GPU, and each speed figure measured side by side in this process.

Parts (``--parts`` runs some; each is reported ok or failed with its error, and the rest go on):

- ``readme``: the README's main job as written, ``workbench adapt --domain rmd17 --device cuda`` in a fresh process
  (wall seconds: the target is 60), and again with ``--backend cueq``.
- ``commands``: every domain × applicable method, one epoch on a cut of its data (``adapt --device cuda``); for each
  domain's default method also ``evaluate`` and, where the task has batch prediction, ``predict`` on files of its
  embedded data.
- ``compare``: a small ``workbench compare`` (features: warmpot against full, 2 folds × 3 development seeds).
- ``serve``: ``workbench serve --device cuda`` on a ptbxl run answers one uploaded record.
- ``mace_step``: the MACE + ELoRA training step (forward, forces by autograd, backward, Adam) on e3nn and on
  cuEquivariance (`workbench.models.mace.to_cueq`), float32 and float64, 10 ethanol frames; which cuEquivariance
  kernels ran (its CUDA ops, or the naive fallback) is recorded. Target: ≤ 20 ms per e3nn step.
- ``partial_ot``: entropic partial OT (`workbench.adaptation.warmpot.partial_plan`), GPU over CPU, n = 8192.
- ``htuning_memory``: training-step memory of H-Tuning and full fine-tuning in a ptbxl run, batch 32.
- ``epochs``: seconds per epoch of each domain's default method, float32 and (where offered) bf16.

Prints a line per part and writes ``benchmarks/results/gpu_check.json`` after every part (a part that fails
leaves the others written); full tracebacks and the commands' output go to ``gpu_check.log`` beside it.
``--smoke`` runs the same code on the CPU with tiny inputs and few domains (the tests run it, under the placement
harness, so that the GPU run does not fail on a code path); its numbers mean nothing.

    python benchmarks/gpu_check.py                 # on one GPU
    python benchmarks/gpu_check.py --smoke --json /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from workbench.adaptation import elora
from workbench.adaptation.warmpot import partial_plan
from workbench.domains.atomistic.task import Rmd17
from workbench.domains.features.partial_da import make_partial_da
from workbench.models.mace import FOUNDATION_ARCHITECTURE, build_mace, load_mace, to_cueq

import workbench
from workbench.core import device as placement
from workbench.core.errors import UserError
from workbench.core.registry import methods, tasks

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_check.json"
DOMAINS = ("rmd17", "ptbxl", "csbm", "features", "sleepedf", "motor-imagery", "physio", "medvl")
PARTS = ("readme", "commands", "compare", "serve", "mace_step", "partial_ot", "htuning_memory", "epochs")
#: One epoch on a cut of each task's embedded data (``commands``).
ONE_EPOCH: dict[str, dict[str, Any]] = {
    "rmd17": dict(train_size=10, val_size=5, batch_size=5),
    "ptbxl": dict(train_size=16, val_size=8, batch_size=8),
    "csbm": dict(nodes=200),
    "features": dict(train_size=200, val_size=50, pretrain_epochs=10),
    "sleepedf": dict(train_size=16, val_size=8, batch_size=8),
    "motor-imagery": dict(train_size=16, val_size=8, batch_size=8),
    "physio": dict(train_size=16, val_size=8, batch_size=8),
    "medvl": dict(train_size=24, val_size=8, batch_size=8),
}
#: Inputs of ``workbench predict`` (files of the embedded data) for the tasks with batch prediction.
PREDICT_FILES = {
    "ptbxl": ("domains/ecg/embedded/ptbxl_synthetic/records100/00000", ("00001_lr.hea", "00001_lr.dat")),
    "sleepedf": ("domains/eeg/embedded/sleep-edf/sleep-cassette", ("SC4001E0-PSG.edf", "SC4001EC-Hypnogram.edf")),
    "motor-imagery": ("domains/eeg/embedded/eegmmidb/S001", ("S001R04.edf",)),
    "physio": ("domains/physio/embedded/site-D", ("D01.hea", "D01.dat", "D01.atr")),
}
#: The ELoRA step time the GPU is held to [s] (10 ethanol frames on one H200).
STEP_TARGET_S = 0.020
#: The README main job's wall time the GPU is held to [s].
README_TARGET_S = 60.0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step: Callable[[], Any], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    return time.perf_counter() - start


class Check:
    """What one check run shares: its device, scale, scratch folder and log."""

    def __init__(self, device: torch.device, smoke: bool, scratch: Path, log: Path, domains: tuple[str, ...]) -> None:
        self.device, self.smoke, self.scratch, self.log, self.domains = device, smoke, scratch, log, domains

    def workbench(self, *arguments: str) -> tuple[int, float]:
        """``python -m workbench ARGUMENTS`` in a fresh process, its output appended to the log: (exit code,
        wall seconds)."""
        start = time.perf_counter()
        with self.log.open("a") as log:
            log.write(f"\n$ workbench {' '.join(arguments)}\n")
            log.flush()
            code = subprocess.run([sys.executable, "-m", "workbench", *arguments], stdout=log,
                                  stderr=subprocess.STDOUT, cwd=self.scratch).returncode  # fmt: skip
        return code, time.perf_counter() - start

    @property
    def flag(self) -> str:
        """The ``--device`` value of the commands (the stand-in of a placement harness reads as cpu)."""
        return self.device.type


def readme(check: Check) -> dict[str, Any]:
    """The README's main job, as written and with ``--backend cueq`` (smoke: e3nn alone, 1 epoch, 5 frames, no
    baselines: cuEquivariance's naive fallback takes a minute to score the test frames on a CPU, and
    ``tests/test_cueq.py`` covers that path)."""
    small = ["--epochs", "1", "--train-size", "5", "--val-size", "2", "--baselines", ""] if check.smoke else []
    rows = {}
    for name, extra in (("e3nn", []), ("cueq", ["--backend", "cueq"]))[: 1 if check.smoke else 2]:
        out = check.scratch / f"readme-{name}"
        code, seconds = check.workbench("adapt", "--domain", "rmd17", "--device", check.flag, "--quiet", "--out",
                                        str(out), *extra, *small)  # fmt: skip
        if code != 0:
            raise RuntimeError(f"workbench adapt --domain rmd17 {' '.join(extra)} exited {code} (see the log)")
        rows[name] = {"wall_s": seconds, "target_s": README_TARGET_S, "met": seconds <= README_TARGET_S}
    return rows


def _applicable(task_name: str) -> list[str]:
    """The methods whose ``check`` passes on the task's embedded data and default model."""
    task = tasks.get(task_name)(**{k: v for k, v in ONE_EPOCH[task_name].items() if k in ("nodes", "pretrain_epochs")})
    task.progress = False
    model = task.load_model(None)
    sizes = ONE_EPOCH[task_name]
    data, _ = task.prepare(model, task.read(None, 0), sizes.get("train_size", 1), sizes.get("val_size", 1), 0)
    found = []
    for name in methods.names():
        try:
            methods.get(name)().check(task, data, model)
        except UserError:
            continue
        found.append(name)
    return found


def commands(check: Check) -> dict[str, Any]:
    """Every domain × applicable method for one epoch, then ``evaluate`` and ``predict`` of each default method
    (smoke: the default methods of features and ptbxl)."""
    rows, failed = [], []
    for domain in check.domains:
        default = tasks.get(domain).default_method
        for method in [default] if check.smoke else _applicable(domain):
            out = check.scratch / "commands" / f"{domain}-{method}"
            row: dict[str, Any] = {"domain": domain, "method": method}
            try:
                start = time.perf_counter()
                workbench.adapt(domain, method, out=str(out), epochs=1, baselines=[], device=check.flag, quiet=True,
                                **ONE_EPOCH[domain])  # fmt: skip
                row["adapt_s"] = time.perf_counter() - start
                if method == default:
                    row["evaluate"] = sorted(workbench.evaluate(out, device=check.flag))
                    if domain in PREDICT_FILES:
                        row["predict_records"] = _predict(check, domain, out)["records"]
                row["status"] = "ok"
            except Exception as error:  # reported, and the next pair goes on
                row["status"] = f"failed: {type(error).__name__}: {error}"
                failed.append(f"{domain}/{method}")
                with check.log.open("a") as log:
                    log.write(f"\n{domain}/{method}:\n{traceback.format_exc()}")
            rows.append(row)
            print(f"    {domain:14s} {method:18s} {row['status'][:90]}")
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rows)} failed: {', '.join(failed)}")
    return {"runs": rows}


def _predict(check: Check, domain: str, run: Path) -> dict[str, Any]:
    folder, names = PREDICT_FILES[domain]
    inputs = check.scratch / "inputs" / domain
    inputs.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(ROOT / folder / name, inputs / name)
    return workbench.predict(run, inputs, check.scratch / "predicted" / f"{domain}.csv", device=check.flag)


def compare(check: Check) -> dict[str, Any]:
    """``workbench compare`` of warmpot against full on the features task, 2 folds × 3 development seeds (smoke:
    one seed)."""
    out = check.scratch / "compare"
    code, seconds = check.workbench("compare", "--domain", "features", "--methods", "warmpot,full", "--folds", "2",
                                    "--seeds", "0" if check.smoke else "0-2", "--epochs", "1", "--device", check.flag,
                                    "--quiet", "--out", str(out))  # fmt: skip
    if code != 0:
        raise RuntimeError(f"workbench compare exited {code} (see the log)")
    cells = json.loads((out / "comparison.json").read_text())["cells"]
    return {"wall_s": seconds, "cells": len(cells)}


def serve(check: Check) -> dict[str, Any]:
    """``workbench serve`` on a one-epoch ptbxl run answers one uploaded record with 200."""
    import httpx

    spec = importlib.util.spec_from_file_location("serve_load", ROOT / "benchmarks" / "serve_load.py")
    serve_load = sys.modules.setdefault("serve_load", importlib.util.module_from_spec(spec))  # its dataclasses
    spec.loader.exec_module(serve_load)
    run = check.scratch / "serve-run"
    workbench.adapt("ptbxl", "readout", out=str(run), epochs=1, baselines=[], device=check.flag, quiet=True,
                    **ONE_EPOCH["ptbxl"])  # fmt: skip
    folder, names = PREDICT_FILES["ptbxl"]
    files = [("file", (name, (ROOT / folder / name).read_bytes())) for name in names]
    with serve_load.running_server(run, check.scratch / "server", "--device", check.flag) as server:
        start = time.perf_counter()
        response = httpx.post(f"{server.url}/predict", headers={"Authorization": f"Bearer {server.token}"},
                              files=files, timeout=120)  # fmt: skip
        seconds = time.perf_counter() - start
    if response.status_code != 200:
        raise RuntimeError(f"POST /predict answered {response.status_code}: {response.text[:300]}")
    return {"status_code": response.status_code, "answer_s": seconds}


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


def cueq_kernels(device: torch.device) -> str:
    """Which cuEquivariance kernels a step on ``device`` runs: its CUDA ops, or the naive PyTorch fallback."""
    if device.type != "cuda":
        return "naive fallback (no CUDA device)"
    found = importlib.util.find_spec("cuequivariance_ops_torch") is not None
    return "CUDA ops (cuequivariance_ops_torch)" if found else "naive fallback (cuequivariance_ops_torch missing)"


def mace_step(check: Check, rounds: int) -> dict[str, Any]:
    """Seconds of one ELoRA training step on the e3nn and the cuEquivariance MACE (median over ``rounds``), float32
    and float64, 10 ethanol frames (smoke: float32, 2 frames of a small MACE)."""
    frames = 2 if check.smoke else 10
    out: dict[str, Any] = {"frames": frames, "cueq_kernels": cueq_kernels(check.device), "target_s": STEP_TARGET_S}
    for name, dtype in (("float32", torch.float32), ("float64", torch.float64))[: 1 if check.smoke else 2]:
        out[name] = _mace_step(check.device, dtype, check.smoke, rounds, frames)
        out[name]["e3nn_met"] = out[name]["e3nn_s"] <= STEP_TARGET_S
        row = out[name]
        print(f"    {name}: e3nn {row['e3nn_s'] * 1e3:8.1f} ms  cueq {row['cueq_s'] * 1e3:8.1f} ms  "
              f"cueq/e3nn {row['cueq_over_e3nn']:.2f}×  (target {STEP_TARGET_S * 1e3:.0f} ms)")  # fmt: skip
    return out


def _mace_step(device: torch.device, dtype: torch.dtype, smoke: bool, rounds: int, frames: int) -> dict[str, float]:
    base = placement.place((small_mace() if smoke else load_mace()).to(dtype), device)
    task = Rmd17()
    data, _ = task.prepare(base, task.read(None, 0), frames, 5, 0)
    batch = task.collate(data.train[:frames], device)
    models = {"e3nn": base, "cueq": placement.place(to_cueq(base), device)}
    steps = {}
    for name, model in models.items():
        adapted = placement.place(elora.apply(copy.deepcopy(model), rank=16, alpha=16.0), device)
        optimizer = torch.optim.Adam([p for p in adapted.parameters() if p.requires_grad], lr=1e-3)

        def step(adapted=adapted, optimizer=optimizer):
            optimizer.zero_grad(set_to_none=True)
            task.loss(adapted, batch, True).backward()
            optimizer.step()

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="cuequivariance_ops_torch is not available")
            step()  # warm-up: kernel selection, autograd graph set-up
        steps[name] = step
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            seconds[name].append(timed(step, device))
    e3nn, cueq = (statistics.median(seconds[name]) for name in ("e3nn", "cueq"))
    return {"e3nn_s": e3nn, "cueq_s": cueq, "cueq_over_e3nn": cueq / e3nn}


def partial_ot(check: Check) -> dict[str, float]:
    """Seconds of entropic partial-OT iterations at ``n × n`` on the device and on the CPU, and their plans'
    largest difference (n = 8192, 200 iterations; smoke: 256, 20)."""
    n, iterations = (256, 20) if check.smoke else (8192, 200)
    problem = make_partial_da(n_source=n, n_target=n, seed=0)
    xs = torch.as_tensor(problem.source_x, dtype=torch.float32)
    xt = torch.as_tensor(problem.target_x, dtype=torch.float32)
    plans, seconds = {}, {}
    for label, where in (("cpu", torch.device("cpu")), ("device", check.device)):
        cost = torch.cdist(xs.to(where), xt.to(where)) ** 2
        cost = cost / cost.max()
        a = torch.full((n,), 1.0 / n, device=where)

        def solve(cost=cost, a=a, label=label):
            plans[label] = partial_plan(cost, a, a, 0.5, reg=0.05, max_iter=iterations, tol=0.0).cpu()

        solve()  # warm-up
        seconds[label] = timed(solve, where)
    row = {
        "n": n,
        "cpu_s": seconds["cpu"],
        "device_s": seconds["device"],
        "cpu_over_device": seconds["cpu"] / seconds["device"],
        "max_plan_difference": float((plans["cpu"] - plans["device"]).abs().max()),
        "largest_plan_entry": float(plans["cpu"].max()),
    }
    print(f"    cpu {row['cpu_s']:.3f} s  {check.flag} {row['device_s']:.3f} s  cpu/{check.flag} "
          f"{row['cpu_over_device']:.1f}×  max |Δplan| {row['max_plan_difference']:.2e}")  # fmt: skip
    return row


def htuning_memory(check: Check) -> dict[str, Any]:
    """``training_step_bytes`` of H-Tuning and of full fine-tuning in one ptbxl run [bytes], batch 32 (smoke: 4)."""
    batch_size = 4 if check.smoke else 32
    settings = dict(epochs=1, train_size=8, val_size=4) if check.smoke else dict(epochs=2)
    run = workbench.adapt(
        domain="ptbxl", method="htuning", baselines=["full"], batch_size=batch_size, device=check.flag,
        out=str(check.scratch / "ptbxl-memory"), quiet=True, **settings,
    )  # fmt: skip
    costs = run.metrics["costs"]
    full, htuning = costs["full"]["training_step_bytes"], costs["htuning"]["training_step_bytes"]
    print(f"    batch {batch_size}: full {full / 2**20:.1f} MiB  htuning {htuning / 2**20:.1f} MiB  "
          f"full/htuning {full / htuning:.1f}×")  # fmt: skip
    return {"batch_size": batch_size, "full_bytes": full, "htuning_bytes": htuning, "full_over_htuning": full / htuning}


def epoch_seconds(check: Check) -> dict[str, Any]:
    """Seconds per epoch of each domain's default method (2 epochs; smoke: 1 epoch of features and ptbxl), no
    baselines, per offered precision."""
    rows = []
    for domain in check.domains:
        offered = tasks.get(domain).precisions
        for precision in [p for p in ("float32", "bf16") if p in offered] or [offered[0]]:
            start = time.perf_counter()
            run = workbench.adapt(
                domain=domain, baselines=[], device=check.flag, precision=precision, quiet=True,
                out=str(check.scratch / "epochs" / f"{domain}-{precision}"), epochs=1 if check.smoke else 2,
            )  # fmt: skip
            cost = run.metrics["costs"][run.metrics["method"]]
            rows.append({"domain": domain, "method": run.metrics["method"], "precision": precision,
                         "seconds_per_epoch": cost["seconds_per_epoch"],
                         "run_seconds": time.perf_counter() - start})  # fmt: skip
            print(f"    {domain:14s} {rows[-1]['method']:10s} {precision:8s} {cost['seconds_per_epoch']:8.2f} s/epoch")
    return {"runs": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="the same code paths on the CPU, tiny inputs")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated parts (default: all: {PARTS})")
    parser.add_argument("--domains", default=",".join(DOMAINS), help="comma-separated domains of the commands and "
                        "epochs parts (default: all; a machine may lack some domains' extras)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per MACE step (default 10; smoke 1)")
    parser.add_argument("--json", default=str(RESULTS))
    args = parser.parse_args(argv)
    chosen = [part for part in args.parts.split(",") if part]
    domains = tuple(domain for domain in args.domains.split(",") if domain)
    unknown = sorted(set(chosen) - set(PARTS)) + sorted(set(domains) - set(DOMAINS))
    if unknown:
        sys.exit(f"gpu_check: unknown part(s) or domain(s) {unknown}; the parts are {', '.join(PARTS)}, the domains "
                 f"{', '.join(DOMAINS)}")  # fmt: skip
    smoke = args.smoke
    if not smoke and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device is visible to torch (use --smoke to try the code paths on the CPU)")
    device = placement.resolve("cpu" if smoke else "cuda")
    rounds = args.rounds or (1 if smoke else 10)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")
    log.write_text("")
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "smoke": smoke,
        "parts": {},
    }
    print(f"device: {results['device']} (torch {results['torch']}){' — smoke run' if smoke else ''}")
    with tempfile.TemporaryDirectory() as scratch:
        check = Check(device, smoke, Path(scratch), log, ("features", "ptbxl") if smoke else domains)
        run = {"readme": readme, "commands": commands, "compare": compare, "serve": serve,
               "mace_step": lambda c: mace_step(c, rounds), "partial_ot": partial_ot, "htuning_memory": htuning_memory,
               "epochs": epoch_seconds}  # fmt: skip
        for part in chosen:
            print(f"\n{part}")
            start = time.perf_counter()
            try:
                row = {"status": "ok", **run[part](check)}
            except Exception as error:  # reported, and the other parts go on
                row = {"status": f"failed: {type(error).__name__}: {error}"}
                with log.open("a") as handle:
                    handle.write(f"\n{part}:\n{traceback.format_exc()}")
                print(f"    FAILED: {row['status']}")
            results["parts"][part] = {**row, "seconds": time.perf_counter() - start}
            out.write_text(json.dumps(results, indent=2) + "\n")  # after every part
    failed = [part for part, row in results["parts"].items() if row["status"] != "ok"]
    print(f"\n{len(chosen) - len(failed)} of {len(chosen)} parts ok{': failed ' + ', '.join(failed) if failed else ''}"
          f"; written: {out} (log: {log})")  # fmt: skip
    return results


if __name__ == "__main__":
    main()

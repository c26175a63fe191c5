"""H-Tuning vs full fine-tuning vs LoRA, and distilled 12/3/1-lead students, on the embedded ECG target site.

The claims under test (H-Tuning, ICML 2025; see /work/shared/METHODS.md): H-Tuning trains in >= 6x less memory
than full fine-tuning at a macro AUROC within 0.02 of it; the distilled student is >= 4.5x faster at inference
and >= 19x smaller. Three measurements, each side by side in this script:

1. Scores, per seed: one ``workbench adapt --domain ptbxl`` run (htuning chosen; full, lora and a 12-lead
   ``distill`` student of the htuning model beside it), then 3- and 1-lead students of the same htuning model
   (``--method distill --teacher RUN``). Test split of the target site (18 records): macro AUROC / AP / F1.
2. Training memory and seconds per step, per method, each in a fresh process (``--worker``) so no method inherits
   another's high-water mark: the base model, the method's prepared model, an AdamW optimizer and one batch of
   ``--memory-batches`` target records are set up; one warm-up step runs (one-time kernel and autograd set-up);
   then the process's resident high-water mark (VmHWM) is reset
   (``/proc/self/clear_refs``) and ``--steps`` training steps run (the method's gradient: backprop, or H-Tuning's
   mixed-order step, then the optimizer). Training memory = VmHWM after the steps minus the resident size
   before them (on a GPU: ``max_memory_allocated`` minus ``memory_allocated`` before). One thread per process;
   glibc's mmap threshold is fixed at 64 KiB so freed tensors leave the resident set at once. A distilled
   student's step includes its teacher's forward. Beside it, in the same worker afterwards, the figure a
   ``workbench adapt`` run reports at that batch size (``training_step_bytes``, `workbench.memory`): peak bytes of
   the tensors a trainer step allocates (activations, gradients, Adam and EMA state; on a CPU not the input
   batch, which the task makes from NumPy memory), the larger of 2 steps after a warm-up. ``htuning`` runs its
   graph-free forwards 8 records at a time (the default); ``htuning-published`` on the whole batch
   (``--zo-chunk 0``): the same gradient, so the same scores.
3. Inference latency (one thread, ``inference_mode``, median of interleaved repeats) and size (parameters,
   float32 bytes) of the teacher and the students, in this process, at batch 1 and 32.

    python benchmarks/ecg_htuning.py                          # 3 seeds, 30 epochs, batches 32 and 128 (~10 min)
    python benchmarks/ecg_htuning.py --seeds 0 --epochs 3 --steps 2 --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

#: Memory rows: (row name, method, options). ``htuning-published`` computes the same gradient (up to rounding) with its
#: graph-free forwards on the whole batch (``--zo-chunk 0``, as published), so it shares ``htuning``'s scores.
TRAINED = (("full", "full", {}), ("lora", "lora", {}), ("htuning", "htuning", {}))
PUBLISHED = ("htuning-published", "htuning", {"zo_chunk": 0})
STUDENT_LEADS = (12, 3, 1)
STUDENTS = tuple((f"student-{n}", "distill", {"n_leads": n}) for n in STUDENT_LEADS)


def _resident_kib(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process [KiB] (Linux ``/proc/self/status``)."""
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def worker(method_name: str, options: dict, batch_size: int, steps: int, device_name: str, seed: int) -> dict:
    """Training memory and seconds per step of one method, measured in this (fresh) process; then the run's figure."""
    from workbench.domains.ecg.task import PtbXl

    from workbench.method import PlanInputs
    from workbench.registry import methods
    from workbench.run import _training_step_bytes
    from workbench.trainer import TrainSettings

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    device = torch.device(device_name)
    task = PtbXl()
    raw = task.read(None, seed)
    base = task.load_model(None)
    data, _ = task.prepare(base, raw, 10**6, 10**6, seed)
    samples = [data.train[i % len(data.train)] for i in range(batch_size)]
    method = methods.get(method_name)(**options)
    teacher = copy.deepcopy(base)  # for distill: the adapted teacher has the base's architecture and cost
    model = method.prepare(base).to(device)
    probe = copy.deepcopy(model)  # for the run's figure, untouched by the steps below (it measures a copy too)
    method.setup(task, model, data, seed)
    settings = TrainSettings(batch_size=batch_size, learning_rate=1e-3, seed=seed)
    stage = method.plan(task, model, data, PlanInputs(settings, adapted_model=lambda: teacher))[-1]
    batch = task.collate(samples, device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)

    def step(index: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        if stage.gradients is None or stage.gradients(model, batch, index) is None:
            stage.loss(model, batch, True).backward()
        optimizer.step()

    step(0)  # warm-up: one-time kernel and autograd set-up is not the method's memory
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start_bytes = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        start_kib = _resident_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current size
    seconds = []
    for index in range(1, steps + 1):
        tic = time.perf_counter()
        step(index)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - tic)
    if device.type == "cuda":
        training_bytes = torch.cuda.max_memory_allocated(device) - start_bytes
    else:
        training_bytes = (_resident_kib("VmHWM") - start_kib) * 1024
    return {
        "training_bytes": int(training_bytes),
        "seconds_per_step": statistics.median(seconds),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "in_run_step_bytes": _training_step_bytes(stage, task, probe, data, device),
    }


def measure_in_fresh_process(name: str, options: dict, batch_size: int, args) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        json.dumps({"method": name, "options": options}),
        "--memory-batches",
        str(batch_size),
        "--steps",
        str(args.steps),
        "--device",
        args.device,
    ]
    # glibc: a fixed mmap threshold returns every freed block >= 64 KiB to the system at once, so the resident
    # size follows the live tensors instead of what the allocator keeps cached.
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    if done.returncode != 0:
        raise RuntimeError(f"worker for {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def latency_and_size(batch_sizes: tuple[int, ...], repeats: int) -> dict[str, dict]:
    """Median forward seconds (one thread) and size of the shipped teacher and fresh 12/3/1-lead students."""
    from workbench.models.ecg import SHIPPED_CHECKPOINT, ECGStudent, load_ecg_model

    torch.set_num_threads(1)
    models = {"teacher": load_ecg_model(SHIPPED_CHECKPOINT).eval()}
    models.update({f"student-{n}": ECGStudent(n_chans=n).eval() for n in STUDENT_LEADS})
    out: dict[str, dict] = {}
    for name, model in models.items():
        n = sum(p.numel() for p in model.parameters())
        out[name] = {"parameters": n, "float32_bytes": 4 * n}
    for batch_size in batch_sizes:
        ecg = torch.randn(batch_size, 12, 1000)
        times: dict[str, list[float]] = {name: [] for name in models}
        with torch.inference_mode():
            for model in models.values():
                model(ecg)  # warm-up
            for _ in range(repeats):  # interleaved, so drifts in machine load hit every model alike
                for name, model in models.items():
                    tic = time.perf_counter()
                    model(ecg)
                    times[name].append(time.perf_counter() - tic)
        for name in models:
            out[name][f"latency_batch{batch_size}_s"] = statistics.median(times[name])
    return out


def scores(seeds: list[int], epochs: int, runs: Path) -> dict[str, list[dict]]:
    import workbench

    per_method: dict[str, list[dict]] = {}
    for seed in seeds:
        run = workbench.adapt(
            domain="ptbxl", seed=seed, epochs=epochs, quiet=True, out=str(runs / f"htuning-{seed}"),
            baselines=["full", "lora", "distill"],
        )  # fmt: skip
        results = {"htuning": run.metrics["after"], **run.metrics["baselines"]}
        results["student-12"] = results.pop("distill")
        costs = dict(run.metrics["costs"])
        costs["student-12"] = costs.pop("distill")
        for n_leads in STUDENT_LEADS[1:]:
            student = workbench.adapt(
                domain="ptbxl", method="distill", baselines=[], seed=seed, epochs=epochs, quiet=True,
                out=str(runs / f"student{n_leads}-{seed}"),
                method_options={"teacher": str(run.path), "n_leads": n_leads},
            )  # fmt: skip
            results[f"student-{n_leads}"] = student.metrics["after"]
            costs[f"student-{n_leads}"] = student.metrics["costs"]["distill"]
        for name, metrics in results.items():
            per_method.setdefault(name, []).append(
                {"seed": seed, **metrics, "train_seconds": costs[name]["train_seconds"]}
            )
        print(f"seed {seed}: " + ", ".join(f"{k} {v['macro_auroc']:.3f}" for k, v in results.items()), flush=True)
    return per_method


def mean_sd(values: list[float]) -> str:
    return f"{np.mean(values):.3f}±{np.std(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=30, help="training epochs (students: 3× this, from scratch)")
    parser.add_argument("--memory-batches", type=int, nargs="+", default=[32, 128], help="records per memory step")
    parser.add_argument("--steps", type=int, default=5, help="training steps per memory run")
    parser.add_argument("--repeats", type=int, default=30, help="forward passes per model for the latency")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", default=None, help="folder for the run directories (default: a temporary one)")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "ecg_htuning.json"))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        batch_size = args.memory_batches[0]
        print(json.dumps(worker(spec["method"], spec["options"], batch_size, args.steps, args.device, 0)))
        return

    start = time.perf_counter()
    rows_spec = (*TRAINED, PUBLISHED, *STUDENTS)
    memory = {
        (name, batch): measure_in_fresh_process(method, options, batch, args)
        for batch in args.memory_batches
        for name, method, options in rows_spec
    }
    speed = latency_and_size((1, 32), args.repeats)
    with tempfile.TemporaryDirectory() as scratch:
        per_method = scores(args.seeds, args.epochs, Path(args.runs or scratch))
    per_method["htuning-published"] = per_method["htuning"]

    full_auroc = np.mean([r["macro_auroc"] for r in per_method["full"]])
    teacher = speed["teacher"]
    batches = args.memory_batches
    print(f"\nptbxl embedded target site, seeds {args.seeds}, {args.epochs} epochs (students 3x); training memory "
          f"(MB: resident set; run: the run's tensor figure) and s/step per step of {'/'.join(map(str, batches))} "
          f"records, fresh process each, {args.device}, 1 thread; latency: batch 1, 1 thread")  # fmt: skip
    header = (
        f"{'method':18} {'macro AUROC':>12} {'macro AP':>12} {'macro F1':>12} {'vs full':>7} "
        + " ".join(f"{f'MB@{b}':>7} {'full/x':>6} {f'run@{b}':>7} {'full/x':>6} {f's/st@{b}':>7}" for b in batches)
        + f" {'params':>8} {'lat. ms':>7} {'faster':>6} {'smaller':>7}"
    )
    print(header)
    print("-" * len(header))
    rows = {}
    for name, _, _ in rows_spec:
        runs = per_method[name]
        auroc = [r["macro_auroc"] for r in runs]
        size = speed[name] if name.startswith("student") else teacher
        row = {
            "macro_auroc": auroc,
            "macro_average_precision": [r["macro_average_precision"] for r in runs],
            "macro_f1": [r["macro_f1"] for r in runs],
            "auroc_minus_full": float(np.mean(auroc) - full_auroc),
            "memory": {
                str(b): {
                    **memory[name, b],
                    "ratio_full_over_method": memory["full", b]["training_bytes"]
                    / max(memory[name, b]["training_bytes"], 1),
                    "in_run_ratio_full_over_method": memory["full", b]["in_run_step_bytes"]
                    / max(memory[name, b]["in_run_step_bytes"], 1),
                }
                for b in batches
            },
            **size,
            "latency_ratio_teacher_over_model": teacher["latency_batch1_s"] / size["latency_batch1_s"],
            "size_ratio_teacher_over_model": teacher["parameters"] / size["parameters"],
        }
        rows[name] = row
        cells = " ".join(
            f"{m['training_bytes'] / 2**20:>7.1f} {m['ratio_full_over_method']:>6.1f} "
            f"{m['in_run_step_bytes'] / 2**20:>7.1f} {m['in_run_ratio_full_over_method']:>6.1f} "
            f"{m['seconds_per_step']:>7.3f}"
            for m in row["memory"].values()
        )
        print(
            f"{name:18} {mean_sd(row['macro_auroc']):>12} {mean_sd(row['macro_average_precision']):>12} "
            f"{mean_sd(row['macro_f1']):>12} {row['auroc_minus_full']:>+7.3f} {cells} {size['parameters']:>8,} "
            f"{1000 * size['latency_batch1_s']:>7.2f} {row['latency_ratio_teacher_over_model']:>6.2f} "
            f"{row['size_ratio_teacher_over_model']:>7.1f}"
        )
    print("\nlatency at batch 32 [ms]: " + ", ".join(
        f"{name} {1000 * value['latency_batch32_s']:.1f}" for name, value in speed.items()
    ))  # fmt: skip
    result = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "json", "runs")},
        "methods": rows,
        "latency_and_size": speed,
        "seconds": time.perf_counter() - start,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()

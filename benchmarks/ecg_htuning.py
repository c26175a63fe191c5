"""H-Tuning vs full fine-tuning vs LoRA on the embedded ECG target site; and, apart, training memory and latency.

The claim under test (H-Tuning, ICML 2025; see /work/shared/METHODS.md): H-Tuning's macro AUROC is within 0.02 of
full fine-tuning's (beside it: LoRA against full fine-tuning). The folds hold out the target site's patients; every
method trains from the shipped teacher under the authors' recipe: 1 % linear warm-up, linear decay, early stopping
on the validation mAP (`workbench compare --schedule linear --warmup-share 0.01 --select-on macro_average_precision
--budget convergence`), each choosing its learning rate per cell on that validation mAP from the authors' 2e-3 and
5e-4 (`--lr-grid 5e-4,2e-3`).

The distilled students are not compared here: a student learns from the model its run adapted, and a compared cell
runs one method alone, so its teacher would be the unadapted base model (and it trains 3× the epochs).

``--costs`` measures, outside the comparison (not a comparison: one process per method, no folds), what the paper's
other claims are about — training memory ≥ 6× below full fine-tuning's and a student ≥ 4.5× faster and ≥ 19×
smaller than its teacher — into ``results/ecg_htuning_costs.json``:

1. per method, in a fresh process with one thread (so no method inherits another's high-water mark): the prepared
   model, AdamW and one batch of ``--memory-batches`` target records; one warm-up step; then the resident high-water
   mark (VmHWM) is reset (``/proc/self/clear_refs``) and ``--steps`` steps run (the method's gradient, then the
   optimizer). Training memory = VmHWM after the steps minus the resident size before (glibc's mmap threshold fixed
   at 64 KiB so freed tensors leave the resident set at once); beside it the run's own figure
   (``training_step_bytes``, `workbench.core.memory`). ``htuning-published`` runs its graph-free forwards on the whole
   batch (``--zo-chunk 0``); a student's step includes its teacher's forward.
2. forward latency (one thread, ``inference_mode``, median of interleaved repeats) and size of the shipped teacher
   and fresh 12/3/1-lead students, at batch 1 and 32.

    python benchmarks/ecg_htuning.py            # full, htuning, lora × 3 folds × seeds 200-204
    python benchmarks/ecg_htuning.py --dev      # seeds 0, 1 (development; no results file)
    python benchmarks/ecg_htuning.py --costs    # memory per step and latency (~5 min)
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
import time
from pathlib import Path

from claims import RESULTS, Benchmark, run

from workbench.comparison.design import CompareSpec
from workbench.comparison.report import Claim
from workbench.core.checkpoint import write_json

#: Where each seed's target site is written (`cohort`): the embedded target site's recipe (site 1 of `DEFAULT_SITES`,
#: the ambulance monitor: 64 patients of one record each) with the comparison's seed as the generator's, so that each
#: unit is new patients, not a new partition of the embedded site (generator seed 2026).
DATA = "benchmarks/runs/ecg_htuning-data/ptbxl-site1-seed{seed}"


def cohort(seed: int) -> Path:
    """The target site of ``seed`` (`DATA`), written once (atomically: a folder that exists is complete)."""
    from workbench.domains.ecg.generate import DEFAULT_SITES, generate_ptbxl_synthetic

    out = Path(__file__).resolve().parents[1] / DATA.replace("{seed}", str(seed))
    if not out.is_dir():
        site = next(site for site in DEFAULT_SITES if site.site == 1)
        generate_ptbxl_synthetic(out, seed=seed, sites=(site,), progress=True)
    return out


BENCHMARK = Benchmark(
    name="ecg_htuning",
    spec=CompareSpec(
        "ptbxl", ("full", "htuning", "lora"), folds=3, seeds=(200, 201, 202, 203, 204), budget="convergence",
        epochs=30, patience=10, lr_grid=(5e-4, 2e-3), schedule="linear", warmup_share=0.01,
        select_on="macro_average_precision", data=DATA,
    ),
    metrics=("macro_auroc", "macro_average_precision"),
    names={"full": "full fine-tuning", "htuning": "H-Tuning", "lora": "LoRA"},
    claims=(
        Claim(
            "htuning",
            "macro_auroc",
            kind="equivalent",
            margin=0.02,
            text="H-Tuning's macro AUROC is equivalent to full fine-tuning's within ±0.02 (the paper's claim)",
        ),  # fmt: skip
        Claim(
            "lora",
            "macro_auroc",
            kind="equivalent",
            margin=0.02,
            text="LoRA's macro AUROC is equivalent to full fine-tuning's within ±0.02",
        ),  # fmt: skip
    ),
    note="Every method under the authors' recipe (H-Tuning, ICML 2025): a 1 % linear warm-up and linear decay over "
    "at most 30 epochs, early stopping (patience 10) on the validation macro average precision, whose best epoch is "
    "kept; the learning rate chosen per cell on the same validation mAP from the authors' 2e-3 and 5e-4 (at 2e-3 "
    "for every method, full fine-tuning fell below the unadapted teacher in most cells of a development run that "
    "is not kept here). Adam (AMSGrad, no weight decay), not the authors' AdamW, and no CutMix. Not compared: the "
    "distilled students (a compared cell has no adapted teacher). Training memory per step and latency are measured "
    "apart (`--costs`, not a comparison). Data: the embedded target site's recipe (site 1, 64 patients of one "
    "record each) generated anew for every seed, the seed being the generator's (data card ecg-htuning-cohorts).",
)

#: Memory rows: (row name, method, options).
MEMORY_ROWS = (("full", "full", {}), ("lora", "lora", {}), ("htuning", "htuning", {}),
               ("htuning-published", "htuning", {"zo_chunk": 0}),
               *((f"student-{n}", "distill", {"n_leads": n}) for n in (12, 3, 1)))  # fmt: skip


def _resident_kib(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process [KiB] (Linux ``/proc/self/status``)."""
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def memory_worker(method_name: str, options: dict, batch_size: int, steps: int) -> dict:
    """Training memory [bytes] and seconds per step of one method, in this (fresh) process; then the run's figure."""
    import torch
    from workbench.domains.ecg.task import PtbXl

    from workbench.core.method import PlanInputs
    from workbench.core.registry import methods
    from workbench.core.trainer import TrainSettings
    from workbench.run.stages import step_bytes

    torch.set_num_threads(1)
    torch.manual_seed(0)
    task = PtbXl()
    base = task.load_model(None)
    data, _ = task.prepare(base, task.read(None, 0), 10**6, 10**6, 0)
    method = methods.get(method_name)(**options)
    teacher = copy.deepcopy(base)  # distill: the adapted teacher has the base's architecture and cost
    model = method.prepare(base)
    probe = copy.deepcopy(model)  # the run's figure, on a copy the steps below leave alone
    method.setup(task, model, data, 0)
    settings = TrainSettings(batch_size=batch_size, learning_rate=1e-3, seed=0)
    stage = method.plan(task, model, data, PlanInputs(settings, adapted_model=lambda: teacher))[-1]
    batch = task.collate([data.train[i % len(data.train)] for i in range(batch_size)], torch.device("cpu"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)

    def step(index: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        if stage.gradients is None or stage.gradients(model, batch, index) is None:
            stage.loss(model, batch, True).backward()
        optimizer.step()

    step(0)  # warm-up: one-time kernel and autograd set-up is not the method's memory
    gc.collect()
    start_kib = _resident_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current size
    seconds = []
    for index in range(1, steps + 1):
        tic = time.perf_counter()
        step(index)
        seconds.append(time.perf_counter() - tic)
    return {
        "training_bytes": (_resident_kib("VmHWM") - start_kib) * 1024,
        "seconds_per_step": statistics.median(seconds),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "in_run_step_bytes": step_bytes(stage, task, probe, data, torch.device("cpu")),
    }


def latency_and_size(batch_sizes: tuple[int, ...], repeats: int) -> dict[str, dict]:
    """Median forward seconds (one thread) and size of the shipped teacher and fresh 12/3/1-lead students."""
    import torch
    from workbench.models.ecg import SHIPPED_CHECKPOINT, ECGStudent, load_ecg_model

    torch.set_num_threads(1)
    models = {"teacher": load_ecg_model(SHIPPED_CHECKPOINT).eval()}
    models.update({f"student-{n}": ECGStudent(n_chans=n).eval() for n in (12, 3, 1)})
    out = {name: {"parameters": sum(p.numel() for p in m.parameters())} for name, m in models.items()}
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


def costs(argv: list[str]) -> None:
    """``--costs``: training memory per step (a fresh process per method and batch) and latency, into
    ``results/ecg_htuning_costs.json``."""
    parser = argparse.ArgumentParser(description="H-Tuning's memory and the students' latency (not a comparison)")
    parser.add_argument("--costs", action="store_true")
    parser.add_argument("--memory-batches", type=int, nargs="+", default=[32, 128], help="records per memory step")
    parser.add_argument("--steps", type=int, default=5, help="training steps per memory run")
    parser.add_argument("--repeats", type=int, default=30, help="forward passes per model for the latency")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        row = json.loads(args.worker)
        print(json.dumps(memory_worker(row["method"], row["options"], args.memory_batches[0], args.steps)))
        return
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    memory: dict[str, dict] = {}
    for batch in args.memory_batches:
        for name, method, options in MEMORY_ROWS:
            row = json.dumps({"method": method, "options": options})
            command = [sys.executable, __file__, "--costs", "--worker", row, "--memory-batches", str(batch),
                       "--steps", str(args.steps)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
            if done.returncode != 0:
                raise RuntimeError(f"memory worker for {name} failed:\n{done.stderr[-3000:]}")
            memory.setdefault(name, {})[str(batch)] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{name} batch {batch}: {memory[name][str(batch)]['training_bytes'] / 2**20:.1f} MiB", flush=True)
    result = {"settings": {k: v for k, v in vars(args).items() if k not in ("costs", "worker")},
              "memory": memory, "latency_and_size": latency_and_size((1, 32), args.repeats)}  # fmt: skip
    write_json(RESULTS / "ecg_htuning_costs.json", result)
    print(json.dumps(result["latency_and_size"], indent=1))


if __name__ == "__main__":
    if "--costs" in sys.argv:
        costs(sys.argv[1:])
    else:
        os.chdir(Path(__file__).resolve().parents[1])  # `DATA` is relative to the repository, as the spec records it
        for seed in (0, 1) if "--dev" in sys.argv else BENCHMARK.spec.seeds:
            cohort(seed)
        run(BENCHMARK)

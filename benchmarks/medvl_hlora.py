"""H-LoRA's claims (HealthGPT, seed 000, issue 13) on the embedded medvl data: does H-LoRA comprehend and generate
at least as well as MoELoRA and plain LoRA plug-ins, at about plain LoRA's training time, and does three-stage
training beat one mixed stage?

1. **Quality** (``--seeds``, default 0 1 2): one `workbench.adapt` run per seed with ``hlora`` beside ``moelora``,
   ``hlora-lora`` (plain LoRA plug-ins of the same total rank) and ``hlora-mixed`` (H-LoRA, one mixed stage for
   three times the epochs), each three-stage method ``--epochs`` per stage (MoELoRA on the first seed only: see
   `quality`). Scores on the test records: closed-VQA
   accuracy, open-answer recall, report findings F1, SSIM / PSNR per generation sub-task. The seconds per epoch of
   the adapter stage (stage 3, the same samples for every method) come from the same runs.
2. **Step time against k** (one process, side by side): a training step (forward, backward, Adam) of the shipped
   model with H-LoRA, MoELoRA and plain LoRA plug-ins on the same mixed batch, ``k`` = 2, 4, 8 experts, the
   methods interleaved over ``--repeats`` rounds; median seconds and the ratio to plain LoRA. HealthGPT reports
   H-LoRA at 1.00× LoRA and MoELoRA at 1.22 / 1.49 / 2.09× for k = 2 / 4 / 8.
3. **Comprehension before and after the generation plug-in** (seed 0): the comprehension plug-in is trained on
   the comprehension records and scored; then generation is trained — into its own plug-in (H-LoRA), or into the
   same single adapter (one shared LoRA for both skills) — and comprehension is scored again.

    python benchmarks/medvl_hlora.py                  # 3 seeds, 4 epochs per stage (~35 min on 2 cores)
    python benchmarks/medvl_hlora.py --seeds 0 --epochs 2 --repeats 3     # a quick look
    python benchmarks/medvl_hlora.py --table          # the tables of the saved results
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

import workbench

RESULTS = Path(__file__).parent / "results" / "medvl_hlora.json"
METHODS = ("hlora", "moelora", "hlora-lora", "hlora-mixed")
LABELS = {"hlora": "H-LoRA", "moelora": "MoELoRA", "hlora-lora": "LoRA (same rank)",
          "hlora-mixed": "H-LoRA, mixed 1 stage"}  # fmt: skip
SCORES = ("closed_accuracy", "open_recall", "report_f1", "ssim_reconstruct", "ssim_super_resolution",
          "ssim_modality_conversion", "psnr_db")  # fmt: skip


def quality(seeds: list[int], epochs: int, runs: Path) -> list[dict]:
    """One record per seed × method: its scores and its adapter stage's seconds per epoch. MoELoRA runs on the
    first seed only: it computes H-LoRA's function from the same initial values (its experts are drawn as the row
    blocks of H-LoRA's factors), so at equal seeds it trains to H-LoRA's numbers up to rounding."""
    records = []
    for seed in seeds:
        out = runs / f"seed{seed}"
        chosen = [m for m in METHODS if m != "moelora" or seed == seeds[0]]
        metrics = workbench.adapt(domain="medvl", method="hlora", baselines=chosen[1:], epochs=epochs,
                                  seed=seed, out=str(out), quiet=True).metrics  # fmt: skip
        for method in chosen:
            scores = metrics["after"] if method == "hlora" else metrics["baselines"][method]
            history = json.loads((out / "results" / f"{method}.json").read_text())["history"]
            last = history[-1]["stage"]
            seconds = float(np.mean([h["seconds"] for h in history if h["stage"] == last]))
            records.append({"seed": seed, "method": method, "adapt_seconds_per_epoch": seconds,
                            **{k: scores[k] for k in SCORES if k in scores}})  # fmt: skip
        print(f"seed {seed}: done", flush=True)
    return records


def _mixed_batch(task, data, size: int = 16):
    """The first ``size`` training records, half comprehension and half generation, collated."""
    comprehension = [s for s in data.train if s.kind == "comprehension"][: size // 2]
    generation = [s for s in data.train if s.kind == "generation"][: size // 2]
    return task.collate(comprehension + generation, torch.device("cpu"))


def step_times(ks: tuple[int, ...], repeats: int) -> list[dict]:
    """Median seconds of one training step per layout and k, interleaved in one process."""
    from workbench.adaptation.hlora import HLoRA, HLoRAPlainLoRA, MoELoRA

    from workbench.method import PlanInputs
    from workbench.registry import tasks

    task = tasks.get("medvl")()
    base = task.load_model(None)
    data, _ = task.prepare(base, task.read(None), 100_000, 100_000, 0)
    batch = _mixed_batch(task, data)
    records = []
    for k in ks:
        models = {}
        for cls in (HLoRAPlainLoRA, HLoRA, MoELoRA):
            method = cls(experts=k)
            model = method.prepare(copy.deepcopy(base)).train()
            plan = method.plan(task, model, data, PlanInputs(replace(_settings(), epochs=1)))
            adapt = next(stage for stage in plan if stage.name == "adapt")
            for name, p in model.named_parameters():
                p.requires_grad_(name in adapt.trainable)
            optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)
            models[cls.name] = (model, optimizer)
        times = {name: [] for name in models}
        for _ in range(repeats + 1):  # the first round warms up
            for name, (model, optimizer) in models.items():
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                task.loss(model, batch, True).backward()
                optimizer.step()
                times[name].append(time.perf_counter() - start)
        lora_s = float(np.median(times["hlora-lora"][1:]))
        for name, values in times.items():
            median = float(np.median(values[1:]))
            records.append({"k": k, "method": name, "seconds_per_step": median, "ratio_to_lora": median / lora_s})
    return records


def _settings():
    from workbench.trainer import TrainSettings

    return TrainSettings(epochs=1, batch_size=16, learning_rate=1e-3, ema_decay=None, patience=100)


def interference(epochs: int, seed: int = 0) -> list[dict]:
    """Comprehension scores after training comprehension alone, then after training generation too: into its own
    plug-in (H-LoRA) or into one adapter shared by both skills."""
    from workbench.adaptation.lora import PluginConfig, apply_plugins

    from workbench.registry import tasks
    from workbench.trainer import Trainer

    task = tasks.get("medvl")()
    base = task.load_model(None)
    data, _ = task.prepare(base, task.read(None), 100_000, 100_000, seed)
    comprehension = [s for s in data.train if s.kind == "comprehension"]
    generation = [s for s in data.train if s.kind == "generation"]
    val_c = [s for s in data.val if s.kind == "comprehension"]
    val_g = [s for s in data.val if s.kind == "generation"]
    test_c = [s for s in data.test if s.kind == "comprehension"]
    settings = replace(_settings(), epochs=epochs, seed=seed)
    config = PluginConfig(rank=32, alpha=64.0, experts=4)
    records = []
    for layout, plugins in (("separate plug-ins (H-LoRA)", ("comprehension", "generation")),
                            ("one shared adapter", ("shared",))):  # fmt: skip
        torch.manual_seed(seed)
        model = apply_plugins(copy.deepcopy(base), ["language"], {name: config for name in plugins})
        for p in [*model.projector_comprehension.parameters(), *model.projector_generation.parameters()]:
            p.requires_grad_(True)
        scores = []
        for samples, val in ((comprehension, val_c), (generation, val_g)):
            Trainer(model, task.loss, task.collate, samples, val, settings, progress=False).fit()
            model.train()
            scores.append(task.evaluate(model, test_c, torch.device("cpu")).metrics)
        for stage, metrics in zip(("after comprehension", "after generation too"), scores):
            records.append({"adapters": layout, "stage": stage,
                            **{k: metrics[k] for k in ("closed_accuracy", "open_recall", "report_f1")}})  # fmt: skip
    return records


def tables(results: dict) -> str:
    lines = []
    if results.get("quality"):
        q = results["quality"]
        seeds = sorted({r["seed"] for r in q})
        lines += [f"Quality, {len(seeds)} seed(s), {results['epochs']} epochs per stage (mean ± sd over seeds)", ""]
        head = ["method"] + list(SCORES) + ["adapt s/epoch"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for method in METHODS:
            rows = [r for r in q if r["method"] == method]
            cells = [LABELS[method]]
            for key in SCORES + ("adapt_seconds_per_epoch",):
                values = np.array([r[key] for r in rows if key in r], float)
                cells.append(f"{values.mean():.3f} ± {values.std():.3f}" if len(values) else "–")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if results.get("step_times"):
        lines += ["Training step time against the number of experts k (median, ratio to plain LoRA)", ""]
        lines.append("| k | LoRA | H-LoRA | MoELoRA |")
        lines.append("|---|---|---|---|")
        for k in sorted({r["k"] for r in results["step_times"]}):
            by = {r["method"]: r for r in results["step_times"] if r["k"] == k}
            cells = [f"{by[m]['seconds_per_step'] * 1e3:.0f} ms ({by[m]['ratio_to_lora']:.2f}×)"
                     for m in ("hlora-lora", "hlora", "moelora")]  # fmt: skip
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        lines.append("")
    if results.get("interference"):
        lines += ["Comprehension before and after generation is trained (seed 0)", ""]
        lines.append("| adapters | stage | closed accuracy | open recall | report F1 |")
        lines.append("|---|---|---|---|---|")
        for r in results["interference"]:
            lines.append(f"| {r['adapters']} | {r['stage']} | {r['closed_accuracy']:.3f} | {r['open_recall']:.3f} | "
                         f"{r['report_f1']:.3f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=4, help="epochs per training stage")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--parts", nargs="+", default=["quality", "step_times", "interference"])
    parser.add_argument("--table", action="store_true", help="print the saved results and stop")
    args = parser.parse_args()
    if args.table:
        print(tables(json.loads(RESULTS.read_text())))
        return
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    machine = f"{torch.get_num_threads()} CPU threads, torch {torch.__version__}"
    results.update({"epochs": args.epochs, "machine": machine})
    RESULTS.parent.mkdir(exist_ok=True)
    if "step_times" in args.parts:
        results["step_times"] = step_times(tuple(args.ks), args.repeats)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")  # each part saved as soon as it is done
    if "interference" in args.parts:
        results["interference"] = interference(args.epochs)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    if "quality" in args.parts:
        with tempfile.TemporaryDirectory() as runs:
            results["quality"] = quality(args.seeds, args.epochs, Path(runs))
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(tables(results))


if __name__ == "__main__":
    main()

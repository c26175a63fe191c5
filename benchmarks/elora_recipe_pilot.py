"""ELoRA and full fine-tuning at the authors' recipe (``--recipe elora:paper``), a pilot: one seed, the embedded
ethanol frames (50 train / 50 validation, the rest of the 10 trajectory blocks test), 2,000 optimizer steps
(200 epochs of 10 steps at batch 5; the authors' budget is up to 500 epochs), the best validation epoch kept.

Both methods train in one run under the same recipe (the paper's baseline ran the authors' recipe too); full
fine-tuning at the project's defaults (per-atom energy loss, EMA 0.99, clip 10, plateau ×0.5, early stopping after
15 epochs) on the same frames and seed is summarised beside them when given (``--tuned``).
What is stored per method: the validation loss of every epoch (the recipe's loss, 1·MSE(total energy) +
1000·MSE(forces), eV²), the validation and test force and energy MAE of every epoch (``--curves``; nothing chooses
on them), the kept epoch, and the test errors with their 95 % intervals over test frames.

    python benchmarks/elora_recipe_pilot.py run --seed 200 --out runs/elora-pilot          # ~25 min alone, 2 cores
    workbench adapt --domain rmd17 --method full --baselines '' --train-size 50 --val-size 50 --epochs 200 --seed 200
        --threads 1 --curves forces_mae_mev_per_a,energy_mae_mev --out runs/full-defaults       # (one line)
    python benchmarks/elora_recipe_pilot.py summarise runs/elora-pilot [--tuned runs/full-defaults]

One seed is a pilot, not a claim: the table says so and draws no verdict.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "elora_recipe_pilot.json"
FIGURE = ROOT / "docs" / "methods" / "elora_recipe_pilot.png"
METRICS = ("forces_mae_mev_per_a", "energy_mae_mev")


def run(seed: int, out: Path, epochs: int) -> None:
    command = [sys.executable, "-m", "workbench", "adapt", "--domain", "rmd17", "--recipe", "elora:paper",
               "--baselines", "full", "--curves", "forces_mae_mev_per_a,energy_mae_mev", "--epochs", str(epochs),
               "--seed", str(seed), "--threads", "1", "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True)


def _method(folder: Path, name: str, metrics: dict) -> dict:
    result = json.loads((folder / "results" / f"{name}.json").read_text())
    history = result["history"]
    key = "after" if name == metrics["method"] else name  # the run's chosen method's intervals are its "after"
    return {
        "validation_loss": [h["val_loss"] for h in history],
        "curves": [h.get("curves") for h in history],  # --curves: validation and test errors per epoch
        "learning_rate": [h["lr"] for h in history],
        "kept_epoch": result["best_epoch"] + 1,
        "epochs": len(history),
        "steps": sum(h["steps"] for h in history),
        "test": {m: result["metrics"][m] for m in METRICS},
        "test_interval": {m: metrics["intervals"][key].get(m) for m in METRICS},
        "trainable_parameters": result["trainable_parameters"],
    }


def summarise(folder: Path, tuned: Path | None) -> dict:
    metrics = json.loads((folder / "metrics.json").read_text())
    config = (folder / "config.yaml").read_text()
    summary = {
        "recipe": "elora:paper",
        "config": config,
        "seed": metrics["seed"],
        "before": {m: metrics["before"][m] for m in METRICS},
        "methods": {"elora (paper recipe)": _method(folder, "elora", metrics),
                    "full (paper recipe)": _method(folder, "full", metrics)},  # fmt: skip
        "verdict": "none: one seed (a pilot)",
    }
    if tuned is not None:
        tuned_metrics = json.loads((tuned / "metrics.json").read_text())
        summary["methods"]["full (the project's defaults)"] = _method(tuned, "full", tuned_metrics)
    RESULT.write_text(json.dumps(summary, indent=2) + "\n")
    _plot(summary)
    return summary


def _plot(summary: dict) -> None:
    """Validation loss, and validation and test force MAE (``--curves``) per epoch of every method."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4))
    loss_axes, force_axes = figure.subplots(1, 2)
    for label, method in summary["methods"].items():
        epochs = range(1, method["epochs"] + 1)
        line = force_axes.plot([], [])[0]  # the method's colour in both panels
        if "paper recipe" in label:  # the others' validation loss is another loss (per-atom energy)
            loss_axes.plot(epochs, method["validation_loss"], color=line.get_color(), label=label)
        for axes in (loss_axes, force_axes):
            axes.axvline(method["kept_epoch"], linestyle=":", color=line.get_color())
        if all(method["curves"]):
            for split, style in (("val", "--"), ("test", "-")):
                values = [point[split]["forces_mae_mev_per_a"] for point in method["curves"]]
                force_axes.plot(epochs, values, style, color=line.get_color(), label=f"{label}, {split}")
    loss_axes.set(xlabel="epoch (10 steps each)", ylabel="validation loss [eV²] (the recipe's)", yscale="log")
    force_axes.set(xlabel="epoch", ylabel="force MAE [meV/Å]", yscale="log")
    loss_axes.legend(fontsize=7)
    force_axes.legend(fontsize=7)
    figure.suptitle(f"ELoRA and full fine-tuning at the authors' recipe, seed {summary['seed']} (dotted: kept epoch)")
    figure.tight_layout()
    figure.savefig(FIGURE, dpi=110)


def table(summary: dict) -> str:
    lines = ["| method | kept epoch / run | test force MAE [meV/Å] | test energy MAE [meV] | trainable |",
             "|---|---|---|---|---|",
             f"| before | - | {summary['before']['forces_mae_mev_per_a']:.2f} | "
             f"{summary['before']['energy_mae_mev']:.2f} | - |"]  # fmt: skip
    for label, method in summary["methods"].items():
        force, energy = (method["test"][m] for m in METRICS)
        low_f, high_f = method["test_interval"]["forces_mae_mev_per_a"] or (float("nan"),) * 2
        lines.append(f"| {label} | {method['kept_epoch']} / {method['epochs']} | {force:.2f} [{low_f:.2f}, "
                     f"{high_f:.2f}] | {energy:.2f} | {method['trainable_parameters']:,} |")  # fmt: skip
    return "\n".join(lines) + f"\n\nOne seed ({summary['seed']}): {summary['verdict']}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    running = commands.add_parser("run")
    running.add_argument("--seed", type=int, default=200)
    running.add_argument("--epochs", type=int, default=200)
    running.add_argument("--out", type=Path, required=True)
    summary = commands.add_parser("summarise")
    summary.add_argument("folder", type=Path)
    summary.add_argument("--tuned", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.seed, args.out, args.epochs)
    else:
        print(table(summarise(args.folder, args.tuned)))


if __name__ == "__main__":
    main()

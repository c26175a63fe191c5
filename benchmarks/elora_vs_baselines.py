"""ELoRA vs full, readout-only and mace-torch LoRA fine-tuning on the embedded DFT target.

The claim under test (ELoRA, ICML 2025): on rMD17, fine-tuning a foundation potential with ELoRA gives
lower energy and force errors than full fine-tuning (25.5 % / 23.7 % better), i.e. ELoRA's force error
is at or below full fine-tuning's at low data. Every (train size, seed) is one `workbench.adapt` run in
this process, so all four methods see the same frames, validation set and foundation model.

    python benchmarks/elora_vs_baselines.py                       # 50 and 200 frames, seeds 0 1 2
    python benchmarks/elora_vs_baselines.py --train-sizes 50 --seeds 0 --epochs 10 --runs /tmp/quick  # a quick look

Each (train size, seed) run is a run directory under ``--runs``; one that is already complete there is
reused, so an interrupted benchmark continues where it stopped. Prints a table (mean ± standard
deviation over seeds) and writes the raw numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import workbench

METHODS = ("elora", "full", "readout", "mace-lora")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-sizes", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--molecule", default="ethanol")
    parser.add_argument("--runs", default="runs/benchmark-elora", help="folder of the run directories")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "elora_vs_baselines.json"))
    args = parser.parse_args()

    records = []
    for size in args.train_sizes:
        for seed in args.seeds:
            out = Path(args.runs) / f"{args.molecule}-{size}-{seed}"
            if (out / "metrics.json").is_file():  # finished earlier: reuse
                metrics = json.loads((out / "metrics.json").read_text())
            else:
                metrics = workbench.adapt(
                    domain="rmd17",
                    method="elora",
                    baselines=list(METHODS[1:]),
                    train_size=size,
                    seed=seed,
                    epochs=args.epochs,
                    out=str(out),
                    quiet=True,
                    resume=out.exists(),
                    molecule=args.molecule,
                ).metrics
            costs = ("trainable_parameters", "seconds_per_epoch", "epochs", "best_epoch")
            for method in METHODS:
                values = metrics["after"] if method == "elora" else metrics["baselines"][method]
                records.append(
                    {
                        "train_size": size,
                        "seed": seed,
                        "method": method,
                        **values,
                        **{k: metrics["costs"][method][k] for k in costs},
                    }
                )
            records.append({"train_size": size, "seed": seed, "method": "before", **metrics["before"]})
            print(f"done: {size} frames, seed {seed}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps({"molecule": args.molecule, "epochs": args.epochs, "records": records}, indent=1)
    )
    print(table(records))


def table(records: list[dict]) -> str:
    columns = [
        ("energy_mae_mev", "E MAE meV"),
        ("forces_mae_mev_per_a", "F MAE meV/Å"),
        ("energy_rmse_mev", "E RMSE meV"),
        ("forces_rmse_mev_per_a", "F RMSE meV/Å"),
    ]
    lines = [
        f"{'frames':>6} {'method':10}"
        + "".join(f"{title:>18}" for _, title in columns)
        + f"{'trainable':>11}{'s/epoch':>9}{'epochs':>8}"
    ]
    for size in sorted({r["train_size"] for r in records}):
        for method in ("before", *METHODS):
            rows = [r for r in records if r["train_size"] == size and r["method"] == method]
            cells = "".join(
                f"{np.mean([r[k] for r in rows]):10.2f} ± {np.std([r[k] for r in rows]):5.2f}" for k, _ in columns
            )
            costs = (
                (
                    f"{rows[0]['trainable_parameters']:>11,}{np.mean([r['seconds_per_epoch'] for r in rows]):9.2f}"
                    f"{np.mean([r['epochs'] for r in rows]):8.1f}"
                )
                if method != "before"
                else ""
            )
            lines.append(f"{size:>6} {method:10}{cells}{costs}")
        elora = np.mean(
            [r["forces_mae_mev_per_a"] for r in records if r["train_size"] == size and r["method"] == "elora"]
        )
        full = np.mean(
            [r["forces_mae_mev_per_a"] for r in records if r["train_size"] == size and r["method"] == "full"]
        )
        lines.append(
            f"{'':6} force MAE ELoRA / full = {elora / full:.3f} "
            f"({'at or below' if elora <= full else 'above'} full fine-tuning)"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

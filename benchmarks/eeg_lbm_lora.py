"""The brainwave-foundation-model claims (seed 001) on subject-wise folds: does the LBM earn its size, what does
head-only tuning lose, and which LoRA targets match full fine-tuning?

Claims under test (METHODS.md, "Large brainwave foundation models with LoRA"): full fine-tuning of an LBM gains
only ~0.5–1 % over EEGNet-sized nets for ~1000× the parameters; head-only tuning loses 8–10 points; LoRA (alpha 8,
dropout 0.5, fused qkv, biases frozen) matches full fine-tuning, best when several components are adapted at once.

Each (task, seed) is a subject-wise fold: the seed shuffles the subjects and holds out ``--test-subjects`` for the
scores and ``--val-subjects`` for early stopping (`workbench.domains.eeg.task.split_subjects`). On each fold, one
`workbench.adapt` run trains LoRA (conv + qkv, the task default) beside full fine-tuning of the shipped pretrained
LaBraM backbone, head-only tuning (``readout``), full fine-tuning of a fresh LaBraM (``full@labram``: what the
pretraining gives), EEGNet and ShallowFBCSPNet from scratch; then one run per other LoRA target set (conv, qkv, fc,
conv+fc, qkv+fc, conv+qkv+fc), each with the task's other LoRA settings. Data: generated sets in the published
layouts, with other subjects than the shipped backbones were pretrained on (seeds 11, not 7):

* ``sleepedf``: 12 nights (`generate_sleep_edf`), 2 test and 2 validation subjects per fold;
* ``motor-imagery``: 12 EEGMMIDB subjects with left/right imagery runs 4, 8, 12 of 10 trials (`generate_motor_imagery`,
  difficulty 0.35), 2 test and 2 validation subjects per fold.

    python benchmarks/eeg_lbm_lora.py                               # both tasks, seeds 0 1 2 (~25 min, 2 cores)
    python benchmarks/eeg_lbm_lora.py --tasks sleepedf --seeds 0 --epochs 5
    python benchmarks/eeg_lbm_lora.py --table                       # the tables of the saved results
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from workbench.domains.eeg.generate import generate_motor_imagery, generate_sleep_edf

import workbench

#: Generated data of each task (seed 11: subjects the shipped backbones never saw).
DATA_SEED = 11
BASELINES = {"full": "full", "readout": "readout", "fresh LaBraM, full": "full@labram", "EEGNet": "full@eegnet",
             "Shallow": "full@shallow"}  # fmt: skip
#: LoRA target sets run besides the default conv + qkv (one run each).
LORA_TARGETS = ("conv", "qkv", "fc", "conv,fc", "qkv,fc", "conv,qkv,fc")


def make_data(task: str, folder: Path) -> Path:
    """The generated set of ``task`` in ``folder`` (its published layout)."""
    if task == "sleepedf":
        return generate_sleep_edf(folder, seed=DATA_SEED, subjects=12)
    return generate_motor_imagery(folder, seed=DATA_SEED, subjects=12, runs=(4, 8, 12), trials_per_run=10)


def run_fold(task: str, data: Path, seed: int, epochs: int, runs: Path) -> list[dict]:
    """Every method on one subject-wise fold: a record per method (scores, trainable parameters, seconds)."""
    common = dict(domain=task, data=str(data), seed=seed, epochs=epochs, quiet=True, test_subjects=2, val_subjects=2)
    metrics = workbench.adapt(method="lora", baselines=list(BASELINES.values()), out=str(runs / f"{seed}"), **common)
    metrics = metrics.metrics
    found = {"LoRA conv+qkv": ("lora", metrics["after"])}
    found.update({column: (entry, metrics["baselines"][entry]) for column, entry in BASELINES.items()})
    records = [_record(task, seed, column, metrics, entry, scores) for column, (entry, scores) in found.items()]
    for targets in LORA_TARGETS:
        lora = workbench.adapt(
            method="lora",
            baselines=[],
            method_options={"targets": targets},
            out=str(runs / f"{seed}-{targets}"),
            **common,
        ).metrics
        records.append(_record(task, seed, f"LoRA {targets.replace(',', '+')}", lora, "lora", lora["after"]))
    return records


def _record(task: str, seed: int, column: str, metrics: dict, entry: str, scores: dict) -> dict:
    cost = metrics["costs"][entry]
    return {
        "task": task,
        "seed": seed,
        "method": column,
        "test_subjects": metrics["data_summary"]["split"]["test"],
        "balanced_accuracy": scores["balanced_accuracy"],
        "cohen_kappa": scores["cohen_kappa"],
        "macro_f1": scores["macro_f1"],
        "trainable_parameters": cost["trainable_parameters"],
        "total_parameters": cost["total_parameters"],
        "train_seconds": cost["train_seconds"],
    }


def table(records: list[dict]) -> str:
    """Per task and method: balanced accuracy and kappa (mean ± sd over folds), the difference to full fine-tuning
    of the pretrained LaBraM (folds won), trainable parameters and their share of full's."""
    lines = []
    for task in sorted({r["task"] for r in records}):
        rows = [r for r in records if r["task"] == task]
        full = {r["seed"]: r for r in rows if r["method"] == "full"}
        header = f"{task:<22}{'bal. acc.':>15}{'kappa':>15}{'− full':>15}{'trainable':>11}{'of full':>9}{'s':>7}"
        lines += [header, "-" * len(header)]
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["method"] == method]
            accuracy = [r["balanced_accuracy"] for r in mine]
            kappa = [r["cohen_kappa"] for r in mine]
            differences = [r["balanced_accuracy"] - full[r["seed"]]["balanced_accuracy"] for r in mine]
            wins = sum(d > 0 for d in differences)
            trainable = mine[0]["trainable_parameters"]
            share = trainable / full[mine[0]["seed"]]["trainable_parameters"]
            lines.append(
                f"{method:<22}{np.mean(accuracy):>8.3f} ± {np.std(accuracy):.3f}{np.mean(kappa):>8.3f} ± "
                f"{np.std(kappa):.3f}{np.mean(differences):>+9.3f} ({wins}/{len(mine)}){trainable:>11,}{share:>9.1%}"
                f"{np.mean([r['train_seconds'] for r in mine]):>7.0f}"
            )
        lines.append("")
    lines.append(
        "balanced accuracy and Cohen's kappa on the held-out subjects, mean ± sd over subject-wise folds (seeds); "
        "− full: difference to full fine-tuning of the pretrained LaBraM (folds where the method is better); "
        "s: training seconds"
    )
    return "\n".join(lines)


def claims(records: list[dict]) -> str:
    """The seed's claims per task: full fine-tuning vs the small nets (gain, parameter ratio), the head-only gap,
    what pretraining gives, and the best LoRA target set vs full (mean over folds, folds won)."""
    lines = []
    for task in sorted({r["task"] for r in records}):
        rows = [r for r in records if r["task"] == task]
        by = {(r["method"], r["seed"]): r for r in rows}
        seeds = sorted({r["seed"] for r in rows})

        def gap(a: str, b: str) -> str:
            d = [by[a, s]["balanced_accuracy"] - by[b, s]["balanced_accuracy"] for s in seeds]
            return f"{np.mean(d):+.3f} ({sum(v > 0 for v in d)}/{len(d)} folds)"

        def ratio(a: str, b: str) -> float:
            return by[a, seeds[0]]["trainable_parameters"] / by[b, seeds[0]]["trainable_parameters"]

        lora = [m for m in dict.fromkeys(r["method"] for r in rows) if m.startswith("LoRA")]
        best = max(lora, key=lambda m: np.mean([by[m, s]["balanced_accuracy"] for s in seeds]))
        lora_share = f"{ratio('LoRA conv+qkv', 'full'):.1%} trainable"
        found = {
            "full fine-tuning − EEGNet": f"{gap('full', 'EEGNet')}, {ratio('full', 'EEGNet'):.0f}x the parameters",
            "full fine-tuning − Shallow": f"{gap('full', 'Shallow')}, {ratio('full', 'Shallow'):.1f}x the parameters",
            "full − head only": gap("full", "readout"),
            "pretrained − fresh LaBraM": f"{gap('full', 'fresh LaBraM, full')} (both fully fine-tuned)",
            "LoRA conv+qkv − full": f"{gap('LoRA conv+qkv', 'full')}, {lora_share}",
            f"best, {best} − full": f"{gap(best, 'full')}, {ratio(best, 'full'):.1%} trainable",
        }
        lines += [f"{task}:"] + [f"  {label:32}{text}" for label, text in found.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["sleepedf", "motor-imagery"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--runs", default=None, help="folder for the data and run directories (default: temporary)")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "eeg_lbm_lora.json"))
    parser.add_argument("--table", action="store_true", help="print the tables of the --json results, run nothing")
    args = parser.parse_args()
    if args.table:
        records = json.loads(Path(args.json).read_text())["records"]
        print(table(records) + "\n\n" + claims(records))
        return

    records = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.runs or scratch)
        for task in args.tasks:
            data = make_data(task, work / f"{task}-data")
            for seed in args.seeds:
                records += run_fold(task, data, seed, args.epochs, work / task)
                print(f"done: {task}, seed {seed} ({time.perf_counter() - start:.0f} s)", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    summary = {"epochs": args.epochs, "data_seed": DATA_SEED, "seconds": time.perf_counter() - start}
    Path(args.json).write_text(json.dumps({**summary, "records": records}, indent=1) + "\n")
    print(table(records) + "\n\n" + claims(records))


if __name__ == "__main__":
    main()

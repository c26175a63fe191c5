"""The brainwave-foundation-model claims (METHODS.md, "Large brainwave foundation models with LoRA", seed 001) on
grouped subject folds of generated cohorts of 30 subjects: does the pretrained LaBraM earn its size, what does
head-only tuning lose, does LoRA match full fine-tuning, and which LoRA target set is best at an equal budget?

Claims under test (the study's): full fine-tuning of an LBM beats EEGNet-sized nets (the study: by ~0.5–1 % for
~1000× the parameters); head-only tuning (``readout``) loses (the study: 8–10 points); the pretraining is worth
something over a fresh LaBraM (``full@labram``, sleep); LoRA in the study's setting (``lora``: conv + fused qkv,
rank 8, alpha 8, dropout 0.5, conv ranks by the power-of-2 rule, the task's `LBM_LORA`) matches full fine-tuning;
adapting several components beats adapting one — compared here at matched trainable budgets (`MATCHED`): conv + fc
at rank 3 and conv + qkv + fc at rank 2 hold 94 % and 88 % of the default's trainable parameters (alpha = rank, so
the update scale alpha / rank stays 1 as in the study's setting). Cut to fit this loaded machine (`ENTRIES`, `cut`):
head-only tuning, the fresh LaBraM and LoRA conv+fc are defined but not run; motor imagery runs full fine-tuning
against ShallowFBCSPNet alone.

How it is measured: `workbench compare` on each task, 3 grouped folds of the 30 subjects × seeds 200–202 (every
subject tested once per seed: 10 test subjects, 4 validation and 16 training subjects per fold; ≥ 500 test windows
per fold), every entry on the same cells and trained the same `EPOCHS` epochs with no early stopping (budget
``steps``) on `TRAIN_WINDOWS` training windows drawn per cell from the training subjects (the cut that fits the
machine), each entry's learning rate chosen per cell on its validation loss from `LR_GRID`, paired to full
fine-tuning. "Not worse" takes a margin of 0.02 balanced
accuracy: twice the study's whole gain of an LBM over EEGNet (~1 point).

The backbones are pretrained on another generator configuration than the test cohorts (`BACKBONES`, made by
``python benchmarks/eeg_lbm_lora.py --pretrain``; card labram-benchmark-backbones):

* sleep: `workbench.domains.eeg.sleep_simulator.SOURCE_SLEEP_COHORT` (seed 7: slower alpha and spindles, steeper 1/f
  background, amplitudes × 1.25, derivation gains ±25 % per subject, 3 µV amplifier noise), masked patch
  reconstruction as the shipped backbone;
* motor imagery: other subjects (seed 7) and runs (4, 6, 8, 10 of 6 trials: fists vs feet too, rest windows
  included) of the same difficulty (0.35; not another montage noise: cut), pretrained with the ``spectrum`` target
  (`workbench.domains.eeg.pretrain.TARGETS`): from the shipped backbone's ``patch`` target (masked samples + spectra)
  LaBraM fits the training windows' waveforms and stays at chance on held-out subjects (``eeg_lbm_lora_probe.py``
  measures why; card labram-benchmark-backbones).

The data (card eeg-lbm-lora-cohorts), generated deterministically into ``benchmarks/runs/eeg_lbm_lora-data/`` by
`cohort` through the domain's generators (real EDF files), not shipped (≈ 36 MB each), one cohort per seed (the
generator's seed is the comparison's: each unit draws new subjects, none of them the backbones' seed-7 ones, so the
intervals cover new cohorts, not only new partitions of one):

* ``sleepedf``: 30 nights of 5 sleep cycles (64–70 scored 30-s epochs each; `generate_sleep_edf`, the embedded
  set's configuration with ``cycles=5``);
* ``motor-imagery``: 30 EEGMMIDB subjects with left/right imagery runs 4, 8, 12 of 18 trials (54 windows each;
  `generate_motor_imagery`, difficulty 0.35).

Results before the cohorts were drawn per seed (one cohort of generator seed 11 re-partitioned by every seed) are in
the git history of ``results/eeg_lbm_lora_<task>.json``.

    python benchmarks/eeg_lbm_lora.py                   # both tasks (sleep, then motor imagery)
    python benchmarks/eeg_lbm_lora.py --only sleep      # one of them
    python benchmarks/eeg_lbm_lora.py --dev --epochs 2  # seeds 0, 1, a quick look (no results file)
    python benchmarks/eeg_lbm_lora.py --pretrain        # remake the two backbones (≈ 20 min on a loaded core)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from claims import HERE, Benchmark, run

from workbench.comparison.design import CompareSpec
from workbench.comparison.report import Claim

#: Subjects of each generated cohort (one per seed: `cohort`), and where the cohorts are written (relative to the
#: repository).
SUBJECTS = 30
SEEDS = (200, 201, 202)
#: The one cohort `eeg_lbm_lora_probe.py` and `lora_family.py` re-partition (generator seed 11).
FIXED_SEED = 11
DATA = Path("benchmarks") / "runs" / "eeg_lbm_lora-data"
#: Sleep cycles per generated night (`workbench.domains.eeg.sleep_simulator.SleepCohort.cycles`).
SLEEP_CYCLES = 5
#: Imagery runs and trials per run of each generated motor-imagery subject.
MI_RUNS, MI_TRIALS = (4, 8, 12), 18
#: The backbones every LaBraM entry starts from, pretrained on another generator configuration (`--pretrain`).
BACKBONES = {
    "sleepedf": Path("models") / "checkpoints" / "labram_sleepedf_source.safetensors",
    "motor-imagery": Path("models") / "checkpoints" / "labram_motor_spectrum.safetensors",
}
#: Epochs of every entry (the study's 20: 200 optimizer steps on sleep, 600 on motor imagery, where LaBraM stays near
#: chance for its first ~300 steps: eeg_lbm_lora_probe.py); training / validation windows drawn per cell (the cut
#: that fits this machine).
EPOCHS = {"sleepedf": 20, "motor-imagery": 20}
#: Learning rates each entry chooses from per cell on its validation loss (the task's 1e-3 in the middle).
LR_GRID = (3e-4, 1e-3, 3e-3)
GRID_TEXT = ", ".join(f"{rate:.0e}".replace("e-0", "e-") for rate in LR_GRID)  # "3e-4, 1e-3, 3e-3"
TRAIN_WINDOWS = {"sleepedf": 160, "motor-imagery": 480}
VAL_WINDOWS = 64
#: LoRA target sets at a budget matched to the default ``lora`` (conv + qkv, rank 8: 7,023 trainable parameters on
#: sleep, 10,504 on motor imagery): conv + fc rank 3 (6,607 / 9,864) and conv + qkv + fc rank 2 (6,191 / 9,224).
MATCHED = {
    "lora:conv+fc": {"targets": "conv,fc", "rank": 3, "alpha": 3.0},
    "lora:conv+qkv+fc": {"targets": "conv,qkv,fc", "rank": 2, "alpha": 2.0},
}
#: What each task compares (cut to fit: sleep without head-only tuning, the fresh LaBraM and LoRA conv+fc; motor
#: imagery full fine-tuning against ShallowFBCSPNet alone; see `cut`).
ENTRIES = {
    "sleepedf": ("full", "lora", "lora:conv+qkv+fc", "full@eegnet", "full@shallow"),
    "motor-imagery": ("full", "full@shallow"),
}
NAMES = {
    "full": "full fine-tuning (`full`)",
    "lora": "LoRA conv+qkv r8 (`lora`, the study's setting)",
    "lora:conv+fc": "LoRA conv+fc r3 (`lora:conv+fc`, matched budget)",
    "lora:conv+qkv+fc": "LoRA conv+qkv+fc r2 (`lora:conv+qkv+fc`, matched budget)",
    "readout": "head only (`readout`)",
    "full@labram": "fresh LaBraM, full (`full@labram`)",
    "full@eegnet": "EEGNet (`full@eegnet`)",
    "full@shallow": "ShallowFBCSPNet (`full@shallow`)",
}
METRIC = "balanced_accuracy"
NOT_WORSE = 0.02


def cohort(task: str, seed: int = FIXED_SEED) -> Path:
    """The generated 30-subject set of ``task`` for the comparison's seed ``seed`` (the generator's seed), under
    `DATA` (written once)."""
    from workbench.domains.eeg.generate import generate_motor_imagery, generate_sleep_edf
    from workbench.domains.eeg.sleep_simulator import SleepCohort

    folder = Path(folder_of(task).replace("{seed}", str(seed)))
    if folder.is_dir():  # written atomically: a folder that exists is complete
        return folder
    if task == "sleepedf":
        return generate_sleep_edf(folder, seed=seed, subjects=SUBJECTS, cohort=SleepCohort(cycles=SLEEP_CYCLES))
    return generate_motor_imagery(folder, seed=seed, subjects=SUBJECTS, runs=MI_RUNS, trials_per_run=MI_TRIALS)


def folder_of(task: str) -> str:
    """Where `cohort` writes ``task``'s set of each seed, a path holding ``{seed}`` (relative to the repository)."""
    if task == "sleepedf":
        return str(DATA / f"sleepedf-seed{{seed}}-{SUBJECTS}subjects-{SLEEP_CYCLES}cycles")
    return str(DATA / f"motor-imagery-seed{{seed}}-{SUBJECTS}subjects-{MI_TRIALS}trials")


def pretrain_backbones() -> None:
    """Remake `BACKBONES`: each task's LaBraM pretrained on another generator configuration than its test cohort."""
    import tempfile

    import torch
    from workbench.domains.eeg.pretrain import motor_corpus, pretrain_labram, sleep_corpus
    from workbench.domains.eeg.sleep_simulator import SOURCE_SLEEP_COHORT
    from workbench.domains.eeg.task import SLEEP_CHANNEL_MAP

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as work:
        sleep = sleep_corpus(Path(work), "uv100", cohort=SOURCE_SLEEP_COHORT)
        motor = motor_corpus(Path(work), "uv100")
    print(pretrain_labram(sleep, BACKBONES["sleepedf"], dict(SLEEP_CHANNEL_MAP), epochs=150, label="sleep"))
    print(pretrain_labram(motor, BACKBONES["motor-imagery"], None, epochs=60, target="spectrum", label="motor"))


def spec(task: str) -> CompareSpec:
    """The comparison of every entry on ``task``: 3 subject folds × seeds 200–202, `EPOCHS` epochs each."""
    return CompareSpec(
        task,
        ENTRIES[task],
        reference="full",
        folds=3,
        seeds=SEEDS,
        budget="steps",
        epochs=EPOCHS[task],
        lr_grid=LR_GRID,
        train_size=TRAIN_WINDOWS[task],
        val_size=VAL_WINDOWS,
        data=folder_of(task),
        model=str(BACKBONES[task]),
        method_options={label: options for label, options in MATCHED.items() if label in ENTRIES[task]},
    )


def cut(task: str) -> str:
    """What the benchmark of ``task`` cuts to fit this machine (rendered under its table)."""
    return (
        f"Cut on this 2-core machine: 3 folds × 3 seeds (3 independent units, the fewest a verdict takes; no "
        f"development pilot sized them), {TRAIN_WINDOWS[task]} training windows drawn per cell from the 16 training "
        f"subjects' ~1,000, {VAL_WINDOWS} validation windows; generated cohorts, not the study's 10-fold CV of real "
        f"ones; LoRA target sets conv, qkv or fc alone are not run. Every entry: {EPOCHS[task]} epochs (the study's), "
        f"its learning rate chosen per cell on validation loss from {GRID_TEXT}."
    )


SLEEP = Benchmark(
    name="eeg_lbm_lora_sleep",
    script="eeg_lbm_lora.py --only sleep",
    spec=spec("sleepedf"),
    metrics=(METRIC, "cohen_kappa"),
    names=NAMES,
    note=cut("sleepedf") + (
        " Cut too: head-only tuning, the fresh LaBraM (`full@labram`) and LoRA conv+fc at the matched budget. Chance "
        "is 0.2 balanced accuracy (five stages)."
    ),
    claims=(
        Claim("lora", METRIC, kind="equivalent", margin=NOT_WORSE,
              text=f"LoRA conv+qkv (the study's setting) is equivalent to full fine-tuning within ±{NOT_WORSE}"),
        Claim("lora:conv+qkv+fc", METRIC, against="lora",
              text="at a matched budget (88 % of its parameters), LoRA on conv+qkv+fc beats conv+qkv"),
        Claim("full", METRIC, against="full@eegnet", text="full fine-tuning of the pretrained LaBraM beats EEGNet"),
        Claim("full", METRIC, against="full@shallow",
              text="full fine-tuning of the pretrained LaBraM beats ShallowFBCSPNet"),
    ),
)  # fmt: skip
MOTOR = Benchmark(
    name="eeg_lbm_lora_motor",
    script="eeg_lbm_lora.py --only motor",
    spec=spec("motor-imagery"),
    metrics=(METRIC, "cohen_kappa"),
    names=NAMES,
    note=cut("motor-imagery") + (
        " Cut too: every LoRA, head-only tuning, the fresh LaBraM and EEGNet. Chance is 0.5 balanced accuracy (two "
        "balanced classes); no claim can pair an entry with a constant, so read it off the mean ± sd column."
    ),
    claims=(
        Claim("full", METRIC, against="full@shallow",
              text="full fine-tuning of the pretrained LaBraM beats ShallowFBCSPNet"),
        Claim("full@shallow", METRIC, text="ShallowFBCSPNet beats full fine-tuning of the pretrained LaBraM"),
    ),
)  # fmt: skip
BENCHMARKS = {"sleep": SLEEP, "motor": MOTOR}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=tuple(BENCHMARKS), help="run one task's benchmark (default: both)")
    parser.add_argument("--pretrain", action="store_true", help="remake the two backbones (BACKBONES) and stop")
    args, rest = parser.parse_known_args(argv)
    os.chdir(HERE.parent)  # the data and backbone paths in the specs are relative to the repository
    if args.pretrain:
        pretrain_backbones()
        return
    for key, benchmark in BENCHMARKS.items():
        if args.only in (None, key):
            for seed in (0, 1) if "--dev" in rest else benchmark.spec.seeds:
                cohort(benchmark.spec.domain, seed)
            run(benchmark, rest)


if __name__ == "__main__":
    main(sys.argv[1:])

"""ELoRA vs full fine-tuning on the embedded rMD17 ethanol DFT target, at two training sizes (issue 38 item 4).

The claim under test (ELoRA, ICML 2025): fine-tuning a foundation potential with ELoRA gives lower force errors
than full fine-tuning at low data (the paper: 23.7 % lower on rMD17). Both entries start from the same shipped
foundation model and train the task's default epochs (40; the same optimizer steps, the best validation-loss epoch
kept) on ``SIZES`` frames drawn from each fold's training blocks. Folds: trajectory blocks of 40 frames (400 fs) and
a purge of ``GAP`` frames (200 fs, the forces' correlation time on these data: `workbench.domains.atomistic.task`)
between every test frame and the nearest training frame, so no training frame is a near copy of a test frame.
The test metric is the force MAE over every frame of the held-out blocks. Seeds 200-203: each redraws the folds, the
training frames and the training randomness (4 independent units × 3 folds).

The seed count: a development pilot (seeds 0-2) did not fit on this loaded machine, so seeds 200-202 ran first and
``workbench compare --plan --pilot benchmarks/runs/elora_vs_baselines_25 --effect 2.47`` (5 % of full fine-tuning's
49.4 meV/Å) asked for 4 seeds (sd of a seed's mean difference 1.06 meV/Å); seed 203 was then added. The verdict is
read once, on the 4 seeds.

Cut for this shared 2-core machine: mace-torch's LoRA (``mace-lora``) and readout-only training (``readout``) are
not run, and the 200-frame size is not run (with a 20-frame purge around 3-4 test blocks, a fold's training blocks
keep 100-200 of the 400 frames, and a 200-frame cell takes ~4× a 50-frame one).

    python benchmarks/elora_vs_baselines.py --workers 2       # both sizes, 2 entries × 3 folds × seeds 200-203
    python benchmarks/elora_vs_baselines.py --only 25 --dev   # seeds 0, 1 (development; no results file)
"""

from __future__ import annotations

import argparse
import sys

from claims import Benchmark, run

from workbench.comparison.design import CompareSpec
from workbench.comparison.report import Claim

SIZES = (25, 50)
#: Frames purged between test and training frames (200 fs at one frame per 10 fs).
GAP = 20
SEEDS = (200, 201, 202, 203)
#: The paper's reported force-error reduction of ELoRA against full fine-tuning on rMD17.
PAPER_REDUCTION = 0.237
#: Full fine-tuning's mean force MAE at 25 frames in this benchmark's table [meV/Å] (seeds 200-203): the base of the
#: margins below (the paper's 23.7 %, and 5 % for "not worse"), fixed from the reference's level, not the difference.
FULL_FORCES_MAE = 49.6


def size(frames: int) -> Benchmark:
    """The comparison at ``frames`` training frames per cell."""
    return Benchmark(
        name=f"elora_vs_baselines_{frames}",
        script=f"elora_vs_baselines.py --only {frames}",
        spec=CompareSpec("rmd17", ("full", "elora"), folds=3, seeds=SEEDS, budget="steps", train_size=frames,
                         task_options={"fold_gap": GAP}),  # fmt: skip
        metrics=("forces_mae_mev_per_a", "energy_mae_mev"),
        names={"full": "full fine-tuning", "elora": "ELoRA"},
        claims=(
            Claim("elora", "forces_mae_mev_per_a", margin=round(PAPER_REDUCTION * FULL_FORCES_MAE, 1),
                  text=f"{frames} frames: ELoRA's force error is {PAPER_REDUCTION:.1%} below full fine-tuning's or "
                  f"more ({PAPER_REDUCTION * FULL_FORCES_MAE:.1f} meV/Å: the paper's claim)"),
            Claim("elora", "forces_mae_mev_per_a",
                  text=f"{frames} frames: ELoRA's force error is lower than full fine-tuning's"),
            Claim("elora", "forces_mae_mev_per_a", kind="not_worse", margin=round(0.05 * FULL_FORCES_MAE, 1),
                  text=f"{frames} frames: ELoRA's force error is not worse than full's by more than "
                  f"{0.05 * FULL_FORCES_MAE:.1f} meV/Å (5 %)"),
            Claim("elora", "energy_mae_mev", text=f"{frames} frames: ELoRA's energy error is lower than full's"),
        ),  # fmt: skip
        note=(
            f"{frames} training frames per cell, 40 epochs (the task's default), batch 5, each method's default "
            f"learning rate; 3 folds of 40-frame trajectory blocks with a {GAP}-frame purge around test frames × seeds "
            "200-203 (4: what the plan asked for a 5 % MDD at 25 frames). Not run here: mace-torch's LoRA, "
            "readout-only, 200 frames (see the script's docstring)."
        ),
    )


BENCHMARKS = {frames: size(frames) for frames in SIZES}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--only", type=int, action="append", choices=SIZES, help="one training size (repeatable)")
    known, rest = parser.parse_known_args(sys.argv[1:])
    for frames, benchmark in BENCHMARKS.items():
        if not known.only or frames in known.only:
            run(benchmark, rest)

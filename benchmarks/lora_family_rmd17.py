"""The LoRA family on an equivariant interatomic potential (issue 27 item 4, rmd17's row): ELoRA with the refinements
that stay equivariant (`workbench.adaptation.lora.variants`, applied per path block) against plain ELoRA, on the
embedded rMD17 ethanol frames.

Every entry fine-tunes the shipped MACE foundation model with ELoRA at its defaults (rank 16, alpha 16, the authors'
learning rate 5e-3) but the one option its refinement changes. Same cells and budget for all (``steps``: the same
epochs, the best validation-loss epoch kept), 50 training frames of each fold's training blocks (ELoRA's low-data
setting) with `GAP` frames purged around the test blocks (`elora_vs_baselines.GAP`), the force MAE over the held-out
blocks.

Run: the two refinements with a claim (RepLoRA, Flat-LoRA at its authors' ρ 0.05) against plain ELoRA, 3 grouped
folds × seeds 200-202 (3 independent units, the fewest a verdict takes), 20 epochs (200 optimizer steps: the fewest
Flat-LoRA is tested at). Cut to fit this 2-core machine: PiSSA, LoRA-One, rsLoRA and DoRA on ELoRA (no claim; their
first look on seed 100 is spent), the task's 40 epochs, a learning-rate grid.

    python benchmarks/lora_family_rmd17.py --workers 2
"""

from __future__ import annotations

import lora_family
from claims import Benchmark, run
from elora_vs_baselines import GAP

from workbench.comparison.design import CompareSpec
from workbench.comparison.report import Claim

#: The refinements with a claim under test here (the others are not run: see the module docstring).
CLAIMED = ("lora:replora", "lora:flat")
#: Those of lora_family's refinements on ELoRA, labelled ``elora:*`` (GOAT is refused there: its routing breaks
#: equivariance).
VARIANTS = {
    label.replace("lora:", "elora:", 1): options
    for label, options in lora_family.VARIANTS.items()
    if label in CLAIMED
}
NAMES = {
    "elora": "ELoRA (`elora`)",
    **{
        label.replace("lora:", "elora:", 1): "+ " + name.replace("`lora:", "`elora:")
        for label, name in lora_family.NAMES.items()
        if label in CLAIMED
    },
}

BENCHMARK = Benchmark(
    name="lora_family_rmd17",
    spec=CompareSpec(
        "rmd17",
        ("elora", *VARIANTS),
        reference="elora",
        folds=3,
        seeds=(200, 201, 202),
        budget="steps",
        epochs=20,
        train_size=50,
        method_options=VARIANTS,
        task_options={"fold_gap": GAP},
    ),
    metrics=("forces_mae_mev_per_a", "energy_mae_mev"),
    names=NAMES,
    claims=(
        Claim("elora:replora", "forces_mae_mev_per_a", text="RepLoRA lowers ELoRA's force error at 50 frames"),
        Claim("elora:flat", "forces_mae_mev_per_a", text="Flat-LoRA lowers ELoRA's force error at 50 frames"),
    ),
    note=(
        f"Cut to fit this 2-core machine: 3 grouped folds (40-frame trajectory blocks, {GAP} frames purged around test "
        "frames) × seeds 200-202 (3 units; no development pilot sized them), 20 epochs (200 steps; the task's default "
        "is 40), 50 training frames, ELoRA's learning rate (5e-3) for every entry (no grid); PiSSA, LoRA-One, rsLoRA "
        "and DoRA on ELoRA not run; the embedded ethanol frames, not the published rMD17 set. Flat-LoRA at ρ 0.05, "
        "its authors' value; RepLoRA is the project's reading of its abstract."
    ),
)

if __name__ == "__main__":
    run(BENCHMARK)

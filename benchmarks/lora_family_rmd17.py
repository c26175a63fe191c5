"""The LoRA family on an equivariant interatomic potential (issue 27 item 4, rmd17's row): ELoRA with the refinements
that stay equivariant (`workbench.adaptation.lora.variants`, applied per path block) against plain ELoRA, on the
embedded rMD17 ethanol frames.

Every entry fine-tunes the shipped MACE foundation model with ELoRA at its defaults (rank 16, alpha 16, the authors'
learning rate 5e-3) but the one option its refinement changes: PiSSA and LoRA-One initialisation per path block,
rsLoRA scaling, DoRA, RepLoRA and Flat-LoRA. Same cells and budget for all (``steps``: the same epochs, the best
validation-loss epoch kept), 50 training frames of each fold's training blocks (ELoRA's low-data setting), the force
MAE over the held-out blocks.

Cut to fit this shared 2-core machine (one ELoRA cell takes 1-2 minutes here, mostly building and scoring the
model): 2 grouped folds × seed 100 (2 cells per entry: a first look, too few for any verdict), 5 epochs.

    python benchmarks/lora_family_rmd17.py
"""

from __future__ import annotations

import lora_family
from claims import Benchmark, run

from workbench.comparison import CompareSpec
from workbench.comparison_report import Claim

#: lora_family's refinements on ELoRA (GOAT is refused there: its routing breaks equivariance), labelled ``elora:*``.
VARIANTS = {
    label.replace("lora:", "elora:", 1): options
    for label, options in lora_family.VARIANTS.items()
    if label != "lora:goat"
}
NAMES = {
    "elora": "ELoRA (`elora`)",
    **{
        label.replace("lora:", "elora:", 1): "+ " + name.replace("`lora:", "`elora:")
        for label, name in lora_family.NAMES.items()
        if label in lora_family.VARIANTS and label != "lora:goat"
    },
}

BENCHMARK = Benchmark(
    name="lora_family_rmd17",
    spec=CompareSpec(
        "rmd17",
        ("elora", *VARIANTS),
        reference="elora",
        folds=2,
        seeds=(100,),
        budget="steps",
        epochs=5,
        train_size=50,
        method_options=VARIANTS,
    ),
    metrics=("forces_mae_mev_per_a", "energy_mae_mev"),
    names=NAMES,
    claims=(
        Claim("elora:replora", "forces_mae_mev_per_a", text="RepLoRA lowers ELoRA's force error at 50 frames"),
        Claim("elora:flat", "forces_mae_mev_per_a", text="Flat-LoRA lowers ELoRA's force error at 50 frames"),
    ),
    note=(
        "Cut to fit this shared 2-core machine: 2 grouped folds × seed 100 (2 cells per entry: too few for any "
        "verdict; read the Δ as a first look), 5 epochs (budget steps), 50 training frames, ELoRA's learning rate "
        "(5e-3) for every entry; the embedded ethanol frames, not the published rMD17 set."
    ),
)

if __name__ == "__main__":
    run(BENCHMARK)

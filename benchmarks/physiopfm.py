"""PhysioPFM at a new site (issue 12): does a LoRA generated from the site's class shapelets, with no backprop at the
site, do what a LoRA trained there does?

The folds hold out the patients of the embedded site D (6 patients: 2 tested per fold, 1 validating, 3 labelled);
the descriptors use the labelled and validating patients. Compared: the generated LoRA (``physiopfm``: diffusion
transformer over the bank of the other sites' LoRAs, PIP shapelets); the bank baselines with the same head and
adapters — the frozen backbone with the ETF head (``physiopfm-none``, the reference), the mean of the bank, the
nearest-descriptor entry — all choosing from the same bank entries (the generator's held-out tenth, drawn with the
cell's seed, is left out of every one); and methods that train at the site, 10 epochs each: the same LoRA by
backprop (``physiopfm-local``) and full fine-tuning. The bank methods take no optimizer step.

    python benchmarks/physiopfm.py            # 6 entries × 3 folds × seeds 100, 101
    python benchmarks/physiopfm.py --dev      # seeds 0, 1 (development; no results file)
"""

from __future__ import annotations

from claims import Benchmark, run

from workbench.comparison import CompareSpec
from workbench.comparison_report import Claim

METHODS = ("physiopfm-none", "physiopfm", "physiopfm-mean", "physiopfm-nearest", "physiopfm-local", "full")

BENCHMARK = Benchmark(
    name="physiopfm",
    spec=CompareSpec("physio", METHODS, folds=3, seeds=(100, 101), epochs=10),
    metrics=("balanced_accuracy", "macro_f1"),
    names={
        "physiopfm-none": "no LoRA (frozen + ETF head)",
        "physiopfm": "generated (diffusion)",
        "physiopfm-mean": "mean of bank",
        "physiopfm-nearest": "nearest-descriptor entry",
        "physiopfm-local": "local LoRA (backprop)",
        "full": "local full fine-tuning",
    },  # fmt: skip
    claims=(
        Claim("physiopfm", "balanced_accuracy", text="The generated LoRA beats no LoRA"),
        Claim(
            "physiopfm",
            "balanced_accuracy",
            against="physiopfm-mean",
            text="The generated LoRA beats the mean of the bank",
        ),  # fmt: skip
        Claim(
            "physiopfm",
            "balanced_accuracy",
            against="physiopfm-nearest",
            text="The generated LoRA beats the bank entry with the nearest descriptor",
        ),  # fmt: skip
        Claim(
            "physiopfm",
            "balanced_accuracy",
            against="physiopfm-local",
            kind="not_worse",
            margin=0.05,
            text="The generated LoRA is within 0.05 of the same LoRA trained at the site",
        ),  # fmt: skip
    ),
    note="Every bank method uses the same 49 of the bank's 54 entries of sites A–C in a cell (the generator's "
    "held-out tenth, drawn with the seed, left out of all of them). The bank methods take 0 optimizer steps (the "
    "steps column), and train s does not count the generator's fit on the bank, done in each of its cells "
    "(`generator_fit_seconds` in the cells' metrics); the others train 10 epochs each (the task's default: 20, "
    "with early stopping). Cut on this 2-core machine: the regressor, raw-series and bank-size (12, 24 entries) "
    "ablations, the linear probe, plain `lora` (its own head), other target sites.",
)

if __name__ == "__main__":
    run(BENCHMARK)

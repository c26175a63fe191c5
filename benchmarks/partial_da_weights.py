"""Partial domain adaptation on the generated problem: WARMPOT vs PADA class weights vs uniform weights vs oracle.

The claim under test (WARMPOT, Nguyen et al.): weighting source samples by a partial optimal-transport plan on
learned features sends almost no weight to the source classes the target lacks, and so improves target accuracy
over uniform weights (plain fine-tuning, ``full``) and over PADA's class weights, close to oracle weights that know
the target's classes. Each seed draws a fresh problem (the ``features`` task's ``partial-da``: 10 Gaussian classes,
the target lacks 5); the folds hold out target rows for scoring (the other target rows are the unlabelled pool).
Every method starts from the same source-only model and trains the same 40 epochs (the task default is 60 with
early stopping; cut to fit this machine).

    python benchmarks/partial_da_weights.py            # 4 methods × 3 folds × seeds 200-204
    python benchmarks/partial_da_weights.py --dev      # seeds 0, 1 (development; no results file)
"""

from __future__ import annotations

from claims import Benchmark, run

from workbench.comparison.design import CompareSpec
from workbench.comparison.report import Claim

BENCHMARK = Benchmark(
    name="partial_da_weights",
    spec=CompareSpec(
        "features", ("full", "warmpot", "pada", "oracle"), folds=3, seeds=tuple(range(200, 205)), epochs=40,
        learner="warmpot",  # uniform weights retrain the source model on its own data: not meant to move
    ),
    metrics=("balanced_accuracy", "accuracy"),
    names={"full": "uniform weights (full)", "pada": "PADA class weights", "oracle": "oracle weights"},
    claims=(
        Claim("warmpot", "balanced_accuracy", text="WARMPOT's weights beat uniform weights"),
        Claim("warmpot", "balanced_accuracy", against="pada", text="WARMPOT's weights beat PADA's class weights"),
        Claim("warmpot", "balanced_accuracy", kind="not_worse", margin=0.02, against="oracle",
              text="WARMPOT is not worse than oracle weights that know the target's classes by more than "
              "0.02"),  # fmt: skip
        Claim("warmpot", "outlier_weight_share", against="pada", direction="lower",
              text="WARMPOT puts less source weight on the classes the target lacks than PADA"),  # fmt: skip
    ),
)

if __name__ == "__main__":
    run(BENCHMARK)

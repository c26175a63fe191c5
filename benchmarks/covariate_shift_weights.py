"""Importance weights for covariate shift through the ``features`` task: ppDRE vs uLSIF, KLIEP, logistic DRE.

The claim under test (ppDRE, seed 001): projection pursuit keeps density-ratio estimation accurate in high
dimension, where kernel methods suffer, so its weights correct a covariate shift better. Each seed draws a fresh
generated regression problem (``problem=covariate-shift``: source ``N(0, I_d)``, a target shifted in a 2-dimensional
subspace, a misspecified linear model whose weighted fit the ratio must correct); the folds hold out target rows for
scoring. Every entry fits the same linear model for the same epochs, weighted by its estimator's ratio (``full``:
unweighted). The estimator-level NMSE against the known ratio is `benchmarks/density_ratio_nmse.py`.

    python benchmarks/covariate_shift_weights.py       # d = 10 and 50, 3 folds × seeds 200-202
    python benchmarks/covariate_shift_weights.py --dev
"""

from __future__ import annotations

import sys
from pathlib import Path

from claims import Benchmark, run

from workbench.comparison.design import CompareSpec
from workbench.comparison.report import Claim

ENTRIES = ("full", "dre-pp", "dre-ulsif", "dre-kliep", "dre-logistic")
NAMES = {"full": "unweighted (full)", "dre-pp": "ppDRE", "dre-ulsif": "uLSIF", "dre-kliep": "KLIEP",
         "dre-logistic": "logistic DRE"}  # fmt: skip


def dimension(dim: int) -> Benchmark:
    """The comparison on generated problems of ``dim`` features."""
    return Benchmark(
        name=f"covariate_shift_weights_d{dim}",
        spec=CompareSpec("features", ENTRIES, folds=3, seeds=tuple(range(200, 203)), learner="dre-pp",
                         task_options={"problem": "covariate-shift", "dim": dim}),  # fmt: skip
        metrics=("mse", "r2"),
        names=NAMES,
        script=Path(__file__).name,
        claims=(
            Claim("dre-pp", "mse", text=f"d = {dim}: ppDRE's weights lower the target error of the unweighted fit"),
            Claim("dre-pp", "mse", against="dre-ulsif", text="… and of uLSIF's weights"),
            Claim("dre-pp", "mse", against="dre-kliep", text="… and of KLIEP's weights"),
        ),
    )


BENCHMARKS = (dimension(10), dimension(50))

if __name__ == "__main__":
    for benchmark in BENCHMARKS:
        run(benchmark, sys.argv[1:])

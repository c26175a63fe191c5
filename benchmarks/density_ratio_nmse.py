"""ppDRE vs uLSIF, KLIEP and logistic-regression DRE on Gaussian covariate shift, d = 10, 50, 100.

The claim under test (ppDRE, seed 001): projection pursuit keeps density-ratio estimation accurate in
high dimension, where kernel methods suffer from the curse of dimensionality. Source ``N(0, I_d)``, and
three target families (`workbench.domains.features.covariate_shift`), each with a known ratio:

* ``subspace`` — shifted in a 2-dimensional random subspace: mean 1 along one direction, standard
  deviation 0.7 along both (`make_covariate_shift` defaults); ``Var_s(r) ≈ 1.6``.
* ``full-rank`` — the scale changes along all ``d`` directions of a random rotation, standard deviations
  log-evenly spread around 1 and scaled so that ``Var_s(r) = 1`` at every ``d`` (`make_full_rank_shift`).
* ``full-rank-mean`` — the same plus a mean shift of 0.5 along one direction (``Var_s(r) = 1`` in all).

Per (family, d, seed) every estimator fits ``r = p_target / p_source`` on 1000 unlabelled target and 1000 source
points and is scored two ways:

* ``nmse`` — on 5000 fresh source (denominator) points, each ratio normalised by its own mean over them:
  ``NMSE = mean[(r̂ / mean r̂ − r / mean r)²]``. The normalisation makes the score blind to the ratio's
  overall scale (which no estimator fixes exactly) and puts both on ``E_den[r] = 1``; the constant
  estimator ``r̂ = 1`` scores the normalised variance of the true ratio, ``Var_s(r)`` above (the
  reference a useful estimator must beat). The seed abstract does not define its NMSE; this is our choice.
* ``test_mse`` — target test MSE (5000 points) of affine least squares on the 1000 labelled source
  points, weighted by the estimator's ratio at them (mean-one, truncated at 10× the mean:
  `importance_weights`). The regression target is misspecified (``coefᵀx + u_1²``), so the weights matter;
  ``unweighted`` is the constant ratio and ``oracle`` the true one.

    python benchmarks/density_ratio_nmse.py                      # every family, d = 10 50 100, seeds 0 1 2
    python benchmarks/density_ratio_nmse.py --families full-rank --dims 10 --seeds 0  # a quick look

Prints, per family, mean ± standard deviation over seeds and writes every number as JSON (each record
names its family); all of it takes about 6 minutes on two busy CPU cores.

Results (seeds 0, 1, 2; ``benchmarks/results/density_ratio_nmse.json``), NMSE at d = 50: subspace
ppDRE 0.66 against uLSIF 1.51 (0.44×). On both full-rank families no estimator beats the constant by
much at d ≥ 50 with 1000 points each: ppDRE keeps 0–1 layers (1.01 and 0.97 against uLSIF 1.01 and
1.02; logistic 0.89 with the mean shift), and even the correctly specified Gaussian plug-in with
Ledoit–Wolf covariances reaches only 0.88 and 0.76 (see `workbench.adaptation.dre_pp`, known limits).
At d = 10, where the directions can be found, ppDRE scores 0.58 and 0.69 against uLSIF 0.73 and 0.80.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from workbench.adaptation.dre_baselines import KLIEP, ULSIF, LogisticDRE
from workbench.adaptation.dre_pp import PPDRE
from workbench.domains.features.covariate_shift import (
    importance_weights,
    make_covariate_shift,
    make_full_rank_shift,
    weighted_least_squares,
)

ESTIMATORS = {"ppdre": PPDRE, "ulsif": ULSIF, "kliep": KLIEP, "logistic": LogisticDRE}
REFERENCES = ("unweighted", "oracle")  # ratio 1 and the true ratio
FAMILIES = {  # name -> problem factory taking dim, seed and the sample sizes (see the module docstring)
    "subspace": make_covariate_shift,
    "full-rank": make_full_rank_shift,
    "full-rank-mean": lambda **kwargs: make_full_rank_shift(mean_shift=0.5, **kwargs),
}


def nmse(estimate: np.ndarray, truth: np.ndarray) -> float:
    """``mean[(r̂ / mean r̂ − r / mean r)²]`` over one sample (see the module docstring)."""
    return float(np.mean((estimate / estimate.mean() - truth / truth.mean()) ** 2))


def run_one(family: str, dim: int, seed: int, n_train: int, n_eval: int, max_weight: float) -> list[dict]:
    """Every estimator and reference on one problem of ``family``; one record each."""
    problem = FAMILIES[family](dim=dim, seed=seed, n_source=n_train, n_target=n_train, n_test=n_eval)
    x_eval = problem.sample("source", n_eval, seed=10_000 + seed)
    truth = problem.true_ratio(x_eval)

    def test_mse(ratio_at_source: np.ndarray) -> float:
        weights = importance_weights(ratio_at_source, max_weight=max_weight)
        coef, intercept = weighted_least_squares(problem.x_source, problem.y_source, weights)
        return float(np.mean((problem.x_test @ coef + intercept - problem.y_test) ** 2))

    records = []
    for name, cls in ESTIMATORS.items():
        start = time.perf_counter()
        model = cls(random_state=seed).fit(problem.x_target, problem.x_source)
        seconds = time.perf_counter() - start
        extra = {"n_layers": model.n_layers_} if name == "ppdre" else {}
        records.append(
            dict(
                family=family,
                estimator=name,
                dim=dim,
                seed=seed,
                seconds=seconds,
                nmse=nmse(model.ratio(x_eval), truth),
                test_mse=test_mse(model.ratio(problem.x_source)),
                **extra,
            )
        )
    constant = np.ones(n_eval)
    references = {"unweighted": (constant, np.ones(n_train)), "oracle": (truth, problem.true_ratio(problem.x_source))}
    for name, (at_eval, at_source) in references.items():
        records.append(
            dict(
                family=family,
                estimator=name,
                dim=dim,
                seed=seed,
                seconds=0.0,
                nmse=nmse(at_eval, truth),
                test_mse=test_mse(at_source),
            )
        )
    return records


def table(records: list[dict], metric: str, dims: list[int]) -> str:
    """Rows: estimators; columns: dimensions; cells: mean ± std over seeds."""
    names = [name for name in (*ESTIMATORS, *REFERENCES) if any(metric in r for r in records if r["estimator"] == name)]
    lines = [f"{metric:<12}" + "".join(f"{'d = ' + str(d):>18}" for d in dims)]
    for name in names:
        cells = []
        for d in dims:
            values = [r[metric] for r in records if r["estimator"] == name and r["dim"] == d]
            cells.append(f"{np.mean(values):>10.3f} ± {np.std(values):<5.3f}")
        lines.append(f"{name:<12}" + "".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES), help="target families (all by default)"
    )
    parser.add_argument("--dims", type=int, nargs="+", default=[10, 50, 100], help="input dimensions d")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one problem draw per seed")
    parser.add_argument("--n-train", type=int, default=1000, help="source and target training points each")
    parser.add_argument("--n-eval", type=int, default=5000, help="held-out source points (NMSE) and test points")
    parser.add_argument("--max-weight", type=float, default=10.0, help="importance-weight truncation (x mean)")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "density_ratio_nmse.json"))
    args = parser.parse_args()

    records = []
    for family in args.families:
        for dim in args.dims:
            for seed in args.seeds:
                records += run_one(family, dim, seed, args.n_train, args.n_eval, args.max_weight)
                print(f"{family}, d = {dim}, seed {seed}: done", flush=True)

    for family in args.families:
        rows = [r for r in records if r["family"] == family]
        print(f"\n=== {family} ===")
        for metric in ("nmse", "test_mse", "seconds", "n_layers"):
            print(table(rows, metric, args.dims), end="\n\n")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k != "json"}
    out.write_text(json.dumps({"config": config, "records": records}, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

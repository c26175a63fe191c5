"""Seconds per solve: `workbench.adaptation.warmpot.partial_plan` (entropic) vs POT's ``entropic_partial_wasserstein``.

Problem (n × n, float64): the features of `make_partial_da` with ``n`` source and ``n`` target samples
(10 classes, 5 in the target, dim 16), squared Euclidean cost divided by its maximum (so costs lie in
[0, 1]), uniform marginals ``1/n``, mass 0.5, ``reg`` 0.05. A partial-DA problem is used rather than
two random clouds because there the row and column constraints are active; on two overlapping
Gaussian clouds with mass 0.5 no marginal binds and both solvers stop after about two iterations.

Same stopping rule on both sides: POT stops when ``‖π_k − π_(k−1)‖_F <= stopThr``, measured every 10
iterations, or after ``numItermax``; `partial_plan` measures the same quantity on the same iterations
(``check_every=10``) against ``tol``. Both get ``--tol`` and ``--max-iter``. Beware POT's default
``stopThr=1e-100``: it is never reached, so POT always runs all ``numItermax`` iterations (1000).
POT's iterations multiply by ``diag(·)`` as a dense matrix product, ``O(n³)`` per iteration, and it
is run only up to ``--pot-max`` (its entries then read "—"). Each solver's time is the best of
``--repeats`` runs. The check: max |π_POT − π_ours| <= 1e-6 wherever both ran (also printed relative
to the largest plan entry, since entries are ~1/n² small).

    OMP_NUM_THREADS=1 python benchmarks/entropic_partial_ot_speed.py
    OMP_NUM_THREADS=1 python benchmarks/entropic_partial_ot_speed.py --sizes 512 2048 --repeats 1

Target: ours >= 10× faster than POT at n = 2048. Results: ``benchmarks/results/entropic_partial_ot_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import ot
import torch
from workbench.adaptation.warmpot import partial_plan
from workbench.domains.features.partial_da import make_partial_da

RESULTS = Path(__file__).resolve().parent / "results" / "entropic_partial_ot_speed.json"
MAX_DIFF = 1e-6


def problem(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cost ``(n, n)`` in [0, 1] and uniform weights ``(n,)``, float64."""
    draw = make_partial_da(n_source=n, n_target=n, seed=seed)
    cost = ot.dist(draw.source_x, draw.target_x)
    cost /= cost.max()
    uniform = np.full(n, 1.0 / n)
    return cost, uniform, uniform.copy()


def best_of(repeats: int, solve) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = solve()
        times.append(time.perf_counter() - start)
    return min(times), result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 2048, 8192], help="problem sizes n (n × n)")
    parser.add_argument("--pot-max", type=int, default=2048, help="run POT only for n up to this (default 2048)")
    parser.add_argument("--reg", type=float, default=0.05, help="entropic regularisation, cost units (default 0.05)")
    parser.add_argument("--mass", type=float, default=0.5, help="transported mass (default 0.5)")
    parser.add_argument("--tol", type=float, default=1e-9, help="stopThr = tol for both solvers (default 1e-9)")
    parser.add_argument("--max-iter", type=int, default=1000, help="numItermax = max_iter for both (default 1000)")
    parser.add_argument("--repeats", type=int, default=3, help="time the best of this many runs (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the partial-DA draw (default 0)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON results (default {RESULTS})")
    args = parser.parse_args(argv)

    print(f"{'n':>6} {'POT s':>9} {'ours s':>9} {'speed-up':>9} {'max diff':>9} {'rel diff':>9} {'POT it':>7}")
    rows = []
    for n in args.sizes:
        cost, a, b = problem(n, args.seed)
        cost_t, a_t, b_t = torch.from_numpy(cost), torch.from_numpy(a), torch.from_numpy(b)
        ours_s, ours = best_of(
            args.repeats,
            lambda: partial_plan(cost_t, a_t, b_t, args.mass, args.reg, max_iter=args.max_iter, tol=args.tol),
        )
        ours = ours.numpy()
        row = {"n": n, "ours_s": ours_s, "pot_s": None, "speedup": None, "max_abs_diff": None}
        row["max_rel_diff"] = row["pot_iterations"] = None
        row["plan_max"] = float(ours.max())
        row["max_row_excess"] = float((ours.sum(1) - a).max())
        if n <= args.pot_max:
            pot_s, (reference, log) = best_of(
                args.repeats,
                lambda: ot.partial.entropic_partial_wasserstein(
                    a, b, cost, args.reg, m=args.mass, numItermax=args.max_iter, stopThr=args.tol, log=True
                ),
            )
            checks = len(log["err"])  # POT measures after iterations 0, 10, 20, ... and stops after one of them
            stopped = log["err"][-1] <= args.tol
            diff = float(np.abs(reference - ours).max())
            row.update(
                pot_s=pot_s,
                speedup=pot_s / ours_s,
                max_abs_diff=diff,
                max_rel_diff=diff / float(reference.max()),
                pot_iterations=10 * (checks - 1) + 1 if stopped else args.max_iter,
            )
        rows.append(row)
        print_row(row)

    failed = [row["n"] for row in rows if row["max_abs_diff"] is not None and row["max_abs_diff"] > MAX_DIFF]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "problem": "make_partial_da(n_source=n, n_target=n, seed) features, squared Euclidean cost / max, uniform",
        "reg": args.reg,
        "mass": args.mass,
        "tol": args.tol,
        "max_iter": args.max_iter,
        "repeats": args.repeats,
        "seed": args.seed,
        "dtype": "float64",
        "torch": torch.__version__,
        "pot": ot.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "machine": platform.processor() or platform.machine(),
    }
    args.out.write_text(json.dumps({"config": meta, "rows": rows, "max_abs_diff_ok": not failed}, indent=2) + "\n")
    print(f"wrote {args.out}")
    if failed:
        raise SystemExit(f"max |plan difference| above {MAX_DIFF} at n = {failed}")
    return rows


def print_row(row: dict) -> None:
    def cell(value, spec: str, width: int) -> str:
        return f"{'—':>{width}}" if value is None else f"{value:>{width}{spec}}"

    print(
        f"{row['n']:>6} {cell(row['pot_s'], '.3f', 9)} {row['ours_s']:>9.3f} {cell(row['speedup'], '.1f', 8)}"
        f"{'×' if row['speedup'] else ' '} {cell(row['max_abs_diff'], '.1e', 9)} {cell(row['max_rel_diff'], '.1e', 9)} "
        f"{cell(row['pot_iterations'], 'd', 7)}",
        flush=True,
    )


if __name__ == "__main__":
    main()

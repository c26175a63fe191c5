"""Seconds of two CPU workloads, alone and beside one busy process, under three thread policies.

Workloads:
- ``rmd17-epoch``: one epoch of the default rmd17 run (ELoRA on the embedded MACE, embedded data; the mean of
  ``seconds`` over 2 epochs of `workbench.adapt`).
- ``partial-ot``: `workbench.adaptation.warmpot.partial_plan` (entropic, float64) on the n = 1024 partial-DA
  problem of ``benchmarks/entropic_partial_ot_speed.py`` (best of 3 solves).
Policies: ``today`` (torch's default: one thread per CPU, what every run used before `workbench.threads`),
``1-thread`` and ``default`` (`workbench.threads.choose_threads`). Conditions: ``alone`` and ``contended`` (a
second process spinning a pure-Python loop, started before and stopped after). Every cell runs in a fresh process;
the cells are interleaved, ``--repeats`` times, and the median is reported with its ratio to ``today`` in the
same condition.

    python benchmarks/threads_under_load.py               # ~5 min on 2 cores
    python benchmarks/threads_under_load.py --repeats 1 --workloads partial-ot

Target (issue 23): contended, the default is no slower than 1 thread; alone, no slower than today.
Results: ``benchmarks/results/threads_under_load.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "threads_under_load.json"
POLICIES = ("today", "1-thread", "default")

CHILD = r"""
import json, os, sys, tempfile, time
policy, workload = sys.argv[1], sys.argv[2]
threads = {"today": os.cpu_count(), "1-thread": 1, "default": None}[policy]
import workbench
from workbench.threads import use_threads
if workload == "partial-ot":
    import ot, torch
    from workbench.adaptation.warmpot import partial_plan
    from workbench.domains.features.partial_da import make_partial_da
    chosen = use_threads(threads)
    draw = make_partial_da(n_source=1024, n_target=1024, seed=0)
    cost = ot.dist(draw.source_x, draw.target_x)
    cost = torch.from_numpy(cost / cost.max())
    uniform = torch.full((1024,), 1 / 1024, dtype=torch.float64)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        partial_plan(cost, uniform, uniform, 0.5, 0.05, max_iter=1000, tol=1e-9)
        times.append(time.perf_counter() - start)
    seconds = min(times)
else:
    with tempfile.TemporaryDirectory() as out:
        run = workbench.adapt("rmd17", epochs=2, baselines=(), quiet=True, out=out + "/run", threads=threads)
        history = json.loads(open(out + "/run/results/elora.json").read())["history"]
        seconds, chosen = sum(h["seconds"] for h in history) / len(history), run.config.threads
print(json.dumps({"seconds": seconds, "threads": chosen}))
"""


def cell(policy: str, workload: str, contended: bool) -> dict:
    """One measurement in a fresh process, beside a busy process when ``contended``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if contended else None
    try:
        if busy is not None:
            time.sleep(1.0)  # let the scheduler see it
        done = subprocess.run([sys.executable, "-c", CHILD, policy, workload], env=env, capture_output=True,
                              text=True, check=False)  # fmt: skip
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    if done.returncode != 0:
        raise RuntimeError(f"{policy} {workload}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["partial-ot", "rmd17-epoch"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    cells = {(w, c, p): [] for w in args.workloads for c in ("alone", "contended") for p in POLICIES}
    for repeat in range(args.repeats):
        for workload, condition, policy in cells:
            cells[(workload, condition, policy)].append(cell(policy, workload, condition == "contended"))
            print(f"repeat {repeat} {workload:12} {condition:10} {policy:9} {cells[(workload, condition, policy)][-1]}",
                  file=sys.stderr, flush=True)  # fmt: skip
    rows = []
    for (workload, condition, policy), runs in cells.items():
        median = statistics.median(r["seconds"] for r in runs)
        today = statistics.median(r["seconds"] for r in cells[(workload, condition, "today")])
        rows.append({"workload": workload, "condition": condition, "policy": policy, "seconds_median": median,
                     "seconds": [r["seconds"] for r in runs], "threads": [r["threads"] for r in runs],
                     "ratio_to_today": median / today})  # fmt: skip
    print(f"{'workload':12} {'condition':10} {'policy':9} {'threads':>8} {'median s':>9} {'÷ today':>8}")
    for row in rows:
        threads = ",".join(str(t) for t in row["threads"])
        print(f"{row['workload']:12} {row['condition']:10} {row['policy']:9} {threads:>8} "
              f"{row['seconds_median']:9.3f} {row['ratio_to_today']:8.2f}")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "load_average_at_end": os.getloadavg()},  # fmt: skip
              "repeats": args.repeats, "rows": rows}
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written {args.json}")


if __name__ == "__main__":
    main()

"""Seconds of two CPU workloads, alone and beside one busy process, under three thread policies; and of one run
beside a competitor that stops halfway, with threads chosen once or following the load.

Workloads:
- ``rmd17-epoch``: one epoch of the default rmd17 run (ELoRA on the embedded MACE, embedded data; the mean of
  ``seconds`` over 2 epochs of `workbench.adapt`).
- ``partial-ot``: `workbench.adaptation.warmpot.partial_plan` (entropic, float64) on the n = 1024 partial-DA
  problem of ``benchmarks/entropic_partial_ot_speed.py`` (best of 3 solves).
Policies: ``today`` (torch's default: one thread per CPU, what every run used before `workbench.run.threads`),
``1-thread`` and ``default`` (`workbench.run.threads.choose_threads`). Conditions: ``alone`` and ``contended`` (a
second process spinning a pure-Python loop, started before and stopped after). Every cell runs in a fresh process;
the cells are interleaved, ``--repeats`` times, and the median is reported with its ratio to ``today`` in the
same condition.

``stopping-competitor`` (issue 41): the README's first command (`workbench.adapt` of rmd17 with its defaults;
``--epochs N``: ELoRA alone for N epochs without early stopping instead) in a fresh process, timed whole
(start-up included): ``quiet`` on the quiet machine (the default policy); then beside ``--competitors`` processes
spinning pure-Python loops (default 1), started 1 s before the run and stopped ``--stop-after`` seconds after it
started (default 60: "a process that stops after a minute"), with ``once``, the count
`workbench.run.threads.choose_threads` gives at start pinned for the whole run (what runs did before they followed the
load), and ``follow``, the default policy (`workbench.run.threads.ThreadPolicy`). Reported: wall seconds, ratio to
quiet, each epoch's threads.

    python benchmarks/threads_under_load.py               # ~5 min on 2 cores
    python benchmarks/threads_under_load.py --repeats 1 --workloads partial-ot
    python benchmarks/threads_under_load.py --workloads stopping-competitor   # ~12 min on 2 cores

Targets: issue 23, contended, the default is no slower than 1 thread; alone, no slower than today. Issue 41,
``follow`` within 15 % of ``quiet``. The competitor's minute bounds that from below: what the run does meanwhile on
part of the machine is time lost whatever the thread count.
Results: ``benchmarks/results/threads_under_load.json`` (``rows``; ``stopping_competitor``).
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
GRID = ("partial-ot", "rmd17-epoch")
STOPPING = "stopping-competitor"
SPIN = [sys.executable, "-c", "while True: pass"]

CHILD = r"""
import json, os, sys, tempfile, time
policy, workload = sys.argv[1], sys.argv[2]
threads = {"today": os.cpu_count(), "1-thread": 1, "default": None}[policy]
import workbench
from workbench.run.threads import use_threads
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
        seconds, chosen = sum(h["seconds"] for h in history) / len(history), history[0]["threads"]
print(json.dumps({"seconds": seconds, "threads": chosen}))
"""

#: One run of the stopping-competitor scenario: argv ``once|follow epochs``; prints each epoch's threads.
RUN = r"""
import json, sys, tempfile
import workbench
from workbench.run.threads import choose_threads
policy, epochs = sys.argv[1], int(sys.argv[2])
threads = choose_threads()[0] if policy == "once" else None
fixed = {"epochs": epochs, "patience": epochs, "baselines": ()} if epochs else {}  # 0: the README's first command
with tempfile.TemporaryDirectory() as out:
    run = workbench.adapt("rmd17", quiet=True, out=out + "/run", threads=threads, **fixed)
    print(json.dumps(run.metrics["costs"][run.metrics["method"]]["threads_per_epoch"]))
"""


def stopping_competitor(policy: str, epochs: int, stop_s: float | None, competitors: int = 1) -> dict:
    """Wall seconds and each epoch's threads of one run in a fresh process, beside ``competitors`` spinning
    processes that stop ``stop_s`` seconds after it started (alone when None)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    spinners = competitors if stop_s is not None else 0
    competitor = [subprocess.Popen(SPIN, stdout=subprocess.DEVNULL) for _ in range(spinners)]
    try:
        if competitor:
            time.sleep(1.0)  # let the scheduler see it
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", RUN, policy, str(epochs)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)  # fmt: skip
        if competitor:
            try:
                child.wait(timeout=stop_s)
            except subprocess.TimeoutExpired:
                pass
            for spinner in competitor:
                spinner.kill()
        stdout, stderr = child.communicate()
        seconds = time.perf_counter() - start
    finally:
        for spinner in competitor:
            spinner.kill()
            spinner.wait()
    if child.returncode != 0:
        raise RuntimeError(f"{policy}: {stderr[-2000:]}")
    return {"seconds": seconds, "threads_per_epoch": json.loads(stdout.strip().splitlines()[-1])}


def run_stopping(epochs: int, stop_s: float, competitors: int) -> dict:
    """The three runs of the stopping-competitor scenario, printed as a table; what the results file records."""
    quiet = stopping_competitor("follow", epochs, None)
    rows = [{"scenario": "quiet", **quiet}]
    for policy in ("once", "follow"):
        rows.append({"scenario": f"competitor stops, {policy}",
                     **stopping_competitor(policy, epochs, stop_s, competitors)})  # fmt: skip
    for row in rows:
        row["ratio_to_quiet"] = row["seconds"] / quiet["seconds"]
    print(f"{'scenario':26} {'wall s':>8} {'÷ quiet':>8}  threads per epoch")
    for row in rows:
        print(f"{row['scenario']:26} {row['seconds']:8.1f} {row['ratio_to_quiet']:8.2f}  "
              f"{''.join(map(str, row['threads_per_epoch']))}")  # fmt: skip
    run = f"rmd17 elora alone, {epochs} epochs" if epochs else "the README's first command (adapt --domain rmd17)"
    return {"machine": machine(), "run": run, "competitor": f"{competitors} spinning process(es)",
            "stop_after_s": stop_s, "rows": rows}


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


def run_grid(workloads: list[str], repeats: int) -> dict:
    """Every (workload, condition, policy) cell ``repeats`` times, interleaved, printed as a table; what the results
    file records."""
    cells = {(w, c, p): [] for w in workloads for c in ("alone", "contended") for p in POLICIES}
    for repeat in range(repeats):
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
    return {"machine": machine(), "repeats": repeats, "rows": rows}


def machine() -> dict:
    """CPUs, platform and load average now: what a results file says of the machine it was measured on."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_at_end": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(GRID), choices=[*GRID, STOPPING])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each grid cell (default: 3)")
    parser.add_argument("--epochs", type=int, default=0,
                        help=f"{STOPPING}: epochs of an ELoRA-alone run (default 0: the README's first command)")
    parser.add_argument("--stop-after", type=float, default=60.0,
                        help=f"{STOPPING}: seconds after the run's start at which the competitor stops (default: 60)")
    parser.add_argument("--competitors", type=int, default=1,
                        help=f"{STOPPING}: spinning processes beside the run (default: 1)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    record = json.loads(args.json.read_text()) if args.json.is_file() else {}  # a part measured replaces its own
    grid = [workload for workload in args.workloads if workload in GRID]
    if grid:
        record.update(run_grid(grid, args.repeats))
    if STOPPING in args.workloads:
        record["stopping_competitor"] = run_stopping(args.epochs, args.stop_after, args.competitors)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written {args.json}")


if __name__ == "__main__":
    main()

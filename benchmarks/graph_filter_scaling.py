"""Cost of one full-graph training epoch as graphs grow: 10k, 100k and 1M undirected edges.

Each size is a CSBM source/target pair with mean degree 10 (so 2k, 20k and 200k nodes per graph), 32
features, hidden width 64 — the csbm task's models and losses. One epoch = one optimiser step of the
method's training loss (`Method.loss(task, model, batch, training=True)`, the trainer's step): forward
and backward through both graphs for ``homophily`` and ``udagcn``, the source graph for the source-only
baselines. Reported: median seconds per epoch over ``--steps`` steps after one warm-up step, and the
process's peak resident memory after each size. The filters are sparse products: Ã has
2·edges + nodes stored entries (printed), never n² (at 200k nodes a dense Ã would need 160 GB).

    python benchmarks/graph_filter_scaling.py                 # 10k, 100k, 1M edges, 3 steps (a few minutes)
    python benchmarks/graph_filter_scaling.py --edges 10000 100000 --steps 5
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import time
from pathlib import Path

import torch
from workbench.domains.graphs.task import CSBMTask

from workbench.core.config import MethodEntry
from workbench.core.registry import methods

METHODS = ("homophily", "mixed-filters", "gcn", "udagcn", "mlp")
#: The run entry (METHOD@MODEL) behind each column.
ENTRIES = {"gcn": "full@gcn", "udagcn": "udagcn@gcn", "mlp": "full@graph-mlp"}


def peak_memory_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_method(task: CSBMTask, base: torch.nn.Module, batch, name: str, steps: int) -> float:
    """Median seconds of one optimiser step of ``name``'s training loss (after one warm-up step)."""
    entry = MethodEntry.parse(ENTRIES.get(name, name))
    method_name, model_name = entry.method, entry.model
    method = methods.get(method_name)()
    torch.manual_seed(0)
    model = method.prepare(copy.deepcopy(base) if not model_name else task.load_model(model_name))
    method.start_epoch(0, steps + 1)
    model.train()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    seconds = []
    for step in range(steps + 1):
        method.start_epoch(step, steps + 1)
        begin = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        method.loss(task, model, batch, True).backward()
        optimizer.step()
        if step:
            seconds.append(time.perf_counter() - begin)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edges", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--degree", type=float, default=10.0)
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "graph_filter_scaling.json"))
    args = parser.parse_args()

    records = []
    for edges in args.edges:
        nodes = int(round(2 * edges / args.degree))
        task = CSBMTask(nodes=nodes, mean_degree=args.degree)
        begin = time.perf_counter()
        raw = task.read(None, seed=0)
        generate_seconds = time.perf_counter() - begin
        base = task.load_model(None)
        data, _ = task.prepare(base, raw, 1, 1, 0)
        batch = task.collate(data.train, torch.device("cpu"))
        propagator = batch.source.propagator(torch.float32)
        record = {
            "edges": raw.source_graph.n_edges,
            "nodes": nodes,
            "propagator_entries": int(propagator._nnz()),
            "dense_would_need_gb": nodes * nodes * 4 / 1e9,
            "generate_seconds": generate_seconds,
        }
        for name in METHODS:
            record[name] = time_method(task, base, batch, name, args.steps)
            print(f"{edges:>9,} edges  {name:14} {record[name]:8.3f} s/epoch", flush=True)
        record["peak_memory_mb"] = peak_memory_mb()
        records.append(record)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"steps": args.steps, "records": records}, indent=1))
    print(table(records))


def table(records: list[dict]) -> str:
    header = f"{'edges':>10} {'nodes':>8} {'Ã entries':>10} " + " ".join(f"{m:>14}" for m in METHODS)
    header += f" {'peak RSS MB':>12}"
    lines = [header, "-" * len(header)]
    for r in records:
        lines.append(
            f"{r['edges']:>10,} {r['nodes']:>8,} {r['propagator_entries']:>10,} "
            + " ".join(f"{r[m]:>14.3f}" for m in METHODS)
            + f" {r['peak_memory_mb']:>12.0f}"
        )
    lines.append("seconds per full-graph training epoch (median; one CPU thread if OMP_NUM_THREADS=1)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

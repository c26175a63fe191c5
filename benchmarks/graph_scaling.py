"""Seconds per epoch and training-step memory of the csbm methods on real citation graphs, against nodes and
features: the dense feature path (before) and the sparse one (now) side by side in one process.

The graphs are cuts of ACMv9 → DBLPv7 as the ACDNE authors publish them (``tests/data/real/graphs``): the first
``fraction`` of each graph's nodes with the edges among them, and the first ``features`` bag-of-words columns. One
epoch is what the trainer does per epoch on this task: one optimiser step of the method's training loss (forward
and backward through both graphs for ``homophily`` and ``udagcn``) and one validation pass on the source. "dense"
reads the features as the (n, d) matrix (the code before: input dropout and the first layer on n · d entries);
"sparse" through `workbench.models.graph.SparseFeatures` (dropout and the first layer on the non-zeros). Reported:
median wall and CPU seconds per epoch over ``--steps`` epochs after one warm-up, and the peak bytes of tensors a
training step allocates (`workbench.core.memory.training_step_bytes`; the feature matrix itself, made before, is not
counted). On a shared machine CPU seconds are the steadier number.

    python benchmarks/graph_scaling.py                          # homophily, 5 sizes, both paths
    python benchmarks/graph_scaling.py --methods homophily udagcn --steps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from workbench.domains.graphs.graph import Graph
from workbench.domains.graphs.readers import read_graph
from workbench.domains.graphs.task import CSBMTask, PairSample, split_source

from workbench.core.config import MethodEntry
from workbench.core.memory import training_step_bytes
from workbench.core.registry import methods

REAL = Path(__file__).resolve().parents[1] / "tests" / "data" / "real" / "graphs"
#: The run entry (METHOD@MODEL) behind each method name.
ENTRIES = {"gcn": "full@gcn", "udagcn": "udagcn@gcn", "mlp": "full@graph-mlp"}


class DenseFeatureGraph(Graph):
    """A graph whose encoders read the dense (n, d) feature matrix: the code path before sparse features."""

    def features(self) -> torch.Tensor:
        return self.x


def cut(graph: Graph, fraction: float, features: int, dense: bool) -> Graph:
    """The first ``fraction`` of the nodes (and the edges among them), the first ``features`` columns."""
    n = max(2, int(round(fraction * graph.n_nodes)))
    keep = (graph.edge_index < n).all(0)
    kind = DenseFeatureGraph if dense else Graph
    return kind(graph.x[:n, :features].contiguous(), graph.edge_index[:, keep], graph.y[:n], graph.name)


def epoch_costs(task: CSBMTask, name: str, batch: PairSample, steps: int) -> dict:
    """Median wall / CPU seconds of an epoch (training step + validation pass) and the step's peak tensor bytes."""
    entry = MethodEntry.parse(ENTRIES.get(name, name))
    method_name, model_name = entry.method, entry.model
    method = methods.get(method_name)()
    torch.manual_seed(0)
    model = method.prepare(task.load_model(model_name or None))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step() -> None:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        method.loss(task, model, batch, True).backward()
        optimizer.step()

    wall, cpu = [], []
    for epoch in range(steps + 1):
        method.start_epoch(epoch, steps + 1)
        begin_wall, begin_cpu = time.perf_counter(), time.process_time()
        step()
        model.eval()
        with torch.no_grad():
            task.loss(model, batch, False)
        if epoch:
            wall.append(time.perf_counter() - begin_wall)
            cpu.append(time.process_time() - begin_cpu)
    peak = max(training_step_bytes(lambda: [step() for _ in range(2)], "cpu"))
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu), "step_peak_mb": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REAL))
    parser.add_argument("--source", default="acmv9")
    parser.add_argument("--target", default="dblpv7")
    parser.add_argument("--methods", nargs="+", default=["homophily"])
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["0.25:6775", "0.5:6775", "1:6775", "1:1000", "1:3000"],
        help="FRACTION_OF_NODES:FEATURES",
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "graph_scaling.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    source, _ = read_graph(Path(args.data) / f"{args.source}.mat")
    target, _ = read_graph(Path(args.data) / f"{args.target}.mat")
    records = []
    header = (
        f"{'nodes S+T':>10} {'features':>8} {'nnz %':>6} {'method':>10} | {'dense s/ep':>10} {'cpu':>6} "
        f"{'MB':>7} | {'sparse s/ep':>11} {'cpu':>6} {'MB':>6} | {'cpu ratio':>9} {'MB ratio':>8}"
    )
    print(header, flush=True)
    for size in args.sizes:
        fraction, features = float(size.split(":")[0]), int(size.split(":")[1])
        for name in args.methods:
            row = {"fraction": fraction, "features": features, "method": name}
            for path in ("dense", "sparse"):
                s, t = (
                    cut(source, fraction, features, path == "dense"),
                    cut(target, fraction, features, path == "dense"),
                )
                task = CSBMTask()
                task.n_classes = int(s.y.max()) + 1
                task.pair = type("Pair", (), {"source_graph": s})()
                train_mask, val_mask = split_source(s, 0.2, 0)
                batch = PairSample(s, t, train_mask, val_mask)
                row["nodes"] = s.n_nodes + t.n_nodes
                row["nonzero_percent"] = 100 * float((s.x != 0).float().mean())
                row[path] = epoch_costs(task, name, batch, args.steps)
            dense, sparse = row["dense"], row["sparse"]
            row["cpu_ratio"] = dense["cpu_s"] / sparse["cpu_s"]
            row["memory_ratio"] = dense["step_peak_mb"] / sparse["step_peak_mb"]
            records.append(row)
            print(
                f"{row['nodes']:>10} {features:>8} {row['nonzero_percent']:>6.2f} {name:>10} | "
                f"{dense['wall_s']:>10.2f} {dense['cpu_s']:>6.2f} {dense['step_peak_mb']:>7.0f} | "
                f"{sparse['wall_s']:>11.2f} {sparse['cpu_s']:>6.2f} {sparse['step_peak_mb']:>6.0f} | "
                f"{row['cpu_ratio']:>9.1f} {row['memory_ratio']:>8.1f}",
                flush=True,
            )
            Path(args.json).write_text(
                json.dumps(
                    {
                        "pair": f"{args.source} → {args.target}",
                        "threads": torch.get_num_threads(),
                        "steps": args.steps,
                        "records": records,
                    },
                    indent=1,
                )
            )


if __name__ == "__main__":
    main()

"""The six citation transfers among ACMv9, Citationv1 and DBLPv7, the csbm task's default run on each.

Every (transfer, seed) is one default run — ``workbench.adapt(domain="csbm", data=FOLDER, source_graph=...,
target_graph=...)``: the default method ``homophily`` and its baselines ``mixed-filters``, ``full@gcn``,
``full@graph-mlp``, ``udagcn@gcn``, 100 epochs each, source-validated epoch kept — on the ``.mat`` files as the
ACDNE authors publish them (``tests/data/real/graphs``). Target accuracy over all target nodes (each node's first
class: single-label accuracy, which is the micro-F1 of single-label predictions) is printed beside the numbers the
papers publish for the same pairs (`PUBLISHED`, micro-F1 of multi-label predictions; see the notes there).

Results go to ``benchmarks/results/graph_citation.json`` after every run, so an interrupted benchmark keeps what it
finished; runs are ordered seed-major (all six transfers at seed 0 first).

    python benchmarks/graph_citation.py                        # 6 transfers × 3 seeds × 5 methods
    python benchmarks/graph_citation.py --seeds 0 --baselines full@gcn
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import workbench

GRAPHS = {"A": "acmv9", "C": "citationv1", "D": "dblpv7"}
TRANSFERS = ("A→D", "D→A", "C→D", "D→C", "A→C", "C→A")
REAL = Path(__file__).resolve().parents[1] / "tests" / "data" / "real" / "graphs"

#: Target micro-F1 [%] the papers publish (method → transfer → value). Filled only where the table was found and
#: read; an empty entry means it was not found here (see the README's citation section).
PUBLISHED: dict[str, dict[str, float]] = {}


def run_one(folder: Path, transfer: str, seed: int, baselines: tuple[str, ...] | None) -> dict:
    source, target = (GRAPHS[key] for key in transfer.split("→"))
    settings = {} if baselines is None else {"baselines": baselines}
    with tempfile.TemporaryDirectory() as out:
        begin, begin_cpu = time.perf_counter(), time.process_time()
        run = workbench.adapt(
            domain="csbm",
            data=str(folder),
            source_graph=source,
            target_graph=target,
            seed=seed,
            out=str(Path(out) / "run"),
            quiet=True,
            **settings,
        )
        seconds, cpu_seconds = time.perf_counter() - begin, time.process_time() - begin_cpu
    results = {run.metrics.get("method", "homophily"): run.metrics["after"], **run.metrics["baselines"]}
    return {
        "transfer": transfer,
        "seed": seed,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "accuracy": {name: metrics["accuracy"] for name, metrics in results.items()},
        "macro_f1": {name: metrics["macro_f1"] for name, metrics in results.items()},
        "source_accuracy": {name: metrics["source_accuracy"] for name, metrics in results.items()},
    }


def table(records: list[dict]) -> str:
    methods = sorted({name for record in records for name in record["accuracy"]}, key=lambda m: (m != "homophily", m))
    lines = ["target accuracy [%], mean ± sd over seeds (n)", "transfer  " + "  ".join(f"{m:>18}" for m in methods)]
    for transfer in TRANSFERS:
        row = [r for r in records if r["transfer"] == transfer]
        if not row:
            continue
        cells = []
        for method in methods:
            values = [100 * r["accuracy"][method] for r in row if method in r["accuracy"]]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):6.1f} ± {sd:4.1f} ({len(values)})" if values else " " * 18)
        lines.append(f"{transfer:8}  " + "  ".join(f"{c:>18}" for c in cells))
    for paper, values in PUBLISHED.items():
        lines.append(f"{paper:>8}: " + ", ".join(f"{t} {v:.1f}" for t, v in values.items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REAL), help="folder with acmv9.mat, citationv1.mat, dblpv7.mat")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--transfers", nargs="+", default=list(TRANSFERS), choices=TRANSFERS)
    parser.add_argument("--baselines", default=None, help="comma-separated baselines (default: the task's)")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "graph_citation.json"))
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    baselines = None if args.baselines is None else tuple(b for b in args.baselines.split(",") if b)

    records: list[dict] = []
    begin = time.perf_counter()
    for seed in args.seeds:
        for transfer in args.transfers:
            records.append(run_one(Path(args.data), transfer, seed, baselines))
            record = records[-1]
            print(
                f"{transfer} seed {seed}: {record['seconds']:.0f} s, accuracy "
                + ", ".join(f"{m} {100 * a:.1f}" for m, a in record["accuracy"].items()),
                flush=True,
            )
            Path(args.json).write_text(
                json.dumps(
                    {
                        "data": "ACMv9, Citationv1, DBLPv7 .mat as the ACDNE authors publish them",
                        "settings": "csbm defaults: 100 epochs, hidden 64, dropout 0.5, lr 0.01, source-validated",
                        "seconds": time.perf_counter() - begin,
                        "published_micro_f1": PUBLISHED,
                        "records": records,
                    },
                    indent=1,
                )
            )
    print(table(records))


if __name__ == "__main__":
    main()

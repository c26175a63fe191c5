"""Cells per hour of `workbench compare`, and where a cell's seconds go: one fixed small comparison per domain.

Each domain runs its default method and LoRA (full training where LoRA is the default or does not apply) on
2 folds × 2 development seeds, ``--epochs`` epochs each, 1 worker and 1 thread, in a fresh Python process. The
process times the engine's functions by phase (the outermost timed call owns the time):

    start-up    interpreter start, imports and the registry, until the comparison begins (once per process)
    data        reading/generating the data, fingerprinting them, preprocessing (`Task.read`, `Task.prepare`)
    model       building or loading the pretrained model (`Task.load_model`)
    base        scoring the unadapted model on the test split
    train       the training stages (validation passes included); s/step = train / optimizer steps
    probes      the warm-up step and the training-step memory probe
    eval        scoring the adapted model and its item intervals
    writing     figures, reports, adapters, results, seals and cell manifests
    other       the rest of the cells' wall time (method set-up, the comparison's own report, ...)

    python benchmarks/compare_throughput.py                        # this checkout's profile, every domain
    python benchmarks/compare_throughput.py --domains features,ptbxl --epochs 2
    python benchmarks/compare_throughput.py --against 0882883      # that commit and this checkout side by side

``--against REF`` runs REF's code (a git commit, extracted with ``git archive``) and this checkout's one domain after
the other in the same invocation (same machine, same load), prints cells per hour and their ratio, and checks that
every cell's test metrics are equal (``same``: bit for bit; else the largest relative difference; a method's time
and memory diagnostics aside). The phases of a
version that lacks a timed function are left empty. ``--json FILE`` keeps everything measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOMAINS = ("features", "csbm", "ptbxl", "sleepedf", "physio", "medvl", "rmd17")
#: The second entry of each domain's comparison (the first is the task's default method).
SECOND = {"features": "full", "csbm": "full", "ptbxl": "lora", "sleepedf": "full", "physio": "lora",
          "medvl": "lora", "rmd17": "full"}  # fmt: skip
PHASES = ("startup", "data", "model", "base", "train", "probes", "eval", "writing", "other")

#: Engine functions timed in a phase: (module, attribute), under this checkout's module names and those before the
#: engine's floors (0.1: ``workbench.run``, ``workbench.comparison``, ``workbench.report`` were modules), so that
#: ``--against`` an older commit times the same functions; task methods are timed on the domain's task class.
MODULE_PHASES = {
    **{(module, "data_record"): "data" for module in ("workbench.run", "workbench.run.adapting")},
    **{(module, "data_fingerprint"): "data" for module in ("workbench.comparison", "workbench.comparison.cells")},
    **{(module, "cast"): "model" for module in ("workbench.run", "workbench.run.adapting")},
    **{(module, "_evaluate_or_reuse"): "base" for module in ("workbench.run", "workbench.run.adapting")},
    ("workbench.run", "_train"): "train",
    ("workbench.run.stages", "train_stages"): "train",
    **{("workbench.run", name): "probes" for name in ("_warm_up", "_training_step_bytes")},
    **{("workbench.run.stages", name): "probes" for name in ("warm_up", "step_bytes")},
    **{(module, "_item_intervals"): "eval" for module in ("workbench.run", "workbench.run.adapting")},
    **{(module, name): "writing" for module in ("workbench.report", "workbench.run.report")
       for name in ("learning_curves", "markdown")},
    **{(module, name): "writing" for module in ("workbench.run", "workbench.run.adapting")
       for name in ("_save_adapter", "_save_result", "seal")},
    **{(module, name): "writing" for module in ("workbench.comparison", "workbench.comparison.cells")
       for name in ("seal", "cell_manifest")},
}  # fmt: skip
TASK_PHASES = {"read": "data", "prepare": "data", "load_model": "model", "evaluate": "eval", "figures": "writing"}


class PhaseClock:
    """Wall seconds per phase; only the outermost timed call counts (nested timed calls are part of it)."""

    def __init__(self) -> None:
        self.seconds = {phase: 0.0 for phase in PHASES}
        self.depth = 0

    def wrap(self, function, phase: str):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            if self.depth:
                return function(*args, **kwargs)
            self.depth += 1
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start
                self.depth -= 1

        return timed


def use_source(root: Path) -> None:
    """Import the workbench (and its domains, models and methods) from the source tree ``root``."""
    import importlib.abc
    import importlib.util

    packages = {"workbench": root / "workbench", "workbench.domains": root / "domains",
                "workbench.models": root / "models", "workbench.adaptation": root / "adaptation"}  # fmt: skip

    class SourceFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name in packages:
                folder = packages[name]
                return importlib.util.spec_from_file_location(
                    name, folder / "__init__.py", submodule_search_locations=[str(folder)]
                )
            return None

    sys.meta_path.insert(0, SourceFinder())


def worker(args: argparse.Namespace) -> None:
    """Run one domain's comparison in this process and write what was measured to ``args.result``."""
    use_source(Path(args.source))
    import importlib

    from workbench.comparison.design import CompareSpec
    from workbench.comparison.execute import compare
    from workbench.core.registry import tasks

    clock = PhaseClock()
    task_class = tasks.get(args.domain)
    for name, phase in TASK_PHASES.items():
        setattr(task_class, name, clock.wrap(getattr(task_class, name), phase))
    for (module_name, attribute), phase in MODULE_PHASES.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:  # the other version's name
            continue
        if hasattr(module, attribute) and not isinstance(getattr(module, attribute), types.ModuleType):
            setattr(module, attribute, clock.wrap(getattr(module, attribute), phase))
    methods = [task_class.default_method, SECOND[args.domain]]
    spec = CompareSpec(domain=args.domain, methods=tuple(methods), folds=2, seeds=(0, 1), epochs=args.epochs)
    began = time.time()
    with tempfile.TemporaryDirectory() as folder:
        comparison = compare(spec, Path(folder) / "comparison", workers=1, threads=1, quiet=True)
        cells = sorted((Path(folder) / "comparison" / "cells").glob("*/*/cell.json"))
        records = {f"{p.parent.parent.name}/{p.parent.name}": json.loads(p.read_text()) for p in cells}
    ended = time.time()
    result = {
        "began": began, "ended": ended, "phases": clock.seconds, "cells": len(records),
        "steps": sum(int(r.get("steps") or 0) for r in records.values()),
        "metrics": {name: r["metrics"] for name, r in records.items()},
        "report_methods": list(comparison.get("methods", {})) if isinstance(comparison, dict) else [],
    }  # fmt: skip
    Path(args.result).write_text(json.dumps(result))


def measure(source: Path, domain: str, epochs: int) -> dict:
    """One domain's comparison from ``source`` in a fresh process: phases per cell, cells per hour, metrics."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        result_path = Path(handle.name)
    command = [sys.executable, __file__, "--worker", "--source", str(source), "--domain", domain,
               "--epochs", str(epochs), "--result", str(result_path)]  # fmt: skip
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.time()
    finished = subprocess.run(command, env=environment, capture_output=True, text=True)
    wall = time.time() - started
    if finished.returncode != 0:
        sys.exit(f"{domain} from {source} failed:\n{finished.stderr[-3000:]}")
    result = json.loads(result_path.read_text())
    result_path.unlink()
    phases = result["phases"]
    phases["startup"] = result["began"] - started
    phases["other"] = max(0.0, wall - sum(seconds for phase, seconds in phases.items() if phase != "other"))
    result.update(wall=wall, cells_per_hour=3600 * result["cells"] / wall)
    return result


def profile_table(label: str, results: dict[str, dict]) -> str:
    header = f"{'domain':<10}" + "".join(f"{p:>9}" for p in PHASES) + f"{'s/step':>9}{'cell s':>9}{'cells/h':>9}"
    lines = [f"{label}: seconds per cell by phase", header]
    for domain, result in results.items():
        n = result["cells"]
        per_step = result["phases"]["train"] / result["steps"] if result["steps"] else math.nan
        lines.append(f"{domain:<10}" + "".join(f"{result['phases'][p] / n:>9.2f}" for p in PHASES)
                     + f"{per_step:>9.3f}{result['wall'] / n:>9.2f}{result['cells_per_hour']:>9.0f}")  # fmt: skip
    return "\n".join(lines)


#: Words of the cell "metrics" that measure the computer, not the model (a method's diagnostics): never compared.
COSTS = ("seconds", "memory", "bytes")


def metric_difference(before: dict, after: dict) -> str:
    """ "same" when every cell's metrics are equal (`COSTS` aside), else the largest relative difference (or what is
    missing)."""
    if set(before) != set(after):
        return "cells differ"
    largest = 0.0
    for cell, metrics in before.items():
        for name, value in metrics.items():
            if any(word in name for word in COSTS):
                continue
            other = after[cell].get(name)
            if other == value or (isinstance(value, float) and math.isnan(value) and math.isnan(other)):
                continue
            if not isinstance(value, (int, float)) or not isinstance(other, (int, float)):
                return f"{cell} {name} differs"
            largest = max(largest, abs(other - value) / max(abs(value), 1e-12))
    return "same" if largest == 0 else f"rel {largest:.1e}"


def extract(reference: str) -> Path:
    """The source tree of git commit ``reference``, in a temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="workbench-ref-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", reference], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domains", default=",".join(DOMAINS), help="comma-separated domains")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of every cell")
    parser.add_argument("--against", metavar="REF", help="a git commit whose code runs beside this checkout's")
    parser.add_argument("--json", metavar="FILE", help="write everything measured here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--domain", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    domains = [d for d in args.domains.split(",") if d]
    sources = {"now": ROOT}
    if args.against:
        sources = {args.against: extract(args.against), "now": ROOT}
    results: dict[str, dict[str, dict]] = {label: {} for label in sources}
    for domain in domains:
        for label, source in sources.items():
            results[label][domain] = measure(source, domain, args.epochs)
            print(f"{domain} ({label}): {results[label][domain]['cells']} cells in "
                  f"{results[label][domain]['wall']:.1f} s", flush=True)  # fmt: skip
    for label in sources:
        print("\n" + profile_table(label, results[label]))
    if args.against:
        before, after = results[args.against], results["now"]
        print(f"\ncells per hour, {args.against} -> now (same machine, one after the other)")
        print(f"{'domain':<10}{'before':>9}{'now':>9}{'ratio':>8}  metrics")
        ratios = []
        for domain in domains:
            ratio = after[domain]["cells_per_hour"] / before[domain]["cells_per_hour"]
            ratios.append(ratio)
            print(
                f"{domain:<10}{before[domain]['cells_per_hour']:>9.0f}{after[domain]['cells_per_hour']:>9.0f}"
                f"{ratio:>7.2f}x  {metric_difference(before[domain]['metrics'], after[domain]['metrics'])}"
            )
        print(f"median ratio {sorted(ratios)[len(ratios) // 2]:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"epochs": args.epochs, "results": results}, indent=1))


if __name__ == "__main__":
    main()

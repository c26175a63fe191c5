"""The contract runs of a refactor: 12 small ``workbench adapt`` runs (rmd17 ELoRA with four refinement sets,
ptbxl LoRA with five, H-Tuning beside distillation, medvl H-LoRA, physio's default), a features comparison
(2 folds × 2 seeds), an ``evaluate`` and a ``predict``; then every metric of two such folders set side by side.

Run them from the code before the change and from the code after, one CPU thread each (bit-identical reruns):

    pip install --no-deps --target /tmp/before_pkg .           # at the commit before (a non-editable copy)
    PYTHONPATH=/tmp/before_pkg python benchmarks/refactor_contract.py run /tmp/before
    python benchmarks/refactor_contract.py run /tmp/after      # this checkout
    python benchmarks/refactor_contract.py same /tmp/before /tmp/after

``same`` prints, per file, how many values it compared and whether they are identical (times, memory, paths,
hashes, versions and thread counts left out), and exits 1 when any differs. A run already in the folder is kept.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--threads", "1", "--quiet", "--seed", "3"]
ELORA = ["--domain", "rmd17", "--method", "elora", "--epochs", "2", "--train-size", "10", "--baselines", "full"]
LORA = ["--domain", "ptbxl", "--method", "lora", "--epochs", "1", "--baselines", ""]
RUNS = {
    "r1": ELORA, "r2": [*ELORA, "--init", "pissa", "--lora-scaling", "rslora"], "r3": [*ELORA, "--reparam", "replora"],
    "r4": [*ELORA, "--init", "lora-one", "--objective", "flat-lora"],
    "p1": LORA, "p2": [*LORA, "--init", "pissa"], "p3": [*LORA, "--dora", "--lora-scaling", "rslora"],
    "p4": [*LORA, "--reparam", "replora"], "p5": [*LORA, "--init", "goat"],
    "h1": ["--domain", "ptbxl", "--epochs", "1", "--baselines", "distill"],
    "m1": ["--domain", "medvl", "--epochs", "1", "--train-size", "16"],
    "f1": ["--domain", "physio", "--epochs", "1"],
}  # fmt: skip
COMPARE = ["--domain", "features", "--methods", "warmpot,full", "--seeds", "200-201", "--folds", "2", "--epochs", "2",
           "--threads", "1"]  # fmt: skip
PREDICT_INPUT = ROOT / "domains/ecg/embedded/ptbxl_synthetic/records100/00000"
#: Keys whose values are costs or provenance, not results.
NOT_RESULTS = ("seconds", "time", "memory", "bytes", "threads", "wall", "created", "path", "out", "commit", "version",
               "began", "ended", "run", "sha256", "hash", "fingerprint", "data")  # fmt: skip


def _workbench(*arguments: str, log: Path) -> None:
    with log.open("w") as handle:
        done = subprocess.run([sys.executable, "-m", "workbench", *arguments], stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"workbench {' '.join(arguments)} failed: see {log}")


def run(out: Path) -> None:
    """Every contract run into ``out`` (kept where there already)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, arguments in RUNS.items():
        if not (out / name).is_dir():
            _workbench("adapt", *arguments, *COMMON, "--out", str(out / name), log=out / f"{name}.log")
    if not (out / "cmp").is_dir():
        _workbench("compare", *COMPARE, "--out", str(out / "cmp"), log=out / "cmp.log")
    if not (out / "p1-evaluation.json").is_file():  # evaluate writes outside the (sealed) run
        _workbench("evaluate", "--run", str(out / "p1"), "--threads", "1", "--out", str(out / "p1-evaluation.json"),
                   log=out / "evaluate.log")  # fmt: skip
    inputs = out / "inputs"
    if not (out / "predicted.csv").is_file():
        inputs.mkdir(exist_ok=True)
        for path in PREDICT_INPUT.glob("00001_lr.*"):
            (inputs / path.name).write_bytes(path.read_bytes())
        _workbench("predict", "--run", str(out / "p1"), "--input", str(inputs), "--output", str(out / "predicted.csv"),
                   log=out / "predict.log")  # fmt: skip


def _leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _leaves(inner, f"{prefix}.{key}")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _leaves(inner, f"{prefix}[{index}]")
    else:
        yield prefix, value


def _results(path: Path) -> dict[str, Any]:
    content = json.loads(path.read_text()) if path.is_file() else {}
    return {key: value for key, value in _leaves(content) if not any(word in key.lower() for word in NOT_RESULTS)}


def same(before: Path, after: Path) -> int:
    """Prints each file's comparison; the number of files that differ."""
    files = [f"{name}/metrics.json" for name in RUNS] + ["cmp/comparison.json", "p1-evaluation.json",
             "predicted.json"] + sorted(str(p.relative_to(before)) for p in before.glob("cmp/cells/*/*/cell.json"))
    differ = 0
    for name in files:
        a, b = _results(before / name), _results(after / name)
        changed = sorted(key for key in set(a) | set(b) if a.get(key) != b.get(key))
        differ += bool(changed) or not a
        verdict = "identical" if a and not changed else "DIFFER " + ", ".join(changed[:5])
        print(f"{name:45} {len(a):5} values  {verdict}")
    csv_same = (before / "predicted.csv").read_bytes() == (after / "predicted.csv").read_bytes()
    differ += not csv_same
    print(f"{'predicted.csv':45} {'byte-identical' if csv_same else 'DIFFER'}")
    return differ


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        run(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "same":
        sys.exit(1 if same(Path(sys.argv[2]), Path(sys.argv[3])) else 0)
    else:
        sys.exit(__doc__)

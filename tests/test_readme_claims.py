"""README.md's claim tables are rendered from benchmarks/results/*.json (`benchmarks/claims.py`), never typed."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _claims():
    spec = importlib.util.spec_from_file_location("benchmark_claims", ROOT / "benchmarks" / "claims.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_readme_agrees_with_the_results_files():
    claims = _claims()
    text = (ROOT / "README.md").read_text()
    names = [match["name"] for match in claims.BLOCK.finditer(text)]
    assert names, "README.md renders no benchmark block"
    assert claims.render_readme(text) == text, "README.md differs from benchmarks/results/: python benchmarks/claims.py"


def test_every_results_file_agrees_with_its_own_cells():
    claims = _claims()
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        result = json.loads(path.read_text())
        if "comparison" in result:  # a comparison's results (speed benchmarks write their own tables)
            again = json.dumps(claims.refreshed(result), sort_keys=True)  # as text: NaN (one unit) equals NaN
            assert again == json.dumps(result, sort_keys=True), f"{path.name}: python benchmarks/claims.py --refresh"


def test_a_changed_result_changes_the_readme(tmp_path):
    claims = _claims()
    text = (ROOT / "README.md").read_text()
    name = next(claims.BLOCK.finditer(text))["name"]
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "results")
    path = tmp_path / "results" / f"{name}.json"
    result = json.loads(path.read_text())
    first = next(iter(result["comparison"]["summary"].values()))
    metric = result["table_metrics"][0]
    first["metrics"][metric]["mean"] += 0.1234
    path.write_text(json.dumps(result))
    assert claims.render_readme(text, tmp_path / "results") != text

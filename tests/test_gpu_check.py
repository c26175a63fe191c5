"""``benchmarks/gpu_check.py --smoke``: every code path of the GPU check runs on the CPU and writes its JSON."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("cuequivariance_torch")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.mark.filterwarnings("ignore:cuequivariance_ops_torch is not available")
def test_smoke_run_covers_every_part(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    out = tmp_path / "gpu_check.json"
    results = gpu_check.main(["--smoke", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["smoke"] is True
    for dtype in ("float32", "float64"):
        row = results["mace_step"][dtype]
        assert row["e3nn_s"] > 0 and row["cueq_s"] > 0 and math.isfinite(row["cueq_over_e3nn"])
    assert results["partial_ot"]["max_plan_difference"] == 0.0  # CPU against CPU: the same plan
    assert results["htuning_memory"]["full_bytes"] > results["htuning_memory"]["htuning_bytes"] > 0
    assert {(row["domain"], row["precision"]) for row in results["epochs"]} == {
        ("features", "float32"),
        ("ptbxl", "float32"),
        ("ptbxl", "bf16"),  # a whole run with mixed-precision steps
    }
    assert all(row["seconds_per_epoch"] > 0 for row in results["epochs"])

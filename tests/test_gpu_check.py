"""``benchmarks/gpu_check.py --smoke``: every part of the GPU check runs on the CPU, under the placement harness (a
tensor left on the host fails here as it would on the GPU), and writes its JSON."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from workbench.core.placement_harness import placement_harness

pytest.importorskip("cuequivariance_torch")
pytest.importorskip("httpx")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore:cuequivariance_ops_torch is not available")
def test_smoke_run_covers_every_part(tmp_path):
    check = gpu_check()
    out = tmp_path / "gpu_check.json"
    with placement_harness():
        results = check.main(["--smoke", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    parts = results["parts"]
    assert results["smoke"] is True and list(parts) == list(check.PARTS)
    assert {part: row["status"] for part, row in parts.items()} == {part: "ok" for part in check.PARTS}
    assert parts["readme"]["e3nn"]["wall_s"] > 0
    assert {(row["domain"], row["method"]) for row in parts["commands"]["runs"]} == {("features", "warmpot"),
                                                                                     ("ptbxl", "htuning")}
    assert parts["commands"]["runs"][1]["predict_records"] >= 1 and parts["commands"]["runs"][1]["evaluate"]
    assert parts["compare"]["cells"] == 4 and parts["serve"]["status_code"] == 200
    row = parts["mace_step"]["float32"]
    assert row["e3nn_s"] > 0 and row["cueq_s"] > 0 and math.isfinite(row["cueq_over_e3nn"])
    assert parts["mace_step"]["cueq_kernels"].startswith("naive fallback")
    assert parts["partial_ot"]["max_plan_difference"] == 0.0  # CPU against CPU: the same plan
    assert parts["htuning_memory"]["full_bytes"] > parts["htuning_memory"]["htuning_bytes"] > 0
    assert {(row["domain"], row["precision"]) for row in parts["epochs"]["runs"]} == {
        ("features", "float32"),
        ("ptbxl", "float32"),
        ("ptbxl", "bf16"),  # a whole run with mixed-precision steps
    }


def test_a_failing_part_is_reported_and_the_others_go_on(tmp_path, monkeypatch):
    check = gpu_check()

    def broken(_):
        raise RuntimeError("planted")

    monkeypatch.setattr(check, "partial_ot", broken)
    results = check.main(["--smoke", "--parts", "partial_ot,htuning_memory", "--json", str(tmp_path / "g.json")])
    assert results["parts"]["partial_ot"]["status"] == "failed: RuntimeError: planted"
    assert results["parts"]["htuning_memory"]["status"] == "ok"
    assert "planted" in (tmp_path / "g.log").read_text()

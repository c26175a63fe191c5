"""``benchmarks/gpu_pack.py``: what each set carries to the GPU machine (without downloading its wheels)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_pack.py"


def gpu_pack():
    spec = importlib.util.spec_from_file_location("gpu_pack", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_set_carries_its_domains_data_and_no_tests():
    pack = gpu_pack()
    core, eeg = set(pack.tracked_files("core")), set(pack.tracked_files("eeg-medvl"))
    for files in (core, eeg):
        assert {"pyproject.toml", "README.md", "benchmarks/gpu_check.py", "workbench/core/device.py"} <= files
        assert not any(name.startswith(("tests/", "docs/", "notebooks/", "benchmarks/results/")) for name in files)
    assert "models/checkpoints/mace_xtb_small.safetensors" in core - eeg
    assert "models/checkpoints/medvl-tiny.safetensors" in eeg - core
    assert any(name.startswith("domains/eeg/embedded/") for name in eeg)
    assert not any(name.startswith("domains/eeg/embedded/") for name in core)


def test_the_run_script_runs_the_sets_parts_on_its_domains():
    pack = gpu_pack()
    for chosen, domains in pack.DOMAINS.items():
        text = pack.RUN_SH.format(chosen=chosen, parts=pack.PARTS[chosen], domains=",".join(domains))
        assert f"--parts {pack.PARTS[chosen]} --domains {','.join(domains)}" in text
        assert "--no-index" in text and '"$out/gpu_check-' in text
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT.with_name("gpu_check.py"))
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    for chosen, parts in pack.PARTS.items():  # every part and domain a set names is one the check knows
        assert set(parts.split(",")) <= set(check.PARTS) and set(pack.DOMAINS[chosen]) <= set(check.DOMAINS)

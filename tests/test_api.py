"""The Python API: `workbench.adapt` returns a run whose merged model reproduces the run's numbers."""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms
from workbench.domains.atomistic.task import Rmd17
from workbench.models.mace import calculator

import workbench


@pytest.mark.slow
def test_adapt_returns_a_run_whose_model_reproduces_its_metrics(tiny_rmd17, tmp_path):
    run = workbench.adapt(
        domain="rmd17",
        method="elora",
        baselines=["readout"],
        data=str(tiny_rmd17),
        epochs=2,
        train_size=10,
        val_size=5,
        out=str(tmp_path / "run"),
        quiet=True,
        method_options={"rank": 4},
    )
    assert run.metrics["method"] == "elora" and set(run.metrics["baselines"]) == {"readout"}
    assert run.config.method_options["rank"] == 4 and run.config.method_options["alpha"] == 16.0
    assert {"metrics.json", "adapter.safetensors", "report.md"} <= set(run.paths)

    task = Rmd17()
    raw = task.read(str(tiny_rmd17))
    rescored = task.evaluate(run.model, task.test_samples(run.model, raw), "cpu").metrics
    assert rescored == pytest.approx(run.metrics["after"], rel=1e-9)
    again = workbench.Run.load(run.path)
    assert task.evaluate(again.model, task.test_samples(again.model, raw), "cpu").metrics == pytest.approx(rescored)

    frame = raw.frames[int(raw.test_indices[0])]
    atoms = Atoms(numbers=frame.atomic_numbers, positions=frame.positions_a)
    atoms.calc = calculator(run.model)
    assert np.isfinite(atoms.get_potential_energy()) and atoms.get_forces().shape == (9, 3)

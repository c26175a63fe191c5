"""Every notebook runs top to bottom (with small settings), so the quick-starts cannot drift."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SMALL_SETTINGS = {
    "rmd17_quickstart.ipynb": {"EPOCHS": 2, "TRAIN_SIZE": 10, "MD_STEPS": 20},
    "shift_quickstart.ipynb": {"EPOCHS": 2, "DIM": 10},
    "graphs_quickstart.ipynb": {"EPOCHS": 3, "NODES": 200},
    "ecg_quickstart.ipynb": {"EPOCHS": 2, "DISTILL_EPOCHS_FACTOR": 1},
    "eeg_quickstart.ipynb": {"EPOCHS": 2},
    "physio_quickstart.ipynb": {"EPOCHS": 2, "ITERATIONS": 100},
    "medvl_quickstart.ipynb": {"EPOCHS": 1},
    "lora_family.ipynb": {"METRIC_INDEX": 0},  # trains nothing: draws benchmarks/results/lora_family_*.json
}
#: A line each notebook prints when it ran to its end.
EXPECTED = {
    "rmd17_quickstart.ipynb": "total-energy drift",
    "shift_quickstart.ipynb": "target MSE",
    "graphs_quickstart.ipynb": "target accuracy",
    "ecg_quickstart.ipynb": "macro AUROC",
    "eeg_quickstart.ipynb": "window rows",
    "physio_quickstart.ipynb": "balanced accuracy",
    "medvl_quickstart.ipynb": "closed-VQA accuracy",
    "lora_family.ipynb": "Δ vs LoRA",
}


def test_every_notebook_has_settings():
    assert {p.name for p in NOTEBOOKS.glob("*.ipynb")} == set(SMALL_SETTINGS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL_SETTINGS))
def test_notebook_runs(name, tmp_path):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    settings = notebook.cells[1]
    for key, value in SMALL_SETTINGS[name].items():
        assert f"{key} = " in settings.source, key
        settings.source = "\n".join(
            f"{key} = {value}" if line.startswith(f"{key} = ") else line for line in settings.source.splitlines()
        )
    NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(out.get("text", "") for cell in notebook.cells for out in cell.get("outputs", []))
    assert EXPECTED[name] in outputs

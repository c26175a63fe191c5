"""What a new user hit on a fresh clone (issue 55, item 5): no ``--version``, the SevenNet environment the docs name
not ignored by git, a Ctrl-C hint that did not say which folder to resume, and no estimate of a long training's
duration before it is under way."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli

import workbench
from workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_version_prints_the_package_s_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"workbench {workbench.__version__}"


def test_the_sevennet_environment_the_docs_create_is_ignored():
    assert ".venv-sevennet" in (ROOT / "docs" / "foundation-potentials.md").read_text()
    assert ".venv-sevennet/" in (ROOT / ".gitignore").read_text().splitlines()


def test_ctrl_c_names_the_run_folder_to_resume(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)  # the default --out: runs/<task>-<method>-<date>-<time> here
    monkeypatch.setattr("workbench.run.adapting._adapt_steps", interrupted)
    result = cli("adapt", "--domain", "features", "--epochs", "1", "--quiet")
    assert result.returncode == 130
    folder = next((tmp_path / "runs").iterdir()).relative_to(tmp_path)
    assert f"the run is in {folder}: continue it with the same command plus --resume --out {folder}" in result.stderr


@pytest.mark.parametrize("threshold, said", [(0.0, True), (3600.0, False)], ids=["long", "short"])
def test_a_long_training_says_its_duration_after_the_first_epoch(caplog, monkeypatch, threshold, said):
    """After the first epoch a trainer says how long the others will take at that pace, when that is long."""
    import logging
    import time

    import torch

    from workbench.core import trainer as trainer_module

    def loss(model, batch, train):
        time.sleep(0.02)  # a measurable epoch
        return ((model(batch[0]) - batch[1]) ** 2).mean()

    samples = [(torch.randn(3), torch.randn(1)) for _ in range(4)]
    monkeypatch.setattr(trainer_module, "ESTIMATE_ABOVE_S", threshold)
    def collate(items, device):
        return [torch.stack(column) for column in zip(*items)]

    fit = trainer_module.Trainer(torch.nn.Linear(3, 1), loss, collate, samples, samples,
                                 trainer_module.TrainSettings(epochs=4, batch_size=2), progress=False,
                                 label="probe")  # fmt: skip
    with caplog.at_level(logging.INFO, logger="workbench"):
        fit.fit()
    lines = [r.getMessage() for r in caplog.records if "the first epoch took" in r.getMessage()]
    assert len(lines) == int(said)
    if said:
        first = fit.history[0]["seconds"]
        assert lines[0].startswith("probe: the first epoch took") and "the other 3 take about" in lines[0]
        assert first > 0.03  # two batches of 20 ms each

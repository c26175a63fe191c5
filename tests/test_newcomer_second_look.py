"""What a new user hit on a fresh clone (issue 55, item 3): no ``--version``, the SevenNet environment the docs name
not ignored by git, and a Ctrl-C hint that did not say which folder to resume."""

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

"""The documentation site builds with warnings as errors (`mkdocs build --strict`): every page in the nav exists,
every link and anchor resolves, every API entry is found, and ARCHITECTURE.md is included as it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_build_is_clean(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    log = result.stdout + result.stderr
    warnings = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]  # MkDocs' own log lines
    assert result.returncode == 0 and not warnings, "\n".join(warnings) or log[-4000:]
    architecture = (site / "architecture" / "index.html").read_text()
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        if line.startswith("## "):  # the repository's ARCHITECTURE.md is the page (pymdownx.snippets)
            assert line[3:].split("`")[0].strip() in architecture, line
    assert "<!-- rendered: ecg_htuning -->" in (site / "domains" / "ecg" / "index.html").read_text()
    api = (site / "api" / "plugins" / "index.html").read_text()
    assert 'id="workbench.core.task.Task"' in api and 'id="workbench.core.method.Method"' in api

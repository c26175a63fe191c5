"""The engine (``workbench/``) names no domain: every task, model and method lives in a plug-in."""

from __future__ import annotations

import re
from pathlib import Path

from workbench.registry import models, tasks

ENGINE = Path(__file__).resolve().parents[1] / "workbench"
#: Words of the domains (besides every registered task and model name) that the engine must not use.
DOMAIN_WORDS = ("mace", "e3nn", "molecule", "ecg", "leads?", "eeg", "sleep", "graph", "atoms?", "homophily")
#: Registered names that are also the engine's own vocabulary ("features and class logits").
GENERIC = {"features"}


def test_no_engine_file_names_a_domain():
    names = [n for n in (*tasks.names(), *models.names()) if n not in GENERIC] + list(DOMAIN_WORDS)
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) if "?" not in n else n for n in names) + r")\b", re.I)
    found = []
    for path in sorted(ENGINE.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip().startswith("#"):
                continue
            for match in pattern.finditer(line):
                found.append(f"{path.name}:{number}: {match.group(0)}")
    assert not found, "the engine names domains:\n" + "\n".join(found)

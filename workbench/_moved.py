"""Old import paths of modules that moved into the engine's floors in 0.2 (``workbench.task`` is
``workbench.core.task``): they keep working until 0.3, with a `FutureWarning` naming the new path.

An old path imports the same module object, so what is set on it (a test's monkeypatch) is set on the module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_CORE = ("checkpoint", "config", "datacard", "device", "ema", "errors", "memory", "method", "metrics", "model", "npz",
         "options", "paths", "placement_harness", "randomness", "records", "registry", "resampled_metrics", "reuse",
         "seal", "settings", "task", "testing", "trainer")  # fmt: skip
#: Old module path -> new module path.
MOVED = {
    **{f"workbench.{name}": f"workbench.core.{name}" for name in _CORE},
    **{f"workbench.{name}": f"workbench.run.{name}" for name in ("fingerprint", "item_bootstrap", "outputs",
                                                                   "report", "rundir", "threads")},
    "workbench.card": "workbench.clinical.card",
    "workbench.comparison_report": "workbench.comparison.report",
    "workbench.statistics": "workbench.comparison.statistics",
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a `MOVED` path and hands back the module at its new path."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return None  # a placeholder module, replaced below

    def exec_module(self, module):
        name = module.__spec__.name
        warnings.warn(f"{name} moved to {MOVED[name]} in workbench 0.2; the old path goes in 0.3", FutureWarning,
                      stacklevel=2)  # fmt: skip
        sys.modules[name] = importlib.import_module(MOVED[name])  # what the import statement returns


def install() -> None:
    """Put the old paths' finder on `sys.meta_path` (once)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())

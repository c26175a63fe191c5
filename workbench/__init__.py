"""Scientific domain-adaptation workbench: adapt a pretrained model to your data, honestly measured.

>>> import workbench
>>> run = workbench.adapt(domain="TASK", method="METHOD", epochs=2)  # doctest: +SKIP (names: workbench list)
>>> run.metrics["after"], run.path                                  # doctest: +SKIP
"""

import importlib
import warnings

# Some model libraries trip a TorchScript annotation warning on every import: pure noise.
warnings.filterwarnings("ignore", message="The TorchScript type system", category=UserWarning)

# The one import of a plug-in package by the engine: its __init__ imports no model library, it installs the hooks
# that make them import safely whenever something imports them (a user's `import peft` after `import workbench`).
import workbench.models  # noqa: E402, F401
from workbench import _moved  # noqa: E402

_moved.install()  # the module paths before 0.2 (``workbench.task``) keep working, with a FutureWarning

__version__ = "0.2.0"

#: The public API, imported on first use (``workbench.adapt``): the command line refuses a mistyped name before
#: torch and matplotlib are imported.
_PUBLIC = {"CompareSpec": "workbench.comparison.design", "compare": "workbench.comparison.execute",
           "Run": "workbench.core.finished", "adapt": "workbench.run.adapting", "evaluate": "workbench.run.evaluating",
           "predict": "workbench.run.predicting"}  # fmt: skip
__all__ = [*sorted(_PUBLIC), "__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

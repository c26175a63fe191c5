"""Scientific domain-adaptation workbench: adapt a pretrained model to your data, honestly measured.

>>> import workbench
>>> run = workbench.adapt(domain="TASK", method="METHOD", epochs=2)  # doctest: +SKIP (names: workbench list)
>>> run.metrics["after"], run.path                                  # doctest: +SKIP
"""

import warnings

# Some model libraries trip a TorchScript annotation warning on every import: pure noise.
warnings.filterwarnings("ignore", message="The TorchScript type system", category=UserWarning)

# The one import of a plug-in package by the engine: its __init__ imports no model library, it installs the hooks
# that make them import safely whenever something imports them (a user's `import peft` after `import workbench`).
import workbench.models  # noqa: E402, F401

__version__ = "0.1.0"

from workbench.comparison import CompareSpec, compare  # noqa: E402
from workbench.run import Run, adapt, evaluate, predict  # noqa: E402

__all__ = ["CompareSpec", "Run", "adapt", "compare", "evaluate", "predict", "__version__"]

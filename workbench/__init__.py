"""Scientific domain-adaptation workbench: adapt a pretrained model to your data, honestly measured.

>>> import workbench
>>> run = workbench.adapt(domain="TASK", method="METHOD", epochs=2)  # doctest: +SKIP (names: workbench list)
>>> run.metrics["after"], run.path                                  # doctest: +SKIP
"""

import warnings

# Some model libraries trip a TorchScript annotation warning on every import: pure noise.
warnings.filterwarnings("ignore", message="The TorchScript type system", category=UserWarning)

__version__ = "0.1.0"

from workbench.run import Run, adapt, evaluate, predict  # noqa: E402

__all__ = ["Run", "adapt", "evaluate", "predict", "__version__"]

"""Scientific domain-adaptation workbench: adapt a pretrained model to your data, honestly measured.

>>> import workbench
>>> run = workbench.adapt(domain="rmd17", method="elora", epochs=2, train_size=20)  # doctest: +SKIP
>>> run.metrics["after"]["forces_mae_mev_per_a"]                                    # doctest: +SKIP
"""

import os
import warnings

import torch

# e3nn's and mace-torch's modules trip a TorchScript annotation warning on every import: pure noise.
warnings.filterwarnings("ignore", message="The TorchScript type system", category=UserWarning)

# mace-torch sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 when it is imported, which silently turns every later
# torch.load without an explicit weights_only into a full unpickle. Import its (tiny) package first and take
# the setting back, so the process keeps torch's safe default.
try:
    import mace  # noqa: F401
except ImportError:  # mace-torch comes with the atomistic extra
    pass
os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)

# e3nn 0.4.4 (pinned by mace-torch) loads its Clebsch-Gordan constants with torch.load, which under
# torch >= 2.6 refuses the `slice` objects they contain; allowing exactly that one type fixes it
# (never TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD). It must run before e3nn is first imported.
torch.serialization.add_safe_globals([slice])

__version__ = "0.1.0"

from workbench.run import Run, adapt, evaluate, predict  # noqa: E402

__all__ = ["Run", "adapt", "evaluate", "predict", "__version__"]

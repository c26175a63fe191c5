"""Backbones and their pretrained checkpoints (``workbench.models``), one module per model family.

This package's import runs before any plug-in (``workbench/__init__`` imports it first), so it is the one place
where third-party model libraries are made to import safely:

- e3nn 0.4.4 (pinned by mace-torch) loads its Clebsch-Gordan constants with ``torch.load``, which under
  torch >= 2.6 refuses the ``slice`` objects they contain; allowing exactly that one type fixes it (never
  ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``). It must run before e3nn is first imported.
- mace-torch sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` when imported, which silently turns every later
  ``torch.load`` without an explicit ``weights_only`` into a full unpickle. Its (tiny) package is imported here
  and the setting taken back, so the process keeps torch's safe default (`workbench.models.mace.calculator` does
  the same after ``mace.calculators``, which sets it again).
- torchaudio is never needed: transformers (so PEFT) imports it only when it is installed, and the PyPI wheel
  does not load against the CPU torch build. No extra of the workbench installs it; do not add it.
"""

import os

import torch

torch.serialization.add_safe_globals([slice])
try:
    import mace  # noqa: F401
except ImportError:  # mace-torch comes with the atomistic extra
    pass
os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)

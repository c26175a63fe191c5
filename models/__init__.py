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
- torchaudio: braindecode requires it (and transformers, so PEFT, imports it whenever it is installed), but the
  PyPI wheel's compiled extension (``torchaudio/lib/_torchaudio.so``) links CUDA torch (``libc10_cuda.so``) and
  fails to load against the CPU torch build, which breaks ``import torchaudio`` and everything that imports it.
  torchaudio itself runs without that extension when its library files are absent (it then reports
  ``_IS_TORCHAUDIO_EXT_AVAILABLE = False`` and its pure-PyTorch functions work: ``lfilter``, ``filtfilt``,
  ``fftconvolve``, ``Resample``, ``Spectrogram`` — what braindecode uses). So when, and only when, the extension
  fails to load, `_import_torchaudio_without_its_extension` imports torchaudio once more with its ``lib/`` folder
  hidden from torchaudio's loader; nothing is changed on disk and a working extension is always used.
"""

import importlib.util
import logging
import os
import sys
import warnings
from pathlib import Path

import torch

# braindecode builds a montage under a name MNE 1.13 deprecates, on every import: noise for the user.
warnings.filterwarnings("ignore", message="Montage name 'standard_1020' is deprecated", category=FutureWarning)
torch.serialization.add_safe_globals([slice])
try:  # imported by name only: binding ``mace`` here would hide this package's own `workbench.models.mace`
    importlib.import_module("mace")
except ImportError:  # mace-torch comes with the atomistic extra
    pass
os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)

#: The model families (one module each), imported on first use as attributes (``workbench.models.mace``).
FAMILIES = ("ecg", "eeg", "graph", "mace", "medvl", "mlp", "physio", "vq")


def __getattr__(name: str):
    if name in FAMILIES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _import_torchaudio_without_its_extension() -> None:
    """Import torchaudio (when installed) so that later imports find it, without its extension if that cannot load."""
    spec = importlib.util.find_spec("torchaudio")
    if spec is None:
        return
    try:
        import torchaudio  # noqa: F401
    except OSError as error:
        for name in [name for name in sys.modules if name == "torchaudio" or name.startswith("torchaudio.")]:
            del sys.modules[name]
        hidden = Path(spec.origin).parent / "lib"
        glob = Path.glob
        Path.glob = lambda self, *args, **kwargs: iter(()) if self == hidden else glob(self, *args, **kwargs)
        try:
            import torchaudio  # noqa: F401, F811
        finally:
            Path.glob = glob
        logging.getLogger(__name__).debug("torchaudio runs without its compiled extension (%s)", error)


_import_torchaudio_without_its_extension()

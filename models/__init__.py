"""Backbones and their pretrained checkpoints (``workbench.models``), one module per model family.

Importing this package imports no third-party model library; it arranges that each imports safely when something
first imports it (the adaptation and domain packages import this package first, so every plug-in path is covered;
``import workbench`` alone imports none of them):

- e3nn 0.4.4 (pinned by mace-torch) loads its Clebsch-Gordan constants with ``torch.load``, which under
  torch >= 2.6 refuses the ``slice`` objects they contain; allowing exactly that one type fixes it (never
  ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``). It is done when e3nn is imported, before its code runs
  (`_e3nn_with_slices_allowed`), so that importing this package imports no torch: a command that refuses a
  mistyped name does so before torch is imported.
- mace-torch sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` when imported, which silently turns every later
  ``torch.load`` without an explicit ``weights_only`` into a full unpickle. When its package ``mace`` has been
  imported the setting is taken back (`_after_import`), so the process keeps torch's safe default
  (`workbench.models.mace.calculator` does the same after ``mace.calculators``, which sets it again).
- mace-torch's ``mace.tools.cg`` prints on stdout, at every import, that cuEquivariance is not installed (an
  optional GPU backend), so that ``--quiet`` is not quiet; `_mace_cg_without_its_notice` drops that one line.
- torchaudio: braindecode requires it (and transformers, so PEFT, imports it whenever it is installed), but the
  PyPI wheel's compiled extension (``torchaudio/lib/_torchaudio.so``) links CUDA torch (``libc10_cuda.so``) and
  fails to load against the CPU torch build, which breaks ``import torchaudio`` and everything that imports it.
  torchaudio itself runs without that extension when its library files are absent (it then reports
  ``_IS_TORCHAUDIO_EXT_AVAILABLE = False`` and its pure-PyTorch functions work: ``lfilter``, ``filtfilt``,
  ``fftconvolve``, ``Resample``, ``Spectrogram`` — what braindecode uses). So when, and only when, the extension
  fails to load, `_torchaudio_without_its_extension` runs torchaudio's import once more with its ``lib/`` folder
  hidden from torchaudio's loader; nothing is changed on disk and a working extension is always used.
"""

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Callable

# braindecode builds a montage under a name MNE 1.13 deprecates, on every import: noise for the user.
warnings.filterwarnings("ignore", message="Montage name 'standard_1020' is deprecated", category=FutureWarning)

#: The model families (one module each), imported on first use as attributes (``workbench.models.mace``).
FAMILIES = ("ecg", "eeg", "graph", "mace", "medvl", "mlp", "physio", "sevennet", "vq")


def __getattr__(name: str):
    if name in FAMILIES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps the import of the top-level package ``name``: ``run(module, execute)`` executes it (``execute`` runs
    the package's own code) and may repair what it did. Once the package has been imported it leaves
    ``sys.meta_path`` (a mere ``find_spec`` probe, as libraries make to see what is installed, leaves it there)."""

    def __init__(self, name: str, run: Callable[[object, Callable[[], None]], None]):
        self.name, self.run = name, run

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            self.run(module, lambda: execute(module))
            if self in sys.meta_path:
                sys.meta_path.remove(self)

        spec.loader.exec_module = exec_module
        return spec


def _mace_without_its_setting(module, execute: Callable[[], None]) -> None:
    execute()
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)


def _e3nn_with_slices_allowed(module, execute: Callable[[], None]) -> None:
    """Allow ``slice`` in ``torch.load``'s weights-only unpickler, then execute e3nn (which loads its constants)."""
    import torch

    torch.serialization.add_safe_globals([slice])
    execute()


def _mace_cg_without_its_notice(module, execute: Callable[[], None]) -> None:
    """Execute ``mace.tools.cg``, which prints on stdout, at every import, that cuEquivariance is not installed (an
    optional GPU backend: ``--backend cueq`` says what to install when asked for). That one line is dropped; anything
    else the module prints is passed on, and an error raised while importing it propagates as it is."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            execute()
    finally:
        kept = [line for line in printed.getvalue().splitlines() if not line.startswith(_MACE_CUEQ_NOTICE)]
        if kept:
            print("\n".join(kept))


#: How mace-torch 0.3's notice begins (`mace/tools/cg.py`).
_MACE_CUEQ_NOTICE = "cuequivariance or cuequivariance_torch is not available"


def _torchaudio_without_its_extension(module, execute: Callable[[], None]) -> None:
    """Execute torchaudio's package; if its extension cannot load, once more with its ``lib/`` folder hidden."""
    try:
        execute()
    except OSError as error:
        for name in [name for name in sys.modules if name.startswith("torchaudio.")]:
            del sys.modules[name]
        hidden = Path(module.__spec__.origin).parent / "lib"
        glob = Path.glob
        Path.glob = lambda self, *args, **kwargs: iter(()) if self == hidden else glob(self, *args, **kwargs)
        try:
            execute()
        finally:
            Path.glob = glob
        logging.getLogger(__name__).debug("torchaudio runs without its compiled extension (%s)", error)


for _name, _run in (
    ("e3nn", _e3nn_with_slices_allowed),
    ("mace", _mace_without_its_setting),
    ("mace.tools.cg", _mace_cg_without_its_notice),
    ("torchaudio", _torchaudio_without_its_extension),
):
    if _name not in sys.modules and not any(getattr(f, "name", None) == _name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(_name, _run))
os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # mace imported before this package
if "e3nn" in sys.modules:  # imported before this package: its later loads need slices too
    _e3nn_with_slices_allowed(sys.modules["e3nn"], lambda: None)

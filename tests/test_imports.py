"""Third-party libraries that import torchaudio load beside the CPU torch build once the workbench is imported."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import workbench
import torch, torchaudio, peft, braindecode.models
import torchaudio.functional as F
x = torch.randn(2, 400, dtype=torch.float64)
y = F.filtfilt(x, torch.tensor([1.0, -0.9], dtype=torch.float64), torch.tensor([0.05, 0.05], dtype=torch.float64))
assert y.shape == x.shape and torch.isfinite(y).all()
print("ok", torchaudio.__version__, torch.__version__)
"""


def test_torchaudio_peft_and_braindecode_import_with_the_workbench():
    """torchaudio's PyPI wheel links CUDA torch; the workbench imports it without that extension (models/__init__)."""
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ok" in result.stdout

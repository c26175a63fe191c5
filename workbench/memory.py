"""Peak memory of one stretch of work (one method's training): GPU allocations, or this process's resident set.

On a GPU the numbers are PyTorch's ``max_memory_allocated``. On a CPU under Linux the process's resident
high-water mark (``VmHWM``) is reset at the start (``/proc/self/clear_refs``) after the C heap has returned its
free memory (``malloc_trim``), so each stretch gets its own peak even late in a run; elsewhere the peak is the
process's high-water mark since it started (``ru_maxrss``), which only grows, and ``added_bytes`` is None.
"""

from __future__ import annotations

import ctypes
import gc
import re
import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", _STATUS.read_text()).group(1))


def _release_free_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class PeakMemory:
    """``with PeakMemory(device) as memory: ...`` then ``memory.peak_bytes`` and ``memory.added_bytes``.

    ``peak_bytes``: the largest GPU allocation total, or resident set size, during the block [bytes].
    ``added_bytes``: ``peak_bytes`` minus the value at the start — what the block itself needed at its peak
    (None where the peak cannot be reset).
    """

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.peak_bytes = 0
        self.added_bytes: int | None = None
        self._start = 0
        self._resettable = False

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        _release_free_heap()
        try:
            self._start = _status_kib("VmRSS") * 1024
            _CLEAR_REFS.write_text("5")  # VmHWM := VmRSS
            self._resettable = True
        except (OSError, AttributeError):  # no /proc (macOS, Windows) or no permission
            self._resettable = False
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
            self.added_bytes = self.peak_bytes - self._start
        elif self._resettable:
            self.peak_bytes = _status_kib("VmHWM") * 1024
            self.added_bytes = self.peak_bytes - self._start
        else:
            maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.peak_bytes = int(maxrss if sys.platform == "darwin" else maxrss * 1024)

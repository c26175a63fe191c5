"""Memory of one stretch of work: the tensors it allocates (`TensorMemory`, `training_step_bytes`), or the process.

`TensorMemory` counts bytes of tensor storages: on a CPU through a dispatch mode that sees every operator's outputs, on
a GPU through PyTorch's allocator statistics; it separates methods whatever the C heap keeps cached.
`training_step_bytes` uses it for the peak of one optimizer step (activations, gradients, optimizer state).

`PeakMemory` measures the process instead. On a GPU the numbers are PyTorch's ``max_memory_allocated``. On a CPU
under Linux the process's resident high-water mark (``VmHWM``) is reset at the start (``/proc/self/clear_refs``) after
the C heap has returned its free memory (``malloc_trim``), so each stretch gets its own peak even late in a run;
elsewhere the peak is the process's high-water mark since it started (``ru_maxrss``), which only grows, and
``added_bytes`` is None.
"""

from __future__ import annotations

import ctypes
import gc
import re
import resource
import sys
import weakref
from pathlib import Path
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

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


class _LiveStorages(TorchDispatchMode):
    """Counts the bytes of the strided tensor storages that operators create while the mode is active.

    A storage is counted when an operator returns it and none of the operator's inputs holds it (a view or an
    in-place result is not new memory); it is uncounted when it is freed (a weakref finalizer). A counted storage
    that an operator resizes is recounted at its new size. Storages made before the mode began are never counted.
    """

    def __init__(self):
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def _free(self, nbytes: list[int]) -> None:
        self.live_bytes -= nbytes[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        inputs = {
            id(t.untyped_storage())
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and t.layout == torch.strided
        }
        for t in tree_leaves(result):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            nbytes = self._sizes.get(storage)
            if nbytes is not None:  # counted already: follow a resize
                self.live_bytes += storage.nbytes() - nbytes[0]
                nbytes[0] = storage.nbytes()
            elif id(storage) not in inputs:
                nbytes = [storage.nbytes()]
                self._sizes[storage] = nbytes
                weakref.finalize(storage, self._free, nbytes)
                self.live_bytes += nbytes[0]
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return result


class TensorMemory:
    """``with TensorMemory(device) as memory: ...``: bytes of the tensors the block allocates that are alive at once.

    ``peak_bytes``: the largest total since the start or the last `reset_peak` [bytes]; ``live_bytes``: the total
    now [bytes]. Tensors that existed before the block (a model's weights) are not counted. On a CPU every
    operator's new output storage is counted until it is freed (not what the allocator keeps cached, nor scratch
    memory a kernel takes outside PyTorch's operators, nor a tensor made without an operator, e.g. by
    ``torch.as_tensor`` on a NumPy array); on a GPU the numbers are ``memory_allocated`` and
    ``max_memory_allocated`` minus ``memory_allocated`` at the start (the caching allocator's blocks, rounded up).
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._mode: _LiveStorages | None = None
        self._start = 0
        self._peak = 0

    def __enter__(self) -> "TensorMemory":
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._mode = _LiveStorages()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)
        else:
            self._peak = self.peak_bytes  # keep the block's numbers after the statistics move on

    @property
    def live_bytes(self) -> int:
        if self._mode is not None:
            return self._mode.live_bytes
        return torch.cuda.memory_allocated(self.device) - self._start

    @property
    def peak_bytes(self) -> int:
        if self._mode is not None:
            return self._mode.peak_bytes
        if self._peak:
            return self._peak
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - self._start

    def reset_peak(self) -> None:
        """Start a new peak from what is alive now."""
        if self._mode is not None:
            self._mode.peak_bytes = self._mode.live_bytes
        else:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)


def training_step_bytes(train: Callable[[], Any], device: torch.device | str, warm_up_steps: int = 1) -> list[int]:
    """Peak tensor bytes of each optimizer step that ``train()`` takes after the first ``warm_up_steps`` [bytes].

    A step spans from the end of the previous ``Optimizer.step`` (or the start) to the end of its own: the batch
    (when an operator makes it, see `TensorMemory`), the forward pass and its saved activations, the gradients,
    the optimizer's update and whatever stays alive from earlier steps (optimizer state, an EMA of the weights) —
    every tensor ``train()`` allocated and that is alive (`TensorMemory`). The warm-up steps create the optimizer
    state; they are run but not returned. What ``train()`` does after its last optimizer step (a validation pass)
    is in no step.
    """
    peaks: list[int] = []
    with TensorMemory(device) as memory:

        def step_done(optimizer, args, kwargs) -> None:
            peaks.append(memory.peak_bytes)
            memory.reset_peak()

        handle = register_optimizer_step_post_hook(step_done)
        try:
            train()
        finally:
            handle.remove()
    if len(peaks) <= warm_up_steps:
        raise ValueError(
            f"training_step_bytes: train() took {len(peaks)} optimizer step(s); it needs more than the "
            f"{warm_up_steps} warm-up step(s)"
        )
    return peaks[warm_up_steps:]

"""Where a run computes: the one owner of device placement.

``--device auto|cpu|cuda`` is resolved once (`resolve`); the engine places every base model on that device
(`place`) before any task or method hook sees it, so a hook finds the run's device from the model it is given
(`device_of`) and no helper needs a device default of its own. A test holds every helper in ``domains/``,
``adaptation/`` and ``models/`` to that (no ``device="cpu"`` default), and `workbench.core.placement_harness` makes the
run device distinguishable from the CPU on a CPU-only machine, so that a tensor left behind on the host fails the
contract tests as it would fail on a GPU.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import nn

from workbench.core.errors import UserError

#: ``--device`` values: "auto" is cuda where torch sees a CUDA device, else cpu.
DEVICES = ("auto", "cpu", "cuda")

#: Set by `workbench.core.placement_harness.placement_harness` while it runs: maps the resolved device to the one the
#: harness stands in for it (None: devices are what they say).
_stand_in: Callable[[torch.device], torch.device] | None = None


def resolve_name(device: str | torch.device | None) -> str:
    """The device type a run computes on, as written in its ``config.yaml``: "auto" (or None) is "cuda" where torch
    sees a CUDA device, else "cpu"; "cuda" without one is a `UserError`."""
    name = "auto" if device is None else str(device)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = name.split(":")[0]
    if kind not in ("cpu", "cuda"):
        raise UserError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device is visible to torch (use --device cpu or auto)")
    return name


def resolve(device: str | torch.device | None) -> torch.device:
    """The `torch.device` of ``--device`` (see `resolve_name`); the one place "auto" is decided."""
    resolved = torch.device(resolve_name(device))
    return _stand_in(resolved) if _stand_in is not None else resolved


def unregistered_tensors(model: nn.Module) -> Iterator[str]:
    """Qualified names of the tensors a module holds as plain attributes (``self.x = torch.zeros(3)``), which
    ``model.to(device)`` does not move: they belong in a buffer (``register_buffer``) or a parameter. Tensors with
    fewer than two elements are left out (a scalar on the host is legal beside a CUDA tensor)."""
    for prefix, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):  # TorchScript keeps its attributes in C++, moved with it
            continue
        registered = set(module._parameters) | set(module._buffers)
        for name, value in vars(module).items():
            if name in registered or name.startswith("__"):
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(item, torch.Tensor) and not isinstance(item, nn.Parameter) and item.numel() > 1
                   for item in values):  # fmt: skip
                yield f"{prefix}.{name}" if prefix else name


def place(model: nn.Module, device: str | torch.device) -> nn.Module:
    """Move ``model`` (its parameters and buffers) onto ``device`` and return it. A model holding tensors outside
    its parameters and buffers is refused (they would stay behind on the host): a `UserError` naming them."""
    left_behind = sorted(unregistered_tensors(model))
    if left_behind:
        raise UserError(
            f"{type(model).__name__} holds tensors outside its parameters and buffers, which would not move to "
            f"{device}: {', '.join(left_behind[:5])}{' ...' if len(left_behind) > 5 else ''} (register them with "
            "register_buffer)"
        )
    return model.to(resolve(device) if isinstance(device, str) else device)


def device_of(model: nn.Module) -> torch.device:
    """The device ``model`` computes on: that of its first parameter (or buffer); the CPU for a model with neither."""
    for tensor in _tensors(model):
        return tensor.device
    return torch.device("cpu")


def _tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()


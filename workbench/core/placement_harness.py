"""A run device that a CPU-only machine can tell apart from the CPU, for tests of placement.

On a CPU machine the run device *is* the CPU, so a helper that puts its batch on ``"cpu"`` beside a model on the
run device passes every test and fails on the first GPU. Under `placement_harness` the engine's resolved device
(`workbench.core.device.resolve`) becomes a stand-in, ``cpu:0``, and every tensor's storage is followed:

- a tensor is *on the run device* when it was moved or made there (``.to(cpu:0)``, ``device=cpu:0``, the device of
  a tensor on it) or computed from one; its ``.device`` then reads ``cpu:0``, as a CUDA tensor reads ``cuda:0``;
- a tensor is *on the host* when made from host data, by a factory without a device, or moved to ``"cpu"``;
- a tensor made inside compiled code (TorchScript, C++) with no tensor argument is *neutral*: it takes the side of
  what it meets (the harness cannot see the device such code asked for);
- an operator that mixes a run-device tensor with a host tensor of more than one element raises `PlacementError`
  (a host scalar beside a CUDA tensor is legal, so it is here), and so does ``.numpy()`` of a run-device tensor.

A `TorchFunctionMode` sees the Python calls (``.to``, ``.device``, factories), a `TorchDispatchMode` every operator,
inside TorchScript and generated code too. Moves copy, as a real transfer does; copies that no mode sees (a
tensor's deep copy, a TorchScript module's ``torch.jit.save`` then ``load``) keep their tensors' sides, as they keep
devices.
The numbers computed are the CPU's own: only placement is checked. Not followed: tensors rebuilt by ``pickle``
(a model library that pickles its generated modules when a model is deep-copied reads as on the host there, so
such a model is not run under the harness; ``docs/gpu.md`` names it).
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any, Iterator

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from workbench.core import device as placement

#: The stand-in for the run device.
RUN_DEVICE = torch.device("cpu", 0)
_HOST = torch.device("cpu")
_DEVICE_PROPERTY = torch._C.TensorBase.__dict__["device"]
_RUN, _NEUTRAL = "run", "neutral"

#: Python-level factories: without a ``device`` they make host tensors (as on a GPU machine).
_FACTORIES = {
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.linspace, torch.logspace, torch.eye,
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.tensor, torch.as_tensor, torch.from_numpy,
    torch.normal, torch.scalar_tensor,
}  # fmt: skip
#: Operators that legally take tensors of both sides on CUDA: copies across devices, and host index tensors.
_CROSSING = {"aten::copy_", "aten::_to_copy", "aten::lift_fresh", "aten::lift_fresh_copy", "aten::_copy_from"}
_INDEXED = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_", "aten::_unsafe_index",
            "aten::_unsafe_index_put"}  # fmt: skip


class PlacementError(RuntimeError):
    """An operator mixed a tensor on the run device with one on the host (it would fail on a GPU)."""


class _Sides:
    """The side (run device or neutral; host when absent) of every storage seen, by its storage's identity."""

    def __init__(self) -> None:
        self.sides: dict[int, tuple[str, StorageWeakRef]] = {}
        #: The first mix seen (TorchScript re-raises it as a RuntimeError without its message).
        self.violation: PlacementError | None = None
        self.lock = threading.Lock()

    @staticmethod
    def _storage(tensor: torch.Tensor) -> Any:
        try:
            return tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested: no storage to follow
            return None

    def side(self, tensor: torch.Tensor) -> str | None:
        storage = self._storage(tensor)
        if storage is None:
            return _NEUTRAL
        entry = self.sides.get(storage._cdata)
        if entry is None or entry[1].expired():
            return None
        return entry[0]

    def mark(self, tensor: torch.Tensor, side: str | None) -> None:
        storage = self._storage(tensor)
        if storage is None:
            return
        with self.lock:
            if side is None:
                self.sides.pop(storage._cdata, None)
            else:
                self.sides[storage._cdata] = (side, StorageWeakRef(storage))
            if len(self.sides) > 50_000:  # drop the tags of freed storages
                self.sides = {key: entry for key, entry in self.sides.items() if not entry[1].expired()}


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]


def _describe(tensor: torch.Tensor) -> str:
    return f"{tuple(tensor.shape)} {str(tensor.dtype).replace('torch.', '')}"


class _Calls(TorchFunctionMode):
    """Python-level calls: moves, factories, ``.device`` and ``.numpy()``."""

    def __init__(self, sides: _Sides, made: threading.local) -> None:
        super().__init__()
        self.sides, self.made = sides, made

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _DEVICE_PROPERTY:  # tensor.device
            return RUN_DEVICE if self.sides.side(args[0]) == _RUN else func(*args)
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and self.sides.side(args[0]) == _RUN:
            raise PlacementError(f"numpy() of a tensor on the run device {_describe(args[0])}: move it to the host "
                                 "first (.cpu())")  # fmt: skip
        if func is torch.Tensor.__deepcopy__:  # a copy of storage, no operator: it stays where it was
            out = func(*args, **kwargs)
            self.sides.mark(out, self.sides.side(args[0]))
            return out
        if func in (torch.Tensor.to, torch.Tensor.cpu):
            parsed = {k: v for k, v in kwargs.items() if k != "copy"}  # Tensor.to's own keyword, not Module.to's
            target = _HOST if func is torch.Tensor.cpu else torch._C._nn._parse_to(*args[1:], **parsed)[0]
            if target is None:
                return func(*args, **kwargs)
            return self._moved(func, args, kwargs, target)
        target = kwargs.get("device")
        if target is not None or func in _FACTORIES:
            target = torch.device(target) if target is not None else _HOST
            if target == RUN_DEVICE:
                kwargs = {**kwargs, "device": _HOST}
            return self._made(func, args, kwargs, _RUN if target == RUN_DEVICE else None)
        return func(*args, **kwargs)

    def _moved(self, func, args, kwargs, target: torch.device) -> Any:
        source = args[0]
        side = _RUN if target == RUN_DEVICE else None
        if side == _RUN:  # the stand-in is the host device to torch
            args = (source, *[_HOST if isinstance(a, torch.device) and a == RUN_DEVICE else a for a in args[1:]])
            args = tuple(_HOST if isinstance(a, str) and torch.device(a) == RUN_DEVICE else a for a in args)
            if "device" in kwargs:
                kwargs = {**kwargs, "device": _HOST}
        out = func(*args, **kwargs)
        if self.sides.side(source) == side:
            return out
        if out.untyped_storage()._cdata == source.untyped_storage()._cdata:
            out = out.clone()  # a move across devices copies
        self.sides.mark(out, side)
        return out

    def _made(self, func, args, kwargs, side: str | None) -> Any:
        self.made.side = side or "host"
        try:
            out = func(*args, **kwargs)
        finally:
            self.made.side = None
        sources = {t.untyped_storage()._cdata for t in _tensors((args, kwargs))}
        for tensor in _tensors(out):
            if tensor.untyped_storage()._cdata in sources:  # as_tensor(x, device=...) may return x itself
                continue
            self.sides.mark(tensor, side)
        return out


class _Operators(TorchDispatchMode):
    """Every operator: refuse a mix of sides; the outputs take the side of the inputs."""

    def __init__(self, sides: _Sides, made: threading.local) -> None:
        super().__init__()
        self.sides, self.made = sides, made

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        inputs = _tensors((args, kwargs))
        checked = inputs[:1] + _tensors(args[2:]) if name in _INDEXED else inputs  # indices may be on the host
        sides = {self.sides.side(t) for t in checked if t.dim() > 0 and t.numel() > 1}
        if _RUN in sides and None in sides and name not in _CROSSING:
            run = next(t for t in checked if self.sides.side(t) == _RUN)
            host = next(t for t in checked if self.sides.side(t) is None and t.dim() > 0 and t.numel() > 1)
            self.sides.violation = PlacementError(
                f"{name} mixes a tensor on the run device {_describe(run)} with one on the host {_describe(host)}: "
                "the host one was made or moved without the run's device (on a GPU this is 'Expected all tensors "
                "to be on the same device')"
            )
            raise self.sides.violation
        out = func(*args, **kwargs)
        if name in ("aten::copy_", "aten::_copy_from"):  # the destination keeps its side
            return out
        every = {self.sides.side(t) for t in inputs}
        if not inputs:
            made = getattr(self.made, "side", None)
            side = _NEUTRAL if made is None else (_RUN if made == _RUN else None)
        else:
            side = _RUN if _RUN in every else (None if None in every else _NEUTRAL)
        input_storages = {t.untyped_storage()._cdata for t in inputs if t.layout == torch.strided}
        for tensor in _tensors(out):
            if side is None and tensor.layout == torch.strided and tensor.untyped_storage()._cdata in input_storages:
                continue  # a view of a host input stays as it is
            self.sides.mark(tensor, side)
        return out


#: The sides of a saved TorchScript module's tensors, kept in its archive (``torch.jit.save``'s extra files), so
#: that ``torch.jit.load`` puts them back where they were, as it does with devices.
_SIDES_FILE = "workbench_placement_sides.json"


def _script_save(save: Any, sides: _Sides) -> Any:
    def jit_save(module: Any, f: Any, _extra_files: dict[str, Any] | None = None) -> Any:
        tensors = module.state_dict(keep_vars=True).values()
        extra = {**(_extra_files or {}), _SIDES_FILE: json.dumps([sides.side(t) for t in tensors])}
        return save(module, f, _extra_files=extra)

    return jit_save


def _script_load(load: Any, sides: _Sides) -> Any:
    def jit_load(f: Any, map_location: Any = None, _extra_files: dict[str, Any] | None = None) -> Any:
        extra = {_SIDES_FILE: ""} if _extra_files is None else {**_extra_files, _SIDES_FILE: ""}
        module = load(f, map_location, _extra_files=extra)
        if _extra_files is not None:
            _extra_files.update({k: v for k, v in extra.items() if k != _SIDES_FILE})
        if extra[_SIDES_FILE] and map_location is None:  # else: where map_location says (the host)
            for tensor, side in zip(module.state_dict(keep_vars=True).values(), json.loads(extra[_SIDES_FILE])):
                sides.mark(tensor, side)
        return module

    return jit_load


@contextlib.contextmanager
def placement_harness() -> Iterator[torch.device]:
    """Run the enclosed code with `RUN_DEVICE` standing in for the device the engine resolves (yields it); a
    mix of run-device and host tensors in one operator raises `PlacementError` (out of this block, also where
    compiled code turned it into another error on the way)."""
    sides, made = _Sides(), threading.local()
    previous = placement._stand_in
    placement._stand_in = lambda device: RUN_DEVICE if device.type == "cpu" else device
    script_save, script_load = torch.jit.save, torch.jit.load
    torch.jit.save, torch.jit.load = _script_save(script_save, sides), _script_load(script_load, sides)
    try:
        with _Operators(sides, made), _Calls(sides, made):
            yield RUN_DEVICE
    except Exception as error:
        if sides.violation is not None and error is not sides.violation:
            raise sides.violation from error
        raise
    finally:
        placement._stand_in = previous
        torch.jit.save, torch.jit.load = script_save, script_load

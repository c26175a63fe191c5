"""Fixed costs paid once per comparison instead of once per cell.

Every cell of a comparison is a run of its own (`workbench.run.adapting.run_request`), and the cells of one seed, or of
one (fold, seed), compute much alike: the same data read or generated, the same pretrained model loaded, the same
splits prepared, the same base-model scores, the same fold-free fits of a method (a weight generator fitted over a
bank of adapters). Inside `sharing()` such a step runs through `shared`: the first call computes it and keeps a copy
in this process; a later call with the same key gets a fresh copy of the kept value instead, with the global random
generators (`workbench.core.randomness`) and the attributes the step set on the task put back as the step left them.
So a cell computes exactly what it would have computed alone: the key holds what the step depends on (data
fingerprint, settings, seed, split) and the state of the random generators before it, and the copy is deep
(a method may change the model or the samples it gets).

Measurements of the computer rather than of the model (a warm-up step, a training step's memory) go through
`measured_once`: taken once per worker and step key, whatever the random generators hold (they change nothing the run
computes afterwards; the memory probe puts the generators back as it found them).

Outside `sharing()` (`workbench adapt`, a notebook) `shared` and `measured_once` just compute. The kept values live
in this process only (a long-lived comparison worker keeps them from cell to cell), at most `KEPT` of them, least
recently used dropped first; cells run seed by seed, so the ones dropped belong to seeds already done.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

from workbench.core import randomness

T = TypeVar("T")

#: Kept values at most (per process): the data of a seed, a model and each (fold, seed)'s split and scores.
KEPT = 12


@dataclass
class _Kept:
    value: Any
    #: The global random generators as the step left them (`workbench.core.randomness.capture`).
    random_state: dict[str, Any]
    #: The task attributes the step set or replaced, as it left them.
    task_attributes: dict[str, Any]


_kept: OrderedDict[str, _Kept] = OrderedDict()
_measured: dict[str, Any] = {}
_active = False
_MISSING = object()


@contextmanager
def sharing(active: bool = True) -> Iterator[None]:
    """Within the block, `shared` keeps and reuses values (``active`` False: it computes each time, as outside)."""
    global _active
    before, _active = _active, active
    try:
        yield
    finally:
        _active = before


def clear() -> None:
    """Drop every kept value and measurement."""
    _kept.clear()
    _measured.clear()


def shared(step: str, key: Any, make: Callable[[], T], task: Any = None) -> T:
    """``make()``, or within `sharing()` a deep copy of what it returned the first time it ran with the same
    ``step``, ``key`` (JSON-able: what the result depends on; None: nothing to share by) and random-generator state;
    ``task``: the object whose attributes ``make`` may set (they are restored with the value)."""
    if not _active or key is None:
        return make()
    digest = _digest(step, key)
    kept = _kept.get(digest)
    if kept is None:
        attributes_before = dict(vars(task)) if task is not None else {}
        value = make()
        attributes = {name: value_ for name, value_ in (vars(task) if task is not None else {}).items()
                      if attributes_before.get(name, _MISSING) is not value_}  # fmt: skip
        kept = _Kept(copy.deepcopy(value), randomness.capture(), copy.deepcopy(attributes))
        _kept[digest] = kept
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
        return value
    _kept.move_to_end(digest)
    randomness.restore(kept.random_state)
    if task is not None:
        vars(task).update(copy.deepcopy(kept.task_attributes))
    return copy.deepcopy(kept.value)


def measured_once(step: str, key: Any, measure: Callable[[], T]) -> T:
    """``measure()``, or within `sharing()` what it returned the first time with the same ``step`` and ``key``
    (whatever the random generators hold): for measurements of the computer (a warm-up, a step's memory) that change
    nothing a run computes afterwards."""
    if not _active or key is None:
        return measure()
    digest = _digest_of(step, key)
    if digest not in _measured:
        _measured[digest] = measure()
    return _measured[digest]


def _digest_of(step: str, key: Any) -> str:
    """sha256 (hex) of ``step`` and ``key``."""
    return hashlib.sha256(json.dumps([step, key], sort_keys=True, default=str).encode()).hexdigest()


def _digest(step: str, key: Any) -> str:
    """sha256 (hex) of ``step``, ``key`` and the state of every global random generator."""
    digest = hashlib.sha256(_digest_of(step, key).encode())
    state = randomness.capture()
    digest.update(state["torch"].numpy().tobytes())
    for cuda in state["cuda"]:
        digest.update(cuda.numpy().tobytes())
    numpy = state["numpy"]
    digest.update(numpy["keys"].numpy().tobytes())
    digest.update(json.dumps([numpy["position"], numpy["has_gauss"], numpy["cached"]]).encode())
    digest.update(state["random"]["internal"].numpy().tobytes())
    digest.update(repr(state["random"]["gauss"]).encode())
    return digest.hexdigest()

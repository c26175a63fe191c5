"""Exponential moving average of trained parameters (what validation and the result use).

After optimiser step ``t = 1, 2, ...`` every shadow copy ``s`` of a parameter ``θ`` moves towards it::

    d_t = min(decay, (1 + t) / (10 + t))        (a short warm-up: early steps average over few updates)
    s  ← s − (1 − d_t) · (s − θ)

— the schedule of TensorFlow's ``ExponentialMovingAverage(num_updates=...)`` and of the ``torch-ema`` package
(tests check the two agree), kept in the engine so that every install has it.

Example::

    >>> ema = ExponentialMovingAverage(params, decay=0.99)   # doctest: +SKIP
    >>> optimizer.step(); ema.update()                        # doctest: +SKIP
    >>> with ema.average_parameters(): validate(model)        # doctest: +SKIP
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch


class ExponentialMovingAverage:
    """Shadow copies of ``params`` averaged after each `update`.

    Args:
        params: the trained parameters (kept by reference; their order is the state's order).
        decay: the largest per-step decay, in [0, 1).
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.params = list(params)
        self.decay = decay
        self.num_updates = 0
        self.shadow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average, after an optimiser step."""
        self.num_updates += 1
        decay = min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
        for shadow, param in zip(self.shadow, self.params):
            shadow.sub_((shadow - param).mul_(1.0 - decay))

    @contextmanager
    def average_parameters(self) -> Iterator[None]:
        """Inside the block the parameters hold the averages; afterwards their own values again."""
        kept = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for param, shadow in zip(self.params, self.shadow):
                param.copy_(shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                for param, value in zip(self.params, kept):
                    param.copy_(value)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "num_updates": self.num_updates, "shadow": [s.clone() for s in self.shadow]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["shadow"]) != len(self.shadow):
            raise ValueError(f"EMA state holds {len(state['shadow'])} tensors; this model trains {len(self.shadow)}")
        self.decay, self.num_updates = state["decay"], state["num_updates"]
        with torch.no_grad():
            for shadow, value in zip(self.shadow, state["shadow"]):
                shadow.copy_(value)

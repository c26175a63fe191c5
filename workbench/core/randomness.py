"""Every random-number generator a run draws from, seeded together and saved in checkpoints.

Training draws from torch's CPU generator (dropout, random initialisations), from each CUDA device's generator,
and possibly from NumPy's and Python's global generators (a task's augmentation, a library's sampler). A
checkpoint keeps all of them (`capture` / `restore`, as plain tensors and numbers: no pickle), so a run killed
after any epoch and resumed continues with the draws the uninterrupted run would have made. Generators that the
trainer or a method seed from ``(seed, epoch, step)`` need no saving.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_all(seed: int) -> None:
    """Seed torch (CPU and every CUDA device), NumPy's global generator and Python's `random` with ``seed``."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def capture() -> dict[str, Any]:
    """The state of every global generator, as tensors, numbers and lists (loadable with ``weights_only=True``)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached": float(cached)},  # fmt: skip
        "random": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
    }


def restore(state: dict[str, Any]) -> None:
    """Put back what `capture` returned."""
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy = state["numpy"]
    np.random.set_state(
        (numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"], numpy["cached"])
    )
    python = state["random"]
    random.setstate((python["version"], tuple(int(v) for v in python["internal"].tolist()), python["gauss"]))

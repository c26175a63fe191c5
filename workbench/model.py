"""The shape every model family shares: a name, a description and a loader."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
from torch import nn


class ModelFamily:
    """A kind of backbone (``mace``, ...) that loads pretrained checkpoints."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: Card (in ``data_cards/``) of the shipped pretrained checkpoint and the data it was trained on.
    card: ClassVar[str | None] = None

    def load(
        self, source: str | Path | None = None, *, trust_checkpoint: bool = False, dtype: torch.dtype = torch.float64
    ) -> nn.Module:
        """The pretrained model at ``source`` (the shipped checkpoint when None)."""
        raise NotImplementedError

"""What the weighting and alignment methods ask of a task beyond the hooks every task has, as protocols.

A method lists the ones it needs in its ``needs_task`` (`workbench.core.method.Method.check` refuses a task that lacks
one before the run directory appears); a task offers one by defining its method. Shapes: ``batch`` is what the
task's ``collate`` returns; ``samples`` a sequence of the task's samples.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
from torch import nn


@runtime_checkable
class PerSampleLosses(Protocol):
    """A task that gives per-sample training losses."""

    def sample_losses(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Per-sample training losses, shape (batch,); their mean is the task's ``loss``."""


@runtime_checkable
class SampleIds(Protocol):
    """A task that numbers its samples (sample weights are looked up by id)."""

    def sample_ids(self, samples: Sequence[Any]) -> np.ndarray:
        """Ids (int64, unique within a run) of samples."""

    def batch_ids(self, batch: Any) -> torch.Tensor:
        """The ids of a batch's samples, as ``sample_ids`` gives them."""


@runtime_checkable
class InputVectors(Protocol):
    """A task whose samples have input vectors (density-ratio estimation in input space)."""

    def sample_inputs(self, samples: Sequence[Any]) -> np.ndarray:
        """Input vectors (n, d) of samples."""


@runtime_checkable
class ClassLabels(Protocol):
    """A task with one class label per sample."""

    def batch_labels(self, batch: Any) -> torch.Tensor:
        """Class labels of a labelled batch, shape (batch,), int64."""


@runtime_checkable
class Embeddings(Protocol):
    """A task that exposes a batch's features and class logits (alignment methods)."""

    def embed(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(features (batch, d), class logits (batch, n_classes)) of a batch, with gradients."""

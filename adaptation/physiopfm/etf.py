"""A fixed simplex equiangular tight frame (ETF) classifier head: PhysioPFM's anchor for imbalanced classes.

A simplex ETF of ``K`` classes in ``d ≥ K`` dimensions is ``K`` unit vectors with pairwise cosine ``−1/(K−1)``,
the most separated arrangement possible (Papyan et al., PNAS 2020, neural collapse); a classifier fixed to it
cannot drift towards the majority class (Yang et al., NeurIPS 2022). With ``U`` (d, K) orthonormal columns::

    M = sqrt(K / (K − 1)) · U (I_K − 1 1ᵀ / K)          # (d, K): column k is class k's anchor
    logits = τ · (z / ‖z‖) M                            # cosine to each anchor, times the temperature τ

PhysioPFM pulls features and class prototypes to such a frame with a temperature (*unverified*: its τ and how
``U`` is drawn are not published; ours: ``U`` from the QR of a seeded Gaussian matrix, τ = 10). Every bank entry
and the new site share one frame (same seed), so a generated LoRA is read against the anchors it was fitted for.
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.core.errors import UserError


def simplex_etf(n_classes: int, width: int, seed: int = 0) -> torch.Tensor:
    """The frame ``M`` (width, n_classes): unit columns, pairwise cosine −1 / (n_classes − 1)."""
    if n_classes < 2 or width < n_classes:
        raise UserError(f"a simplex ETF needs 2 ≤ classes ≤ width; got {n_classes} classes in width {width}")
    generator = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(width, n_classes, generator=generator, dtype=torch.float64))
    centring = torch.eye(n_classes, dtype=torch.float64) - 1.0 / n_classes
    return ((n_classes / (n_classes - 1)) ** 0.5 * u @ centring).float()


class EtfHead(nn.Module):
    """Fixed ETF classifier: features (batch, width) → logits (batch, n_classes) = τ · cos(z, anchor_k).

    Nothing in it trains (the frame is a buffer), so a model with this head adapts through its adapters only.
    """

    def __init__(self, width: int, n_classes: int, temperature: float = 10.0, seed: int = 0):
        super().__init__()
        self.temperature, self.seed = float(temperature), int(seed)
        self.register_buffer("frame", simplex_etf(n_classes, width, seed))

    @property
    def n_classes(self) -> int:
        return self.frame.shape[1]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        unit = features / features.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        return self.temperature * unit @ self.frame.to(features.dtype)

    def extra_repr(self) -> str:
        width, classes = self.frame.shape
        return f"width={width}, classes={classes}, temperature={self.temperature:g}, seed={self.seed}"

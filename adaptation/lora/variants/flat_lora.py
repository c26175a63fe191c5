"""Flat-LoRA's noise (``objective="flat-lora"``): the loss at the adapted weights perturbed per output unit.

Paper: Li et al., "Flat-LoRA: Low-Rank Adaptation over a Flat Loss Landscape", ICML 2025. One draw of
``ε ~ N(0, σ_t² ‖u‖² / n)`` per step for every output unit ``u`` of an adapted weight ``W' = W + ΔW`` (``n`` its
fan-in), detached; `workbench.adaptation.lora.flat` schedules ``σ_t`` and sets the noise on LoRA layers (rows of
``W'``), `workbench.adaptation.elora.perturbed` on ELoRA's blocks (their output units). It is how the adapter trains,
not what a layer computes: a `LoraConfig` field of plain LoRA adapters only.
"""

from __future__ import annotations

import math

import torch
from workbench.adaptation.lora.variants.base import LoraVariant

from workbench.core.errors import UserError

#: ``objective`` choices: the loss, or Flat-LoRA's expected loss over random perturbations of the adapted weights.
OBJECTIVES = ("plain", "flat-lora")


def unit_noise(units: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """``ε`` for output units ``units`` (detached; fan-in along axis 1, ``(out, fan_in)`` or ``(groups, fan_in,
    out)``): ``N(0, σ² ‖u‖² / fan_in)`` per unit, drawn in ``units``' order and shape."""
    std = sigma * units.norm(dim=1, keepdim=True) / math.sqrt(units.shape[1])
    return torch.randn(units.shape, generator=generator, dtype=units.dtype, device=units.device) * std


class FlatLoRA(LoraVariant):
    """Flat-LoRA's training fields (``objective``, ``flat_sigma``) and noise (`unit_noise`); nothing on a layer."""

    name = "flat-lora"

    @classmethod
    def applies(cls, config) -> bool:
        return False

    @classmethod
    def check_training(cls, config) -> None:
        if config.objective not in OBJECTIVES:
            raise UserError(f"LoRA objective must be one of {OBJECTIVES}, got {config.objective!r}")
        sigma = config.flat_sigma
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not sigma >= 0:
            raise UserError(f"LoRA flat_sigma must be a number >= 0, got {sigma!r}")
        if config.objective != "plain" and config.kind != "lora":
            raise UserError(
                f"LoRA objective={config.objective!r} is an option of plain LoRA adapters, not of {config.kind} "
                "adapters; leave objective at 'plain'"
            )

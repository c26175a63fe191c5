"""rsLoRA's scale ``alpha / sqrt(r)`` (``scaling="rslora"``).

Paper: Kalajdzievski, "A Rank Stabilization Scaling Factor for Fine-Tuning with LoRA", 2023 (PEFT's ``use_rslora``).
``r`` is each expert's rank ``r / k`` for GOAT's experts (as GOAT's code), and ELoRA's nominal rank on its blocks.
"""

from __future__ import annotations

import math

from workbench.adaptation.lora.variants.base import LoraVariant


class RsLoRA(LoraVariant):
    """``scale = alpha / sqrt(r)`` in place of ``alpha / r``."""

    name = "rslora"

    @classmethod
    def applies(cls, config) -> bool:
        return config.scaling == "rslora"

    def scale(self, config, fan_in: int | None, scale: float) -> float:
        return config.alpha / math.sqrt(config.rank // (config.experts or 1))

    def label(self, config) -> str:
        return ""

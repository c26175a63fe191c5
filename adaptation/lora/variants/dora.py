"""DoRA (``dora=True``): a trained magnitude per output unit times the direction of the adapted weight.

Paper: Liu et al., "DoRA: Weight-Decomposed Low-Rank Adaptation", ICML 2024 (PEFT's ``use_dora``). The magnitude
``m`` starts at the norms of the output units of ``W + ΔW`` (the identity at start) and rescales each unit of the
adapted weight, ``W' = m ⊙ (W + ΔW) / ||W + ΔW||``, the norm detached from the gradient (the paper's section 4.3).

* On a layer (PEFT's names and shapes): ``lora_magnitude_vector[name].weight``, ``(out,)`` for linear layers and
  ``(1, out, 1, ...)`` for convolutions; the norm is over each output row's inputs and kernel. The input way
  computes PEFT's ``(f − 1) ⊙ W dropout(x) + f ⊙ scale · B A dropout(x)`` on top of ``W x + b`` (``f = m / norm``);
  ``ΔW = f ⊙ (W + scale · B A) − W`` depends on the weight it is added to (`LoraLayer.merge` keeps it for unmerge).
* On ELoRA's blocks: ``magnitude[i]`` of shape ``(groups, 1, out)`` per block, each block read as output units
  ``(groups, fan_in, out)`` (an output channel of a path, of a radial layer, of one element's contraction).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from workbench.adaptation.lora.variants.base import LoraVariant


class Magnitude(nn.Module):
    """DoRA's trained magnitude ``weight``: one value per output unit, shaped ``shape`` (PEFT's module of that name)."""

    def __init__(self, shape: tuple[int, ...], like: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shape, dtype=like.dtype, device=like.device))


class DoRA(LoraVariant):
    """Magnitude and direction (module doc)."""

    name = "dora"

    @classmethod
    def applies(cls, config) -> bool:
        return config.dora is True

    # ---- a LoraLayer ------------------------------------------------------------------------------------------

    def add(self, layer, name, config) -> None:
        base = layer.base_layer
        out = base.weight.shape[0]
        shape = (out,) if isinstance(base, nn.Linear) else (1, out) + (1,) * (base.weight.dim() - 2)
        layer.lora_magnitude_vector[name] = Magnitude(shape, base.weight)

    def file_names(self, names):
        """PEFT's file name of the magnitude, ``lora_magnitude_vector`` (no ``.weight``)."""
        names["lora_magnitude_vector"] = names.pop("lora_magnitude_vector.weight")
        return names

    def after_factors(self, layer, name) -> None:
        """The magnitude: the row norms of ``W + scale · B A``."""
        with torch.no_grad():
            magnitude = layer.lora_magnitude_vector[name].weight
            magnitude.copy_(self._row_norm(layer, layer._lora_weight(name)).reshape(magnitude.shape))

    @staticmethod
    def _row_norm(layer, lora_weight: torch.Tensor) -> torch.Tensor:
        """``||W + ΔW||`` of each output unit (over inputs and kernel), detached: shape ``(out,)``."""
        return (layer.base_layer.weight + lora_weight.detach()).flatten(1).norm(dim=1).detach()

    def _factor(self, layer, name: str, lora_weight: torch.Tensor) -> torch.Tensor:
        """``f = m / ||W + scale · B A||`` per output unit, shape ``(out,)``."""
        return layer.lora_magnitude_vector[name].weight.flatten() / self._row_norm(layer, lora_weight)

    def update(self, layer, name, x, base):
        """PEFT's term ``(f − 1) ⊙ W dropout(x) + f ⊙ scale · B A dropout(x)``; ``W x`` is taken from ``base`` (minus
        the bias) while the dropout is inactive."""
        base_layer = layer.base_layer
        dropped = layer.lora_dropout[name](x)
        factor = self._factor(layer, name, layer._lora_weight(name))
        channel = (1, -1) + (1,) * (x.dim() - 2) if isinstance(base_layer, (nn.Conv1d, nn.Conv2d)) else (-1,)
        if base is None or layer._dropout_acts(name):
            if isinstance(base_layer, nn.Linear):
                base = F.linear(dropped, base_layer.weight)
            else:
                base = base_layer._conv_forward(dropped, base_layer.weight, None)
        elif base_layer.bias is not None:
            base = base - base_layer.bias.view(channel)
        factor = factor.view(channel)
        lora = layer._factor_forward(name, dropped)
        return (factor - 1) * base + factor * lora * layer.scales[name]

    def delta_weight(self, layer, name, delta):
        """``f ⊙ (W + scale · B A) − W`` (``f`` per output row, of the current base weight)."""
        weight = layer.base_layer.weight
        factor = self._factor(layer, name, delta).view((-1,) + (1,) * (weight.dim() - 1))
        return factor * (weight + delta) - weight

    # ---- ELoRA's blocks ---------------------------------------------------------------------------------------

    def add_to_blocks(self, host) -> None:
        pairs = host.pairs()
        like = pairs[0][1]
        host.magnitude = nn.ParameterList(
            nn.Parameter(torch.empty(units.shape[0], 1, units.shape[2], dtype=like.dtype, device=like.device))
            for units in (host.units(i, torch.empty(a.shape[0], b.shape[1])) for i, (a, b) in enumerate(pairs))
        )

    def adapt_blocks(self, host, adapted):
        """Each block's output units rescaled to their magnitude ``m · u / ||u||`` (norm detached)."""
        out = []
        for i, (block, m) in enumerate(zip(host.blocks(adapted), host.magnitude)):
            units = host.units(i, block)
            out.append(host.from_units(i, m * units / units.detach().norm(dim=1, keepdim=True)))
        return host.assemble(out)

    def after_block_factors(self, host, original) -> None:
        """The magnitudes: the norms of the output units of ``original + ΔW``."""
        with torch.no_grad():
            adapted = original + host.assemble(host.deltas())
            for i, (block, m) in enumerate(zip(host.blocks(adapted), host.magnitude)):
                m.copy_(host.units(i, block).norm(dim=1, keepdim=True))

"""What a LoRA variant is: one refinement of plain LoRA as an object the adapted weights dispatch to.

The idea is HF PEFT's ``LoraVariant`` (``peft/tuners/lora/variants.py``): each refinement owns its initialisation,
forward, merge and extra parameters, so that the layer stays a dispatcher. A variant here owns, in addition, the
checks of its options and its composition rules, and it acts on two hosts:

* a `workbench.adaptation.lora.layer.LoraLayer` (the ``layer`` hooks): one adapter ``name`` with factors
  ``lora_A[name]`` ``(r, in·K)`` and ``lora_B[name]`` ``(out, r)``, ``ΔW = scale · B A``, output units the rows of
  ``W``; extra parameters go into the layer's per-adapter containers under PEFT's names;
* an ELoRA adapter of one weight cut into blocks (`workbench.adaptation.elora.BlockLowRank`, the ``block`` hooks):
  each block ``M_i (rows, cols)`` with factors ``A_i (rows, r)``, ``B_i (r, cols)``, ``ΔM_i = scale · A_i B_i / d_i``,
  output units read as ``(groups, fan_in, out)``. A block hook acts on one block's factor pair or on its output
  units, never across blocks: any value of one block keeps an equivariant model equivariant.

Every hook's default is plain LoRA's (nothing to do), so a variant defines only what it changes. The registry
(`workbench.adaptation.lora.variants`) asks every registered class to `check` every configuration, and instantiates
those that `applies` to an adapter, in registration order.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn


class LoraVariant:
    """One refinement of LoRA (module doc). Class-level hooks see configurations; instance hooks see a host."""

    #: The name an `AdapterConfig` lists in ``variants`` to ask for this variant (built-in ones are asked for by
    #: their own option: ``init``, ``scaling``, ``dora``, ``reparam``, ``kind``).
    name: ClassVar[str]
    #: Whether its update depends on the input (routed experts): no fixed ``ΔW`` represents it.
    routed: ClassVar[bool] = False
    #: Whether it changes the factors the layer computes with (`factors`): the forward then uses them explicitly.
    transforms_factors: ClassVar[bool] = False

    # ---- configurations ---------------------------------------------------------------------------------------

    @classmethod
    def applies(cls, config: Any) -> bool:
        """Whether an adapter of ``config`` (an `AdapterConfig`) uses this variant."""
        return cls.name in config.variants

    @classmethod
    def check(cls, config: Any) -> None:
        """A `UserError` for what this variant refuses of ``config`` (its options and what they combine with);
        called for every adapter configuration, whether the variant applies or not."""

    @classmethod
    def check_training(cls, config: Any) -> None:
        """A `UserError` for what this variant refuses of a `LoraConfig`'s training fields (``objective``, ...)."""

    @classmethod
    def check_fits(cls, base: nn.Module, config: Any) -> None:
        """A `UserError` when an adapter of ``config`` using this variant cannot adapt the layer ``base``."""

    @classmethod
    def method_arguments(cls, options: dict[str, Any]) -> dict[str, Any]:
        """`LoraConfig` keywords a method's parsed options imply for this variant (default none)."""
        return {}

    @classmethod
    def aux_loss_weight(cls, options: dict[str, Any]) -> float | None:
        """The weight a method's step gives the auxiliary loss this variant keeps in the layers' ``balance_loss``
        (`LoraLayer.take_balance_loss`); None: it keeps none."""
        return None

    def scale(self, config: Any, fan_in: int | None, scale: float) -> float:
        """The update's scale given the one before this variant (``alpha / r`` to start); ``fan_in``: the layer's
        input size (None where unknown)."""
        return scale

    def label(self, config: Any) -> str:
        """How ``extra_repr`` names this variant on a layer (empty: not shown)."""
        return self.name

    # ---- a LoraLayer ------------------------------------------------------------------------------------------

    def factor_modules(self, base: nn.Module, config: Any, make) -> tuple[nn.Module, nn.Module] | None:
        """``(lora_A[name], lora_B[name])`` when this variant lays the factors out (``make(base, rank)`` gives one
        uninitialised pair); None: one pair of rank ``r``."""
        return None

    def add(self, layer: nn.Module, name: str, config: Any) -> None:
        """Register this variant's parameters and buffers of adapter ``name`` on ``layer`` (no random draw)."""

    def init_factors(self, layer: nn.Module, name: str) -> bool:
        """Set adapter ``name``'s factors (then True) instead of the Kaiming-uniform ``A``, ``B = 0``."""
        return False

    def init_parameters(self, layer: nn.Module, name: str) -> None:
        """Draw this variant's own parameters, after the factors (the random draws' order is the hooks')."""

    def after_factors(self, layer: nn.Module, name: str) -> None:
        """Called each time adapter ``name``'s factors were set (init, LoRA-One's gradient init)."""

    def factors(self, layer: nn.Module, name: str, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The ``(A, B)`` the layer computes with, given the ones before this variant."""
        return a, b

    def update(self, layer: nn.Module, name: str, x: torch.Tensor, base: torch.Tensor | None) -> torch.Tensor | None:
        """Adapter ``name``'s whole contribution to the output, or None: plain LoRA's ``scale · B A dropout(x)``."""
        return None

    def delta_weight(self, layer: nn.Module, name: str, delta: torch.Tensor) -> torch.Tensor:
        """``ΔW`` of adapter ``name`` given the one before this variant (``scale · B A`` to start)."""
        return delta

    def merge_error(self, layer: nn.Module, name: str) -> str | None:
        """Why adapter ``name`` cannot be merged (None: it can)."""
        return None

    def delete(self, layer: nn.Module, name: str) -> None:
        """Undo what adapter ``name`` did to the base layer before its parameters go."""

    def file_names(self, names: dict[str, nn.Parameter]) -> dict[str, nn.Parameter]:
        """One adapter's parameters by file name (``lora_A.weight``, ...) as this variant names them in files."""
        return names

    # ---- an ELoRA adapter of blocks ---------------------------------------------------------------------------

    def add_to_blocks(self, host: nn.Module) -> None:
        """Register this variant's parameters on ``host`` (its blocks' factors exist; draws allowed, in order)."""

    def block_factors(self, host: nn.Module, pairs: list) -> list:
        """Each block's ``(A_i, B_i)`` the host computes with, given the ones before this variant."""
        return pairs

    def adapt_blocks(self, host: nn.Module, adapted: torch.Tensor) -> torch.Tensor:
        """The adapted weight (``W + ΔW``, weight-shaped) after this variant."""
        return adapted

    def init_blocks(self, host: nn.Module, original: torch.Tensor) -> bool:
        """Set every block's factors from the stored base weight ``original`` (which it may change in place), then
        True; False: the host's own init stands."""
        return False

    def after_block_factors(self, host: nn.Module, original: torch.Tensor) -> None:
        """Called each time the host's factors were set, with the stored base weight."""


def promoted(matrix: torch.Tensor) -> torch.Tensor:
    """``matrix`` in float64 if it is float64, else float32 (the precision of the SVD-based inits)."""
    return matrix.to(torch.promote_types(matrix.dtype, torch.float32))

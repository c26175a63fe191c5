"""LoRA's refinements as variant objects, and their registry (HF PEFT's ``LoraVariant`` idea; `base` says what a
variant owns).

Built in, one module each: `routed` (H-LoRA's fused and MoELoRA's looped token-routed experts, ``kind``), `goat`
(GOAT's top-k experts, SVD init, derived scale and balance loss), `pissa` (PiSSA's init), `lora_one` (LoRA-One's
init), `replora` (RepLoRA's MLP of the factors), `dora` (DoRA's magnitude), `rslora` (rsLoRA's scale) and
`flat_lora` (Flat-LoRA's training noise). `workbench.adaptation.lora.layer.LoraLayer` and ELoRA's block adapters
(`workbench.adaptation.elora`) dispatch to the variants of each adapter, in registration order (which is the order
of their checks and of their random draws at initialisation).

A new variant is one module with a `LoraVariant` subclass and one `register` call; an adapter asks for it by name
(``lora.apply(model, ..., variants=("name",))``)::

    >>> @register                                               # doctest: +SKIP
    ... class Gate(LoraVariant):
    ...     name = "gate"
"""

from __future__ import annotations

from typing import Any

from torch import nn
from workbench.adaptation.lora.variants.base import LoraVariant
from workbench.adaptation.lora.variants.dora import DoRA
from workbench.adaptation.lora.variants.flat_lora import FlatLoRA
from workbench.adaptation.lora.variants.goat import GOAT
from workbench.adaptation.lora.variants.lora_one import LoraOne
from workbench.adaptation.lora.variants.pissa import PiSSA
from workbench.adaptation.lora.variants.replora import RepLoRA
from workbench.adaptation.lora.variants.routed import HLoRA, MoELoRA
from workbench.adaptation.lora.variants.rslora import RsLoRA

from workbench.core.errors import UserError

#: Every registered variant class by name, in registration order.
VARIANTS: dict[str, type[LoraVariant]] = {}


def register(cls: type[LoraVariant]) -> type[LoraVariant]:
    """Add variant class ``cls`` under ``cls.name`` (a name taken by another class is refused); returns it."""
    if not issubclass(cls, LoraVariant):
        raise UserError(f"a LoRA variant is a LoraVariant subclass, got {cls!r}")
    taken = VARIANTS.get(cls.name)
    if taken is not None and taken is not cls:
        raise UserError(f"LoRA variant name '{cls.name}' is taken by {taken.__name__}; choose another name")
    VARIANTS[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove variant ``name`` (what a test that registered one does after)."""
    VARIANTS.pop(name, None)


def check(config: Any) -> None:
    """Every variant's checks of an `AdapterConfig` (names in ``config.variants`` must be registered)."""
    unknown = [name for name in config.variants if name not in VARIANTS]
    if unknown:
        raise UserError(f"LoRA variants {unknown} are not registered; registered: {sorted(VARIANTS)}")
    for cls in VARIANTS.values():
        cls.check(config)


def check_training(config: Any) -> None:
    """Every variant's checks of a `LoraConfig`'s training fields."""
    for cls in VARIANTS.values():
        cls.check_training(config)


def check_fits(base: nn.Module, config: Any) -> None:
    """Every variant's checks of an adapter of ``config`` on layer ``base``."""
    for cls in VARIANTS.values():
        cls.check_fits(base, config)


def variants_for(config: Any) -> list[LoraVariant]:
    """A new instance of every variant ``config`` uses, in registration order."""
    return [cls() for cls in VARIANTS.values() if cls.applies(config)]


def scale_for(config: Any, fan_in: int | None) -> float:
    """The update's scale: ``alpha / r``, then each variant's change (`LoraVariant.scale`)."""
    scale = config.alpha / config.rank
    for variant in variants_for(config):
        scale = variant.scale(config, fan_in, scale)
    return scale


def method_arguments(options: dict[str, Any]) -> dict[str, Any]:
    """The `LoraConfig` keywords every variant reads off a method's options (`LoraVariant.method_arguments`)."""
    out: dict[str, Any] = {}
    for cls in VARIANTS.values():
        out.update(cls.method_arguments(options))
    return out


def aux_loss_weight(options: dict[str, Any]) -> float | None:
    """The weight of the variants' auxiliary losses in a method's step (None: no variant keeps one)."""
    weights = [w for w in (cls.aux_loss_weight(options) for cls in VARIANTS.values()) if w is not None]
    return sum(weights) if weights else None


for _builtin in (RepLoRA, GOAT, HLoRA, MoELoRA, PiSSA, LoraOne, DoRA, RsLoRA, FlatLoRA):
    register(_builtin)

__all__ = ["VARIANTS", "LoraVariant", "check", "check_fits", "check_training", "register", "scale_for", "variants_for"]

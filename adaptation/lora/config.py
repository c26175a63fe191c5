"""What `workbench.adaptation.lora.apply` is asked for (`LoraConfig`), and how each target's rank is chosen.

A `LoraConfig` is the JSON-able record of one `apply` call (one named adapter on a model's targets): `save_adapter`
writes it into the adapter file, and `load_adapter` rebuilds the same adapters on the same architecture from it (as
PEFT's ``LoraConfig`` does). An `AdapterConfig` is what one adapter of one layer is: its kind, rank, scale, experts,
dropout and way of computing (what PEFT's ``LoraLayer.update_layer`` receives).

Adapter kinds (`KINDS`), all starting as the identity (see `workbench.adaptation.lora.layer`):

* ``"lora"`` — plain LoRA, ``(alpha / r) · B A x``;
* ``"hlora"`` — H-LoRA: ``k`` token-routed experts fused in one ``A``/``B`` pair, ``scale = alpha / r · k``;
* ``"moelora"`` — MoELoRA: the same experts as ``k`` separate ``A_e``/``B_e`` pairs computed in a loop;
* ``"goat"`` — GOAT (Fan et al., "Make LoRA Great Again: Boosting LoRA with Adaptive Singular Values and
  Mixture-of-Experts Optimization Alignment", ICML 2025; code Facico/GOAT-PEFT): ``k`` expert pairs of ``r / k``
  ranks, each token sent to its ``top_k`` experts by a softmax router, their weights renormalised over the chosen
  ones; ``init="goat"`` sets the experts from segments of the base weight's SVD and ``scaling="goat"`` is the
  authors' derived scale (`workbench.adaptation.lora.layer`).

Rank of a target module (first rule that applies):

1. ``rank_pattern``: the rank of the first fnmatch pattern (in the mapping's order) that matches the module name;
2. ``conv_rank="rule"`` and the module is a convolution: `conv_rule_rank` (the brainwave-LoRA rule);
3. ``rank``.

The scale of every target is ``alpha / its rank`` (as PEFT does with its ``rank_pattern``), times the number of
experts for the routed kinds; with ``scaling="rslora"`` it is ``alpha / sqrt(its rank)``.

Options of plain LoRA adapters (each as HF PEFT's, which the tests check against; routed kinds take the defaults):

* ``scaling`` (`SCALINGS`): ``"standard"`` ``alpha / r`` (Hu et al.) or ``"rslora"`` ``alpha / sqrt(r)`` (Kalajdzievski,
  "A Rank Stabilization Scaling Factor for Fine-Tuning with LoRA", 2023; PEFT's ``use_rslora``);
* ``init`` (`INITS`): ``"kaiming"`` (PEFT's default ``init_lora_weights=True``: ``A`` Kaiming-uniform, ``B = 0``; PEFT's
  ``"gaussian"`` is another init, ``A ~ N(0, 1/r²)``) or ``"pissa"`` (Meng et al., "PiSSA: Principal Singular Values
  and Singular Vectors Adaptation of Large Language Models", NeurIPS 2024; PEFT's ``init_lora_weights="pissa"``: the
  factors hold the top-r singular triplets of the base weight, which keeps their residual, see
  `workbench.adaptation.lora.layer`), or ``"lora-one"`` (Zhang, Liu and Chen, "LoRA-One: One-Step Full Gradient
  Could Suffice for Fine-Tuning Large Language Models, Provably and Efficiently", ICML 2025; not in PEFT): the
  adapters start as ``"kaiming"`` until `workbench.adaptation.lora.init_lora_one` sets them from the top-r singular
  triplets of one full fine-tuning gradient (the ``lora`` method does so before training);
* ``dora`` (Liu et al., "DoRA: Weight-Decomposed Low-Rank Adaptation", ICML 2024; PEFT's ``use_dora``): a trained
  magnitude per output unit times the direction ``(W + scale · B A) / ||W + scale · B A||`` (norm per output row).

Options not in PEFT (plain LoRA only; RepLoRA's adapter files carry no ``adapter_config.json``, PEFT having no such
layer, while a Flat-LoRA adapter is a plain LoRA one that PEFT loads):

* ``reparam`` (`REPARAMS`): ``"none"`` or ``"replora"`` (Truong et al., "RepLoRA: Reparameterizing Low-Rank Adaptation
  via the Perspective of Mixture of Experts", ICML 2025): the factors the layer computes with come out of a light
  MLP shared by ``A`` and ``B`` (`workbench.adaptation.lora.layer`); not with ``init`` pissa / lora-one (they set the
  factors themselves, which the MLP would change) nor ``dora``;
* ``objective`` (`OBJECTIVES`, `LoraConfig` only: it is how the adapter trains, not what a layer computes):
  ``"plain"`` or ``"flat-lora"`` (Li et al., "Flat-LoRA: Low-Rank Adaptation over a Flat Loss Landscape", ICML 2025):
  the loss at the merged weights perturbed by seeded random noise of relative size ``flat_sigma``
  (`workbench.adaptation.lora.flat`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Mapping

from torch import nn
from workbench.adaptation.lora import variants
from workbench.adaptation.lora.variants.flat_lora import OBJECTIVES as OBJECTIVES
from workbench.adaptation.lora.variants.goat import GOAT_ETA as GOAT_ETA
from workbench.adaptation.lora.variants.goat import GOAT_RHO as GOAT_RHO

from workbench.core.errors import UserError

#: ``compute`` choices: ``"input"`` (PEFT's ``W x + B A x``) or ``"weight"`` (``(W + B A) x``).
COMPUTES = ("input", "weight")
#: Adapter kinds: plain LoRA, H-LoRA's fused routed experts, MoELoRA's looped experts, GOAT's top-k routed experts.
KINDS = ("lora", "hlora", "moelora", "goat")
#: ``init`` choices: PEFT's default (Kaiming-uniform ``A``, ``B = 0``), PiSSA (top-r singular triplets of ``W``) and
#: LoRA-One (top-r singular triplets of one full fine-tuning gradient: `workbench.adaptation.lora.init_lora_one`) and
#: GOAT (its experts from segments of the base weight's SVD; ``kind="goat"`` only).
INITS = ("kaiming", "pissa", "lora-one", "goat")
#: ``scaling`` choices: ``alpha / r``, rsLoRA's ``alpha / sqrt(r)`` and GOAT's ``sqrt(3 η n_in / r_e)`` (``kind="goat"``
#: only; the layer computes it, knowing ``n_in``).
SCALINGS = ("standard", "rslora", "goat")
#: ``reparam`` choices: the factors as they are, or RepLoRA's MLP of them.
REPARAMS = ("none", "replora")
#: ``conv_rank`` choices: ``"peft"`` (convolutions take ``rank`` like every target), ``"rule"`` (`conv_rule_rank`).
CONV_RANKS = ("peft", "rule")


def conv_rule_rank(in_channels: int, out_channels: int, kernel_numel: int) -> int:
    """The brainwave-LoRA conv rank: the largest power of 2 whose adapter is not larger than the weight.

    Paper: the ICML 2025 evaluation of large brainwave foundation models fine-tuned with LoRA (seed 001 of this
    project; METHODS.md, "Large brainwave foundation models with LoRA"): "conv rank: largest power of 2 whose
    adapter is not larger than the weight".

    The adapter is counted in the factorisation every convolution gets here (PEFT's): ``lora_A`` has the base
    kernel, ``(r, in, *kernel)``, and ``lora_B`` is 1×1, ``(out, r, 1, ...)``, so it holds ``r·(in·K + out)``
    values against the weight's ``out·in·K`` (``K = kernel_numel``)::

        r = max{2^j : 2^j·(in·K + out) ≤ out·in·K},  at least 1

    The rule needs no other factorisation: it only picks ``r``, and keeping PEFT's shapes keeps the adapter file
    loadable by PEFT (the chosen ranks go into its ``rank_pattern``). A weight smaller than any rank-1 adapter
    (e.g. a 1→1 channel, kernel-1 conv) gets rank 1, the smallest adapter there is.

    Args:
        in_channels, out_channels: the convolution's channels (groups = 1).
        kernel_numel: product of the kernel sizes (15 for a ``(1, 15)`` kernel).

    Example::

        >>> conv_rule_rank(1, 8, 15), conv_rule_rank(8, 8, 3), conv_rule_rank(12, 32, 7)
        (4, 4, 16)
    """
    weight = out_channels * in_channels * kernel_numel
    per_rank = in_channels * kernel_numel + out_channels
    rank = 1
    while 2 * rank * per_rank <= weight:
        rank *= 2
    return rank


@dataclass(frozen=True)
class AdapterConfig:
    """One adapter of one layer (HealthGPT's plug-ins are such adapters, chosen per batch by task kind).

    Args:
        rank: total rank ``r``; for the experts' kinds a multiple of ``experts`` (each expert holds ``r / k`` ranks).
        alpha: scale numerator.
        experts: number ``k`` of token-routed experts; None (default) for plain LoRA.
        kind: one of `KINDS`; None (default): ``"hlora"`` with experts, ``"lora"`` without.
        dropout: dropout probability on the adapter's input (default 0).
        compute: ``"input"`` (default, PEFT's) or ``"weight"`` (``ΔW`` folded into the weight on each forward; plain
            LoRA only).
        init: ``"kaiming"`` (default) or ``"pissa"`` (`INITS`; see the module doc); plain LoRA only.
        scaling: ``"standard"`` (default, ``alpha / r``) or ``"rslora"`` (``alpha / sqrt(r)``); plain LoRA only.
        dora: DoRA's magnitude and direction (default False); plain LoRA only.
        reparam: ``"none"`` (default) or ``"replora"`` (`REPARAMS`); plain LoRA only, not with PiSSA, LoRA-One or DoRA.
        top_k: experts each token is sent to (``kind="goat"``; default 2, the authors').
        variants: names of further registered variants (`workbench.adaptation.lora.variants.register`) to apply.

    Each refinement is a variant object (`workbench.adaptation.lora.variants`) that checks its own options here.
    """

    rank: int
    alpha: float
    experts: int | None = None
    kind: str | None = None
    dropout: float = 0.0
    compute: str = "input"
    init: str = "kaiming"
    scaling: str = "standard"
    dora: bool = False
    reparam: str = "none"
    top_k: int = 2
    variants: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """The fields' own checks, then every variant's (`workbench.adaptation.lora.variants.check`)."""
        if self.kind is None:
            object.__setattr__(self, "kind", "lora" if self.experts is None else "hlora")
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "dropout", float(self.dropout))
        if self.kind not in KINDS:
            raise UserError(f"LoRA adapter kind must be one of {KINDS}, got {self.kind!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise UserError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        if not self.alpha > 0:
            raise UserError(f"LoRA alpha must be positive, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"LoRA dropout must lie in [0, 1), got {self.dropout}")
        if self.compute not in COMPUTES:
            raise UserError(f"LoRA compute must be one of {COMPUTES}, got {self.compute!r}")
        if self.init not in INITS:
            raise UserError(f"LoRA init must be one of {INITS}, got {self.init!r}")
        if self.scaling not in SCALINGS:
            raise UserError(f"LoRA scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if not isinstance(self.dora, bool):
            raise UserError(f"LoRA dora must be true or false, got {self.dora!r}")
        if self.reparam not in REPARAMS:
            raise UserError(f"LoRA reparam must be one of {REPARAMS}, got {self.reparam!r}")
        names = (self.variants,) if isinstance(self.variants, str) else self.variants
        object.__setattr__(self, "variants", tuple(names))
        variants.check(self)
        if self.kind == "lora" and self.experts is not None:
            raise UserError(f"a plain LoRA adapter has no experts (got experts={self.experts}); use experts=None")

    @property
    def routed(self) -> bool:
        """Whether a router weighs experts token by token (then the update depends on the input: not mergeable)."""
        return any(variant.routed for variant in variants.variants_for(self))

    @property
    def scale(self) -> float:
        """``alpha / r`` (plain LoRA), ``alpha / sqrt(r)`` (``scaling="rslora"``) or ``alpha / r · k`` (the experts'
        kinds, as HealthGPT's code; GOAT's: ``alpha / r_e`` or ``alpha / sqrt(r_e)`` with ``r_e = r / k`` each
        expert's rank, as GOAT's code). GOAT's derived scale needs the layer's input size: `scale_for`."""
        return self.scale_for(None)

    def scale_for(self, fan_in: int | None) -> float:
        """The scale on a layer of ``fan_in`` inputs (None: unknown): ``alpha / r`` as each variant changes it (`scale`;
        GOAT's ``sqrt(3 η fan_in / r_e)`` with ``scaling="goat"``, ``η`` = `GOAT_ETA`)."""
        return variants.scale_for(self, fan_in)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; ``variants`` only when some are asked for (files stay readable by earlier versions)."""
        out = asdict(self)
        out["variants"] = list(self.variants)
        return out if self.variants else {k: v for k, v in out.items() if k != "variants"}

    @classmethod
    def from_dict(cls, content: Mapping[str, Any], source: str | Path) -> "AdapterConfig":
        """The config `to_dict` wrote (``layout``, the name plug-in files used before, is read as ``kind``)."""
        values = dict(content)
        if "layout" in values and "kind" not in values:
            values["kind"] = values.pop("layout")
        try:
            return cls(**values)
        except TypeError as error:
            raise UserError(f"{source}: the LoRA adapter configuration {values} is not one ({error})") from None


@dataclass(frozen=True)
class LoraConfig:
    """The arguments of one `apply` call (see `workbench.adaptation.lora.apply` for their meaning).

    Args:
        targets: group names of the model's ``adapter_target_groups`` and/or fnmatch patterns over module names;
            None (default) adapts every declared group.
        rank: LoRA rank ``r`` (default 8).
        alpha: scale numerator: updates are multiplied by ``alpha / r`` (default 8).
        dropout: dropout probability on the adapter's input (default 0).
        rank_pattern: ``{fnmatch pattern over module names: rank}``; the first matching pattern wins (default none).
        conv_rank: ``"peft"`` (default) or ``"rule"`` (`conv_rule_rank` for convolutions).
        train: fnmatch patterns over parameter names trained in full besides the adapters (default none).
        experts: number ``k`` of token-routed experts; None (default) for plain LoRA.
        kind: the adapters' kind (`KINDS`); None (default): ``"hlora"`` with experts, ``"lora"`` without.
        compute: ``"input"`` (default, PEFT's) or ``"weight"`` (``ΔW`` folded into the weight on each forward; the
            same function, other memory and time, see `workbench.adaptation.lora.layer`).
        init: ``"kaiming"`` (default, PEFT's) or ``"pissa"`` (`INITS`; see the module doc).
        scaling: ``"standard"`` (default, ``alpha / r``) or ``"rslora"`` (``alpha / sqrt(r)``).
        dora: DoRA (default False).
        reparam: ``"none"`` (default) or ``"replora"`` (RepLoRA's MLP of the factors).
        objective: ``"plain"`` (default) or ``"flat-lora"`` (Flat-LoRA's expected loss over perturbed merged weights;
            plain LoRA only).
        flat_sigma: Flat-LoRA's relative noise size ``σ`` (default 0.05, the authors' ``rho``), ≥ 0.
        top_k: GOAT's experts per token (``kind="goat"``; default 2).
        variants: further registered variants to apply (`AdapterConfig.variants`).
    """

    targets: tuple[str, ...] | None = None
    rank: int = 8
    alpha: float = 8.0
    dropout: float = 0.0
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    conv_rank: str = "peft"
    train: tuple[str, ...] = ()
    experts: int | None = None
    compute: str = "input"
    kind: str | None = None
    init: str = "kaiming"
    scaling: str = "standard"
    dora: bool = False
    reparam: str = "none"
    objective: str = "plain"
    flat_sigma: float = 0.05
    top_k: int = 2
    variants: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.targets, str):
            object.__setattr__(self, "targets", (self.targets,))
        elif self.targets is not None:
            object.__setattr__(self, "targets", tuple(self.targets))
        object.__setattr__(self, "train", (self.train,) if isinstance(self.train, str) else tuple(self.train))
        object.__setattr__(self, "rank_pattern", dict(self.rank_pattern or {}))
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "dropout", float(self.dropout))
        for name, rank in [("rank", self.rank), *((f"rank_pattern['{k}']", v) for k, v in self.rank_pattern.items())]:
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
                raise UserError(f"LoRA {name} must be a positive integer, got {rank!r}")
        if self.conv_rank not in CONV_RANKS:
            raise UserError(f"LoRA conv_rank must be one of {CONV_RANKS}, got {self.conv_rank!r}")
        names = (self.variants,) if isinstance(self.variants, str) else self.variants
        object.__setattr__(self, "variants", tuple(names))
        object.__setattr__(self, "kind", self.adapter(self.rank).kind)  # checks the adapter's fields
        variants.check_training(self)
        object.__setattr__(self, "flat_sigma", float(self.flat_sigma))

    def adapter(self, rank: int) -> AdapterConfig:
        """The `AdapterConfig` of a target of rank ``rank`` (`rank_of`)."""
        return AdapterConfig(
            rank,
            self.alpha,
            self.experts,
            self.kind,
            self.dropout,
            self.compute,
            self.init,
            self.scaling,
            self.dora,
            self.reparam,
            self.top_k,
            self.variants,
        )

    def rank_of(self, name: str, module: nn.Module) -> int:
        """The rank of target ``name`` (``rank_pattern``, then the conv rule, then ``rank``; see the module doc)."""
        for pattern, rank in self.rank_pattern.items():
            if fnmatchcase(name, pattern):
                return rank
        if self.conv_rank == "rule" and isinstance(module, (nn.Conv1d, nn.Conv2d)):
            kernel = module.weight.shape[2:].numel()
            return conv_rule_rank(module.in_channels, module.out_channels, kernel)
        return self.rank

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (tuples become lists)."""
        out = asdict(self)
        out["targets"] = None if self.targets is None else list(self.targets)
        out["train"] = list(self.train)
        out["variants"] = list(self.variants)
        return out if self.variants else {k: v for k, v in out.items() if k != "variants"}

    @classmethod
    def from_dict(cls, content: Mapping[str, Any], source: str | Path) -> "LoraConfig":
        """The config `to_dict` wrote; an unknown or malformed field is a `UserError` naming ``source``."""
        if not isinstance(content, Mapping):
            raise UserError(f"{source}: the LoRA configuration must be a JSON object, found {type(content).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(content) - known)
        if unknown:
            raise UserError(f"{source}: unknown LoRA configuration field(s) {unknown}; known: {sorted(known)}")
        try:
            return cls(**content)
        except (TypeError, ValueError, UserError) as error:
            raise UserError(f"{source}: bad LoRA configuration ({error})") from None

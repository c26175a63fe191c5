"""ELoRA: equivariant low-rank adaptation of SO(3)-equivariant interatomic potentials.

Paper: "ELoRA: Low-Rank Adaptation for Equivariant GNNs", ICML 2025 (seed 002 of this project).

Why it keeps equivariance: an e3nn weight only ever mixes *channels* within one path — the path's
block acts as ``W_p ⊗ I_(2l+1)`` (``o3.Linear``) or ``W_p ⊗ CG`` (tensor products). A change made in
weight space, block by block, is therefore still equivariant, whatever its values. A low-rank update
applied in *feature* space across the irreps axis mixes components of different ``l`` and breaks it.

What gets an adapter (all through ``torch.nn.utils.parametrize`` on the stock modules' weights, no
fork of e3nn or MACE):

* every ``e3nn.o3.Linear`` and every ``e3nn.o3.TensorProduct`` with internal weights (MACE's skip
  tensor product, ``uvw`` mode): for each weighted instruction ``p`` with block shape
  ``(..., w)``, ``W_p += (alpha / r) · A_p @ B_p`` with ``A_p ((prod ...) × r)`` and ``B_p (r × w)``.
  The flat ``weight`` is the per-path blocks concatenated in instruction order, row-major; biases
  are left alone;
* radial-MLP layers (``e3nn.nn.FullyConnectedNet``, invariant scalars) and ``torch.nn.Linear``:
  a dense ``W += (alpha / r) · A @ B``;
* MACE's symmetric contraction: the highest-order weights ``(n_elements, n_params, channels)`` get
  ``W_e += (alpha / r) · (A_e / n_params) @ B`` — ``A`` per element, ``B`` shared — and, as the
  authors do, the lower-order contraction weights train in full (``train_lower_order``);
* the same MACE on cuEquivariance (`workbench.models.mace.to_cueq`): its ``Linear`` and fully connected tensor
  products keep e3nn's per-path flat weight layout, so they get the same per-path update; its symmetric
  contraction stacks all of e3nn's contraction weights in one tensor, and `ContractionLowRank` gives each stacked
  block the update its e3nn weight gets. ELoRA on the converted model is the same function as ELoRA on the e3nn
  model with the same adapter values (tested to 1e-10 in float64).

A block whose smaller side is below ``r`` gets that smaller rank instead (``A @ B`` can already
reach every matrix of the block then, so nothing is lost but parameters); the scale stays ``alpha / r``.

Initialisation as the authors': ``A ~ N(0, 1)``, ``B = 0``, so the adapted model starts identical to
the base model.

The LoRA refinements that act in weight space, block by block, keep equivariance and are options of `apply` and of
the method: PiSSA and LoRA-One initialisation (``init``), rsLoRA's scale (``scaling``), RepLoRA's MLP of each block's
factors (``reparam``), DoRA's magnitude per output unit of each block (``dora``) and Flat-LoRA's per-unit noise on the
adapted weights (`perturbed`, ``objective="flat-lora"``). They are the LoRA layer's own variant objects
(`workbench.adaptation.lora.variants`), applied by `BlockLowRank` to each block: a variant acts on one block's factor
pair or on its output units and never mixes blocks, and any value of a block keeps the model equivariant. "Output
units" and "fan-in" read each block as ``(groups, fan_in, out)``: an e3nn path ``(mul_in [· mul_in2], mul_out)`` and a
radial layer ``(h_in, h_out)`` are one group; MACE's contraction ``(n_elements, n_params, channels)`` has one group per
element (each atom uses its element's weight alone); ``torch.nn.Linear``'s ``(out, in)`` weight is read transposed.
ELoRA's ``A_i (rows, r)`` plays LoRA's ``B`` and ``B_i (r, cols)`` LoRA's ``A``. GOAT's token-routed experts would gate
on non-scalar features and mix irreps components: refused (`GOAT_REFUSAL`). On cuEquivariance's symmetric
contraction only ``scaling`` is built.

`merge` folds the updates into the weights and returns a plain model; it removes ELoRA's own parametrizations only,
and a model's other parametrizations stay as they are.

What ELoRA shares with `workbench.adaptation.lora`: the adapter file (one safetensors file whose metadata holds
the method and its configuration, loaded with a matched / missing / unexpected report, `lora.io`). What it does
not: the feature-space `LoraLayer` (a low-rank path across the irreps axis breaks equivariance, see above) and
LoRA's factor layout — here ``ΔW_p = A_p @ B_p`` with ``A ~ N(0, 1)`` per path, in e3nn's flat weight order; the
common part is one matrix product.

Example::

    >>> model = elora.apply(model, rank=16, alpha=16)      # doctest: +SKIP
    >>> ...train...
    >>> elora.save_adapter(model, "adapter.safetensors")   # doctest: +SKIP
    >>> plain = elora.merge(model)                          # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator

import torch
from e3nn import o3
from e3nn.nn._fc import _Layer as RadialLayer
from torch import nn
from torch.nn.utils import parametrize
from workbench.adaptation.lora.config import AdapterConfig
from workbench.adaptation.lora.flat import flat_stage
from workbench.adaptation.lora.io import load_into, read_adapter, write_adapter
from workbench.adaptation.lora.method import GRADIENT_CHUNK, REFINEMENT_OPTIONS, LoRA
from workbench.adaptation.lora.model import mean_gradients
from workbench.adaptation.lora.variants import variants_for
from workbench.adaptation.lora.variants.flat_lora import FlatLoRA, unit_noise
from workbench.adaptation.lora.variants.lora_one import LoraOne

from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.options import Option
from workbench.core.recipe import Recipe
from workbench.core.registry import methods

try:  # MACE is optional: without it ELoRA still adapts any e3nn model
    from mace.modules.symmetric_contraction import Contraction as MaceContraction
except ImportError:  # pragma: no cover - mace-torch is installed with the atomistic extra
    MaceContraction = None

try:  # cuEquivariance is optional (the cueq extra): MACE converted by `workbench.models.mace.to_cueq`
    import cuequivariance as cue
    import cuequivariance_torch as cuet
except ImportError:
    cue = cuet = None


#: ``init`` choices on ELoRA: ELoRA's own (``"kaiming"``, the name LoRA's options use for their default: here the
#: authors' ``A ~ N(0, 1)``, ``B = 0``), PiSSA and LoRA-One.
ELORA_INITS = ("kaiming", "pissa", "lora-one")

GOAT_REFUSAL = (
    "GOAT on ELoRA is refused: GOAT is a mixture of LoRA experts routed token by token by gates computed from the "
    "input features, so its update depends on the input; on an equivariant model those features carry non-scalar "
    "irreps (l >= 1), so the gates change under rotation and the routed update mixes irreps components, which breaks "
    "equivariance (ELoRA's updates are fixed per-path weight values). Use the lora method on a non-equivariant model, "
    "or ELoRA with --init kaiming, pissa or lora-one"
)


class BlockLowRank(nn.Module):
    """ELoRA's adapter of one weight, block by block: ``M_i + scale · (A_i B_i) / d_i``, refined by the LoRA variants
    of its `AdapterConfig` (module doc).

    A subclass holds the factors and says how its weight splits into blocks: `pairs` (the free factors of each block
    as ``(rows, r)``, ``(r, cols)`` views), `divisors` ``d_i`` (``n_params`` for the contraction, else 1), `blocks`
    (a weight-shaped tensor → each block as a ``(rows, cols)`` matrix view), `assemble` (the inverse) and `units`
    (a block matrix → ``(groups, fan_in, out)``) with `from_units`; then it calls `_add_variants`.

    Attributes:
        perturbation: Flat-LoRA's noise in the weight's shape while `perturbed` holds it (added to the adapted
            weight), else None.
    """

    divisors: list[float]

    def _add_variants(self, config: AdapterConfig) -> None:
        """Scale and the variants' parameters (drawn in the variants' order, after the factors)."""
        self.scale = config.scale
        self.perturbation: torch.Tensor | None = None
        self.variants = variants_for(config)
        for variant in self.variants:
            variant.add_to_blocks(self)

    def pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        raise NotImplementedError

    def blocks(self, weight: torch.Tensor) -> list[torch.Tensor]:
        raise NotImplementedError

    def assemble(self, blocks: list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def units(self, index: int, block: torch.Tensor) -> torch.Tensor:
        """Block ``index`` ``(rows, cols)`` as ``(groups, fan_in, out)`` (default: one group, columns are outputs)."""
        return block[None]

    def from_units(self, index: int, units: torch.Tensor) -> torch.Tensor:
        return units[0]

    def factors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The ``(A_i, B_i)`` each block computes with: the free factors as the variants make them."""
        pairs = self.pairs()
        for variant in self.variants:
            pairs = variant.block_factors(self, pairs)
        return pairs

    def deltas(self) -> list[torch.Tensor]:
        """``scale · A_i B_i / d_i`` of each block, ``(rows, cols)``."""
        return [self.scale * (a @ b) / d for (a, b), d in zip(self.factors(), self.divisors)]

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        adapted = weight + self.assemble(self.deltas())
        for variant in self.variants:
            adapted = variant.adapt_blocks(self, adapted)
        return adapted if self.perturbation is None else adapted + self.perturbation

    def set_factors(self, index: int, left: torch.Tensor, right: torch.Tensor) -> None:
        """Block ``index``'s free factors from the ``left @ right`` its delta is to be (times ``d_i`` in ``A``)."""
        a, b = self.pairs()[index]
        with torch.no_grad():
            a.copy_(left * self.divisors[index])
            b.copy_(right)

    def init_weights(self, original: torch.Tensor) -> None:
        """A variant's init of every block from the stored base weight ``original`` (PiSSA's, which leaves the
        residual in ``original``), then `after_factors`; ELoRA's own init stands otherwise."""
        if [variant for variant in self.variants if variant.init_blocks(self, original)]:
            self.after_factors(original)

    def after_factors(self, original: torch.Tensor) -> None:
        """The variants' parameters that follow the factors (DoRA's magnitudes), at the stored base ``original``."""
        for variant in self.variants:
            variant.after_block_factors(self, original)

    def noise(self, adapted: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
        """Flat-LoRA's ``ε`` for the adapted weight ``adapted`` (detached), drawn block by block in the weight's order
        over each block's output units (`workbench.adaptation.lora.variants.flat_lora.unit_noise`)."""
        out = []
        for i, block in enumerate(self.blocks(adapted.detach())):
            out.append(self.from_units(i, unit_noise(self.units(i, block), sigma, generator)))
        return self.assemble(out)


class PathLowRank(BlockLowRank):
    """Per-path low-rank update of a flat e3nn weight (``o3.Linear``, ``o3.TensorProduct``).

    Args:
        path_shapes: block shape of each weighted path, in the weight's order (``(mul_in, mul_out)``
            for ``o3.Linear``, ``(u, v, w)`` for a ``uvw`` tensor product).
        config: rank ``r``, scale and refinements (`AdapterConfig`; its variants act on each path's block).

    Shapes:
        weight ``(sum_p prod(path_shape_p),)`` -> same; block ``p`` is ``(prod(path_shape_p[:-1]), path_shape_p[-1])``.
    """

    def __init__(self, path_shapes: list[tuple[int, ...]], config: AdapterConfig, dtype: torch.dtype,
                 device: torch.device):  # fmt: skip
        super().__init__()
        self.shapes = [(math.prod(shape[:-1]), shape[-1]) for shape in path_shapes]
        ranks = [min(config.rank, rows, cols) for rows, cols in self.shapes]
        self.A = nn.ParameterList(
            [nn.Parameter(torch.randn(rows, r, dtype=dtype, device=device)) for (rows, _), r in zip(self.shapes, ranks)]
        )
        self.B = nn.ParameterList(
            [nn.Parameter(torch.zeros(r, cols, dtype=dtype, device=device)) for (_, cols), r in zip(self.shapes, ranks)]
        )
        self.divisors = [1.0] * len(self.shapes)
        self._add_variants(config)

    def pairs(self):
        return list(zip(self.A, self.B))

    def blocks(self, weight):
        sizes = [rows * cols for rows, cols in self.shapes]
        return [part.reshape(shape) for part, shape in zip(weight.split(sizes), self.shapes)]

    def assemble(self, blocks):
        return torch.cat([block.reshape(-1) for block in blocks])


class DenseLowRank(BlockLowRank):
    """Dense low-rank update ``W += scale · A @ B`` of a 2-D weight (one block).

    ``outputs_first``: the weight is ``(out, in)`` (``torch.nn.Linear``) rather than e3nn's ``(in, out)``.

    Shapes:
        weight ``(rows, cols)`` -> same; ``A (rows, r)``, ``B (r, cols)``.
    """

    def __init__(self, shape: tuple[int, int], config: AdapterConfig, dtype: torch.dtype, device: torch.device,
                 outputs_first: bool = False):  # fmt: skip
        super().__init__()
        rank_used = min(config.rank, *shape)
        self.outputs_first = outputs_first
        self.A = nn.Parameter(torch.randn(shape[0], rank_used, dtype=dtype, device=device))
        self.B = nn.Parameter(torch.zeros(rank_used, shape[1], dtype=dtype, device=device))
        self.divisors = [1.0]
        self._add_variants(config)

    def pairs(self):
        return [(self.A, self.B)]

    def blocks(self, weight):
        return [weight]

    def assemble(self, blocks):
        return blocks[0]

    def units(self, index, block):
        return (block.T if self.outputs_first else block)[None]

    def from_units(self, index, units):
        return units[0].T if self.outputs_first else units[0]


class ElementLowRank(BlockLowRank):
    """Update of MACE's highest-order contraction weights: ``W_e += scale · (A_e / n_params) @ B``.

    One block: the weights stacked over elements, ``(n_elements · n_params, channels)`` (``B`` is shared), whose
    output units are read per element (``(n_elements, n_params, channels)``).

    Shapes:
        weight ``(n_elements, n_params, channels)`` -> same; ``A (n_elements, n_params, r)`` per
        element, ``B (r, channels)`` shared by all elements.
    """

    def __init__(self, shape: tuple[int, int, int], config: AdapterConfig, dtype: torch.dtype, device: torch.device,
                 contraction_a: str = "divided"):  # fmt: skip
        super().__init__()
        self.shape = shape
        n_elements, self.n_params, channels = shape
        rank_used = min(config.rank, n_elements * self.n_params, channels)
        stored = contraction_a == "stored"  # the authors': A = randn / n_params as the parameter, no division after
        a = torch.randn(n_elements, self.n_params, rank_used, dtype=dtype, device=device)
        self.A = nn.Parameter(a / self.n_params if stored else a)
        self.B = nn.Parameter(torch.zeros(rank_used, channels, dtype=dtype, device=device))
        self.divisors = [1.0 if stored else float(self.n_params)]
        self._add_variants(config)

    def pairs(self):
        return [(self.A.view(-1, self.A.shape[-1]), self.B)]

    def blocks(self, weight):
        return [weight.reshape(-1, weight.shape[-1])]

    def assemble(self, blocks):
        return blocks[0].reshape(self.shape)

    def units(self, index, block):
        return block.reshape(self.shape)

    def from_units(self, index, units):
        return units.reshape(-1, units.shape[-1])


class ContractionLowRank(nn.Module):
    """ELoRA on a cuEquivariance symmetric contraction, whose one weight holds all of e3nn's contraction weights.

    ``blocks`` (from `workbench.models.mace.to_cueq`): ``(is_highest_order, n_params)`` of each e3nn weight in the
    order they are stacked along the weight's second axis. A highest-order block gets `ElementLowRank`'s update
    ``(alpha/r) · (A_e / n_params) @ B``; a lower-order block, when ``train_lower_order``, a full update ``D``
    (zeros at start), which trains exactly as the e3nn weight itself does. With mace-torch's reduced
    Clebsch-Gordan basis the stacked update is projected as the converter projects the weights: ``Δ @ P``.

    Shapes:
        weight ``(n_elements, n_reduced, channels)`` -> same; ``P (sum n_params, n_reduced)``.
    """

    def __init__(
        self,
        blocks: list[tuple[bool, int]],
        shape: tuple[int, int, int],
        projection: torch.Tensor | None,
        config: AdapterConfig,
        train_lower_order: bool,
        dtype: torch.dtype,
        device: torch.device,
        contraction_a: str = "divided",
    ):
        super().__init__()
        n_elements, _, channels = shape
        self.blocks = blocks
        self.scale, rank = config.scale, config.rank
        self.stored = contraction_a == "stored"
        self.A, self.B, self.D = nn.ParameterList(), nn.ParameterList(), nn.ParameterList()
        for highest, n_params in blocks:
            if highest:
                r = min(rank, n_elements * n_params, channels)
                a = torch.randn(n_elements, n_params, r, dtype=dtype, device=device)
                self.A.append(nn.Parameter(a / n_params if self.stored else a))
                self.B.append(nn.Parameter(torch.zeros(r, channels, dtype=dtype, device=device)))
            else:
                delta = nn.Parameter(torch.zeros(n_elements, n_params, channels, dtype=dtype, device=device))
                self.D.append(delta.requires_grad_(train_lower_order))
        self.register_buffer(
            "projection", None if projection is None else projection.to(dtype=dtype, device=device), persistent=False
        )

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        highest, lower, parts = iter(zip(self.A, self.B)), iter(self.D), []
        for is_highest, n_params in self.blocks:
            if is_highest:
                a, b = next(highest)
                parts.append(self.scale * (a if self.stored else a / n_params) @ b)
            else:
                parts.append(next(lower))
        delta = torch.cat(parts, dim=1)
        if self.projection is not None:
            delta = torch.einsum("zau,ab->zbu", delta, self.projection)
        return weight + delta


#: `apply`'s options beside rank, alpha and ``train_lower_order`` (in the adapter file's metadata).
REFINEMENT_KEYS = ("init", "scaling", "reparam", "dora", "objective", "flat_sigma", "contraction_a")
#: How the highest-order contraction's ``A`` holds its ``1 / n_params``: ``divided`` (A ~ N(0, 1), divided in the
#: update) or ``stored`` (A ~ N(0, 1) / n_params as the parameter, as the authors' code stores it: the same first
#: update, but Adam, whose steps do not scale with the parameter, then moves ``A / n_params`` n_params times faster).
CONTRACTION_A = ("divided", "stored")
#: The LoRA package's options the `ELoRA` method shares, by name.
_LORA_OPTIONS = {option.name: option for option in (*LoRA.options, *REFINEMENT_OPTIONS)}
#: Why ELoRA does not take GOAT's init and scale (`GOAT_REFUSAL` at length).
GOAT_ON_ELORA = (
    "GOAT's experts are routed by the input features, which on an equivariant model carry l >= 1 irreps: the routed "
    "update breaks equivariance (GOAT is method lora's, on non-equivariant models)"
)

#: The parametrizations ELoRA registers (what `merge` removes; `apply` refuses a model already carrying one).
ADAPTERS = (PathLowRank, DenseLowRank, ElementLowRank, ContractionLowRank)


def _adapted(model: nn.Module) -> list[tuple[nn.Module, str, bool]]:
    """(module, attribute, whether ELoRA's adapter is the attribute's only parametrization) of every weight that
    carries an ELoRA adapter."""
    found = []
    for module in model.modules():
        if parametrize.is_parametrized(module):
            for attribute, stack in module.parametrizations.items():
                if any(isinstance(p, ADAPTERS) for p in stack):
                    found.append((module, attribute, all(isinstance(p, ADAPTERS) for p in stack)))
    return found


def _weighted_path_shapes(module: nn.Module) -> list[tuple[int, ...]]:
    """Block shape of each weighted path, in the flat weight's order (e3nn's instructions, or the segments of
    cuEquivariance's descriptor, which follow e3nn's order: the converter copies the flat weights as they are)."""
    if isinstance(module, o3.Linear):
        return [tuple(ins.path_shape) for ins in module.instructions]
    if isinstance(module, o3.TensorProduct):
        return [tuple(ins.path_shape) for ins in module.instructions if ins.has_weight]
    if isinstance(module, cuet.Linear):
        descriptor = cue.descriptors.linear(module.irreps_in, module.irreps_out)
    else:
        descriptor = cue.descriptors.fully_connected_tensor_product(
            module.irreps_in1, module.irreps_in2, module.irreps_out
        )
    return [tuple(segment) for segment in descriptor.polynomial.inputs[0].segments]


def _cueq_weighted(module: nn.Module) -> bool:
    """A cuEquivariance Linear or fully connected tensor product with one internal weight row."""
    if cuet is None or not isinstance(module, (cuet.Linear, cuet.FullyConnectedTensorProduct)):
        return False
    weight = getattr(module, "weight", None)
    return isinstance(weight, nn.Parameter) and weight.ndim == 2 and weight.shape[0] == 1 and weight.numel() > 0


def _targets(model: nn.Module) -> Iterator[tuple[nn.Module, str, str]]:
    """(module, weight attribute, kind) for every weight ELoRA adapts, in module order."""
    for module in model.modules():
        if isinstance(module, o3.Linear) and module.internal_weights and module.weight_numel > 0:
            yield module, "weight", "path"
        elif isinstance(module, o3.TensorProduct) and module.internal_weights and module.weight_numel > 0:
            yield module, "weight", "path"
        elif _cueq_weighted(module):
            yield module, "weight", "path"
        elif cuet is not None and isinstance(module, cuet.SymmetricContraction) and hasattr(module, "elora_blocks"):
            yield module, "weight", "contraction"
        elif isinstance(module, (RadialLayer, nn.Linear)):
            yield module, "weight", "dense"
        elif MaceContraction is not None and isinstance(module, MaceContraction):
            weight = getattr(module, "weights_max", None)
            if isinstance(weight, nn.Parameter) and weight.numel() > 0:
                yield module, "weights_max", "element"


def adapter_config(
    rank: int, alpha: float, init: str, scaling: str, reparam: str, dora: bool, objective: str, flat_sigma: float
) -> AdapterConfig:
    """The `AdapterConfig` whose variants every block takes; a `UserError` for `apply` arguments that no model can
    take (before any model is seen): GOAT (`GOAT_REFUSAL`), an init not in `ELORA_INITS`, and what the variants
    refuse (their own checks, as for LoRA layers)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise UserError(f"ELoRA rank must be a positive integer, got {rank}")
    if "goat" in (init, scaling):
        raise UserError(GOAT_REFUSAL)
    if init not in ELORA_INITS:
        raise UserError(f"ELoRA init must be one of {ELORA_INITS}, got {init!r}")
    try:
        config = AdapterConfig(rank, alpha, init=init, scaling=scaling, dora=dora, reparam=reparam)
        FlatLoRA.check_training(SimpleNamespace(objective=objective, flat_sigma=flat_sigma, kind=config.kind))
    except UserError as error:
        raise UserError(f"ELoRA: {error}") from None
    return config


def apply(
    model: nn.Module,
    rank: int = 16,
    alpha: float = 16.0,
    train_lower_order: bool = True,
    init: str = "kaiming",
    scaling: str = "standard",
    reparam: str = "none",
    dora: bool = False,
    objective: str = "plain",
    flat_sigma: float = 0.05,
    contraction_a: str = "divided",
) -> nn.Module:
    """Attach ELoRA adapters to ``model`` in place, freeze everything else and return it.

    Args:
        model: an e3nn-based model (MACE or any model built of ``o3.Linear``/``o3.TensorProduct``).
        rank: LoRA rank ``r`` of every update (default 16, the authors').
        alpha: scale; updates are multiplied by ``alpha / rank`` (default 16).
        train_lower_order: also train MACE's lower-order symmetric-contraction weights in full.
        init: ``"kaiming"`` (default; the name LoRA's options give their default init, on ELoRA the authors'
            ``A ~ N(0, 1)``, ``B = 0``), ``"pissa"`` (each block's top-r singular triplets, the base block keeping
            the residual) or ``"lora-one"`` (ELoRA's own init until `init_lora_one` sets the factors).
        scaling: ``"standard"`` (``alpha / r``) or ``"rslora"`` (``alpha / sqrt(r)``).
        reparam: ``"none"`` or ``"replora"`` (each block's factors through its RepLoRA MLP).
        dora: DoRA's magnitude per output unit of each block (default False).
        objective: ``"plain"`` or ``"flat-lora"`` (how the `ELoRA` method trains; recorded in the adapter file).
        flat_sigma: Flat-LoRA's relative noise size ``σ`` (default 0.05).
        contraction_a: `CONTRACTION_A` (default ``divided``; ``stored``: the authors').

    The refinements are the LoRA variants, per block (module doc); GOAT (token-routed experts) is refused.
    cuEquivariance's symmetric contraction takes ``scaling`` only.
    """
    config = adapter_config(rank, alpha, init, scaling, reparam, dora, objective, flat_sigma)
    if _adapted(model):
        raise UserError("this model already carries ELoRA adapters; merge them first (elora.merge)")
    targets = list(_targets(model))
    if not targets:
        raise UserError(
            f"{type(model).__name__} has no e3nn Linear, tensor-product, radial-MLP or "
            "symmetric-contraction weights: ELoRA does not fit this model"
        )
    refined = {"init": init != "kaiming", "reparam": reparam != "none", "dora": dora, "objective": objective != "plain"}
    if any(kind == "contraction" for *_, kind in targets) and any(refined.values()):
        asked = [name for name, on in refined.items() if on]
        raise UserError(
            f"ELoRA's {', '.join(asked)} refinement(s) are not built for cuEquivariance's symmetric contraction (one "
            "weight stacking every order); use --backend e3nn, or leave them at their defaults"
        )
    model.requires_grad_(False)
    for module, attribute, kind in targets:
        _attach(module, attribute, kind, config, train_lower_order, contraction_a)
    model._elora_config = {
        "rank": rank,
        "alpha": alpha,
        "train_lower_order": train_lower_order,
        "init": init,
        "scaling": scaling,
        "reparam": reparam,
        "dora": dora,
        "objective": objective,
        "flat_sigma": float(flat_sigma),
        "contraction_a": contraction_a,
    }
    return model


def _attach(module: nn.Module, attribute: str, kind: str, config: AdapterConfig, train_lower_order: bool,
            contraction_a: str = "divided") -> None:  # fmt: skip
    """Register the ELoRA adapter of ``kind`` (`_targets`) on ``module``'s weight ``attribute``: built, its variants'
    magnitudes set, parametrized (the stored base frozen), then a variant's init of the blocks (PiSSA's)."""
    weight = getattr(module, attribute)
    kwargs = dict(config=config, dtype=weight.dtype, device=weight.device)
    if kind == "path":
        adapter = PathLowRank(_weighted_path_shapes(module), **kwargs)
    elif kind == "dense":
        adapter = DenseLowRank(tuple(weight.shape), **kwargs, outputs_first=isinstance(module, nn.Linear))
    elif kind == "contraction":
        adapter = ContractionLowRank(
            module.elora_blocks, tuple(weight.shape), module.elora_projection, train_lower_order=train_lower_order,
            contraction_a=contraction_a, **kwargs,
        )  # fmt: skip
    else:
        adapter = ElementLowRank(tuple(weight.shape), **kwargs, contraction_a=contraction_a)
        if train_lower_order:
            for lower in module.weights:
                lower.requires_grad_(lower.numel() > 0)
    if isinstance(adapter, BlockLowRank):
        adapter.after_factors(weight.detach())
    parametrize.register_parametrization(module, attribute, adapter)
    original = getattr(module.parametrizations, attribute).original
    original.requires_grad_(False)
    if isinstance(adapter, BlockLowRank):
        adapter.init_weights(original)


def _block_adapters(model: nn.Module) -> list[tuple[str, nn.Module, str, BlockLowRank]]:
    """(module name, module, attribute, adapter) of every `BlockLowRank` adapter, in module order."""
    out = []
    for name, module in model.named_modules():
        if parametrize.is_parametrized(module):
            for attribute, stack in module.parametrizations.items():
                out.extend((name, module, attribute, p) for p in stack if isinstance(p, BlockLowRank))
    return out


def init_lora_one(
    model: nn.Module, loss: Callable[[nn.Module, Any], torch.Tensor], batches: Iterable[tuple[Any, int]], gamma: float
) -> dict[str, torch.Tensor]:
    """LoRA-One's factors of every block of a model adapted with ``init="lora-one"``, from one full-batch gradient.

    As `workbench.adaptation.lora.init_lora_one` (same ``γ``, same sign: the factors from ``−G``), block by block
    (`workbench.adaptation.lora.variants.lora_one`): ``G`` is the gradient of the mean of ``loss(model, batch)`` over
    every sample of ``batches`` (``(batch, number of samples)`` pairs) w.r.t. each adapted base weight, taken in eval
    mode before training. Returns ``{module name.attribute: G}``; ``requires_grad`` and ``.grad`` are left as they
    were.
    """
    config = getattr(model, "_elora_config", None)
    if config is None or config.get("init") != "lora-one":
        raise UserError("elora.init_lora_one initialises a model adapted with elora.apply(..., init='lora-one')")
    if not gamma > 0:
        raise UserError(f"LoRA-One's gamma must be positive, got {gamma}")
    adapters = _block_adapters(model)
    originals = [getattr(module.parametrizations, attribute).original for _, module, attribute, _ in adapters]
    means = mean_gradients(model, loss, batches, originals, "elora.init_lora_one")
    gradients = {}
    for (name, _, attribute, adapter), original, mean in zip(adapters, originals, means):
        gradients[f"{name}.{attribute}"] = mean
        LoraOne.init_blocks_from_gradient(adapter, original, mean, gamma)
    return gradients


def perturbations(model: nn.Module, seed: int, sigma: float) -> dict[str, torch.Tensor]:
    """Flat-LoRA's noise ``{module name.attribute: ε}`` of every adapted weight in module order, from one generator
    seeded with ``seed`` (on the weights' device), at the current adapted weights (`BlockLowRank.noise`)."""
    if sigma < 0:
        raise UserError(f"Flat-LoRA's sigma must be >= 0, got {sigma}")
    adapters = _block_adapters(model)
    if not adapters:
        raise UserError(f"this {type(model).__name__} carries no ELoRA adapter to perturb (call elora.apply first)")
    generator = torch.Generator(device=adapters[0][3].pairs()[0][1].device).manual_seed(seed)
    out = {}
    with torch.no_grad():
        for name, module, attribute, adapter in adapters:
            adapter.perturbation = None
            out[f"{name}.{attribute}"] = adapter.noise(getattr(module, attribute), sigma, generator)
    return out


@contextmanager
def perturbed(model: nn.Module, seed: int, sigma: float) -> Iterator[None]:
    """Within the block every adapted weight is ``W' + ε`` (`perturbations` of ``seed``); none after it."""
    noise = perturbations(model, seed, sigma)
    adapters = _block_adapters(model)
    try:
        for name, _, attribute, adapter in adapters:
            adapter.perturbation = noise[f"{name}.{attribute}"]
        yield
    finally:
        for *_, adapter in adapters:
            adapter.perturbation = None


def merge(model: nn.Module) -> nn.Module:
    """Fold every ELoRA update into its weight, remove the adapters and return the plain model.

    Only ELoRA's parametrizations are removed. A weight on which ELoRA's adapter is stacked over another
    parametrization cannot be folded without folding that one too: such a model is refused, unchanged.
    """
    adapted = _adapted(model)
    stacked = [type(module).__name__ + "." + attribute for module, attribute, alone in adapted if not alone]
    if stacked:
        raise UserError(
            f"cannot merge ELoRA: its adapter is stacked over another parametrization on {', '.join(stacked[:3])}; "
            "fold that one first (torch.nn.utils.parametrize.remove_parametrizations(..., leave_parametrized=True))"
        )
    for module, attribute, _ in adapted:
        parametrize.remove_parametrizations(module, attribute, leave_parametrized=True)
    if hasattr(model, "_elora_config"):
        del model._elora_config
    return model


def save_adapter(model: nn.Module, path: str | Path) -> None:
    """Write the adapter alone: its tensors (every ``A``/``B``, RepLoRA's MLPs, DoRA's magnitudes and the
    lower-order weights it trains) in one safetensors file whose metadata holds `apply`'s options.

    A PiSSA adapter's file holds no residual base: the residual is a function of the base weights alone (the best
    rank-r approximation does not depend on the singular vectors' signs), and `load_adapter` recomputes it from the
    base model it is given, as `workbench.adaptation.lora` does (PEFT's convention)."""
    config = getattr(model, "_elora_config", None)
    if config is None:
        raise UserError("this model carries no ELoRA adapter (call elora.apply first)")
    write_adapter(path, ELoRA().trainable_state(model), "elora", config)


def load_adapter(model: nn.Module, path: str | Path) -> nn.Module:
    """Apply ELoRA to a base ``model`` with the configuration saved in ``path`` and load the adapter into it.

    The file must hold exactly the adapter's tensors, of the same shapes (else a `UserError` naming the file and
    the matched / missing / unexpected tensors).
    """
    tensors, config = read_adapter(path, "elora")
    try:
        options = {key: config[key] for key in ("rank", "alpha", "train_lower_order")}
    except (KeyError, TypeError):
        raise UserError(f"{path}: not an ELoRA adapter (no ELoRA configuration in its metadata)") from None
    options.update({key: config[key] for key in REFINEMENT_KEYS if key in config})  # files before refinements: none
    try:
        apply(model, **options)
    except UserError as error:
        raise UserError(f"{path}: {error}") from None
    load_into({n: p for n, p in model.named_parameters() if p.requires_grad}, tensors, path, strict=True)
    return model


@methods.register
class ELoRA(Method):
    """ELoRA as a workbench method (see the module docstring), with the LoRA refinements that stay equivariant.

    ``--init pissa|lora-one``, ``--lora-scaling rslora``, ``--reparam replora``, ``--dora`` are `apply`'s options
    (the LoRA variants per block, module doc); ``--init lora-one`` sets the factors in `setup` from the gradient of
    the task's training loss (energy and forces) over every training frame (`init_lora_one`, ``--gamma``).
    ``--objective flat-lora`` trains on Flat-LoRA's loss as the ``lora`` method does: each step at the adapted
    weights perturbed by noise drawn from ``seed · 1_000_003 + step`` with ``σ_t = flat_sigma (1 − cos(π t / T)) / 2``
    (`perturbed`); validation sees the unperturbed model. GOAT is refused (`GOAT_REFUSAL`).
    """

    name = "elora"
    description = "Equivariant LoRA: per-path low-rank weight updates of e3nn/MACE layers (ICML 2025)"
    model_families = ("mace", "sevennet")
    learning_rate = 5e-3  # the authors'; 2e-3 and 1e-2 were no better on rmd17 validation (50 frames)
    options = (
        Option("rank", int, 16, "LoRA rank r of every ELoRA update"),
        Option("alpha", float, 16.0, "ELoRA scale alpha (updates are multiplied by alpha / rank)"),
        dataclasses.replace(
            _LORA_OPTIONS["init"],
            help="adapter init: 'kaiming' (ELoRA's own: A ~ N(0, 1), B = 0, the authors'), 'pissa' (top-r singular "
            "triplets of each path block, which keeps the residual) or 'lora-one' (top-r singular triplets of each "
            "block's full-batch gradient of the energy+forces loss over the training frames)",
            refused={"goat": GOAT_ON_ELORA},
        ),
        dataclasses.replace(_LORA_OPTIONS["lora_scaling"], refused={"goat": GOAT_ON_ELORA}),
        *(_LORA_OPTIONS[name] for name in ("dora", "gamma", "reparam", "objective", "flat_sigma")),
        Option("contraction_a", str, "divided", "how the symmetric contraction's A holds its 1/n_params: divided (A ~ "
               "N(0,1), divided in the update) or stored (A ~ N(0,1)/n_params, the authors' code: Adam then moves it "
               "n_params times faster)", choices=CONTRACTION_A),
    )
    #: The authors' recipe (MACE_ELoRA branch of hyjwpk/ELoRA; CLaSLoVe/MMEA's rMD17 splits and training log, which
    #: say its full fine-tuning baseline ran the same recipe): read from their scripts, not the paper's text.
    recipes = {
        "paper": Recipe(
            source="hyjwpk/ELoRA branch MACE_ELoRA and CLaSLoVe/MMEA's rMD17 setup",
            settings={"learning_rate": 5e-3, "batch_size": 5, "epochs": 500, "patience": 500, "ema_decay": 0.995,
                      "clip_grad_norm": 100.0, "lr_factor": 0.8, "lr_patience": 5, "schedule": "plateau",
                      "precision": "float64", "train_size": 50, "val_size": 50, "select_on": "loss"},
            task_options={"rmd17": {"energy_loss": "total", "energy_weight": 1.0, "forces_weight": 1000.0}},
            method_options={"rank": 16, "alpha": 16.0, "init": "kaiming", "contraction_a": "stored"},
            departures=(
                "weight decay 1e-8 on some parameter groups not reproduced (0 here)",
                "MACE's second (SWA) stage from epoch 400 (--swa --start_swa=400: its own loss weights and learning "
                "rate, weights averaged) not reproduced",
                "validation every epoch, not every 2",
                "the authors' foundation model is MACE-OFF23 medium and their test set 1,000 rMD17 frames; here the "
                "run's model and data",
            ),
        ),
    }

    def __init__(self, **options: Any):
        """The options, checked before any model is seen (`adapter_config`; LoRA-One's ``gamma``)."""
        super().__init__(**options)
        c = self.config
        try:
            adapter_config(c["rank"], c["alpha"], c["init"], c["lora_scaling"], c["reparam"], c["dora"],
                           c["objective"], c["flat_sigma"])  # fmt: skip
        except UserError as error:
            raise UserError(f"method 'elora': {error}") from None
        if c["gamma"] <= 0:
            raise UserError(f"method 'elora': --gamma must be positive (LoRA-One divides by sqrt(gamma)), got "
                            f"{c['gamma']}")  # fmt: skip

    def prepare(self, model: nn.Module) -> nn.Module:
        config = self.config
        return apply(
            model,
            rank=config["rank"],
            alpha=config["alpha"],
            init=config["init"],
            scaling=config["lora_scaling"],
            reparam=config["reparam"],
            dora=config["dora"],
            objective=config["objective"],
            flat_sigma=config["flat_sigma"],
            contraction_a=config["contraction_a"],
        )

    def setup(self, task, model: nn.Module, data, seed: int) -> None:
        """LoRA-One (``--init lora-one``): the factors from the gradient of the task's *training* loss over every
        training frame, `GRADIENT_CHUNK` frames per pass (training form: MACE's forces keep their graph to the
        weights only then; the model is in eval mode). Keeps ``seed`` for Flat-LoRA's noise."""
        self._seed = seed
        if self.config["init"] == "lora-one":
            device = device_of(model)
            chunks = [data.train[i : i + GRADIENT_CHUNK] for i in range(0, len(data.train), GRADIENT_CHUNK)]
            batches = ((task.collate(chunk, device), len(chunk)) for chunk in chunks)
            init_lora_one(model, lambda m, batch: task.loss(m, batch, True), batches, self.config["gamma"])

    def plan(self, task, model: nn.Module, data, inputs: PlanInputs) -> list[Stage]:
        """One stage; with ``--objective flat-lora`` its step is Flat-LoRA's at the perturbed adapted weights
        (`workbench.adaptation.lora.flat.flat_stage` with `perturbed`, as the ``lora`` method's plan)."""
        stages = super().plan(task, model, data, inputs)
        if self.config["objective"] != "flat-lora":
            return stages
        seed = getattr(self, "_seed", inputs.settings.seed)
        sigma = self.config["flat_sigma"]
        return [flat_stage(stages[0], task, len(data.train), inputs.settings, sigma, seed, perturb=perturbed)]

    def merge(self, model: nn.Module) -> nn.Module:
        return merge(model)

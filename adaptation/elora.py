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
the base model. `merge` folds the updates into the weights and returns a plain model; it removes ELoRA's own
parametrizations only, and a model's other parametrizations stay as they are.

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

import math
from pathlib import Path
from typing import Iterator

import torch
from e3nn import o3
from e3nn.nn._fc import _Layer as RadialLayer
from torch import nn
from torch.nn.utils import parametrize
from workbench.adaptation.lora.io import load_into, read_adapter, write_adapter

from workbench.errors import UserError
from workbench.method import Method
from workbench.options import Option
from workbench.registry import methods

try:  # MACE is optional: without it ELoRA still adapts any e3nn model
    from mace.modules.symmetric_contraction import Contraction as MaceContraction
except ImportError:  # pragma: no cover - mace-torch is installed with the atomistic extra
    MaceContraction = None

try:  # cuEquivariance is optional (the cueq extra): MACE converted by `workbench.models.mace.to_cueq`
    import cuequivariance as cue
    import cuequivariance_torch as cuet
except ImportError:
    cue = cuet = None


class PathLowRank(nn.Module):
    """Per-path low-rank update of a flat e3nn weight (``o3.Linear``, ``o3.TensorProduct``).

    Args:
        path_shapes: block shape of each weighted path, in the weight's order (``(mul_in, mul_out)``
            for ``o3.Linear``, ``(u, v, w)`` for a ``uvw`` tensor product).
        rank, alpha: LoRA rank ``r`` and scale ``alpha`` (the update is multiplied by ``alpha / r``).

    Shapes:
        weight ``(sum_p prod(path_shape_p),)`` -> same.
    """

    def __init__(
        self, path_shapes: list[tuple[int, ...]], rank: int, alpha: float, dtype: torch.dtype, device: torch.device
    ):
        super().__init__()
        self.scale = alpha / rank
        blocks = [(math.prod(shape[:-1]), shape[-1]) for shape in path_shapes]
        ranks = [min(rank, rows, cols) for rows, cols in blocks]
        self.A = nn.ParameterList(
            [nn.Parameter(torch.randn(rows, r, dtype=dtype, device=device)) for (rows, _), r in zip(blocks, ranks)]
        )
        self.B = nn.ParameterList(
            [nn.Parameter(torch.zeros(r, cols, dtype=dtype, device=device)) for (_, cols), r in zip(blocks, ranks)]
        )

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        delta = torch.cat([(a @ b).reshape(-1) for a, b in zip(self.A, self.B)])
        return weight + self.scale * delta


class DenseLowRank(nn.Module):
    """Dense low-rank update ``W += (alpha / r) · A @ B`` of a 2-D weight.

    Shapes:
        weight ``(rows, cols)`` -> same; ``A (rows, r)``, ``B (r, cols)``.
    """

    def __init__(self, shape: tuple[int, int], rank: int, alpha: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.scale = alpha / rank
        rank_used = min(rank, *shape)
        self.A = nn.Parameter(torch.randn(shape[0], rank_used, dtype=dtype, device=device))
        self.B = nn.Parameter(torch.zeros(rank_used, shape[1], dtype=dtype, device=device))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.scale * (self.A @ self.B)


class ElementLowRank(nn.Module):
    """Update of MACE's highest-order contraction weights: ``W_e += (alpha/r) · (A_e / n_params) @ B``.

    Shapes:
        weight ``(n_elements, n_params, channels)`` -> same; ``A (n_elements, n_params, r)`` per
        element, ``B (r, channels)`` shared by all elements.
    """

    def __init__(self, shape: tuple[int, int, int], rank: int, alpha: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        n_elements, self.n_params, channels = shape
        self.scale = alpha / rank
        rank_used = min(rank, n_elements * self.n_params, channels)
        self.A = nn.Parameter(torch.randn(n_elements, self.n_params, rank_used, dtype=dtype, device=device))
        self.B = nn.Parameter(torch.zeros(rank_used, channels, dtype=dtype, device=device))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.scale * (self.A / self.n_params) @ self.B


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
        rank: int,
        alpha: float,
        train_lower_order: bool,
        dtype: torch.dtype,
        device: torch.device,
    ):
        super().__init__()
        n_elements, _, channels = shape
        self.blocks = blocks
        self.scale = alpha / rank
        self.A, self.B, self.D = nn.ParameterList(), nn.ParameterList(), nn.ParameterList()
        for highest, n_params in blocks:
            if highest:
                r = min(rank, n_elements * n_params, channels)
                self.A.append(nn.Parameter(torch.randn(n_elements, n_params, r, dtype=dtype, device=device)))
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
                parts.append(self.scale * (a / n_params) @ b)
            else:
                parts.append(next(lower))
        delta = torch.cat(parts, dim=1)
        if self.projection is not None:
            delta = torch.einsum("zau,ab->zbu", delta, self.projection)
        return weight + delta


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


def apply(model: nn.Module, rank: int = 16, alpha: float = 16.0, train_lower_order: bool = True) -> nn.Module:
    """Attach ELoRA adapters to ``model`` in place, freeze everything else and return it.

    Args:
        model: an e3nn-based model (MACE or any model built of ``o3.Linear``/``o3.TensorProduct``).
        rank: LoRA rank ``r`` of every update (default 16, the authors').
        alpha: scale; updates are multiplied by ``alpha / rank`` (default 16).
        train_lower_order: also train MACE's lower-order symmetric-contraction weights in full.
    """
    if rank < 1:
        raise UserError(f"ELoRA rank must be a positive integer, got {rank}")
    if _adapted(model):
        raise UserError("this model already carries ELoRA adapters; merge them first (elora.merge)")
    model.requires_grad_(False)
    targets = list(_targets(model))
    if not targets:
        raise UserError(
            f"{type(model).__name__} has no e3nn Linear, tensor-product, radial-MLP or "
            "symmetric-contraction weights: ELoRA does not fit this model"
        )
    for module, attribute, kind in targets:
        weight = getattr(module, attribute)
        kwargs = dict(rank=rank, alpha=alpha, dtype=weight.dtype, device=weight.device)
        if kind == "path":
            adapter = PathLowRank(_weighted_path_shapes(module), **kwargs)
        elif kind == "dense":
            adapter = DenseLowRank(tuple(weight.shape), **kwargs)
        elif kind == "contraction":
            adapter = ContractionLowRank(
                module.elora_blocks,
                tuple(weight.shape),
                module.elora_projection,
                train_lower_order=train_lower_order,
                **kwargs,
            )
        else:
            adapter = ElementLowRank(tuple(weight.shape), **kwargs)
            if train_lower_order:
                for lower in module.weights:
                    lower.requires_grad_(lower.numel() > 0)
        parametrize.register_parametrization(module, attribute, adapter)
        getattr(module.parametrizations, attribute).original.requires_grad_(False)
    model._elora_config = {"rank": rank, "alpha": alpha, "train_lower_order": train_lower_order}
    return model


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
    """Write the adapter alone: its tensors (every ``A``/``B`` and the lower-order weights it trains) in
    one safetensors file whose metadata holds rank, alpha and ``train_lower_order``."""
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
    apply(model, **options)
    load_into({n: p for n, p in model.named_parameters() if p.requires_grad}, tensors, path, strict=True)
    return model


@methods.register
class ELoRA(Method):
    """ELoRA as a workbench method (see the module docstring)."""

    name = "elora"
    description = "Equivariant LoRA: per-path low-rank weight updates of e3nn/MACE layers (ICML 2025)"
    model_families = ("mace",)
    learning_rate = 5e-3  # the authors'; 2e-3 and 1e-2 were no better on rmd17 validation (50 frames)
    options = (
        Option("rank", int, 16, "LoRA rank r of every ELoRA update"),
        Option("alpha", float, 16.0, "ELoRA scale alpha (updates are multiplied by alpha / rank)"),
    )

    def prepare(self, model: nn.Module) -> nn.Module:
        return apply(model, rank=self.config["rank"], alpha=self.config["alpha"])

    def merge(self, model: nn.Module) -> nn.Module:
        return merge(model)

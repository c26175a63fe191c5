"""The LoRA refinements on ELoRA's weight-space adapters, acting block by block so that they stay equivariant.

Each ELoRA adapter (`workbench.adaptation.elora`) updates its weight block by block: one path of an e3nn flat weight,
a dense radial-MLP weight, or MACE's stacked per-element contraction weights with their shared ``B``. Any value of
such a block gives an equivariant model (the module docstring of `workbench.adaptation.elora` says why), so every
refinement below, which only computes *which* values the block takes, keeps the model equivariant:

* ``init="pissa"`` (Meng et al., NeurIPS 2024; as `workbench.adaptation.lora.layer`): with ``U S Vᵀ`` the SVD of the
  block's matrix ``M`` (rows × cols), the factors hold its top-r triplets, ``A = U_r sqrt(S_r / scale)``,
  ``B = sqrt(S_r / scale) V_rᵀ`` (``A`` times ``n_params`` for the contraction, whose formula divides by it), and the
  stored base block becomes the residual ``M − scale · A B``: the model is the same function at start;
* ``init="lora-one"`` (Zhang, Liu and Chen, ICML 2025; as `workbench.adaptation.lora.init_lora_one`): with ``U S Vᵀ``
  the SVD of ``−G`` (``G`` the task loss's full-batch gradient w.r.t. the block), ``A = U_r sqrt(S_r / s₁) / sqrt(γ)``,
  ``B = sqrt(S_r / s₁) V_rᵀ / sqrt(γ)``; the base left as it is. A block whose gradient is exactly zero (a path the
  loss does not reach) keeps ELoRA's own init;
* ``scaling="rslora"``: ``scale = alpha / sqrt(r)`` instead of ``alpha / r``;
* ``reparam="replora"`` (Truong et al., ICML 2025): each block's factors come out of its own RepLoRA MLP
  (`workbench.adaptation.lora.layer.Reparam`, ``3 r²`` parameters a block): with ELoRA's ``ΔM = A B`` and LoRA's
  ``ΔW = B_lora A_lora``, ELoRA's ``A`` plays LoRA's ``B`` and ELoRA's ``B`` LoRA's ``A``;
* ``dora`` (Liu et al., ICML 2024): a trained magnitude per output unit of each block rescales the adapted block's
  column (an output channel of a path, of a radial layer, of one element's contraction) to
  ``m · (M + ΔM)_col / ||(M + ΔM)_col||`` (norm detached, as DoRA's section 4.3);
* Flat-LoRA's noise (Li et al., ICML 2025; `workbench.adaptation.elora.perturbed`): added to the adapted block,
  ``ε ~ N(0, σ_t² ||(M + ΔM)_col||² / fan_in)`` per output unit.

"Output units" and "fan-in" read each block as ``(groups, fan_in, out)``: an e3nn path ``(mul_in [· mul_in2], mul_out)``
and a radial layer ``(h_in, h_out)`` are one group; MACE's contraction ``(n_elements, n_params, channels)`` has one
group per element (each atom uses its element's weight alone); ``torch.nn.Linear``'s ``(out, in)`` weight is read
transposed.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from workbench.adaptation.lora.config import REPARAMS, SCALINGS
from workbench.adaptation.lora.layer import Reparam

from workbench.errors import UserError

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


def check_refinements(init: str, scaling: str, reparam: str, dora: bool) -> None:
    """One validator of ELoRA's refinement options (a `UserError` naming the option and what is allowed)."""
    if "goat" in (init, scaling):
        raise UserError(GOAT_REFUSAL)
    if init not in ELORA_INITS:
        raise UserError(f"ELoRA init must be one of {ELORA_INITS}, got {init!r}")
    if scaling not in SCALINGS:
        raise UserError(f"ELoRA scaling (--lora-scaling) must be one of {SCALINGS}, got {scaling!r}")
    if reparam not in REPARAMS:
        raise UserError(f"ELoRA reparam must be one of {REPARAMS}, got {reparam!r}")
    if not isinstance(dora, bool):
        raise UserError(f"ELoRA dora must be true or false, got {dora!r}")
    if reparam == "replora" and (init != "kaiming" or dora):
        other = f"init={init!r}" if init != "kaiming" else "dora=True"
        raise UserError(
            f"ELoRA reparam='replora' with {other} is not defined (RepLoRA's MLP would change the factors that option "
            "sets or rescales); use reparam='none', or init='kaiming' without dora"
        )


def scale_of(alpha: float, rank: int, scaling: str) -> float:
    """``alpha / r`` (standard) or rsLoRA's ``alpha / sqrt(r)``; ``r`` the nominal rank (a smaller block keeps it)."""
    return alpha / math.sqrt(rank) if scaling == "rslora" else alpha / rank


class BlockLowRank(nn.Module):
    """ELoRA's adapter of one weight, block by block: ``M_i + scale · (A_i B_i) / d_i`` and the refinements.

    A subclass holds the factors and says how its weight splits into blocks: `pairs` (the free factors of each block
    as ``(rows, r)``, ``(r, cols)`` views), `divisors` ``d_i`` (``n_params`` for the contraction, else 1), `blocks`
    (a weight-shaped tensor → each block as a ``(rows, cols)`` matrix view), `assemble` (the inverse) and `units`
    (a block matrix → ``(groups, fan_in, out)``) with `from_units`.

    Attributes:
        perturbation: Flat-LoRA's noise in the weight's shape while `workbench.adaptation.elora.perturbed` holds it
            (added to the adapted weight), else None.
    """

    divisors: list[float]

    def _setup_refinements(self, scaling: str, reparam: str, dora: bool, alpha: float, rank: int) -> None:
        """Scale, RepLoRA's MLPs (Kaiming-uniform, as LoRA's) and DoRA's magnitudes (set by `reset_magnitude`)."""
        self.scale = scale_of(alpha, rank, scaling)
        self.perturbation: torch.Tensor | None = None
        pairs = self.pairs()
        like = pairs[0][1]
        self.reparam = None
        if reparam == "replora":
            self.reparam = nn.ModuleList(Reparam(b.shape[0], like) for _, b in pairs)
            for module in self.reparam.modules():
                if isinstance(module, nn.Linear):
                    nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
        self.magnitude = None
        if dora:
            self.magnitude = nn.ParameterList(
                nn.Parameter(torch.empty(units.shape[0], 1, units.shape[2], dtype=like.dtype, device=like.device))
                for units in (self.units(i, torch.empty(a.shape[0], b.shape[1])) for i, (a, b) in enumerate(pairs))
            )

    # ---- the layout a subclass gives ------------------------------------------------------------------------------

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

    # ---- forward -------------------------------------------------------------------------------------------------

    def factors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The ``(A_i, B_i)`` each block computes with: the free factors, or RepLoRA's MLP of them."""
        if self.reparam is None:
            return self.pairs()
        out = []
        for (a, b), mlp in zip(self.pairs(), self.reparam):
            b_used, a_used = mlp.factors(b, a)  # LoRA's (A, B) roles: ELoRA's B is LoRA's A (r, in), A is B (out, r)
            out.append((a_used, b_used))
        return out

    def deltas(self) -> list[torch.Tensor]:
        """``scale · A_i B_i / d_i`` of each block, ``(rows, cols)``."""
        return [self.scale * (a @ b) / d for (a, b), d in zip(self.factors(), self.divisors)]

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        adapted = weight + self.assemble(self.deltas())
        if self.magnitude is not None:
            adapted = self._dora(adapted)
        return adapted if self.perturbation is None else adapted + self.perturbation

    def _dora(self, adapted: torch.Tensor) -> torch.Tensor:
        """DoRA: each block's output units rescaled to their magnitude ``m · u / ||u||`` (norm detached)."""
        out = []
        for i, (block, m) in enumerate(zip(self.blocks(adapted), self.magnitude)):
            units = self.units(i, block)
            out.append(self.from_units(i, m * units / units.detach().norm(dim=1, keepdim=True)))
        return self.assemble(out)

    # ---- initialisations -----------------------------------------------------------------------------------------

    def _set(self, index: int, left: torch.Tensor, right: torch.Tensor) -> None:
        """Block ``index``'s free factors from the ``left @ right`` its delta is to be (times ``d_i`` in ``A``)."""
        a, b = self.pairs()[index]
        with torch.no_grad():
            a.copy_(left * self.divisors[index])
            b.copy_(right)

    def init_pissa(self, original: torch.Tensor) -> None:
        """PiSSA on every block (module doc); ``original`` (the stored base weight) becomes the residual in place."""
        residual = []
        for i, (block, (a, _)) in enumerate(zip(self.blocks(original.detach()), self.pairs())):
            rank = a.shape[-1]
            u, s, vh = torch.linalg.svd(block.to(torch.promote_types(block.dtype, torch.float32)), full_matrices=False)
            root = (s[:rank] / self.scale).sqrt()
            left, right = u[:, :rank] * root, root[:, None] * vh[:rank]
            self._set(i, left.to(block.dtype), right.to(block.dtype))
            residual.append(block - self.scale * (left @ right).to(block.dtype))
        with torch.no_grad():
            original.copy_(self.assemble(residual))
        self.reset_magnitude(original)

    def init_from_gradient(self, original: torch.Tensor, gradient: torch.Tensor, gamma: float) -> int:
        """LoRA-One on every block from ``gradient`` (the loss's w.r.t. the stored base weight, its shape); returns how
        many blocks had a zero gradient and kept ELoRA's own init."""
        untouched = 0
        for i, (block, (a, _)) in enumerate(zip(self.blocks(-gradient.detach()), self.pairs())):
            if not block.abs().max() > 0:
                untouched += 1
                continue
            rank = a.shape[-1]
            u, s, vh = torch.linalg.svd(block.to(torch.promote_types(block.dtype, torch.float32)), full_matrices=False)
            root = (s[:rank] / s[0]).sqrt() / math.sqrt(gamma)
            self._set(i, (u[:, :rank] * root).to(block.dtype), (root[:, None] * vh[:rank]).to(block.dtype))
        self.reset_magnitude(original)
        return untouched

    def reset_magnitude(self, original: torch.Tensor) -> None:
        """DoRA's magnitudes: the norms of the output units of ``original + ΔW`` (the identity at this point)."""
        if self.magnitude is None:
            return
        with torch.no_grad():
            adapted = original + self.assemble(self.deltas())
            for i, (block, m) in enumerate(zip(self.blocks(adapted), self.magnitude)):
                m.copy_(self.units(i, block).norm(dim=1, keepdim=True))

    # ---- Flat-LoRA -----------------------------------------------------------------------------------------------

    def noise(self, adapted: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
        """Flat-LoRA's ``ε`` for the adapted weight ``adapted`` (detached): per block, per output unit,
        ``N(0, σ² ||u||² / fan_in)``, drawn block by block in the weight's order as ``(groups, fan_in, out)``."""
        out = []
        for i, block in enumerate(self.blocks(adapted.detach())):
            units = self.units(i, block)
            std = sigma * units.norm(dim=1, keepdim=True) / math.sqrt(units.shape[1])
            z = torch.randn(units.shape, generator=generator, dtype=units.dtype, device=units.device)
            out.append(self.from_units(i, z * std))
        return self.assemble(out)

"""The LoRA layer: a frozen ``nn.Linear`` / ``nn.Conv1d`` / ``nn.Conv2d`` plus named low-rank adapters.

Paper: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022. Layout and names as HF PEFT's
``peft.tuners.lora.layer``: the wrapped layer is kept whole as ``base_layer`` and each adapter's factors live under
its name in ``lora_A[name]`` / ``lora_B[name]`` (``nn.ModuleDict`` s, as PEFT's), so parameters are named
``<module>.base_layer.weight``, ``<module>.lora_A.<name>.weight``, ``<module>.lora_B.<name>.weight``; files drop the
adapter name (``<module>.lora_A.weight``), as PEFT's do. `LoraLayer.add_adapter`, `LoraLayer.set_adapter`,
`LoraLayer.delete_adapter`, `LoraLayer.merge` / `LoraLayer.unmerge` manage them as PEFT's methods of those names.

Each adapter has a kind (`workbench.adaptation.lora.config.AdapterConfig.kind`); with ``x`` the input::

    lora:     (alpha / r) · B (A (dropout(x)))
    hlora:    scale · B (repeat_interleave(softmax(R x), r / k) ⊙ A (dropout(x))),      scale = alpha / r · k
    moelora:  scale · Σ_e softmax(R x)_e · B_e (A_e (dropout(x)))
    goat:     scale · Σ_{e ∈ top_k(g)} (g_e / Σ_{top_k} g) · B_e (A_e (dropout(x))),      g = softmax(R x)

and the layer computes ``W x + b + Σ_{active, unmerged adapters} update(x)``.

* plain LoRA, linear: ``A = Linear(in, r)``, ``B = Linear(r, out)`` (no biases): ``ΔW = B A``;
* plain LoRA, convolution: ``A`` is a convolution of the base layer's kernel, stride, padding, dilation and padding
  mode into ``r`` channels and ``B`` a 1×1 convolution back to ``out`` (PEFT's factorisation; PEFT leaves out
  dilation and padding mode, which makes its merge inexact for such layers). The composition is one convolution of
  weight ``ΔW[o, i, k] = Σ_j B[o, j] A[j, i, k]``, so the merge is exact. Grouped convolutions are refused.
* H-LoRA (HealthGPT, seed 000; METHODS.md "H-LoRA"): ``k`` experts of ``r / k`` ranks each in one ``A``/``B`` pair,
  weighed token by token by the router ``lora_route[name] = Linear(in, k)``; it equals the MoELoRA loop with ``A_e``
  the rows ``e·r/k … (e+1)·r/k − 1`` of ``A`` and ``B_e`` the same columns of ``B`` at one matmul pair instead of
  ``k``. ``scale = alpha / r · k`` follows the authors' code (their paper's Eq. 9 differs). The router reads the
  undropped input; dropout acts on ``A``'s input as for every kind (METHODS.md notes the authors apply it after
  ``A``; with dropout 0 the two agree). Routed kinds adapt ``nn.Linear`` layers only and cannot be merged.
* MoELoRA: ``lora_A[name]`` / ``lora_B[name]`` are ``nn.ModuleList`` s of ``k`` experts (``in → r/k → out``).
* GOAT (Fan et al., ICML 2025; its authors' code, Facico/GOAT-PEFT, ``goat/peta/src/goat/layer.py``): MoELoRA's
  layout, each token sent to its ``top_k`` experts, their gates renormalised to sum to 1 (every expert is computed
  for every token and the others weighed 0: the same function as the authors' gather, simpler on small models).
  ``scale`` is per expert, ``alpha / r_e`` (``r_e = r / k``) or, with ``scaling="goat"``, the authors' derived
  ``sqrt(3 η n_in / r_e)``. Each forward keeps the router's load-balancing loss ``k · Σ_e f_e P_e`` (``f_e`` the
  share of tokens sent to ``e``, counting every top-k choice, ``P_e`` the mean router probability) in
  ``balance_loss[name]``; the ``lora`` method adds it to the task's loss times its ``goat_aux`` (the authors' 1e-3).

Initialisation (``init``) as PEFT's; every adapter starts as the identity:

* ``"kaiming"`` (and loralib's): ``A`` Kaiming-uniform with ``a = sqrt(5)`` (the default of a linear layer's weight,
  fan-in ``in·K``), then ``B = 0``, then the router Kaiming-uniform;
* ``"pissa"`` (PiSSA, Meng et al., NeurIPS 2024; PEFT's ``init_lora_weights="pissa"``): with ``U S Vᵀ`` the SVD of the
  base weight flattened to ``(out, in·K)`` (in float64 for float64 weights, else float32), ``A = sqrt(S_r / scale)
  V_rᵀ`` and ``B = U_r sqrt(S_r / scale)``, so ``scale · B A`` is the best rank-r approximation of ``W``, and **the base
  weight is replaced by the residual** ``W_res = W − scale · B A`` (PEFT's convention: the layer still computes ``W``
  at start, the adapter trains the principal part). The residual is a function of ``W`` alone (it does not depend
  on the singular vectors' signs), so an adapter file needs no copy of it: loading the file onto the original base
  model runs the same SVD and reproduces ``W_res`` (as ``peft.PeftModel.from_pretrained`` does with PEFT's config).
  Merging gives ``W_res + scale · B A = W + ΔW`` with ``ΔW = scale · (B A − B₀ A₀)``; `delete_adapter` puts ``W =
  W_res + scale · B₀ A₀`` back (up to rounding) from the initial factors kept as non-persistent buffers
  (``pissa_factors[name]``). Convolutions take the same SVD of the flattened kernel (PEFT's PiSSA adapts linear
  layers only; its adapter config is then not written);
* ``"lora-one"`` (LoRA-One, Zhang, Liu and Chen, ICML 2025; the authors' released code, ``direction=LoRA-One``,
  ``scale=stable``): ``"kaiming"`` until `LoraLayer.init_from_gradient` is given the full fine-tuning gradient ``G`` of
  the base weight; then with ``U S Vᵀ`` the SVD of ``−G`` (flattened to ``(out, in·K)``),
  ``B = U_r sqrt(S_r / s₁) / sqrt(γ)`` and ``A = sqrt(S_r / s₁) V_rᵀ / sqrt(γ)`` (``s₁`` the largest singular value,
  ``γ`` the authors' ``stable_gamma``, 128 by default), the base weight left as it is: the adapted layer starts one
  rank-r gradient step away, ``W + scale · B A = W − scale / (γ s₁) · G_r`` (``G_r`` the best rank-r approximation
  of ``G``).

* ``"goat"`` (GOAT's ``init_type="goat"``; ``kind="goat"`` only): with ``U S Vᵀ`` the SVD of ``W`` (``n`` singular
  values) cut into ``k`` segments of ``n // k``, expert ``e`` takes the first ``r_e`` triplets of segment ``e``,
  ``S_e`` divided by ``scale · ρ`` (``ρ`` = `GOAT_RHO`, 10): ``A_e = sqrt(S_e / (scale ρ)) V_eᵀ``, ``B_e = U_e
  sqrt(S_e / (scale ρ))``, and the base weight becomes ``W − scale · Σ_e B_e A_e / k`` (the authors' ``init_cof =
  1 / k``). Unlike the other inits the layer does not start as ``W``: the experts' routed sum replaces the average
  that was taken out. The residual is a function of ``W`` (``W − Σ_e U_e S_e V_eᵀ / (ρ k)``), kept for
  `delete_adapter` as PiSSA's is.

Dropout acts on the adapter's input only; the base path never sees it.

RepLoRA (``reparam="replora"``; Truong et al., ICML 2025, "RepLoRA: Reparameterizing Low-Rank Adaptation via the
Perspective of Mixture of Experts"): the factors the layer computes with are the output of a light MLP of trained
free factors. This workbench's reading of the paper's abstract ("a lightweight MLP to reparameterize the LoRA
matrices"; the paper's width, activation and sharing were not available to check): one MLP per adapter over the
rank axis, its first layer ``H (r, r)`` shared by both factors, its output layers ``P_A, P_B (r, r)`` their own, no
biases, GELU between (``Â``, ``B̂`` the free factors ``lora_A[name].weight``, ``lora_B[name].weight``, flattened to
``(r, in·K)`` and ``(out, r)``)::

    A = P_A gelu(H Â),        B = gelu(B̂ Hᵀ) P_Bᵀ,        ΔW = scale · B A

``Â`` and ``B̂`` start as the ``"kaiming"`` init (``B̂ = 0``, so ``B = 0``: the identity at start), ``H``, ``P_A``,
``P_B`` Kaiming-uniform; the MLP is ``lora_reparam[name]`` (``hidden``, ``A``, ``B``: ``3 r²`` parameters a layer,
saved with the adapter). `merge` adds ``ΔW`` of the MLP's factors, so the merged model carries no MLP (no cost at
inference).

Scaling (``scaling``): ``scale = alpha / r`` or rsLoRA's ``alpha / sqrt(r)`` (PEFT's ``use_rslora``).

DoRA (``dora``; Liu et al., ICML 2024; PEFT's ``use_dora``): a trained magnitude ``m`` (one value per output unit,
initialised to the row norms of ``W + scale · B A``) rescales the adapted weight row by row,
``W' = (m / ||W + scale · B A||) ⊙ (W + scale · B A)``, the norm (over each output unit's inputs and kernel) detached
from the gradient as the paper's section 4.3 and PEFT do. The input way computes PEFT's
``(f − 1) ⊙ W dropout(x) + f ⊙ scale · B A dropout(x)`` on top of ``W x + b`` (``f = m / norm``): with dropout
inactive that is ``W' x + b``. The magnitude is ``lora_magnitude_vector[name].weight``, shaped ``(out,)`` for linear
layers and ``(1, out, 1, ...)`` for convolutions (PEFT's names and shapes). Its ``ΔW = W' − W`` depends on the weight
it is added to: `merge` computes every merged adapter's ``ΔW`` from the weight before that merge and keeps it, so
`unmerge` subtracts exactly what was added.

Two ways to compute a plain adapter (``compute``):

* ``"input"`` (default, PEFT's): ``base_layer(x) + scale · B(A(dropout(x)))`` — the adapter's activations
  (``A``'s and ``B``'s outputs) are extra memory, its backward never forms a weight-sized gradient;
* ``"weight"`` (loralib's ``ConvLoRA``; the ``htuning`` method's): the base layer's own operation with ``W + ΔW``, one
  convolution or matmul — no adapter activations and one op instead of three (cheaper for convolutions over long
  signals), but a weight-sized ``ΔW`` and gradient per layer (costly for large linear layers). Dropout cannot act
  in weight space: while the adapter's dropout is active (training with ``dropout > 0``) it computes the input way.
  Only stock ``nn.Linear``/``nn.Conv1d``/``nn.Conv2d`` base layers (not subclasses, whose forward may differ).

Shapes:
    linear: x (..., in) → (..., out); ``lora_A[name].weight (r, in)``, ``lora_B[name].weight (out, r)``,
    ``lora_route[name].weight (k, in)``; MoELoRA ``lora_A[name][e].weight (r / k, in)``.
    conv: x (batch, in, *spatial) → (batch, out, *spatial'); ``lora_A[name].weight (r, in, *kernel)``,
    ``lora_B[name].weight (out, r, 1, ...)``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize, skip_init
from workbench.adaptation.lora.config import GOAT_RHO, AdapterConfig

from workbench.errors import UserError

#: The layer types LoRA wraps.
SUPPORTED = (nn.Linear, nn.Conv1d, nn.Conv2d)
#: The adapter name `LoraLayer` and `workbench.adaptation.lora.apply` use when none is given (PEFT's).
DEFAULT = "default"
#: The per-adapter containers of a layer, in registration (and file) order.
CONTAINERS = ("lora_A", "lora_B", "lora_route", "lora_reparam", "lora_magnitude_vector")


class AdapterDict(nn.ModuleDict):
    """``nn.ModuleDict`` of one part of every adapter, by adapter name (PEFT's ``lora_A`` / ``lora_B``). An attribute
    it lacks is read from its one entry when it holds one (``layer.lora_A.weight`` is the single adapter's ``A``)."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or len(self) != 1:
                raise AttributeError(
                    f"'{name}' of a layer's adapter part holding adapters {list(self.keys())}: name one "
                    f"(lora_A['<adapter>'].{name})"
                ) from None
            return getattr(next(iter(self.values())), name)


class Magnitude(nn.Module):
    """DoRA's trained magnitude ``weight``: one value per output unit, shaped ``shape`` (PEFT's module of that name)."""

    def __init__(self, shape: tuple[int, ...], like: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shape, dtype=like.dtype, device=like.device))


class Reparam(nn.Module):
    """RepLoRA's MLP of one adapter's free factors (module doc): ``hidden`` shared, ``A`` and ``B`` per factor, each
    a bias-free ``(r, r)`` linear layer."""

    def __init__(self, rank: int, like: torch.Tensor):
        super().__init__()
        factory = {"dtype": like.dtype, "device": like.device}
        self.hidden, self.A, self.B = (skip_init(nn.Linear, rank, rank, bias=False, **factory) for _ in range(3))

    def factors(self, free_a: torch.Tensor, free_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, B)`` in the free factors' shapes: ``A = P_A gelu(H Â)``, ``B = gelu(B̂ Hᵀ) P_Bᵀ``.

        Shapes: free_a (r, in, *kernel), free_b (out, r, *ones) → the same."""
        a = self.A(F.gelu(self.hidden(free_a.flatten(1).T))).T
        b = self.B(F.gelu(self.hidden(free_b.flatten(1))))
        return a.reshape(free_a.shape), b.reshape(free_b.shape)


class InitialFactors(nn.Module):
    """PiSSA's initial factors ``A`` and ``B`` (non-persistent buffers: never saved), to put the base weight back."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        super().__init__()
        self.register_buffer("A", torch.zeros_like(a), persistent=False)
        self.register_buffer("B", torch.zeros_like(b), persistent=False)


def check_fits(base: nn.Module, config: AdapterConfig) -> None:
    """A `UserError` when ``config`` cannot adapt the layer ``base``: a grouped convolution, a routed kind on a
    convolution, ``compute="weight"`` on a non-stock layer, GOAT's, PiSSA's or LoRA-One's rank above the weight's, or
    GOAT's and PiSSA's residual on a parametrized weight (what `LoraLayer.add_adapter` refuses; a method checks it
    before a run)."""
    if isinstance(base, (nn.Conv1d, nn.Conv2d)) and base.groups != 1:
        raise UserError(
            f"LoRA on a grouped convolution ({type(base).__name__} with groups={base.groups}) is not supported; "
            "leave this module out of the targets"
        )
    if config.routed and not isinstance(base, nn.Linear):
        raise UserError(
            f"routed LoRA experts ({config.kind}) adapt nn.Linear layers, not {type(base).__name__}; leave this "
            "module out of the targets"
        )
    if config.compute == "weight" and _stock_class(base) not in SUPPORTED:
        raise UserError(
            f"compute='weight' runs the stock layer's operation with W + ΔW, which a {type(base).__name__} cannot; "
            "use compute='input'"
        )
    if config.init == "goat":
        segment = min(base.weight.shape) // config.experts
        if config.rank // config.experts > segment:
            raise UserError(
                f"GOAT cuts the {min(base.weight.shape)} singular values of the {tuple(base.weight.shape)} base "
                f"weight into {config.experts} segments of {segment}: an expert's rank "
                f"{config.rank // config.experts} does not fit; lower the rank or the experts"
            )
    largest = min(base.weight.shape[0], base.weight[0].numel())
    if config.init in ("pissa", "goat", "lora-one") and config.rank > largest:
        what = "gradient" if config.init == "lora-one" else "base weight"
        raise UserError(
            f"init={config.init!r} takes the top-r singular triplets of the {tuple(base.weight.shape)} {what}, which "
            f"has {largest}: LoRA rank {config.rank} is too large for init={config.init!r}"
        )
    if config.init in ("pissa", "goat") and parametrize.is_parametrized(base, "weight"):
        raise UserError(
            f"init={config.init!r} replaces the base weight by a residual, which a parametrized weight cannot take; "
            "use init='kaiming' for this target"
        )


class LoraLayer(nn.Module):
    """``base_layer(x) + Σ_{active adapters} update(x)`` around a frozen linear or conv layer (PEFT's ``LoraLayer``).

    Args:
        base_layer: the ``nn.Linear``, ``nn.Conv1d`` or ``nn.Conv2d`` to adapt (kept as is, as ``base_layer``).
        config: an adapter to add and make active at once (`add_adapter`, `set_adapter`); None (default): none yet.
        name: that adapter's name (default ``"default"``, PEFT's).

    Attributes:
        adapters: ``{name: AdapterConfig}`` in the order added.
        active_adapters: the names whose updates the forward adds (PEFT's ``active_adapters``).
        merged_adapters: the names folded into the base weight, in merge order (their ``ΔW`` kept for `unmerge`).

    The single-adapter views ``rank``, ``scale``, ``merged``, ``compute`` and ``delta_weight()`` read the one active
    adapter (a `UserError` when several are active).

    Shapes:
        see the module docstring.
    """

    def __init__(self, base_layer: nn.Module, config: AdapterConfig | None = None, name: str = DEFAULT):
        super().__init__()
        if not isinstance(base_layer, SUPPORTED):
            raise UserError(
                f"LoRA adapts nn.Linear, nn.Conv1d and nn.Conv2d layers, not {type(base_layer).__name__}; "
                "leave this module out of the targets"
            )
        self.base_layer = base_layer
        self.lora_dropout = AdapterDict()
        self.lora_A, self.lora_B, self.lora_route = AdapterDict(), AdapterDict(), AdapterDict()
        self.lora_reparam = AdapterDict()
        self.lora_magnitude_vector, self.pissa_factors = AdapterDict(), AdapterDict()
        self.adapters: dict[str, AdapterConfig] = {}
        #: Each adapter's scale on this layer (`AdapterConfig.scale_for` of its input size).
        self.scales: dict[str, float] = {}
        #: GOAT's load-balancing loss of the last forward, by adapter (module doc).
        self.balance_loss: dict[str, torch.Tensor] = {}
        self.active_adapters: tuple[str, ...] = ()
        self._merged_deltas: dict[str, torch.Tensor] = {}
        #: Flat-LoRA's noise ``ε`` (the base weight's shape) while `workbench.adaptation.lora.flat.perturbed` holds it:
        #: the layer then computes with ``W + ΔW + ε``; None otherwise.
        self.perturbation: torch.Tensor | None = None
        if config is not None:
            self.add_adapter(name, config)
            self.set_adapter(name)

    # ---- adapters -----------------------------------------------------------------------------------------

    def add_adapter(self, name: str, config: AdapterConfig) -> None:
        """Add adapter ``name`` (initialised so that it starts as the identity; PiSSA replaces the base weight by its
        residual); the active adapters stay as they are (PEFT's ``update_layer``). A taken or malformed name, a
        routed kind on a convolution, ``compute="weight"`` on a non-stock base layer and PiSSA of a rank above the
        weight's or on a parametrized weight are refused."""
        if not isinstance(name, str) or not name or "." in name:
            raise UserError(f"LoRA adapter names are non-empty strings without '.', got {name!r}")
        if name in self.adapters:
            raise UserError(f"this layer already has a LoRA adapter named '{name}'; delete_adapter('{name}') first")
        base = self.base_layer
        check_fits(base, config)
        self.lora_dropout[name] = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        if config.kind in ("moelora", "goat"):
            per_expert = config.rank // config.experts
            self.lora_A[name] = nn.ModuleList(_factors(base, per_expert)[0] for _ in range(config.experts))
            self.lora_B[name] = nn.ModuleList(_factors(base, per_expert)[1] for _ in range(config.experts))
        else:
            self.lora_A[name], self.lora_B[name] = _factors(base, config.rank)
        if config.routed:
            weight = base.weight
            self.lora_route[name] = skip_init(
                nn.Linear, base.in_features, config.experts, bias=False, dtype=weight.dtype, device=weight.device
            )
        if config.reparam == "replora":
            self.lora_reparam[name] = Reparam(config.rank, base.weight)
        if config.dora:
            out = base.weight.shape[0]
            shape = (out,) if isinstance(base, nn.Linear) else (1, out) + (1,) * (base.weight.dim() - 2)
            self.lora_magnitude_vector[name] = Magnitude(shape, base.weight)
        if config.init == "pissa":
            self.pissa_factors[name] = InitialFactors(self.lora_A[name].weight, self.lora_B[name].weight)
        if config.init == "goat":
            rows = torch.empty(config.rank, base.weight.shape[1], dtype=base.weight.dtype, device=base.weight.device)
            self.pissa_factors[name] = InitialFactors(rows, rows.new_empty(base.weight.shape[0], config.rank))
        self.adapters[name] = config
        self.scales[name] = config.scale_for(base.weight[0].numel())
        self.reset_adapter(name)

    def reset_adapter(self, name: str) -> None:
        """Adapter ``name`` is the identity again, as its ``init`` says (module doc): ``"kaiming"``: ``A``
        Kaiming-uniform (``a = sqrt(5)``), ``B = 0``, router Kaiming-uniform (the draws in that order, expert by
        expert); ``"pissa"``: the base weight put back, then its SVD; ``"goat"``: the base weight put back, its SVD's
        segments, then the router Kaiming-uniform (GOAT's layer does not start as the identity). Then DoRA's
        magnitude: the row norms of ``W + scale · B A``."""
        config = self.adapters[name]
        if config.init == "pissa":
            self._restore_base(name)
            self._pissa(name)
        elif config.init == "goat":
            self._restore_base(name)
            self._goat(name)
            nn.init.kaiming_uniform_(self.lora_route[name].weight, a=math.sqrt(5))  # the router as a linear layer's
        else:
            self._kaiming(name)
        if config.dora:
            with torch.no_grad():
                magnitude = self.lora_magnitude_vector[name].weight
                magnitude.copy_(self._row_norm(self._lora_weight(name)).reshape(magnitude.shape))

    def _kaiming(self, name: str) -> None:
        for module in self.lora_A[name].modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
        for module in self.lora_B[name].modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                nn.init.zeros_(module.weight)
        if name in self.lora_route:
            nn.init.kaiming_uniform_(self.lora_route[name].weight, a=math.sqrt(5))
        for module in self.lora_reparam[name].children() if name in self.lora_reparam else ():
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))

    def _pissa(self, name: str) -> None:
        """PiSSA (module doc): ``A``, ``B`` from the top-r SVD of ``W``, kept in ``pissa_factors``, and
        ``W ← W − scale · B A`` (the products in PEFT's order, so float32 weights give PEFT's factors)."""
        config, weight, scale = self.adapters[name], self.base_layer.weight, self.scales[name]
        lora_a, lora_b = self.lora_A[name].weight, self.lora_B[name].weight
        flat = weight.detach().flatten(1).to(torch.promote_types(weight.dtype, torch.float32))
        u, singular, vh = torch.linalg.svd(flat, full_matrices=False)
        root = (singular[: config.rank] / scale).sqrt()
        a, b = root[:, None] * vh[: config.rank], u[:, : config.rank] * root
        with torch.no_grad():
            lora_a.copy_(a.reshape(lora_a.shape))
            lora_b.copy_(b.reshape(lora_b.shape))
            self.pissa_factors[name].A.copy_(lora_a)
            self.pissa_factors[name].B.copy_(lora_b)
            weight.copy_((flat - scale * b @ a).reshape(weight.shape))

    def _goat(self, name: str) -> None:
        """GOAT's init (module doc): expert ``e`` from the first ``r_e`` singular triplets of segment ``e`` of ``W``'s
        SVD, ``S / (scale ρ)`` split as square roots; the stacked factors kept in ``pissa_factors`` and
        ``W ← W − scale · Σ_e B_e A_e / k``."""
        config, weight, scale = self.adapters[name], self.base_layer.weight, self.scales[name]
        flat = weight.detach().to(torch.promote_types(weight.dtype, torch.float32))
        u, singular, vh = torch.linalg.svd(flat, full_matrices=False)
        per_expert, segment = config.rank // config.experts, len(singular) // config.experts
        chosen = torch.cat([torch.arange(e * segment, e * segment + per_expert) for e in range(config.experts)])
        root = (singular[chosen] / (scale * GOAT_RHO)).sqrt()
        a, b = root[:, None] * vh[chosen], u[:, chosen] * root
        with torch.no_grad():
            for e, (a_e, b_e) in enumerate(zip(self.lora_A[name], self.lora_B[name])):
                a_e.weight.copy_(a[e * per_expert : (e + 1) * per_expert])
                b_e.weight.copy_(b[:, e * per_expert : (e + 1) * per_expert])
            self.pissa_factors[name].A.copy_(a)
            self.pissa_factors[name].B.copy_(b)
            weight.copy_(flat - scale * (b @ a) / config.experts)

    def init_from_gradient(self, name: str, gradient: torch.Tensor, gamma: float) -> None:
        """LoRA-One (module doc): ``A``, ``B`` from the top-r SVD of ``−gradient`` (the loss's gradient with respect to
        the base weight, its shape), scaled by ``1 / sqrt(γ s₁)``; the base weight is left as it is. DoRA's magnitude
        is set again to the row norms of ``W + scale · B A`` (as the authors' code does)."""
        why = self.gradient_error(name, gradient)
        if why:
            raise UserError(f"LoRA-One cannot initialise this layer: {why}")
        config, weight = self.adapters[name], self.base_layer.weight
        flat = -gradient.detach().flatten(1).to(torch.promote_types(weight.dtype, torch.float32))
        u, singular, vh = torch.linalg.svd(flat, full_matrices=False)
        root = (singular[: config.rank] / singular[0]).sqrt() / math.sqrt(gamma)
        lora_a, lora_b = self.lora_A[name].weight, self.lora_B[name].weight
        with torch.no_grad():
            lora_a.copy_((root[:, None] * vh[: config.rank]).reshape(lora_a.shape))
            lora_b.copy_((u[:, : config.rank] * root).reshape(lora_b.shape))
            if config.dora:
                magnitude = self.lora_magnitude_vector[name].weight
                magnitude.copy_(self._row_norm(self._lora_weight(name)).reshape(magnitude.shape))

    def gradient_error(self, name: str, gradient: torch.Tensor) -> str | None:
        """Why `init_from_gradient` cannot take ``gradient`` for adapter ``name`` — None when it can."""
        weight, rank = self.base_layer.weight, self.adapters[name].rank
        if tuple(gradient.shape) != tuple(weight.shape):
            return f"the gradient has shape {tuple(gradient.shape)}, the weight {tuple(weight.shape)}"
        if not gradient.abs().max() > 0:
            return "the loss does not depend on its weight (zero gradient); leave it out of the targets"
        if rank > min(weight.shape[0], weight[0].numel()):
            return f"rank {rank} is above the {tuple(weight.shape)} weight's number of singular values"
        return None

    def _restore_base(self, name: str) -> None:
        """``W ← W + scale · B₀ A₀``: the base weight PiSSA adapter ``name`` found (zero before its first init)."""
        initial, share = self.pissa_factors[name], 1 / (self.adapters[name].experts or 1)  # GOAT took 1 / k of it
        with torch.no_grad():
            weight = self.base_layer.weight
            weight.add_(share * self._product(name, initial.A, initial.B).to(weight.dtype))

    def set_adapter(self, names: str | Sequence[str]) -> None:
        """Make ``names`` (one name or several; ``()`` for none: the base layer alone) the active adapters. Unlike
        PEFT's, ``requires_grad`` is left as it is: the method chooses what trains."""
        names = (names,) if isinstance(names, str) else tuple(names)
        unknown = [n for n in names if n not in self.adapters]
        if unknown:
            raise UserError(f"no LoRA adapter named {unknown}; this layer has {list(self.adapters) or 'none'}")
        self.active_adapters = names

    def delete_adapter(self, name: str) -> None:
        """Remove adapter ``name`` and its parameters (it leaves the active adapters); a merged one is refused."""
        if name not in self.adapters:
            raise UserError(f"no LoRA adapter named '{name}'; this layer has {list(self.adapters) or 'none'}")
        if name in self.merged_adapters:
            raise UserError(f"LoRA adapter '{name}' is merged into the base weight; unmerge it first")
        if self.adapters[name].init in ("pissa", "goat"):
            self._restore_base(name)
        for container in (self.lora_dropout, self.pissa_factors, *(getattr(self, part) for part in CONTAINERS)):
            if name in container:
                del container[name]
        del self.adapters[name], self.scales[name]
        self.balance_loss.pop(name, None)
        self.active_adapters = tuple(n for n in self.active_adapters if n != name)

    def adapter_parameters(self, name: str | None = None) -> dict[str, nn.Parameter]:
        """Adapter ``name``'s parameters (None: every adapter's) by their file names inside the layer, the adapter
        name left out as in PEFT's files (``lora_A.weight``, ``lora_route.weight``, ``lora_A.0.weight``,
        ``lora_magnitude_vector``), in the order of `CONTAINERS`. With None, names of several adapters keep theirs
        (``lora_magnitude_vector.<adapter>.weight``)."""
        out = {}
        for part in CONTAINERS:
            for adapter, module in getattr(self, part).items():
                if name is None or adapter == name:
                    keep = "" if name is not None else f".{adapter}"
                    out.update({f"{part}{keep}.{key}": p for key, p in module.named_parameters()})
        if name is not None and name in self.lora_magnitude_vector:  # PEFT's file name of DoRA's magnitude
            out["lora_magnitude_vector"] = out.pop("lora_magnitude_vector.weight")
        return out

    # ---- forward ------------------------------------------------------------------------------------------

    def update(self, name: str, x: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
        """Adapter ``name``'s contribution to the output (the module docstring's formula of its kind); ``base``: the
        base layer's output ``W x + b``, if at hand (DoRA reuses it)."""
        config, scale = self.adapters[name], self.scales[name]
        a, b, dropout = self.lora_A[name], self.lora_B[name], self.lora_dropout[name]
        if config.dora:
            return self._dora_update(name, x, base)
        if config.kind == "lora":
            return self._factor_forward(name, dropout(x)) * scale
        gates = torch.softmax(self.lora_route[name](x), dim=-1)
        if config.kind == "hlora":
            gates = gates.repeat_interleave(config.rank // config.experts, dim=-1)
            return b(gates * a(dropout(x))) * scale
        if config.kind == "goat":
            gates = self._top_k_gates(name, gates)
        dropped, total = dropout(x), 0
        for expert, (a_e, b_e) in enumerate(zip(a, b)):  # MoELoRA and GOAT: one matmul pair per expert
            total = total + gates[..., expert : expert + 1] * b_e(a_e(dropped))
        return total * scale

    def _top_k_gates(self, name: str, gates: torch.Tensor) -> torch.Tensor:
        """GOAT's routing weights: the ``top_k`` largest router probabilities renormalised to sum to 1, the others 0
        (shape of ``gates``, ``(..., k)``); while training with gradients, keeps the load-balancing loss
        ``k · Σ_e f_e P_e`` in `balance_loss` until the step takes it (`take_balance_loss`)."""
        config = self.adapters[name]
        chosen, experts = gates.topk(config.top_k, dim=-1)
        routed = torch.zeros_like(gates).scatter(-1, experts, chosen / chosen.sum(dim=-1, keepdim=True))
        if not (self.training and torch.is_grad_enabled()):
            return routed
        flat = gates.reshape(-1, config.experts)
        counts = torch.bincount(experts.reshape(-1), minlength=config.experts).to(gates.dtype)
        self.balance_loss[name] = config.experts * (counts / len(flat) * flat.mean(dim=0)).sum()
        return routed

    def take_balance_loss(self) -> torch.Tensor | float:
        """The sum of the GOAT load-balancing losses the last training forward kept (0 if none), which the layer then
        forgets (a kept graph would stop the model from being copied)."""
        total = sum(self.balance_loss.values(), 0.0)
        self.balance_loss.clear()
        return total

    def _dora_update(self, name: str, x: torch.Tensor, base: torch.Tensor | None) -> torch.Tensor:
        """PEFT's DoRA term ``(f − 1) ⊙ W dropout(x) + f ⊙ scale · B A dropout(x)``, ``f = m / ||W + scale·B A||``
        detached; ``W x`` is taken from ``base`` (minus the bias) while the dropout is inactive."""
        layer = self.base_layer
        dropped = self.lora_dropout[name](x)
        factor = self._dora_factor(name, self._lora_weight(name))
        channel = (1, -1) + (1,) * (x.dim() - 2) if isinstance(layer, (nn.Conv1d, nn.Conv2d)) else (-1,)
        if base is None or self._dropout_acts(name):
            if isinstance(layer, nn.Linear):
                base = F.linear(dropped, layer.weight)
            else:
                base = layer._conv_forward(dropped, layer.weight, None)
        elif layer.bias is not None:
            base = base - layer.bias.view(channel)
        factor = factor.view(channel)
        lora = self._factor_forward(name, dropped)
        return (factor - 1) * base + factor * lora * self.scales[name]

    def _factor_weights(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(A, B)`` plain adapter ``name`` computes with: its factors, or RepLoRA's MLP of them."""
        a, b = self.lora_A[name].weight, self.lora_B[name].weight
        return self.lora_reparam[name].factors(a, b) if name in self.lora_reparam else (a, b)

    def _factor_forward(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """``B (A x)`` of plain adapter ``name`` (unscaled), by the factors' own layers (their convolution settings)."""
        if name not in self.lora_reparam:
            return self.lora_B[name](self.lora_A[name](x))
        a, b = self._factor_weights(name)
        if isinstance(self.base_layer, nn.Linear):
            return F.linear(F.linear(x, a), b)
        return self.lora_B[name]._conv_forward(self.lora_A[name]._conv_forward(x, a, None), b, None)

    def _acting(self) -> list[str]:
        """The active adapters not merged into the base weight: those the forward adds."""
        return [n for n in self.active_adapters if n not in self.merged_adapters]

    def _dropout_acts(self, name: str) -> bool:
        return self.training and isinstance(self.lora_dropout[name], nn.Dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acting = self._acting()
        by_weight = [n for n in acting if self.adapters[n].compute == "weight" and not self._dropout_acts(n)]
        if by_weight:
            weight = self.base_layer.weight
            for name in by_weight:
                weight = weight + self.delta_weight(name)
            if isinstance(self.base_layer, nn.Linear):
                out = F.linear(x, weight, self.base_layer.bias)
            else:
                out = self.base_layer._conv_forward(x, weight, self.base_layer.bias)
        else:
            out = self.base_layer(x)
        base = None if by_weight else out
        for name in acting:
            if name not in by_weight:
                out = out + self.update(name, x, base)
        if self.perturbation is not None:
            if isinstance(self.base_layer, nn.Linear):
                out = out + F.linear(x, self.perturbation)
            else:
                out = out + self.base_layer._conv_forward(x, self.perturbation, None)
        return out

    @property
    def weight(self) -> torch.Tensor:
        """The weight the layer computes with, ``W + Σ ΔW`` over the acting adapters, for models that read
        ``module.weight`` and call ``F.linear`` / ``F.conv*`` themselves (braindecode's ``Labram`` does so for its
        fused ``qkv``): the update then acts in weight space there. An input-dependent update (routed experts) or
        active adapter dropout cannot act in weight space: reading the weight then is refused. Flat-LoRA's
        ``perturbation``, while set, is added too."""
        weight = self.base_layer.weight
        for name in self._acting():
            if self.adapters[name].routed or self._dropout_acts(name):
                raise UserError(
                    f"the model reads the weight of a {type(self).__name__} directly (it calls F.linear or F.conv "
                    "itself), where an input-dependent update or adapter dropout cannot act; set the LoRA dropout to 0 "
                    "for this target, or leave it out of the targets"
                )
            weight = weight + self.delta_weight(name)
        return weight if self.perturbation is None else weight + self.perturbation

    @property
    def bias(self) -> torch.Tensor | None:
        """The base layer's bias (LoRA adds none)."""
        return self.base_layer.bias

    # ---- single-adapter views -----------------------------------------------------------------------------

    def _only(self) -> str:
        if len(self.active_adapters) != 1:
            raise UserError(
                f"this LoRA layer has active adapters {list(self.active_adapters)}; name one (layer.adapters[name])"
            )
        return self.active_adapters[0]

    @property
    def rank(self) -> int:
        return self.adapters[self._only()].rank

    @property
    def scale(self) -> float:
        return self.scales[self._only()]

    @property
    def compute(self) -> str:
        return self.adapters[self._only()].compute

    @property
    def merged_adapters(self) -> list[str]:
        """The adapters folded into the base weight, in merge order."""
        return list(self._merged_deltas)

    @property
    def merged(self) -> bool:
        """Whether any adapter is folded into the base weight (PEFT's ``merged``)."""
        return bool(self.merged_adapters)

    # ---- merging ------------------------------------------------------------------------------------------

    def delta_weight(self, name: str | None = None) -> torch.Tensor:
        """``ΔW`` of plain adapter ``name`` (None: the one active adapter) in the base weight's shape (what `merge`
        adds): ``scale · B A``, or with DoRA ``f ⊙ (W + scale · B A) − W`` (``f`` per output row, of the current base
        weight)."""
        name = self._only() if name is None else name
        lora = self._lora_weight(name)
        if not self.adapters[name].dora:
            return lora
        weight = self.base_layer.weight
        factor = self._dora_factor(name, lora).view((-1,) + (1,) * (weight.dim() - 1))
        return factor * (weight + lora) - weight

    def _product(self, name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``scale · B A`` of factors ``a`` (``lora_A``'s shape) and ``b`` of adapter ``name``, shaped as ``W``."""
        return (b.flatten(1) @ a.flatten(1)).reshape(self.base_layer.weight.shape) * self.scales[name]

    def _lora_weight(self, name: str) -> torch.Tensor:
        """``scale · B A`` of plain adapter ``name``."""
        return self._product(name, *self._factor_weights(name))

    def _row_norm(self, lora_weight: torch.Tensor) -> torch.Tensor:
        """``||W + ΔW||`` of each output unit (over inputs and kernel), detached: shape ``(out,)``."""
        return (self.base_layer.weight + lora_weight.detach()).flatten(1).norm(dim=1).detach()

    def _dora_factor(self, name: str, lora_weight: torch.Tensor) -> torch.Tensor:
        """DoRA's ``f = m / ||W + scale · B A||`` per output unit, shape ``(out,)``."""
        return self.lora_magnitude_vector[name].weight.flatten() / self._row_norm(lora_weight)

    def merge_error(self, names: Sequence[str] | None = None) -> str | None:
        """Why `merge` cannot fold ``names`` (None: the active adapters not merged yet) — None when it can."""
        names = [n for n in (self.active_adapters if names is None else names) if n not in self.merged_adapters]
        for name in names:
            if name not in self.adapters:
                return f"it has no LoRA adapter named '{name}' (it has {list(self.adapters) or 'none'})"
            if self.adapters[name].routed:
                return (
                    f"its {self.adapters[name].kind} adapter '{name}' computes an input-dependent update, which no "
                    "fixed weight represents; keep it unmerged (the model runs as it is)"
                )
        if names and parametrize.is_parametrized(self.base_layer, "weight"):
            kinds = ", ".join(type(p).__name__ for p in self.base_layer.parametrizations.weight)
            return (
                f"its base weight is computed by a parametrization LoRA did not create ({kinds}), into which ΔW cannot "
                "be folded exactly; leave this module out of the targets, or fold that parametrization first "
                "(torch.nn.utils.parametrize.remove_parametrizations(module, 'weight', leave_parametrized=True))"
            )
        return None

    def merge(self, adapter: str | Sequence[str] | None = None) -> None:
        """``W ← W + ΔW`` of adapter(s) ``adapter`` (None: the active ones), each once (PEFT's ``merge``); merged
        adapters no longer add their update in the forward. Every ``ΔW`` is computed from the weight before this
        merge (as the forward computes them) and kept for `unmerge` (a weight-sized tensor per merged adapter, until
        `unmerge`; `workbench.adaptation.lora.merge` with ``unload=True`` drops the layer and it)."""
        names = self.active_adapters if adapter is None else (adapter,) if isinstance(adapter, str) else adapter
        why = self.merge_error(names)
        if why:
            raise UserError(f"cannot merge this LoRA layer: {why}")
        with torch.no_grad():
            weight = self.base_layer.weight
            new = [n for n in dict.fromkeys(names) if n not in self._merged_deltas]
            deltas = {n: self.delta_weight(n).to(weight.dtype) for n in new}
            for name, delta in deltas.items():
                weight.add_(delta)
                self._merged_deltas[name] = delta

    def unmerge(self) -> None:
        """``W ← W − ΔW`` of every merged adapter, last merged first, with the ``ΔW`` `merge` added (PEFT's
        ``unmerge``; the base weight again up to rounding)."""
        with torch.no_grad():
            weight = self.base_layer.weight
            while self._merged_deltas:
                weight.sub_(self._merged_deltas.pop(next(reversed(self._merged_deltas))).to(weight))

    def extra_repr(self) -> str:
        adapters = ", ".join(
            f"{n}: {c.kind} r={c.rank} scale={self.scales[n]:g}"
            + (f" init={c.init}" if c.init != "kaiming" else "")
            + (" dora" if c.dora else "")
            + (f" reparam={c.reparam}" if c.reparam != "none" else "")
            for n, c in self.adapters.items()
        )
        return f"adapters={{{adapters}}}, active={list(self.active_adapters)}, merged={self.merged_adapters}"


def _stock_class(module: nn.Module) -> type:
    """The module's class, seen through the subclass ``torch.nn.utils.parametrize`` makes of a parametrized one."""
    cls = type(module)
    return cls.__bases__[0] if parametrize.is_parametrized(module) else cls


def _factors(base_layer: nn.Module, rank: int) -> tuple[nn.Module, nn.Module]:
    """Uninitialised ``(lora_A, lora_B)`` for ``base_layer`` (no random draw: `LoraLayer.reset_adapter` draws)."""
    weight = base_layer.weight
    factory = {"dtype": weight.dtype, "device": weight.device}
    if isinstance(base_layer, nn.Linear):
        return (
            skip_init(nn.Linear, base_layer.in_features, rank, bias=False, **factory),
            skip_init(nn.Linear, rank, base_layer.out_features, bias=False, **factory),
        )
    conv = nn.Conv1d if isinstance(base_layer, nn.Conv1d) else nn.Conv2d
    lora_a = skip_init(
        conv,
        base_layer.in_channels,
        rank,
        base_layer.kernel_size,
        stride=base_layer.stride,
        padding=base_layer.padding,
        dilation=base_layer.dilation,
        padding_mode=base_layer.padding_mode,
        bias=False,
        **factory,
    )
    return lora_a, skip_init(conv, rank, base_layer.out_channels, 1, bias=False, **factory)

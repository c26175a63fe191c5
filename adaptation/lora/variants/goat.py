"""GOAT (``kind="goat"``): MoELoRA's experts, each token sent to its top-k, with an SVD init and a load-balancing loss.

Paper: Fan et al., "Make LoRA Great Again: Boosting LoRA with Adaptive Singular Values and Mixture-of-Experts
Optimization Alignment", ICML 2025 (code: Facico/GOAT-PEFT, ``goat/peta/src/goat/layer.py``)::

    goat:     scale · Σ_{e ∈ top_k(g)} (g_e / Σ_{top_k} g) · B_e (A_e (dropout(x))),      g = softmax(R x)

(every expert is computed for every token and the others weighed 0: the authors' function, simpler on small models).

* scale per expert: ``alpha / r_e`` (``r_e = r / k``) or, with ``scaling="goat"``, ``sqrt(3 η n_in / r_e)``;
* ``init="goat"`` (the authors' ``init_type="goat"``): with ``U S Vᵀ`` the SVD of ``W`` (``n`` singular values) cut
  into ``k`` segments of ``n // k``, expert ``e`` takes the first ``r_e`` triplets of segment ``e``, ``S_e`` divided
  by ``scale · ρ``: ``A_e = sqrt(S_e / (scale ρ)) V_eᵀ``, ``B_e = U_e sqrt(S_e / (scale ρ))``, and the base weight
  becomes ``W − scale · Σ_e B_e A_e / k`` (``init_cof = 1 / k``; the layer does not start as ``W``). The stacked
  initial factors are kept as PiSSA's (``pissa_factors[name]``) to put ``W`` back on delete; then the router;
* each training forward keeps the router's load-balancing loss ``k · Σ_e f_e P_e`` (``f_e`` the share of tokens sent
  to ``e``, counting every top-k choice, ``P_e`` the mean router probability) in the layer's ``balance_loss[name]``;
  the ``lora`` method adds it times ``goat_aux`` (the authors' 1e-3) to the task's loss.
"""

from __future__ import annotations

import math

import torch
from workbench.adaptation.lora.variants.base import promoted
from workbench.adaptation.lora.variants.pissa import InitialFactors, check_rank, check_residual, restore_base
from workbench.adaptation.lora.variants.routed import MoELoRA

from workbench.core.errors import UserError

#: GOAT's constants as its authors' code sets them: singular values divided by ``scale · ρ`` before they become the
#: experts' factors; ``η`` of the derived scale (their ``ETA``, 1.0 in every released script).
GOAT_RHO = 10.0
GOAT_ETA = 1.0


class GOAT(MoELoRA):
    """Top-k routed experts, their SVD init and balance loss (module doc)."""

    name = "goat"
    free = ("init", "scaling")  # GOAT's experts take GOAT's init and every scaling

    @classmethod
    def check(cls, config) -> None:
        goat = config.kind == "goat"
        if (config.init == "goat" or config.scaling == "goat") and not goat:
            raise UserError(
                f"LoRA init/scaling 'goat' belongs to GOAT's routed experts (kind='goat'), not to {config.kind} "
                "adapters"
            )
        if goat and config.init not in ("kaiming", "goat"):
            raise UserError(f"GOAT's experts start as 'kaiming' or 'goat', not init={config.init!r}")
        super().check(config)
        if not goat:
            return
        top_k = config.top_k
        top_k_ok = isinstance(top_k, int) and not isinstance(top_k, bool) and 1 <= top_k <= config.experts
        if not top_k_ok:
            raise UserError(f"GOAT's top_k must be an integer in 1..experts ({config.experts}), got {top_k!r}")

    @classmethod
    def check_fits(cls, base, config) -> None:
        super().check_fits(base, config)
        if config.init == "goat":
            segment = min(base.weight.shape) // config.experts
            if config.rank // config.experts > segment:
                raise UserError(
                    f"GOAT cuts the {min(base.weight.shape)} singular values of the {tuple(base.weight.shape)} base "
                    f"weight into {config.experts} segments of {segment}: an expert's rank "
                    f"{config.rank // config.experts} does not fit; lower the rank or the experts"
                )
            check_rank(base, config, "base weight")
            check_residual(base, config)

    @classmethod
    def method_arguments(cls, options) -> dict:
        """``--init goat``: GOAT's experts (``--experts`` dividing ``--rank``, ``--top-k`` in 1..experts), computed the
        input way (they depend on the input)."""
        if options.get("init") != "goat":
            return {}
        rank, experts, top_k = (options[name] for name in ("rank", "experts", "top_k"))
        if experts < 1 or rank % experts:
            raise UserError(f"method 'lora': --init goat splits --rank {rank} among --experts {experts}: give "
                            "--experts that divides --rank")  # fmt: skip
        if not 1 <= top_k <= experts:
            raise UserError(f"method 'lora': --top-k {top_k} must be in 1..{experts} (--experts): the experts each "
                            "token is sent to")  # fmt: skip
        return {"kind": "goat", "experts": experts, "compute": "input"}

    @classmethod
    def aux_loss_weight(cls, options) -> float | None:
        return options["goat_aux"] if options.get("init") == "goat" else None

    def scale(self, config, fan_in, scale: float) -> float:
        if config.scaling != "goat":
            return super().scale(config, fan_in, scale)
        if fan_in is None:
            raise UserError("GOAT's scale sqrt(3 eta n_in / r_e) depends on the layer: use scale_for(n_in)")
        return math.sqrt(3 * GOAT_ETA * fan_in / (config.rank // config.experts))

    def label(self, config) -> str:
        return "init=goat" if config.init == "goat" else ""

    def add(self, layer, name, config) -> None:
        super().add(layer, name, config)
        if config.init == "goat":
            weight = layer.base_layer.weight
            rows = torch.empty(config.rank, weight.shape[1], dtype=weight.dtype, device=weight.device)
            layer.part("pissa_factors")[name] = InitialFactors(rows, rows.new_empty(weight.shape[0], config.rank))

    def init_factors(self, layer, name) -> bool:
        """``init="goat"``: the base weight put back, then the experts from its SVD's segments and ``W ← W − scale ·
        Σ_e B_e A_e / k``."""
        config = layer.adapters[name]
        if config.init != "goat":
            return False
        restore_base(layer, name, 1 / config.experts)
        weight, scale = layer.base_layer.weight, layer.scales[name]
        flat = promoted(weight.detach())
        u, singular, vh = torch.linalg.svd(flat, full_matrices=False)
        per_expert, segment = config.rank // config.experts, len(singular) // config.experts
        chosen = torch.cat([torch.arange(e * segment, e * segment + per_expert) for e in range(config.experts)])
        root = (singular[chosen] / (scale * GOAT_RHO)).sqrt()
        a, b = root[:, None] * vh[chosen], u[:, chosen] * root
        with torch.no_grad():
            for e, (a_e, b_e) in enumerate(zip(layer.lora_A[name], layer.lora_B[name])):
                a_e.weight.copy_(a[e * per_expert : (e + 1) * per_expert])
                b_e.weight.copy_(b[:, e * per_expert : (e + 1) * per_expert])
            layer.pissa_factors[name].A.copy_(a)
            layer.pissa_factors[name].B.copy_(b)
            weight.copy_(flat - scale * (b @ a) / config.experts)
        return True

    def delete(self, layer, name) -> None:
        if layer.adapters[name].init == "goat":
            restore_base(layer, name, 1 / layer.adapters[name].experts)

    def gates(self, layer, name, x):
        """The ``top_k`` largest router probabilities renormalised to sum to 1, the others 0 (``(..., k)``); while
        training with gradients, keeps the load-balancing loss ``k · Σ_e f_e P_e`` in ``balance_loss[name]`` until
        the step takes it (`LoraLayer.take_balance_loss`)."""
        config, gates = layer.adapters[name], super().gates(layer, name, x)
        chosen, experts = gates.topk(config.top_k, dim=-1)
        routed = torch.zeros_like(gates).scatter(-1, experts, chosen / chosen.sum(dim=-1, keepdim=True))
        if not (layer.training and torch.is_grad_enabled()):
            return routed
        flat = gates.reshape(-1, config.experts)
        counts = torch.bincount(experts.reshape(-1), minlength=config.experts).to(gates.dtype)
        layer.balance_loss[name] = config.experts * (counts / len(flat) * flat.mean(dim=0)).sum()
        return routed

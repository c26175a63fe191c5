"""H-Tuning's mixed-order gradient: zeroth-order over the full batch, backprop over a few samples, mixed.

Paper: "H-Tuning: Toward Low-Cost and Efficient ECG-based Cardiovascular Disease Detection with Pre-Trained
Models", ICML 2025 (seed 000 of this project; see /work/shared/METHODS.md, "H-Tuning").

Trainable: LoRA (r = 16, scaling 1, `workbench.adaptation.lora`) on the model's declared target groups (for the
ECG models: every conv, the merged qkv, the attention output, the FFN and the first head layer), every bias, and
the model's declared head (the last classifier). The trainable parameters split in two groups: the *mixed* group
``θ`` (LoRA factors and the body's biases) and the *head* ``φ`` (the parameters of the declared head module).
One step on a batch ``(x_i, y_i), i = 1..n``:

1. zeroth order (SPSA / MeZO), full batch, no autograd graph: draw ``z ~ N(0, I)`` (same shape as ``θ``) from
   ``seed``; ``L± = L(θ ± eps·z; x_1..n)``; ``g_ZO = (L+ − L−) / (2·eps) · z``. ``z`` is regenerated from the seed
   each time it is needed, one tensor at a time, never stored whole. ``E_z[g_ZO] = ∇_θ L + O(eps²)``;
2. first order: ``g_FO = ∇_θ L(θ; x_1..bp_batch)`` by ordinary backprop on the first ``bp_batch`` samples only
   (the loader shuffles, so they are a random sub-batch) — activation memory of ``bp_batch``, not ``n``, samples;
3. mix, norm-matched: ``g = c·g_FO + (1 − c)·‖g_FO‖·g_ZO / ‖g_ZO‖``. The authors' code matches norms per
   parameter tensor (``norm_match="tensor"``, default); ``"global"`` matches over the whole group. Either way
   ``(2c − 1)·‖g_FO‖ ≤ ‖g‖ ≤ ‖g_FO‖`` (triangle inequality): the ZO term sets a direction, never the scale;
4. the head gets the exact full-batch gradient ``∇_φ L(φ; f(x_1..n))`` from features ``f`` (the model's declared
   embedding hook, what its head reads) computed without a graph (detached) at the restored ``θ``. The authors'
   code takes these features from the ``θ − eps·z`` pass to save a forward; here they come from ``θ`` itself, so
   the head gradient is exact.

The results go into each parameter's ``.grad``; any optimizer (the paper: AdamW, lr 2e-3, 1 % warm-up, linear
decay) then steps as usual. By default the mixed group is restored bit-exactly after the ZO passes from a copy
of its values (an adapter-sized copy); ``exact_restore=False`` restores MeZO-style by adding ``+eps·z`` back
(no copy, but rounding leaves ~1 ulp changes).

The loss must be deterministic in ``θ`` for ``L+ − L−`` to measure ``θ``'s effect: no dropout, no batch
statistics in training mode (the ECG models of `models.ecg` use GroupNorm/LayerNorm and no dropout). The model
must declare (`workbench.core.model.ModelSpec`) LoRA target groups, a head and an embedding hook with
``model(x) == head(embedding(x))``.

Shapes:
    batch_x ``ecg (batch, 12, n_samples)`` (any model input with the batch first), batch_y ``(batch, n_classes)``
    multi-hot; ``loss_fn(logits (batch, n_classes), labels) → ()`` mean over the batch.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from workbench.adaptation import lora
from workbench.adaptation.lora import method as lora_method

from workbench.core.errors import UserError
from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.model import require
from workbench.core.options import Option
from workbench.core.registry import methods

NORM_MATCHES = ("tensor", "global")
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _perturb(params: Sequence[nn.Parameter], seed: int, scale: float, backup: Sequence[torch.Tensor] | None) -> None:
    """``θ ← backup + scale·z`` (or ``θ += scale·z`` without a backup), ``z`` regenerated from ``seed``."""
    generator = torch.Generator(device=params[0].device).manual_seed(seed)
    with torch.no_grad():
        for index, p in enumerate(params):
            z = torch.randn(p.shape, generator=generator, dtype=p.dtype, device=p.device)
            if backup is None:
                p.add_(z, alpha=scale)
            else:
                torch.add(backup[index], z, alpha=scale, out=p)


def _z(params: Sequence[nn.Parameter], seed: int):
    """Yield ``z`` for each parameter, regenerated from ``seed`` in the order `_perturb` draws it."""
    generator = torch.Generator(device=params[0].device).manual_seed(seed)
    for p in params:
        yield torch.randn(p.shape, generator=generator, dtype=p.dtype, device=p.device)


def _chunks(n: int, chunk: int | None) -> list[slice]:
    """Consecutive slices of at most ``chunk`` records covering ``range(n)`` (one slice when ``chunk`` is None)."""
    size = n if not chunk else chunk
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def batch_loss(
    model: nn.Module, loss_fn: LossFn, batch_x: torch.Tensor, batch_y: torch.Tensor, chunk: int | None = None
) -> float:
    """``loss_fn(model(batch_x), batch_y)`` without a graph, the forward run ``chunk`` records at a time.

    Chunks are weighted by their share of the batch, which gives the full-batch value (up to rounding) when
    ``loss_fn`` is a mean over records; activation memory is then that of ``chunk`` records, not the batch's.
    """
    n = len(batch_x)
    with torch.inference_mode():
        return sum(
            float(loss_fn(model(batch_x[part]), batch_y[part])) * (part.stop - part.start) / n
            for part in _chunks(n, chunk)
        )


def zeroth_order_projection(
    model: nn.Module,
    params: Sequence[nn.Parameter],
    loss_fn: LossFn,
    batch_x: torch.Tensor,
    batch_y: torch.Tensor,
    *,
    eps: float = 1e-3,
    seed: int = 0,
    exact_restore: bool = True,
    chunk: int | None = None,
) -> tuple[float, float, float]:
    """Two-sided SPSA on ``params``: returns ``((L+ − L−) / (2 eps), L+, L−)``; ``g_ZO = first · z(seed)``.

    ``params`` are back at their values on return (bit-exact with ``exact_restore``). ``chunk``: see `batch_loss`.
    """
    backup = [p.detach().clone() for p in params] if exact_restore else None
    try:
        _perturb(params, seed, eps, backup)
        loss_plus = batch_loss(model, loss_fn, batch_x, batch_y, chunk)
        _perturb(params, seed, -eps if backup is not None else -2 * eps, backup)
        loss_minus = batch_loss(model, loss_fn, batch_x, batch_y, chunk)
    finally:
        if backup is not None:
            with torch.no_grad():
                for p, value in zip(params, backup):
                    p.copy_(value)
    if backup is None:
        _perturb(params, seed, eps, None)
    return (loss_plus - loss_minus) / (2 * eps), loss_plus, loss_minus


def zeroth_order_gradient(
    model: nn.Module,
    params: Sequence[nn.Parameter],
    loss_fn: LossFn,
    batch_x: torch.Tensor,
    batch_y: torch.Tensor,
    *,
    eps: float = 1e-3,
    seed: int = 0,
) -> list[torch.Tensor]:
    """The SPSA estimate ``g_ZO = (L+ − L−) / (2 eps) · z`` as tensors (for checks; the step never stores it)."""
    projected, _, _ = zeroth_order_projection(model, params, loss_fn, batch_x, batch_y, eps=eps, seed=seed)
    return [projected * z for z in _z(params, seed)]


def mixed_order_gradients(
    model: nn.Module,
    lora_params: Sequence[nn.Parameter],
    head_params: Sequence[nn.Parameter],
    loss_fn: LossFn,
    batch_x: torch.Tensor,
    batch_y: torch.Tensor,
    *,
    eps: float = 1e-3,
    bp_batch: int = 2,
    c: float = 0.9,
    seed: int = 0,
    norm_match: str = "tensor",
    exact_restore: bool = True,
    features: Callable[[torch.Tensor], torch.Tensor] | None = None,
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    chunk: int | None = None,
) -> dict[str, float]:
    """One H-Tuning gradient (see the module docstring); writes ``.grad`` of ``lora_params`` and ``head_params``.

    Args:
        model: maps ``batch_x`` to logits; must be deterministic (no dropout).
        lora_params: the mixed group ``θ`` (LoRA factors and the body's trainable biases).
        head_params: the head ``φ`` (last classifier weight and bias), disjoint from ``θ``.
        loss_fn: ``loss_fn(logits, labels)``, the batch mean (e.g. ``F.binary_cross_entropy_with_logits``).
        eps: SPSA perturbation size (default 1e-3, the paper's).
        bp_batch: samples backpropagated for ``g_FO`` (default 2, the paper's): the first ``bp_batch`` of the batch.
        c: weight of ``g_FO`` in the mix, in [0, 1] (default 0.9; the paper tunes it in {0.85, 0.9, 0.95, 0.99}).
        seed: seed of ``z``; give each step its own (e.g. from the run seed and the step index).
        norm_match: ``"tensor"`` (per parameter tensor, the authors' code) or ``"global"`` (whole group).
        exact_restore: restore ``θ`` from a copy (bit-exact) rather than by adding ``eps·z`` back.
        features: ``features(batch_x)`` → what the head reads (default: the model's declared embedding hook).
        head: ``head(features)`` → logits (default: the model's declared head module).
        chunk: records per graph-free forward (the two ZO passes and the head's features); None (default, the
            paper's) runs the whole batch at once. Smaller chunks give the same gradient (up to rounding, for a
            ``loss_fn`` that is a mean over records) in the activation memory of ``chunk`` records.

    Returns:
        ``loss`` (full batch, at ``θ``), ``loss_plus``, ``loss_minus``, ``loss_bp`` (the ``bp_batch`` samples)
        and ``projected_gradient`` ``(L+ − L−) / (2 eps)``.
    """
    lora_params, head_params = list(lora_params), list(head_params)
    features, head = _checked_mixed_order(
        model, lora_params, head_params, batch_x, eps, bp_batch, c, norm_match, features, head
    )

    # (1) zeroth order on the full batch: only the scalar (L+ − L−) / (2 eps) is kept.
    projected, loss_plus, loss_minus = zeroth_order_projection(
        model, lora_params, loss_fn, batch_x, batch_y, eps=eps, seed=seed, exact_restore=exact_restore, chunk=chunk
    )

    # (2) first order on the first bp_batch samples, for θ only.
    with torch.enable_grad():
        loss_bp = loss_fn(model(batch_x[:bp_batch]), batch_y[:bp_batch])
        first_order = torch.autograd.grad(loss_bp, lora_params, allow_unused=True)
    first_order = [torch.zeros_like(p) if g is None else g for p, g in zip(lora_params, first_order)]

    # (3) mix, norm-matched; g_ZO = projected · z, so g_ZO / ‖g_ZO‖ = sign(projected) · z / ‖z‖.
    _write_mixed_gradients(lora_params, first_order, projected, seed, c, norm_match)

    # (4) exact full-batch head gradient from detached features at θ.
    with torch.no_grad():
        head_input = torch.cat([features(batch_x[part]) for part in _chunks(len(batch_x), chunk)])
    with torch.enable_grad():
        loss = loss_fn(head(head_input), batch_y)
        head_gradients = torch.autograd.grad(loss, head_params, allow_unused=True) if head_params else ()
    for p, g in zip(head_params, head_gradients):
        p.grad = torch.zeros_like(p) if g is None else g

    return {
        "loss": loss.item(),
        "loss_plus": loss_plus,
        "loss_minus": loss_minus,
        "loss_bp": loss_bp.item(),
        "projected_gradient": projected,
    }


def _checked_mixed_order(
    model: nn.Module,
    lora_params: list[nn.Parameter],
    head_params: list[nn.Parameter],
    batch_x: torch.Tensor,
    eps: float,
    bp_batch: int,
    c: float,
    norm_match: str,
    features: Callable[[torch.Tensor], torch.Tensor] | None,
    head: Callable[[torch.Tensor], torch.Tensor] | None,
) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """`mixed_order_gradients`' arguments checked; returns ``(features, head)``, by default the model's declared
    embedding hook and head module."""
    if not lora_params:
        raise UserError("mixed_order_gradients: lora_params is empty; apply LoRA first (lora.apply)")
    if {id(p) for p in lora_params} & {id(p) for p in head_params}:
        raise UserError("mixed_order_gradients: a parameter is both in lora_params and head_params")
    if not all(p.requires_grad for p in lora_params + head_params):
        raise UserError("mixed_order_gradients: every parameter it updates must have requires_grad=True")
    if not 0.0 <= c <= 1.0:
        raise UserError(f"mixed_order_gradients: c must lie in [0, 1], got {c}")
    if not eps > 0:
        raise UserError(f"mixed_order_gradients: eps must be positive, got {eps}")
    if not 1 <= bp_batch <= len(batch_x):
        raise UserError(f"mixed_order_gradients: bp_batch must lie in [1, batch size {len(batch_x)}], got {bp_batch}")
    if norm_match not in NORM_MATCHES:
        raise UserError(f"mixed_order_gradients: norm_match must be one of {NORM_MATCHES}, got {norm_match!r}")
    if features is None or head is None:
        spec = require(model, "htuning", "embedding", "head")
        features = features if features is not None else getattr(model, spec.embedding)
        head = head if head is not None else model.get_submodule(spec.head)
    return features, head


def _write_mixed_gradients(
    lora_params: list[nn.Parameter],
    first_order: list[torch.Tensor],
    projected: float,
    seed: int,
    c: float,
    norm_match: str,
) -> None:
    """Writes ``p.grad = c · g_FO + (1 − c) · g_ZO · ‖g_FO‖ / ‖g_ZO‖`` (norms per tensor or of the whole group),
    ``g_ZO = projected · z(seed)``; ``first_order`` has one tensor per parameter, shaped like it."""
    if norm_match == "global":
        fo_norm = torch.sqrt(sum(g.pow(2).sum() for g in first_order))
        zo_norm = abs(projected) * torch.sqrt(sum(z.pow(2).sum() for z in _z(lora_params, seed)))
    for p, g_fo, z in zip(lora_params, first_order, _z(lora_params, seed)):
        g_zo = projected * z
        if norm_match == "tensor":
            fo_norm, zo_norm = torch.linalg.vector_norm(g_fo), torch.linalg.vector_norm(g_zo)
        zo_term = g_zo * (fo_norm / zo_norm) if zo_norm > 0 else torch.zeros_like(g_zo)
        p.grad = c * g_fo + (1.0 - c) * zo_term if c < 1.0 else g_fo.clone()


def split_parameters(model: nn.Module, head: str | None = None) -> tuple[list, list]:
    """(mixed group ``θ``, head ``φ``) of a prepared model: trainable parameters outside / inside the module
    ``head`` (default: the model's declared head), each in ``named_parameters`` order."""
    head = head if head is not None else require(model, "htuning", "head").head
    inside = {id(p) for p in model.get_submodule(head).parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [p for p in trainable if id(p) not in inside], [p for p in trainable if id(p) in inside]


@methods.register
class HTuning(Method):
    """H-Tuning (ICML 2025) as a workbench method.

    `prepare`: LoRA (``rank`` 16, ``alpha`` 16: scaling 1; `workbench.adaptation.lora.apply`) on every target
    group the model declares (for the ECG models: every conv, the merged qkv, the attention output, the FFN, the
    head's first layer), plus every bias and the declared head (the last classifier: weight and bias) trained in
    full; everything else frozen. Works on any model that declares target groups, a head and an embedding hook.
    The adapters compute ``(W + ΔW) x`` (``compute="weight"``, loralib's way for convolutions): the full-batch ZO
    passes then hold no adapter activations (one step of 32 records on the shipped teacher: 8.5 MiB, against
    10.9 MiB the input way; ``benchmarks/ecg_htuning.py``). The graph-free forwards (the two ZO passes, the head's
    features) run ``zo_chunk`` records at a time (default 8): the same gradient up to rounding (`batch_loss`), in the
    activation memory of 8 records instead of the batch's — on the shipped teacher no more than the ``bp_batch``
    backprop already needs, so smaller chunks only cost time; ``--zo-chunk 0`` runs them on the whole batch, as
    published.

    The step *replaces* ``loss.backward()``: `plan` gives the default stage ``HTuning.gradients`` as its
    `Stage.gradients` (``gradients(model, batch, step)``), which writes every trainable ``.grad``
    (`mixed_order_gradients`) and returns the detached full-batch loss; the trainer then clips and steps the
    optimizer as usual. ``z`` is seeded with ``run seed · 1_000_003 + step`` (the run seed from `setup`), so a
    resumed run draws the same ``z``. Validation keeps using the stage's ``loss`` (`Method.loss`: the task's
    loss). The batch must be ``(inputs, labels)``; the loss on logits is the task's ``logits_loss`` when it has
    one, else BCE with logits (multi-label).
    """

    name = "htuning"
    description = "H-Tuning: LoRA + mixed zeroth/first-order gradients + exact head gradient (ICML 2025)"
    needs_model = ("adapter_target_groups", "head", "embedding")
    learning_rate = 2e-3  # the authors' AdamW rate
    options = (
        Option("rank", int, 16, "LoRA rank r of every update"),
        Option("alpha", float, 16.0, "LoRA scale alpha (updates are multiplied by alpha / rank; 16/16 = 1)"),
        Option("c", float, 0.9, "weight of the backprop gradient in the mix (paper: 0.85, 0.9, 0.95, 0.99)"),
        Option("bp_batch", int, 2, "samples of each batch that are backpropagated"),
        Option("eps", float, 1e-3, "zeroth-order perturbation size"),
        Option("norm_match", str, "tensor", "match norms per parameter tensor or over the group", NORM_MATCHES),
        Option(
            "zo_chunk",
            int,
            8,
            "records per graph-free forward (ZO passes, head features): the same gradient in the activation memory "
            "of this many records; 0 = the whole batch at once (the paper's)",
        ),
        *lora_method.REFINEMENT_OPTIONS,
    )

    def __init__(self, **options):
        super().__init__(**options)
        if not 0.0 <= self.config["c"] <= 1.0:
            raise UserError(f"method 'htuning': --c must lie in [0, 1], got {self.config['c']}")
        if self.config["zo_chunk"] < 0:
            raise UserError(
                f"method 'htuning': --zo-chunk must be 0 (whole batch) or positive, got {self.config['zo_chunk']}"
            )
        if self.config["bp_batch"] < 1 or self.config["eps"] <= 0:
            raise UserError("method 'htuning': --bp-batch must be a positive integer and --eps positive")
        self._config(train=())

    def _config(self, train: tuple[str, ...]) -> lora.LoraConfig:
        """What `prepare` applies (`workbench.adaptation.lora.method.checked_config`: refused before any model)."""
        arguments = {"rank": self.config["rank"], "alpha": self.config["alpha"], "compute": "weight", "train": train}
        return lora_method.checked_config(self.name, self.config, **arguments)

    def check(self, task, data, model: nn.Module) -> None:
        """What the model must declare (`Method.check`); the adapters fit its targets."""
        super().check(task, data, model)
        lora.check_config(model, self._config(train=()))

    def prepare(self, model: nn.Module) -> nn.Module:
        head = require(model, self.name, *self.needs_model).head
        return lora.apply_config(model, self._config(train=("*.bias", f"{head}.*")))

    def setup(self, task, model: nn.Module, data, seed: int) -> None:
        """Keeps ``seed`` for the seeded ``z``; with ``--init lora-one`` sets the adapters from the task's full-batch
        gradient (`workbench.adaptation.lora.method.init_from_task_gradient`)."""
        self.seed = int(seed)
        if self.config["init"] == "lora-one":
            lora_method.init_from_task_gradient(task, model, data, self.config["gamma"])

    def plan(self, task, model: nn.Module, data, inputs: PlanInputs) -> list[Stage]:
        """One stage whose gradients are `gradients` (no backward pass through the LoRA factors)."""
        return [replace(stage, gradients=partial(self.gradients, task)) for stage in super().plan(task, model, data,
                                                                                                   inputs)]

    def gradients(self, task, model: nn.Module, batch: Any, step: int) -> torch.Tensor:
        """One mixed-order gradient for ``batch = (inputs, labels)`` at global ``step``, written into the trainable
        ``.grad``; returns the detached loss (`workbench.core.method.Stage.gradients`)."""
        try:
            batch_x, batch_y = batch
        except (TypeError, ValueError):
            raise UserError(
                f"method 'htuning' needs batches of (inputs, labels); task '{task.name}' gives {type(batch).__name__}"
            ) from None
        loss_fn = getattr(task, "logits_loss", F.binary_cross_entropy_with_logits)
        seed = getattr(self, "seed", 0) * 1_000_003 + int(step)
        result = self.mixed_step(model, batch_x, batch_y, loss_fn, seed=seed)
        return torch.tensor(result["loss"])

    def mixed_step(
        self, model: nn.Module, batch_x: torch.Tensor, batch_y: torch.Tensor, loss_fn: LossFn, seed: int
    ) -> dict[str, float]:
        """Write one mixed-order gradient into the trainable ``.grad``; returns `mixed_order_gradients`' numbers."""
        lora_params, head_params = split_parameters(model)
        return mixed_order_gradients(
            model,
            lora_params,
            head_params,
            loss_fn,
            batch_x,
            batch_y,
            eps=self.config["eps"],
            bp_batch=min(self.config["bp_batch"], len(batch_x)),
            c=self.config["c"],
            seed=seed,
            norm_match=self.config["norm_match"],
            chunk=self.config["zo_chunk"] or None,
        )

    def trainable_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The LoRA factors and the bias and head parameters by their file names (`lora.adapter_state`: PEFT's,
        without the adapter name), so a run's ``adapter.safetensors`` keeps its names."""
        return {name: p.detach().clone() for name, p in lora.adapter_state(model).items()}

    def load_trainable_state(self, model: nn.Module, state, source="<state>") -> None:
        lora.load_state(model, state, source)

    def merge(self, model: nn.Module) -> nn.Module:
        return lora.merge(model)

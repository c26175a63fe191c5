"""PhysioPFM's weight generator: p(LoRA weights | task descriptor), fitted on a bank of (descriptor, weights) pairs.

A bank holds ``n`` pairs: a descriptor ``c`` (``C`` values describing a site's task) and the flattened LoRA weights
``w`` (``P`` values) fitted for it elsewhere. A generator maps a new site's descriptor to weights, with no training
at that site. Two kinds:

* `WeightDiffusion` (``kind="diffusion"``): a conditional diffusion model over the weight vector. The standardized
  vector (per coordinate, from the bank) is zero-padded to ``n_chunks = ceil(P / chunk)`` chunks of ``chunk`` values,
  tokens ``(batch, n_chunks, chunk)``; ``Linear(chunk, width)`` + a learned position embedding; the timestep
  (sinusoidal embedding → MLP) and the descriptor (MLP of the standardized descriptor) are both added to every
  token, and the descriptor's embedding is also one extra prefix token; a stack of pre-norm, non-causal
  transformer blocks (GELU, 4 × width feed-forward, no dropout) and a final LayerNorm; ``Linear(width, chunk)``
  gives the predicted clean chunks, un-chunked with the padding dropped. It is trained to predict the clean
  weights ``x0`` (not the noise) from ``x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise`` at uniformly drawn ``t``,
  and samples with deterministic DDIM (eta = 0) on an evenly spaced subsequence of the training steps.
* `WeightRegressor` (``kind="regressor"``): the ablation, an MLP ``C → 256 → 256 → P`` (GELU) trained with MSE on
  the standardized weights; deterministic.

As the paper is reported to do (its code is not released; none of this is checked against it): a GPT-2-style
transformer as the denoiser over weight chunks of 576 values, 1000 diffusion steps, a linear beta schedule,
x0-prediction, learning rate 4e-4, batch 64. Our choices, not from the paper: the sizes (width 128, depth 4,
4 heads), the descriptor both as a prefix token and added to every token (on the tests' synthetic linear bank, width 64,
depth 2, 150 iterations at rate 2e-3, the prefix alone reached held-out cosine 0.82-0.93 and both 0.90-0.95, 3 seeds),
per-coordinate standardization of weights and descriptors (std floored at `STD_FLOOR_RELATIVE` × the mean std and at
`STD_FLOOR_ABSOLUTE`, so a (nearly) constant coordinate does not blow up), AdamW with weight decay `WEIGHT_DECAY` and a
constant rate, the zero-initialised output layer (the untrained model predicts the bank's mean), 50 DDIM steps.

Shapes: ``weights (n, P)``, ``conditions (n, C)``; `generate` takes ``conditions (m, C)`` and returns ``(m, P)``
in the weights' original scale. A generator file (`save_generator`) is one safetensors file whose metadata holds
``kind`` and ``config`` (the constructor's arguments, JSON), so `load_generator` rebuilds it from the file alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from workbench.core.checkpoint import check_state_fits, load_tensors, read_metadata, save_tensors
from workbench.core.errors import UserError

WEIGHT_DECAY = 1e-5
STD_FLOOR_RELATIVE = 1e-3  # a coordinate's std is at least this × the mean std over coordinates ...
STD_FLOOR_ABSOLUTE = 1e-8  # ... and at least this (a bank whose coordinates are all constant)


class _Standardized(nn.Module):
    """Holds the bank's per-coordinate mean/std of weights (P,) and conditions (C,) as buffers."""

    kind: str

    def __init__(self, n_weights: int, n_condition: int):
        super().__init__()
        self.n_weights, self.n_condition = n_weights, n_condition
        self.register_buffer("weight_mean", torch.zeros(n_weights))
        self.register_buffer("weight_std", torch.ones(n_weights))
        self.register_buffer("condition_mean", torch.zeros(n_condition))
        self.register_buffer("condition_std", torch.ones(n_condition))

    @torch.no_grad()
    def set_standardization(self, weights: Tensor, conditions: Tensor) -> None:
        """Mean and floored std per coordinate of ``weights (n, P)`` and ``conditions (n, C)``."""
        for name, values in (("weight", weights), ("condition", conditions)):
            std = values.std(dim=0)
            floor = max(STD_FLOOR_RELATIVE * std.mean().item(), STD_FLOOR_ABSOLUTE)
            getattr(self, f"{name}_mean").copy_(values.mean(dim=0))
            getattr(self, f"{name}_std").copy_(std.clamp_min(floor))

    def standardize_weights(self, weights: Tensor) -> Tensor:
        return (weights - self.weight_mean) / self.weight_std

    def standardize_conditions(self, conditions: Tensor) -> Tensor:
        return (conditions - self.condition_mean) / self.condition_std

    def unstandardize_weights(self, weights_std: Tensor) -> Tensor:
        return weights_std * self.weight_std + self.weight_mean

    def _conditions_in(self, conditions: Tensor) -> Tensor:
        """``conditions (m, C)`` checked, on the model's device and dtype, standardized."""
        _check_matrix("conditions", conditions, self.n_condition)
        return self.standardize_conditions(conditions.to(self.weight_mean))


def linear_schedule(steps: int, beta_start: float, beta_end: float) -> tuple[Tensor, Tensor]:
    """(betas (steps,), alpha_bar (steps,)): linear betas and ``alpha_bar_t = prod_{s <= t} (1 - beta_s)``."""
    betas = torch.linspace(beta_start, beta_end, steps, dtype=torch.float64)
    return betas.float(), torch.cumprod(1.0 - betas, dim=0).float()


def timestep_embedding(t: Tensor, dim: int) -> Tensor:
    """Sinusoidal embedding ``(batch, dim)`` of integer timesteps ``t (batch,)`` (transformer positions' formula)."""
    half = dim // 2
    frequencies = torch.exp(-math.log(10_000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = t.float()[:, None] * frequencies[None]
    return F.pad(torch.cat([angles.sin(), angles.cos()], dim=1), (0, dim - 2 * half))


def ddim_sample(
    predict_clean: Callable[[Tensor, Tensor], Tensor],
    alpha_bar: Tensor,
    shape: tuple[int, ...],
    sampling_steps: int,
    generator: torch.Generator,
) -> Tensor:
    """Deterministic DDIM (eta = 0) from x0-predictions; returns the final clean sample ``(shape)``.

    Starts from ``x ~ N(0, I)`` drawn with ``generator`` at ``t = T - 1``; visits ``sampling_steps`` evenly spaced
    training steps down to 0, each ``x0 = predict_clean(x_t, t (batch,))``, ``eps = (x_t - sqrt(abar_t) x0) /
    sqrt(1 - abar_t)``, ``x_prev = sqrt(abar_prev) x0 + sqrt(1 - abar_prev) eps``; after ``t = 0`` comes
    ``abar = 1``, so the result is the last x0-prediction.
    """
    steps = alpha_bar.shape[0]
    if not 1 <= sampling_steps <= steps:
        raise UserError(f"sampling_steps: expected 1 to {steps} (the training steps), found {sampling_steps}")
    times = torch.linspace(steps - 1, 0, sampling_steps).round().long().to(alpha_bar.device)
    abars = torch.cat([alpha_bar[times], alpha_bar.new_ones(1)])
    x = torch.randn(shape, generator=generator, device=generator.device, dtype=alpha_bar.dtype).to(alpha_bar.device)
    for i, t in enumerate(times):
        x0 = predict_clean(x, t.expand(shape[0]))
        eps = (x - abars[i].sqrt() * x0) / (1.0 - abars[i]).sqrt()
        x = abars[i + 1].sqrt() * x0 + (1.0 - abars[i + 1]).sqrt() * eps
    return x


class WeightDiffusion(_Standardized):
    """Conditional diffusion transformer over weight chunks, x0-prediction (see the module docstring)."""

    kind = "diffusion"

    def __init__(
        self,
        n_weights: int,
        n_condition: int,
        chunk: int = 576,
        width: int = 128,
        depth: int = 4,
        heads: int = 4,
        steps: int = 1000,
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
    ):
        super().__init__(n_weights, n_condition)
        self.config = dict(
            n_weights=n_weights,
            n_condition=n_condition,
            chunk=chunk,
            width=width,
            depth=depth,
            heads=heads,
            steps=steps,
            beta_start=beta_start,
            beta_end=beta_end,
        )
        self.chunk, self.width, self.steps = chunk, width, steps
        self.n_chunks = -(-n_weights // chunk)
        betas, alpha_bar = linear_schedule(steps, beta_start, beta_end)
        self.register_buffer("betas", betas)
        self.register_buffer("alpha_bar", alpha_bar)

        self.embed = nn.Linear(chunk, width)
        self.position = nn.Parameter(0.02 * torch.randn(self.n_chunks + 1, width))  # prefix token first
        self.time_mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.SiLU(), nn.Linear(4 * width, width))
        self.condition_mlp = nn.Sequential(nn.Linear(n_condition, 4 * width), nn.SiLU(), nn.Linear(4 * width, width))
        block = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, depth, norm=nn.LayerNorm(width), enable_nested_tensor=False)
        self.out = nn.Linear(width, chunk)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def q_sample(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """``x_t (batch, P) = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise``; ``x0, noise (batch, P)``, ``t (batch,)``."""
        abar = self.alpha_bar[t][:, None]
        return abar.sqrt() * x0 + (1.0 - abar).sqrt() * noise

    def predict_clean(self, x_t: Tensor, t: Tensor, condition_std: Tensor) -> Tensor:
        """Predicted standardized x0 ``(batch, P)`` from ``x_t (batch, P)``, ``t (batch,)`` and the standardized
        descriptor ``condition_std (batch, C)``."""
        batch = x_t.shape[0]
        tokens = F.pad(x_t, (0, self.n_chunks * self.chunk - self.n_weights)).view(batch, self.n_chunks, self.chunk)
        condition = self.condition_mlp(condition_std)  # (batch, width)
        shared = self.time_mlp(timestep_embedding(t, self.width)) + condition
        h = torch.cat([condition[:, None], self.embed(tokens)], dim=1) + self.position + shared[:, None]
        chunks = self.out(self.blocks(h)[:, 1:])  # (batch, n_chunks, chunk)
        return chunks.reshape(batch, -1)[:, : self.n_weights]

    def training_loss(self, x0: Tensor, condition_std: Tensor) -> Tensor:
        """MSE of the x0-prediction at uniformly drawn ``t`` (global RNG): ``x0 (batch, P)``, standardized."""
        t = torch.randint(0, self.steps, (x0.shape[0],), device=x0.device)
        x_t = self.q_sample(x0, t, torch.randn_like(x0))
        return F.mse_loss(self.predict_clean(x_t, t, condition_std), x0)

    @torch.no_grad()
    def generate(self, conditions: Tensor, sampling_steps: int = 50, seed: int = 0) -> Tensor:
        """Weights ``(m, P)``, original scale, for ``conditions (m, C)``: DDIM from noise seeded by ``seed`` (a
        local generator; the global RNG is untouched)."""
        condition_std = self._conditions_in(conditions)
        generator = torch.Generator(device=self.alpha_bar.device).manual_seed(seed)
        x0 = ddim_sample(
            lambda x_t, t: self.predict_clean(x_t, t, condition_std),
            self.alpha_bar,
            (condition_std.shape[0], self.n_weights),
            sampling_steps,
            generator,
        )
        return self.unstandardize_weights(x0)


class WeightRegressor(_Standardized):
    """The ablation: an MLP from the standardized descriptor to the standardized weights."""

    kind = "regressor"

    def __init__(self, n_weights: int, n_condition: int, hidden: int = 256):
        super().__init__(n_weights, n_condition)
        self.config = dict(n_weights=n_weights, n_condition=n_condition, hidden=hidden)
        self.mlp = nn.Sequential(
            nn.Linear(n_condition, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, n_weights),
        )

    def forward(self, condition_std: Tensor) -> Tensor:
        """Standardized weights ``(batch, P)`` from ``condition_std (batch, C)``."""
        return self.mlp(condition_std)

    def training_loss(self, x0: Tensor, condition_std: Tensor) -> Tensor:
        """MSE to the standardized weights ``x0 (batch, P)``."""
        return F.mse_loss(self(condition_std), x0)

    @torch.no_grad()
    def generate(self, conditions: Tensor, seed: int = 0) -> Tensor:
        """Weights ``(m, P)``, original scale, for ``conditions (m, C)``; ``seed`` is ignored (deterministic)."""
        return self.unstandardize_weights(self(self._conditions_in(conditions)))


GENERATORS: dict[str, type[_Standardized]] = {"diffusion": WeightDiffusion, "regressor": WeightRegressor}


def _check_matrix(name: str, values: Tensor, columns: int | None = None) -> None:
    """``values`` is a finite 2-D tensor (with ``columns`` columns if given), else a `UserError`."""
    if values.ndim != 2 or (columns is not None and values.shape[1] != columns):
        expected = f"(n, {columns})" if columns is not None else "(n, features)"
        raise UserError(f"{name}: expected a matrix of shape {expected}, found shape {tuple(values.shape)}")
    if not torch.isfinite(values).all():
        raise UserError(f"{name}: {int((~torch.isfinite(values)).sum())} values are not finite (NaN or inf)")


def fit_weight_generator(
    kind: str,
    weights: Tensor,
    conditions: Tensor,
    *,
    iterations: int = 3000,
    batch_size: int = 64,
    learning_rate: float = 4e-4,
    seed: int = 0,
    progress: bool = False,
    checkpoints: Sequence[int] = (),
    callback: Callable[[int, nn.Module], None] | None = None,
    **architecture,
) -> nn.Module:
    """A generator of ``kind`` ("diffusion" | "regressor") fitted on the bank ``weights (n, P)``, ``conditions
    (n, C)``; returned in eval mode.

    Standardization from the bank, then ``iterations`` AdamW steps (weight decay `WEIGHT_DECAY`) on batches of
    ``batch_size`` pairs (drawn without replacement, or with replacement when ``n < batch_size``), everything
    seeded by ``seed`` inside a forked RNG (the caller's global RNG is untouched). ``architecture`` goes to the
    model's constructor (``width``, ``depth``, ``chunk``, ... or ``hidden``). Trains on ``weights``' device.
    ``callback(iterations_done, model)`` is called (model in eval mode, then back to training) after each of the
    ``checkpoints`` iteration counts: how early stopping is chosen on held-out entries without refitting.
    """
    if kind not in GENERATORS:
        raise UserError(f"kind: expected one of {sorted(GENERATORS)}, found '{kind}'")
    _check_matrix("weights", weights)
    _check_matrix("conditions", conditions)
    n = weights.shape[0]
    if conditions.shape[0] != n:
        raise UserError(f"the bank has {n} weight vectors but {conditions.shape[0]} conditions; expected one each")
    if n < 2:
        raise UserError(f"the bank has {n} (descriptor, weights) pair; a generator needs at least 2")
    weights, conditions = weights.float(), conditions.float().to(weights.device)
    devices = [weights.device] if weights.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = GENERATORS[kind](weights.shape[1], conditions.shape[1], **architecture).to(weights.device)
        model.set_standardization(weights, conditions)
        weights_std, conditions_std = model.standardize_weights(weights), model.standardize_conditions(conditions)
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=WEIGHT_DECAY)
        model.train()
        bar = tqdm(range(iterations), desc=f"fit {kind} generator", disable=not progress)
        for iteration in bar:
            if n < batch_size:
                index = torch.randint(0, n, (batch_size,), device=weights.device)
            else:
                index = torch.randperm(n, device=weights.device)[:batch_size]
            loss = model.training_loss(weights_std[index], conditions_std[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if progress:
                bar.set_postfix(loss=f"{loss.item():.4f}")
            if callback is not None and iteration + 1 in checkpoints:
                callback(iteration + 1, model.eval())
                model.train()
    return model.eval()


def save_generator(model: nn.Module, path: str | Path) -> None:
    """Write a fitted generator to ``path`` (safetensors; metadata ``kind`` and ``config`` as JSON), atomically."""
    save_tensors(
        path, model.state_dict(), metadata={"format": "pt", "kind": model.kind, "config": json.dumps(model.config)}
    )


def load_generator(path: str | Path) -> nn.Module:
    """The generator saved at ``path`` by `save_generator`, in eval mode; any other file is a `UserError` naming it."""
    metadata = read_metadata(path)
    kind = metadata.get("kind")
    if kind not in GENERATORS or "config" not in metadata:
        raise UserError(
            f"{path}: not a weight-generator file (expected metadata 'kind' in {sorted(GENERATORS)} and 'config', "
            f"found keys {sorted(metadata)})"
        )
    try:
        model = GENERATORS[kind](**json.loads(metadata["config"]))
    except (json.JSONDecodeError, TypeError) as error:
        raise UserError(
            f"{path}: the metadata field 'config' is not a {kind} generator's configuration ({error})"
        ) from None
    state = load_tensors(path)
    check_state_fits(model.state_dict(), state, path, f"the tensors do not fit the {kind} generator's configuration")
    model.load_state_dict(state)
    return model.eval()

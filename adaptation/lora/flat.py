"""Flat-LoRA's objective: the loss at randomly perturbed merged weights, the noise regenerated from a seed.

Paper: Li et al., "Flat-LoRA: Low-Rank Adaptation over a Flat Loss Landscape", ICML 2025 (code: nblt/Flat-LoRA, whose
training code was not readable here; this follows the paper). A low-rank update that is flat in the space of ``A``
and ``B`` may still be sharp in the full weight space; Flat-LoRA minimises the Bayesian expectation loss
``E_ε L(W + scale · B A + ε)`` with one draw of ``ε`` per step, ``ε`` applied to the *merged* weight ``W' = W + ΔW``
of every adapted layer and scaled per output row (filter):

    ε_ij ~ N(0, σ_t² ‖W'_i‖² / n),        n = in · K (the row's length),        σ_t = σ (1 − cos(π t / T)) / 2

with ``σ_t`` the authors' cosine-increasing schedule over the ``T`` training steps (``σ`` their ``rho``, 0.05). The
noise is detached (no gradient flows to its scale) and never kept: `perturbed` draws it from ``seed`` for one forward
pass, each layer adds ``ε x`` to its output (its weight property reads ``W' + ε``), and `perturbations` draws the
same tensors again from the same seed. Only the adapters' parameters receive gradients, as in plain LoRA.

Example::

    >>> sigma = flat.sigma_at(0.05, step, total)                                      # doctest: +SKIP
    >>> with flat.perturbed(model, seed=1_000_003 * run_seed + step, sigma=sigma):    # doctest: +SKIP
    ...     loss = task_loss(model, batch)
    >>> loss.backward()                                                               # doctest: +SKIP

Shapes:
    each layer's ε has its base weight's shape: (out, in) or (out, in, *kernel).
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Callable, Iterator

import torch
from torch import nn
from workbench.adaptation.lora.model import lora_layers
from workbench.adaptation.lora.variants.flat_lora import unit_noise

from workbench.core.errors import UserError
from workbench.core.method import Stage
from workbench.core.trainer import TrainSettings, distributed


def sigma_at(sigma: float, step: int, total: int) -> float:
    """``σ_t = σ (1 − cos(π t / T)) / 2`` at step ``t`` (0-based) of ``T = total`` steps (clamped to ``[0, σ]``)."""
    if total < 1:
        raise UserError(f"Flat-LoRA's schedule needs a positive number of training steps, got {total}")
    return sigma * (1 - math.cos(math.pi * min(max(step, 0), total) / total)) / 2


def perturbations(model: nn.Module, seed: int, sigma: float) -> dict[str, torch.Tensor]:
    """``{module name: ε}`` for every LoRA layer of ``model`` in module order, drawn from one generator seeded with
    ``seed`` (on the weights' device) with each row's standard deviation ``σ ‖W'_i‖ / sqrt(n)`` of the layer's current
    merged weight ``W'`` (detached)."""
    if sigma < 0:
        raise UserError(f"Flat-LoRA's sigma must be >= 0, got {sigma}")
    layers = lora_layers(model)
    if not layers:
        raise UserError(f"this {type(model).__name__} carries no LoRA layers to perturb (call lora.apply first)")
    device = next(iter(layers.values())).base_layer.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    out = {}
    with torch.no_grad():
        for name, layer in layers.items():
            weight = layer.base_layer.weight.detach()
            for adapter in layer._acting():  # W' = W + ΔW of the plain adapters (dropout or not)
                if not layer.adapters[adapter].routed:
                    weight = weight + layer.delta_weight(adapter).detach()
            out[name] = unit_noise(weight.flatten(1), sigma, generator).reshape(weight.shape)
    return out


@contextmanager
def perturbed(model: nn.Module, seed: int, sigma: float) -> Iterator[None]:
    """Within the block every LoRA layer computes with ``W' + ε`` (`perturbations` of ``seed``); the layers hold no
    noise after it (a graph built inside keeps what its backward needs)."""
    noise = perturbations(model, seed, sigma)
    layers = lora_layers(model)
    try:
        for name, epsilon in noise.items():
            layers[name].perturbation = epsilon
        yield
    finally:
        for layer in layers.values():
            layer.perturbation = None


def flat_stage(
    stage: Stage,
    task,
    train_samples: int,
    settings: TrainSettings,
    sigma: float,
    seed: int,
    perturb: Callable[[nn.Module, int, float], AbstractContextManager] | None = None,
) -> Stage:
    """``stage`` with Flat-LoRA's step: each step ``t`` of the run's ``T`` (``settings.epochs`` epochs of this
    process's share of ``train_samples`` in batches of ``settings.batch_size``) runs the task's training loss within
    ``perturb(model, seed · 1_000_003 + t, σ_t)`` (`perturbed` by default; ELoRA passes its own), ``σ_t`` =
    `sigma_at`, backpropagates it and returns it detached. Validation and evaluation see the unperturbed model."""
    total = settings.epochs * -(-(train_samples // distributed()[1]) // settings.batch_size)
    perturb = perturbed if perturb is None else perturb

    def step(model: nn.Module, batch: Any, index: int) -> torch.Tensor:
        with perturb(model, seed * 1_000_003 + index, sigma_at(sigma, index, total)):
            loss = task.loss(model, batch, True)
        loss.backward()
        return loss.detach()

    return dataclasses.replace(stage, gradients=step)

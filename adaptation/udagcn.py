"""UDAGCN-style adversarial graph domain adaptation: a GCN, a gradient-reversal domain classifier, target entropy.

Paper: Wu et al., "Unsupervised Domain Adaptive Graph Convolutional Networks", WWW 2020 (after DANN,
Ganin et al., JMLR 2016). A domain classifier d(·) learns to tell source from target node embeddings
while the encoder, through a gradient-reversal layer (identity forward, −λ·gradient backward), learns
to make them indistinguishable:

    L = CE(f(X_S), Y_S) + domain_weight · BCE(d(GRL_λ(Z)), domain) + entropy_weight · p · H(f(X_T))

with the DANN schedule λ = 2 / (1 + exp(−10 p)) − 1 over training progress p ∈ [0, 1], and the target's
mean prediction entropy H ramped in with p. Defaults: domain_weight 1, entropy_weight 0.1, lr 0.01.

What is left out: UDAGCN's second, global encoder (a GCN over the positive pointwise mutual information
matrix of random walks) and the attention that mixes it with the local one — here the encoder is the
local 2-layer GCN alone (the csbm task runs it as ``udagcn@gcn``), so this is "DANN on a GCN", the adversarial part
of UDAGCN. It trains any `GraphNet` encoder the same way.

The domain classifier (hidden → hidden → 1, ReLU) is attached to the model by ``prepare`` as
``model.domain_classifier``, saved with the adapter, and removed by ``merge`` (prediction never uses it).

Shapes:
    embeddings (n_S + n_T, hidden) → domain logits (n_S + n_T,)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from workbench.adaptation.homophily import EncoderMethod, graph_batch, graph_net

from workbench.core.errors import UserError
from workbench.core.options import Option
from workbench.core.registry import methods

if TYPE_CHECKING:
    from workbench.core.task import Task


class _ReverseGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return -ctx.scale * grad, None


def reverse_gradient(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Identity forward; multiplies the gradient by −scale backward (the gradient-reversal layer)."""
    return _ReverseGradient.apply(x, scale)


def dann_schedule(progress: float) -> float:
    """λ(p) = 2 / (1 + exp(−10 p)) − 1: 0 at the start of training, → 1 at the end (Ganin et al.)."""
    return 2.0 / (1.0 + math.exp(-10.0 * progress)) - 1.0


def domain_loss(classifier: nn.Module, z_source: torch.Tensor, z_target: torch.Tensor, scale: float) -> torch.Tensor:
    """Balanced BCE of the domain classifier on reversed-gradient embeddings (source 0, target 1)."""
    logits_s = classifier(reverse_gradient(z_source, scale)).squeeze(-1)
    logits_t = classifier(reverse_gradient(z_target, scale)).squeeze(-1)
    return 0.5 * (
        F.binary_cross_entropy_with_logits(logits_s, torch.zeros_like(logits_s))
        + F.binary_cross_entropy_with_logits(logits_t, torch.ones_like(logits_t))
    )


def mean_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean Shannon entropy [nats] of the predicted class distributions (n, C) → ()."""
    log_p = F.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p).sum(-1).mean()


@methods.register
class UDAGCN(EncoderMethod):
    name = "udagcn"
    description = "UDAGCN-style adversarial alignment: gradient-reversal domain classifier + target entropy (on a GCN)"
    options = (
        Option("domain_weight", float, 1.0, "weight of the adversarial domain-classification loss"),
        Option("entropy_weight", float, 0.1, "weight of the target entropy term (ramped in with progress)"),
    )

    def __init__(self, **options: Any):
        super().__init__(**options)
        for key in ("domain_weight", "entropy_weight"):
            if self.config[key] < 0:
                raise UserError(f"--{key.replace('_', '-')} must not be negative, got {self.config[key]}")

    def prepare(self, model: nn.Module) -> nn.Module:
        model = super().prepare(model)
        hidden = model.architecture["hidden_channels"]
        weight = model.head.weight
        model.domain_classifier = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)).to(
            weight.device, weight.dtype
        )
        return model

    def loss(self, task: "Task", model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        if not training:
            return task.loss(model, batch, training)
        batch = graph_batch(batch, self.name)
        z_s, _ = model.embed(batch.source)
        z_t, _ = model.embed(batch.target)
        progress = self.epoch / max(self.epochs, 1)
        mask = batch.train_mask
        source = F.cross_entropy(model.head(z_s)[mask], batch.source.y[mask])
        adversarial = domain_loss(model.domain_classifier, z_s, z_t, dann_schedule(progress))
        entropy = mean_entropy(model.head(z_t))
        return source + self.config["domain_weight"] * adversarial + self.config["entropy_weight"] * progress * entropy

    def merge(self, model: nn.Module) -> nn.Module:
        model = graph_net(model, self.name)
        if hasattr(model, "domain_classifier"):
            del model.domain_classifier
        return model

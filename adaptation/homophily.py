"""Homophily alignment (HGDA): mixed low/high/full-pass filters with per-branch source–target alignment.

Paper: Fang et al., "Homophily Enhanced Graph Domain Adaptation", ICML 2025. A source graph and a target
graph with different homophily need different filters: low-pass smoothing helps where neighbours share
classes, high-pass differences where they do not. The encoder (`workbench.models.graph.MixedFilterEncoder`)
keeps one branch of each kind, and the loss aligns the two domains branch by branch:

    L = CE(f(X_S), Y_S)                                   source nodes of the training split
      + λ_a · Σ_{b ∈ {low, high, full}} KL(Z_b^S ‖ Z_b^T)  alignment of each branch's embeddings
      + λ_p · CE(f(X_T), ŷ_T)                              target pseudo-labels ŷ_T = argmax f(X_T) (detached)

with λ_a = λ_p = 0.1 (``align_weight``, ``pseudo_weight``), Adam lr 0.01, full-graph steps.

The KL term compares node embeddings as distributions over channels, p = softmax(z). Two estimates:

- ``pairing="mean"`` (default): KL(p̄^S ‖ p̄^T) between the domains' mean channel distributions
  p̄ = mean_i softmax(z_i): a divergence between the two embedding distributions' channel profiles,
  exactly zero when the embedding sets are equal (in any order), blind to differences that leave the
  mean profile unchanged.
- ``pairing="random"`` (the authors' reading as recorded in METHODS.md, *unverified* against their
  code): each step pairs min(n_S, n_T) random source nodes with as many random target nodes and
  averages KL(p_i^S ‖ p_j^T). This estimates E_{i,j} KL(p_i^S ‖ p_j^T), the mean *pairwise* divergence:
  it is **not** zero when the two distributions are equal (it then equals the embeddings' spread within
  a domain), so besides aligning it contracts every embedding towards every other.

Why "mean" is the default: the issue asks for an alignment term that vanishes for identical
distributions, which "random" does not; and on ACMv9 → DBLPv7 (60 epochs, one seed) "random" collapsed
the target onto one class (target accuracy 0.24, macro F1 0.08; without pseudo-labels 0.37) where
"mean" gave 0.58 and the unaligned encoder 0.62. The CSBM grid (`benchmarks/graph_homophily_grid.py`)
reports both.

Pseudo-labels use every target node whose top predicted probability is at least ``pseudo_threshold``
(0: all, as in the paper), from the epoch ``pseudo_warmup · epochs`` on (0: from the start, as in the
paper; self-training an untrained model can lock the target onto one class). Before that epoch the
pseudo-label term is not computed at all. ``mixed-filters`` is the same encoder trained on the source
loss alone (the no-alignment ablation).

Named variants (`VARIANTS`, the class's ``variants``: ``workbench adapt --method homophily:delayed``, compared as
``homophily:released`` / ``homophily:delayed``; `workbench.core.config.variant_options`):

- ``released``: the authors' released pseudo-label recipe (``HGDA_MAG.py``), the options' defaults:
  argmax pseudo-labels ŷ_T of the current model on *every* target node from epoch 0, when the model is
  still untrained. On the citation graphs this locks the target onto one class (ACMv9 → DBLPv7, seeds
  200–202: accuracy 0.25–0.39 against 0.59–0.66 for a source-only GCN). What stays the project's here:
  the KL estimate (``pairing="mean"``, the default; the authors' random pairs are ``pairing="random"``),
  the trainer's EMA, clipping and plateau schedule, the task's dropout and epoch budget (100, the same for
  every compared method; the authors ran 50), and the epoch selection below.
- ``delayed`` — **the project's change, not the paper's**: no pseudo-label term before half the epochs
  (``pseudo_warmup=0.5``), then only target nodes whose top predicted probability is at least 0.9
  (``pseudo_threshold=0.9``). Chosen on seeds 200–202 (ACMv9 → DBLPv7, delay to half alone: 0.62 / 0.64
  on seeds 201 / 202 where the released recipe gave 0.39 / 0.32); reported numbers use seeds from 210.

Epoch selection is the csbm task's rule for every method (`workbench.domains.graphs.task`): the source
validation criterion among the epochs whose predicted target classes are not collapsed (normalised
class entropy ≥ ``--collapse-entropy``, 0.5); no target label is used. This is the project's rule for
``released`` too (the authors' own choice of epoch is not reproduced); ``--collapse-entropy 0`` gives
source validation alone, as before. Measured (seeds 210–212, `benchmarks/graph_citation.py`): ``delayed``
removes the collapse on the citation graphs and stays a few points below a source-only GCN; a run of
``released`` that collapses from its first epochs has no epoch the rule accepts, so it falls back to source
validation — the rule flags such a run, it cannot repair it.

Plain PyTorch: `branch_alignment` and `pseudo_label_loss` work on any tensors.

Shapes:
    source parts [(n_S, hidden)] × branches, target parts [(n_T, hidden)] × branches → alignment ()
    target logits (n_T, n_classes) → pseudo-label loss ()
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from workbench.models.graph import BRANCHES, GraphNet

from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.options import Option
from workbench.core.registry import methods

if TYPE_CHECKING:
    from workbench.core.task import Task, TaskData

PAIRINGS = ("random", "mean")

#: Named variants of ``homophily``: their method options (module docstring). ``released`` is the options' defaults.
VARIANTS: dict[str, dict[str, Any]] = {
    "released": {"pseudo_warmup": 0.0, "pseudo_threshold": 0.0},
    "delayed": {"pseudo_warmup": 0.5, "pseudo_threshold": 0.9},
}


def kl_rows(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """mean_i KL(softmax(source_i) ‖ softmax(target_i)) for row-paired embeddings (m, d), (m, d)."""
    log_p = F.log_softmax(source, dim=-1)
    log_q = F.log_softmax(target, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def kl_means(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """KL(p̄^S ‖ p̄^T) of the mean channel distributions p̄ = mean_i softmax(z_i); (n_S, d), (n_T, d) → ()."""
    p = F.softmax(source, dim=-1).mean(0).clamp_min(1e-12)
    q = F.softmax(target, dim=-1).mean(0).clamp_min(1e-12)
    return (p * (p.log() - q.log())).sum()


def branch_alignment(
    source_parts: Sequence[torch.Tensor],
    target_parts: Sequence[torch.Tensor],
    pairing: str = "mean",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Σ_b KL(Z_b^S ‖ Z_b^T) over branches (module docstring); one node pairing shared by all branches."""
    if len(source_parts) != len(target_parts):
        raise ValueError(f"{len(source_parts)} source branches vs {len(target_parts)} target branches")
    if pairing == "mean":
        return sum(kl_means(s, t) for s, t in zip(source_parts, target_parts))
    if pairing != "random":
        raise UserError(f"--pairing must be one of {list(PAIRINGS)}, got {pairing!r}")
    n_source, n_target = source_parts[0].shape[0], target_parts[0].shape[0]
    m = min(n_source, n_target)
    device = source_parts[0].device
    rows_s = torch.randperm(n_source, generator=generator)[:m].to(device)
    rows_t = torch.randperm(n_target, generator=generator)[:m].to(device)
    return sum(kl_rows(s[rows_s], t[rows_t]) for s, t in zip(source_parts, target_parts))


def pseudo_label_loss(logits: torch.Tensor, threshold: float = 0.0) -> torch.Tensor:
    """CE of target logits (n, C) against their own detached argmax, over nodes with max prob ≥ threshold."""
    with torch.no_grad():
        confidence, labels = F.softmax(logits, dim=-1).max(-1)
        keep = confidence >= threshold
    if not bool(keep.any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits[keep], labels[keep])


def graph_net(model: nn.Module, method: str) -> GraphNet:
    """``model`` if it is a graph node classifier; otherwise a `UserError` saying what the method needs."""
    if not isinstance(model, GraphNet):
        raise UserError(
            f"method '{method}' trains graph node classifiers (workbench.models.graph.GraphNet, the csbm task's "
            f"model); got {type(model).__name__}"
        )
    return model


def graph_batch(batch: Any, method: str):
    """The (source, target) graph pair of a batch of the csbm task; a `UserError` for other tasks' batches."""
    if not (hasattr(batch, "source") and hasattr(batch, "target") and hasattr(batch, "train_mask")):
        raise UserError(
            f"method '{method}' needs a source/target graph pair (the csbm task); got {type(batch).__name__}"
        )
    return batch


class EncoderMethod(Method):
    """Base of the graph methods: train every parameter of a `GraphNet` (any encoder: ``--model gnn``, ``gcn`` or
    ``graph-mlp``, or ``METHOD@MODEL`` as a baseline)."""

    learning_rate = 1e-2
    model_families = ("gnn",)

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.seed, self.epoch, self.epochs = 0, 0, 1

    def prepare(self, model: nn.Module) -> nn.Module:
        return graph_net(model, self.name).requires_grad_(True)

    def setup(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        graph_batch(data.train[0], self.name)
        self.seed = seed
        self.epoch = 0

    def plan(self, task: "Task", model: nn.Module, data: "TaskData", inputs: PlanInputs) -> list[Stage]:
        """One stage that keeps the epoch (`start_epoch`) for the pair draws and the pseudo-label warm-up."""
        return [dataclasses.replace(stage, on_epoch=self.start_epoch) for stage in super().plan(task, model, data,
                                                                                                 inputs)]

    def start_epoch(self, epoch: int, epochs: int) -> None:
        self.epoch, self.epochs = epoch, epochs

    def step_generator(self) -> torch.Generator:
        """A generator seeded by (seed, epoch): the same pairs after a resume."""
        return torch.Generator().manual_seed(int(self.seed) * 1_000_003 + int(self.epoch))


@methods.register
class MixedFilters(EncoderMethod):
    name = "mixed-filters"
    description = "HGDA's mixed low/high/full-pass filter encoder trained on the source only (no alignment)"

    def diagnostics(self, task: "Task", model: nn.Module, data: "TaskData") -> dict[str, float]:
        return mixing_weights(model)


def mixing_weights(model: nn.Module) -> dict[str, float]:
    """The learned branch weights w_b of a mixed-filter net (``mix_low``, ``mix_high``, ``mix_full``)."""
    encoder = getattr(model, "encoder", None)
    if encoder is None or not hasattr(encoder, "mix"):
        return {}
    return {f"mix_{branch}": float(w) for branch, w in zip(BRANCHES, encoder.mix.detach().cpu())}


@methods.register
class HomophilyAlignment(EncoderMethod):
    name = "homophily"
    description = "HGDA: mixed low/high/full-pass filters + per-branch source-target KL alignment + pseudo-labels"
    #: Named variants: ``homophily:released`` (the authors' pseudo-labels, the defaults), ``homophily:delayed``
    #: (the project's delayed, confidence-thresholded pseudo-labels); `VARIANTS`.
    variants = VARIANTS
    options = (
        Option("align_weight", float, 0.1, "weight λ_a of the per-branch KL alignment term"),
        Option("pseudo_weight", float, 0.1, "weight λ_p of the target pseudo-label cross-entropy"),
        Option(
            "pairing",
            str,
            "mean",
            "KL estimate: the domains' mean channel distributions, or random node pairs (authors' reading)",
            choices=PAIRINGS,
        ),
        Option(
            "pseudo_threshold",
            float,
            0.0,
            "least predicted probability of a target pseudo-label (0: all nodes, as released; homophily:delayed 0.9, "
            "the project's)",
        ),
        Option(
            "pseudo_warmup",
            float,
            0.0,
            "share of the epochs before the pseudo-label term starts (0: from the start, as released; "
            "homophily:delayed 0.5, the project's)",
        ),
    )

    def __init__(self, **options: Any):
        super().__init__(**options)
        for key in ("align_weight", "pseudo_weight"):
            if self.config[key] < 0:
                raise UserError(f"--{key.replace('_', '-')} must not be negative, got {self.config[key]}")
        if not 0.0 <= self.config["pseudo_warmup"] < 1.0:
            raise UserError(f"--pseudo-warmup must be in [0, 1), got {self.config['pseudo_warmup']}")
        if not 0.0 <= self.config["pseudo_threshold"] < 1.0:
            raise UserError(f"--pseudo-threshold must be in [0, 1), got {self.config['pseudo_threshold']}")

    def terms(self, model: nn.Module, batch: Any, pseudo: bool = True) -> dict[str, torch.Tensor]:
        """The loss terms on one source/target pair (source CE on the training nodes); the pseudo-label term only
        with ``pseudo``."""
        batch = graph_batch(batch, self.name)
        z_s, parts_s = model.embed(batch.source)
        z_t, parts_t = model.embed(batch.target)
        logits_s, logits_t = model.head(z_s), model.head(z_t)
        mask = batch.train_mask
        terms = {
            "source": F.cross_entropy(logits_s[mask], batch.source.y[mask]),
            "alignment": branch_alignment(parts_s, parts_t, self.config["pairing"], self.step_generator()),
        }
        if pseudo:
            terms["pseudo"] = pseudo_label_loss(logits_t, self.config["pseudo_threshold"])
        return terms

    def loss(self, task: "Task", model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        if not training:
            return task.loss(model, batch, training)
        active = self.pseudo_active()
        terms = self.terms(model, batch, pseudo=active)
        loss = terms["source"] + self.config["align_weight"] * terms["alignment"]
        return loss + self.config["pseudo_weight"] * terms["pseudo"] if active else loss

    def pseudo_active(self) -> bool:
        """Whether the pseudo-label term is on in the current epoch (after ``pseudo_warmup`` of the epochs)."""
        return self.epoch >= self.config["pseudo_warmup"] * self.epochs

    def diagnostics(self, task: "Task", model: nn.Module, data: "TaskData") -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            device = device_of(model)
            terms = self.terms(model, task.collate(data.train, device))
        return {**mixing_weights(model), **{f"final_{name}_loss": float(value) for name, value in terms.items()}}

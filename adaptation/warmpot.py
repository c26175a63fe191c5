"""WARMPOT: partial domain adaptation with partial optimal transport (the solver, the weights, the method).

Method: WARMPOT (seed 000 of this project, ``METHODS.md``; formula *unverified*), after m-POT:
Nguyen et al., "Improving Mini-batch Optimal Transport via Partial Transportation", ICML 2022.
In partial domain adaptation the target classes are a subset of the source classes. Only a mass
``m < 1`` of the source is transported to the target, so source samples of classes the target lacks
(outlier classes) can stay untransported; their share of the plan gives them a loss weight near 0.

The authors' recipe (m-POT, as ``METHODS.md`` records it) and where this module departs from it:

* Kept: minibatch plans on ``C = η1·‖g(x_s) − g(x_t)‖² + η2·(−log p_t[y_s])``, the mass annealed from
  0.01 to α over the first half of training, ``loss = weighted CE + η3·⟨π, C⟩``.
* Checkpoint selection (not given there): the workbench keeps the epoch of the lowest validation loss, and
  WARMPOT's validation loss weights each source class by its mean β. As ``0 <= β <= 1/m``, the weights
  concentrate while the mass is small, so the losses of epochs at different masses are not comparable: on
  the generated partial-DA problem an epoch at mass ≈ 0.06 won (outlier share 0.165 over 3 seeds). Here
  only epochs at the full mass can be chosen (`TrainSettings.select_from`; early stopping and the
  learning-rate plateau schedule count from there too), where the weights have one scale.
* Label term: in m-POT (and DeepJDOT, JUMBOT) its gradient trains the target predictions toward the
  labels of the source samples the plan matched them with. The plan starts from the source-only
  classifier, whose mistakes (target samples of a shared class predicted as an outlier class) make the
  outlier-class sources the cheap match; that gradient then teaches the mistake back to the classifier.
  Here the label term still chooses the pairs (its value in ``C`` is unchanged) but carries no gradient
  (``--label-gradient`` restores the authors' choice). Measured with the selection above, 3 seeds
  (``benchmarks/partial_da_weights.py``): outlier share 0.106 → 0.075, target accuracy 0.806 → 0.824.
  Weighting the label term by the target prediction's confidence, annealing it from 0 with the mass, or
  correcting the predictions by the plans' class weights moved the share by less than 0.02 there.

Partial optimal transport (Chapel et al., "Partial Optimal Transport with Applications on
Positive-Unlabeled Learning", NeurIPS 2020) of mass ``m`` between weights ``a (n,)``, ``b (n_t,)``::

    π* = argmin_π  ⟨π, C⟩ + reg · Σ_ij π_ij log π_ij
         s.t.  π ≥ 0,   π 1 ≤ a,   πᵀ 1 ≤ b,   1ᵀ π 1 = m ≤ min(Σ a, Σ b).

``reg = None`` solves the exact problem (``reg = 0``) with POT's network simplex (CPU, no gradient).
``reg > 0`` is solved here, in torch, by iterative Bregman (KL) projections with Dykstra corrections
(Benamou, Carlier, Cuturi, Nenna & Peyré, "Iterative Bregman Projections for Regularized
Transportation Problems", SIAM J. Sci. Comput. 2015, prop. 5) — the fixed point of POT's
``ot.partial.entropic_partial_wasserstein``. Every iterate has the form
``π_ij = exp(f_i + g_j − C_ij / reg)``, so the solver keeps the log-potentials ``f, g`` and only ever
evaluates ``logsumexp``; ``exp(−C / reg)`` is never formed, and small ``reg`` neither underflows nor
gives NaN. One iteration, with Dykstra corrections ``p (n,)``, ``q (n_t,)`` (both start at 0)::

    f ← f + p;   s = min(log a − LSE_j(f_i + g_j − C_ij/reg), 0);   f ← f + s;   p ← −s   (rows ≤ a)
    g ← g + q;   t = min(log b − LSE_i(f_i + g_j − C_ij/reg), 0);   g ← g + t;   q ← −t   (cols ≤ b)
    f ← f + log m − LSE_ij(f_i + g_j − C_ij/reg)                                           (mass = m)

(the mass set is affine, so its Dykstra correction is a constant that cancels). Each iteration costs
two ``logsumexp`` passes over ``C`` — ``O(n · n_t)`` — where POT's ``diag(·) @ K`` is ``O(n² n_t)``.
The last projection of every iteration is onto the mass, so the returned plan carries exactly ``m``.

Example::

    >>> cost = torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float64)
    >>> a, b = torch.tensor([0.1, 0.2]), torch.tensor([0.1, 0.1])
    >>> partial_plan(cost, a, b, mass=0.1)  # exact: all of it from source 0 to target 0
    tensor([[0.1000, 0.0000],
            [0.0000, 0.0000]], dtype=torch.float64)
    >>> partial_plan(cost, a, b, mass=0.1, reg=1.0).sum(dim=1)  # entropic: spread, rows still <= a
    tensor([0.0881, 0.0119], dtype=torch.float64)
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from workbench.adaptation.source_weighting import effective_sample_share, outlier_weight_share
from workbench.adaptation.task_needs import ClassLabels, Embeddings, PerSampleLosses

from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.options import Option
from workbench.core.registry import methods

if TYPE_CHECKING:
    from workbench.core.task import Task, TaskData


def _as_float_tensor(value, name: str, like: torch.Tensor) -> torch.Tensor:
    try:
        return torch.as_tensor(value, dtype=like.dtype, device=like.device)  # a float goes straight to like's dtype
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{name} must be a tensor or array of numbers, got {type(value).__name__}") from error


def _check_weights(weights: torch.Tensor, name: str, batch: int | None, size: int, side: str) -> torch.Tensor:
    """Validate ``a`` or ``b``: shape ``(size,)`` or ``(batch, size)``, finite, non-negative; returns it batched."""
    expected = f"({size},)" if batch is None else f"({size},) or ({batch}, {size})"
    if weights.shape == (size,):
        weights = weights.expand(1 if batch is None else batch, size)
    elif batch is None or weights.shape != (batch, size):
        raise ValueError(
            f"{name} must have shape {expected} to match the {side} axis of cost, got {tuple(weights.shape)}"
        )
    if not bool(torch.isfinite(weights).all()):
        raise ValueError(f"{name} has NaN or inf entries; expected finite weights >= 0")
    if bool((weights < 0).any()):
        raise ValueError(f"{name} has negative entries (min {weights.min().item():.3g}); expected weights >= 0")
    return weights


def _check_problem(cost, a, b, mass, reg, max_iter, tol):
    """Validate `partial_plan`'s inputs; returns ``(cost (B, n, m), a (B, n), b (B, m), mass (B,), batched)``."""
    if not isinstance(cost, torch.Tensor):
        cost = torch.as_tensor(cost)
    if not cost.is_floating_point():
        cost = cost.to(torch.get_default_dtype())
    if cost.dim() not in (2, 3):
        raise ValueError(f"cost must have shape (n, m) or (batch, n, m), got {tuple(cost.shape)}")
    if cost.numel() == 0:
        raise ValueError(
            f"cost is empty (shape {tuple(cost.shape)}); expected at least one source row and one target column"
        )
    bad = int((~torch.isfinite(cost)).sum())
    if bad:
        raise ValueError(f"cost has {bad} non-finite entries (NaN or inf); expected a finite cost matrix")
    batched = cost.dim() == 3
    batch = cost.shape[0] if batched else None
    n, m = cost.shape[-2:]
    a = _check_weights(_as_float_tensor(a, "a", cost), "a", batch, n, "source (rows, dim -2)")
    b = _check_weights(_as_float_tensor(b, "b", cost), "b", batch, m, "target (columns, dim -1)")

    n_problems = batch if batched else 1
    mass_t = _as_float_tensor(mass, "mass", cost)
    if mass_t.dim() == 0:
        mass_t = mass_t.expand(n_problems)
    elif mass_t.shape != (n_problems,):
        raise ValueError(
            f"mass must be a number or have shape ({n_problems},) (one per problem), got {tuple(mass_t.shape)}"
        )
    capacity = torch.minimum(a.sum(-1), b.sum(-1))
    slack = 1 + 16 * torch.finfo(cost.dtype).eps  # weights summing to 1 up to rounding still allow mass = 1
    out_of_range = ~torch.isfinite(mass_t) | (mass_t <= 0) | (mass_t > capacity * slack)
    if bool(out_of_range.any()):
        k = int(out_of_range.nonzero()[0, 0])
        where = f" (problem {k})" if batched else ""
        raise ValueError(
            f"mass must be in (0, min(sum a, sum b)] = (0, {capacity[k].item():.6g}]{where}, got {mass_t[k].item():.6g}"
        )
    mass_t = torch.minimum(mass_t, capacity)

    if reg is not None and not (isinstance(reg, (int, float)) and math.isfinite(reg) and reg > 0):
        raise ValueError(f"reg must be None (exact partial OT) or a positive finite number, got {reg!r}")
    if not (isinstance(max_iter, int) and max_iter >= 1):
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    if not (isinstance(tol, (int, float)) and tol >= 0):
        raise ValueError(f"tol must be a number >= 0, got {tol!r}")
    if not batched:
        cost = cost.unsqueeze(0)
    return cost, a, b, mass_t, batched


def _exact_partial_plan(cost: torch.Tensor, a: torch.Tensor, b: torch.Tensor, mass: float) -> np.ndarray:
    """Exact partial OT of one problem through ``ot.partial.partial_wasserstein`` (float64 numpy)."""
    import ot

    cost_np = cost.detach().cpu().double().numpy()
    low, high = float(cost_np.min()), float(cost_np.max())
    if low < 0 or high <= 0:
        # POT's reservoir costs 2·max(C), which keeps mass out of the reservoir-to-reservoir cell only for
        # C >= 0 with a positive entry. With the mass fixed, a constant shift leaves the optimal plan unchanged.
        cost_np = cost_np - low + (high - low if high > low else 1.0)
    a_np = a.detach().cpu().double().numpy()
    b_np = b.detach().cpu().double().numpy()
    mass = min(mass, float(a_np.sum()), float(b_np.sum()))
    return ot.partial.partial_wasserstein(a_np, b_np, cost_np, m=mass)


# Elements per block of rows: on a CPU a block of 2^17 float64 (1 MiB) stays in cache through the
# add / max / subtract / exp / sum passes of a logsumexp, which are memory-bound on the whole matrix
# (about 2x faster at n = 2048, 2.5x at 8192). A GPU takes the whole matrix in one block.
_CPU_BLOCK_ELEMENTS = 2**17
_GPU_BLOCK_ELEMENTS = 2**28


class _RowBlocks:
    """Blocks of rows of a ``(B, rows, cols)`` log-kernel, with one reusable buffer per block shape."""

    def __init__(self, log_kernel: torch.Tensor):
        self.log_kernel = log_kernel
        batch, rows, cols = log_kernel.shape
        budget = _CPU_BLOCK_ELEMENTS if log_kernel.device.type == "cpu" else _GPU_BLOCK_ELEMENTS
        self.step = max(1, min(rows, budget // (batch * cols)))
        self.buffer = torch.empty(batch, self.step, cols, dtype=log_kernel.dtype, device=log_kernel.device)
        self.spare = None

    def __iter__(self):
        rows = self.log_kernel.shape[1]
        for start in range(0, rows, self.step):
            stop = min(start + self.step, rows)
            yield slice(start, stop), self.log_kernel[:, start:stop], self.buffer[:, : stop - start]

    def logsumexp(self, row_potential: torch.Tensor, column_potential: torch.Tensor) -> torch.Tensor:
        """``u_i + LSE_j(K_ij + v_j)``, K the log-kernel. Shapes: u ``(B, rows)``, v ``(B, cols)`` -> ``(B, rows)``."""
        out = torch.empty_like(row_potential)
        for rows, block, x in self:
            torch.add(block, column_potential.unsqueeze(-2), out=x)
            top = x.amax(dim=-1, keepdim=True).nan_to_num_(neginf=0.0)  # all -inf: the sum is 0, its log -inf
            out[:, rows] = x.sub_(top).exp_().sum(dim=-1).log_().add_(top.squeeze(-1))
        return out.add_(row_potential)

    def plan_change(self, f: torch.Tensor, g: torch.Tensor, f_old: torch.Tensor, g_old: torch.Tensor) -> torch.Tensor:
        """``‖π − π_old‖_F``, plans ``exp(f_i + g_j + K_ij)``. Shapes: f ``(B, rows)``, g ``(B, cols)`` -> ``(B,)``."""
        if self.spare is None:
            self.spare = torch.empty_like(self.buffer)
        total = torch.zeros(f.shape[0], dtype=f.dtype, device=f.device)
        for rows, block, x in self:
            y = self.spare[:, : x.shape[1]]
            torch.add(block, g.unsqueeze(-2), out=x).add_(f[:, rows].unsqueeze(-1)).exp_()
            torch.add(block, g_old.unsqueeze(-2), out=y).add_(f_old[:, rows].unsqueeze(-1)).exp_()
            total += x.sub_(y).square_().sum(dim=(-2, -1))
        return total.sqrt_()


@torch.no_grad()
def _entropic_partial_plan(
    cost: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    mass: torch.Tensor,
    reg: float,
    max_iter: int,
    tol: float,
    check_every: int,
) -> torch.Tensor:
    """Log-domain Dykstra iterations (see the module docstring); every problem of the batch stops on its own.

    Shapes:
        cost ``(B, n, m)``, a ``(B, n)``, b ``(B, m)``, mass ``(B,)`` -> plan ``(B, n, m)``.
    """
    log_kernel = cost / -reg
    rows = _RowBlocks(log_kernel)  # row sums read K, column sums its contiguous transpose
    columns = _RowBlocks(log_kernel.transpose(-2, -1).contiguous())
    log_a, log_b, log_mass = a.log(), b.log(), mass.log()
    has_a, has_b = a > 0, b > 0
    minus_inf = torch.tensor(-math.inf, dtype=cost.dtype, device=cost.device)

    # POT's start, K = exp(−C/reg) · m / Σ exp(−C/reg), as potentials
    g = torch.zeros_like(b)
    f = torch.zeros_like(a)
    f += (log_mass - torch.logsumexp(rows.logsumexp(f, g), dim=-1)).unsqueeze(-1)
    p = torch.zeros_like(a)  # Dykstra corrections of the row and column projections
    q = torch.zeros_like(b)
    active = torch.ones(cost.shape[0], dtype=torch.bool, device=cost.device)

    for iteration in range(max_iter):
        f_new = f + p
        s = torch.where(has_a, (log_a - rows.logsumexp(f_new, g)).clamp_(max=0), minus_inf)
        f_new = f_new + s
        g_new = g + q
        column = columns.logsumexp(g_new, f_new)
        t = torch.where(has_b, (log_b - column).clamp_(max=0), minus_inf)
        g_new = g_new + t
        f_new = f_new + (log_mass - torch.logsumexp(column + t, dim=-1)).unsqueeze(-1)

        keep = active.unsqueeze(-1)  # a converged problem keeps its potentials: batched == looped
        f_old, g_old = f, g
        f, g = torch.where(keep, f_new, f), torch.where(keep, g_new, g)
        p = torch.where(keep, torch.where(has_a, -s, 0), p)  # rows with a_i = 0 stay at f_i = -inf
        q = torch.where(keep, torch.where(has_b, -t, 0), q)
        if tol > 0 and iteration % check_every == 0:
            error = rows.plan_change(f, g, f_old, g_old)  # POT's err: ‖π_k − π_(k−1)‖_F
            active = active & ~(error <= tol)
            if not bool(active.any()):
                break
    plan = torch.add(log_kernel, f.unsqueeze(-1), out=cost.new_empty(cost.shape))
    return plan.add_(g.unsqueeze(-2)).exp_()


def partial_plan(
    cost: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    mass: float | torch.Tensor,
    reg: float | None = None,
    *,
    max_iter: int = 1000,
    tol: float = 1e-9,
    check_every: int = 10,
) -> torch.Tensor:
    """Partial optimal transport plan of total mass ``mass`` (exact, or entropic in torch).

    Transports at most ``a_i`` out of source ``i``, at most ``b_j`` into target ``j``, exactly ``mass``
    in total (see the module docstring for the problem and the iterations).

    Args:
        cost: transport cost ``C`` (any units; ``reg`` is in the same units).
        a, b: source and target weights, ``>= 0``; shared by the batch when 1-D.
        mass: mass ``m`` to transport, in ``(0, min(Σ a, Σ b)]``; a number or one per problem.
        reg: ``None`` (default) for exact partial OT through POT (CPU network simplex, a loop over
            the batch); ``> 0`` for the entropic problem solved here (any device, whole batch at once).
        max_iter: entropic only — maximum number of iterations (default 1000).
        tol: entropic only — a problem stops once ``‖π_k − π_(k−1)‖_F <= tol`` (Frobenius norm of the
            change of the plan over one iteration, the quantity POT's ``stopThr`` bounds; default 1e-9).
            In float32 rounding noise can keep this above 1e-9: use e.g. ``tol=1e-7`` there.
        check_every: entropic only — the change is measured at iterations 0, ``check_every``, …
            (default 10, as POT), sparing a device sync and a plan evaluation every iteration.

    Threads: it computes with torch's thread count as the caller left it (a run sets it by its policy). Called from
    a notebook on a busy machine, wrap it in ``with workbench.run.threads.following_load(): ...`` (one thread per core
    beside a busy process is several times slower, `benchmarks/threads_under_load.py`).

    Returns:
        The plan, same dtype and device as ``cost``, without gradient: by the envelope theorem the
        gradient of the (exact) partial OT cost in ``C`` is the plan itself, so use ``(plan * C).sum()``.

    Raises:
        ValueError: a non-finite or empty ``cost``, weights of the wrong shape, negative or non-finite
            weights, ``mass`` outside ``(0, min(Σ a, Σ b)]``, ``reg <= 0``, bad ``max_iter``/``tol``.

    Shapes:
        cost ``(n, m)`` or ``(batch, n, m)``; a ``(n,)`` or ``(batch, n)``; b ``(m,)`` or ``(batch, m)``;
        mass ``()`` or ``(batch,)`` -> plan, same shape as ``cost``.
    """
    if not (isinstance(check_every, int) and check_every >= 1):
        raise ValueError(f"check_every must be a positive integer, got {check_every!r}")
    cost, a, b, mass, batched = _check_problem(cost, a, b, mass, reg, max_iter, tol)
    if reg is None:
        plans = [
            torch.from_numpy(_exact_partial_plan(cost[k], a[k], b[k], float(mass[k]))) for k in range(cost.shape[0])
        ]
        plan = torch.stack(plans).to(dtype=cost.dtype, device=cost.device)
    else:
        plan = _entropic_partial_plan(cost.detach(), a, b, mass, float(reg), max_iter, tol, check_every)
    return plan if batched else plan[0]


def source_weights(
    source_features: torch.Tensor,
    target_features: torch.Tensor,
    source_labels: torch.Tensor,
    target_probs: torch.Tensor | None = None,
    mass: float = 0.5,
    reg: float | None = None,
    *,
    feature_weight: float = 1.0,
    label_weight: float = 1.0,
    normalize_features: bool = True,
    prob_floor: float = 1e-8,
    max_iter: int = 1000,
    tol: float = 1e-9,
) -> torch.Tensor:
    """One loss weight per source sample, mean 1, from the partial transport plan to the target.

    With uniform weights ``a = 1/n_s``, ``b = 1/n_t`` and the plan ``π`` of `partial_plan` (mass
    ``m = mass``) for the joint cost (m-POT's, WARMPOT in ``METHODS.md``)::

        C_ij = η1 · ‖f_s,i − f_t,j‖² / mean_ij ‖f_s,i − f_t,j‖²  +  η2 · (−log max(p_t,j[y_s,i], floor)),

    the weights are ``β_i = n_s · Σ_j π_ij / m``. The feature term is divided by its mean over all
    pairs (``normalize_features=True``) so ``η1`` does not depend on the scale of the features; the
    label term (only when ``target_probs`` is given) costs sending a source sample of class ``y`` to a
    target sample the model thinks is unlikely to be of class ``y``.

    Why: the row constraint ``π 1 <= a`` gives ``Σ_j π_ij <= 1/n_s``, so ``0 <= β_i <= 1/m``: a source
    sample can at most be fully transported. The plan carries exactly ``m``, so
    ``mean_i β_i = (1/n_s) · n_s · Σ_ij π_ij / m = 1`` — the weighted source loss keeps its scale.
    Outlier classes: let a fraction ``ρ`` of the source samples belong to classes the target has
    (shared classes); together their rows can send up to ``ρ``. If an outlier-class row ``i`` sends
    mass to target ``j`` while ``m <= ρ``, the shared rows send less than ``m <= ρ``, so some shared
    row ``k`` has room left; moving that mass from ``(i, j)`` to ``(k, j)`` keeps every constraint and
    changes the cost by ``C_kj − C_ij``. So when every target sample is cheaper to reach from any
    shared-class sample than from any outlier-class one (well separated classes, or the label term of
    a decent classifier), the exact plan gives outlier classes ``β = 0`` — entropic plans
    ``~exp(−gap / reg)`` — and the shared classes mean ``1/ρ``. With ``m > ρ`` at least ``m − ρ`` has
    to come from outlier classes: keep ``mass`` at most the (expected) shared share of the source.

    Args:
        source_features, target_features: features ``f_s``, ``f_t`` (e.g. the backbone's output).
        source_labels: source class indices ``y_s`` (used by the label term only; always checked).
        target_probs: target class probabilities ``p_t`` (softmax of the model), or None for no label term.
        mass: transported mass ``m`` in ``(0, 1]`` (default 0.5).
        reg: None for exact partial OT (default), or the entropic regularisation in units of ``C``.
        feature_weight, label_weight: ``η1``, ``η2`` (default 1 and 1).
        normalize_features: divide the squared distances by their mean (default True).
        prob_floor: probabilities are clamped to at least this before the log (default 1e-8).
        max_iter, tol: passed to `partial_plan` (entropic only).

    Returns:
        ``β``, float tensor on the features' device, without gradient (a constant of the loss). It is
        divided by ``Σ_ij π_ij`` (``= m`` up to rounding), which makes the mean 1 to the last digit.

    Shapes:
        source_features ``(n_s, d)``, target_features ``(n_t, d)``, source_labels ``(n_s,)`` int,
        target_probs ``(n_t, n_classes)`` -> ``(n_s,)``.
    """
    source_features, target_features, source_labels = _checked_inputs(
        source_features, target_features, source_labels, feature_weight, label_weight, prob_floor
    )
    n_s, n_t = source_features.shape[0], target_features.shape[0]
    dtype = source_features.dtype
    with torch.no_grad():
        cost = _joint_cost(
            source_features,
            target_features,
            source_labels,
            target_probs,
            feature_weight,
            label_weight,
            normalize_features,
            prob_floor,
        )
        uniform_s = torch.full((n_s,), 1.0 / n_s, dtype=dtype, device=cost.device)
        uniform_t = torch.full((n_t,), 1.0 / n_t, dtype=dtype, device=cost.device)
        plan = partial_plan(cost, uniform_s, uniform_t, mass, reg, max_iter=max_iter, tol=tol)
        return plan.sum(dim=1) * (n_s / plan.sum())  # Σ π = m up to rounding; this makes the mean 1 exactly


def _checked_inputs(
    source_features: torch.Tensor,
    target_features: torch.Tensor,
    source_labels: torch.Tensor,
    feature_weight: float,
    label_weight: float,
    prob_floor: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`source_weights`' inputs checked; returns the features ``(n_s, d)``, ``(n_t, d)`` detached in one float
    dtype and the labels ``(n_s,)``."""
    source_features = torch.as_tensor(source_features)
    target_features = torch.as_tensor(target_features, device=source_features.device)
    if source_features.dim() != 2 or target_features.dim() != 2 or source_features.shape[1] != target_features.shape[1]:
        raise ValueError(
            "source_features and target_features must have shapes (n_s, d) and (n_t, d) with the same d, got "
            f"{tuple(source_features.shape)} and {tuple(target_features.shape)}"
        )
    n_s, n_t = source_features.shape[0], target_features.shape[0]
    if n_s == 0 or n_t == 0:
        raise ValueError(f"source_features ({n_s} rows) and target_features ({n_t} rows) must not be empty")
    dtype = source_features.dtype if source_features.is_floating_point() else torch.get_default_dtype()
    source_features = source_features.detach().to(dtype)
    target_features = target_features.detach().to(dtype)
    source_labels = torch.as_tensor(source_labels, device=source_features.device)
    if source_labels.shape != (n_s,) or source_labels.is_floating_point() or source_labels.is_complex():
        raise ValueError(
            f"source_labels must be integer class indices of shape ({n_s},), got {source_labels.dtype} "
            f"of shape {tuple(source_labels.shape)}"
        )
    if not (
        math.isfinite(feature_weight) and feature_weight >= 0 and math.isfinite(label_weight) and label_weight >= 0
    ):
        raise ValueError(f"feature_weight and label_weight must be >= 0, got {feature_weight!r} and {label_weight!r}")
    if not 0 < prob_floor < 1:
        raise ValueError(f"prob_floor must be in (0, 1), got {prob_floor!r}")
    return source_features, target_features, source_labels


def _joint_cost(
    source_features: torch.Tensor,
    target_features: torch.Tensor,
    source_labels: torch.Tensor,
    target_probs: torch.Tensor | None,
    feature_weight: float,
    label_weight: float,
    normalize_features: bool,
    prob_floor: float,
) -> torch.Tensor:
    """`source_weights`' cost ``C`` ``(n_s, n_t)``: scaled squared feature distance plus the label term; no gradient."""
    n_t = target_features.shape[0]
    dtype = source_features.dtype
    distance = torch.cdist(source_features, target_features).square_()
    if normalize_features:
        scale = distance.mean()
        if scale > 0:
            distance = distance / scale
    cost = feature_weight * distance
    if target_probs is not None:
        probs = torch.as_tensor(target_probs, device=source_features.device).detach().to(dtype)
        if probs.dim() != 2 or probs.shape[0] != n_t:
            raise ValueError(f"target_probs must have shape ({n_t}, n_classes), got {tuple(probs.shape)}")
        if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
            raise ValueError("target_probs has negative or non-finite entries; expected class probabilities")
        n_classes = probs.shape[1]
        if bool(((source_labels < 0) | (source_labels >= n_classes)).any()):
            raise ValueError(
                f"source_labels must be in [0, {n_classes}) (the columns of target_probs), got values in "
                f"[{int(source_labels.min())}, {int(source_labels.max())}]"
            )
        label_cost = -probs.clamp_min(prob_floor).log()  # (n_t, n_classes)
        cost = cost + label_weight * label_cost[:, source_labels.long()].T
    return cost


def full_mass_epoch(anneal: float, epochs: int) -> int:
    """First epoch (0-based) trained at the full mass when it grows over the first ``anneal`` share of ``epochs``
    epochs (``ceil(anneal · epochs)``), at most the last epoch."""
    if not (0 <= anneal <= 1 and isinstance(epochs, int) and epochs >= 1):
        raise ValueError(f"need anneal in [0, 1] and a whole number of epochs >= 1, got {anneal!r} and {epochs!r}")
    return min(math.ceil(anneal * epochs), epochs - 1)


@methods.register
class Warmpot(Method):
    """WARMPOT training: partial-OT weighted source loss plus the partial-Wasserstein alignment term.

    Each step pairs the source batch with a target batch drawn from the unlabelled adaptation pool
    (seeded by seed, epoch and step, so an interrupted run resumes exactly), computes the joint cost
    ``C = η1·‖g(x_s) − g(x_t)‖²/mean + η2·(−log p_t[y_s])`` on the learned features ``g`` and the
    target predictions, solves the partial plan π of mass m on ``C`` (detached), and minimises

        L = mean_i β_i CE_i + η3 · ⟨π, C⟩,     β_i = n_s · Σ_j π_ij / m

    (gradients flow through the feature term of ``C`` into both domains' features: the alignment term;
    through its label term only with ``label_gradient``, see the module docstring). The mass grows
    linearly from ``mass_start`` to ``mass`` over the first ``anneal`` share of the epochs. Validation
    weights each source sample's loss by its class's mean β over the epoch just trained (classes the
    plans left out stop counting), so early stopping tracks the shared-class source risk; only epochs
    from `full_mass_epoch` on, trained at the full mass, can be chosen, as β's scale follows the mass.
    """

    name = "warmpot"
    description = "WARMPOT: partial-OT source weights + partial-Wasserstein feature alignment (partial DA)"
    needs_task = ("target_pool", Embeddings, ClassLabels, PerSampleLosses)
    options = (
        Option("mass", float, 0.4, "transported mass α, below the share of source samples of shared classes"),
        Option("mass_start", float, 0.01, "mass at the first epoch (annealed up to --mass)"),
        Option("anneal", float, 0.5, "share of the epochs over which the mass grows"),
        Option("reg", float, 0.0, "entropic regularisation of the minibatch plans (0: exact partial OT)"),
        Option("feature_weight", float, 1.0, "η1: weight of the feature distance in the cost"),
        Option("label_weight", float, 1.0, "η2: weight of the label term −log p_t[y_s] in the cost"),
        Option("align_weight", float, 1.0, "η3: weight of the alignment term ⟨π, C⟩ in the loss"),
        Option(
            "label_gradient",
            bool,
            False,
            "let the label term of ⟨π, C⟩ train the target predictions toward the matched source labels (m-POT)",
        ),
    )

    def __init__(self, **options: Any):
        super().__init__(**options)
        config = self.config
        if not 0 < config["mass"] <= 1 or not 0 < config["mass_start"] <= config["mass"]:
            raise UserError(f"need 0 < --mass-start <= --mass <= 1, got {config['mass_start']} and {config['mass']}")
        if not 0 <= config["anneal"] <= 1 or config["reg"] < 0:
            raise UserError("--anneal must be in [0, 1] and --reg at least 0")
        self.mass, self.epoch, self.step = config["mass_start"], 0, 0

    def prepare(self, model: nn.Module) -> nn.Module:
        return model.requires_grad_(True)

    def plan(self, task: "Task", model: nn.Module, data: "TaskData", inputs: PlanInputs) -> list[Stage]:
        """One stage with the transported mass annealed per epoch (`start_epoch`), of which only epochs at the full
        mass can be chosen (`TrainSettings.select_from`): see the class docstring."""
        settings = inputs.settings
        settings = dataclasses.replace(settings, select_from=full_mass_epoch(self.config["anneal"], settings.epochs))
        return [Stage("train", data.train, data.val, settings, partial(self.loss, task), on_epoch=self.start_epoch)]

    def setup(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        self.target, self.seed = data.target, seed
        self.device = device_of(model)

    def start_epoch(self, epoch: int, epochs: int) -> None:
        ramp = 1.0 if self.config["anneal"] == 0 else min(1.0, epoch / (self.config["anneal"] * epochs))
        self.mass = self.config["mass_start"] + ramp * (self.config["mass"] - self.config["mass_start"])
        self.epoch, self.step = epoch, 0
        self.class_weight_sum, self.class_count = None, None  # per-class β of this epoch, for validation

    def _target_batch(self, task: "Task", size: int) -> Any:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 10_007 + self.step)
        picks = torch.randperm(len(self.target), generator=generator)[:size].tolist()
        return task.collate([self.target[i] for i in picks], self.device)

    def joint_cost(self, source_features, target_features, source_labels, target_logits) -> torch.Tensor:
        """C (n_s, n_t): normalised squared feature distance plus the label term ``−log p_t[y_s]``.

        The feature term carries gradients into both domains' features; the label term carries them into the
        target predictions only with ``--label-gradient`` (see the module docstring); its value is the same either
        way. Shapes: features ``(n_s, d)``, ``(n_t, d)``, source_labels ``(n_s,)``, target_logits
        ``(n_t, n_classes)`` -> ``(n_s, n_t)``.
        """
        distance = torch.cdist(source_features, target_features) ** 2
        cost = self.config["feature_weight"] * distance / distance.detach().mean().clamp_min(1e-12)
        if self.config["label_weight"]:
            logits = target_logits if self.config["label_gradient"] else target_logits.detach()
            log_probs = torch.log_softmax(logits, dim=-1)  # (n_t, n_classes)
            cost = cost - self.config["label_weight"] * log_probs[:, source_labels].T
        return cost

    def loss(self, task: "Task", model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        if not training:
            return self._validation_loss(task, model, batch)
        labels = task.batch_labels(batch)
        target = self._target_batch(task, len(labels))
        self.step += 1
        source_features, source_logits = task.embed(model, batch)
        target_features, target_logits = task.embed(model, target)
        cost = self.joint_cost(source_features, target_features, labels, target_logits)
        n_s, n_t = cost.shape
        a = torch.full((n_s,), 1.0 / n_s, dtype=cost.dtype, device=cost.device)
        b = torch.full((n_t,), 1.0 / n_t, dtype=cost.dtype, device=cost.device)
        plan = partial_plan(cost.detach(), a, b, self.mass, self.config["reg"] or None)
        weights = n_s * plan.sum(1) / self.mass
        self._record_class_weights(labels, weights, source_logits.shape[1])
        cross_entropy = torch.nn.functional.cross_entropy(source_logits, labels, reduction="none")
        return (weights * cross_entropy).mean() + self.config["align_weight"] * (plan * cost).sum()

    def _record_class_weights(self, labels: torch.Tensor, weights: torch.Tensor, n_classes: int) -> None:
        if self.class_weight_sum is None:
            self.class_weight_sum = torch.zeros(n_classes, dtype=weights.dtype, device=weights.device)
            self.class_count = torch.zeros_like(self.class_weight_sum)
        self.class_weight_sum.index_add_(0, labels, weights.detach())
        self.class_count.index_add_(0, labels, torch.ones_like(weights))

    def _validation_loss(self, task: "Task", model: nn.Module, batch: Any) -> torch.Tensor:
        """Source loss with class weights: the mean β of each class over the epoch's plans (1 before any)."""
        if self.class_weight_sum is None:
            return task.loss(model, batch, False)
        seen = self.class_count > 0
        class_weights = torch.where(
            seen,
            self.class_weight_sum / self.class_count.clamp_min(1),
            torch.ones_like(seen, dtype=self.class_count.dtype),
        )
        losses = task.sample_losses(model, batch)
        return (class_weights[task.batch_labels(batch)].to(losses.dtype) * losses).mean()

    def diagnostics(self, task: "Task", model: nn.Module, data: "TaskData") -> dict[str, float]:
        """Where the final model's full-data plan (source training set → target pool) puts the weight."""
        model.eval()
        with torch.no_grad():
            source_features, _ = task.embed(model, task.collate(data.train, self.device))
            target_features, target_logits = task.embed(model, task.collate(data.target, self.device))
        labels = task.batch_labels(task.collate(data.train, self.device))
        weights = source_weights(
            source_features,
            target_features,
            labels,
            torch.softmax(target_logits, dim=-1) if self.config["label_weight"] else None,
            mass=self.config["mass"],
            reg=self.config["reg"] or None,
            feature_weight=self.config["feature_weight"],
            label_weight=self.config["label_weight"],
        )
        result = {"weight_effective_sample_share": effective_sample_share(weights)}
        share = outlier_weight_share(task, data, weights)
        if share is not None:
            result["outlier_weight_share"] = share
        return result

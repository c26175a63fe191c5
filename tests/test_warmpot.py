"""WARMPOT's transport: `partial_plan` against POT, its constraints and edge cases; `source_weights`."""

from __future__ import annotations

import doctest
import json

import numpy as np
import ot
import pytest
import torch
from workbench.adaptation import warmpot
from workbench.adaptation.warmpot import partial_plan, source_weights
from workbench.domains.features import partial_da
from workbench.domains.features.partial_da import make_partial_da

import workbench as wb
from workbench.core.method import PlanInputs
from workbench.core.task import TaskData
from workbench.core.trainer import TrainSettings


def random_problem(seed: int, n: int = 30, m: int = 25, dim: int = 3):
    """Unit-scale squared-distance cost (max 1) and random weights summing to 1 and 1.2 (float64 numpy)."""
    rng = np.random.default_rng(seed)
    cost = ot.dist(rng.normal(size=(n, dim)), rng.normal(size=(m, dim)) + 0.5)
    cost /= cost.max()
    a = rng.uniform(0.2, 1.0, n)
    b = rng.uniform(0.2, 1.0, m)
    return cost, a / a.sum(), 1.2 * b / b.sum()


def check_constraints(plan: torch.Tensor, a, b, mass: float, atol: float) -> None:
    a, b = torch.as_tensor(a, dtype=plan.dtype), torch.as_tensor(b, dtype=plan.dtype)
    assert torch.isfinite(plan).all() and (plan >= 0).all()
    assert (plan.sum(-1) <= a + atol).all()
    assert (plan.sum(-2) <= b + atol).all()
    assert plan.sum().item() == pytest.approx(mass, abs=atol)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mass", [0.3, 0.9, 1.0])
def test_exact_plan_has_pots_optimal_cost(seed, mass):
    cost, a, b = random_problem(seed)
    reference = ot.partial.partial_wasserstein(a, b, cost, m=min(mass, a.sum()))  # POT rejects 1.0 > 1 - 1e-16
    plan = partial_plan(torch.from_numpy(cost), torch.from_numpy(a), torch.from_numpy(b), mass)
    assert plan.dtype == torch.float64 and plan.shape == cost.shape
    assert (plan.numpy() * cost).sum() == pytest.approx((reference * cost).sum(), rel=1e-12, abs=1e-14)
    check_constraints(plan, a, b, mass, atol=1e-12)


def test_exact_plan_of_a_negative_or_constant_cost():
    cost, a, b = random_problem(3)
    shifted = cost - 0.7  # POT's reservoir alone would mis-handle negative costs: the plan must not change
    reference = (ot.partial.partial_wasserstein(a, b, cost, m=0.6) * cost).sum()
    plan = partial_plan(torch.from_numpy(shifted), torch.from_numpy(a), torch.from_numpy(b), 0.6)
    assert (plan.numpy() * cost).sum() == pytest.approx(reference, rel=1e-12)
    check_constraints(plan, a, b, 0.6, atol=1e-12)
    flat = partial_plan(torch.zeros(5, 4), torch.full((5,), 0.2), torch.full((4,), 0.25), 0.5)
    check_constraints(flat, torch.full((5,), 0.2), torch.full((4,), 0.25), 0.5, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("reg", [0.1, 0.03])
def test_entropic_plan_matches_pot(seed, reg):
    cost, a, b = random_problem(seed)
    reference = ot.partial.entropic_partial_wasserstein(a, b, cost, reg, m=0.7, numItermax=20_000, stopThr=1e-14)
    plan = partial_plan(
        torch.from_numpy(cost), torch.from_numpy(a), torch.from_numpy(b), 0.7, reg, max_iter=20_000, tol=1e-14
    ).numpy()
    assert np.abs(plan - reference).max() < 1e-6
    assert (plan * cost).sum() == pytest.approx((reference * cost).sum(), abs=1e-6)


def test_same_stopping_rule_as_pot_gives_the_same_plan_before_convergence():
    cost, a, b = random_problem(4)
    for iterations in (1, 7, 25):
        reference = ot.partial.entropic_partial_wasserstein(a, b, cost, 0.02, m=0.5, numItermax=iterations)
        plan = partial_plan(torch.from_numpy(cost), a, b, 0.5, 0.02, max_iter=iterations, tol=1e-100).numpy()
        assert np.abs(plan - reference).max() < 1e-12
    # the same stopThr stops both at the same iteration, long before convergence here
    reference = ot.partial.entropic_partial_wasserstein(a, b, cost, 0.02, m=0.5, numItermax=1000, stopThr=1e-5)
    plan = partial_plan(torch.from_numpy(cost), a, b, 0.5, 0.02, tol=1e-5).numpy()
    converged = partial_plan(torch.from_numpy(cost), a, b, 0.5, 0.02, tol=1e-14, max_iter=20_000).numpy()
    assert np.abs(plan - reference).max() < 1e-12 < np.abs(plan - converged).max()


def test_small_reg_stays_finite_and_feasible():
    cost, a, b = random_problem(5, n=40, m=50)
    with np.errstate(all="ignore"):
        assert np.exp(-cost / 1e-3).min() == 0  # the multiplicative kernel underflows here
    plan = partial_plan(torch.from_numpy(cost), torch.from_numpy(a), torch.from_numpy(b), 0.8, 1e-3, max_iter=5000)
    check_constraints(plan, a, b, 0.8, atol=1e-6)
    exact = (ot.partial.partial_wasserstein(a, b, cost, m=0.8) * cost).sum()
    assert (plan.numpy() * cost).sum() == pytest.approx(exact, abs=5e-3)


def test_zero_weights_get_no_mass():
    cost, a, b = random_problem(6, n=12, m=10)
    a[[0, 5]], b[3] = 0.0, 0.0
    plan = partial_plan(torch.from_numpy(cost), torch.from_numpy(a), torch.from_numpy(b), 0.5, 0.05, tol=1e-13)
    assert (plan[[0, 5]] == 0).all() and (plan[:, 3] == 0).all()
    keep_a, keep_b = a > 0, b > 0
    reduced = ot.partial.entropic_partial_wasserstein(
        a[keep_a], b[keep_b], cost[keep_a][:, keep_b], 0.05, m=0.5, numItermax=20_000, stopThr=1e-13
    )
    assert np.abs(plan.numpy()[keep_a][:, keep_b] - reduced).max() < 1e-9


@pytest.mark.parametrize("reg", [None, 0.05])
def test_batched_equals_looped(reg):
    problems = [random_problem(seed, n=15, m=12) for seed in range(3)]
    cost = torch.stack([torch.from_numpy(c) for c, _, _ in problems])
    a = torch.stack([torch.from_numpy(a) for _, a, _ in problems])
    b = torch.stack([torch.from_numpy(b) for _, _, b in problems])
    mass = torch.tensor([0.3, 0.6, 1.0], dtype=torch.float64)
    cost[1] *= 3.0  # problems converging at different iterations
    batched = partial_plan(cost, a, b, mass, reg)
    assert batched.shape == cost.shape
    for k in range(3):
        looped = partial_plan(cost[k], a[k], b[k], float(mass[k]), reg)
        assert torch.allclose(batched[k], looped, rtol=0, atol=1e-13)
    shared = partial_plan(cost, a[0], b[0], 0.5, reg)  # 1-D weights are shared by the batch
    assert torch.allclose(shared[2], partial_plan(cost[2], a[0], b[0], 0.5, reg), rtol=0, atol=1e-13)


@pytest.mark.parametrize("reg", [None, 0.05])
def test_float32_in_float32_out(reg):
    cost, a, b = random_problem(7)
    plan64 = partial_plan(torch.from_numpy(cost), torch.from_numpy(a), torch.from_numpy(b), 0.5, reg)
    plan32 = partial_plan(torch.from_numpy(cost).float(), torch.from_numpy(a).float(), b, 0.5, reg, tol=1e-7)
    assert plan32.dtype == torch.float32
    check_constraints(plan32, a, b, 0.5, atol=1e-5)
    cost64 = (plan64.numpy() * cost).sum()
    assert (plan32.double().numpy() * cost).sum() == pytest.approx(cost64, rel=1e-4)


def test_plan_has_no_gradient_and_keeps_the_input():
    cost, a, b = random_problem(8)
    cost_t = torch.from_numpy(cost).requires_grad_(True)
    before = cost_t.detach().clone()
    plan = partial_plan(cost_t, a, b, 0.5, 0.1)
    assert not plan.requires_grad and torch.equal(cost_t.detach(), before)
    (plan * cost_t).sum().backward()  # the envelope-theorem gradient of the OT cost is the plan
    assert torch.equal(cost_t.grad, plan)


def bad(cost=None, a=None, b=None, mass=0.5, reg=0.1, **kwargs):
    return partial_plan(
        torch.rand(4, 3, dtype=torch.float64) if cost is None else cost,
        torch.full((4,), 0.25) if a is None else a,
        torch.full((3,), 1 / 3) if b is None else b,
        mass,
        reg,
        **kwargs,
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(cost=torch.tensor([[0.0, float("nan")], [1.0, 2.0]])), "cost has 1 non-finite"),
        (dict(cost=torch.tensor([[0.0, float("inf")], [1.0, 2.0]])), "non-finite"),
        (dict(cost=torch.zeros(0, 3)), "cost is empty"),
        (dict(cost=torch.zeros(2, 4, 0)), "cost is empty"),
        (dict(cost=torch.zeros(4)), r"cost must have shape \(n, m\) or \(batch, n, m\)"),
        (dict(a=torch.tensor([0.5, -0.1, 0.3, 0.3])), "a has negative entries"),
        (dict(b=torch.tensor([0.5, float("nan"), 0.5])), "b has NaN or inf"),
        (dict(a=torch.full((5,), 0.2)), r"a must have shape \(4,\)"),
        (dict(b=torch.full((2, 3), 0.3)), r"b must have shape \(3,\)"),
        (dict(mass=0.0), r"mass must be in \(0, min\(sum a, sum b\)\]"),
        (dict(mass=-1.0), "mass must be in"),
        (dict(mass=1.5), r"mass must be in \(0, min\(sum a, sum b\)\] = \(0, 1\]"),
        (dict(mass=float("nan")), "mass must be in"),
        (dict(cost=torch.rand(2, 4, 3), mass=torch.tensor([0.5, 0.5, 0.5])), r"mass must be a number or have shape"),
        (dict(cost=torch.rand(2, 4, 3), a=torch.full((2, 4), 0.1)), r"mass must be in .* \(problem 0\)"),
        (dict(reg=0.0), "reg must be None"),
        (dict(reg=-1.0), "reg must be None"),
        (dict(max_iter=0), "max_iter must be a positive integer"),
        (dict(tol=-1.0), "tol must be a number >= 0"),
        (dict(check_every=0), "check_every must be a positive integer"),
    ],
)
def test_bad_inputs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bad(**kwargs)


def test_mass_equal_to_total_weight_despite_rounding():
    n = 7
    a = torch.full((n,), 1 / n, dtype=torch.float32)  # sums to 1 only up to float32 rounding
    plan = partial_plan(torch.rand(n, n), a, a, 1.0, 0.1, tol=1e-7)
    assert plan.sum().item() == pytest.approx(1.0, abs=1e-5)


def test_make_partial_da_is_deterministic_and_has_the_stated_ground_truth():
    options = dict(n_classes=6, target_classes=[1, 4], n_source=60, n_target=400, rotation=0.4)
    first, again, other = (make_partial_da(**options, seed=seed) for seed in (3, 3, 4))
    assert np.array_equal(first.source_x, again.source_x) and np.array_equal(first.target_x, again.target_x)
    assert not np.array_equal(first.source_x, other.source_x)
    assert first.outlier_classes.tolist() == [0, 2, 3, 5] and first.target_classes.tolist() == [1, 4]
    assert set(first.target_y.tolist()) == {1, 4} and np.bincount(first.source_y).tolist() == [10] * 6
    assert first.shared_fraction == pytest.approx(1 / 3)
    rotation = first.rotation_matrix
    assert np.allclose(rotation @ rotation.T, np.eye(16)) and not np.allclose(rotation, np.eye(16))
    # undoing the shift brings the target back to the source's class means
    unshifted = (first.target_x - first.translation) @ rotation
    for k in (1, 4):
        assert np.linalg.norm(unshifted[first.target_y == k].mean(0) - first.class_means[k]) < 1.0
    with pytest.raises(ValueError, match="target_classes must be distinct"):
        make_partial_da(n_classes=4, target_classes=[1, 1])
    with pytest.raises(ValueError, match="target_classes must be between 1 and n_classes"):
        make_partial_da(n_classes=4, target_classes=5)


@pytest.mark.parametrize("reg", [None, 0.01])
def test_source_weights_ignore_outlier_classes_in_an_easy_problem(reg):
    problem = make_partial_da(
        n_classes=6, target_classes=3, n_source=180, n_target=90, dim=8, separation=20.0, shift=1.0, seed=0
    )
    weights = source_weights(
        torch.from_numpy(problem.source_x),
        torch.from_numpy(problem.target_x),
        torch.from_numpy(problem.source_y),
        mass=problem.shared_fraction,
        reg=reg,
    )
    assert weights.shape == (180,) and weights.mean().item() == pytest.approx(1.0, abs=1e-12)
    outlier = torch.from_numpy(problem.source_is_outlier)
    assert weights[outlier].max() < 1e-3
    assert weights[~outlier].mean().item() == pytest.approx(2.0, abs=1e-3)  # 1 / shared fraction


def test_source_weights_label_term_and_validation():
    problem = make_partial_da(n_classes=4, target_classes=2, n_source=80, n_target=40, seed=1)
    xs, xt = torch.from_numpy(problem.source_x), torch.from_numpy(problem.target_x)
    ys = torch.from_numpy(problem.source_y)
    probs = torch.nn.functional.one_hot(torch.from_numpy(problem.target_y), 4).double()  # an oracle classifier
    weights = source_weights(xs, xt, ys, probs, mass=0.5, reg=0.05, feature_weight=0.1, label_weight=1.0)
    assert weights.mean().item() == pytest.approx(1.0, abs=1e-12)
    assert weights[torch.from_numpy(problem.source_is_outlier)].max() < 1e-6
    assert (weights <= 1 / 0.5 + 1e-5).all()  # row constraint, up to the stopping tolerance
    with pytest.raises(ValueError, match="same d"):
        source_weights(xs, xt[:, :3], ys)
    with pytest.raises(ValueError, match=r"source_labels must be integer class indices of shape \(80,\)"):
        source_weights(xs, xt, ys[:10])
    with pytest.raises(ValueError, match=r"target_probs must have shape \(40, n_classes\)"):
        source_weights(xs, xt, ys, probs[:5])
    with pytest.raises(ValueError, match=r"source_labels must be in \[0, 3\)"):
        source_weights(xs, xt, ys, probs[:, :3])
    with pytest.raises(ValueError, match="mass must be in"):
        source_weights(xs, xt, ys, mass=1.5)


@pytest.mark.parametrize("module", [warmpot, partial_da])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


def test_only_epochs_at_the_full_mass_can_be_chosen(tmp_path):
    method = warmpot.Warmpot()
    data = TaskData(train=[], val=[], test=[], source="none")
    first = method.plan(None, None, data, PlanInputs(TrainSettings(epochs=60)))[0].settings.select_from
    assert first == warmpot.full_mass_epoch(0.5, 60) == 30
    method.start_epoch(first - 1, 60)
    assert method.mass < method.config["mass"]
    method.start_epoch(first, 60)
    assert method.mass == method.config["mass"]
    assert warmpot.full_mass_epoch(0.0, 60) == 0 and warmpot.full_mass_epoch(1.0, 60) == 59  # at most the last
    with pytest.raises(ValueError, match="need anneal in"):
        warmpot.full_mass_epoch(0.5, 0)
    run = wb.adapt(domain="features", baselines=[], out=str(tmp_path / "run"), epochs=4, quiet=True, train_size=200)
    history = json.loads((tmp_path / "run" / "results" / "warmpot.json").read_text())["history"]
    assert [h["selectable"] for h in history] == [False, False, True, True]
    best = min(history[2:], key=lambda h: h["val_loss"])["epoch"]
    assert run.metrics["costs"]["warmpot"]["best_epoch"] == best


@pytest.mark.parametrize("label_gradient", [False, True])
def test_label_term_chooses_the_pairs_and_trains_the_target_predictions_only_when_asked(label_gradient):
    generator = torch.Generator().manual_seed(0)
    source, target = torch.randn(6, 3, generator=generator), torch.randn(5, 3, generator=generator)
    logits = torch.randn(5, 4, generator=generator).requires_grad_(True)
    labels = torch.tensor([0, 1, 2, 3, 0, 1])
    method = warmpot.Warmpot(label_gradient=label_gradient)
    features = target.clone().requires_grad_(True)
    cost = method.joint_cost(source, features, labels, logits)
    distance = torch.cdist(source, target) ** 2
    plain = distance / distance.mean() - torch.log_softmax(logits, dim=-1)[:, labels].T
    assert torch.allclose(cost, plain)  # the same value, so the same plan
    cost.sum().backward()
    assert (logits.grad is not None and bool(logits.grad.abs().sum() > 0)) == label_gradient
    assert features.grad.abs().sum() > 0  # the feature term always aligns

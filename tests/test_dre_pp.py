"""PPDRE and the density-ratio baselines against closed-form ratios of Gaussian covariate shifts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.stats import multivariate_normal
from workbench.adaptation.dre_baselines import KLIEP, ULSIF, LogisticDRE
from workbench.adaptation.dre_pp import PPDRE
from workbench.domains.features.covariate_shift import (
    importance_weights,
    make_covariate_shift,
    make_full_rank_shift,
    weighted_least_squares,
)

ESTIMATORS = [PPDRE, ULSIF, KLIEP, LogisticDRE]


def nmse(estimate: np.ndarray, truth: np.ndarray) -> float:
    """Both ratios normalised by their mean over the same denominator sample (as in the benchmark)."""
    return float(np.mean((estimate / estimate.mean() - truth / truth.mean()) ** 2))


@pytest.fixture(scope="module")
def shift10():
    """d = 10, shift in a random 2-D subspace; PPDRE fitted once (default settings)."""
    problem = make_covariate_shift(dim=10, seed=0)
    model = PPDRE(random_state=0).fit(problem.x_target, problem.x_source)
    return problem, model


# --- the problem ---------------------------------------------------------------------------------------


def test_true_ratio_matches_scipy_pdf_ratio():
    problem = make_covariate_shift(dim=7, shift_dims=3, mean_shift=0.8, target_scale=(0.6, 0.9, 1.2), seed=4)
    shift = problem.shift
    covariance = np.eye(7) + shift.basis @ np.diag(shift.target_scale**2 - 1) @ shift.basis.T
    x = np.vstack([problem.x_source[:100], problem.x_target[:100]])
    expected = multivariate_normal(shift.basis @ shift.target_mean, covariance).logpdf(x) - multivariate_normal(
        np.zeros(7), np.eye(7)
    ).logpdf(x)
    np.testing.assert_allclose(shift.log_true_ratio(x), expected, atol=1e-10)
    # and the sampler draws from that target
    draw = problem.sample("target", 200_000, seed=1)
    np.testing.assert_allclose(draw.mean(0), shift.basis @ shift.target_mean, atol=0.01)
    np.testing.assert_allclose(np.cov(draw.T), covariance, atol=0.02)


@pytest.mark.parametrize("mean_shift", [0.0, 0.5])
def test_full_rank_ratio_matches_scipy_pdf_ratio(mean_shift):
    problem = make_full_rank_shift(dim=6, mean_shift=mean_shift, ratio_variance=1.5, seed=3)
    shift = problem.shift
    assert shift.basis.shape == (6, 6) and np.all(np.abs(np.log(shift.target_scale)) > 0)  # every direction
    np.testing.assert_allclose(shift.basis.T @ shift.basis, np.eye(6), atol=1e-12)
    covariance = shift.basis @ np.diag(shift.target_scale**2) @ shift.basis.T
    mean = shift.basis @ shift.target_mean
    x = np.vstack([problem.x_source[:100], problem.x_target[:100]])
    expected = multivariate_normal(mean, covariance).logpdf(x) - multivariate_normal(np.zeros(6), np.eye(6)).logpdf(x)
    np.testing.assert_allclose(shift.log_true_ratio(x), expected, atol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(mean), mean_shift, atol=1e-12)
    draw = problem.sample("target", 200_000, seed=1)
    np.testing.assert_allclose(draw.mean(0), mean, atol=0.01)
    np.testing.assert_allclose(np.cov(draw.T), covariance, atol=0.02)


@pytest.mark.parametrize("dim", [2, 10, 50])
def test_full_rank_ratio_variance_is_the_requested_one_at_every_dimension(dim):
    """Closed form equal to the request, and a Monte-Carlo estimate of ``E_s[r²] − 1`` agrees with it."""
    problem = make_full_rank_shift(dim=dim, ratio_variance=1.0, seed=0)
    assert abs(problem.shift.ratio_variance - 1.0) < 1e-9
    ratio = problem.true_ratio(problem.sample("source", 400_000, seed=2))
    assert abs(ratio.mean() - 1) < 0.02
    assert abs(ratio.var() - 1.0) < 0.15
    # the subspace family's closed form as well (default problem: ≈ 1.62)
    subspace = make_covariate_shift(dim=dim, seed=0)
    ratio = subspace.true_ratio(subspace.sample("source", 400_000, seed=2))
    assert abs(ratio.var() - subspace.shift.ratio_variance) < 0.2


def test_full_rank_problem_is_deterministic_and_validated():
    a, b = make_full_rank_shift(dim=5, seed=3), make_full_rank_shift(dim=5, seed=3)
    np.testing.assert_array_equal(a.x_target, b.x_target)
    np.testing.assert_array_equal(a.shift.target_scale, b.shift.target_scale)
    with pytest.raises(ValueError, match="lower mean_shift below 0.83"):
        make_full_rank_shift(mean_shift=1.0)
    with pytest.raises(ValueError, match="ratio_variance must be a finite number > 0"):
        make_full_rank_shift(ratio_variance=0.0)
    with pytest.raises(ValueError, match="for d = 1 use make_covariate_shift"):
        make_full_rank_shift(dim=1)
    with pytest.raises(ValueError, match="n_target must be at least 1"):
        make_full_rank_shift(n_target=0)


def test_problem_is_deterministic_and_validated():
    a, b = make_covariate_shift(dim=5, seed=3), make_covariate_shift(dim=5, seed=3)
    np.testing.assert_array_equal(a.x_source, b.x_source)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    with pytest.raises(ValueError, match="infinite variance"):
        make_covariate_shift(target_scale=1.5)
    with pytest.raises(ValueError, match="shift_dims"):
        make_covariate_shift(dim=3, shift_dims=4)


# --- PPDRE ---------------------------------------------------------------------------------------------


def test_ppdre_recovers_the_ratio_in_ten_dimensions(shift10):
    """Threshold 0.5. The constant estimate scores ≈ 1.6 (the normalised variance of the true ratio) and
    the best ratio of the mean-shift direction alone ≈ 0.37 (``E[r₁²]·Var(r₂)``); below 0.5 needs that
    direction nearly exact. Measured on this draw 0.12 (benchmark seeds 0, 1, 2: 0.13, 0.29, 0.48)."""
    problem, model = shift10
    x_eval = problem.sample("source", 5000, seed=100)
    truth = problem.true_ratio(x_eval)
    score = nmse(model.ratio(x_eval), truth)
    assert score < 0.5
    assert score < 0.35 * nmse(np.ones_like(truth), truth)
    # its first direction is the mean shift's, up to sign
    assert abs(float(model.directions_[0].numpy() @ problem.shift.basis[:, 0])) > 0.9


def test_ppdre_beats_ulsif_in_fifty_dimensions():
    """The paper's claim, on one draw: measured NMSE 0.68 (PPDRE) vs 1.50 (uLSIF) vs 1.57 (constant)."""
    problem = make_covariate_shift(dim=50, seed=1)
    x_eval = problem.sample("source", 5000, seed=101)
    truth = problem.true_ratio(x_eval)
    pp = nmse(PPDRE(random_state=1).fit(problem.x_target, problem.x_source).ratio(x_eval), truth)
    ulsif = nmse(ULSIF(random_state=1).fit(problem.x_target, problem.x_source).ratio(x_eval), truth)
    assert pp < 0.8 < ulsif


def test_directions_are_orthonormal_and_at_most_d():
    problem = make_covariate_shift(dim=6, n_source=300, n_target=300, seed=2)
    model = PPDRE(max_layers=3, epochs=20, validation_fraction=0, random_state=0)
    model.fit(problem.x_target, problem.x_source)
    assert model.n_layers_ == 3
    directions = model.directions_.numpy()
    np.testing.assert_allclose(directions @ directions.T, np.eye(3), atol=1e-10)
    small = make_covariate_shift(dim=3, n_source=200, n_target=200, seed=0)
    capped = PPDRE(max_layers=10, epochs=5, validation_fraction=0, random_state=0).fit(small.x_target, small.x_source)
    assert capped.n_layers_ == 3  # no direction is left after d


def test_layer_selection_with_zero_significance_takes_the_lowest_held_out_loss():
    problem = make_full_rank_shift(dim=4, n_source=300, n_target=300, seed=1)
    model = PPDRE(epochs=20, significance=0.0, patience=4, random_state=0).fit(problem.x_target, problem.x_source)
    assert len(model.validation_losses_) == 5  # all d = 4 layers tried with patience 4
    assert model.n_layers_ == int(np.argmin(model.validation_losses_))


def test_ppdre_beats_the_constant_ratio_on_a_small_full_rank_shift():
    """d = 4, 500 points each, the scale changes along every direction (``Var_s(r) = 1``; the constant scores
    0.47 on these 5000 points, which rarely reach the ratio's heavy tail). Measured NMSE / constant, seeds
    0, 1, 2: 0.75, 0.69, 0.73 with 2–3 layers. Before issue 15 (free directions, patience 1, any lower
    held-out loss): 0.82, 0.89 and, on this seed, 4.4e3 — it kept all 10 layers, four of them along one
    direction (|cos| ≥ 0.93 between them)."""
    problem = make_full_rank_shift(dim=4, n_source=500, n_target=500, seed=2)
    x_eval = problem.sample("source", 5000, seed=102)
    truth = problem.true_ratio(x_eval)
    model = PPDRE(random_state=2).fit(problem.x_target, problem.x_source)
    assert 2 <= model.n_layers_ <= 4
    assert nmse(model.ratio(x_eval), truth) < 0.85 * nmse(np.ones_like(truth), truth)


def test_closed_form_theta_is_the_minimiser_of_the_ridge_lsif_loss():
    """For the fitted (a, c) of each layer of a two-layer model, θ equals a direct numerical minimisation
    of E_den[r₁² f²] − 2 E_num[r₁ f] + λ‖θ‖² on the standardised fitting data (r₁ = 1 for layer 1)."""
    rng = np.random.default_rng(0)
    x_den, x_num = rng.normal(size=(40, 3)), rng.normal(size=(30, 3)) * 0.8 + [0.7, 0.0, 0.0]
    ridge = 0.3
    model = PPDRE(n_bases=4, max_layers=2, ridge=ridge, epochs=5, validation_fraction=0, random_state=0)
    model.fit(x_num, x_den)
    assert model.n_layers_ == 2

    def features(x, layer):
        z = ((x - model.mean_.numpy()) / model.scale_.numpy()) @ model.directions_[layer].numpy()
        centres = model.centres_[layer].numpy()
        return np.hstack([np.ones((len(z), 1)), np.exp(-0.5 * (z[:, None] - centres[None, :]) ** 2)])

    r_num, r_den = np.ones(len(x_num)), np.ones(len(x_den))
    for layer in range(2):
        phi_num, phi_den = features(x_num, layer), features(x_den, layer)

        def loss(theta):
            penalty = ridge * np.sum(theta**2)
            return np.mean((r_den * (phi_den @ theta)) ** 2) - 2 * np.mean(r_num * (phi_num @ theta)) + penalty

        direct = minimize(loss, np.zeros(5), method="BFGS", options={"gtol": 1e-12}).x
        theta = model.thetas_[layer].numpy()
        np.testing.assert_allclose(theta, direct, atol=1e-6)
        r_num, r_den = r_num * np.maximum(phi_num @ theta, 0), r_den * np.maximum(phi_den @ theta, 0)


def test_ratio_is_deterministic_non_negative_and_keeps_the_input_type(shift10):
    problem, model = shift10
    again = PPDRE(random_state=0).fit(problem.x_target, problem.x_source)
    x = problem.x_test[:200]
    np.testing.assert_array_equal(model.ratio(x), again.ratio(x))
    from_tensors = PPDRE(random_state=0).fit(torch.as_tensor(problem.x_target), torch.as_tensor(problem.x_source))
    np.testing.assert_array_equal(model.ratio(x), from_tensors.ratio(x))
    assert np.all(model.ratio(x) >= 0)
    out = model.ratio(torch.as_tensor(x, dtype=torch.float32))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (200,)
    np.testing.assert_allclose(out.numpy(), model.ratio(x), rtol=1e-5)


def test_importance_weighting_with_ppdre_lowers_target_mse(shift10):
    """Misspecified affine fit of ``coefᵀx + u₁²``, weights truncated at 10× their mean: measured target test
    MSE 3.51 unweighted, 0.87 with PPDRE weights, 0.80 with the true ratio (this draw)."""
    problem, model = shift10

    def test_mse(weights):
        coef, intercept = weighted_least_squares(problem.x_source, problem.y_source, weights)
        return float(np.mean((problem.x_test @ coef + intercept - problem.y_test) ** 2))

    unweighted = test_mse(None)
    weighted = test_mse(importance_weights(model.ratio(problem.x_source)))
    oracle = test_mse(importance_weights(problem.true_ratio(problem.x_source)))
    assert weighted < 0.5 * unweighted
    assert weighted < 1.5 * oracle


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ppdre_on_cuda_matches_cpu():
    problem = make_covariate_shift(dim=5, n_source=300, n_target=300, seed=0)
    cpu = PPDRE(epochs=20, random_state=0).fit(problem.x_target, problem.x_source)
    gpu = PPDRE(epochs=20, random_state=0, device="cuda").fit(problem.x_target, problem.x_source)
    x = torch.as_tensor(problem.x_test[:100], device="cuda")
    out = gpu.ratio(x)
    assert out.device.type == "cuda"
    assert gpu.n_layers_ == cpu.n_layers_
    np.testing.assert_allclose(out.cpu().numpy(), cpu.ratio(problem.x_test[:100]), rtol=1e-6, atol=1e-9)


# --- every estimator: input checks and a sanity level ----------------------------------------------------


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_bad_inputs_raise_clear_errors(cls):
    rng = np.random.default_rng(0)
    good = rng.normal(size=(20, 3))
    with_nan, with_inf = good.copy(), good.copy()
    with_nan[4, 1], with_inf[2, 0] = np.nan, np.inf
    estimator = cls(random_state=0)
    with pytest.raises(ValueError, match=r"x_numerator contains NaN or inf \(first at row 4, column 1\)"):
        estimator.fit(with_nan, good)
    with pytest.raises(ValueError, match="x_denominator contains NaN or inf"):
        estimator.fit(good, with_inf)
    with pytest.raises(ValueError, match="x_numerator needs at least 2 sample"):
        estimator.fit(np.empty((0, 3)), good)
    with pytest.raises(ValueError, match=r"x_denominator has 2 features but the estimator expects 3"):
        estimator.fit(good, good[:, :2])
    with pytest.raises(ValueError, match=r"must be 2-D .* x.reshape\(-1, 1\)"):
        estimator.fit(good[:, 0], good[:, 0])
    with pytest.raises(RuntimeError, match="not fitted yet"):
        cls(random_state=0).ratio(good)
    estimator.fit(good + 0.5, good)
    with pytest.raises(ValueError, match="x has 4 features but the estimator expects 3"):
        estimator.ratio(rng.normal(size=(5, 4)))
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        estimator.ratio(with_nan)


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(n_bases=0), r"n_bases=...\) must be an integer >= 1"),
        (dict(ridge=0.0), r"ridge=...\) must be a finite number > 0"),
        (dict(validation_fraction=1.0), r"validation_fraction=...\) must lie in \[0, 1\)"),
        (dict(epochs=2.5), r"epochs=...\) must be an integer >= 0"),
        (dict(patience=0), r"patience=...\) must be an integer >= 1"),
        (dict(significance=-1.0), r"significance=...\) must be a finite number >= 0"),
    ],
)
def test_bad_ppdre_settings_raise(params, message):
    x = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ValueError, match=message):
        PPDRE(**params).fit(x, x)


def test_too_few_samples_for_the_validation_split():
    x = np.random.default_rng(0).normal(size=(3, 2))
    with pytest.raises(ValueError, match="pass more samples or change validation_fraction"):
        PPDRE(validation_fraction=0.05).fit(x, x)


EASY_2D = {
    # both shift directions, target N(m, 0.7²) along them: bounded ratio, as the kernel models
    "bounded": dict(dim=2, n_source=500, n_target=500, seed=0),
    # a mean shift of 0.7 between unit Gaussians: log-linear ratio, as the logistic model
    "log-linear": dict(dim=2, shift_dims=1, mean_shift=0.7, target_scale=1.0, n_source=500, n_target=500, seed=0),
}


@pytest.mark.parametrize("cls, case", [(ULSIF, "bounded"), (KLIEP, "bounded"), (LogisticDRE, "log-linear")])
def test_baselines_are_finite_non_negative_and_accurate_on_an_easy_case(cls, case):
    """A 2-D shift that the estimator's model class contains; it must cut the constant estimate's NMSE
    (1.61 bounded, 0.65 log-linear) by 4×. Measured: uLSIF 0.12, KLIEP 0.07, logistic 0.01."""
    problem = make_covariate_shift(**EASY_2D[case])
    x_eval = problem.sample("source", 3000, seed=1)
    truth = problem.true_ratio(x_eval)
    model = cls(random_state=0).fit(problem.x_target, problem.x_source)
    estimate = model.ratio(x_eval)
    assert estimate.shape == truth.shape and np.all(np.isfinite(estimate)) and np.all(estimate >= 0)
    assert nmse(estimate, truth) < 0.25 * nmse(np.ones_like(truth), truth)
    tensor = model.ratio(torch.as_tensor(x_eval[:10]))
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float64


def test_densratio_wrappers_are_seeded_and_leave_numpy_global_state_alone():
    problem = make_covariate_shift(**EASY_2D["bounded"])
    x_eval = problem.x_test[:500]
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    first = ULSIF(random_state=5).fit(problem.x_target, problem.x_source).ratio(x_eval)
    np.testing.assert_array_equal(np.random.get_state()[1], before)
    second = ULSIF(random_state=5).fit(problem.x_target, problem.x_source).ratio(x_eval)
    np.testing.assert_array_equal(first, second)

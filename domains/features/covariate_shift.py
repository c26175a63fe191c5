"""Gaussian covariate-shift problems whose true density ratio is known in closed form.

The setting of the ppDRE experiments (seed 001 of this project): a high-dimensional input whose
distribution shifts only in a few directions. With an orthonormal ``basis`` ``U (d, k)`` drawn at random
(so the shift is not axis-aligned) and ``u = Uᵀx``:

* source (the density-ratio *denominator*): ``x ~ N(0, I_d)``;
* target (the *numerator*): ``x ~ N(U m, I_d + U (diag(s²) − I_k) Uᵀ)`` with ``m = (mean_shift, 0, …, 0)``
  and ``s = target_scale`` — a mean shift along ``U[:, 0]`` and a change of scale along all ``k`` columns.

Outside ``span(U)`` both densities agree, so the ratio depends on ``u`` alone:

    log r(x) = log p_t(x) − log p_s(x) = Σ_j [ −½ ((u_j − m_j) / s_j)² − log s_j + ½ u_j² ].

Under the source, ``E[r] = 1`` and ``E[r²]`` is finite only when every ``s_j < √2`` (enforced); then

    E_s[r²] = ∏_j exp(m_j² / (2 − s_j²)) / (s_j √(2 − s_j²))      (`GaussianShift.ratio_variance` is this − 1).

Two families:

* `make_covariate_shift` — the *subspace* family: ``k = shift_dims`` (default 2) directions shift, the
  other ``d − k`` do not, whatever ``d`` is.
* `make_full_rank_shift` — the *full-rank* family: ``U`` is a random ``d × d`` rotation and the scale
  changes along every column, ``log s_j = τ t_j`` with ``t_j = (−1)^j j / d`` (``j = 1..d``: magnitudes
  evenly spaced in ``(0, 1]``, signs alternating, so half the directions narrow and half widen) assigned
  to the columns in random order, plus an optional mean shift along ``U[:, 0]``. Drawing ``s_j`` in a
  fixed range would make ``E_s[r²]`` grow exponentially with ``d`` (each direction multiplies it by
  ``≈ 1 + 2 (log s_j)²``; ``s_j`` evenly spaced in ``[0.7, 1.3]`` gives ``Var_s(r) ≈ 38`` at ``d = 50``,
  uniform draws there 36–123: a ratio that is a few spikes). Instead ``τ`` is solved so that the
  normalised variance ``Var_s(r) = E_s[r²] − 1`` equals ``ratio_variance`` (default 1, against ≈ 1.6 for
  the default subspace problem) at every ``d``: the total shift stays the same while it spreads over
  more directions (at ``d = 50``, ``τ ≈ 0.14``: standard deviations 0.87–1.15).

Regression target (Shimodaira-style misspecification, J. Stat. Plan. Inference 2000): ``y = g(x) + ε``,
``g(x) = coefᵀx + curvature · u_1²``, ``ε ~ N(0, noise²)``. A linear model (`weighted_least_squares`)
cannot represent the curvature, so its best fit depends on where the inputs lie: the source fit
linearises ``u_1²`` around 0, the target needs it around ``mean_shift``. Importance weighting the source
loss by ``r`` moves the fit towards the target's optimum.

Example::

    >>> problem = make_covariate_shift(dim=5, seed=0)
    >>> problem.x_source.shape, problem.x_target.shape, problem.x_test.shape
    ((1000, 5), (1000, 5), (2000, 5))
    >>> bool(abs(problem.true_ratio(problem.sample("source", 100_000, seed=1)).mean() - 1) < 0.05)
    True
    >>> full = make_full_rank_shift(dim=50, seed=0)
    >>> full.shift.basis.shape, round(full.shift.ratio_variance, 6)
    ((50, 50), 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_MAX_SCALE = math.sqrt(2.0)


@dataclass(frozen=True, eq=False)
class GaussianShift:
    """The parameters of a Gaussian covariate shift and a misspecified regression target (all float64).

    Attributes:
        basis: orthonormal columns spanning the shift, ``U``.
        target_mean: target mean in shift coordinates, ``m``.
        target_scale: target standard deviation in shift coordinates, ``s`` (each below √2).
        coef, curvature, noise: the regression function ``g(x) = coefᵀx + curvature · (U[:, 0]ᵀx)²`` and
            the standard deviation of its additive Gaussian noise.

    Shapes:
        basis ``(d, k)``; target_mean, target_scale ``(k,)``; coef ``(d,)``.
    """

    basis: np.ndarray
    target_mean: np.ndarray
    target_scale: np.ndarray
    coef: np.ndarray
    curvature: float
    noise: float

    @property
    def dim(self) -> int:
        return self.basis.shape[0]

    @property
    def ratio_variance(self) -> float:
        """Normalised variance of the true ratio under the source, ``Var_s(r) = E_s[r²] − 1`` (closed form;
        the NMSE of the constant estimate ``r̂ = 1``)."""
        return math.expm1(_log_second_moment(self.target_mean, self.target_scale))

    def sample(self, domain: str, n: int, seed: int | np.random.Generator | None = None) -> np.ndarray:
        """``n`` inputs from ``domain`` ("source" or "target"). Shapes: -> ``(n, d)``."""
        if domain not in ("source", "target"):
            raise ValueError(f"domain must be 'source' or 'target', got {domain!r}")
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((n, self.dim))
        if domain == "source":
            return x
        u = x @ self.basis  # replace the parts along U by N(m, diag(s²)) draws
        return x + (self.target_mean + u * self.target_scale - u) @ self.basis.T

    def log_true_ratio(self, x: np.ndarray) -> np.ndarray:
        """``log p_target(x) − log p_source(x)`` in closed form. Shapes: x ``(n, d)`` -> ``(n,)``."""
        u = np.asarray(x, dtype=np.float64) @ self.basis
        z = (u - self.target_mean) / self.target_scale
        return np.sum(-0.5 * z**2 - np.log(self.target_scale) + 0.5 * u**2, axis=1)

    def true_ratio(self, x: np.ndarray) -> np.ndarray:
        """``p_target(x) / p_source(x)``. Shapes: x ``(n, d)`` -> ``(n,)``."""
        return np.exp(self.log_true_ratio(x))

    def regression_function(self, x: np.ndarray) -> np.ndarray:
        """Noise-free ``g(x)``. Shapes: x ``(n, d)`` -> ``(n,)``."""
        x = np.asarray(x, dtype=np.float64)
        return x @ self.coef + self.curvature * (x @ self.basis[:, 0]) ** 2

    def label(self, x: np.ndarray, seed: int | np.random.Generator | None = None) -> np.ndarray:
        """Noisy labels ``g(x) + ε``. Shapes: x ``(n, d)`` -> ``(n,)``."""
        rng = np.random.default_rng(seed)
        return self.regression_function(x) + self.noise * rng.standard_normal(len(x))


@dataclass(frozen=True, eq=False)
class CovariateShiftProblem:
    """A `GaussianShift` and one draw of data from it (float64 arrays).

    Attributes:
        shift: the distributions and the regression target.
        x_source, y_source: labelled source (denominator) sample.
        x_target: unlabelled target (numerator) sample, for density-ratio estimation.
        x_test, y_test: held-out labelled target sample, for evaluation only.

    Shapes:
        x_source ``(n_source, d)``, y_source ``(n_source,)``; x_target ``(n_target, d)``;
        x_test ``(n_test, d)``, y_test ``(n_test,)``.
    """

    shift: GaussianShift
    x_source: np.ndarray
    y_source: np.ndarray
    x_target: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def sample(self, domain: str, n: int, seed: int | np.random.Generator | None = None) -> np.ndarray:
        """Fresh inputs, as `GaussianShift.sample`."""
        return self.shift.sample(domain, n, seed)

    def true_ratio(self, x: np.ndarray) -> np.ndarray:
        """``p_target(x) / p_source(x)``, as `GaussianShift.true_ratio`."""
        return self.shift.true_ratio(x)


def make_covariate_shift(
    dim: int = 10,
    shift_dims: int = 2,
    mean_shift: float = 1.0,
    target_scale: float | tuple[float, ...] = 0.7,
    n_source: int = 1000,
    n_target: int = 1000,
    n_test: int = 2000,
    curvature: float = 1.0,
    noise: float = 0.5,
    seed: int = 0,
) -> CovariateShiftProblem:
    """Draw a `CovariateShiftProblem`; everything (basis, coefficients, samples) follows from ``seed``.

    Args:
        dim: input dimension ``d`` (tens to hundreds).
        shift_dims: ``k``, the dimension of the subspace the shift lives in (``1 <= k <= d``).
        mean_shift: target mean along the first shift direction, in source standard deviations.
        target_scale: target standard deviation along each shift direction (one value or ``k``), each in
            ``(0, √2)`` so that the importance weights have finite variance under the source.
        n_source, n_target, n_test: sizes of the labelled source, unlabelled target and labelled test
            (target) samples.
        curvature, noise: the regression function's curvature along the mean shift and its noise
            standard deviation.
        seed: seed of one ``numpy.random.default_rng`` that draws everything.
    """
    if not 1 <= shift_dims <= dim:
        raise ValueError(f"shift_dims must be between 1 and dim={dim}, got {shift_dims}")
    scale = np.broadcast_to(np.asarray(target_scale, dtype=np.float64), (shift_dims,)).copy()
    if np.any(scale <= 0) or np.any(scale >= _MAX_SCALE):
        raise ValueError(
            f"target_scale must lie in (0, √2) in every shift direction, got {scale.tolist()}: at √2 or above "
            "the importance weights have infinite variance under the source"
        )
    for name, n in (("n_source", n_source), ("n_target", n_target), ("n_test", n_test)):
        if n < 1:
            raise ValueError(f"{name} must be at least 1, got {n}")
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((dim, shift_dims)))
    coef = rng.standard_normal(dim)
    coef /= np.linalg.norm(coef)
    target_mean = np.zeros(shift_dims)
    target_mean[0] = mean_shift
    shift = GaussianShift(
        basis=basis, target_mean=target_mean, target_scale=scale, coef=coef, curvature=curvature, noise=noise
    )
    return _draw_problem(shift, n_source, n_target, n_test, rng)


def _log_second_moment(mean: np.ndarray, scale: np.ndarray) -> float:
    """``log E_s[r²]`` for target ``N(m_j, s_j²)`` against ``N(0, 1)`` along each shift direction (``s_j < √2``).

    Shapes: mean, scale ``(k,)``.
    """
    return float(np.sum(mean**2 / (2 - scale**2) - np.log(scale) - 0.5 * np.log(2 - scale**2)))


def _draw_problem(shift: GaussianShift, n_source: int, n_target: int, n_test: int, rng) -> CovariateShiftProblem:
    """One draw of the data of ``shift``, in a fixed order (source, its labels, target, test, test labels)."""
    for name, n in (("n_source", n_source), ("n_target", n_target), ("n_test", n_test)):
        if n < 1:
            raise ValueError(f"{name} must be at least 1, got {n}")
    x_source = shift.sample("source", n_source, rng)
    y_source = shift.label(x_source, rng)  # drawn before the target, so n_target and n_test leave the source be
    x_target = shift.sample("target", n_target, rng)
    x_test = shift.sample("target", n_test, rng)
    return CovariateShiftProblem(
        shift=shift,
        x_source=x_source,
        y_source=y_source,
        x_target=x_target,
        x_test=x_test,
        y_test=shift.label(x_test, rng),
    )


def make_full_rank_shift(
    dim: int = 10,
    mean_shift: float = 0.0,
    ratio_variance: float = 1.0,
    n_source: int = 1000,
    n_target: int = 1000,
    n_test: int = 2000,
    curvature: float = 1.0,
    noise: float = 0.5,
    seed: int = 0,
) -> CovariateShiftProblem:
    """Draw a full-rank `CovariateShiftProblem` (module docstring): the scale changes along all ``d`` directions.

    ``U`` is a random rotation ``(d, d)``; the target is ``N(U m, U diag(s²) Uᵀ)`` with ``m = (mean_shift, 0,
    …, 0)`` and ``log s_j = τ t_j``, ``t`` a random permutation of ``(−1)^j j / d``, ``j = 1..d``; ``τ > 0``
    (below ``log √2 / max t``, where the widest ``s_j`` reaches √2) is solved (Brent's method on the closed-form
    ``E_s[r²]``) so that ``Var_s(r) = ratio_variance``. The log-ratio is a sum of ``d`` one-dimensional terms in
    ``u = Uᵀx``. Everything follows from ``seed``; the data are drawn as in `make_covariate_shift`.

    Args:
        dim: input dimension ``d`` (at least 2; for one direction use `make_covariate_shift`).
        mean_shift: target mean along ``U[:, 0]``, in source standard deviations (default 0: scale only). The
            mean shift alone gives ``Var_s(r) = exp(mean_shift²) − 1``, which must stay below ``ratio_variance``.
        ratio_variance: the normalised variance of the true ratio under the source, ``E_s[r²] − 1`` (> 0;
            default 1).
        n_source, n_target, n_test, curvature, noise, seed: as in `make_covariate_shift`.
    """
    if not (isinstance(dim, (int, np.integer)) and dim >= 2):
        raise ValueError(f"dim must be an integer >= 2, got {dim!r} (for d = 1 use make_covariate_shift)")
    if not (math.isfinite(ratio_variance) and ratio_variance > 0):
        raise ValueError(f"ratio_variance must be a finite number > 0, got {ratio_variance!r}")
    target_log = math.log1p(ratio_variance)
    if not (math.isfinite(mean_shift) and mean_shift**2 < target_log):
        raise ValueError(
            f"mean_shift={mean_shift!r} alone gives Var_s(r) = exp(mean_shift²) − 1 = {math.expm1(mean_shift**2):.3g} "
            f">= ratio_variance={ratio_variance}: lower mean_shift below {math.sqrt(target_log):.3g} or raise "
            "ratio_variance"
        )
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    coef = rng.standard_normal(dim)
    coef /= np.linalg.norm(coef)
    steps = np.arange(1, dim + 1)
    spread = rng.permutation((-1.0) ** steps * steps / dim)
    target_mean = np.zeros(dim)
    target_mean[0] = mean_shift

    from scipy.optimize import brentq  # here, not at the top: the task must load (and say what is missing) without it

    def excess(tau: float) -> float:
        return _log_second_moment(target_mean, np.exp(tau * spread)) - target_log

    # below 0 at τ = 0 (checked above); E_s[r²] -> ∞ as the widest s_j = e^{τ max t} -> √2
    tau = brentq(excess, 0.0, math.log(_MAX_SCALE) / spread.max() * (1 - 1e-9), xtol=1e-14)
    shift = GaussianShift(
        basis=basis,
        target_mean=target_mean,
        target_scale=np.exp(tau * spread),
        coef=coef,
        curvature=curvature,
        noise=noise,
    )
    return _draw_problem(shift, n_source, n_target, n_test, rng)


def importance_weights(ratio: np.ndarray, max_weight: float = 10.0) -> np.ndarray:
    """Mean-one importance weights from density-ratio values, truncated at ``max_weight`` times the mean.

    ``w = r / mean(r)``, then ``w = min(w, max_weight)``, then ``w / mean(w)``. Truncation trades a little
    bias for much less variance when a few ratios are huge. Shapes: ratio ``(n,)`` -> ``(n,)``.
    """
    ratio = np.clip(np.asarray(ratio, dtype=np.float64), 0.0, None)
    if ratio.ndim != 1 or ratio.size == 0 or not np.all(np.isfinite(ratio)) or ratio.sum() <= 0:
        raise ValueError("ratio must be a non-empty 1-D array of finite values with a positive sum")
    weights = np.minimum(ratio / ratio.mean(), max_weight)
    return weights / weights.mean()


def weighted_least_squares(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """The misspecified model: affine least squares ``min Σ_i w_i (y_i − xᵢᵀβ − b)²``.

    Returns ``(β, b)``; predict with ``x @ β + b``. Shapes: x ``(n, d)``, y ``(n,)``, weights ``(n,)``
    (non-negative; ``None`` for all ones) -> β ``(d,)``, b scalar.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    sqrt_w = np.ones(len(x)) if weights is None else np.sqrt(np.asarray(weights, dtype=np.float64))
    design = np.hstack([x, np.ones((len(x), 1))]) * sqrt_w[:, None]
    solution, *_ = np.linalg.lstsq(design, y * sqrt_w, rcond=None)
    return solution[:-1], float(solution[-1])

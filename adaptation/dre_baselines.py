"""Baseline density-ratio estimators with `PPDRE`'s interface: ``fit(x_numerator, x_denominator)``, ``ratio(x)``.

Each is a thin wrapper of a maintained library:

* `ULSIF` — unconstrained least-squares importance fitting (Kanamori, Hido & Sugiyama, JMLR 2009):
  ``r(x) = Σ_l α_l K(x, c_l)`` with Gaussian kernels at numerator points, ``α`` from the LSIF loss with a
  ridge in closed form, negative ``α`` set to 0; bandwidth and ridge by leave-one-out cross-validation.
  Wraps ``densratio.densratio(method="uLSIF")`` (skada 0.6 has no uLSIF).
* `KLIEP` — Kullback–Leibler importance estimation (Sugiyama et al., NeurIPS 2007): the same kernel model,
  ``α ≥ 0`` maximising ``E_num[log r]`` subject to ``E_den[r] = 1``; bandwidth by likelihood
  cross-validation. Wraps ``densratio.densratio(method="KLIEP")``. Not skada's ``KLIEPReweightAdapter``:
  in skada 0.6 its ascent step is machine epsilon (``alpha += EPS * A.T @ (1 / (A @ alpha))``), so ``α``
  never leaves its feasible starting point and the KLIEP objective is not optimised (checked: ``α``
  equals the projection of all-ones to 1e-14).
* `LogisticDRE` — a probabilistic classifier between the samples (Qin 1998; Bickel et al., ICML 2007):
  ``r(x) = (n_den / n_num) · p(num | x) / p(den | x) = (n_den / n_num) · exp(logit(x))``, with
  ``sklearn.linear_model.LogisticRegression`` (L2, ``C = 1``) on standardised inputs. Its log-ratio is
  linear in ``x``: exact for a mean shift between equal covariances, misspecified for a change of scale.
  Not skada's ``DiscriminatorReweightAdapter``: it rescales its weights to mean one over the *query*
  batch, so the ratio at a point would depend on the other points queried.

All three standardise inputs with the denominator's mean and standard deviation (as `PPDRE` does); the
kernel methods search bandwidths ``σ = median pairwise distance × 2^{-2..2}`` — densratio's default grid
(``10^{-3..1}``) stops below the typical distance in a hundred dimensions. Ratios are clipped at 0.

Shapes (every estimator):
    x_numerator ``(n_num, d)``, x_denominator ``(n_den, d)``; ratio: x ``(n, d)`` -> ``(n,)``, numpy in,
    numpy out, a torch tensor in, a tensor out.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from workbench.adaptation.dre_pp import as_input_type, check_samples
from workbench.adaptation.importance_weighting import ImportanceWeighting

from workbench.core.registry import methods


class _Estimator:
    """Shared plumbing: one validator at each entry, standardisation by the denominator's statistics."""

    def fit(self, x_numerator: Any, x_denominator: Any):
        """Fit ``r = p_num / p_den`` from a sample of each density; returns ``self``."""
        x_num = check_samples(x_numerator, "x_numerator", min_samples=2)
        x_den = check_samples(x_denominator, "x_denominator", x_num.shape[1], min_samples=2)
        self.n_features_in_ = x_num.shape[1]
        self.mean_ = x_den.mean(axis=0)
        scale = x_den.std(axis=0)
        self.scale_ = np.where(scale > 0, scale, 1.0)
        self._fit(self._standardise(x_num), self._standardise(x_den))
        return self

    def ratio(self, x: Any) -> np.ndarray | torch.Tensor:
        """Estimated ``p_num(x) / p_den(x)``, clipped at 0; numpy in, numpy out; a tensor in, a tensor out."""
        if not hasattr(self, "mean_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted yet: call fit(x_numerator, x_denominator) first")
        z = self._standardise(check_samples(x, "x", self.n_features_in_))
        return as_input_type(np.clip(self._ratio(z), 0.0, None), x)

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean_) / self.scale_

    def _fit(self, x_num: np.ndarray, x_den: np.ndarray) -> None:
        raise NotImplementedError

    def _ratio(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError


def _median_distance(x: np.ndarray, rng: np.random.Generator, n_max: int = 500) -> float:
    """Median pairwise Euclidean distance of (at most ``n_max`` rows of) ``x``."""
    x = x[rng.permutation(len(x))[:n_max]]
    squared = np.sum(x**2, 1)[:, None] + np.sum(x**2, 1)[None, :] - 2 * x @ x.T
    distances = np.sqrt(np.clip(squared[np.triu_indices(len(x), k=1)], 0.0, None))
    return float(np.median(distances)) if distances.size else 1.0


def _densratio(x_num: np.ndarray, x_den: np.ndarray, random_state: int | None, **kwargs):
    """``densratio.densratio`` without its printing, seeded: it draws from numpy's global generator, whose
    state is restored afterwards."""
    import densratio  # optional dependency, imported when used

    state = np.random.get_state()
    try:
        if random_state is not None:
            np.random.seed(random_state)
        with contextlib.redirect_stdout(io.StringIO()):
            return densratio.densratio(x_num, x_den, verbose=False, **kwargs)
    finally:
        np.random.set_state(state)


class _KernelDensratio(_Estimator):
    """A ``densratio`` kernel estimator; bandwidth grid by the median heuristic unless given."""

    def _sigmas(self, x_num: np.ndarray, x_den: np.ndarray) -> np.ndarray:
        if self.sigmas is not None:
            return np.asarray(self.sigmas, dtype=np.float64).ravel()
        rng = np.random.default_rng(self.random_state)
        return _median_distance(np.vstack([x_num, x_den]), rng) * 2.0 ** np.arange(-2, 3)

    def _ratio(self, z: np.ndarray) -> np.ndarray:
        return np.asarray(self.result_.compute_density_ratio(z), dtype=np.float64).ravel()


class ULSIF(_KernelDensratio):
    """uLSIF by ``densratio.densratio(method="uLSIF")`` (see the module docstring).

    Args:
        n_kernels: Gaussian kernels, centred at random numerator points (default 100).
        sigmas: bandwidths to cross-validate, in standardised units; None (default) for
            ``median distance × (0.25, 0.5, 1, 2, 4)``.
        ridges: ridge strengths to cross-validate; None (default) for densratio's ``10^{-3..1}`` (9 values).
        random_state: seed of the kernel centres (default None).
    """

    def __init__(self, n_kernels: int = 100, sigmas=None, ridges=None, random_state: int | None = None):
        self.n_kernels = n_kernels
        self.sigmas = sigmas
        self.ridges = ridges
        self.random_state = random_state

    def _fit(self, x_num: np.ndarray, x_den: np.ndarray) -> None:
        self.result_ = _densratio(
            x_num,
            x_den,
            self.random_state,
            method="uLSIF",
            sigma_range=self._sigmas(x_num, x_den),
            lambda_range=self.ridges,
            kernel_num=self.n_kernels,
        )


class KLIEP(_KernelDensratio):
    """KLIEP by ``densratio.densratio(method="KLIEP")`` (see the module docstring); bandwidth by 5-fold
    likelihood cross-validation.

    Args:
        n_kernels: Gaussian kernels, centred at random numerator points (default 100).
        sigmas: bandwidths to cross-validate, in standardised units; None (default) for
            ``median distance × (0.25, 0.5, 1, 2, 4)``.
        random_state: seed of the kernel centres and folds (default None).
    """

    def __init__(self, n_kernels: int = 100, sigmas=None, random_state: int | None = None):
        self.n_kernels = n_kernels
        self.sigmas = sigmas
        self.random_state = random_state

    def _fit(self, x_num: np.ndarray, x_den: np.ndarray) -> None:
        self.result_ = _densratio(
            x_num,
            x_den,
            self.random_state,
            method="KLIEP",
            sigma=self._sigmas(x_num, x_den),
            kernel_num=self.n_kernels,
        )


class LogisticDRE(_Estimator):
    """Density ratio from a logistic-regression domain classifier (see the module docstring).

    Args:
        C: inverse L2 regularisation strength of ``sklearn.linear_model.LogisticRegression`` (default 1.0,
            on standardised inputs).
        max_iter: solver iterations (default 1000).
    """

    def __init__(self, C: float = 1.0, max_iter: int = 1000, random_state: int | None = None):  # noqa: N803
        self.C = C
        self.max_iter = max_iter
        self.random_state = random_state  # unused (the fit is deterministic); kept for one constructor call

    def _fit(self, x_num: np.ndarray, x_den: np.ndarray) -> None:
        labels = np.r_[np.ones(len(x_num)), np.zeros(len(x_den))]
        self.classifier_ = LogisticRegression(C=self.C, max_iter=self.max_iter)
        self.classifier_.fit(np.vstack([x_num, x_den]), labels)
        self.prior_ratio_ = len(x_den) / len(x_num)

    def _ratio(self, z: np.ndarray) -> np.ndarray:
        return self.prior_ratio_ * np.exp(np.clip(self.classifier_.decision_function(z), -700, 700))


@methods.register
class ULSIFWeighting(ImportanceWeighting):
    name = "dre-ulsif"
    description = "Importance weights from uLSIF density ratios (densratio)"

    def make_estimator(self, seed: int, device: torch.device) -> ULSIF:  # numpy: the CPU
        return ULSIF(random_state=seed)


@methods.register
class KLIEPWeighting(ImportanceWeighting):
    name = "dre-kliep"
    description = "Importance weights from KLIEP density ratios (densratio)"

    def make_estimator(self, seed: int, device: torch.device) -> KLIEP:  # numpy: the CPU
        return KLIEP(random_state=seed)


@methods.register
class LogisticWeighting(ImportanceWeighting):
    name = "dre-logistic"
    description = "Importance weights from a logistic source-vs-target classifier (scikit-learn)"

    def make_estimator(self, seed: int, device: torch.device) -> LogisticDRE:  # numpy: the CPU
        return LogisticDRE(random_state=seed)

"""Choosing C for the amplified prefix-sum RMSE under balls-in-bins batching (004 §4.2).

The objective is RMSE(C) = σ(C)·‖A C⁻¹‖_F/√n, with σ(C) the noise the Monte Carlo accountant
calibrates for C on fixed common random numbers. σ(C) comes from bisection; its gradient is
implicit: ∂σ/∂θ = −(∂δ̂/∂θ)/(∂δ̂/∂σ) at δ̂(σ(C), C) = δ, both partials by autodiff of the explicit
δ̂.

Parameterizations keep C >= 0 (004 Lemma 3.2) and c_0 = 1 (RMSE is scale-invariant):
- BLT with d buffers: θ_r = sigmoid(a_r) ∈ (0, 1), ω_r = softplus(b_r) > 0, initialised by a
  least-squares fit to the ``init_bands``-banded square root;
- Toeplitz: c_k = softplus(t_k) for k >= 1, initialised from the ``init_bands``-banded square root.

:func:`optimize_banded` is the banded baseline of 004 §5.1 (following Choquette-Choo et al. 2024a):
a w-banded Toeplitz C optimized for the *unamplified* RMSE, a deterministic objective (no Monte
Carlo); :func:`optimize_blt_unamplified` optimizes a BLT for the same objective (a reference point).

Optimization uses Adam on log RMSE (the paper uses plain gradient descent) with fresh Monte Carlo
samples at every step (reusing one small sample set overfits C to it: σ looks smaller on those
samples than on fresh ones) and returns the last iterate; intermediate σ values need not be accurate
(the final C is recalibrated by the accountant, with EVR). It lives in ``accounting`` because σ(C)
is calibration: the correlation matrices and their RMSE stay in ``dpledger.mechanisms``, which
imports nothing of the accounting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from dpledger import validation
from dpledger.accounting import montecarlo as mc
from dpledger.accounting.mc_search import SigmaSearch, calibrate_sigma
from dpledger.accounting.pld import gaussian_noise_for
from dpledger.mechanisms.matrices import banded_params, banded_sqrt_coefficients, coefficients
from dpledger.mechanisms.rmse import prefix_error_norm_torch, prefix_rmse


@dataclass(frozen=True)
class MechanismRmse:
    """A correlation matrix C (as mechanism_params), the σ it needs and the prefix-sum RMSE at that
    σ."""

    mechanism: str
    mechanism_params: dict[str, Any]
    noise_multiplier: float
    rmse: float


@dataclass(frozen=True)
class AmplifiedRmse(MechanismRmse):
    """RMSE of one C at (ε, δ) under balls-in-bins (Monte Carlo σ) and without amplification."""

    epsilon: float
    unamplified_noise_multiplier: float
    unamplified_rmse: float


@dataclass(frozen=True)
class RmseSetting:
    """Where RMSEs are compared: the target (ε, δ), the balls-in-bins schedule (``bins`` batches per
    epoch for ``epochs`` epochs) and the Monte Carlo estimate's sample count and seed."""

    epsilon: float
    delta: float
    bins: int
    epochs: int
    samples: int
    seed: int = 0

    @property
    def steps(self) -> int:
        return self.bins * self.epochs


@mc.single_threaded
def amplified_rmse(
    mechanism: str, mechanism_params: dict[str, Any], setting: RmseSetting
) -> AmplifiedRmse:
    """σ and RMSE of C under balls-in-bins (Monte Carlo estimate, no EVR: a utility figure) and
    unamplified.

    Unamplified: every example sits in a fixed slot of every epoch in arbitrary order, so the
    Gaussian mechanism with sensitivity max_i ‖m_i‖ (the same columns Lemma 3.2 sums) is calibrated
    exactly.
    """
    epsilon, delta = setting.epsilon, setting.delta
    values = coefficients(mechanism, mechanism_params, setting.steps)
    pair = mc.fixed_bins_pair(values, setting.bins, setting.steps)
    upper = gaussian_noise_for(pair.max_sensitivity(), epsilon, delta)
    sigma = calibrate_sigma(
        pair, epsilon, delta, setting.samples, setting.seed, upper
    ).noise_multiplier
    return AmplifiedRmse(
        mechanism,
        mechanism_params,
        noise_multiplier=sigma,
        rmse=prefix_rmse(values, sigma),
        epsilon=epsilon,
        unamplified_noise_multiplier=upper,
        unamplified_rmse=prefix_rmse(values, upper),
    )


def unamplified_rmse(
    mechanism: str,
    mechanism_params: dict[str, Any],
    epsilon: float,
    delta: float,
    bins: int,
    epochs: int,
) -> float:
    """The RMSE of C without amplification, as in :func:`amplified_rmse` (no Monte Carlo)."""
    steps = bins * epochs
    values = coefficients(mechanism, mechanism_params, steps)
    sensitivity = mc.fixed_bins_pair(values, bins, steps).max_sensitivity()
    return prefix_rmse(values, gaussian_noise_for(sensitivity, epsilon, delta))


def best_bands(setting: RmseSetting, candidates: list[int] | None = None) -> AmplifiedRmse:
    """The w-banded C (w a power of two up to n) with the smallest amplified RMSE, over both banded
    families: the square root of the prefix-sum matrix and :func:`optimize_banded`'s C (004 §5.1's
    banded matrices, optimized without amplification). Neither family wins everywhere: at n = 2048,
    b = 128 the square root is better at ε <= 8, the optimized C at ε = 16
    (``benchmarks/RESULTS.md``)."""
    widths = candidates or [2**i for i in range(int(math.log2(setting.steps)) + 1)]
    results = [
        amplified_rmse("banded", params, setting)
        for w in widths
        for params in (banded_params(w), optimize_banded(w, setting.bins, setting.epochs))
    ]
    return min(results, key=lambda r: r.rmse)


def optimize_banded(bands: int, bins: int, epochs: int, iterations: int = 100) -> dict[str, Any]:
    """mechanism_params of the ``bands``-banded Toeplitz C (c_0 = 1, c_k = softplus(t_k) >= 0)
    minimizing the unamplified RMSE factor max_i ‖m_i‖ · ‖A C⁻¹‖_F/√n, m_i = Σ_e C[:, e·b + i]
    (every example in one fixed slot per epoch; for w <= b this is √E·‖c‖, the sensitivity under
    cyclic Poisson too).

    L-BFGS from the banded square root; 004 §5.1 optimizes its banded baselines this way, for each
    w, without accounting for amplification."""
    validation.at_least("bands", bands, 1, integer=True)
    n = bins * epochs
    width = min(bands, n)
    if width == 1:
        return {"coefficients": [1.0]}
    start = banded_sqrt_coefficients(width)[1:]
    raw = torch.as_tensor(np.log(np.expm1(start)), dtype=torch.float64).requires_grad_(True)

    def values() -> torch.Tensor:
        return torch.cat(
            [
                torch.ones(1, dtype=torch.float64),
                torch.nn.functional.softplus(raw),
                torch.zeros(n - width, dtype=torch.float64),
            ]
        )

    _minimize_unamplified(raw, values, bins, n, iterations)
    return {"coefficients": values().detach()[:width].tolist()}


def optimize_blt_unamplified(
    buffers: int, bins: int, epochs: int, init_bands: int, iterations: int = 500
) -> dict[str, Any]:
    """mechanism_params of the ``buffers``-buffer BLT minimizing the same unamplified objective as
    :func:`optimize_banded`, by L-BFGS from a fit to the ``init_bands``-banded square root: the best
    a BLT does without amplification, against which a banded C shows what a BLT's geometric tail
    costs."""
    validation.at_least("buffers", buffers, 1, integer=True)
    n = bins * epochs
    start, to_coefficients, to_params = _blt(buffers, n, init_bands)
    raw = start.clone().requires_grad_(True)
    _minimize_unamplified(raw, lambda: to_coefficients(raw, n), bins, n, iterations)
    return to_params(raw.detach())


def _minimize_unamplified(
    raw: torch.Tensor, values: Callable[[], torch.Tensor], bins: int, n: int, iterations: int
) -> None:
    """L-BFGS on log(max_i ‖m_i‖ · ‖A C⁻¹‖_F) over ``raw``, in place (``values()``: raw ->
    c_0..c_{n-1})."""
    optimizer = torch.optim.LBFGS(
        [raw], max_iter=iterations, line_search_fn="strong_wolfe", tolerance_grad=1e-10
    )

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        coefficients = values()
        sensitivity_sq = torch.diagonal(mc.toeplitz_gram(coefficients, bins, n)).max()
        loss = 0.5 * torch.log(sensitivity_sq) + torch.log(prefix_error_norm_torch(coefficients))
        loss.backward()
        return loss

    optimizer.step(objective)


@dataclass(frozen=True)
class OptimizedMatrix(MechanismRmse):
    """The optimized C, its σ and RMSE on the optimization samples, and the optimizer's trace."""

    history: list[float] = field(default_factory=list)


def blt_fit(target: np.ndarray, buffers: int) -> tuple[np.ndarray, np.ndarray]:
    """A BLT close to the Toeplitz coefficients ``target`` (c_0 = 1): decays 1 − 1/τ with τ
    log-spaced over the target's support, output scales by non-negative least squares on c_1.. (an
    initial point)."""
    from scipy.optimize import nnls

    support = max(2, int(np.flatnonzero(target)[-1]) + 1 if np.any(target[1:]) else 2)
    decays = 1.0 - 1.0 / np.geomspace(1.5, max(2.0, support), buffers)
    lags = np.arange(target.size - 1)
    design = decays[None, :] ** lags[:, None]
    scales, _ = nnls(design, target[1:])
    return decays, scales


def _blt(buffers: int, steps: int, init_bands: int) -> tuple[torch.Tensor, Callable, Callable]:
    target = np.zeros(steps)
    target[: min(steps, init_bands)] = banded_sqrt_coefficients(init_bands)[:steps]
    decays, scales = blt_fit(target, buffers)
    scales = np.maximum(scales, 1e-2)
    start = torch.cat(
        [
            torch.logit(torch.as_tensor(np.clip(decays, 1e-4, 1 - 1e-4))),
            torch.as_tensor(np.log(np.expm1(scales))),
        ]
    )

    def to_coefficients(raw: torch.Tensor, steps: int) -> torch.Tensor:
        decays, scales = torch.sigmoid(raw[:buffers]), torch.nn.functional.softplus(raw[buffers:])
        powers = decays[None, :] ** torch.arange(steps - 1, dtype=torch.float64)[:, None]
        return torch.cat([torch.ones(1, dtype=torch.float64), powers @ scales])

    def to_params(raw: torch.Tensor) -> dict[str, Any]:
        return {
            "buffer_decays": torch.sigmoid(raw[:buffers]).tolist(),
            "output_scales": torch.nn.functional.softplus(raw[buffers:]).tolist(),
        }

    return start, to_coefficients, to_params


def _toeplitz(steps: int, init_bands: int) -> tuple[torch.Tensor, Callable, Callable]:
    init = np.maximum(
        np.concatenate([banded_sqrt_coefficients(init_bands), np.zeros(steps)])[1:steps], 1e-6
    )
    start = torch.as_tensor(np.log(np.expm1(init)), dtype=torch.float64)

    def to_coefficients(raw: torch.Tensor, _: int) -> torch.Tensor:
        return torch.cat([torch.ones(1, dtype=torch.float64), torch.nn.functional.softplus(raw)])

    def to_params(raw: torch.Tensor) -> dict[str, Any]:
        return {"coefficients": to_coefficients(raw, steps).tolist()}

    return start, to_coefficients, to_params


@mc.single_threaded
def optimize_matrix(
    mechanism: str,
    epsilon: float,
    delta: float,
    bins: int,
    epochs: int,
    *,
    steps: int = 300,
    samples: int = 1 << 14,
    seed: int = 0,
    learning_rate: float = 0.05,
    buffers: int = 3,
    init_bands: int = 4,
    progress: bool = False,
) -> OptimizedMatrix:
    """Optimize a BLT (``buffers`` buffers) or Toeplitz C for the balls-in-bins RMSE at (ε, δ) (004
    §4.2)."""
    n = bins * epochs
    if mechanism == "blt":
        start, to_coefficients, to_params = _blt(buffers, n, init_bands)
    elif mechanism == "toeplitz":
        start, to_coefficients, to_params = _toeplitz(n, init_bands)
    else:
        raise ValueError(f"cannot optimize mechanism {mechanism!r}; choose blt or toeplitz")
    raw = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([raw], lr=learning_rate)
    history: list[float] = []
    guess = None
    bar = tqdm(range(steps + 1), desc=f"optimize {mechanism}", disable=not progress, leave=False)
    for step in bar:
        values = to_coefficients(raw, n)
        gram = mc.toeplitz_gram(values, bins, n)
        pair = mc.DominatingPair((gram.detach().numpy(),))
        upper = gaussian_noise_for(pair.max_sensitivity(), epsilon, delta)
        search = calibrate_sigma(
            pair, epsilon, delta, samples, seed + step, upper, guess=guess, tolerance=1e-6
        )
        sigma, guess = search.noise_multiplier, search.noise_multiplier
        norm = prefix_error_norm_torch(values)
        rmse = sigma * float(norm.detach())
        history.append(rmse)
        if step == steps:
            break
        gradient = _implicit_gradient(raw, gram, norm, search, epsilon, sigma)
        optimizer.zero_grad()
        raw.grad = gradient
        optimizer.step()
        bar.set_postfix(rmse=f"{rmse:.4g}")
    return OptimizedMatrix(mechanism, to_params(raw.detach()), sigma, rmse, history)


def _implicit_gradient(
    raw: torch.Tensor,
    gram: torch.Tensor,
    norm: torch.Tensor,
    search: SigmaSearch,
    epsilon: float,
    sigma: float,
) -> torch.Tensor:
    """∇ log RMSE = ∇σ/σ + ∇‖·‖/‖·‖, with ∇σ = −(∂δ̂/∂raw)/(∂δ̂/∂σ) (implicit function theorem)."""
    grad_norm = torch.autograd.grad(norm, raw, retain_graph=True)[0]
    if not search.kept:
        return grad_norm / norm.detach()
    sigma_t = torch.tensor(sigma, dtype=torch.float64, requires_grad=True)
    factor = torch.linalg.cholesky(gram)
    totals = [torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)]
    for chunk in search.kept:
        draw = chunk[0]
        correlated = draw.normals.to(torch.float64) @ factor.T
        for index, loss in enumerate(mc.losses(gram, draw.bins, correlated, sigma_t)):
            totals[index] = totals[index] + mc.hockey_stick(loss, epsilon).sum()
    delta_hat = max(totals, key=lambda t: float(t.detach())) / search.samples
    d_raw, d_sigma = torch.autograd.grad(delta_hat, [raw, sigma_t], allow_unused=True)
    if d_raw is None or d_sigma is None or float(d_sigma) >= 0:
        return grad_norm / norm.detach()
    return -d_raw / d_sigma / sigma + grad_norm / norm.detach()

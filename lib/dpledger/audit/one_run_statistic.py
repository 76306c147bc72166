"""The fixed statistic of the ``order`` bound and its exact law under a Gaussian null.

The statistic of canary j is S_j = h·Σ_t k_t, k_t = round(f(x_t)/h), with f the per-step likelihood
ratio of the Poisson law at the CLAIMED noise σ (units of C):

    f(x) = log[(1 − q) + q·e^{(x − 1/2)/σ²}],

x_t the canary's residual at step t. It is fixed before the data are seen (σ and q come from the
ledger and the sampler), so one ranking serves every null. Under the null "Gaussian noise of std σ'
at each step, the canary in each step with probability q", the k_t are i.i.d. per step with a
law computed exactly from normal CDFs (f is increasing, so each value of k is an interval of x),
and S is their T-fold convolution (an FFT): the exact law of the statistic under P (out) and Q
(in), rounding included, since the rounding is part of the statistic. With h = 0.01 the rounding
moves S by about h·√(T/12) (0.04 at T = 230), which costs no measurable power.

Guesses: "in" for the canaries of highest S (one-sided: an "out" canary and an "in" canary the
sampler never placed look alike, so the low end carries little).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.stats import norm

from dpledger.audit.one_run_order import ErrorProfile

SCORE_STEP = 0.01
TAIL_SD = 9.0  # noise stds beyond which a step's law is cut (mass below 1e-19)


def _per_step(x: np.ndarray, noise: float, step_probability: float) -> np.ndarray:
    """f(x) / h rounded (integers as floats), stable for any x."""
    q = step_probability
    f = np.logaddexp(np.log1p(-q), np.log(q) + (x - 0.5) / noise**2)
    return np.floor(f / SCORE_STEP + 0.5)


def statistic(observation: np.ndarray, noise: float, step_probability: float) -> np.ndarray:
    """S of each canary's row of ``observation`` (canaries × steps, units of C)."""
    x = np.asarray(observation, dtype=np.float64)
    return SCORE_STEP * _per_step(x, noise, step_probability).sum(axis=1)


def _edge(k: np.ndarray, noise: float, step_probability: float) -> np.ndarray:
    """The x at which f(x)/h reaches k − 1/2 (−∞ below f's infimum log(1 − q))."""
    q = step_probability
    f = (k - 0.5) * SCORE_STEP
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = np.log(np.expm1(f - np.log1p(-q))) + np.log1p(-q) - np.log(q)
    x = noise**2 * excess + 0.5
    return np.where(f > np.log1p(-q), x, -np.inf)


def step_law(
    noise: float, step_probability: float, null_noise: float
) -> tuple[int, np.ndarray, np.ndarray]:
    """(least k, P-pmf of k, Q-pmf of k) of one step under the null of noise ``null_noise``."""
    q = step_probability
    top = 1.0 + TAIL_SD * null_noise
    low = int(_per_step(np.array([-np.inf]), noise, q)[0])
    high = int(_per_step(np.array([top]), noise, q)[0]) + 1
    k = np.arange(low, high + 1, dtype=np.float64)
    edges = _edge(k, noise, q)
    edges = np.append(edges[1:], np.inf)  # upper edge of each k (the last takes the rest)
    lower = np.concatenate([[-np.inf], edges[:-1]])
    out = norm.cdf(edges / null_noise) - norm.cdf(lower / null_noise)
    shifted = norm.cdf((edges - 1.0) / null_noise) - norm.cdf((lower - 1.0) / null_noise)
    return low, out, (1.0 - q) * out + q * shifted


@lru_cache(maxsize=128)
def statistic_law(
    noise: float, step_probability: float, steps: int, null_noise: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values of S, P-pmf, Q-pmf) over ``steps`` independent steps (FFT convolution; the
    float64 round-off, about 1e-16 a cell, is clipped at 0)."""
    low, p, q = step_law(noise, step_probability, null_noise)
    size = steps * (p.size - 1) + 1
    length = 1 << int(np.ceil(np.log2(size)))
    laws = [np.fft.irfft(np.fft.rfft(d, length) ** steps, length)[:size] for d in (p, q)]
    laws = [np.clip(d, 0.0, None) for d in laws]
    values = SCORE_STEP * (steps * low + np.arange(size))
    return values, laws[0] / laws[0].sum(), laws[1] / laws[1].sum()


def statistic_profile(
    noise: float, step_probability: float, steps: int, null_noise: float
) -> ErrorProfile:
    """The errors of guessing "in" for the highest S, as a function of S's quantile, under the
    null of noise ``null_noise`` (a canary at S is out with probability P/(P + Q) there)."""
    values, p, q = statistic_law(noise, step_probability, steps, null_noise)
    mass = 0.5 * (p + q)
    keep = mass > 0
    error = p[keep] / (p[keep] + q[keep])
    return ErrorProfile.ranked(values[keep], error, mass[keep])


def one_sided_mistakes(scores: np.ndarray, included: np.ndarray, guesses: int) -> int:
    """Mistakes of guessing "in" for the ``guesses`` highest scores (ties in a fixed order)."""
    order = np.argsort(-scores, kind="stable")[:guesses]
    return int(np.count_nonzero(~included[order]))

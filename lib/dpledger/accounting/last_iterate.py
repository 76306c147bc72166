"""The last-iterate heuristic (Steinke, Nasr, Ganesh, Balle, Choquette-Choo, Jagielski, Hayes,
Thakurta, Smith, Terzis; ICLR 2025, arXiv 2410.06186): a heuristic ε for releasing only the final
model.

For linear losses and SGD with a constant learning rate, the final model is θ₀ − η·Σ_t g̃_t, and Σ_t
g̃_t is a sufficient statistic: in units of the clip norm C it is K + N(0, T·σ²) with the example
present (K = the number of steps that used it) and N(0, T·σ²) without. The heuristic ε is the ε(δ)
of that pair, the larger of both directions:

- Poisson or fresh fixed-size subsets (each step with probability q): K ~ Binomial(T, q), a mixture
  of Gaussians against one Gaussian;
- one slot per epoch (shuffle, balls-in-bins, ...): K = E epochs exactly, a Gaussian pair N(E, Tσ²)
  vs N(0, Tσ²).

It is NOT a guarantee: nonlinear losses can leak more (the paper constructs counterexamples); it is
a prediction of what an auditor of the final model alone can find, computed before training.

The hockey-stick divergence is computed in closed form: the likelihood ratio p/q of the mixture
against the Gaussian is increasing in the output, so {p > e^ε q} is a half-line whose end solves one
equation, and δ is a sum of normal tails there.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr, logsumexp
from scipy.stats import binom

from dpledger.errors import ParamsError

MASS_TAIL = 1e-30  # binomial weights below it are dropped (their total is below δ's resolution)
TAIL_WIDTH = 40.0  # counts beyond mean + 40 sd + 40 have binomial mass far below MASS_TAIL
EPSILON_CAP = 200.0


def participation(
    steps: int, step_probability: float | None, epochs: int
) -> tuple[np.ndarray, np.ndarray]:
    """(counts K, their probabilities): Binomial(T, q) for per-step laws, else K = E surely."""
    if step_probability is None:
        return np.array([float(epochs)]), np.array([1.0])
    mean = steps * step_probability
    reach = mean + TAIL_WIDTH * math.sqrt(mean * (1.0 - step_probability)) + TAIL_WIDTH
    counts = np.arange(0, min(math.ceil(reach), steps) + 1, dtype=np.float64)
    weights = binom.pmf(counts, steps, step_probability)
    keep = weights > MASS_TAIL
    return counts[keep], weights[keep] / weights[keep].sum()


def _log_ratio(x: float, counts: np.ndarray, log_weights: np.ndarray, scale: float) -> float:
    """log p(x)/q(x) of the mixture Σ w_k N(k, s²) against N(0, s²), s = ``scale``."""
    return float(logsumexp(log_weights + (counts * x - counts**2 / 2.0) / scale**2))


def _root(function, start: float, step: float) -> float:
    """A root of the increasing ``function``, bracketed by walking outward from ``start``."""
    low, high = start - step, start + step
    while function(low) > 0:
        low -= 2 * (high - low)
    while function(high) < 0:
        high += 2 * (high - low)
    return float(brentq(function, low, high, xtol=1e-12, rtol=1e-14))


def hockey_stick(epsilon: float, counts: np.ndarray, weights: np.ndarray, scale: float) -> float:
    """max over both directions of sup_S P(S) − e^ε Q(S) for P = Σ w_k N(k, s²), Q = N(0, s²)."""
    log_w = np.log(weights)
    center = float(np.dot(counts, weights))

    def ratio_minus(level: float):
        return lambda x: _log_ratio(x, counts, log_w, scale) - level

    # P over Q: {x > a} with log p/q(a) = ε
    a = _root(ratio_minus(epsilon), center, scale)
    upper = logsumexp(log_w + log_ndtr(-(a - counts) / scale))
    forward = math.exp(upper) - math.exp(epsilon + log_ndtr(-a / scale))
    # Q over P: {x < b} with log p/q(b) = −ε; it exists only when the weight of K = 0 is < e^{−ε}
    zero = weights[counts == 0].sum()
    backward = 0.0
    if zero < math.exp(-epsilon):
        b = _root(ratio_minus(-epsilon), 0.0, scale)
        lower = logsumexp(log_w + log_ndtr((b - counts) / scale))
        backward = math.exp(log_ndtr(b / scale)) - math.exp(epsilon + lower)
    return max(forward, backward, 0.0)


def last_iterate_epsilon(
    noise_multiplier: float,
    steps: int,
    delta: float,
    *,
    step_probability: float | None,
    epochs: int,
) -> float:
    """The heuristic ε at ``delta`` of releasing only the last iterate of ``steps`` DP-SGD steps."""
    if not noise_multiplier > 0 or steps < 1 or not 0 < delta < 1:
        raise ParamsError(
            f"last-iterate heuristic: σ = {noise_multiplier}, steps = {steps}, "
            f"δ = {delta} are invalid: it needs σ > 0, steps >= 1 and δ in (0, 1)"
        )
    counts, weights = participation(steps, step_probability, epochs)
    scale = noise_multiplier * math.sqrt(steps)
    if hockey_stick(0.0, counts, weights, scale) <= delta:
        return 0.0
    high = 1.0
    while hockey_stick(high, counts, weights, scale) > delta:
        high *= 2.0
        if high > EPSILON_CAP:
            return math.inf
    return float(
        brentq(lambda eps: hockey_stick(eps, counts, weights, scale) - delta, 0.0, high, xtol=1e-6)
    )

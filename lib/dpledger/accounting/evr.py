"""How many fresh samples Estimate-Verify-Release needs for a stated failure probability.

The check: release (σ, ε) only if the mean of m fresh samples of W = (1 − e^{ε−Y})_+ ∈ [0, 1] is at
most a threshold τ < δ. It fails (passes a pair whose true δ exceeds the target) with probability at
most

    P(mean <= τ | E W = μ >= δ) <= exp(−m · kl(τ ‖ μ)) <= exp(−m · kl(τ ‖ δ))

by the Chernoff–Hoeffding bound for [0, 1]-valued variables (Hoeffding 1963, Thm 1 in its
relative-entropy form: a [0, 1] variable's moment generating function is at most that of a Bernoulli
with the same mean), with kl(a ‖ b) = a ln(a/b) + (1 − a) ln((1 − a)/(1 − b)) the Bernoulli relative
entropy, increasing in b >= a (so μ = δ is the worst case). It is never weaker than Bernstein's
exp(−m t²/(2δ + 2t/3)), t = δ − τ (tests/test_accounting_evr.py checks both directions numerically).
The sample count then follows from the failure probability β: m = ceil(ln(1/β) / kl(τ ‖ δ)).
"""

from __future__ import annotations

import math


def kl_bernoulli(a: float, b: float) -> float:
    """Relative entropy of Bernoulli(a) from Bernoulli(b), 0 <= a < b < 1."""
    first = 0.0 if a == 0 else a * math.log(a / b)
    return first + (1 - a) * (math.log1p(-a) - math.log1p(-b))


def failure_bound(samples: int, delta: float, threshold: float) -> float:
    """β: the probability that ``samples`` fresh samples pass the check although the true δ exceeds
    ``delta``."""
    return math.exp(-samples * kl_bernoulli(threshold, delta))


def samples_for(failure: float, delta: float, threshold: float) -> int:
    """The fewest fresh samples whose :func:`failure_bound` is at most ``failure``."""
    return math.ceil(math.log(1.0 / failure) / kl_bernoulli(threshold, delta))

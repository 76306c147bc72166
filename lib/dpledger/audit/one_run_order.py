"""The order-statistics tail of a one-run audit (Xiang, Wang, Xiao, Tian, Wang 2025, 2509.08704).

n canaries, each "in" with probability 1/2. The auditor ranks them by confidence, releases its r
most confident guesses and makes T mistakes among them. When each canary's observation is an
independent draw of a binary experiment (P: out, Q: in) and the guesses follow a fixed rule, the
cut decomposition gives T exactly: conditioned on the score quantile W of the best canary NOT
released, the r released ones are i.i.d. above it, each wrong with the mean error rate γ̄(W) above
that quantile, and W is the (n − r)-th of n uniform order statistics, Beta(n − r, r + 1):

    P[T ≤ u] = E_W[ BinCDF(u; r, γ̄(W)) ],  γ̄(w) = G(w)/(1 − w),  G(w) = ∫_w^1 γ(v) dv,

with γ(v) the error of a guess at score quantile v (for the experiment's own likelihood ratio L:
confidence |L|, "in" when L > 0, γ = 1/(1 + e^{|L|})). For r = n there is no cut and
T ~ Binomial(n, E[γ]). A small P[T ≤ u] refutes the experiment as the canaries' channel. The
paper's theorem extends the tail of the likelihood-ratio guesser to any mechanism whose trade-off
is that experiment's and any guesser (the least number of mistakes such a mechanism allows); here
it is used in two ways (:mod:`dpledger.audit.one_run_family`).

A channel is its values of L and their mass under the mixture M = (P + Q)/2 (the canaries' bits are
fair coins, so M is what a canary's observation follows); ±∞ are atoms that reveal the bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, gammaln, logsumexp
from scipy.stats import binom

CUT_NODES = 4001  # quadrature nodes over the cut's Beta law
CUT_WIDTH = 16.0  # standard deviations of the Beta law either side of its mean


@dataclass(frozen=True)
class Channel:
    """A binary experiment as ``log_ratio`` = log dQ/dP (±inf allowed) and ``mass`` under M."""

    log_ratio: np.ndarray
    mass: np.ndarray

    @classmethod
    def from_loss_pmf(
        cls, losses: np.ndarray, probabilities: np.ndarray, infinity_mass: float
    ) -> "Channel":
        """The experiment of a discretised privacy loss distribution: ``probabilities`` of the loss
        values ``losses`` under Q (the "in" law) and Q's atom at +∞; P follows as e^{−L}·Q. A
        pessimistic discretisation rounds each step's loss up, so over T composed steps the values
        sit about T·h/2 too high and P would lack mass (a fifth of it at T = 230, h = 2·10⁻³);
        left as an atom at −∞, that lack would pose as certain guesses. The values are shifted
        down by the one constant that makes P sum to one: each step's rounding undone on average,
        what remains is a random walk of about h·√(T/12) nats (≈ 0.01 there)."""
        losses = np.asarray(losses, dtype=np.float64)
        q = np.asarray(probabilities, dtype=np.float64)
        keep = q > 0
        losses, q = losses[keep], q[keep]
        losses = losses + logsumexp(np.log(q) - losses)
        p = np.exp(np.log(q) - losses)
        log_ratio = np.append(losses, np.inf)
        mass = 0.5 * np.append(q + p, infinity_mass)
        return cls(log_ratio, mass / mass.sum())

    @classmethod
    def epsilon_delta(cls, epsilon: float, delta: float) -> "Channel":
        """The (ε, δ) randomized response: the least private experiment that is (ε, δ)-DP (every
        (ε, δ)-DP pair is a post-processing of it). Q: +∞ with δ, ±ε with (1 − δ)·(e^ε, 1) /
        (1 + e^ε); P the mirror image."""
        c = (1.0 - delta) * float(expit(-epsilon))
        log_ratio = np.array([np.inf, -np.inf, epsilon, -epsilon])
        mass = 0.5 * np.array([delta, delta, c * np.exp(epsilon) + c, c + c * np.exp(epsilon)])
        return cls(log_ratio, mass / mass.sum())


@dataclass(frozen=True)
class ErrorProfile:
    """The channel's outcomes ordered by confidence |L| (least first), as quantile bands of M: band
    j covers [``edges[j]``, ``edges[j+1]``) and its guesses err with probability ``error[j]``."""

    edges: np.ndarray
    error: np.ndarray
    above: np.ndarray  # error mass strictly above band j: Σ_{k>j} error[k]·width[k]

    @classmethod
    def of(cls, channel: Channel) -> "ErrorProfile":
        """Guesses by the channel's own likelihood ratio: confidence |L|, "in" where L > 0, wrong
        with probability 1/(1 + e^{|L|}) (0 at the ±∞ atoms)."""
        confidence = np.abs(channel.log_ratio)
        return cls.ranked(confidence, expit(-confidence), channel.mass)

    @classmethod
    def ranked(cls, confidence: np.ndarray, error: np.ndarray, mass: np.ndarray) -> "ErrorProfile":
        """Outcomes of M-``mass`` ranked by ``confidence`` (ties in a fixed order), each guess wrong
        with probability ``error``: any fixed guessing rule, not only the likelihood ratio's."""
        order = np.argsort(confidence, kind="stable")
        error, width = error[order], mass[order] / mass.sum()
        edges = np.concatenate([[0.0], np.cumsum(width)])
        edges[-1] = 1.0
        weighted = error * width
        above = np.cumsum(weighted[::-1])[::-1] - weighted
        return cls(edges, error, above)

    @property
    def mean_error(self) -> float:
        """E_M[γ]: the error rate of one guess at a random canary (the cut at quantile 0)."""
        return float(self.error_above(np.zeros(1))[0])

    def error_above(self, w: np.ndarray) -> np.ndarray:
        """G(w): the error mass of the quantiles above ``w``; exact inside a band (an atom's share
        above w errs at the atom's rate)."""
        j = np.clip(np.searchsorted(self.edges, w, side="right") - 1, 0, self.error.size - 1)
        return self.error[j] * np.maximum(self.edges[j + 1] - w, 0.0) + self.above[j]

    def mean_error_above(self, w: np.ndarray) -> np.ndarray:
        """γ̄(w) = G(w)/(1 − w): the error rate of a guess drawn above quantile ``w``."""
        w = np.asarray(w, dtype=np.float64)
        return np.clip(self.error_above(w) / np.maximum(1.0 - w, 1e-300), 0.0, 1.0)


def _log_binom_cdf(mistakes: int, guesses: int, rate: np.ndarray) -> np.ndarray:
    """log P[Binomial(guesses, rate) ≤ mistakes], 0 where the rate is 0."""
    rate = np.asarray(rate, dtype=np.float64)
    out = np.zeros_like(rate)
    positive = rate > 0
    out[positive] = binom.logcdf(mistakes, guesses, rate[positive])
    return out


def tail_probability(profile: ErrorProfile, canaries: int, guesses: int, mistakes: int) -> float:
    """P[T ≤ ``mistakes``] for the ``guesses`` most confident of ``canaries`` i.i.d. canaries of the
    channel (the cut decomposition, module docstring); the integral over the cut's Beta law is a
    trapezoid in log space over ± :data:`CUT_WIDTH` standard deviations."""
    if mistakes < 0 or not 0 < guesses <= canaries:
        raise ValueError(f"need 0 ≤ u and 0 < r ≤ n, got u={mistakes}, r={guesses}, n={canaries}")
    if mistakes >= guesses:
        return 1.0
    if guesses == canaries:
        return float(np.exp(_log_binom_cdf(mistakes, guesses, np.array([profile.mean_error]))[0]))
    a, b = float(canaries - guesses), float(guesses + 1)
    mean, sd = a / (a + b), np.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0)))
    low, high = max(1e-300, mean - CUT_WIDTH * sd), min(1.0 - 1e-16, mean + CUT_WIDTH * sd)
    w = np.linspace(low, high, CUT_NODES)
    log_beta = (
        (a - 1.0) * np.log(w) + (b - 1.0) * np.log1p(-w) + gammaln(a + b) - gammaln(a) - gammaln(b)
    )
    log_terms = log_beta + _log_binom_cdf(mistakes, guesses, profile.mean_error_above(w))
    # trapezoid: Σ (f_i + f_{i+1})/2 · Δw, all in logs
    pairs = np.logaddexp(log_terms[:-1], log_terms[1:]) - np.log(2.0)
    return float(min(1.0, np.exp(logsumexp(pairs) + np.log(w[1] - w[0]))))


def released_mistakes(scores: np.ndarray, included: np.ndarray, guesses: int) -> int:
    """Mistakes of the ``guesses`` most confident guesses by likelihood ratio ``scores``: the
    largest |score| first (ties in a fixed order), guess "in" where the score is > 0."""
    order = np.argsort(-np.abs(scores), kind="stable")[:guesses]
    return int(np.count_nonzero((scores[order] > 0) != included[order]))


def simulate_mistakes(
    channel: Channel, canaries: int, guesses: int, runs: int, rng: np.random.Generator
) -> np.ndarray:
    """Mistakes of ``runs`` independent audits of i.i.d. canaries of ``channel``, by brute force:
    draw each canary's outcome from M and its bit from P(in | L) = e^L/(1 + e^L), release the
    ``guesses`` most confident. The check of :func:`tail_probability`."""
    outcomes = rng.choice(channel.mass.size, size=(runs, canaries), p=channel.mass)
    scores = channel.log_ratio[outcomes]
    included = rng.random((runs, canaries)) < expit(scores)
    jitter = rng.random((runs, canaries))  # breaks ties among equal scores at random
    return np.array(
        [
            released_mistakes(np.where(np.isfinite(s), s + 1e-9 * j * np.sign(s), s), b, guesses)
            for s, b, j in zip(scores, included, jitter)
        ]
    )

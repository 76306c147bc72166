"""The order-statistics bound of one run (:mod:`dpledger.audit.one_run_order`) in its two forms.

- ``order`` (the claimed mechanism's family). Null: "every canary's coordinate is released as the
  ledger's mechanism releases it": T steps, the canary in each step with probability q (Poisson),
  Gaussian noise of std σ' (units of the clip norm C). Under it the canaries are independent draws
  of one experiment: each has its own coordinate, whose noise is independent of every other
  coordinate's, and its own placements. The canaries are ranked by a statistic fixed in advance
  (:mod:`dpledger.audit.one_run_statistic`), whose law under each null is computed exactly, so the
  tail is exact, not a bound. σ' is searched for the least noise still refuted; ε_emp is the ε of
  that σ' (adding a canary; dp_accounting's PLD, rounded optimistically so it is not overstated).
  It refutes "the run is this Gaussian mechanism at σ' or more noise", not a generic (ε, δ) claim.
- ``order-eps-delta`` (a generic (ε, δ) test). Null: any mechanism that is (ε, δ)-DP for each
  canary; by the paper's theorem the fewest mistakes it allows are those of i.i.d. canaries through
  the (ε, δ) randomized response. Guesses are "in" for the highest scores.

The number of guesses r is never picked after looking: every r of :data:`RELEASE_FRACTIONS` is
tested with a Bonferroni share of the significance, or a held-out part of the canaries picks it
(``split``). ε_emp is the largest refuted; the search assumes refutation is monotone in the
parameter (more noise or a smaller ε, fewer refutations), true of both families.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution as pld

from dpledger.audit.one_run_order import Channel, ErrorProfile, tail_probability
from dpledger.audit.one_run_statistic import one_sided_mistakes, statistic, statistic_profile

RELEASE_FRACTIONS = (0.05, 0.1, 0.25, 0.5, 1.0)  # r/n tested (Bonferroni over them)
LOSS_STEP = 2e-3  # the null's loss discretisation (pessimistic: conservative tests)
EPSILON_STEP = 1e-3  # the discretisation of ε_emp's accountant (optimistic: never overstated)
SEARCH_STEPS = 14


@dataclass(frozen=True)
class OrderEstimate:
    """ε_emp of one form of the order-statistics bound: ``guesses`` released of ``canaries``,
    ``mistakes`` among them, refuting the null down to ``parameter`` (σ' for ``order``, ε for
    ``order-eps-delta``) at ``confidence``; ``ceiling`` is the most any run could show."""

    form: str
    epsilon: float
    parameter: float
    confidence: float
    canaries: int
    guesses: int
    mistakes: int
    guesses_tried: int
    threshold: str
    ceiling: float


def guess_counts(canaries: int) -> list[int]:
    """The data-independent numbers of released guesses: a fraction of :data:`RELEASE_FRACTIONS`."""
    return sorted({max(1, int(round(f * canaries))) for f in RELEASE_FRACTIONS})


@lru_cache(maxsize=128)
def gaussian_channel(noise: float, step_probability: float, steps: int, step: float) -> Channel:
    """Adding one canary to the Poisson-subsampled Gaussian of ``steps`` steps at noise std
    ``noise`` (sensitivity 1), its loss rounded up to multiples of ``step``."""
    dist = pld.from_gaussian_mechanism(
        noise,
        sensitivity=1.0,
        sampling_prob=step_probability,
        value_discretization_interval=step,
        pessimistic_estimate=True,
        use_connect_dots=False,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
    )
    pmf = dist.self_compose(steps)._pmf_remove.to_dense_pmf()
    losses = (pmf._lower_loss + np.arange(pmf._probs.size)) * pmf._discretization
    return Channel.from_loss_pmf(losses, pmf._probs, pmf._infinity_mass)


@lru_cache(maxsize=16)
def gaussian_epsilon(noise: float, step_probability: float, steps: int, delta: float) -> float:
    """ε of adding a canary at ``noise`` (dp_accounting's PLD, rounded optimistically)."""
    dist = pld.from_gaussian_mechanism(
        noise,
        sensitivity=1.0,
        sampling_prob=step_probability,
        value_discretization_interval=EPSILON_STEP,
        pessimistic_estimate=False,
        use_connect_dots=False,
    )
    return float(dist.self_compose(steps)._pmf_remove.get_epsilon_for_delta(delta))


def largest_refuted(refutes: Callable[[float], bool], low: float, high: float) -> float | None:
    """The largest θ in [low, high) with ``refutes(θ)`` (monotone: refuted below a point), by
    bisection on a log scale, never evaluating ``high`` itself (the least private, and dearest,
    null); None when not even ``low`` is refuted."""
    if not refutes(low):
        return None
    for _ in range(SEARCH_STEPS):
        mid = float(np.sqrt(low * high))
        low, high = (mid, high) if refutes(mid) else (low, mid)
    return low


def refutes_at(
    profile: ErrorProfile, canaries: int, counts: list[tuple[int, int]], significance: float
) -> bool:
    """Whether any (guesses, mistakes) of ``counts`` has P[T ≤ mistakes] ≤ ``significance`` under
    the channel of ``profile`` (each count already holds its Bonferroni share)."""
    return any(tail_probability(profile, canaries, r, u) <= significance for r, u in counts)


Counts = Callable[[float, np.ndarray, list[int]], list[tuple[int, int]]]


def order_search(
    counts_at: Counts,
    profile_at: Callable[[float], ErrorProfile],
    canaries: int,
    significance: float,
    bracket: tuple[float, float],
    threshold: str,
    split_fraction: float,
) -> tuple[float | None, int, int, int, int]:
    """(θ refuted or None, canaries judged, guesses, mistakes, guesses tried) of an order bound;
    ``counts_at(θ, keep, rs)`` gives the (r, mistakes) of the canaries ``keep`` for each r of
    ``rs`` at the null θ. ``bonferroni``: every r of :func:`guess_counts` at a share of the
    significance; ``split``: the first ``split_fraction`` of the canaries pick the fraction of
    guesses whose own bound is largest, the rest are judged at it alone."""
    everyone = np.ones(canaries, dtype=bool)
    if threshold == "bonferroni":
        return _judge(
            counts_at, profile_at, everyone, guess_counts(canaries), significance, bracket
        )
    held = np.zeros(canaries, dtype=bool)
    held[: int(round(canaries * split_fraction))] = True
    rest = ~held
    picked = [
        (_judge(counts_at, profile_at, held, [r], significance, bracket)[0] or 0.0, -r)
        for r in guess_counts(int(held.sum()))
    ]
    r = max(1, int(round(-max(picked)[1] * rest.sum() / held.sum())))
    return _judge(counts_at, profile_at, rest, [r], significance, bracket)


def _judge(
    counts_at: Counts,
    profile_at: Callable[[float], ErrorProfile],
    keep: np.ndarray,
    guesses: list[int],
    significance: float,
    bracket: tuple[float, float],
) -> tuple[float | None, int, int, int, int]:
    """The largest θ the canaries ``keep`` refute at any r of ``guesses`` (a Bonferroni share
    each), with the canaries judged and the (r, mistakes) that refutes it."""
    share, n = significance / len(guesses), int(np.count_nonzero(keep))
    theta = largest_refuted(
        lambda t: refutes_at(profile_at(t), n, counts_at(t, keep, guesses), share), *bracket
    )
    at = bracket[0] if theta is None else theta
    profile = profile_at(at)
    r, mistakes = min(counts_at(at, keep, guesses), key=lambda c: tail_probability(profile, n, *c))
    return theta, n, r, mistakes, len(guesses)


def perfect(included: np.ndarray) -> Counts:
    """The counts of a perfectly leaking run, what no run can beat (the ceiling): "in" guesses
    all right while in canaries remain, then all wrong."""

    def counts(theta: float, keep: np.ndarray, guesses: list[int]) -> list[tuple[int, int]]:
        inside = int(np.count_nonzero(included[keep]))
        return [(r, max(0, r - inside)) for r in guesses]

    return counts


def family_estimate(
    observation: np.ndarray,
    included: np.ndarray,
    *,
    step_probability: float,
    noise_claimed: float,
    delta: float,
    confidence: float,
    threshold: str,
    split_fraction: float,
) -> OrderEstimate:
    """``order``: the least noise σ' (units of C) at which the run still is not the ledger's
    Poisson-subsampled Gaussian, from the canaries' rows ``observation`` (canaries × steps), ranked
    by the fixed statistic of :mod:`dpledger.audit.one_run_statistic`; ε_emp is the ε of σ'."""
    steps = observation.shape[1]
    scores = statistic(observation, noise_claimed, step_probability)

    def profile_at(theta: float) -> ErrorProfile:
        return statistic_profile(noise_claimed, step_probability, steps, 1.0 / theta)

    def counts_at(theta: float, keep: np.ndarray, guesses: list[int]) -> list[tuple[int, int]]:
        return [(r, one_sided_mistakes(scores[keep], included[keep], r)) for r in guesses]

    # σ' from 4σ (ε_emp 0 below it) to σ/6 (a broken run shows at least that); the ceiling is
    # sought up to σ/2 only: at least ε(σ/2) is all the verdict needs (it exceeds the claim)
    search = (included.size, 1.0 - confidence)
    rule = (threshold, split_fraction)
    bracket = (0.25 / noise_claimed, 6.0 / noise_claimed)
    theta, n, r, mistakes, tried = order_search(counts_at, profile_at, *search, bracket, *rule)
    top_bracket = (bracket[0], 2.0 / noise_claimed)
    top = order_search(perfect(included), profile_at, *search, top_bracket, *rule)[0]

    def epsilon(t: float | None) -> float:
        return 0.0 if t is None else gaussian_epsilon(1.0 / t, step_probability, steps, delta)

    parameter = float("inf") if theta is None else 1.0 / theta
    return OrderEstimate(
        "order",
        epsilon(theta),
        parameter,
        confidence,
        n,
        r,
        mistakes,
        tried,
        threshold,
        epsilon(top),
    )


def eps_delta_estimate(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    confidence: float,
    threshold: str,
    split_fraction: float,
) -> OrderEstimate:
    """``order-eps-delta``: the largest ε whose (ε, δ) claim the "in" guesses for the highest
    ``scores`` refute (the paper's tail for the (ε, δ) randomized response)."""

    def profile_at(epsilon: float) -> ErrorProfile:
        return ErrorProfile.of(Channel.epsilon_delta(epsilon, delta))

    def counts_at(theta: float, keep: np.ndarray, guesses: list[int]) -> list[tuple[int, int]]:
        return [(r, one_sided_mistakes(scores[keep], included[keep], r)) for r in guesses]

    search = (included.size, 1.0 - confidence, (0.01, 64.0), threshold, split_fraction)
    theta, n, r, mistakes, tried = order_search(counts_at, profile_at, *search)
    top = order_search(perfect(included), profile_at, *search)[0] or 0.0
    return OrderEstimate(
        "order-eps-delta",
        theta or 0.0,
        theta or 0.0,
        confidence,
        n,
        r,
        mistakes,
        tried,
        threshold,
        top,
    )

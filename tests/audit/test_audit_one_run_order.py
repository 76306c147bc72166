"""The order-statistics one-run bound (2509.08704): its tail against the paper's published numbers
and against brute-force simulation, its null on honest runs, broken runs contradicted, and the
audit's ceiling."""

from __future__ import annotations

import numpy as np
import pytest

from dpledger.audit.canaries import CanaryLaw, observe, stream
from dpledger.audit.one_run import CANNOT_TEST, audit_one_run, verdict_for
from dpledger.audit.one_run_bounds import ceiling_epsilon
from dpledger.audit.one_run_family import (
    family_estimate,
    gaussian_channel,
    gaussian_epsilon,
    guess_counts,
    largest_refuted,
    refutes_at,
)
from dpledger.audit.one_run_order import (
    Channel,
    ErrorProfile,
    simulate_mistakes,
    tail_probability,
)
from dpledger.audit.one_run_statistic import one_sided_mistakes, statistic, statistic_profile

DELTA = 1e-5


# (mechanism: noise = 1/μ, sampling probability q, one step; n canaries, r released, u mistakes;
# the paper's ε lower bound at δ = 1e-5, 95 %) from zihangxiang/tight-privacy-audit-in-one-run,
# compare/RESULTS.txt (commit 6359b19), rows "Gaussian mu=0.5", "Gaussian mu=2", "SGM mu=2 q=0.2".
PAPER = [
    (0.5, 1.0, 1000, 500, 172, 1.4689),
    (2.0, 1.0, 10_000, 5000, 202, 9.6526),
    (2.0, 0.2, 10_000, 1000, 216, 6.7008),
]


@pytest.mark.parametrize("mu, q, n, r, u, published", PAPER)
def test_bound_matches_the_papers_published_numbers(mu, q, n, r, u, published):
    """Our tail on the same (n, r, u), the null family searched over μ: within 1 % of the paper,
    and never above it by more than its own rounding (our ε is rounded down)."""

    def refutes(theta: float) -> bool:
        profile = ErrorProfile.of(gaussian_channel(1.0 / theta, q, 1, 1e-3))
        return tail_probability(profile, n, r, u) <= 0.05

    theta = largest_refuted(refutes, 0.5 * mu, 1.5 * mu)
    ours = gaussian_epsilon(1.0 / theta, q, 1, DELTA)
    assert published * 0.99 <= ours <= published * 1.002


def _empirical_cdf(samples: np.ndarray, u: int) -> tuple[float, float]:
    p = float(np.mean(samples <= u))
    return p, np.sqrt(p * (1 - p) / samples.size) + 1e-3


@pytest.mark.parametrize(
    "channel, n, r",
    [
        (gaussian_channel(1.0, 1.0, 1, 1e-3), 400, 100),  # μ = 1 Gaussian, the likelihood ratio
        (gaussian_channel(0.8, 0.3, 3, 1e-3), 300, 300),  # subsampled, 3 steps, no cut (r = n)
        (Channel.epsilon_delta(1.0, 0.01), 500, 60),  # the (ε, δ) randomized response
    ],
)
def test_tail_equals_its_own_monte_carlo_simulation(channel, n, r):
    """P[T ≤ u] from the cut decomposition against 4000 brute-force audits, at u around the mean."""
    rng = np.random.default_rng(7)
    mistakes = simulate_mistakes(channel, n, r, 4000, rng)
    profile = ErrorProfile.of(channel)
    for u in np.quantile(mistakes, [0.1, 0.5, 0.9]).astype(int):
        p, se = _empirical_cdf(mistakes, int(u))
        assert abs(tail_probability(profile, n, r, int(u)) - p) < 4 * se


def _canaries(noise, q, steps, m, seed, shift=1.0):
    """Ideal canaries: rows of Gaussian noise plus ``shift`` where a canary is in and placed."""
    rng = stream(seed, 9)
    included = rng.random(m) < 0.5
    placed = rng.random((m, steps)) < q
    rows = rng.standard_normal((m, steps)) * noise + shift * (included[:, None] & placed)
    return rows, included


def test_fixed_statistic_law_equals_simulation_under_a_null():
    """The exact law of the ranking statistic under a null noise different from the one it is
    computed at: mistakes of one-sided guesses in 3000 simulated audits against the tail."""
    claimed, null, q, steps, n, r = 1.0, 1.3, 0.2, 12, 300, 60
    mistakes = np.array(
        [
            one_sided_mistakes(statistic(rows, claimed, q), included, r)
            for rows, included in (_canaries(null, q, steps, n, s) for s in range(3000))
        ]
    )
    profile = statistic_profile(claimed, q, steps, null)
    for u in np.quantile(mistakes, [0.1, 0.5, 0.9]).astype(int):
        p, se = _empirical_cdf(mistakes, int(u))
        assert abs(tail_probability(profile, n, r, int(u)) - p) < 4 * se


def test_honest_runs_refute_their_own_claim_in_at_most_5_percent_of_200_seeds():
    """The family form at the claimed σ on 200 honest runs (the test behind ε_emp ≤ claim)."""
    sigma, q, steps, m = 1.0, 0.1, 30, 2000
    grid = guess_counts(m)
    profile = statistic_profile(sigma, q, steps, sigma)
    refuted = 0
    for seed in range(200):
        rows, included = _canaries(sigma, q, steps, m, seed)
        scores = statistic(rows, sigma, q)
        counts = [(r, one_sided_mistakes(scores, included, r)) for r in grid]
        refuted += refutes_at(profile, m, counts, 0.05 / len(grid))
    assert refuted <= 10


@pytest.mark.parametrize("noise_scale, shift", [(0.25, 1.0), (1.0, 4.0)])
def test_broken_runs_are_contradicted_and_the_honest_one_is_not(noise_scale, shift):
    """Noise scaled by 1/4, and a canary whose contribution is not clipped (4 C): ε_emp above the
    claim; the honest run below it."""
    sigma, q, steps, m = 1.0, 0.1, 30, 2000
    claim = gaussian_epsilon(sigma, q, steps, DELTA)
    settings = dict(
        step_probability=q,
        noise_claimed=sigma,
        delta=DELTA,
        confidence=0.95,
        threshold="bonferroni",
        split_fraction=0.5,
    )
    honest = family_estimate(*_canaries(sigma, q, steps, m, 1), **settings)
    broken = family_estimate(*_canaries(sigma * noise_scale, q, steps, m, 1, shift), **settings)
    assert honest.epsilon <= claim < broken.epsilon
    assert verdict_for(broken.epsilon, claim, broken.ceiling) == "contradicted"


def test_a_claim_above_the_ceiling_cannot_be_tested_and_is_never_consistent():
    included = np.random.default_rng(0).random(10_000) < 0.5
    ceilings = {
        bound: ceiling_epsilon(
            included,
            bound=bound,
            family="eps-delta",
            delta=DELTA,
            confidence=0.95,
            threshold="bonferroni",
            split_fraction=0.5,
        )
        for bound in ("fdp", "steinke")
    }
    # the audit's power ceiling at 10⁴ canaries: about 6.6 (f-DP) and 4.5 (Steinke)
    assert 6.4 < ceilings["fdp"] < 6.8 and 4.3 < ceilings["steinke"] < 4.7
    assert verdict_for(3.0, 8.0, ceilings["fdp"]) == CANNOT_TEST
    assert verdict_for(3.0, 5.0, ceilings["fdp"]) == "consistent"
    assert verdict_for(9.0, 8.0, ceilings["fdp"]) == "contradicted"


def test_a_run_released_without_noise_is_contradicted_not_refused():
    """All released sums exactly the real examples' (no noise at all): the audit stage's scores
    must not fail on a zero noise std."""
    steps, m, sigma = 20, 1000, 3.0  # a claim below both bounds' ceilings at 1000 canaries
    law = CanaryLaw("poisson", steps, 2, step_probability=0.2)
    rng = np.random.default_rng(3)
    real = rng.standard_normal((steps, m)).astype(np.float32)
    saved = {
        "raw": real.copy(),
        "real": real,
        "included": rng.random(m) < 0.5,
        "seed": np.array(5),
    }
    claim = gaussian_epsilon(sigma, 0.2, steps, DELTA)
    for bound in ("order", "fdp"):
        result = audit_one_run(
            saved,
            law,
            noise_multiplier=sigma,
            epsilon_claimed=claim,
            delta=DELTA,
            confidence=0.95,
            bound=bound,
            threshold="bonferroni",
            split_fraction=0.5,
            correlated=False,
        )
        assert result.verdict == "contradicted", bound


def test_observe_and_the_statistic_agree_with_the_recorded_layout():
    """The statistic reads canaries × steps rows as :func:`observe` returns them."""
    steps, m = 5, 8
    raw = np.zeros((steps, m))
    included = np.arange(m) % 2 == 0
    placed = np.ones((m, steps), dtype=bool)
    rows = observe(raw, raw, included, placed)
    scores = statistic(rows, 1.0, 0.5)
    assert np.all(scores[included] > scores[~included].max())


def test_split_threshold_judges_held_out_canaries_and_separates_honest_from_broken():
    """``split``: the first half picks r, the second half alone is judged; noise/4 contradicted,
    the honest run not, and the estimate counts only the judged half."""
    sigma, q, steps, m = 1.0, 0.1, 30, 2000
    claim = gaussian_epsilon(sigma, q, steps, DELTA)
    settings = dict(
        step_probability=q,
        noise_claimed=sigma,
        delta=DELTA,
        confidence=0.95,
        threshold="split",
        split_fraction=0.5,
    )
    honest = family_estimate(*_canaries(sigma, q, steps, m, 2), **settings)
    broken = family_estimate(*_canaries(sigma / 4, q, steps, m, 2), **settings)
    assert honest.epsilon <= claim < broken.epsilon
    assert honest.canaries == m // 2 and honest.guesses_tried == 1

"""Importance-sampled EVR verification: unbiased, bounded weights, right conditional law, fewer
samples."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpledger.accounting import AllocationAccountant, describe, evr, get_accountant
from dpledger.accounting import importance as imp
from dpledger.accounting import montecarlo as mc
from dpledger.errors import UnsupportedMechanismError


def _banded_gram():
    return mc.fixed_bins_pair(np.array([1.0, 0.6, 0.3]), bins=4, steps=8)


@pytest.mark.parametrize("sigma,epsilon", [(1.0, 1.5), (0.8, 2.5)])
def test_importance_estimate_agrees_with_plain_sampling(sigma, epsilon):
    pair = _banded_gram()
    gram = pair.grams[0]
    plain = mc.estimate_delta(pair, sigma, epsilon, 1 << 19, seed=1)
    remove, add = imp.proposals(torch.as_tensor(gram), sigma, epsilon)
    for proposal, exact in ((remove, plain.delta_remove), (add, plain.delta_add)):
        found = imp.estimate(gram, proposal, sigma, epsilon, 1 << 17, seed=2)
        assert abs(found.delta - exact) <= 4 * math.hypot(found.stderr, plain.stderr)
        assert exact <= proposal.bound  # δ <= M: the union bound covers the whole loss tail


def test_importance_agrees_with_allocation_bounds_for_identity():
    """C = I, one epoch: importance-sampled δ at the allocation accountant's upper ε is <= δ, at its
    lower ε >= δ, up to 4 standard errors (pld-accounting's bounds are independent of this code)."""
    delta = 1e-4
    description = describe(
        sampler="balls-in-bins", noise_multiplier=1.0, batches_per_epoch=10, epochs=1
    )
    bounds = AllocationAccountant().epsilon(description, delta)
    gram = get_accountant("montecarlo").pair(description).grams[0]
    for epsilon, side in ((bounds.epsilon, "upper"), (bounds.details["epsilon_lower"], "lower")):
        remove, _ = imp.proposals(torch.as_tensor(gram), 1.0, epsilon)
        assert remove.bound < 0.5
        found = imp.estimate(gram, remove, 1.0, epsilon, 1 << 17, seed=5)
        if side == "upper":
            assert found.delta <= delta + 4 * found.stderr
        else:
            assert found.delta >= delta - 4 * found.stderr


@settings(max_examples=25, deadline=None)
@given(
    bins=st.integers(2, 6),
    decay=st.floats(0.0, 0.9),
    sigma=st.floats(0.4, 3.0),
    epsilon=st.floats(0.05, 4.0),
    seed=st.integers(0, 1000),
)
def test_weighted_terms_never_exceed_the_bound(bins, decay, sigma, epsilon, seed):
    pair = mc.fixed_bins_pair(decay ** np.arange(2 * bins), bins=bins, steps=2 * bins)
    gram = pair.grams[0]
    for proposal in imp.proposals(torch.as_tensor(gram), sigma, epsilon):
        if proposal.bound == 0:
            continue
        found = imp.estimate(gram, proposal, sigma, epsilon, 2000, seed=seed)
        assert 0.0 <= found.largest <= proposal.bound * (1 + 1e-12)


def test_tail_sampler_matches_truncated_normal_far_in_the_tail():
    rng = np.random.default_rng(0)
    for cut in (-1.0, 2.0, 9.0, 30.0):
        uniform = torch.from_numpy(1.0 - rng.random(20_000))
        draws = imp._tail(uniform, torch.tensor(cut, dtype=torch.float64)).numpy()
        assert np.all(draws >= cut) and np.all(np.isfinite(draws))
        assert stats.kstest(draws, stats.truncnorm(cut, np.inf).cdf).pvalue > 1e-3


def test_conditioned_rows_have_the_gaussian_conditional_law():
    """U | U_i = v ~ N(v·g/g_i, G − g gᵀ/g_i), g = G[:, i]; and 1ᵀU = v likewise along G1."""
    gram = torch.as_tensor(_banded_gram().grams[0], dtype=torch.float64)
    factor = mc.gram_factor(gram)
    rows, value = 200_000, 1.7
    normals = torch.from_numpy(np.random.default_rng(1).standard_normal((rows, 4)))
    for direction in (
        torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64),
        torch.ones(4, dtype=torch.float64),
    ):
        spread = gram @ direction
        variance = float(direction @ spread)
        found = imp.conditioned(
            normals,
            factor,
            direction.expand(rows, 4),
            spread.expand(rows, 4),
            torch.full((rows,), value, dtype=torch.float64),
        ).numpy()
        assert np.allclose(found @ direction.numpy(), value)
        expected_cov = gram.numpy() - np.outer(spread, spread) / variance
        assert np.allclose(found.mean(axis=0), value * spread.numpy() / variance, atol=0.02)
        assert np.allclose(np.cov(found.T), expected_cov, atol=0.03)


def test_importance_needs_fewer_samples_when_the_bound_is_below_one():
    delta, threshold, failure = 1e-5, 0.75e-5, 1e-6 / 3
    plain = evr.samples_for(failure, delta, threshold)
    for bound in (0.5, 0.1, 1e-3, 2e-5):
        count = imp.samples_needed(bound, failure, delta, threshold)
        assert count <= min(plain, 1.001 * bound * plain + 1)
        if bound >= 0.1:
            assert count == pytest.approx(bound * plain, rel=0.05)
        assert evr.failure_bound(count, delta / bound, threshold / bound) <= failure
    # δ <= M <= target: proven without samples
    assert imp.samples_needed(delta, failure, delta, threshold) == 0


def test_accountant_picks_importance_sampling_only_where_it_is_cheaper():
    small = describe(sampler="balls-in-bins", noise_multiplier=1.0, batches_per_epoch=10, epochs=1)
    accountant = get_accountant("montecarlo", samples=1 << 16, failure_probability=1e-3)
    result = accountant.epsilon(small, 1e-3)
    details = result.details
    assert details["verification"] == "importance"
    assert details["verify_samples"] < details["verify_samples_plain"]
    assert details["importance_bound_remove"] < 1
    assert "importance-sampled" in result.assumptions[-1]
    pair = accountant.pair(small)
    # M >= 1 at small σ: plain is used
    assert accountant.importance_plan(pair, 0.3, 0.5, 1e-3) is None


def test_importance_refused_for_several_pieces():
    redrawn = describe(
        sampler="balls-in-bins-redrawn", noise_multiplier=1.0, batches_per_epoch=4, epochs=2
    )
    forced = get_accountant("montecarlo", samples=5000, verification="importance")
    with pytest.raises(UnsupportedMechanismError, match="one piece"):
        forced.importance_plan(forced.pair(redrawn), 1.0, 1.0, 1e-3)
    assert (
        get_accountant("montecarlo").importance_plan(forced.pair(redrawn), 1.0, 1.0, 1e-3) is None
    )

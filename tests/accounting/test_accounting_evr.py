"""EVR's sample count from a failure probability: the KL (Chernoff–Hoeffding) bound, checked."""

import math

import numpy as np
import pytest

from dpledger.accounting import describe, evr
from dpledger.accounting import montecarlo as mc
from dpledger.accounting.accountants.montecarlo import EVR_ATTEMPTS, MonteCarloAccountant
from dpledger.errors import ParamsError


def bernstein_bound(samples: int, delta: float, threshold: float) -> float:
    """Bernstein's bound for the same event (Var W <= E W): the looser one the KL bound replaces."""
    gap = delta - threshold
    return math.exp(-samples * gap**2 / (2 * delta + 2 * gap / 3))


@pytest.mark.parametrize("delta,ratio", [(1e-5, 0.5), (1e-3, 0.8), (0.05, 0.6)])
def test_kl_bound_is_never_weaker_than_bernstein(delta, ratio):
    threshold = ratio * delta
    for samples in (10**4, 10**6, 10**8):
        kl_bound = evr.failure_bound(samples, delta, threshold)
        assert kl_bound <= bernstein_bound(samples, delta, threshold)


def test_sample_count_is_the_fewest_meeting_the_failure_probability():
    delta, threshold, failure = 1e-5, 0.75e-5, 1e-6 / 3
    samples = evr.samples_for(failure, delta, threshold)
    assert (
        evr.failure_bound(samples, delta, threshold)
        <= failure
        < evr.failure_bound(samples - 1, delta, threshold)
    )
    assert 3e7 < samples < 6e7


def test_bound_holds_for_the_worst_case_bernoulli():
    """Bernoulli(δ) is the worst [0, 1] variable of mean δ: its pass frequency stays under the
    bound."""
    delta, threshold, samples, trials = 0.05, 0.04, 2000, 20000
    rng = np.random.default_rng(0)
    means = rng.binomial(samples, delta, size=trials) / samples
    bound = evr.failure_bound(samples, delta, threshold)
    assert np.mean(means <= threshold) <= bound
    assert np.mean(means <= threshold) >= bound / 20


def test_default_failure_probability_keeps_unconditional_delta_within_ten_percent():
    accountant = MonteCarloAccountant()
    assert accountant.failure_target(1e-5) == pytest.approx(1e-6)
    assert accountant.failure_target(1e-3) == pytest.approx(1e-6)
    threshold, fresh, _ = accountant.verification_plan(1e-5)
    assert EVR_ATTEMPTS * evr.failure_bound(fresh, 1e-5, threshold) <= 1e-6 * (1 + 1e-9)


def test_verification_reports_failure_probability_and_count():
    accountant = MonteCarloAccountant(
        samples=20_000, failure_probability=0.01, verification="plain"
    )
    description = describe(
        sampler="balls-in-bins-redrawn", noise_multiplier=1.0, batches_per_epoch=4, epochs=1
    )
    result = accountant.epsilon(description, 0.05)
    details = result.details
    assert details["mc_failure_probability"] <= 0.01
    assert details["verify_samples"] == evr.samples_for(
        0.01 / EVR_ATTEMPTS, 0.05, details["evr_threshold"]
    )
    assert details["unconditional_delta"] <= 0.05 + 0.01


def test_samples_do_not_depend_on_chunk_size():
    pair = mc.fixed_bins_pair(np.array([1.0, 0.5, 0.25, 0.1]), bins=4, steps=8)
    small = mc.estimate_delta(pair, 1.0, 0.5, 3 * mc.BLOCK + 17, seed=3, chunk=mc.BLOCK)
    large = mc.estimate_delta(pair, 1.0, 0.5, 3 * mc.BLOCK + 17, seed=3, chunk=8 * mc.BLOCK)
    # same samples; only the summation order differs
    assert small.delta == pytest.approx(large.delta, rel=1e-12)


def test_chunk_memory_is_bounded():
    wide = mc.redrawn_bins_pair(1000, 16_000)
    assert mc.chunk_rows(wide) * wide.bins * len(wide.grams) <= max(
        mc.MEMORY_VALUES, mc.BLOCK * 16_000
    )
    narrow = mc.redrawn_bins_pair(8, 16)
    assert mc.chunk_rows(narrow) * 8 * 2 <= mc.MEMORY_VALUES


def test_cuda_refused_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(
        ParamsError, match="device = 'cuda' is invalid: no CUDA device is available"
    ):
        MonteCarloAccountant(device="cuda")

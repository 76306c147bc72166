"""Monte Carlo balls-in-bins accountant: checked against exact Gaussians, a brute-force sampler and
PLD."""

import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from dpledger.accounting import calibrate_noise, describe, get_accountant
from dpledger.accounting import montecarlo as mc
from dpledger.accounting.evr import EvrVerification
from dpledger.accounting.mc_search import calibrate_sigma
from dpledger.accounting.pld import PldRun, gaussian_noise_for, pld_epsilon
from dpledger.mechanisms import banded_params, coefficients, dense_matrix
from helpers.oracles import gram_from_matrix, naive_losses


def _within(estimate: mc.DeltaEstimate, truth: float, spread: float = 4.0) -> bool:
    return abs(estimate.delta - truth) <= spread * estimate.stderr + 1e-12


def test_without_amplification_equals_composed_gaussian_pld():
    """b = 1: every step uses the example, so E epochs of C = I are E composed Gaussians
    (sensitivity 1)."""
    epochs, sigma, epsilon = 4, 2.0, 0.5
    pair = mc.fixed_bins_pair(np.ones(1), 1, epochs)
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_event.GaussianDpEvent(sigma), epochs)
    estimate = mc.estimate_delta(pair, sigma, epsilon, 200_000, seed=3)
    assert _within(estimate, accountant.get_delta(epsilon))


@pytest.mark.parametrize("mechanism,params", [("identity", {}), ("banded", banded_params(3))])
def test_fast_sampler_agrees_with_brute_force_n_dimensional_sampler(mechanism, params):
    bins, epochs, sigma = 6, 3, 0.9
    steps = bins * epochs
    matrix = dense_matrix(coefficients(mechanism, params, steps))
    modes = matrix.reshape(steps, epochs, bins).sum(axis=1)
    remove, add = naive_losses(modes, sigma, 100_000, seed=1)
    pair = mc.fixed_bins_pair(coefficients(mechanism, params, steps), bins, steps)
    for epsilon in (0.5, 1.5):
        brute = [np.clip(-np.expm1(epsilon - y), 0, None) for y in (remove, add)]
        fast = mc.estimate_delta(pair, sigma, epsilon, 100_000, seed=2)
        for value, mine in zip(brute, (fast.delta_remove, fast.delta_add)):
            spread = math.sqrt(value.var() / value.size + fast.stderr**2)
            assert abs(value.mean() - mine) <= 4 * spread + 1e-9


def test_gram_of_toeplitz_equals_gram_of_dense_matrix():
    values = coefficients("blt", {"buffer_decays": [0.8, 0.3], "output_scales": [0.2, 0.4]}, 20)
    pair = mc.fixed_bins_pair(values, 5, 20)
    np.testing.assert_allclose(pair.grams[0], gram_from_matrix(dense_matrix(values), 5), atol=1e-12)
    truncated = mc.fixed_bins_pair(values, 5, 13)
    np.testing.assert_allclose(
        truncated.grams[0], gram_from_matrix(dense_matrix(values, 13), 5), atol=1e-12
    )


def test_one_epoch_fixed_and_redrawn_bins_are_the_same_mechanism():
    accountant = get_accountant(
        "montecarlo", samples=20_000, verify_samples=20_000, evr_delta_ratio=0.5
    )
    fixed = describe(sampler="balls-in-bins", noise_multiplier=0.8, batches_per_epoch=10, epochs=1)
    redrawn = describe(
        sampler="balls-in-bins-redrawn", noise_multiplier=0.8, batches_per_epoch=10, epochs=1
    )
    assert accountant.epsilon_estimate(fixed, 1e-2) == pytest.approx(
        accountant.epsilon_estimate(redrawn, 1e-2)
    )


def test_fixed_bins_with_independent_noise_are_far_worse_than_poisson_and_say_so():
    """Issue 3's measurement: σ = 1, b = 100, E = 4 gives ε ≈ 5.5 with fixed bins vs 1.20 for
    Poisson."""
    accountant = get_accountant(
        "montecarlo", samples=1 << 16, verify_samples=1 << 16, evr_delta_ratio=0.9
    )
    fixed = describe(sampler="balls-in-bins", noise_multiplier=1.0, batches_per_epoch=100, epochs=4)
    estimate = accountant.epsilon_estimate(fixed, 1e-5)
    poisson = pld_epsilon(PldRun(1.0, "poisson", 1, 0.01, None, None, 400), 1e-5, 1e-3)
    assert poisson == pytest.approx(1.20, abs=0.02)
    assert 5.0 < estimate < 6.2
    verified = EvrVerification(
        samples=1 << 16,
        verification="plain",
        verify_samples=1 << 16,
        verify_samples_plain=1 << 16,
        evr_attempts=1,
        delta_estimate_verify=0.0,
        delta_interval_95=(0.0, 0.0),
        delta_remove=0.0,
        delta_add=0.0,
        evr_threshold=0.95e-5,
        delta_calibrated=0.9e-5,
        mc_failure_probability=0.5,
        unconditional_delta=1.0,
    )
    sentences = accountant.assumptions(fixed, 1e-5, verified)
    assert sentences[0].startswith("WARNING") and f"{poisson:.3g}" in sentences[0]


def test_redrawn_bins_track_poisson_for_independent_noise():
    accountant = get_accountant(
        "montecarlo", samples=1 << 16, verify_samples=1 << 16, evr_delta_ratio=0.9
    )
    redrawn = describe(
        sampler="balls-in-bins-redrawn", noise_multiplier=1.0, batches_per_epoch=100, epochs=4
    )
    assert accountant.epsilon_estimate(redrawn, 1e-5) == pytest.approx(1.2, abs=0.25)


def test_sigma_search_hits_delta_on_its_samples_and_is_the_smallest():
    pair = mc.fixed_bins_pair(coefficients("banded", banded_params(4), 40), 8, 40)
    upper = gaussian_noise_for(pair.max_sensitivity(), 1.0, 1e-3)
    search = calibrate_sigma(pair, 1.0, 1e-3, 50_000, seed=5, upper=upper)
    at_sigma = mc.estimate_delta(pair, search.noise_multiplier, 1.0, 50_000, seed=5)
    below = mc.estimate_delta(pair, search.noise_multiplier * 0.999, 1.0, 50_000, seed=5)
    assert at_sigma.delta <= 1e-3 < below.delta
    assert search.noise_multiplier < upper


@pytest.mark.parametrize("sampler", ["balls-in-bins", "balls-in-bins-redrawn"])
def test_monte_carlo_calibration_certifies_with_evr(sampler):
    accountant = get_accountant(
        "montecarlo", samples=50_000, verify_samples=200_000, evr_delta_ratio=0.5
    )
    description = describe(sampler=sampler, batches_per_epoch=10, epochs=3)
    calibration = calibrate_noise(accountant, description, 1.0, 1e-2)
    details = calibration.result.details
    assert details["delta_estimate_verify"] <= details["evr_threshold"] < 1e-2
    assert 0 < details["mc_failure_probability"] < 1e-6
    fresh = mc.estimate_delta(
        accountant.pair(description), calibration.noise_multiplier, 1.0, 200_000, seed=99
    )
    assert fresh.interval[0] <= 1e-2


def test_evr_failure_probability_shrinks_with_more_verification_samples():
    description = describe(
        sampler="balls-in-bins", noise_multiplier=1.0, batches_per_epoch=5, epochs=2
    )
    few = get_accountant("montecarlo", samples=5000, verify_samples=5000).epsilon(description, 0.05)
    many = get_accountant("montecarlo", samples=5000, verify_samples=50_000).epsilon(
        description, 0.05
    )
    assert many.details["mc_failure_probability"] < few.details["mc_failure_probability"]


@pytest.mark.parametrize("field,values", [("sigma", [0.6, 0.9, 1.4]), ("epochs", [1, 2, 4])])
def test_monte_carlo_epsilon_is_monotone(field, values):
    accountant = get_accountant("montecarlo", samples=40_000, verify_samples=40_000)
    estimates = []
    for value in values:
        sigma = value if field == "sigma" else 1.0
        epochs = value if field == "epochs" else 2
        description = describe(
            sampler="balls-in-bins",
            noise_multiplier=sigma,
            batches_per_epoch=8,
            epochs=epochs,
            mechanism="banded",
            mechanism_params=banded_params(2),
        )
        estimates.append(accountant.epsilon_estimate(description, 1e-3))
    ordered = estimates[::-1] if field == "sigma" else estimates
    assert all(a < b for a, b in zip(ordered, ordered[1:]))


@pytest.mark.parametrize("sampler", ["balls-in-bins", "balls-in-bins-redrawn"])
def test_a_run_stopped_before_every_bin_is_used_keeps_its_noise(sampler):
    """Steps before the first epoch ends leave bins unused (G singular and diagonal). One step of b
    bins is the Poisson-subsampled Gaussian at q = 1/b (dp-accounting's PLD); three steps are
    checked against the brute-force sampler of the 3 × b mode matrix."""
    bins, sigma, epsilon = 10, 1.0, 0.8
    description = describe(
        sampler=sampler, noise_multiplier=sigma, batches_per_epoch=bins, epochs=2
    )
    pair = get_accountant("montecarlo").pair(description.with_steps(1))
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_event.PoissonSampledDpEvent(1 / bins, dp_event.GaussianDpEvent(sigma)))
    assert _within(
        mc.estimate_delta(pair, sigma, epsilon, 200_000, seed=5), accountant.get_delta(epsilon)
    )
    pair = get_accountant("montecarlo").pair(description.with_steps(3))
    fast = mc.estimate_delta(pair, sigma, epsilon, 200_000, seed=6)
    remove, add = naive_losses(np.eye(3, bins), sigma, 200_000, seed=7)
    for losses, mine in zip((remove, add), (fast.delta_remove, fast.delta_add)):
        brute = np.clip(-np.expm1(epsilon - losses), 0, None)
        assert (
            abs(brute.mean() - mine)
            <= 4 * math.sqrt(brute.var() / brute.size + fast.stderr**2) + 1e-9
        )


def test_evr_retries_add_their_failure_probability_to_delta():
    """The failure bound covers every attempt (union over EVR_ATTEMPTS), so the unconditional δ is δ
    + β whether the first attempt passed or a retry did."""
    accountant = get_accountant("montecarlo", samples=20_000, verify_samples=20_000)
    description = describe(
        sampler="balls-in-bins", noise_multiplier=1.0, batches_per_epoch=5, epochs=2
    )
    pair, delta = accountant.pair(description), 0.05
    epsilon = accountant.epsilon_estimate(description, delta)
    _, _, once = accountant.verify(pair, 1.0, 1.2 * epsilon, delta, raise_sigma=False)
    assert once.evr_attempts == 1
    assert once.unconditional_delta == pytest.approx(delta + once.mc_failure_probability)
    _, certified, retried = accountant.verify(pair, 1.0, 0.8 * epsilon, delta, raise_sigma=False)
    assert retried.evr_attempts > 1 and certified > 0.8 * epsilon
    assert retried.mc_failure_probability == once.mc_failure_probability
    assert retried.unconditional_delta == pytest.approx(
        min(1.0, delta + retried.mc_failure_probability)
    )


def test_samples_are_philox_normals_keyed_by_block_with_far_tails():
    """torch's float32 randn caps a pair's Box–Muller radius at √(2·24·ln 2) = 5.77 (24-bit
    uniforms), a total-variation gap of 2⁻²⁴ a pair that biases δ̂; the samples are the engine's
    Philox normals (radius to 9.5σ, checked in tests/test_philox_normal.py), keyed by (seed, block,
    piece), the bins SFC64's."""
    from scipy import stats

    from dpledger.philox_normal import fill_standard_normal

    pair = mc.redrawn_bins_pair(bins=4, steps=12)
    pieces = list(mc.draws(pair, 100, seed=5, chunk=64))
    for index, draw in enumerate(pieces[0]):
        words = np.random.SeedSequence((5, 0, index)).generate_state(3, np.uint32)
        rng = np.random.Generator(np.random.SFC64(int(words[0])))
        np.testing.assert_array_equal(draw.bins.numpy(), rng.integers(0, 4, 100))
        expected = np.empty(400, np.float32)
        fill_standard_normal(expected, (int(words[1]), int(words[2])), step=0)
        np.testing.assert_array_equal(draw.normals.numpy(), expected.reshape(100, 4))
    # one draw per redrawn epoch
    assert sum(p[0].bins.shape[0] for p in pieces) == 100 and len(pieces[0]) == 3
    assert not torch.equal(pieces[0][0].normals, pieces[0][1].normals)
    many = torch.cat(
        [
            d.normals.reshape(-1)
            for d in mc.draw_chunk(pair, 3 * mc.BLOCK, 9, (0, 3), torch.device("cpu"))
        ]
    )
    assert stats.kstest(many.double().numpy(), "norm").pvalue > 1e-4


def _random_pair(seed: int, bins: int, epochs: int) -> tuple[np.ndarray, np.ndarray]:
    """A random non-negative lower-triangular C (n = bins·epochs): its modes M (n × b) and G =
    MᵀM."""
    rng = np.random.default_rng(seed)
    steps = bins * epochs
    matrix = np.tril(
        rng.exponential(size=(steps, steps)) * (rng.random((steps, steps)) < 0.3)
    ) + np.eye(steps)
    modes = matrix.reshape(steps, epochs, bins).sum(axis=1)
    np.testing.assert_allclose(modes.T @ modes, gram_from_matrix(matrix, bins), rtol=1e-12)
    return modes, modes.T @ modes


@pytest.mark.parametrize(
    "seed,bins,epochs,sigma",
    # 0.05: G/σ² > KERNEL_LIMIT, plain LSE
    [
        (0, 5, 3, 1.0),
        (1, 8, 2, 4.0),
        (2, 6, 4, 0.25),
        (3, 7, 1, 0.05),
    ],
)
def test_one_exp_screen_matches_n_dimensional_losses_within_its_margin(seed, bins, epochs, sigma):
    """The float32 screen's losses (one exp per term) against log P(x)/Q(x) computed from x ∈ R^n
    directly, and against the float64 ``losses`` on the same rounded draws: off by far less than the
    stated margin."""
    from scipy.special import logsumexp

    modes, gram = _random_pair(seed, bins, epochs)
    rng = np.random.default_rng(seed + 10)
    rows = 2000
    noise = rng.standard_normal((rows, modes.shape[0]))
    chosen = rng.integers(0, bins, rows)
    factor = np.linalg.cholesky(gram)
    # U = W Fᵀ = Mᵀ Z, rounded
    normals = np.linalg.solve(factor, (noise @ modes).T).T.astype(np.float32)
    pair = mc.DominatingPair((gram,))
    screen = mc.Screen(mc.PreparedPair(pair), sigma)
    draw = mc.Draw(torch.from_numpy(chosen), torch.from_numpy(normals))
    remove, add, margin = (t.numpy() for t in screen([draw]))

    half_norms = 0.5 * np.sum(modes**2, axis=0)

    def log_ratio(points: np.ndarray) -> np.ndarray:
        return logsumexp((points @ modes - half_norms) / sigma**2, axis=1) - math.log(bins)

    exact_remove, exact_add = (
        t.numpy()
        for t in mc.losses(
            torch.from_numpy(gram),
            torch.from_numpy(chosen),
            torch.from_numpy(normals).double() @ torch.from_numpy(factor).T,
            sigma,
        )
    )
    assert np.all(np.abs(remove - exact_remove) <= margin / 40) and np.all(
        np.abs(add - exact_add) <= margin / 40
    )
    direct_remove, direct_add = (
        log_ratio(modes.T[chosen] + sigma * noise),
        -log_ratio(sigma * noise),
    )
    assert np.all(np.abs(remove - direct_remove) <= margin) and np.all(
        np.abs(add - direct_add) <= margin
    )
    assert np.ptp(direct_remove) > 1.0  # the losses spread over values the margin could not hide


@pytest.mark.parametrize("sigma", [1.3, 0.2])  # 0.2: G/σ² = 100 > KERNEL_LIMIT, plain LSE
def test_one_exp_screen_on_diagonal_gram_uses_the_own_bin_shortcut(sigma):
    pair = mc.fixed_bins_pair(np.ones(1), 16, 64)  # C = I, 4 epochs: G = 4·I
    prepared = mc.PreparedPair(pair)
    assert prepared.diagonal == [True]
    chunk = next(mc.draws(pair, 3000, seed=2))
    remove, add, margin = mc.Screen(prepared, sigma)(chunk)
    exact_remove, exact_add = prepared.chunk_losses(chunk, sigma, torch.float64)
    assert torch.all((remove - exact_remove).abs() <= margin / 40)
    assert torch.all((add - exact_add).abs() <= margin / 40)


def _unscreened_delta(
    pair: mc.DominatingPair, sigma: float, epsilon: float, samples: int, seed: int
) -> np.ndarray:
    """δ̂ per direction with every sample's float64 losses (no screen): the reference the screen
    must equal."""
    prepared = mc.PreparedPair(pair)
    sums = np.zeros(2)
    for chunk in mc.draws(pair, samples, seed):
        for index, loss in enumerate(prepared.chunk_losses(chunk, sigma, torch.float64)):
            sums[index] += float(mc.hockey_stick(loss, epsilon).sum())
    return sums / samples


@pytest.mark.parametrize(
    "pair,sigma",
    [
        (mc.fixed_bins_pair(coefficients("banded", banded_params(4), 48), 12, 48), 2.0),
        (mc.fixed_bins_pair(np.ones(1), 12, 48), 1.2),
        (mc.redrawn_bins_pair(12, 30), 0.8),
    ],
)
def test_screened_estimate_is_exact_and_independent_of_chunks_and_workers(pair, sigma):
    samples = 5 * mc.BLOCK + 123
    reference = _unscreened_delta(pair, sigma, 1.0, samples, seed=4)
    # samples past the threshold exist, so the screen has something to keep
    assert reference.max() > 1e-4
    results = [
        mc.estimate_delta(pair, sigma, 1.0, samples, seed=4, chunk=chunk, workers=workers)
        for chunk in (mc.BLOCK, 2 * mc.BLOCK, 8 * mc.BLOCK)
        for workers in (1, 2, 3)
    ]
    for result in results:
        np.testing.assert_allclose([result.delta_remove, result.delta_add], reference, rtol=1e-12)
        assert result.stderr == pytest.approx(results[0].stderr, rel=1e-9)


def test_mc_verification_key_reaches_the_accountant_and_bad_values_get_one_line():
    import copy
    from pathlib import Path
    from typing import get_args

    import yaml

    from dpledger.accounting.accountants.montecarlo import VERIFICATIONS
    from dpledger.errors import ParamsError
    from dpledger.params import parse_params
    from dpledger.params.calibrate import CalibrateParams
    from dpledger.pipeline.calibrate import accountant_settings

    assert get_args(CalibrateParams.model_fields["mc_verification"].annotation) == VERIFICATIONS
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    raw["calibrate"]["mc_verification"] = "plain"
    accountant = get_accountant("montecarlo", **accountant_settings(parse_params(raw)))
    assert accountant.verification == "plain"
    bad = copy.deepcopy(raw)
    bad["calibrate"]["mc_verification"] = "fast"
    with pytest.raises(ParamsError) as excinfo:
        parse_params(bad)
    message = str(excinfo.value)
    assert (
        message.startswith("params: calibrate.mc_verification = 'fast' is invalid")
        and "\n" not in message
    )
    assert "'auto', 'plain' or 'importance'" in message


def test_the_float32_screen_and_the_bounds_never_run_under_the_callers_tf32(monkeypatch):
    """The screen's margin assumes float32 products (2⁻²⁴); TF32 (10 mantissa bits) would break it
    on a GPU. A caller with TF32 on: every product of the screen and of the σ-interval bounds runs
    with it off, and the caller's setting comes back (issue 30)."""
    from dpledger.precision import tf32_enabled

    seen = []
    original = mc.correlate

    def spy(*args, **kwargs):
        seen.append(tf32_enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(mc, "correlate", spy)
    pair = mc.fixed_bins_pair(coefficients("banded", banded_params(4), 48), 12, 48)
    prepared = mc.PreparedPair(pair)
    chunk = next(mc.draws(pair, 500, seed=1))
    leaves = torch.backends.cuda.matmul, torch.backends.mkldnn.matmul
    saved = [leaf.fp32_precision for leaf in leaves]
    try:
        for leaf in leaves:
            leaf.fp32_precision = "tf32"
        mc.Screen(prepared, 1.5)(chunk)
        prepared.chunk_loss_bounds(chunk, 1.0, 2.0)
        assert tf32_enabled() and torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        for leaf, value in zip(leaves, saved):
            leaf.fp32_precision = value
    assert len(seen) == 2 and not any(seen)


@pytest.mark.parametrize(
    "free,values",
    [
        (80 << 30, mc.CUDA_MAX_VALUES),  # an H100: capped
        (2 << 30, (2 << 30) // 4 // mc.CUDA_BYTES_PER_VALUE),  # a quarter of what is free
        (1 << 20, mc.MEMORY_VALUES),  # never below the CPU's chunks
    ],
)
def test_cuda_chunks_grow_with_free_memory_at_the_same_estimate(monkeypatch, free, values):
    """Issue 30: 4M-value chunks left a GPU idle between host syncs; CUDA now takes up to a quarter
    of its free memory. The estimate is the same, bit for bit, at any chunk size (blocks are seeded
    alone): checked on the CPU with the chunk size CUDA would take."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 << 30))
    pair = mc.fixed_bins_pair(coefficients("banded", banded_params(4), 48), 12, 48)
    cuda = torch.device("cuda")
    assert mc.chunk_values(cuda) == values
    assert mc.chunk_values(torch.device("cpu")) == mc.MEMORY_VALUES
    rows = mc.chunk_rows(pair, cuda)
    assert rows % mc.BLOCK == 0
    assert rows * pair.bins <= values < (rows + mc.BLOCK) * pair.bins
    samples = 5 * mc.BLOCK + 123
    assert mc.block_ranges(samples, None, pair, cuda) == [(0, 6)]
    whole = mc.estimate_delta(pair, 2.0, 1.0, samples, seed=4, chunk=rows, workers=1)
    blockwise = mc.estimate_delta(pair, 2.0, 1.0, samples, seed=4, chunk=mc.BLOCK, workers=1)
    assert (whole.delta_remove, whole.delta_add) == (blockwise.delta_remove, blockwise.delta_add)
    assert whole.stderr == pytest.approx(blockwise.stderr, rel=1e-12)

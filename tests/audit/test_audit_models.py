"""Batched-Gaussian models: exact likelihood ratios against naive densities, and placement against
the real samplers."""

import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

from dpledger.accounting.pld import PldRun, pld_epsilon
from dpledger.audit.backend import NumpyBackend, TorchBackend, cuda_available, select_backend
from dpledger.audit.bgm import BgmAudit, audit_bgm
from dpledger.audit.models import PatternModel, SlotModel, StepMixtureModel
from dpledger.audit.samplers import audited_sampler, record_memberships
from dpledger.audit.simulate import simulate_scores

NUMPY = NumpyBackend()


def naive_slot_score(x, weights, sigma, present, absent, same_slot):
    """log p_D(x)/p_D'(x) for x of shape (epochs, slots) by explicit Gaussian densities."""

    def log_density(shift):
        # (epochs, slot where the record is)
        per_slot = np.array(
            [
                [
                    stats.norm.logpdf(
                        x[e], loc=shift * (np.arange(x.shape[1]) == t), scale=sigma
                    ).sum()
                    for t in range(x.shape[1])
                ]
                for e in range(x.shape[0])
            ]
        )
        log_w = np.log(weights)
        if same_slot:
            return logsumexp(log_w + per_slot.sum(axis=0))
        return sum(logsumexp(log_w + per_slot[e]) for e in range(x.shape[0]))

    return log_density(present) - log_density(absent)


@pytest.mark.parametrize(
    "weights,present,absent,same_slot",
    [
        ((0.25, 0.25, 0.25, 0.25), 2.0, 1.0, False),
        ((0.5, 0.3, 0.2, 0.0), 2.0, 1.0, False),
        ((0.25, 0.25, 0.25, 0.25), 1.0, 0.0, True),
        ((0.25, 0.25, 0.25, 0.25), 6.0, 5.0, False),
    ],
)
def test_slot_model_score_is_the_exact_likelihood_ratio(weights, present, absent, same_slot):
    sigma, epochs = 0.8, 3
    model = SlotModel(sigma, epochs, weights, present, absent, same_slot_every_epoch=same_slot)
    rng = np.random.default_rng(0)
    support = np.asarray(weights) > 0
    for _ in range(3):
        x = rng.normal(0.0, sigma, (epochs, len(weights))) + (
            present * (rng.random((epochs, len(weights))) < 0.3)
        )
        naive = naive_slot_score(
            x[:, support], np.asarray(weights)[support], sigma, present, absent, same_slot
        )
        rows = x[:, support].sum(axis=0, keepdims=True) if same_slot else x[:, support]
        fast = model.score(NUMPY, rows.astype(np.float32).copy())
        assert fast[0] == pytest.approx(naive, abs=2e-3)


def test_step_mixture_score_is_the_exact_likelihood_ratio():
    sigma, q = 0.7, 0.1
    model = StepMixtureModel(sigma, 5, q, 2.0, 1.0)
    x = np.random.default_rng(1).normal(0.5, 1.0, (2, 5))

    def mix(v, shift):
        return np.log(
            (1 - q) * stats.norm.pdf(v, 0, sigma) + q * stats.norm.pdf(v, shift, sigma)
        ).sum(axis=1)

    assert np.allclose(
        model.score(NUMPY, x.astype(np.float32)), mix(x, 2.0) - mix(x, 1.0), atol=1e-4
    )


def test_pattern_model_score_is_the_mixture_over_patterns():
    patterns = np.array([[1, 0, 0], [0, 1, 1], [0, 0, 2]], dtype=float)
    model = PatternModel(1.3, patterns, lambda rng, n: patterns[rng.integers(0, 3, n)], 1.0, 0.0)
    x = np.random.default_rng(2).normal(0, 1, (4, 3))
    naive = logsumexp(
        [
            stats.norm.logpdf(x, p, 1.3).sum(axis=1) - stats.norm.logpdf(x, 0, 1.3).sum(axis=1)
            for p in patterns
        ],
        axis=0,
    ) - np.log(3)
    assert np.allclose(model.score(NUMPY, x.astype(np.float32)), naive, atol=1e-4)


def slot_frequencies(sampler, options, n, batch_size, epochs, runs):
    counts = np.zeros(epochs * -(-n // batch_size))
    for seed in range(runs):
        counts += record_memberships(
            sampler,
            dataset_size=n,
            batch_size=batch_size,
            epochs=epochs,
            options=options,
            seed=seed,
        )
    return counts / runs


@pytest.mark.parametrize(
    "sampler,options",
    [
        ("partial-shuffle", {"buffer_size": 10}),
        ("shuffle", {}),
    ],
)
def test_slot_weights_match_where_the_real_sampler_puts_the_record(sampler, options):
    n, batch_size = 22, 4  # a partial last batch: weights ∝ batch size
    audited = audited_sampler(
        sampler,
        dataset_size=n,
        batch_size=batch_size,
        epochs=1,
        noise_multiplier=1.0,
        options=options,
    )
    observed = slot_frequencies(sampler, options, n, batch_size, 1, 3000)
    assert np.allclose(observed, audited.model.slot_weights, atol=0.03)


def test_samplers_without_closed_form_run_the_sampler():
    audited = audited_sampler(
        "balls-in-bins",
        dataset_size=40,
        batch_size=8,
        epochs=2,
        noise_multiplier=1.0,
        options={"pad_truncate": True},
    )
    assert audited.simulated_by_sampler
    assert audited.model.score_patterns.shape[1] == 10


def test_poisson_audit_stays_below_its_pld_epsilon_and_shuffle_exceeds_it():
    common = dict(
        dataset_size=100,
        batch_size=1,
        epochs=1,
        noise_multiplier=1.0,
        observations=100_000,
        delta=1e-5,
        progress=False,
    )
    poisson, _ = audit_bgm(BgmAudit("poisson", **common))
    shuffle, _ = audit_bgm(BgmAudit("shuffle", **common))
    claim = pld_epsilon(PldRun(1.0, "poisson", 1, 0.01, 100, 1, 100), 1e-5)
    assert poisson.claim.epsilon == pytest.approx(claim)
    assert poisson.estimate.epsilon < claim and poisson.judgement.verdict != "contradicted"
    assert shuffle.estimate.epsilon > claim and shuffle.judgement.verdict == "contradicted"


def test_simulation_is_reproducible_and_independent_of_threads():
    model = SlotModel(1.0, 2, (1.0,) * 10, 2.0, 1.0)
    one = simulate_scores(
        model, 5000, seed=3, backend=NUMPY, workers=1, chunk_games=1000, progress=False
    )
    two = simulate_scores(
        model, 5000, seed=3, backend=NUMPY, workers=2, chunk_games=1000, progress=False
    )
    assert np.array_equal(one.present, two.present) and np.array_equal(one.absent, two.absent)


def test_torch_backend_scores_equal_numpy_scores():
    import torch

    model = SlotModel(0.9, 2, (0.5, 0.25, 0.25), 2.0, 1.0)
    x = np.random.default_rng(4).normal(0, 1, (8, 3)).astype(np.float32)
    torch_scores = model.score(TorchBackend("cpu"), torch.as_tensor(x.copy())).numpy()
    assert np.allclose(torch_scores, model.score(NUMPY, x.copy()), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="no CUDA device")
def test_gpu_backend_runs_the_shuffle_audit():
    backend = select_backend("auto")
    assert backend.device == "cuda"
    scores = simulate_scores(
        SlotModel(1.0, 1, (1.0,) * 100, 2.0, 1.0), 100_000, seed=0, backend=backend, progress=False
    )
    assert np.all(np.isfinite(scores.present))


def test_default_poisson_claim_uses_the_samplers_own_sample_rate():
    """A correct Poisson mechanism at q = 0.05 ≠ B/n must be judged against the ε of q = 0.05, not
    of B/n."""
    common = dict(
        dataset_size=100,
        batch_size=1,
        epochs=1,
        noise_multiplier=1.0,
        observations=40_000,
        delta=1e-5,
        progress=False,
        backend="numpy",
    )
    result, _ = audit_bgm(BgmAudit("poisson", options={"sample_rate": 0.05}, **common))
    assert result.claim.epsilon == pytest.approx(
        pld_epsilon(PldRun(1.0, "poisson", 1, 0.05, 100, 1, 100), 1e-5)
    )
    # the B/n claim would be "contradicted"
    assert result.estimate.epsilon > pld_epsilon(PldRun(1.0, "poisson", 1, 0.01, 100, 1, 100), 1e-5)
    assert result.judgement.verdict != "contradicted" and "0.05" in result.claim.basis

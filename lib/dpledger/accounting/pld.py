"""Privacy-loss-distribution (PLD) and RDP accounting through dp-accounting.

PLDs are built from ``dp_accounting.pld.privacy_loss_distribution`` primitives with
``pessimistic_estimate=True`` and ``use_connect_dots=True`` (the connect-the-dots discretization, an
upper bound on the true hockey-stick curve), exactly as ``PLDAccountant`` does for the same events,
so ``epsilon`` equals ``PLDAccountant(value_discretization_interval=...)`` on them. Both adjacency
directions (add and remove) are included and the worse one is reported.

- Poisson, one example: the Poisson-subsampled Gaussian (``PoissonSampledDpEvent``).
- Poisson, a group of k: the mixture of Gaussians with sensitivities 0..k and Binomial(k, q) weights
  (001 Thm 3.1; ``MixtureOfGaussiansDpEvent``).
- Fixed batch size B (a fresh uniform B-subset each step): sensitivities 2j with j ~ Hypergeometric
  (population N = dataset size, k group members, B draws) (001 Thm 3.3; N bounds the dataset that
  contains the group, as in jax_privacy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats

from dpledger.accounting.bounds import DISCRETIZATION
from dpledger.accounting.description import MechanismDescription


@dataclass(frozen=True)
class PldRun:
    """A run as the PLD accountant sees it: one step's subsampled Gaussian, composed ``steps``
    times.

    σ is the noise std over the clip norm; ``group_size`` k adjacent examples; ``dataset_size`` and
    ``batch_size`` matter only for fixed-size sampling (the hypergeometric weights). Frozen, hence a
    cache key for :func:`composed_pld`.
    """

    noise_multiplier: float
    sampler: str
    group_size: int
    sample_rate: float
    dataset_size: int | None
    batch_size: int | None
    steps: int

    @classmethod
    def of(cls, description: MechanismDescription, group_size: int | None = None) -> PldRun:
        """The run of a ``MechanismDescription``, for groups of ``group_size`` (default: the
        description's)."""
        d = description
        k = d.group_size if group_size is None else group_size
        return cls(
            d.noise_multiplier, d.sampler, k, d.sample_rate, d.dataset_size, d.batch_size, d.steps
        )


def mog_sensitivities(run: PldRun) -> tuple[list[float], list[float]]:
    """The scalar mixture-of-Gaussians (sensitivities, probabilities) dominating one step (001
    §3.2–3.3)."""
    counts = np.arange(run.group_size + 1)
    if run.sampler == "poisson":
        return counts.astype(float).tolist(), stats.binom.pmf(
            counts, run.group_size, run.sample_rate
        ).tolist()
    if run.sampler == "fixed":
        probs = stats.hypergeom(M=run.dataset_size, n=run.group_size, N=run.batch_size).pmf(counts)
        return (2.0 * counts).tolist(), probs.tolist()
    raise ValueError(f"no mixture-of-Gaussians reduction for sampler {run.sampler!r}")


def mog_event(run: PldRun) -> dp_event.MixtureOfGaussiansDpEvent:
    """The dp-accounting event of one step: std σ (clip norm 1), random sensitivity (001 Def.
    2.8)."""
    sens, probs = mog_sensitivities(run)
    keep = [i for i, p in enumerate(probs) if p > 0.0]
    return dp_event.MixtureOfGaussiansDpEvent(
        run.noise_multiplier, [sens[i] for i in keep], [probs[i] for i in keep]
    )


@lru_cache(maxsize=8)
def composed_pld(run: PldRun, discretization: float):
    """The PLD of ``run.steps`` self-compositions of one step (cached: calibration re-asks the same
    σ)."""
    upper_bound = {
        "pessimistic_estimate": True,
        "use_connect_dots": True,
        "value_discretization_interval": discretization,
    }
    if run.group_size == 1 and run.sampler in ("poisson", "fixed"):
        # Fixed batch, k = 1: the MoG {0: 1 − B/N, 2: B/N} with std σ is the subsampled Gaussian
        # with std σ/2 (sensitivity 2 at σ is sensitivity 1 at σ/2); the Gaussian PLD builds much
        # faster.
        scale = 1.0 if run.sampler == "poisson" else 2.0
        single = pld_lib.from_gaussian_mechanism(
            standard_deviation=run.noise_multiplier / scale,
            sampling_prob=run.sample_rate,
            **upper_bound,
        )
    else:
        event = mog_event(run)
        single = pld_lib.from_mixture_gaussian_mechanism(
            standard_deviation=event.standard_deviation,
            sensitivities=event.sensitivities,
            sampling_probs=event.sampling_probs,
            **upper_bound,
        )
    return single.self_compose(run.steps)


def pld_epsilon(run: PldRun, delta: float, discretization: float = DISCRETIZATION) -> float:
    """ε(δ) of the run (∞ for σ = 0)."""
    if run.noise_multiplier == 0:
        return math.inf
    return float(composed_pld(run, discretization).get_epsilon_for_delta(delta))


def pld_delta(run: PldRun, epsilon: float, discretization: float = DISCRETIZATION) -> float:
    """δ(ε) of the run (1 for σ = 0)."""
    if run.noise_multiplier == 0:
        return 1.0
    return float(composed_pld(run, discretization).get_delta_for_epsilon(epsilon))


def _rdp_accountant(noise_multiplier: float, sample_rate: float, steps: int):
    accountant = rdp_privacy_accountant.RdpAccountant()
    event = dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier))
    accountant.compose(dp_event.SelfComposedDpEvent(event, steps))
    return accountant


def rdp_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε(δ) of the Poisson-subsampled Gaussian by Rényi DP (a looser cross-check of the PLD)."""
    if noise_multiplier == 0:
        return math.inf
    return float(_rdp_accountant(noise_multiplier, sample_rate, steps).get_epsilon(delta))


def rdp_delta(noise_multiplier: float, sample_rate: float, steps: int, epsilon: float) -> float:
    """δ(ε) of the Poisson-subsampled Gaussian by Rényi DP."""
    if noise_multiplier == 0:
        return 1.0
    return float(_rdp_accountant(noise_multiplier, sample_rate, steps).get_delta(epsilon))


def gaussian_delta(sensitivity_over_sigma: float, epsilon: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism with sensitivity/σ = μ (Balle & Wang 2018, Thm 8)."""
    mu = sensitivity_over_sigma
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    first = stats.norm.cdf(mu / 2 - epsilon / mu)
    second = math.exp(epsilon + stats.norm.logcdf(-mu / 2 - epsilon / mu)) if epsilon < 700 else 0.0
    return float(max(first - second, 0.0))


def gaussian_noise_for(sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ with the Gaussian mechanism of this sensitivity (ε, δ)-DP, by bisection on the
    exact δ."""
    low, high = 1e-3, 1.0
    while gaussian_delta(sensitivity / high, epsilon) > delta:
        low, high = high, 2 * high
    for _ in range(100):
        mid = 0.5 * (low + high)
        low, high = (
            (mid, high) if gaussian_delta(sensitivity / mid, epsilon) > delta else (low, mid)
        )
    return high

"""How many fresh samples Estimate-Verify-Release needs for a stated failure probability.

The check: release (σ, ε) only if the mean of m fresh samples of W = (1 − e^{ε−Y})_+ ∈ [0, 1] is at
most a threshold τ < δ. It fails (passes a pair whose true δ exceeds the target) with probability at
most

    P(mean <= τ | E W = μ >= δ) <= exp(−m · kl(τ ‖ μ)) <= exp(−m · kl(τ ‖ δ))

by the Chernoff–Hoeffding bound for [0, 1]-valued variables (Hoeffding 1963, Thm 1 in its
relative-entropy form: a [0, 1] variable's moment generating function is at most that of a Bernoulli
with the same mean), with kl(a ‖ b) = a ln(a/b) + (1 − a) ln((1 − a)/(1 − b)) the Bernoulli relative
entropy, increasing in b >= a (so μ = δ is the worst case). It is never weaker than Bernstein's
exp(−m t²/(2δ + 2t/3)), t = δ − τ (tests/accounting/test_accounting_evr.py checks both directions
numerically).
The sample count then follows from the failure probability β: m = ceil(ln(1/β) / kl(τ ‖ δ)).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


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


FAILURE_BOUND = "Chernoff-Hoeffding (KL) for [0, 1] variables, union over EVR attempts"


@dataclass(frozen=True)
class ImportanceDraws:
    """What importance-sampled verification used per direction: the weight bound M and the draws."""

    bound_remove: float
    bound_add: float
    samples_remove: int
    samples_add: int


@dataclass(frozen=True)
class SigmaSearchSummary:
    """What the σ search on common random numbers found before verification (004 Alg. 2)."""

    sigma_calibrated: float
    survivors: int
    search_passes: int
    delta_hat_calibration: float


@dataclass(frozen=True)
class EvrVerification:
    """The outcome of Estimate-Verify-Release: how the claim was checked on fresh samples and the
    failure probability it carries (a typed record; :meth:`to_details` is its JSON form in the
    accountant's result).

    ``samples``: the estimation samples; ``verify_samples``: fresh draws of the passing attempt in
    all (``verify_samples_plain``: what plain sampling would have needed); ``evr_attempts``: the
    attempt that passed; ``delta_estimate_verify`` (with its 95 % interval and per direction): δ̂ on
    the fresh draws, at most ``evr_threshold`` τ; ``delta_calibrated``: δ' of the estimate;
    ``mc_failure_probability``: β over all attempts, so the claim is unconditionally
    (ε, ``unconditional_delta``)-DP."""

    samples: int
    verification: str
    verify_samples: int
    verify_samples_plain: int
    evr_attempts: int
    delta_estimate_verify: float
    delta_interval_95: tuple[float, float]
    delta_remove: float
    delta_add: float
    evr_threshold: float
    delta_calibrated: float
    mc_failure_probability: float
    unconditional_delta: float
    importance: ImportanceDraws | None = None
    search: SigmaSearchSummary | None = None

    def to_details(self) -> dict[str, Any]:
        """The flat JSON details the calibration record and ``--json`` carry (keys as before)."""
        details: dict[str, Any] = {
            "samples": self.samples,
            "verification": self.verification,
            "verify_samples": self.verify_samples,
            "verify_samples_plain": self.verify_samples_plain,
            "failure_bound": FAILURE_BOUND,
            "evr_attempts": self.evr_attempts,
            "delta_estimate_verify": self.delta_estimate_verify,
            "delta_interval_95": list(self.delta_interval_95),
            "delta_remove": self.delta_remove,
            "delta_add": self.delta_add,
            "evr_threshold": self.evr_threshold,
            "delta_calibrated": self.delta_calibrated,
            "mc_failure_probability": self.mc_failure_probability,
            "unconditional_delta": self.unconditional_delta,
        }
        if self.importance is not None:
            details.update(
                {
                    "importance_bound_remove": self.importance.bound_remove,
                    "importance_bound_add": self.importance.bound_add,
                    "verify_samples_remove": self.importance.samples_remove,
                    "verify_samples_add": self.importance.samples_add,
                }
            )
        if self.search is not None:
            details.update(asdict(self.search))
        return details

"""The Monte Carlo accountant: balls-in-bins with any non-negative correlation matrix C (004), ε
estimated on seeded samples and certified by Estimate-Verify-Release on fresh ones.

Covers balls-in-bins (bins fixed across epochs, any C >= 0; bins redrawn every epoch, C = I),
example-level only. ``auto`` picks it where nothing deterministic covers the run (correlated noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from dpledger import validation
from dpledger.accounting import evr, importance
from dpledger.accounting import montecarlo as mc
from dpledger.accounting.accountants.base import base_assumptions, outside, require_support
from dpledger.accounting.bounds import MIN_MC_SAMPLES
from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.mc_search import calibrate_sigma
from dpledger.accounting.pld import PldRun, gaussian_noise_for, pld_epsilon
from dpledger.accounting.record import AccountantResult
from dpledger.accounting.search import Calibration
from dpledger.devices import resolve_device
from dpledger.errors import DpledgerError, ParamsError, UnsupportedMechanismError
from dpledger.mechanisms import coefficients

EVR_ATTEMPTS = 3
VERIFICATIONS = ("auto", "plain", "importance")
FAILURE_CAP = 1e-6


@dataclass(frozen=True)
class MonteCarloAccountant:
    """Monte Carlo accounting of balls-in-bins (004) with Estimate-Verify-Release.

    ε is estimated (or σ calibrated) at δ' = evr_delta_ratio·δ on ``samples`` samples; then fresh
    samples must give δ̂ <= τ, the midpoint of δ' and δ. The number of fresh samples follows from
    the failure probability β (default min(δ/10, 1e-6)): each attempt gets β/EVR_ATTEMPTS and the
    sample count of :func:`evr.samples_for` (Chernoff–Hoeffding KL bound; ``verify_samples``
    overrides it, and β then follows from the count). A failed check raises σ (or ε) by 5% and
    checks again on new fresh samples, at most EVR_ATTEMPTS times, so the release is (ε, δ)-DP
    except with probability β (union bound), and unconditionally (ε, δ + β)-DP (004 Thm 2.1): at
    most 1.1·δ with the default β.

    ``verification``: ``plain`` samples the pair itself; ``importance`` samples the bounded-weight
    proposals of :mod:`importance` (one piece only: bins fixed across epochs), each direction
    checked on its own fresh draws with the KL bound applied to f·w/M ∈ [0, 1], threshold τ/M (same
    β per direction); ``auto`` picks importance sampling per attempt where it needs fewer samples in
    all (its bound M < 1).
    """

    samples: int = 1 << 18
    failure_probability: float | None = None
    verify_samples: int | None = None
    seed: int = 0
    evr_delta_ratio: float = 0.5
    device: str = "cpu"
    verification: str = "auto"
    name: str = "montecarlo"
    deterministic: ClassVar[bool] = False
    printed_bounds: ClassVar[dict[str, str]] = {}
    auto_rank: ClassVar[int | None] = 2

    def __post_init__(self) -> None:
        if self.samples < MIN_MC_SAMPLES or (
            self.verify_samples is not None and self.verify_samples < MIN_MC_SAMPLES
        ):
            raise ParamsError(
                f"mc samples = {self.samples}/{self.verify_samples} are invalid: "
                f"need at least {MIN_MC_SAMPLES}"
            )
        validation.within("evr_delta_ratio", self.evr_delta_ratio, 0, 1)
        if self.failure_probability is not None:
            validation.within("failure_probability", self.failure_probability, 0, 1)
        validation.one_of("verification", self.verification, VERIFICATIONS)
        resolve_device(self.device)

    def failure_target(self, delta: float) -> float:
        """β: the user's, or min(δ/10, 1e-6) so that the unconditional δ + β stays within 1.1·δ."""
        return (
            self.failure_probability
            if self.failure_probability is not None
            else min(delta / 10, FAILURE_CAP)
        )

    def verification_plan(self, delta: float) -> tuple[float, int, float]:
        """(threshold τ, fresh samples per attempt, failure bound per attempt)."""
        threshold = 0.5 * (1.0 + self.evr_delta_ratio) * delta
        if self.verify_samples is not None:
            return (
                threshold,
                self.verify_samples,
                evr.failure_bound(self.verify_samples, delta, threshold),
            )
        per_attempt = self.failure_target(delta) / EVR_ATTEMPTS
        return threshold, evr.samples_for(per_attempt, delta, threshold), per_attempt

    def unsupported(self, description: MechanismDescription) -> str | None:
        refusal = outside(
            description,
            "Monte Carlo",
            ("balls-in-bins", "balls-in-bins-redrawn"),
            "balls-in-bins batching",
            "pld",
        )
        if refusal:
            return refusal
        if description.group_size != 1:
            return (
                "the Monte Carlo accountant is example-level only; "
                "group-level ε needs poisson or fixed with pld"
            )
        if description.sampler == "balls-in-bins-redrawn" and description.mechanism != "identity":
            return (
                "correlated noise needs bins fixed across epochs "
                "(004 Lemma 3.2 sums the same slot over epochs); use sampler balls-in-bins"
            )
        return None

    def pair(self, description: MechanismDescription) -> mc.DominatingPair:
        require_support(self, description)
        d = description
        if d.sampler == "balls-in-bins-redrawn":
            return mc.redrawn_bins_pair(d.batches_per_epoch, d.steps)
        values = coefficients(d.mechanism, d.mechanism_params, d.steps)
        return mc.fixed_bins_pair(values, d.batches_per_epoch, d.steps)

    def assumptions(
        self, description: MechanismDescription, delta: float, verified: evr.EvrVerification
    ) -> list[str]:
        d = description
        sentences = base_assumptions(d)
        poisson = poisson_at_same_noise(d, delta)
        if poisson is not None:
            sentences.insert(
                0,
                (
                    f"WARNING: with independent noise (mechanism identity) over {d.epochs} epochs, "
                    "bins fixed across epochs are far worse than Poisson sampling: "
                    f"at this σ = {d.noise_multiplier:.4g} and q, "
                    f"Poisson would give ε = {poisson:.3g}; "
                    "for DP-SGD use balls-in-bins-redrawn or poisson, "
                    "and keep fixed bins for correlated noise"
                ),
            )
        if d.mechanism != "identity":
            sentences.append(
                f"correlated noise: the model receives x + C⁻¹z with C the {d.mechanism} matrix "
                f"(non-negative lower-triangular Toeplitz); dominating pair of 004 Lemma 3.2"
            )
        failure_probability = verified.mc_failure_probability
        if verified.importance is not None:
            draws = verified.importance
            how = (
                f"importance-sampled fresh sets of {draws.samples_remove} (remove) "
                f"and {draws.samples_add} (add) "
                f"draws with weights bounded by M = {draws.bound_remove:.3g} / {draws.bound_add:.3g} "  # noqa: E501
                "(KL bound on f·w/M; where M <= δ the bound δ <= M proves the direction)"
            )
        else:
            how = f"fresh sets of {verified.verify_samples} samples"
        sentences.append(
            "Monte Carlo estimate with Estimate-Verify-Release: "
            f"estimated at δ' = {self.evr_delta_ratio:g}·δ on {self.samples} samples, "
            f"verified below τ = midpoint(δ', δ) on {how}; "
            f"the claim fails with probability at most {failure_probability:.3g} over the accountant's randomness "  # noqa: E501
            f"(Chernoff–Hoeffding KL bound, union over {EVR_ATTEMPTS} attempts), "
            f"so it is unconditionally (ε, δ + {failure_probability:.3g})-DP"
        )
        return sentences

    def importance_plan(
        self, pair: mc.DominatingPair, sigma: float, epsilon: float, delta: float
    ) -> tuple[tuple[importance.Proposal, ...], tuple[int, ...]] | None:
        """The importance-sampling proposals and per-direction draws for this attempt, or None where
        plain sampling is used (``verification``, several pieces, a fixed ``verify_samples``, or
        more draws)."""
        if self.verification == "plain" or self.verify_samples is not None:
            return None
        if len(pair.grams) != 1:
            if self.verification == "importance":
                raise UnsupportedMechanismError(
                    "verification = importance needs bins fixed across epochs (one piece): "
                    "with bins redrawn every epoch the losses of the epochs add and the per-piece union bound does not cover their sum"  # noqa: E501
                )
            return None
        threshold, plain, failure = self.verification_plan(delta)
        gram = torch.as_tensor(pair.grams[0], dtype=torch.float64)
        proposals = importance.proposals(gram, sigma, epsilon)
        counts = tuple(
            importance.samples_needed(p.bound, failure, delta, threshold) for p in proposals
        )
        if self.verification == "auto" and sum(counts) >= plain:
            return None
        return proposals, counts

    def verify(
        self, pair: mc.DominatingPair, sigma: float, epsilon: float, delta: float, raise_sigma: bool
    ) -> tuple[float, float, evr.EvrVerification]:
        """Estimate-Verify-Release on fresh samples; returns the certified (σ, ε) and what the
        verification found.

        If the check fails, σ (or, at a fixed σ, ε) is raised by 5% and checked again on new fresh
        samples, at most ``EVR_ATTEMPTS`` times. Each attempt passes a bad (σ, ε) with probability
        <= β, so the released claim fails with probability <= attempts·β (union bound).
        """
        threshold, fresh, failure = self.verification_plan(delta)
        device = resolve_device(self.device)
        for attempt in range(1, EVR_ATTEMPTS + 1):
            seed = self.seed + 1_000_003 * attempt
            plan = self.importance_plan(pair, sigma, epsilon, delta)
            if plan is None:
                estimate = mc.estimate_delta(pair, sigma, epsilon, fresh, seed, device=device)
                passed = estimate.delta <= threshold
            else:
                estimate = importance.verify(
                    pair.grams[0], plan[0], plan[1], sigma, epsilon, seed, device
                )
                passed = all(
                    p.bound <= delta or e.delta <= threshold
                    for p, e in zip(plan[0], estimate.parts)
                )
            if passed:
                break
            if raise_sigma:
                sigma *= 1.05
            else:
                epsilon = epsilon * 1.05 + 1e-3
        else:
            raise DpledgerError(
                f"Estimate-Verify-Release refused after {EVR_ATTEMPTS} attempts: "
                f"fresh samples give δ̂ = {estimate.delta:.3g} > threshold {threshold:.3g}; "
                f"increase calibrate.mc_samples (now {self.samples}) "
                f"or lower calibrate.evr_delta_ratio (now {self.evr_delta_ratio:g})"
            )
        total_failure = min(1.0, EVR_ATTEMPTS * failure)
        verified = evr.EvrVerification(
            samples=self.samples,
            verification="plain" if plan is None else "importance",
            verify_samples=fresh if plan is None else sum(plan[1]),
            verify_samples_plain=fresh,
            evr_attempts=attempt,
            delta_estimate_verify=estimate.delta,
            delta_interval_95=estimate.interval,
            delta_remove=estimate.delta_remove,
            delta_add=estimate.delta_add,
            evr_threshold=threshold,
            delta_calibrated=self.evr_delta_ratio * delta,
            mc_failure_probability=total_failure,
            unconditional_delta=min(1.0, delta + total_failure),
            importance=None
            if plan is None
            else evr.ImportanceDraws(plan[0][0].bound, plan[0][1].bound, plan[1][0], plan[1][1]),
        )
        return sigma, epsilon, verified

    def epsilon(self, description: MechanismDescription, delta: float) -> AccountantResult:
        """ε at the description's σ: estimated at δ', then certified by Estimate-Verify-Release."""
        pair = self.pair(description)
        if description.noise_multiplier == 0:
            return AccountantResult(self.name, math.inf, delta, base_assumptions(description), {})
        _, eps, verified = self.verify(
            pair,
            description.noise_multiplier,
            self.epsilon_estimate(description, delta),
            delta,
            raise_sigma=False,
        )
        return AccountantResult(
            self.name,
            eps,
            delta,
            self.assumptions(description, delta, verified),
            verified.to_details(),
        )

    def epsilon_estimate(self, description: MechanismDescription, delta: float) -> float:
        """ε̂ at δ' = evr_delta_ratio·δ from ``samples`` samples, without verification (curves, not
        claims)."""
        if description.noise_multiplier == 0:
            return math.inf
        prepared = mc.PreparedPair(self.pair(description), resolve_device(self.device))
        found = prepared.positive_losses(description.noise_multiplier, self.samples, self.seed)
        return mc.epsilon_from_losses(found, self.samples, self.evr_delta_ratio * delta)

    def curve_epsilon(
        self, description: MechanismDescription, delta: float, table_discretization: float
    ) -> float:
        """The estimate at δ' (no EVR: only the final claim is verified)."""
        return self.epsilon_estimate(description, delta)

    def delta(self, description: MechanismDescription, epsilon: float) -> float:
        return self.delta_estimate(description, epsilon).delta

    def delta_estimate(self, description: MechanismDescription, epsilon: float) -> mc.DeltaEstimate:
        """δ̂(ε) with its confidence interval (no EVR)."""
        return mc.estimate_delta(
            self.pair(description), description.noise_multiplier, epsilon, self.samples, self.seed
        )

    def calibrate(
        self,
        description: MechanismDescription,
        epsilon: float,
        delta: float,
        tolerance: float = 0.0,
    ) -> Calibration:
        """σ by bisection with common random numbers at δ' (004 Alg. 2), then EVR on fresh
        samples (``tolerance`` is the bisection's own, relative in σ)."""
        pair = self.pair(description)
        upper = gaussian_noise_for(pair.max_sensitivity(), epsilon, self.evr_delta_ratio * delta)
        search = calibrate_sigma(
            pair,
            epsilon,
            self.evr_delta_ratio * delta,
            self.samples,
            self.seed,
            upper,
            device=resolve_device(self.device),
        )
        sigma, _, verified = self.verify(
            pair, search.noise_multiplier, epsilon, delta, raise_sigma=True
        )
        summary = evr.SigmaSearchSummary(
            search.noise_multiplier, search.survivors, search.passes, search.delta_hat
        )
        verified = replace(verified, search=summary)
        result = AccountantResult(
            self.name,
            epsilon,
            delta,
            self.assumptions(description.with_noise(sigma), delta, verified),
            verified.to_details(),
        )
        return Calibration(sigma, result)


def poisson_at_same_noise(description: MechanismDescription, delta: float) -> float | None:
    """ε of Poisson sampling at the same σ, q and steps (PLD), where fixed bins with C = I over
    several epochs are used: the comparison users must see (fixed bins lose amplification across
    epochs)."""
    d = description
    if (
        d.sampler != "balls-in-bins"
        or d.mechanism != "identity"
        or d.epochs == 1
        or d.noise_multiplier == 0
    ):
        return None
    return pld_epsilon(
        PldRun(d.noise_multiplier, "poisson", 1, d.sample_rate, None, None, d.steps), delta
    )


ACCOUNTANT = MonteCarloAccountant

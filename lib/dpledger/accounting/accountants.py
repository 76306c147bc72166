"""Accountants behind one interface: ε(δ) and δ(ε) of a :class:`MechanismDescription`, with
assumptions.

An accountant that cannot account soundly for a description says why (:meth:`unsupported`) instead
of guessing; :func:`require_support` turns that into an :class:`UnsupportedMechanismError`.

| accountant   | samplers                                   | group k > 1 | correlated C |
|--------------|--------------------------------------------|-------------|--------------|
| ``pld``      | poisson, fixed                             | yes (MoG)   | no           |
| ``rdp``      | poisson                                    | no          | no           |
| ``allocation`` | balls-in-bins-redrawn, balls-in-bins (C = I) | no        | no           |
| ``montecarlo`` | balls-in-bins (any C >= 0), balls-in-bins-redrawn (C = I) | no | yes    |

``auto`` (:func:`resolve_accountant`) picks the first of pld, allocation, montecarlo that covers the
sampler and mechanism, as each one's :meth:`unsupported` says: today pld for poisson/fixed,
allocation for balls-in-bins with C = I (deterministic and tighter than Monte Carlo), montecarlo for
correlated noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch

from dpledger.accounting import evr, importance
from dpledger.accounting import montecarlo as mc
from dpledger.accounting.allocation import LOWER_GRID_FACTOR, allocation_epsilon, allocation_on_grid
from dpledger.accounting.description import MechanismDescription, describe
from dpledger.accounting.pld import (
    DISCRETIZATION,
    PldRun,
    gaussian_noise_for,
    pld_delta,
    pld_epsilon,
    rdp_delta,
    rdp_epsilon,
)
from dpledger.accounting.record import AccountantResult
from dpledger.devices import resolve_device
from dpledger.errors import DpledgerError, ParamsError, UnsupportedMechanismError
from dpledger.mechanisms import coefficients

EVR_ATTEMPTS = 3
VERIFICATIONS = ("auto", "plain", "importance")
FAILURE_CAP = 1e-6
ADJACENCY = "add or remove one example (both directions accounted, the worse one reported)"
RELEASE = "every intermediate model is released (no last-iterate amplification is claimed)"


class Accountant(Protocol):
    name: str

    def unsupported(self, description: MechanismDescription) -> str | None: ...

    def epsilon(self, description: MechanismDescription, delta: float) -> AccountantResult: ...

    def delta(self, description: MechanismDescription, epsilon: float) -> float: ...


def _outside(
    description: MechanismDescription, name: str, covered: tuple[str, ...], what: str, use: str
) -> str | None:
    """The refusal of accountant ``name`` for a sampler outside ``covered`` (``what`` in words),
    naming the accountant to ``use`` instead; None for a covered sampler."""
    if description.sampler in covered:
        return None
    return f"the {name} accountant covers {what}, not {description.sampler}; use --accountant {use}"


def _base_assumptions(description: MechanismDescription) -> list[str]:
    adjacency = (
        ADJACENCY
        if description.group_size == 1
        else (
            f"add or remove up to k = {description.group_size} examples (group privacy; both "
            "directions accounted)"
        )
    )
    return [
        description.sampling_sentence(),
        f"adjacency: {adjacency}",
        f"noise N(0, (σ·clip norm)²) with σ = {description.noise_multiplier:.6g} added once per "
        "step to the sum "
        f"of per-example clipped gradients, {description.steps} steps",
        RELEASE,
    ]


@dataclass(frozen=True)
class PldAccountant:
    """dp-accounting PLD, pessimistic connect-the-dots discretization (see accounting.pld)."""

    discretization: float = DISCRETIZATION
    name: str = "pld"

    def unsupported(self, description: MechanismDescription) -> str | None:
        refusal = _outside(
            description, "PLD", ("poisson", "fixed"), "poisson and fixed sampling", "montecarlo"
        )
        if refusal:
            return refusal
        if description.mechanism != "identity":
            return (
                "correlated noise (mechanism != identity) is accounted only under balls-in-bins "
                "batching "
                "(004); use sampler balls-in-bins with accountant montecarlo"
            )
        if description.sampler == "fixed" and (
            description.dataset_size is None or description.batch_size is None
        ):
            return "fixed-size sampling needs dataset_size and batch_size"
        return None

    def epsilon(self, description: MechanismDescription, delta: float) -> AccountantResult:
        require_support(self, description)
        eps = pld_epsilon(PldRun.of(description), delta, self.discretization)
        method = (
            "Poisson-subsampled Gaussian"
            if description.sampler == "poisson" and description.group_size == 1
            else "mixture of Gaussians (001)"
        )
        assumptions = _base_assumptions(description) + [
            f"dp-accounting PLD of the {method}, pessimistic connect-the-dots discretization "
            f"(interval {self.discretization:g}): an upper bound on ε up to float rounding",
        ]
        return AccountantResult(
            self.name,
            eps,
            delta,
            assumptions,
            {"discretization": self.discretization, "method": method},
        )

    def delta(self, description: MechanismDescription, epsilon: float) -> float:
        require_support(self, description)
        return pld_delta(PldRun.of(description), epsilon, self.discretization)


@dataclass(frozen=True)
class RdpAccountant:
    """dp-accounting Rényi DP of the Poisson-subsampled Gaussian: a looser cross-check of the
    PLD."""

    name: str = "rdp"

    def unsupported(self, description: MechanismDescription) -> str | None:
        if description.sampler != "poisson":
            return (
                "the RDP accountant here covers poisson sampling only, not "
                f"{description.sampler}; use pld or montecarlo"
            )
        if description.group_size != 1:
            return (
                "the RDP accountant has no group-level analysis here; use pld (mixture of "
                "Gaussians, 001)"
            )
        if description.mechanism != "identity":
            return "correlated noise is accounted only with balls-in-bins and montecarlo"
        return None

    def epsilon(self, description: MechanismDescription, delta: float) -> AccountantResult:
        require_support(self, description)
        d = description
        eps = rdp_epsilon(d.noise_multiplier, d.sample_rate, d.steps, delta)
        assumptions = _base_assumptions(d) + [
            "dp-accounting RDP (default orders), converted to (ε, δ): looser than PLD"
        ]
        return AccountantResult(self.name, eps, delta, assumptions, {})

    def delta(self, description: MechanismDescription, epsilon: float) -> float:
        require_support(self, description)
        d = description
        return rdp_delta(d.noise_multiplier, d.sample_rate, d.steps, epsilon)


@dataclass(frozen=True)
class AllocationAccountant:
    """Deterministic PLD bounds of balls-in-bins with C = I as a random allocation (see
    accounting.allocation)."""

    name: str = "allocation"

    def unsupported(self, description: MechanismDescription) -> str | None:
        refusal = _outside(
            description,
            "allocation",
            ("balls-in-bins", "balls-in-bins-redrawn"),
            "balls-in-bins batching",
            "pld",
        )
        if refusal:
            return refusal
        if description.mechanism != "identity":
            return (
                "correlated noise (mechanism != identity) needs the Monte Carlo accountant (004 "
                "Lemma 3.2)"
            )
        if description.group_size != 1:
            return (
                "the allocation accountant is example-level only; group-level ε needs poisson "
                "or fixed with pld"
            )
        return None

    def epsilon(
        self, description: MechanismDescription, delta: float, grid: float | None = None
    ) -> AccountantResult:
        """Upper (the claim) and lower ε: adaptively refined, or on one fixed ``grid`` (σ searches;
        the lower on a coarser one, see :func:`allocation_on_grid`)."""
        require_support(self, description)
        d = description
        if d.noise_multiplier == 0:
            return AccountantResult(self.name, math.inf, delta, _base_assumptions(d), {})
        bounds = (
            allocation_epsilon(d, delta) if grid is None else allocation_on_grid(d, delta, grid)
        )
        mapping = (
            f"{d.epochs} epoch(s) of a 1-of-{d.batches_per_epoch} random allocation, composed"
            if d.sampler == "balls-in-bins-redrawn"
            else f"one 1-of-{d.batches_per_epoch} random allocation at noise σ/√E = "
            f"{d.noise_multiplier / math.sqrt(d.epochs):.6g} (the example sits in the same slot of "
            "all "
            f"{d.epochs} epochs: one Gaussian of sensitivity √E)"
        )
        assumptions = _base_assumptions(d) + [
            f"pld-accounting (Feldman & Shenfeld) random-allocation PLD: {mapping}; the claim is "
            "the dominating "
            f"(upper) bound, the dominated (lower) bound is ε = {bounds.lower:.6g}"
            + ("" if bounds.converged else " (refinement stopped before upper/lower <= 1.1)"),
        ]
        return AccountantResult(
            self.name,
            bounds.upper,
            delta,
            assumptions,
            {
                "epsilon_lower": bounds.lower,
                "epsilon_upper": bounds.upper,
                "converged": bounds.converged,
                "loss_discretization": "adaptive" if grid is None else grid,
                "lower_loss_discretization": "adaptive"
                if grid is None
                else LOWER_GRID_FACTOR * grid,
            },
        )

    def delta(self, description: MechanismDescription, epsilon: float) -> float:
        raise UnsupportedMechanismError(
            "accountant allocation: δ(ε) is not offered; ask for ε at δ"
        )


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

    def __post_init__(self) -> None:
        if self.samples < 1000 or (self.verify_samples is not None and self.verify_samples < 1000):
            raise ParamsError(
                f"mc samples = {self.samples}/{self.verify_samples} are invalid: need at least 1000"
            )
        if not 0.0 < self.evr_delta_ratio < 1.0:
            raise ParamsError(
                f"evr_delta_ratio = {self.evr_delta_ratio} is invalid: it must lie in (0, 1)"
            )
        if self.failure_probability is not None and not 0.0 < self.failure_probability < 1.0:
            raise ParamsError(
                f"failure_probability = {self.failure_probability} is invalid: it must lie in (0, "
                "1)"
            )
        if self.verification not in VERIFICATIONS:
            raise ParamsError(
                f"verification = {self.verification!r} is invalid: allowed values are "
                f"{', '.join(VERIFICATIONS)}"
            )
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
        refusal = _outside(
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
                "the Monte Carlo accountant is example-level only; group-level ε needs poisson "
                "or fixed with pld"
            )
        if description.sampler == "balls-in-bins-redrawn" and description.mechanism != "identity":
            return (
                "correlated noise needs bins fixed across epochs (004 Lemma 3.2 sums the same slot "
                "over "
                "epochs); use sampler balls-in-bins"
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
        self, description: MechanismDescription, delta: float, details: dict
    ) -> list[str]:
        d = description
        sentences = _base_assumptions(d)
        poisson = poisson_at_same_noise(d, delta)
        if poisson is not None:
            sentences.insert(
                0,
                (
                    f"WARNING: with independent noise (mechanism identity) over {d.epochs} epochs, "
                    "bins fixed across "
                    "epochs are far worse than Poisson sampling: at this σ = "
                    f"{d.noise_multiplier:.4g} and q, Poisson "
                    f"would give ε = {poisson:.3g}; for DP-SGD use balls-in-bins-redrawn or "
                    "poisson, and keep fixed "
                    f"bins for correlated noise"
                ),
            )
        if d.mechanism != "identity":
            sentences.append(
                f"correlated noise: the model receives x + C⁻¹z with C the {d.mechanism} matrix "
                f"(non-negative lower-triangular Toeplitz); dominating pair of 004 Lemma 3.2"
            )
        failure_probability = details["mc_failure_probability"]
        if details["verification"] == "importance":
            how = (
                f"importance-sampled fresh sets of {details['verify_samples_remove']} (remove) and "
                f"{details['verify_samples_add']} (add) draws with weights bounded by M = "
                f"{details['importance_bound_remove']:.3g} / {details['importance_bound_add']:.3g} "
                f"(KL bound on f·w/M; where M <= δ the bound δ <= M proves the direction)"
            )
        else:
            how = f"fresh sets of {details['verify_samples']} samples"
        sentences.append(
            "Monte Carlo estimate with Estimate-Verify-Release: estimated at δ' = "
            f"{self.evr_delta_ratio:g}·δ on "
            f"{self.samples} samples, verified below τ = midpoint(δ', δ) on {how}; the claim fails "
            "with "
            f"probability at most {failure_probability:.3g} over the accountant's randomness "
            "(Chernoff–Hoeffding "
            f"KL bound, union over {EVR_ATTEMPTS} attempts), so it is unconditionally "
            f"(ε, δ + {failure_probability:.3g})-DP"
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
                    "verification = importance needs bins fixed across epochs (one piece): with "
                    "bins redrawn every "
                    "epoch the losses of the epochs add and the per-piece union bound does not "
                    "cover their sum"
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
    ) -> tuple[float, float, dict]:
        """Estimate-Verify-Release on fresh samples; returns the certified (σ, ε) and the details.

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
                f"Estimate-Verify-Release refused after {EVR_ATTEMPTS} attempts: fresh samples "
                "give "
                f"δ̂ = {estimate.delta:.3g} > threshold {threshold:.3g}; increase "
                "calibrate.mc_samples (now "
                f"{self.samples}) or lower calibrate.evr_delta_ratio (now {self.evr_delta_ratio:g})"
            )
        low, high = estimate.interval
        total_failure = min(1.0, EVR_ATTEMPTS * failure)
        details = {
            "samples": self.samples,
            "verification": "plain" if plan is None else "importance",
            "verify_samples": fresh if plan is None else sum(plan[1]),
            "verify_samples_plain": fresh,
            "failure_bound": (
                "Chernoff-Hoeffding (KL) for [0, 1] variables, union over EVR attempts"
            ),
            "evr_attempts": attempt,
            "delta_estimate_verify": estimate.delta,
            "delta_interval_95": [low, high],
            "delta_remove": estimate.delta_remove,
            "delta_add": estimate.delta_add,
            "evr_threshold": threshold,
            "delta_calibrated": self.evr_delta_ratio * delta,
            "mc_failure_probability": total_failure,
            "unconditional_delta": min(1.0, delta + total_failure),
        }
        if plan is not None:
            details.update(
                {
                    "importance_bound_remove": plan[0][0].bound,
                    "importance_bound_add": plan[0][1].bound,
                    "verify_samples_remove": plan[1][0],
                    "verify_samples_add": plan[1][1],
                }
            )
        return sigma, epsilon, details

    def epsilon(self, description: MechanismDescription, delta: float) -> AccountantResult:
        """ε at the description's σ: estimated at δ', then certified by Estimate-Verify-Release."""
        pair = self.pair(description)
        if description.noise_multiplier == 0:
            return AccountantResult(self.name, math.inf, delta, _base_assumptions(description), {})
        _, eps, details = self.verify(
            pair,
            description.noise_multiplier,
            self.epsilon_estimate(description, delta),
            delta,
            raise_sigma=False,
        )
        return AccountantResult(
            self.name, eps, delta, self.assumptions(description, delta, details), details
        )

    def epsilon_estimate(self, description: MechanismDescription, delta: float) -> float:
        """ε̂ at δ' = evr_delta_ratio·δ from ``samples`` samples, without verification (curves, not
        claims)."""
        if description.noise_multiplier == 0:
            return math.inf
        prepared = mc.PreparedPair(self.pair(description), resolve_device(self.device))
        found = prepared.positive_losses(description.noise_multiplier, self.samples, self.seed)
        return mc.epsilon_from_losses(found, self.samples, self.evr_delta_ratio * delta)

    def delta(self, description: MechanismDescription, epsilon: float) -> float:
        return self.delta_estimate(description, epsilon).delta

    def delta_estimate(self, description: MechanismDescription, epsilon: float) -> mc.DeltaEstimate:
        """δ̂(ε) with its confidence interval (no EVR)."""
        return mc.estimate_delta(
            self.pair(description), description.noise_multiplier, epsilon, self.samples, self.seed
        )

    def calibrate(
        self, description: MechanismDescription, epsilon: float, delta: float
    ) -> tuple[float, AccountantResult]:
        """σ by bisection with common random numbers at δ' (004 Alg. 2), then EVR on fresh
        samples."""
        pair = self.pair(description)
        upper = gaussian_noise_for(pair.max_sensitivity(), epsilon, self.evr_delta_ratio * delta)
        search = mc.calibrate_sigma(
            pair,
            epsilon,
            self.evr_delta_ratio * delta,
            self.samples,
            self.seed,
            upper,
            device=resolve_device(self.device),
        )
        sigma, _, details = self.verify(
            pair, search.noise_multiplier, epsilon, delta, raise_sigma=True
        )
        details.update(
            {
                "sigma_calibrated": search.noise_multiplier,
                "survivors": search.survivors,
                "search_passes": search.passes,
                "delta_hat_calibration": search.delta_hat,
            }
        )
        result = AccountantResult(
            self.name,
            epsilon,
            delta,
            self.assumptions(description.with_noise(sigma), delta, details),
            details,
        )
        return sigma, result


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


ACCOUNTANT_TYPES: dict[str, type] = {
    "pld": PldAccountant,
    "rdp": RdpAccountant,
    "allocation": AllocationAccountant,
    "montecarlo": MonteCarloAccountant,
}
ACCOUNTANTS = tuple(ACCOUNTANT_TYPES)
AUTO_ORDER = ("pld", "allocation", "montecarlo")
"""The accountants ``auto`` may stand for, tightest first: the deterministic PLD and allocation
bounds before the sampled Monte Carlo one (rdp is only pld's looser cross-check)."""


def settings_of(name: str) -> tuple[str, ...]:
    """The settings accountant ``name`` takes: its dataclass fields less its name."""
    return tuple(f.name for f in fields(ACCOUNTANT_TYPES[name]) if f.name != "name")


SETTINGS = tuple(sorted({setting for name in ACCOUNTANTS for setting in settings_of(name)}))
"""Every setting some accountant takes (a caller may hand one bundle of them to any one)."""


def get_accountant(name: str, **settings: Any) -> Accountant:
    """The accountant called ``name`` configured with those of ``settings`` it takes
    (:func:`settings_of`); the others must be settings of another accountant (one bundle serves
    all), else the call is refused."""
    if name not in ACCOUNTANT_TYPES:
        allowed = ", ".join(ACCOUNTANTS)
        raise ParamsError(f"accountant = {name!r} is invalid: allowed values are auto, {allowed}")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        allowed = ", ".join(SETTINGS)
        raise ParamsError(f"accountant settings {unknown} are unknown: allowed are {allowed}")
    own = settings_of(name)
    return ACCOUNTANT_TYPES[name](**{key: value for key, value in settings.items() if key in own})


def accountant_of(result: AccountantResult) -> Accountant:
    """The accountant configured as it was for ``result``: its settings read from the result's
    details (which also hold what it found, such as a PLD's method or a Monte Carlo δ estimate)."""
    own = settings_of(result.accountant)
    settings = {key: value for key, value in result.details.items() if key in own}
    return get_accountant(result.accountant, **settings)


def _covers(name: str, sampler: str, mechanism: str) -> bool:
    probe = describe(sampler=sampler, dataset_size=2, batch_size=1, epochs=1, mechanism=mechanism)
    return get_accountant(name).unsupported(probe) is None


def resolve_accountant(name: str, sampler: str, mechanism: str = "identity") -> str:
    """``name``, or for ``auto`` the first of :data:`AUTO_ORDER` whose :meth:`unsupported` accepts
    the sampler with the mechanism. Where none does, the most general one that accepts the sampler
    (the last of the order), so that its refusal says what to change."""
    if name != "auto":
        return name
    covering = [candidate for candidate in AUTO_ORDER if _covers(candidate, sampler, mechanism)]
    if covering:
        return covering[0]
    fallback = [candidate for candidate in AUTO_ORDER if _covers(candidate, sampler, "identity")]
    return fallback[-1] if fallback else AUTO_ORDER[0]


def require_support(accountant: Accountant, description: MechanismDescription) -> None:
    """Raise :class:`UnsupportedMechanismError` with the accountant's reason if it cannot account
    soundly."""
    reason = accountant.unsupported(description)
    if reason is not None:
        raise UnsupportedMechanismError(f"accountant {accountant.name}: {reason}")

"""A one-run canary audit of the actual training run (Steinke, Nasr, Jagielski 2023, 2305.08846).

m white-box gradient canaries C·e_j, each on its own coordinate j of the trainable parameters
(distinct, drawn with a recorded seed), each "in" with probability 1/2, placed in steps exactly as
the schedule's sampler places a real example
(:meth:`dpledger.sampling.base.BatchSampler.membership`: Poisson each step with probability q,
shuffle one slot per epoch, balls-in-bins its bin, ...).

Side copy (the released model is unchanged): after each ``engine.step()`` the train stage reads the
canary coordinates of the released noisy sum g̃_t (clipped sum + the step's noise, after the
data-parallel all-reduce) and of the real examples' clipped sum s_t in it (gathered apart from the
noise), both from ``engine.last_watched``. g̃_t[j]/C + 1{j in, placed at t}
is exactly what an all-iterates adversary sees of coordinate j had the canary been one more example
of the run, with the same noise draw, except for the canary's effect on later iterates (it would
move weight j by lr·C/B when used, and so the later gradients of the real examples). ASSUMPTION:
that effect is negligible; a canary on its own coordinate touches no other weight, and the audit
does not model it.

The adversary (ASSUMPTION, the one DP protects against): it knows every other record of the data
set, the run's iterates and its batches, so it computes the real examples' clipped sum s_t itself
and observes the residual (g̃_t[j] − s_t[j])/C + 1{j in, placed at t}: the noise as released plus
the canary. This is valid: the canaries never enter the model, so the trajectory and every s_t are
independent of the inclusion bits; the guarantee of each step holds whatever the other examples'
gradients (the accountant's worst case fixes them), so removing them is post-processing with
information independent of the bits, and the Steinke and f-DP bounds hold as for the raw sums.
It is what makes the audit reach the ideal canaries: left in, the real gradients at a coordinate
persist over steps and drown the canary's few uses (benchmarks/RESULTS.md, one-run audit). s_t is
measured as the buffer before the canary and the all-reduce minus the buffer right after the noise
draw, not as the released sum minus the noise, so noise lost after its draw still shows. With data
parallelism s_t is rank 0's share; the other ranks' stay in the residual as interference (less
power, same validity).

Scores (the adversary's side, memberships unknown): the exact log likelihood ratio of "in" vs "out"
for the all-iterates observation of one coordinate under the sampler's law, at the noise std the
residuals show (:func:`measured_noise`; the claimed σ on an honest run, less on a run that
cheats) (:mod:`dpledger.audit.models`: per step log[(1 − q) + q·e^{(x − 1/2)/σ²}] summed for
independent steps; the slot mixture per epoch for shuffling). A misspecified score (correlated
noise, leftover interference) loses power but never validity: the bounds of :mod:`one_run_bounds`
hold for any score computed from the observation and information independent of the bits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpledger.accounting.last_iterate import last_iterate_epsilon
from dpledger.audit.backend import NumpyBackend
from dpledger.audit.canaries import (
    ARTIFACT,
    CanaryLaw,
    canary_law,
    load_observations,
    observe,
    stream,
)
from dpledger.audit.models import SlotModel, StepMixtureModel
from dpledger.audit.noise_tails import NoiseSupport, noise_support
from dpledger.audit.one_run_bounds import OneRunEstimate, ceiling_epsilon, one_run_epsilon
from dpledger.audit.one_run_family import OrderEstimate, eps_delta_estimate, family_estimate
from dpledger.errors import DpledgerError, ParamsError
from dpledger.sampling.schedule import Schedule

ADVERSARY = "adversary knows the other records"  # the report's words for what the scores remove
MAD_TO_STD = 1.482602218505602  # 1/Φ⁻¹(3/4): the median absolute deviation of N(0, s²) is s/1.4826
# the least noise std the scores use: a run that released its sums with no noise at all shows 0, and
# its canaries must then score as certain (a contradiction), not as an invalid σ
NOISE_FLOOR = 1e-6
ORDER_BOUNDS = ("order", "order-eps-delta")
CANNOT_TEST = "cannot test this claim"


def measured_noise(observation: np.ndarray) -> float:
    """The noise std the observations show (units of C): a median absolute deviation over all canary
    coordinates and steps, robust to the canaries' +1 in a fraction q/2 of them. A function of the
    observation alone, so scoring at it keeps the bound valid; on an honest run it is the claimed σ,
    on a run with less noise it is what makes the scores sharp."""
    deviations = np.abs(observation - np.median(observation))
    return max(float(MAD_TO_STD * np.median(deviations)), NOISE_FLOOR)


def score(law: CanaryLaw, observation: np.ndarray, noise_multiplier: float) -> np.ndarray:
    """Log likelihood ratio "in" vs "out" of each canary's row of ``observation`` (units of C)."""
    backend = NumpyBackend()
    x = np.array(observation, dtype=np.float64)
    if law.step_probability is not None:
        model = StepMixtureModel(noise_multiplier, law.num_steps, law.step_probability, 1.0, 0.0)
        return model.score(backend, x)
    weights = np.asarray(law.slot_weights, dtype=np.float64)
    x = x.reshape(x.shape[0], law.epochs, weights.size)[:, :, weights > 0]
    x = x.sum(axis=1) if law.same_slot_every_epoch else x.reshape(-1, x.shape[2])
    slot = SlotModel(
        noise_multiplier, law.epochs, law.slot_weights, 1.0, 0.0, law.same_slot_every_epoch
    )
    return slot.score(backend, x)


ORDER_METHODS = {
    "order": "order statistics (2509.08704), the ledger's Gaussian family",
    "order-eps-delta": "order statistics (2509.08704), generic (ε, δ)",
}


def _method(estimate: OneRunEstimate | OrderEstimate) -> str:
    """The report's words for how ε_emp was reached."""
    if isinstance(estimate, OrderEstimate):
        return f"{ORDER_METHODS[estimate.form]}, {estimate.threshold}, {ADVERSARY}"
    name = f"{estimate.bound} ({estimate.family})" if estimate.bound == "fdp" else "steinke"
    return f"{name}, {estimate.threshold}, {ADVERSARY}"


def verdict_for(epsilon_emp: float, epsilon_claimed: float, ceiling: float) -> str:
    """contradicted above the claim; where the claim is above the most this audit could ever show
    (its ceiling: every guess right), a consistent result is no evidence, so it says so."""
    if epsilon_emp > epsilon_claimed:
        return "contradicted"
    return CANNOT_TEST if epsilon_claimed > ceiling else "consistent"


@dataclass(frozen=True)
class OneRunResult:
    """ε_emp of the run against the claim, with what it rests on; ``order`` holds both forms of the
    order-statistics bound (None where a form does not apply, with the reason in ``notes``)."""

    estimate: OneRunEstimate | OrderEstimate
    ceiling: float
    epsilon_claimed: float
    verdict: str
    placement: str
    steps: int
    noise_claimed: float
    noise_measured: float
    assumptions: tuple[str, ...]
    order: dict[str, OrderEstimate | None]
    notes: tuple[str, ...] = ()

    def summary(self) -> dict[str, Any]:
        """The flat facts metrics/audit.json carries for the one-run audit."""
        e = self.estimate
        flat: dict[str, Any] = {
            "epsilon_emp_one_run": e.epsilon,
            "one_run_verdict": self.verdict,
            "one_run_confidence": e.confidence,
            "one_run_canaries": e.canaries,
            "one_run_noise_measured": self.noise_measured,
            "one_run_method": _method(e),
            "one_run_ceiling": self.ceiling,
            "one_run_fraction_of_claim": e.epsilon / self.epsilon_claimed,
        }
        for form, found in self.order.items():
            key = "one_run_" + form.replace("-", "_")
            flat[f"{key}_epsilon"] = None if found is None else found.epsilon
            flat[f"{key}_ceiling"] = None if found is None else found.ceiling
        return flat

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "estimate": asdict(self.estimate),
            "order": {k: None if v is None else asdict(v) for k, v in self.order.items()},
            "epsilon_claimed": self.epsilon_claimed,
            "placement": self.placement,
            "steps": self.steps,
            "noise_claimed": self.noise_claimed,
            "assumptions": list(self.assumptions),
            "notes": list(self.notes),
        }


def assumptions(correlated: bool) -> tuple[str, ...]:
    """What the one-run ε_emp rests on, in sentences for the report."""
    lines = [
        "One run, m gradient canaries C·e_j on distinct coordinates, each in with probability 1/2 "
        "(2305.08846).",
        "Side copy: the canary is added to the released noisy sums of its own coordinate, not to the model; its effect on later iterates is assumed negligible.",  # noqa: E501
        "Adversary: knows every other record (the standard DP adversary), so it removes the real examples' clipped sum from each released coordinate; valid because the canaries never enter the model, which makes those sums independent of the canaries' inclusion.",  # noqa: E501
        "Scores: log likelihood ratio of one coordinate's residual sums under the sampler's law at the noise std measured from them (the claimed σ on an honest run).",  # noqa: E501
        "order (the ledger's family): refutes 'each canary coordinate is released as the ledger's Poisson-subsampled Gaussian at noise σ′'; under it the canaries are independent "  # noqa: E501
        "(own coordinate, own noise, own placements), so the order-statistics tail of a fixed statistic is exact (2509.08704); it is not a test of a generic (ε, δ) claim.",  # noqa: E501
        "order-eps-delta: refutes 'the run is (ε, δ)-DP for each canary' by the order-statistics tail of the (ε, δ) randomized response, which 2509.08704 proves is the least number of mistakes any such mechanism allows.",  # noqa: E501
        "The number of guesses is fixed in advance: a Bonferroni grid (or held-out canaries); "
        "ε_emp is the largest ε refuted, from the run's actual guesses (one random draw).",
    ]
    if correlated:
        lines.append(
            "Correlated noise: the scores assume independent noise per step, so they lose power; "
            "the bound stays valid (it holds for any score); the family form does not apply."
        )
    return tuple(lines)


def order_estimates(
    observation: np.ndarray,
    scores: np.ndarray,
    included: np.ndarray,
    law: CanaryLaw,
    **settings: Any,
) -> tuple[dict[str, OrderEstimate | None], tuple[str, ...]]:
    """Both forms of the order-statistics bound, with why a form was not computed. ``settings``:
    noise_multiplier, delta, confidence, threshold, split_fraction, correlated."""
    common = {k: settings[k] for k in ("delta", "confidence", "threshold", "split_fraction")}
    found: dict[str, OrderEstimate | None] = {
        "order-eps-delta": eps_delta_estimate(scores, included, **common)
    }
    notes: list[str] = []
    if law.step_probability is None or settings["correlated"]:
        found["order"] = None
        notes.append(
            "order (family): not computed; it models independent Gaussian noise per step and Poisson placement, and this run has "  # noqa: E501
            + ("correlated noise" if settings["correlated"] else f"{law.placement} placement")
        )
    else:
        found["order"] = family_estimate(
            observation,
            included,
            step_probability=law.step_probability,
            noise_claimed=settings["noise_multiplier"],
            **common,
        )
    return found, tuple(notes)


def audit_one_run(
    saved: dict[str, np.ndarray],
    law: CanaryLaw,
    *,
    noise_multiplier: float,
    epsilon_claimed: float,
    delta: float,
    confidence: float,
    bound: str,
    threshold: str,
    split_fraction: float,
    correlated: bool,
) -> OneRunResult:
    """ε_emp of the run from its recorded canary coordinates, less the real examples' clipped sums
    there: the params' ``bound`` and both order-statistics forms. ``order`` falls back to the
    ``fdp`` bound where the family form does not apply (stated in the notes)."""
    observation, included = _observation(saved, law)
    measured = measured_noise(observation)
    scores = score(law, observation, measured)
    settings = {
        "noise_multiplier": noise_multiplier,
        "delta": delta,
        "confidence": confidence,
        "threshold": threshold,
        "split_fraction": split_fraction,
        "correlated": correlated,
    }
    order, notes = order_estimates(observation, scores, included, law, **settings)
    chosen = order.get(bound)
    if chosen is not None:
        estimate: OneRunEstimate | OrderEstimate = chosen
        ceiling = chosen.ceiling
    else:
        if bound in ORDER_BOUNDS:
            notes += (f"{bound} does not apply to this run; the fdp bound is reported instead",)
            bound = "fdp"
        estimate = _estimate(scores, included, bound, delta, confidence, threshold, split_fraction)
        ceiling = ceiling_epsilon(
            included,
            bound="steinke" if bound == "steinke" else "fdp",
            family="gaussian" if bound == "fdp-gaussian" else "eps-delta",
            delta=delta,
            confidence=confidence,
            threshold=threshold,
            split_fraction=split_fraction,
        )
    return OneRunResult(
        estimate,
        ceiling,
        epsilon_claimed,
        verdict_for(estimate.epsilon, epsilon_claimed, ceiling),
        law.placement,
        law.num_steps,
        noise_multiplier,
        measured,
        assumptions(correlated),
        order,
        notes,
    )


def _observation(saved: dict[str, np.ndarray], law: CanaryLaw) -> tuple[np.ndarray, np.ndarray]:
    """(canaries × steps residual observations, inclusion bits) of a whole record."""
    if "real" not in saved:
        raise DpledgerError(
            f"audit.one_run: {ARTIFACT} has no real examples' clipped sums "
            "(an older train stage wrote it); re-run the train stage"
        )
    raw, real = saved["raw"], saved["real"]
    whole = np.isfinite(raw).all(axis=1) & np.isfinite(real).all(axis=1)
    if raw.shape[0] != law.num_steps or real.shape != raw.shape or not whole.all():
        raise DpledgerError(
            f"audit.one_run: {ARTIFACT} lacks {np.count_nonzero(~whole)} of {law.num_steps} steps "
            "(or does not match the schedule); re-run the train stage"
        )
    included = saved["included"].astype(bool)
    placed = law.placed(int(saved["seed"]), included.size)
    return observe(raw, real, included, placed), included


def ideal_epsilon(
    law: CanaryLaw,
    noise_multiplier: float,
    canaries: int,
    *,
    delta: float,
    confidence: float,
    bound: str,
    threshold: str = "bonferroni",
    seed: int = 0,
) -> float:
    """ε_emp of interference-free canaries at the same σ, law and m: pure noise plus the canary."""
    rng = stream(seed, 3)
    included = rng.random(canaries) < 0.5
    raw = rng.standard_normal((law.num_steps, canaries)) * noise_multiplier
    placed = law.placed(seed, canaries)
    observation = observe(raw, np.zeros_like(raw), included, placed)
    scores = score(law, observation, measured_noise(observation))
    if bound in ORDER_BOUNDS:
        settings = {"threshold": threshold, "split_fraction": 0.5, "correlated": False}
        order, _ = order_estimates(
            observation,
            scores,
            included,
            law,
            noise_multiplier=noise_multiplier,
            delta=delta,
            confidence=confidence,
            **settings,
        )
        found = order[bound]
        return 0.0 if found is None else found.epsilon
    return _estimate(scores, included, bound, delta, confidence, threshold).epsilon


def _estimate(
    scores: np.ndarray,
    included: np.ndarray,
    bound: str,
    delta: float,
    confidence: float,
    threshold: str,
    split_fraction: float | None = None,
) -> OneRunEstimate:
    """:func:`one_run_epsilon` for the params' ``bound`` name (fdp, fdp-gaussian or steinke)."""
    split = {} if split_fraction is None else {"split_fraction": split_fraction}
    return one_run_epsilon(
        scores,
        included,
        delta=delta,
        confidence=confidence,
        bound="steinke" if bound == "steinke" else "fdp",
        family="gaussian" if bound == "fdp-gaussian" else "eps-delta",
        threshold=threshold,
        **split,
    )


def heuristic_epsilon(
    law: CanaryLaw | None, noise_multiplier: float, delta: float, correlated: bool
) -> dict[str, Any]:
    """The last-iterate heuristic ε (:mod:`dpledger.accounting.last_iterate`) for the sampler's law,
    or
    None with the reason where it does not apply."""
    if correlated:
        return {"epsilon_last_iterate_heuristic": None, "note": "not computed for correlated noise"}
    if law is None:
        return {
            "epsilon_last_iterate_heuristic": None,
            "note": "the sampler states no law of membership",
        }
    epsilon = last_iterate_epsilon(
        noise_multiplier,
        law.num_steps,
        delta,
        step_probability=law.step_probability,
        epochs=law.epochs,
    )
    note = "heuristic for releasing only the final model (linear losses; 2410.06186): no guarantee"
    return {"epsilon_last_iterate_heuristic": epsilon, "note": note}


def run_noise_support(
    law: CanaryLaw | None, noise_multiplier: float, secure: bool, steps: int
) -> NoiseSupport:
    """The run's noise reach and tail δ: the secure path, else the shorter of the engine's two
    (Philox on the CPU in float32, torch's float64 chunks elsewhere: which one a device takes is
    not in the ledger), for an example used as often as the sampler uses one (T·q for Poisson, once
    an epoch otherwise; once per step when the sampler states no law)."""
    if law is None:
        uses = float(steps)
    elif law.step_probability is not None:
        uses = law.num_steps * law.step_probability
    else:
        uses = float(law.epochs)
    paths = ("secure",) if secure else ("philox", "torch-float64")
    found = [noise_support(p, noise_multiplier, uses) for p in paths]
    return min(found, key=lambda s: s.reach)


def audit_run(
    settings: Any,
    schedule: Schedule,
    train_dir: Path,
    *,
    noise_multiplier: float,
    epsilon: float,
    delta: float,
    correlated: bool,
    secure: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The audit stage's part: (flat metrics, details) of the last-iterate heuristic and, when
    ``settings.enabled`` (params ``audit.one_run``), of the one-run audit of the recorded canaries.
    """
    try:
        law: CanaryLaw | None = canary_law(schedule)
    except ParamsError:
        law = None
    heuristic = heuristic_epsilon(law, noise_multiplier, delta, correlated)
    support = run_noise_support(law, noise_multiplier, secure, schedule.num_steps)
    metrics: dict[str, Any] = {
        "epsilon_last_iterate_heuristic": heuristic["epsilon_last_iterate_heuristic"],
        "noise_support": support.line(),
        "noise_support_sigma": support.reach,
        "noise_tail_delta": support.tail_delta,
    }
    details: dict[str, Any] = {"last_iterate": heuristic, "noise_support": asdict(support)}
    if not settings.enabled:
        return metrics, details
    if law is None:
        reason = (
            f"sampler {schedule.sampler!r} states no closed-form law of membership for canaries"
        )
        metrics.update({"epsilon_emp_one_run": None, "one_run_verdict": "not run"})
        details["one_run"] = {"verdict": "not run", "note": reason}
        return metrics, details
    path = train_dir / ARTIFACT
    if not path.exists():
        raise DpledgerError(
            f"audit.one_run: {path} is missing; re-run the train stage with audit.one_run.enabled"
        )
    result = audit_one_run(
        load_observations(path),
        law,
        noise_multiplier=noise_multiplier,
        epsilon_claimed=epsilon,
        delta=delta,
        confidence=settings.confidence,
        bound=settings.bound,
        threshold=settings.threshold,
        split_fraction=settings.split_fraction,
        correlated=correlated,
    )
    metrics.update(result.summary())
    details["one_run"] = result.to_dict()
    return metrics, details

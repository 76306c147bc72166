"""Audit of the batched Gaussian mechanism (002 App. A; the Worst-Case threat model) for a sampler."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from dpledger.accounting.pld import PldRun, pld_epsilon
from dpledger.audit.backend import select_backend
from dpledger.audit.estimate import AuditStatistics
from dpledger.audit.result import AuditResult, Claim, conclude
from dpledger.audit.samplers import AuditedSampler, audited_sampler
from dpledger.audit.simulate import GameScores, entries_per_game, simulate_scores
from dpledger.errors import ParamsError
from dpledger.params.bounds import (
    MAX_AUDIT_DRAWS,
    MAX_AUDIT_OBSERVATIONS,
    refuse_beyond,
)

CLAIM_ACCOUNTANTS = ("poisson", "fixed")


def accounted_epsilon(
    claim_sampler: str,
    *,
    noise_multiplier: float,
    dataset_size: int,
    batch_size: int,
    steps: int,
    delta: float,
    sample_rate: float | None = None,
) -> float:
    """ε a ledger would claim: the PLD accountant (pessimistic) for ``claim_sampler`` at q = ``sample_rate``
    (default B/n)."""
    if claim_sampler not in CLAIM_ACCOUNTANTS:
        raise ParamsError(
            f"audit: claim sampler = {claim_sampler!r} is invalid: allowed values are {', '.join(CLAIM_ACCOUNTANTS)} "
            f"(or give the claimed epsilon explicitly)"
        )
    rate = batch_size / dataset_size if sample_rate is None else sample_rate
    return pld_epsilon(PldRun(noise_multiplier, claim_sampler, 1, rate, dataset_size, batch_size, steps), delta)


def default_claim(
    claim_sampler: str,
    sampler: str,
    options: dict[str, Any] | None,
    *,
    noise_multiplier: float,
    dataset_size: int,
    batch_size: int,
    steps: int,
    delta: float,
) -> Claim:
    """The claim a ledger would make for ``claim_sampler`` (:func:`accounted_epsilon`), at q = a Poisson
    sampler's own ``sample_rate`` when the claim is Poisson too, else B/n."""
    own_rate = (options or {}).get("sample_rate")
    if claim_sampler == "poisson" and sampler == "poisson" and own_rate is not None:
        rate = float(own_rate)
    else:
        rate = batch_size / dataset_size
    epsilon = accounted_epsilon(
        claim_sampler,
        noise_multiplier=noise_multiplier,
        dataset_size=dataset_size,
        batch_size=batch_size,
        steps=steps,
        delta=delta,
        sample_rate=rate,
    )
    q = "B/n" if rate == batch_size / dataset_size else f"{rate:g} (the sampler's sample_rate)"
    return Claim(epsilon, delta, f"PLD accountant assuming '{claim_sampler}' sampling, q = {q}, {steps} steps")


def bgm_assumptions(audited: AuditedSampler) -> list[str]:
    """What the BGM audit's ε_emp rests on, in sentences for the report."""
    return [
        "Worst-Case threat model: the batched Gaussian mechanism, every batch sum released (002 App. A).",
        f"Zero-out adjacency; audited pair {audited.pair}.",
        f"Where the record lands under '{audited.sampler}': {audited.placement}.",
        "Scores are exact log likelihood ratios of the pair; ε_emp is a lower bound on the mechanism's ε only.",
    ]


def simulate_bgm(
    audited: AuditedSampler, observations: int, *, seed: int, backend: str = "auto", progress: bool = True
) -> tuple[GameScores, dict[str, float]]:
    """Scores of ``observations`` games (half on D, half on D') and the generation speed."""
    if observations < 4 or observations % 2:
        raise ParamsError(f"audit.observations = {observations} is invalid: it must be an even number >= 4")
    if observations > MAX_AUDIT_OBSERVATIONS:
        raise ParamsError(
            f"audit.observations = {observations} is invalid: it must be at most {MAX_AUDIT_OBSERVATIONS:,}"
        )
    refuse_beyond(
        f"audit.observations = {observations} of games drawing {entries_per_game(audited.model)} values each",
        observations * entries_per_game(audited.model),
        MAX_AUDIT_DRAWS,
        "draws",
        "lower audit.observations",
    )
    chosen = select_backend(backend)
    started = time.perf_counter()
    scores = simulate_scores(audited.model, observations // 2, seed=seed, backend=chosen, progress=progress)
    seconds = time.perf_counter() - started
    timing = {"simulate_s": round(seconds, 3), "observations_per_s": round(observations / max(seconds, 1e-9), 1)}
    return scores, timing


def audit_bgm(
    sampler: str,
    *,
    dataset_size: int,
    batch_size: int,
    epochs: int,
    noise_multiplier: float,
    observations: int,
    delta: float,
    statistics: AuditStatistics = AuditStatistics(),
    epsilon_claimed: float | None = None,
    claim_basis: str | None = None,
    claim_sampler: str = "poisson",
    options: dict[str, Any] | None = None,
    seed: int = 0,
    backend: str = "auto",
    progress: bool = True,
) -> tuple[AuditResult, GameScores]:
    """Audit the BGM run with ``sampler``; the claim defaults to the PLD ε accounted for ``claim_sampler``."""
    sizes = {"dataset_size": dataset_size, "batch_size": batch_size, "noise_multiplier": noise_multiplier}
    audited = audited_sampler(sampler, epochs=epochs, options=options, seed=seed, **sizes)
    steps = audited.steps_per_epoch * epochs
    if epsilon_claimed is None:
        claim = default_claim(claim_sampler, sampler, options, steps=steps, delta=delta, **sizes)
    else:
        claim = Claim(epsilon_claimed, delta, claim_basis or "given")
    started = time.perf_counter()
    scores, timing = simulate_bgm(audited, observations, seed=seed, backend=backend, progress=progress)
    setting = {
        "dataset_size": dataset_size,
        "batch_size": batch_size,
        "epochs": epochs,
        "steps_per_epoch": audited.steps_per_epoch,
        "noise_multiplier": noise_multiplier,
        "options": dict(options or {}),
        "seed": seed,
        "backend": select_backend(backend).name,
        "pair": audited.pair,
        "placement": audited.placement,
    }
    result = conclude(
        scores,
        claim,
        statistics,
        audit="bgm",
        sampler=sampler,
        setting=setting,
        assumptions=bgm_assumptions(audited),
        timing=timing,
    )
    timing = {**timing, "wall_time_s": round(time.perf_counter() - started, 3)}
    return replace(result, timing=timing), scores

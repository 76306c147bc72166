"""Audit of the batched Gaussian mechanism (002 App. A; the Worst-Case threat model) for a
sampler."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dpledger import validation
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


def _check_claim_sampler(claim_sampler: str) -> None:
    validation.one_of(
        "claim sampler",
        claim_sampler,
        CLAIM_ACCOUNTANTS,
        where="audit",
        note=" (or give the claimed epsilon explicitly)",
    )


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
    """ε a ledger would claim: the PLD accountant (pessimistic) for ``claim_sampler`` at q =
    ``sample_rate`` (default B/n)."""
    _check_claim_sampler(claim_sampler)
    rate = batch_size / dataset_size if sample_rate is None else sample_rate
    return pld_epsilon(
        PldRun(noise_multiplier, claim_sampler, 1, rate, dataset_size, batch_size, steps), delta
    )


def bgm_assumptions(audited: AuditedSampler) -> list[str]:
    """What the BGM audit's ε_emp rests on, in sentences for the report."""
    return [
        "Worst-Case threat model: the batched Gaussian mechanism, every batch sum released "
        "(002 App. A).",
        f"Zero-out adjacency; audited pair {audited.pair}.",
        f"Where the record lands under '{audited.sampler}': {audited.placement}.",
        "Scores are exact log likelihood ratios of the pair; "
        "ε_emp is a lower bound on the mechanism's ε only.",
    ]


def simulate_bgm(
    audited: AuditedSampler,
    observations: int,
    *,
    seed: int,
    backend: str = "auto",
    progress: bool = True,
) -> tuple[GameScores, dict[str, float]]:
    """Scores of ``observations`` games (half on D, half on D') and the generation speed."""
    if observations < 4 or observations % 2:
        raise validation.invalid(
            "audit.observations", observations, "it must be an even number >= 4"
        )
    if observations > MAX_AUDIT_OBSERVATIONS:
        raise validation.invalid(
            "audit.observations", observations, f"it must be at most {MAX_AUDIT_OBSERVATIONS:,}"
        )
    refuse_beyond(
        f"audit.observations = {observations} of games drawing {entries_per_game(audited.model)} values each",  # noqa: E501
        observations * entries_per_game(audited.model),
        MAX_AUDIT_DRAWS,
        "draws",
        "lower audit.observations",
    )
    chosen = select_backend(backend)
    started = time.perf_counter()
    scores = simulate_scores(
        audited.model, observations // 2, seed=seed, backend=chosen, progress=progress
    )
    seconds = time.perf_counter() - started
    timing = {
        "simulate_s": round(seconds, 3),
        "observations_per_s": round(observations / max(seconds, 1e-9), 1),
    }
    return scores, timing


@dataclass(frozen=True)
class BgmAudit:
    """What one audit of the batched Gaussian mechanism plays: the sampler with its ``options``
    (e.g. ``sample_rate``, ``last_batch``, ``buffer_size``), the run's sizes and σ, the number of
    games, the statistics, and the claim judged at ``delta``: ``claim`` when given (e.g. the
    ledger's ε), else the PLD ε accounted for ``claim_sampler`` (:meth:`judged_claim`)."""

    sampler: str
    dataset_size: int
    batch_size: int
    epochs: int
    noise_multiplier: float
    observations: int
    delta: float
    statistics: AuditStatistics = AuditStatistics()
    claim: Claim | None = None
    claim_sampler: str = "poisson"
    options: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    backend: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        if self.claim is not None and self.claim.delta != self.delta:
            raise ParamsError(
                f"audit: the claim's delta = {self.claim.delta} is invalid: "
                f"it must equal the audit's delta = {self.delta}"
            )

    def audited(self) -> AuditedSampler:
        """Where the audited record lands under the sampler, and the exact score of the pair."""
        return audited_sampler(
            self.sampler,
            dataset_size=self.dataset_size,
            batch_size=self.batch_size,
            epochs=self.epochs,
            noise_multiplier=self.noise_multiplier,
            options=dict(self.options),
            seed=self.seed,
        )

    def run_setting(self, steps: dict[str, int]) -> dict[str, Any]:
        """The run's sizes and σ as an audit's ``setting`` records them, with its number of
        ``steps`` (keyed as that audit counts them)."""
        return {
            "dataset_size": self.dataset_size,
            "batch_size": self.batch_size,
            "epochs": self.epochs,
            **steps,
            "noise_multiplier": self.noise_multiplier,
        }

    def judged_claim(self, steps: int) -> Claim:
        """The claim given, or the one a ledger would make for ``claim_sampler``: the PLD ε (as
        :func:`accounted_epsilon`) of a run of ``steps`` steps, at q = a Poisson sampler's own
        ``sample_rate`` when the claim is Poisson too, else B/n."""
        if self.claim is not None:
            return self.claim
        own_rate = self.options.get("sample_rate")
        if self.claim_sampler == "poisson" and self.sampler == "poisson" and own_rate is not None:
            rate = float(own_rate)
        else:
            rate = self.batch_size / self.dataset_size
        _check_claim_sampler(self.claim_sampler)
        run = PldRun(
            self.noise_multiplier,
            self.claim_sampler,
            1,
            rate,
            self.dataset_size,
            self.batch_size,
            steps,
        )
        epsilon = pld_epsilon(run, self.delta)
        q = (
            "B/n"
            if rate == self.batch_size / self.dataset_size
            else f"{rate:g} (the sampler's sample_rate)"
        )
        basis = f"PLD accountant assuming '{self.claim_sampler}' sampling, q = {q}, {steps} steps"
        return Claim(epsilon, self.delta, basis)


def audit_bgm(config: BgmAudit) -> tuple[AuditResult, GameScores]:
    """Audit the BGM run ``config`` plays; the claim defaults to the PLD ε accounted for its
    ``claim_sampler``."""
    audited = config.audited()
    claim = config.judged_claim(audited.steps_per_epoch * config.epochs)
    started = time.perf_counter()
    scores, timing = simulate_bgm(
        audited,
        config.observations,
        seed=config.seed,
        backend=config.backend,
        progress=config.progress,
    )
    setting = {
        **config.run_setting({"steps_per_epoch": audited.steps_per_epoch}),
        "options": dict(config.options),
        "seed": config.seed,
        "backend": select_backend(config.backend).name,
        "pair": audited.pair,
        "placement": audited.placement,
    }
    result = conclude(
        scores,
        claim,
        config.statistics,
        audit="bgm",
        sampler=config.sampler,
        setting=setting,
        assumptions=bgm_assumptions(audited),
        timing=timing,
    )
    timing = {**timing, "wall_time_s": round(time.perf_counter() - started, 3)}
    return replace(result, timing=timing), scores

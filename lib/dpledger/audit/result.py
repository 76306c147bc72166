"""The record of one audit: ε_emp beside the claim, the verdict, and what the numbers rest on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dpledger.audit.estimate import AuditStatistics, EpsilonEstimate, clopper_pearson_upper
from dpledger.audit.simulate import GameScores
from dpledger.audit.verdict import Verdict, judge


@dataclass(frozen=True)
class AuditResult:
    """One audit. ``observations`` counts games on D and D' together (2 × games per side)."""

    audit: str
    sampler: str
    epsilon_emp: float
    epsilon_claimed: float
    claim_basis: str
    verdict: str
    observations: int
    confidence: float
    delta: float
    threshold_method: str
    valid: bool
    estimate: EpsilonEstimate
    judgement: Verdict
    setting: dict[str, Any]
    assumptions: list[str]
    timing: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The flat fields the CLI prints and the stage writes to metrics/audit.json."""
        return {
            "epsilon_emp": self.epsilon_emp,
            "epsilon_claimed": self.epsilon_claimed,
            "verdict": self.verdict,
            "observations": self.observations,
            "confidence": self.confidence,
            "delta": self.delta,
            "threshold_method": self.threshold_method,
            "threshold_valid": self.valid,
            "sampler": self.sampler,
            "audit": self.audit,
            "point_estimate": self.judgement.point_estimate,
            "observations_needed": self.judgement.observations_needed,
            **{key: value for key, value in self.timing.items()},
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Claim:
    """The (ε, δ) claim an audit judges, and where ε comes from (e.g. the ledger, or the PLD accountant)."""

    epsilon: float
    delta: float
    basis: str


def conclude(
    scores: GameScores,
    claim: Claim,
    statistics: AuditStatistics,
    *,
    audit: str,
    sampler: str,
    setting: dict[str, Any],
    assumptions: list[str],
    timing: dict[str, float],
) -> AuditResult:
    """Estimate ε_emp from the game scores and judge it against the claim."""
    estimate = statistics.estimate(scores.present, scores.absent, claim.delta)
    judgement = judge(
        estimate.epsilon,
        claim.epsilon,
        scores.present,
        scores.absent,
        delta=claim.delta,
        confidence=statistics.confidence,
        valid=estimate.valid,
    )
    return AuditResult(
        audit=audit,
        sampler=sampler,
        epsilon_emp=estimate.epsilon,
        epsilon_claimed=float(claim.epsilon),
        claim_basis=claim.basis,
        verdict=judgement.verdict,
        observations=2 * scores.games_per_side,
        confidence=statistics.confidence,
        delta=claim.delta,
        threshold_method=statistics.method,
        valid=estimate.valid,
        estimate=estimate,
        judgement=judgement,
        setting=setting,
        assumptions=assumptions,
        timing=timing,
    )


def epsilon_versus_observations(
    scores: GameScores, delta: float, statistics: AuditStatistics, points: int = 6
) -> list[tuple[int, float]]:
    """ε_emp measured on prefixes of the games (N/2^j, ..., N): how the bound grew with N."""
    curve = []
    for size in sorted({max(8, scores.games_per_side >> j) for j in range(points)}):
        prefix = scores.prefix(min(size, scores.games_per_side))
        curve.append((2 * prefix.games_per_side, statistics.estimate(prefix.present, prefix.absent, delta).epsilon))
    return curve


def tradeoff_points(scores: GameScores, confidence: float, points: int = 400) -> np.ndarray:
    """Empirical trade-off curve: rows (FPR, FNR, FPR upper, FNR upper) at thresholds spread over the
    absent scores' upper tail on a log scale (per-threshold bounds, for display)."""
    games = scores.games_per_side
    absent_sorted, present_sorted = np.sort(scores.absent), np.sort(scores.present)
    counts = np.unique(np.round(np.geomspace(1, games - 1, points)).astype(np.int64))
    thresholds = absent_sorted[games - 1 - counts]
    false_negatives = np.searchsorted(present_sorted, thresholds, side="right")
    alpha_each = (1.0 - confidence) / 2.0
    return np.column_stack(
        [
            counts / games,
            false_negatives / games,
            clopper_pearson_upper(counts, games, alpha_each),
            clopper_pearson_upper(false_negatives, games, alpha_each),
        ]
    )

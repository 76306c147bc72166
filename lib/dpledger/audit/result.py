"""The record of one audit: ε_emp beside the claim, the verdict, and what the numbers rest on."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dpledger.audit.estimate import AuditStatistics, EpsilonEstimate, clopper_pearson_upper
from dpledger.audit.simulate import GameScores
from dpledger.audit.verdict import Verdict, judge


@dataclass(frozen=True)
class Claim:
    """The (ε, δ) claim an audit judges, and where ε comes from (e.g. the ledger, or the PLD
    accountant)."""

    epsilon: float
    delta: float
    basis: str


# The facts :meth:`AuditResult.summary` starts with (the CLI's lines, metrics/audit.json's first
# keys).
SUMMARY_FACTS = (
    "epsilon_emp",
    "epsilon_claimed",
    "verdict",
    "observations",
    "confidence",
    "delta",
    "threshold_method",
)


@dataclass(frozen=True)
class AuditResult:
    """One audit: the claim judged, the ε_emp estimate, the verdict, and what the numbers rest on,
    each fact held once (ε_emp and the threshold method in ``estimate``, the claimed ε and δ in
    ``claim``, the verdict in ``judgement``). ``observations`` counts games on D and D' together (2
    × games per side; a ``split`` estimate evaluates on part of them)."""

    audit: str
    sampler: str
    claim: Claim
    estimate: EpsilonEstimate
    judgement: Verdict
    observations: int
    setting: dict[str, Any]
    assumptions: list[str]
    timing: dict[str, float] = field(default_factory=dict)

    def facts(self) -> dict[str, Any]:
        """The flat facts, by the names metrics/audit.json gives them, in its order."""
        return {
            "audit": self.audit,
            "sampler": self.sampler,
            "epsilon_emp": self.estimate.epsilon,
            "epsilon_claimed": float(self.claim.epsilon),
            "claim_basis": self.claim.basis,
            "verdict": self.judgement.verdict,
            "observations": self.observations,
            "confidence": self.estimate.confidence,
            "delta": self.claim.delta,
            "threshold_method": self.estimate.method,
            "valid": self.estimate.valid,
        }

    def summary(self) -> dict[str, Any]:
        """The flat fields the CLI prints and the stage writes to metrics/audit.json."""
        facts = self.facts()
        return {
            **{key: facts[key] for key in SUMMARY_FACTS},
            "threshold_valid": facts["valid"],
            "sampler": self.sampler,
            "audit": self.audit,
            "point_estimate": self.judgement.point_estimate,
            "observations_needed": self.judgement.observations_needed,
            **self.timing,
        }

    def to_dict(self) -> dict[str, Any]:
        """The whole record (artifacts/audit/audit.json): the flat facts, then the estimate, the
        judgement and the setting in full."""
        return {
            **self.facts(),
            "estimate": asdict(self.estimate),
            "judgement": asdict(self.judgement),
            "setting": copy.deepcopy(self.setting),
            "assumptions": list(self.assumptions),
            "timing": dict(self.timing),
        }


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
    judgement = judge(estimate, claim.epsilon, scores.present, scores.absent)
    observations = 2 * scores.games_per_side
    return AuditResult(
        audit, sampler, claim, estimate, judgement, observations, setting, assumptions, timing
    )


def epsilon_versus_observations(
    scores: GameScores, delta: float, statistics: AuditStatistics, points: int = 6
) -> list[tuple[int, float]]:
    """ε_emp measured on prefixes of the games (N/2^j, ..., N): how the bound grew with N."""
    curve = []
    for size in sorted({max(8, scores.games_per_side >> j) for j in range(points)}):
        prefix = scores.prefix(min(size, scores.games_per_side))
        curve.append(
            (
                2 * prefix.games_per_side,
                statistics.estimate(prefix.present, prefix.absent, delta).epsilon,
            )
        )
    return curve


def tradeoff_points(scores: GameScores, confidence: float, points: int = 400) -> np.ndarray:
    """Empirical trade-off curve: rows (FPR, FNR, FPR upper, FNR upper) at thresholds spread over
    the absent scores' upper tail on a log scale (per-threshold bounds, for display)."""
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

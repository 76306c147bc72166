"""The verdict of an audit against the ledger's claim, and power planning: what N would settle it.

- ``contradicted``: the valid lower bound ε_emp exceeds the claimed ε (the claim is false with the
  stated confidence). An invalid threshold method (``max``) never yields this verdict alone: it is
  reported as ``inconclusive`` with a note.
- ``inconclusive``: ε_emp ≤ claim, but the point estimate (the larger of ε_emp and the best raw
  rates, each from ≥ 10 games) exceeds the claim: more games may settle it (see
  ``observations_needed``).
- ``consistent``: not even the point estimate exceeds the claim at this N.

Projection (power planning): the rates observed at the count-grid thresholds, with the counts
scaled to N' = c·N and the Bonferroni bound recomputed at N'. Thresholds farther in the tails than
1/N cannot be seen at N, so the projection understates how ε_emp grows (it is a floor).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpledger.audit.estimate import (
    EpsilonEstimate,
    clopper_pearson_upper,
    count_grid,
    epsilon_from_rates,
)

MIN_POINT_COUNT = 10
PROJECTION_FACTORS = tuple(2**j for j in range(0, 21, 2))


@dataclass(frozen=True)
class Verdict:
    """ε_emp against the claim; ``observations_needed`` is the projected N at which ε_emp exceeds
    it."""

    verdict: str
    point_estimate: float
    observations_needed: int | None
    projection: list[tuple[int, float]]
    note: str


def _grid_rates(
    present: np.ndarray, absent: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(false positives, false negatives, counts grid) at the grid thresholds of both sides."""
    games = present.shape[0]
    present_sorted, absent_sorted = np.sort(present), np.sort(absent)
    counts = count_grid(games)
    small_fpr_thresholds = absent_sorted[games - 1 - counts]
    small_fnr_thresholds = present_sorted[counts]
    fp = np.concatenate(
        [counts, games - np.searchsorted(absent_sorted, small_fnr_thresholds, side="left")]
    )
    fn = np.concatenate(
        [np.searchsorted(present_sorted, small_fpr_thresholds, side="right"), counts]
    )
    return fp.astype(np.float64), fn.astype(np.float64), counts


def point_estimate(present: np.ndarray, absent: np.ndarray, delta: float) -> float:
    """Best ε from raw rates at grid thresholds whose counts are all ≥ MIN_POINT_COUNT (no
    bound)."""
    games = present.shape[0]
    fp, fn, _ = _grid_rates(present, absent)
    usable = (np.minimum(fp, fn) >= MIN_POINT_COUNT) & (
        np.maximum(fp, fn) <= games - MIN_POINT_COUNT
    )
    if not np.any(usable):
        return 0.0
    return float(np.max(epsilon_from_rates(fp[usable] / games, fn[usable] / games, delta)))


def project_epsilon(
    present: np.ndarray,
    absent: np.ndarray,
    *,
    delta: float,
    confidence: float,
    factors: tuple[int, ...] = PROJECTION_FACTORS,
) -> list[tuple[int, float]]:
    """(observations N' = c·N, projected Bonferroni ε_emp at N') for each factor c."""
    games = present.shape[0]
    fp, fn, _ = _grid_rates(present, absent)
    projection = []
    for factor in factors:
        scaled = games * factor
        tried = 2 * count_grid(scaled).shape[0]
        alpha_each = (1.0 - confidence) / (2.0 * tried)
        eps = epsilon_from_rates(
            clopper_pearson_upper(fp * factor, scaled, alpha_each),
            clopper_pearson_upper(fn * factor, scaled, alpha_each),
            delta,
        )
        projection.append((2 * scaled, float(np.max(eps))))
    return projection


def judge(
    estimate: EpsilonEstimate, epsilon_claimed: float, present: np.ndarray, absent: np.ndarray
) -> Verdict:
    """The verdict of ``estimate``'s ε_emp (a lower bound at its confidence when it is valid)
    against ``epsilon_claimed``, from the scores it was estimated from."""
    epsilon_emp, delta, valid = estimate.epsilon, estimate.delta, estimate.valid
    best = max(point_estimate(present, absent, delta), epsilon_emp)
    projection = project_epsilon(present, absent, delta=delta, confidence=estimate.confidence)
    needed = next((n for n, eps in projection if eps > epsilon_claimed), None)
    if epsilon_emp > epsilon_claimed and valid:
        return Verdict(
            "contradicted", best, needed, projection, "the lower bound on ε exceeds the claim"
        )
    if epsilon_emp > epsilon_claimed:
        note = (
            "ε_emp exceeds the claim, "
            "but the uncorrected 'max' threshold method is not a valid bound"
        )
        return Verdict("inconclusive", best, needed, projection, note)
    if best > epsilon_claimed:
        note = "the point estimate exceeds the claim; more observations may settle it"
        return Verdict("inconclusive", best, needed, projection, note)
    note = (
        "no evidence against the claim at this number of observations "
        "(an audit cannot prove a claim)"
    )
    return Verdict("consistent", best, needed, projection, note)

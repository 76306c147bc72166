"""Empirical epsilon from the scores of a distinguishing game (002 §3.1, App. B Alg. 5).

Scores of games run on D (target present) and D' (target zeroed out) are thresholded: "present"
iff score > τ. At a threshold, Clopper–Pearson upper bounds ᾱ (FPR) and β̄ (FNR) that hold jointly
with probability ≥ ``confidence`` give the lower bound (002 Eq. 1)

    ε_emp = max{ ln((1 − ᾱ − δ)/β̄), ln((1 − β̄ − δ)/ᾱ), 0 }.

Choosing τ on the data the bounds are computed from is what makes the paper's estimate optimistic.
Three threshold methods:

- ``bonferroni`` (valid, default): thresholds are the order statistics of one side's scores at a
  data-independent geometric grid of counts k (``τ_k`` = the score with exactly k scores of D'
  above it). ``1 − F(τ_k)`` is Beta(k+1, R−k)-distributed, so the Clopper–Pearson bound of count k
  is exact for this data-dependent threshold, and the other side's count at ``τ_k`` is Binomial
  given ``τ_k`` (the two sides are independent). A union bound over the 2 bounds of every grid
  threshold makes the maximum a valid lower bound.
- ``split`` (valid): a held-out part of the games picks one threshold; the rest evaluates it.
- ``max`` (NOT valid; the paper's practice): every threshold, each with the per-threshold bound;
  the maximum over thresholds over-states ε_emp (measure it with ``dpledger audit selfcheck``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.special import betaincinv

from dpledger import validation
from dpledger.errors import ParamsError

THRESHOLD_METHODS: tuple[str, ...] = ("bonferroni", "split", "max")
GRID_RATIO = 2.0


@dataclass(frozen=True)
class EpsilonEstimate:
    """An empirical lower bound on ε and the threshold that gave it.

    ``fpr_upper``/``fnr_upper`` are the Clopper–Pearson bounds at the chosen threshold; ``valid``
    says whether the bound holds at ``confidence`` (False only for ``max``).
    """

    epsilon: float
    delta: float
    confidence: float
    method: str
    valid: bool
    threshold: float
    false_positives: float
    false_negatives: float
    fpr_upper: float
    fnr_upper: float
    games_per_side: int
    thresholds_tried: int


@dataclass(frozen=True)
class AuditStatistics:
    """How an audit bounds ε_emp from its game scores: the confidence of the lower bound, the
    threshold method (:data:`THRESHOLD_METHODS`) and the held-out fraction of ``split``. δ comes
    with the claim judged (:class:`dpledger.audit.result.Claim`)."""

    confidence: float = 0.95
    method: str = "bonferroni"
    split_fraction: float = 0.2

    def estimate(self, present: np.ndarray, absent: np.ndarray, delta: float) -> EpsilonEstimate:
        """:func:`estimate_epsilon` with these settings at ``delta``."""
        return estimate_epsilon(
            present,
            absent,
            delta=delta,
            confidence=self.confidence,
            method=self.method,
            split_fraction=self.split_fraction,
        )


def clopper_pearson_upper(
    count: np.ndarray | float, trials: int | float, alpha: float
) -> np.ndarray:
    """One-sided upper (1 − alpha) Clopper–Pearson bound on a rate from ``count`` of ``trials``.

    Non-integer counts are allowed (power planning scales observed counts); count ≥ trials gives 1.
    """
    count = np.asarray(count, dtype=np.float64)
    safe = np.minimum(count, trials - 1)
    bound = betaincinv(safe + 1.0, trials - safe, 1.0 - alpha)
    return np.where(count >= trials, 1.0, bound)


def epsilon_from_rates(fpr_upper: np.ndarray, fnr_upper: np.ndarray, delta: float) -> np.ndarray:
    """002 Eq. 1: ε implied by (FPR, FNR) upper bounds; a term with non-positive numerator is
    skipped."""
    fpr_upper = np.asarray(fpr_upper, dtype=np.float64)
    fnr_upper = np.asarray(fnr_upper, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        small_fnr = np.log((1.0 - fpr_upper - delta) / fnr_upper)
        small_fpr = np.log((1.0 - fnr_upper - delta) / fpr_upper)
    small_fnr = np.where((1.0 - fpr_upper - delta > 0) & (fnr_upper > 0), small_fnr, 0.0)
    small_fpr = np.where((1.0 - fnr_upper - delta > 0) & (fpr_upper > 0), small_fpr, 0.0)
    return np.maximum(np.maximum(small_fnr, small_fpr), 0.0)


def count_grid(games_per_side: int, ratio: float = GRID_RATIO) -> np.ndarray:
    """Data-independent counts 0, 1, 2, ... growing geometrically by ``ratio`` up to R − 1."""
    top = max(games_per_side - 1, 0)
    steps = int(np.ceil(np.log(max(top, 1)) / np.log(ratio))) + 1
    grid = np.unique(np.round(ratio ** np.arange(steps)).astype(np.int64))
    return np.unique(np.concatenate([[0], grid[grid <= top]]))


@dataclass(frozen=True)
class _Candidate:
    epsilon: float
    threshold: float
    false_positives: float
    false_negatives: float
    fpr_upper: float
    fnr_upper: float


def _small_fpr_side(
    absent_sorted: np.ndarray,
    present_sorted: np.ndarray,
    counts: np.ndarray,
    alpha_each: float,
    delta: float,
    floor: float = 0.0,
) -> _Candidate:
    """Best threshold among τ_k = the score with k absent scores above it, for k in ``counts``.

    Every k is evaluated unless ``counts`` is long; then counts are taken in growing blocks and the
    search stops once ln(R/k) (an upper bound on any later term, since ᾱ ≥ k/R) cannot beat the best
    or ``floor`` (the best already found elsewhere).
    """
    games = absent_sorted.shape[0]
    best = _Candidate(0.0, float("inf"), 0.0, 0.0, 1.0, 1.0)
    start = 0
    block = 4096
    while start < counts.shape[0]:
        if counts[start] > 0 and np.log(games / counts[start]) <= max(best.epsilon, floor):
            break
        chunk = counts[start : start + block]
        thresholds = absent_sorted[games - 1 - chunk]
        false_negatives = np.searchsorted(present_sorted, thresholds, side="right")
        fpr_upper = clopper_pearson_upper(chunk, games, alpha_each)
        fnr_upper = clopper_pearson_upper(false_negatives, present_sorted.shape[0], alpha_each)
        eps = epsilon_from_rates(fpr_upper, fnr_upper, delta)
        i = int(np.argmax(eps))
        if eps[i] > best.epsilon:
            best = _Candidate(
                float(eps[i]),
                float(thresholds[i]),
                float(chunk[i]),
                float(false_negatives[i]),
                float(fpr_upper[i]),
                float(fnr_upper[i]),
            )
        start += block
        block *= 4
    return best


def _best_threshold(
    present: np.ndarray, absent: np.ndarray, counts: np.ndarray, alpha_each: float, delta: float
) -> _Candidate:
    """Best of both sides: small FPR (thresholds from absent scores) and, mirrored, small FNR."""
    present_sorted = np.sort(present)
    absent_sorted = np.sort(absent)
    small_fpr = _small_fpr_side(absent_sorted, present_sorted, counts, alpha_each, delta)
    mirrored = _small_fpr_side(
        -present_sorted[::-1],
        -absent_sorted[::-1],
        counts,
        alpha_each,
        delta,
        floor=small_fpr.epsilon,
    )
    small_fnr = _Candidate(
        mirrored.epsilon,
        -mirrored.threshold,
        mirrored.false_negatives,
        mirrored.false_positives,
        mirrored.fnr_upper,
        mirrored.fpr_upper,
    )
    return small_fpr if small_fpr.epsilon >= small_fnr.epsilon else small_fnr


def _check_inputs(present: np.ndarray, absent: np.ndarray, delta: float, confidence: float) -> None:
    if present.ndim != 1 or absent.ndim != 1 or present.shape != absent.shape:
        raise ParamsError(
            "audit: scores must be two 1-D arrays of equal length, "
            f"got {present.shape} and {absent.shape}"
        )
    validation.at_least("games per side", present.shape[0], 2, where="audit")
    validation.within("delta", delta, 0, 1, where="audit")
    validation.within("confidence", confidence, 0.5, 1, where="audit")
    if not (np.all(np.isfinite(present)) and np.all(np.isfinite(absent))):
        raise ParamsError("audit: scores contain NaN or infinity; the score function overflowed")


def estimate_epsilon(
    present: np.ndarray,
    absent: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    method: str = "bonferroni",
    split_fraction: float = 0.2,
) -> EpsilonEstimate:
    """ε_emp from scores of games on D (``present``) and D' (``absent``), one score per game.

    ``present[i]`` and ``absent[i]`` must be independent; the split method uses the first
    ``split_fraction`` of each side to pick the threshold and the rest to bound the rates.
    """
    present = np.asarray(present, dtype=np.float64)
    absent = np.asarray(absent, dtype=np.float64)
    _check_inputs(present, absent, delta, confidence)
    alpha = 1.0 - confidence
    games = present.shape[0]
    if method == "max":
        counts = np.arange(games, dtype=np.int64)
        best = _best_threshold(present, absent, counts, alpha / 2.0, delta)
        return _estimate(best, delta, confidence, method, False, games, 2 * games)
    if method == "bonferroni":
        counts = count_grid(games)
        tried = 2 * counts.shape[0]
        best = _best_threshold(present, absent, counts, alpha / (2.0 * tried), delta)
        return _estimate(best, delta, confidence, method, True, games, tried)
    if method == "split":
        return _split_estimate(present, absent, delta, confidence, split_fraction)
    raise validation.invalid(
        "audit.threshold", method, f"allowed values are {', '.join(THRESHOLD_METHODS)}"
    )


def _estimate(
    best: _Candidate,
    delta: float,
    confidence: float,
    method: str,
    valid: bool,
    games: int,
    tried: int,
) -> EpsilonEstimate:
    return EpsilonEstimate(
        **asdict(best),
        delta=delta,
        confidence=confidence,
        method=method,
        valid=valid,
        games_per_side=games,
        thresholds_tried=tried,
    )


def _split_estimate(
    present: np.ndarray, absent: np.ndarray, delta: float, confidence: float, split_fraction: float
) -> EpsilonEstimate:
    """Choose a side and a count level on held-out games, then bound the rates at that one threshold
    on the remaining games.

    On the held-out part every grid count k (both sides) is scored by the bound it would give at the
    evaluation size (counts scaled up); the chosen count, scaled to the evaluation games, fixes the
    threshold as an order statistic of the evaluation games, whose bound is then exact.
    """
    validation.within("audit.split_fraction", split_fraction, 0, 1)
    games = present.shape[0]
    held = int(round(games * split_fraction))
    evaluated = games - held
    if held < 2 or evaluated < 2:
        raise ParamsError(
            f"audit: {games} games per side are too few to split at fraction {split_fraction}"
        )
    alpha_each = (1.0 - confidence) / 2.0
    scale = evaluated / held
    sides = {
        "small_fpr": (
            np.sort(absent[:held]),
            np.sort(present[:held]),
            np.sort(absent[held:]),
            np.sort(present[held:]),
        ),
        "small_fnr": (
            -np.sort(present[:held])[::-1],
            -np.sort(absent[:held])[::-1],
            -np.sort(present[held:])[::-1],
            -np.sort(absent[held:])[::-1],
        ),
    }
    counts = count_grid(held)
    choice, best_predicted, best_count = "small_fpr", -1.0, 0
    for side, (held_a, held_p, _, _) in sides.items():
        thresholds = held_a[held - 1 - counts]
        other = np.searchsorted(held_p, thresholds, side="right")
        predicted = epsilon_from_rates(
            clopper_pearson_upper(counts * scale, evaluated, alpha_each),
            clopper_pearson_upper(other * scale, evaluated, alpha_each),
            delta,
        )
        i = int(np.argmax(predicted))
        if predicted[i] > best_predicted:
            choice, best_predicted, best_count = side, float(predicted[i]), int(counts[i])
    count = min(int(np.floor(best_count * scale)), evaluated - 1)
    eval_a, eval_p = sides[choice][2], sides[choice][3]
    threshold = eval_a[evaluated - 1 - count]
    other = int(np.searchsorted(eval_p, threshold, side="right"))
    bound_a = float(clopper_pearson_upper(count, evaluated, alpha_each))
    bound_p = float(clopper_pearson_upper(other, evaluated, alpha_each))
    if choice == "small_fpr":
        best = _Candidate(0.0, float(threshold), float(count), float(other), bound_a, bound_p)
    else:
        best = _Candidate(0.0, -float(threshold), float(other), float(count), bound_p, bound_a)
    eps = float(epsilon_from_rates(best.fpr_upper, best.fnr_upper, delta))
    best = _Candidate(
        eps,
        best.threshold,
        best.false_positives,
        best.false_negatives,
        best.fpr_upper,
        best.fnr_upper,
    )
    return _estimate(best, delta, confidence, "split", True, games, 1)

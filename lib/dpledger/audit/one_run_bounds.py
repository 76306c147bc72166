"""Lower bounds on ε from ONE run: m canaries, each in with probability 1/2, guessed by score.

The auditor guesses "in" for the ``guesses`` highest-scored canaries; ``correct`` of them really
were in. Two tests of the claim "the run is (ε, δ)-DP for each canary":

- ``steinke`` (Steinke, Nasr, Jagielski, NeurIPS 2023, arXiv 2305.08846, Thm 5.2): under the claim,
  P[correct ≥ v] ≤ β + 2mδ·α, with β = P[Binomial(r, e^ε/(1+e^ε)) ≥ v] and α = max_{1≤i≤v} P[v − i ≤
  Binomial(r, e^ε/(1+e^ε)) < v] / i.
- ``fdp`` (Mahloujifar, Melis, Chaudhuri, ICML 2025, arXiv 2410.22235, the capped recursion of their
  Alg. "audit_rh"): a claim stated as a trade-off function f is refuted when the recursion on the
  (TPR, FPR) pair that f allows for the guesses falls short of what was observed. The family of f is
  ``eps-delta`` (the (ε, δ)-DP trade-off f(x) = max(0, 1 − δ − e^ε x, e^{−ε}(1 − δ − x)): refuting
  it refutes the (ε, δ) claim itself) or ``gaussian`` (μ-GDP at the μ whose (ε, δ) curve passes
  through the claim, as jax_privacy reports it: refuting it refutes "the run is that Gaussian", a
  stronger claim).

ε_emp is the largest ε whose claim the counts refute at significance 1 − confidence. The number of
guesses r is not chosen after seeing the data: either every r of a data-independent grid is tested
with a Bonferroni share of the significance, or a held-out part of the canaries picks r (``split``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from dp_accounting import get_sigma_gaussian
from scipy.optimize import brentq
from scipy.special import expit
from scipy.stats import binom, norm

from dpledger.audit.estimate import count_grid
from dpledger.errors import ParamsError

BOUNDS = ("fdp", "steinke")
FDP_FAMILIES = ("eps-delta", "gaussian")
ONE_RUN_THRESHOLDS = ("bonferroni", "split")
EPSILON_TOLERANCE = 1e-4
EPSILON_CAP = 100.0  # beyond it every test of a finite claim is refuted or numbers underflow


def steinke_p_value(
    canaries: int, guesses: int, correct: int, epsilon: float, delta: float
) -> float:
    """Probability bound of ``correct`` or more right guesses out of ``guesses`` under (ε, δ)-DP
    (2305.08846 Thm 5.2); the claim is refuted at significance s when this is ≤ s."""
    if correct <= 0:
        return 1.0
    p = float(expit(epsilon))
    beta = float(binom.sf(correct - 1, guesses, p))
    if delta == 0:
        return beta
    i = np.arange(1, correct + 1)
    alpha = float(np.max((binom.sf(correct - i - 1, guesses, p) - beta) / i))
    return min(beta + 2.0 * canaries * delta * alpha, 1.0)


def _inverse_blow_up(family: str, epsilon: float, delta: float) -> Callable[[float], float]:
    """x ↦ the least FPR at which a test under the claimed trade-off f reaches TPR x (inverse of 1 −
    f)."""
    if family == "eps-delta":
        grow, shrink = math.exp(epsilon), math.exp(-epsilon)
        return lambda x: max(0.0, (x - delta) * shrink, 1.0 - delta - grow * (1.0 - x))
    mu = 1.0 / get_sigma_gaussian(epsilon, delta)
    return lambda x: float(norm.cdf(norm.ppf(x) - mu))


def fdp_refutes(
    canaries: int, guesses: int, correct: int, significance: float, inverse: Callable
) -> bool:
    """Whether ``correct`` of ``guesses`` right refutes the trade-off whose inverse blow-up is
    ``inverse`` at ``significance`` (2410.22235, the capped recursion): walk down from the observed
    counts, raising the FPR to what f requires for the TPR reached; the claim survives when the pair
    can reach r/m."""
    if correct <= 0:
        return False
    tpr = significance * correct / canaries
    fpr = significance * (guesses - correct) / canaries
    for i in range(correct - 1, -1, -1):
        raised = max(fpr, inverse(tpr))
        if raised == fpr:
            break
        tpr = min(tpr + i / (guesses - i) * (raised - fpr), 1.0)
        fpr = raised
    return tpr + fpr > guesses / canaries


def _refutes(
    bound: str,
    family: str,
    canaries: int,
    guesses: int,
    correct: int,
    significance: float,
    delta: float,
):
    if bound == "steinke":
        return lambda eps: steinke_p_value(canaries, guesses, correct, eps, delta) <= significance
    return lambda eps: fdp_refutes(
        canaries, guesses, correct, significance, _inverse_blow_up(family, eps, delta)
    )


def epsilon_refuted(
    bound: str,
    canaries: int,
    guesses: int,
    correct: int,
    significance: float,
    delta: float,
    family: str = "eps-delta",
) -> float:
    """The largest ε whose claim ``correct`` right out of ``guesses`` refutes (0 when not even ε = 0
    is)."""
    refutes = _refutes(bound, family, canaries, guesses, correct, significance, delta)
    if guesses <= 0 or not refutes(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while refutes(high):
        low, high = high, 2.0 * high
        if high > EPSILON_CAP:
            return EPSILON_CAP
    return float(
        brentq(lambda eps: 0.5 if refutes(eps) else -0.5, low, high, xtol=EPSILON_TOLERANCE)
    )


@dataclass(frozen=True)
class OneRunEstimate:
    """ε_emp of one run and how it was reached: ``guesses`` top-scored canaries called "in",
    ``correct`` of them right, out of ``canaries`` evaluated; valid at ``confidence`` (the threshold
    rule keeps it valid)."""

    epsilon: float
    bound: str
    family: str
    threshold: str
    confidence: float
    delta: float
    canaries: int
    guesses: int
    correct: int
    guesses_tried: int


def _correct_at(scores: np.ndarray, included: np.ndarray, guesses: np.ndarray) -> np.ndarray:
    """Right guesses among the top-r scores for each r in ``guesses`` (ties in a fixed order)."""
    order = np.argsort(-scores, kind="stable")
    hits = np.concatenate([[0], np.cumsum(included[order])])
    return hits[guesses]


def guess_grid(canaries: int) -> np.ndarray:
    """Data-independent numbers of guesses: 1, 2, 4, ... (the audits' count grid) and m."""
    grid = count_grid(canaries + 1)
    return np.unique(np.append(grid[grid > 0], canaries))


def one_run_epsilon(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    bound: str = "fdp",
    family: str = "eps-delta",
    threshold: str = "bonferroni",
    split_fraction: float = 0.5,
) -> OneRunEstimate:
    """ε_emp from the canaries' ``scores`` (higher: more likely in) and their true memberships."""
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    _check(scores, included, delta, confidence, bound, family, threshold)
    significance = 1.0 - confidence
    if threshold == "bonferroni":
        return _best_of_grid(scores, included, delta, confidence, bound, family, significance)
    if not 0.0 < split_fraction < 1.0:
        raise ParamsError(
            f"audit.one_run.split_fraction = {split_fraction} is invalid: it must be in (0, 1)"
        )
    held = int(round(scores.size * split_fraction))
    if held < 2 or scores.size - held < 2:
        raise ParamsError(
            f"audit.one_run: {scores.size} canaries are too few to split at {split_fraction}"
        )
    # The held-out canaries pick a fraction of guesses; the rest are judged at it.
    chosen = _best_of_grid(
        scores[:held], included[:held], delta, confidence, bound, family, significance
    )
    rest, rest_in = scores[held:], included[held:]
    guesses = max(1, int(round(chosen.guesses * rest.size / held)))
    correct = int(_correct_at(rest, rest_in, np.array([guesses]))[0])
    eps = epsilon_refuted(bound, rest.size, guesses, correct, significance, delta, family)
    return OneRunEstimate(
        eps, bound, family, "split", confidence, delta, rest.size, guesses, correct, 1
    )


def _best_of_grid(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    confidence: float,
    bound: str,
    family: str,
    significance: float,
) -> OneRunEstimate:
    """Every r of :func:`guess_grid` tested at significance / (number of r): the best ε is valid."""
    canaries = scores.size
    grid = guess_grid(canaries)
    correct = _correct_at(scores, included, grid)
    share = significance / grid.size
    best = (0.0, int(grid[0]), int(correct[0]))
    for guesses, right in zip(grid.tolist(), correct.tolist()):
        if right / guesses <= expit(best[0]):
            continue  # a precision at or below e^ε/(1+e^ε) cannot refute a claim above the best ε
        eps = epsilon_refuted(bound, canaries, guesses, right, share, delta, family)
        if eps > best[0]:
            best = (eps, guesses, right)
    return OneRunEstimate(
        best[0],
        bound,
        family,
        "bonferroni",
        confidence,
        delta,
        canaries,
        best[1],
        best[2],
        int(grid.size),
    )


def _check(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    confidence: float,
    bound: str,
    family: str,
    threshold: str,
) -> None:
    if scores.ndim != 1 or scores.shape != included.shape or scores.size < 2:
        raise ParamsError(
            f"audit.one_run: scores {scores.shape} and memberships {included.shape} must match"
        )
    if not np.all(np.isfinite(scores)):
        raise ParamsError(
            "audit.one_run: scores contain NaN or infinity (a non-finite noisy sum was released)"
        )
    if not 0.0 < delta < 1.0:
        raise ParamsError(f"audit.one_run: delta = {delta} is invalid: it must be in (0, 1)")
    if not 0.5 < confidence < 1.0:
        raise ParamsError(
            f"audit.one_run.confidence = {confidence} is invalid: it must be in (0.5, 1)"
        )
    for key, value, allowed in (
        ("bound", bound, BOUNDS),
        ("family", family, FDP_FAMILIES),
        ("threshold", threshold, ONE_RUN_THRESHOLDS),
    ):
        if value not in allowed:
            raise ParamsError(
                f"audit.one_run.{key} = {value!r} is invalid: "
                f"allowed values are {', '.join(allowed)}"
            )


def ceiling_epsilon(
    included: np.ndarray,
    *,
    bound: str,
    family: str,
    delta: float,
    confidence: float,
    threshold: str,
    split_fraction: float,
) -> float:
    """The most ε_emp this audit could show, whatever the run: every "in" guess right while in
    canaries remain, at the best r it may use (the grid with its Bonferroni share, or any r of the
    judged part for ``split``). A claim above it cannot be refuted by these canaries."""
    included = np.asarray(included, dtype=bool)
    significance = 1.0 - confidence
    if threshold == "bonferroni":
        judged, grid = included, guess_grid(included.size)
        significance /= grid.size
    else:
        judged = included[int(round(included.size * split_fraction)) :]
        grid = guess_grid(judged.size)
    inside = int(np.count_nonzero(judged))
    return max(
        epsilon_refuted(bound, judged.size, r, min(r, inside), significance, delta, family)
        for r in grid.tolist()
    )

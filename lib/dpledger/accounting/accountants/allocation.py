"""The allocation accountant: deterministic PLD bounds of balls-in-bins with C = I as a random
allocation (see :mod:`dpledger.accounting.allocation`), and its staged σ search.

Covers balls-in-bins (bins fixed or redrawn every epoch) with independent noise, example-level only.
``auto`` prefers it to Monte Carlo there: deterministic and tighter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, ClassVar

from dpledger.accounting.accountants.base import base_assumptions, outside, require_support
from dpledger.accounting.accountants.rdp import RdpAccountant
from dpledger.accounting.allocation import (
    LOWER_GRID_FACTOR,
    allocation_epsilon,
    allocation_on_grid,
    allocation_upper,
)
from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.record import AccountantResult
from dpledger.accounting.search import MAX_NOISE, Calibration, bracketed_search, unreachable
from dpledger.errors import UnsupportedMechanismError

OFFSET_ROUNDS = 2
COARSE_STEPS = 6
FINE_STEPS = 4
CURVE_GRID = 0.1
"""Loss interval of the ε-vs-step curve's points (whole epochs: an upper bound for every step inside
them)."""


@dataclass(frozen=True)
class AllocationAccountant:
    """Deterministic PLD bounds of balls-in-bins with C = I as a random allocation (see
    accounting.allocation)."""

    name: str = "allocation"
    deterministic: ClassVar[bool] = True
    auto_rank: ClassVar[int | None] = 1
    printed_bounds: ClassVar[dict[str, str]] = {
        "noise": (
            "the claim: ε is the allocation upper bound on calibrate's fixed loss grid, "
            "as the pipeline records it; "
            "dpledger epsilon at this σ refines its grid adaptively, "
            "so it may print a slightly different valid upper bound"
        ),
        "epsilon": (
            "a valid upper bound from an adaptively refined grid; the claim calibrate records "
            "(and dpledger noise prints) for a σ is the upper bound on its fixed calibration grid, "
            "which may differ slightly"
        ),
    }
    """Which of its two valid upper bounds ``dpledger noise`` and ``dpledger epsilon`` print."""

    def unsupported(self, description: MechanismDescription) -> str | None:
        refusal = outside(
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
                "correlated noise (mechanism != identity) needs the Monte Carlo accountant "
                "(004 Lemma 3.2)"
            )
        if description.group_size != 1:
            return (
                "the allocation accountant is example-level only; "
                "group-level ε needs poisson or fixed with pld"
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
            return AccountantResult(self.name, math.inf, delta, base_assumptions(d), {})
        bounds = (
            allocation_epsilon(d, delta) if grid is None else allocation_on_grid(d, delta, grid)
        )
        mapping = (
            f"{d.epochs} epoch(s) of a 1-of-{d.batches_per_epoch} random allocation, composed"
            if d.sampler == "balls-in-bins-redrawn"
            else f"one 1-of-{d.batches_per_epoch} random allocation at noise σ/√E = {d.noise_multiplier / math.sqrt(d.epochs):.6g} "  # noqa: E501
            f"(the example sits in the same slot of all {d.epochs} epochs: "
            "one Gaussian of sensitivity √E)"
        )
        assumptions = base_assumptions(d) + [
            f"pld-accounting (Feldman & Shenfeld) random-allocation PLD: {mapping}; "
            "the claim is the dominating (upper) bound, the dominated (lower) "
            f"bound is ε = {bounds.lower:.6g}"
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

    def calibrate(
        self, description: MechanismDescription, epsilon: float, delta: float, tolerance: float
    ) -> Calibration:
        """σ whose dominating bound on the claim's grid (loss interval 0.07·ε, at most 0.1) lies in
        [ε − tolerance', ε], tolerance' = max(tolerance, 0.002·ε), with as few evaluations on that
        grid as possible: each costs seconds (b = 100, E = 20), as the geometric convolution is
        quadratic in the grid size, so a grid k× coarser costs ~1/k².

        Near the answer the bound on a coarser grid exceeds the claim grid's by a near-constant
        offset D (it moves by < 0.3 % of itself across 5 % of σ), and the bound is close to linear
        in the loss interval. So D is estimated by Richardson extrapolation from grids 3× and 6× the
        claim's, the 6× grid (~1/36 of the cost) is solved for ε − tolerance/2 + D by secant steps
        on log σ (from the Poisson RDP σ; D is estimated again where the solution moved more than
        15 % from where it was estimated), then the claim grid is evaluated there and stepped
        (Newton on log σ with the coarse slope; false position once bracketed) until it lands in
        the band: usually once. Only claim-grid values are accepted, so the returned σ's ε is that
        grid's proven upper bound, never above the target."""
        tolerance = max(tolerance, 2e-3 * epsilon)
        fine = min(0.1, max(1e-3, 0.07 * epsilon))
        aim = epsilon - tolerance / 2

        def upper(log_sigma: float, grid: float) -> float:
            return allocation_upper(description.with_noise(math.exp(log_sigma)), delta, grid)

        poisson = replace(description, sampler="poisson")
        start = bracketed_search(
            RdpAccountant(), poisson, epsilon, delta, 1e-2 * epsilon
        ).noise_multiplier
        log_sigma, rate = _coarse_solution(upper, math.log(start), aim, tolerance, fine)
        feasible, log_sigma = _claim_grid_search(
            lambda x: upper(x, fine), log_sigma, rate, epsilon, aim, tolerance
        )
        while feasible is None:
            log_sigma += math.log(1.15)
            if log_sigma > math.log(MAX_NOISE):
                raise unreachable(epsilon, delta)
            value = upper(log_sigma, fine)
            if value <= epsilon:
                feasible = (log_sigma, value)
        sigma = math.exp(feasible[0])
        return Calibration(sigma, self.epsilon(description.with_noise(sigma), delta, grid=fine))

    def curve_epsilon(
        self, description: MechanismDescription, delta: float, table_discretization: float
    ) -> float:
        """The dominating bound on the :data:`CURVE_GRID` loss grid."""
        return allocation_upper(description, delta, CURVE_GRID)


def _coarse_solution(
    upper: Callable[[float, float], float],
    log_sigma: float,
    aim: float,
    tolerance: float,
    fine: float,
) -> tuple[float, float]:
    """(log σ, slope −dε/dlog σ): the 6×-grid solution for ``aim`` plus the Richardson offset D,
    from ``log_sigma`` (see :meth:`AllocationAccountant.calibrate`)."""
    for _ in range(OFFSET_ROUNDS):
        anchor = (log_sigma, upper(log_sigma, 6 * fine))
        goal = aim + 5 / 3 * (anchor[1] - upper(log_sigma, 3 * fine))
        points = [anchor]
        log_sigma += math.log(anchor[1] / goal) / 1.25
        for _ in range(COARSE_STEPS):
            points.append((log_sigma, upper(log_sigma, 6 * fine)))
            if abs(points[-1][1] - goal) <= tolerance / 8:
                break
            log_sigma = _secant(points[-2], points[-1], goal)
        if abs(log_sigma - anchor[0]) <= 0.15:
            break
    (x_first, y_first), (x_last, y_last) = points[0], points[-1]
    rate = (
        (y_first - y_last) / (x_last - x_first) if abs(x_last - x_first) > 1e-3 else 1.25 * y_last
    )
    return log_sigma, rate


def _claim_grid_search(
    upper: Callable[[float], float],
    log_sigma: float,
    rate: float,
    epsilon: float,
    aim: float,
    tolerance: float,
) -> tuple[tuple[float, float] | None, float]:
    """The smallest feasible (log σ, ε) on the claim grid found in :data:`FINE_STEPS` evaluations
    (Newton with the coarse slope, false position once bracketed), or None if none was feasible;
    and the log σ the steps reached (where a search for a feasible one goes on)."""
    feasible: tuple[float, float] | None = None
    infeasible: tuple[float, float] | None = None
    for _ in range(FINE_STEPS):
        value = upper(log_sigma)
        if value <= epsilon:
            if feasible is None or log_sigma < feasible[0]:
                feasible = (log_sigma, value)
            if epsilon - value <= tolerance:
                break
        elif infeasible is None or log_sigma > infeasible[0]:
            infeasible = (log_sigma, value)
        if feasible and infeasible:
            width = feasible[0] - infeasible[0]
            log_sigma = min(
                max(_secant(infeasible, feasible, aim), infeasible[0] + 0.01 * width),
                feasible[0] - 0.01 * width,
            )
        else:
            log_sigma += (value - aim) / max(rate, 1e-3 * aim)
    return feasible, log_sigma


def _secant(a: tuple[float, float], b: tuple[float, float], goal: float) -> float:
    """log σ where the line through (log σ, ε) points a and b reaches ``goal``; a step of at most
    0.3 in log σ from b (ε is smooth and monotone in σ, so the guard only matters for wild first
    guesses)."""
    (x_a, y_a), (x_b, y_b) = a, b
    if y_a == y_b:
        return x_b
    step = (goal - y_b) * (x_b - x_a) / (y_b - y_a)
    return x_b + min(max(step, -0.3), 0.3)


ACCOUNTANT = AllocationAccountant

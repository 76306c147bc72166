"""σ calibration: the smallest noise multiplier whose proven ε is at most the target.

PLD and RDP: bracket σ (doubling from 1), then narrow the bracket (false position with the Illinois
fix, a safeguarded bisection) until the proven ε lies in [target − tolerance, target] (never above
it). Allocation (seconds per evaluation): solved on coarse grids first, then a few evaluations on
the claim's grid (see :func:`_calibrate_allocation`). The target is bounded (ε <= MAX_EPSILON) so
the search never walks σ down to where the PLD grids explode. Monte Carlo: 004 Alg. 2 with common
random numbers plus Estimate-Verify-Release (see :class:`MonteCarloAccountant.calibrate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dpledger.accounting.accountants import (
    Accountant,
    AllocationAccountant,
    MonteCarloAccountant,
    RdpAccountant,
    require_support,
)
from dpledger.accounting.allocation import allocation_upper
from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.record import AccountantResult
from dpledger.errors import ParamsError

EPSILON_TOLERANCE = 1e-4
MAX_NOISE = 1e6
MIN_NOISE = 1e-3
MAX_EPSILON = 100.0
OFFSET_ROUNDS = 2
COARSE_STEPS = 6
FINE_STEPS = 4


@dataclass(frozen=True)
class Calibration:
    """The calibrated σ and the accountant's result at that σ (its ε is <= the target)."""

    noise_multiplier: float
    result: AccountantResult


def calibrate_noise(  # noqa: C901  (validation, then one bracketed search per accountant kind)
    accountant: Accountant,
    description: MechanismDescription,
    epsilon: float,
    delta: float,
    tolerance: float = EPSILON_TOLERANCE,
) -> Calibration:
    """σ for the target (ε, δ) with ``accountant``; its proven ε is within ``tolerance`` below the
    target."""
    if not (math.isfinite(epsilon) and 0 < epsilon <= MAX_EPSILON):
        raise ParamsError(
            f"epsilon = {epsilon} is invalid: it must be a number in (0, {MAX_EPSILON:g}] (beyond "
            "it "
            f"no noise multiplier >= {MIN_NOISE:g} is needed and the claim says nothing)"
        )
    if not 0.0 < delta < 1.0:
        raise ParamsError(f"delta = {delta} is invalid: it must lie in (0, 1)")
    require_support(accountant, description)
    if isinstance(accountant, MonteCarloAccountant):
        sigma, result = accountant.calibrate(description, epsilon, delta)
        return Calibration(sigma, result)
    if isinstance(accountant, AllocationAccountant):
        return _calibrate_allocation(
            accountant, description, epsilon, delta, max(tolerance, 2e-3 * epsilon)
        )

    def eps_at(sigma: float) -> float:
        return accountant.epsilon(description.with_noise(sigma), delta).epsilon

    high, eps_high = 1.0, eps_at(1.0)
    low, eps_low = 0.0, math.inf
    while eps_high > epsilon:
        low, eps_low, high = high, eps_high, 2.0 * high
        if high > MAX_NOISE:
            raise ParamsError(
                f"epsilon = {epsilon} is unreachable with noise multiplier <= {MAX_NOISE:g} at "
                f"delta = {delta}"
            )
        eps_high = eps_at(high)
    while low == 0.0 and high > MIN_NOISE:
        eps_down = eps_at(high / 2.0)
        if eps_down > epsilon:
            low, eps_low = high / 2.0, eps_down
        else:
            high, eps_high = high / 2.0, eps_down
    side = 0
    while epsilon - eps_high > tolerance and high - low > 1e-9 * high:
        mid = _illinois_point(low, eps_low, high, eps_high, epsilon, side)
        eps_mid = eps_at(mid)
        if eps_mid > epsilon:
            low, eps_low, side = mid, eps_mid, (side - 1 if side < 0 else -1)
        else:
            high, eps_high, side = mid, eps_mid, (side + 1 if side > 0 else 1)
    return Calibration(high, accountant.epsilon(description.with_noise(high), delta))


def _calibrate_allocation(  # noqa: C901  (a staged secant/Newton search, see docstring)
    accountant: AllocationAccountant,
    description: MechanismDescription,
    epsilon: float,
    delta: float,
    tolerance: float,
) -> Calibration:
    """σ whose dominating bound on the claim's grid (loss interval 0.07·ε, at most 0.1) lies in
    [ε − tolerance, ε], with as few evaluations on that grid as possible: each costs seconds (b =
    100, E = 20), as the geometric convolution is quadratic in the grid size, so a grid k× coarser
    costs ~1/k².

    Near the answer the bound on a coarser grid exceeds the claim grid's by a near-constant offset D
    (it moves by < 0.3 % of itself across 5 % of σ), and the bound is close to linear in the loss
    interval. So D is estimated by Richardson extrapolation from grids 3× and 6× the claim's, the 6×
    grid (~1/36 of the cost) is solved for ε − tolerance/2 + D by secant steps on log σ (from the
    Poisson RDP σ; D is estimated again where the solution moved more than 15 % from where it was
    estimated), then the claim grid is evaluated there and stepped (Newton on log σ with the coarse
    slope; false position once bracketed) until it lands in the band: usually once. Only claim-grid
    values are accepted, so the returned σ's ε is that grid's proven upper bound, never above the
    target."""
    fine = min(0.1, max(1e-3, 0.07 * epsilon))
    aim = epsilon - tolerance / 2

    def upper(log_sigma: float, grid: float) -> float:
        return allocation_upper(description.with_noise(math.exp(log_sigma)), delta, grid)

    poisson = replace(description, sampler="poisson")
    start = calibrate_noise(
        RdpAccountant(), poisson, epsilon, delta, tolerance=1e-2 * epsilon
    ).noise_multiplier
    log_sigma = math.log(start)
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
    feasible: tuple[float, float] | None = None
    infeasible: tuple[float, float] | None = None
    for _ in range(FINE_STEPS):
        value = upper(log_sigma, fine)
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
    while feasible is None:
        log_sigma += math.log(1.15)
        if log_sigma > math.log(MAX_NOISE):
            raise ParamsError(
                f"epsilon = {epsilon} is unreachable with noise multiplier <= {MAX_NOISE:g} at "
                f"delta = {delta}"
            )
        value = upper(log_sigma, fine)
        if value <= epsilon:
            feasible = (log_sigma, value)
    sigma = math.exp(feasible[0])
    return Calibration(sigma, accountant.epsilon(description.with_noise(sigma), delta, grid=fine))


def _secant(a: tuple[float, float], b: tuple[float, float], goal: float) -> float:
    """log σ where the line through (log σ, ε) points a and b reaches ``goal``; a step of at most
    0.3 in log σ from b (ε is smooth and monotone in σ, so the guard only matters for wild first
    guesses)."""
    (x_a, y_a), (x_b, y_b) = a, b
    if y_a == y_b:
        return x_b
    step = (goal - y_b) * (x_b - x_a) / (y_b - y_a)
    return x_b + min(max(step, -0.3), 0.3)


def _illinois_point(
    low: float, eps_low: float, high: float, eps_high: float, target: float, side: int
) -> float:
    """Next σ inside (low, high): false position on ε(σ) − target, with the Illinois halving of the
    end that keeps being retained; bisection where the low end's ε is infinite."""
    if not math.isfinite(eps_low):
        return 0.5 * (low + high)
    f_low, f_high = eps_low - target, eps_high - target
    if side >= 2:
        f_low /= 2 ** (side - 1)
    elif side <= -2:
        f_high /= 2 ** (-side - 1)
    point = high - f_high * (high - low) / (f_high - f_low)
    width = high - low
    return min(max(point, low + 1e-3 * width), high - 1e-3 * width)

"""σ calibration: the smallest noise multiplier whose proven ε is at most the target.

PLD, RDP and allocation: bracket σ (doubling from 1; allocation from the Poisson RDP σ by factors of 1.15),
then narrow the bracket (false position with the Illinois fix, a safeguarded bisection) until the proven ε
lies in [target − tolerance, target] (never above it). The target is bounded (ε <= MAX_EPSILON) so the
search never walks σ down to where the PLD grids explode. Monte Carlo: 004 Alg. 2 with common random numbers
plus Estimate-Verify-Release (see :class:`MonteCarloAccountant.calibrate`).
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


@dataclass(frozen=True)
class Calibration:
    """The calibrated σ and the accountant's result at that σ (its ε is <= the target)."""

    noise_multiplier: float
    result: AccountantResult


def calibrate_noise(
    accountant: Accountant,
    description: MechanismDescription,
    epsilon: float,
    delta: float,
    tolerance: float = EPSILON_TOLERANCE,
) -> Calibration:
    """σ for the target (ε, δ) with ``accountant``; its proven ε is within ``tolerance`` below the target."""
    if not (math.isfinite(epsilon) and 0 < epsilon <= MAX_EPSILON):
        raise ParamsError(
            f"epsilon = {epsilon} is invalid: it must be a number in (0, {MAX_EPSILON:g}] (beyond it "
            f"no noise multiplier >= {MIN_NOISE:g} is needed and the claim says nothing)"
        )
    if not 0.0 < delta < 1.0:
        raise ParamsError(f"delta = {delta} is invalid: it must lie in (0, 1)")
    require_support(accountant, description)
    if isinstance(accountant, MonteCarloAccountant):
        sigma, result = accountant.calibrate(description, epsilon, delta)
        return Calibration(sigma, result)

    def eps_at(sigma: float) -> float:
        if isinstance(accountant, AllocationAccountant):
            return allocation_upper(description.with_noise(sigma), delta, grid)
        return accountant.epsilon(description.with_noise(sigma), delta).epsilon

    grid = min(0.1, max(1e-3, 0.07 * epsilon))
    start, factor, tolerance = _search_plan(accountant, description, epsilon, delta, tolerance)
    high, eps_high = start, eps_at(start)
    low, eps_low = 0.0, math.inf
    if isinstance(accountant, AllocationAccountant):
        low, eps_low, high, eps_high = _newton_bracket(eps_at, start, eps_high, epsilon)
    while eps_high > epsilon:
        low, eps_low, high = high, eps_high, factor * high
        if high > MAX_NOISE:
            raise ParamsError(
                f"epsilon = {epsilon} is unreachable with noise multiplier <= {MAX_NOISE:g} at delta = {delta}"
            )
        eps_high = eps_at(high)
    while low == 0.0 and high > MIN_NOISE:
        eps_down = eps_at(high / factor)
        if eps_down > epsilon:
            low, eps_low = high / factor, eps_down
        else:
            high, eps_high = high / factor, eps_down
    side = 0
    while epsilon - eps_high > tolerance and high - low > 1e-9 * high:
        mid = _illinois_point(
            low, eps_low, high, eps_high, epsilon, side, log_scale=isinstance(accountant, AllocationAccountant)
        )
        eps_mid = eps_at(mid)
        if eps_mid > epsilon:
            low, eps_low, side = mid, eps_mid, (side - 1 if side < 0 else -1)
        else:
            high, eps_high, side = mid, eps_mid, (side + 1 if side > 0 else 1)
    if isinstance(accountant, AllocationAccountant):
        return Calibration(high, accountant.epsilon(description.with_noise(high), delta, grid=grid))
    return Calibration(high, accountant.epsilon(description.with_noise(high), delta))


def _search_plan(
    accountant: Accountant, description: MechanismDescription, epsilon: float, delta: float, tolerance: float
) -> tuple[float, float, float]:
    """(first σ, bracketing factor, ε tolerance). The allocation accountant costs seconds per point, so it
    starts at the RDP σ of Poisson sampling with the same q and steps (close to it: a few points bracket
    the answer) and stops within 0.1% of the target. It evaluates the dominating bound alone on one grid
    (loss interval 0.07·ε, at most 0.1), and the claim is that bound at the σ found, with the lower bound
    on the same grid beside it."""
    if not isinstance(accountant, AllocationAccountant):
        return 1.0, 2.0, tolerance
    poisson = replace(description, sampler="poisson")
    start = calibrate_noise(RdpAccountant(), poisson, epsilon, delta, tolerance=1e-2 * epsilon).noise_multiplier
    return start, 1.15, max(tolerance, 1e-3 * epsilon)


def _newton_bracket(eps_at, start: float, eps_start: float, target: float) -> tuple[float, float, float, float]:
    """(low, ε(low), high, ε(high)) from a second point at σ·(ε(σ)/target)^0.8, 1% beyond (near ε = 1 the
    allocation bound falls like σ^-1.2 to σ^-1.3), so one evaluation usually brackets the target; where it
    does not, the nearer point is returned as ``high`` with ``low`` = 0 and the caller's bracketing goes on."""
    beyond = 0.99 if eps_start < target else 1.01
    guess = start * (eps_start / target) ** 0.8 * beyond
    eps_guess = eps_at(guess)
    points = sorted([(start, eps_start), (guess, eps_guess)])
    (small, eps_small), (large, eps_large) = points
    if eps_small > target >= eps_large:
        return small, eps_small, large, eps_large
    if eps_large > target:
        return large, eps_large, large * 1.15, eps_at(large * 1.15)
    return 0.0, math.inf, small, eps_small


def _illinois_point(
    low: float, eps_low: float, high: float, eps_high: float, target: float, side: int, log_scale: bool = False
) -> float:
    """Next σ inside (low, high): false position on ε(σ) − target (on log ε against log σ with
    ``log_scale``, where ε is close to a power of σ), with the Illinois halving of the end that keeps being
    retained; bisection where the low end's ε is infinite."""
    if not math.isfinite(eps_low):
        return 0.5 * (low + high)
    if log_scale and low > 0:
        point = math.exp(
            _illinois_point(
                math.log(low), math.log(eps_low), math.log(high), math.log(eps_high), math.log(target), side
            )
        )
        width = high - low
        return min(max(point, low + 1e-3 * width), high - 1e-3 * width)
    f_low, f_high = eps_low - target, eps_high - target
    if side >= 2:
        f_low /= 2 ** (side - 1)
    elif side <= -2:
        f_high /= 2 ** (-side - 1)
    point = high - f_high * (high - low) / (f_high - f_low)
    width = high - low
    return min(max(point, low + 1e-3 * width), high - 1e-3 * width)

"""σ calibration: the smallest noise multiplier whose proven ε is at most the target.

PLD and RDP: bracket σ by doubling, then narrow the bracket (false position with the Illinois fix,
a safeguarded bisection) until the proven ε lies in
[target − tolerance, target] (never above it). Monte Carlo: 004 Alg. 2 with common random numbers
plus Estimate-Verify-Release (see :class:`MonteCarloAccountant.calibrate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpledger.accounting.accountants import Accountant, MonteCarloAccountant, require_support
from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.record import AccountantResult
from dpledger.errors import ParamsError

EPSILON_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Calibration:
    """The calibrated σ and the accountant's result at that σ (its ε is <= the target)."""

    noise_multiplier: float
    result: AccountantResult


def calibrate_noise(accountant: Accountant, description: MechanismDescription, epsilon: float, delta: float,
                    tolerance: float = EPSILON_TOLERANCE) -> Calibration:
    """σ for the target (ε, δ) with ``accountant``; its proven ε is within ``tolerance`` below the target."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ParamsError(f"epsilon = {epsilon} is invalid: it must be a finite number > 0")
    if not 0.0 < delta < 1.0:
        raise ParamsError(f"delta = {delta} is invalid: it must lie in (0, 1)")
    require_support(accountant, description)
    if isinstance(accountant, MonteCarloAccountant):
        sigma, result = accountant.calibrate(description, epsilon, delta)
        return Calibration(sigma, result)

    def eps_at(sigma: float) -> float:
        return accountant.epsilon(description.with_noise(sigma), delta).epsilon

    low, high = 0.0, 1.0
    eps_low, eps_high = math.inf, eps_at(high)
    while eps_high > epsilon:
        low, eps_low, high = high, eps_high, 2.0 * high
        if high > 1e6:
            raise ParamsError(f"epsilon = {epsilon} is unreachable with noise multiplier <= 1e6 at delta = {delta}")
        eps_high = eps_at(high)
    while low == 0.0 and high > 1e-3:
        eps_half = eps_at(high / 2)
        if eps_half > epsilon:
            low, eps_low = high / 2, eps_half
        else:
            high, eps_high = high / 2, eps_half
    side = 0
    while epsilon - eps_high > tolerance and high - low > 1e-9 * high:
        mid = _illinois_point(low, eps_low, high, eps_high, epsilon, side)
        eps_mid = eps_at(mid)
        if eps_mid > epsilon:
            low, eps_low, side = mid, eps_mid, (side - 1 if side < 0 else -1)
        else:
            high, eps_high, side = mid, eps_mid, (side + 1 if side > 0 else 1)
    return Calibration(high, accountant.epsilon(description.with_noise(high), delta))


def _illinois_point(low: float, eps_low: float, high: float, eps_high: float, target: float, side: int) -> float:
    """Next σ inside (low, high): false position on ε(σ) − target, with the Illinois halving of the end
    that keeps being retained; bisection where the low end's ε is infinite."""
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

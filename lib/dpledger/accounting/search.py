"""The bracketed σ search shared by the accountants whose ε is cheap to evaluate (PLD, RDP).

Bracket σ (doubling from 1), then narrow the bracket (false position with the Illinois fix, a
safeguarded bisection) until the proven ε lies in [target − tolerance, target] (never above it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.record import AccountantResult
from dpledger.errors import ParamsError

MAX_NOISE = 1e6
MIN_NOISE = 1e-3


class EpsilonSource(Protocol):
    """What the search needs of an accountant: its proven ε at δ."""

    def epsilon(self, description: MechanismDescription, delta: float) -> AccountantResult: ...


@dataclass(frozen=True)
class Calibration:
    """The calibrated σ and the accountant's result at that σ (its ε is <= the target)."""

    noise_multiplier: float
    result: AccountantResult


def unreachable(epsilon: float, delta: float) -> ParamsError:
    """The refusal of a target no σ up to :data:`MAX_NOISE` meets."""
    return ParamsError(
        f"epsilon = {epsilon} is unreachable with noise multiplier <= {MAX_NOISE:g} at delta = {delta}"  # noqa: E501
    )


def bracketed_search(
    accountant: EpsilonSource,
    description: MechanismDescription,
    epsilon: float,
    delta: float,
    tolerance: float,
) -> Calibration:
    """σ whose ε (``accountant.epsilon`` at δ) lies in [ε − tolerance, ε]: bracket, then narrow."""

    def eps_at(sigma: float) -> float:
        return accountant.epsilon(description.with_noise(sigma), delta).epsilon

    high, eps_high = 1.0, eps_at(1.0)
    low, eps_low = 0.0, math.inf
    while eps_high > epsilon:
        low, eps_low, high = high, eps_high, 2.0 * high
        if high > MAX_NOISE:
            raise unreachable(epsilon, delta)
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

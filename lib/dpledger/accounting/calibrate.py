"""σ calibration: the smallest noise multiplier whose proven ε is at most the target, and the
ε-vs-step curve; both written once on the accountants' interface.

Each accountant calibrates in its own way behind :meth:`Accountant.calibrate`: PLD and RDP by the
bracketed search of :mod:`dpledger.accounting.search`, allocation (seconds per evaluation) on
coarse grids first, Monte Carlo by 004 Alg. 2 with common random numbers plus
Estimate-Verify-Release. The target is bounded (ε <= MAX_EPSILON) so the search never walks σ down
to where the PLD grids explode.
"""

from __future__ import annotations

import math

import numpy as np

from dpledger import validation
from dpledger.accounting.accountants.base import Accountant, require_support
from dpledger.accounting.bounds import MAX_EPSILON
from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.search import MAX_NOISE, MIN_NOISE, Calibration

__all__ = ["Calibration", "MAX_NOISE", "calibrate_noise", "epsilon_curve"]

EPSILON_TOLERANCE = 1e-4


def calibrate_noise(
    accountant: Accountant,
    description: MechanismDescription,
    epsilon: float,
    delta: float,
    tolerance: float = EPSILON_TOLERANCE,
) -> Calibration:
    """σ for the target (ε, δ) with ``accountant``; its proven ε is within ``tolerance`` below the
    target."""
    if not (math.isfinite(epsilon) and 0 < epsilon <= MAX_EPSILON):
        requirement = (
            f"it must be a number in (0, {MAX_EPSILON:g}] "
            f"(beyond it no noise multiplier >= {MIN_NOISE:g} is needed and the claim says nothing)"
        )
        raise validation.invalid("epsilon", epsilon, requirement)
    validation.within("delta", delta, 0, 1)
    require_support(accountant, description)
    return accountant.calibrate(description, epsilon, delta, tolerance)


def epsilon_curve(
    accountant: Accountant,
    description: MechanismDescription,
    delta: float,
    claim: float,
    points: int,
    table_discretization: float,
) -> list[tuple[int, float]]:
    """(steps, ε after that many steps) on ~``points`` grid points including the last step.

    Each value is valid for every step count up to its own, so the curve is made monotone by a
    reverse running minimum, and the last point is min(claim, curve). The points before the last
    are the accountant's :meth:`curve_epsilon` (PLD on the coarser table discretization, allocation
    on a 0.1 loss grid, Monte Carlo estimates at δ' without EVR; the final claim is verified).
    """
    grid = sorted(
        {int(round(t)) for t in np.linspace(1, description.steps, points)} | {description.steps}
    )
    values = [
        accountant.curve_epsilon(description.with_steps(t), delta, table_discretization)
        for t in grid[:-1]
    ]
    values.append(claim)
    values = list(np.minimum.accumulate(np.asarray(values)[::-1])[::-1])
    return [(int(t), float(v)) for t, v in zip(grid, values)]

"""Group-level ε for k examples: the mixture-of-Gaussians accountant beside the generic conversion.

- ``mog``: tight, by composing the scalar MoG PLD (001 Thm 3.1 Poisson, Thm 3.3 fixed batch).
- ``conversion``: the group-privacy lemma (Vadhan 2017, Lemma 2.2) in its telescoped form
  δ_k = δ₁ (e^{kε₁} − 1)/(e^{ε₁} − 1), ε_k = k ε₁(δ₁), minimised over δ₁ on a log grid (001 §3.4).
  It returns ∞ where the PLD cannot resolve the tiny δ₁ it needs (tail truncation), which is
  reported. For fixed-size sampling ε₁ is taken at N − k + 1 examples (q = B/(N − k + 1)): removing
  the group one example at a time leaves datasets down to that size, and each hop must be covered.
- ``linear``: the reference line k·ε₁(δ) at the same δ (001 §3.5); not a guarantee for the group.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.pld import DISCRETIZATION, PldRun, composed_pld, pld_epsilon

PLD_RELIABLE_DELTA = 1e-9
"""The smallest δ₁ at which the conversion reads the composed PLD. Below it the FFT composition's
round-off dominates the tail: on the digits run (230 steps, q = 0.045) moving σ by 1e-11 moved
ε₁(δ₁ = e⁻³⁰) by 0.4 %, and ε₁(e⁻²⁰ ≈ 2e-9) still by 4e-7, while at δ₁ ≥ 1e-9 it moves by < 1e-6
relative. Smaller δ₁ use the RDP bound (Poisson; smooth in σ, valid at any δ) or are infeasible."""


GRID_POINTS = 49
"""Points of the log-δ₁ grid of :func:`group_conversion_epsilon` (2.5 nats apart)."""

BISECTIONS = 14
"""Halvings of the grid cell where feasibility ends."""


@dataclass(frozen=True)
class GroupEpsilon:
    """One row of the group table; None (with ``note``) where a method does not apply."""

    group_size: int
    mog: float | None
    conversion: float | None
    linear: float | None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def group_conversion_epsilon(
    description: MechanismDescription,
    delta: float,
    group_size: int,
    discretization: float = DISCRETIZATION,
) -> float:
    """Smallest k·ε₁(δ₁) with the telescoped δ_k(δ₁) <= δ, over δ₁ ≤ δ; ∞ if no point of the search
    is feasible. Any feasible δ₁ gives a valid bound. ε₁ is the PLD's down to
    :data:`PLD_RELIABLE_DELTA` and the RDP bound below it, so the result is as reproducible in σ as
    the example-level ε.

    ε₁(δ₁) falls as δ₁ grows, so the best feasible δ₁ is the largest: a log grid of
    :data:`GRID_POINTS` over 120 nats finds the largest feasible grid point, and
    :data:`BISECTIONS` halvings of the cell above it find the edge of feasibility (the bracket
    ends 120/48/2¹⁴ ≈ 1.5e-4 nats wide, finer than the 0.025 of the former 241 + 41-point grid,
    with 63 ε₁ readings instead of 282)."""
    if group_size == 1:
        return _pld_epsilon(description, delta, discretization)
    dataset_size, sample_rate = description.dataset_size, description.sample_rate
    if description.sampler == "fixed":
        # Removing the group one example at a time, the i-th removal is out of a dataset of N − i +
        # 1 examples, where the removed one is sampled with probability B/(N − i + 1): every hop is
        # covered only by the example-level ε at the smallest of them, N − k + 1 (adding is covered
        # at N).
        dataset_size = description.dataset_size - group_size + 1
        if dataset_size < description.batch_size:
            return math.inf
        sample_rate = description.batch_size / dataset_size
    run = replace(PldRun.of(description, 1), dataset_size=dataset_size, sample_rate=sample_rate)
    pld = composed_pld(run, discretization)
    rdp = _rdp(run) if description.sampler == "poisson" else None

    def bound(log_delta_1: float) -> float:
        if log_delta_1 >= math.log(PLD_RELIABLE_DELTA):
            eps_1 = float(pld.get_epsilon_for_delta(math.exp(log_delta_1)))
        elif rdp is not None:
            eps_1 = float(rdp.get_epsilon(math.exp(log_delta_1)))
        else:
            return math.inf
        feasible = math.isfinite(eps_1) and log_delta_1 + _log_growth(
            group_size, eps_1
        ) <= math.log(delta)
        return group_size * eps_1 if feasible else math.inf

    coarse = np.linspace(math.log(delta), math.log(delta) - 120.0, GRID_POINTS)
    values = [bound(x) for x in coarse]
    best = int(np.argmin(values))
    if not math.isfinite(values[best]) or best == 0:
        return values[best]  # nothing feasible, or δ₁ = δ itself
    # ε₁ falls as δ₁ grows: below the larger neighbour the edge of feasibility is in this cell
    feasible, beyond, value = float(coarse[best]), float(coarse[best - 1]), values[best]
    for _ in range(BISECTIONS):
        middle = (feasible + beyond) / 2
        found = bound(middle)
        if found <= value:
            feasible, value = middle, found
        else:
            beyond = middle
    return value


def _rdp(run: PldRun) -> rdp_privacy_accountant.RdpAccountant:
    """The RDP accountant of a Poisson run, composed once (ε at each δ₁ is then cheap)."""
    accountant = rdp_privacy_accountant.RdpAccountant()
    step = dp_event.PoissonSampledDpEvent(
        run.sample_rate, dp_event.GaussianDpEvent(run.noise_multiplier)
    )
    accountant.compose(dp_event.SelfComposedDpEvent(step, run.steps))
    return accountant


def _log_growth(group_size: int, eps_1: float) -> float:
    """log((e^{kε} − 1)/(e^ε − 1)), in log space so that large kε does not overflow (k at ε = 0)."""
    if eps_1 == 0:
        return math.log(group_size)
    return (
        group_size * eps_1
        + math.log(-math.expm1(-group_size * eps_1))
        - eps_1
        - math.log(-math.expm1(-eps_1))
    )


def _pld_epsilon(
    description: MechanismDescription, delta: float, discretization: float, group_size: int = 1
) -> float:
    """PLD ε at δ of the described run for groups of ``group_size`` (1: example level)."""
    return pld_epsilon(PldRun.of(description, group_size), delta, discretization)


def group_table(
    description: MechanismDescription,
    delta: float,
    group_sizes: list[int],
    discretization: float = DISCRETIZATION,
) -> list[GroupEpsilon]:
    """Group-level ε for each k by MoG, by the conversion and the linear line (Poisson and fixed
    samplers).

    ``discretization`` is the (pessimistic) PLD interval of the MoG accountant, whose cost grows
    with k; the example-level PLD (k = 1, the conversion and the linear line) always uses the fine
    default.
    """
    if description.sampler not in ("poisson", "fixed"):
        note = (
            f"no group-level accountant for {description.sampler}: "
            "the mixture-of-Gaussians reduction covers Poisson and fixed-size sampling (001), "
            "and the conversion needs the example-level ε at a δ far below what Monte Carlo can estimate"  # noqa: E501
        )
        return [GroupEpsilon(k, None, None, None, note) for k in group_sizes]
    example = _pld_epsilon(description, delta, DISCRETIZATION)
    rows = []
    for k in group_sizes:
        mog = example if k == 1 else _pld_epsilon(description, delta, discretization, k)
        conversion = group_conversion_epsilon(description, delta, k)
        too_small = (
            description.sampler == "fixed"
            and description.dataset_size - k + 1 < description.batch_size
        )
        note = (
            ""
            if math.isfinite(conversion)
            else (
                "conversion returned ∞: "
                f"removing {k} examples leaves fewer than B = {description.batch_size}"
                if too_small
                else "conversion returned ∞: "
                "the example-level δ₁ it needs is below the PLD's tail truncation"
            )
        )
        rows.append(GroupEpsilon(k, mog, conversion, k * example, note))
    return rows

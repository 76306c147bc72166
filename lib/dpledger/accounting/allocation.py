"""Deterministic ε of balls-in-bins with independent noise (C = I), via ``pld-accounting`` (Feldman
& Shenfeld).

Balls-in-bins puts each example in one of b bins uniformly and independently of the others, so the
differing example takes part in exactly one of the epoch's b steps, uniformly at random: the "random
allocation" (1 of b) of Feldman & Shenfeld, whose PLD ``PLD_accounting`` bounds from both sides.

- ``balls-in-bins-redrawn`` (bins redrawn every epoch): E independent 1-of-b allocations, composed
  (``num_steps = b, num_epochs = E``, noise σ).
- ``balls-in-bins`` with C = I (bins fixed across epochs): the example sits in the same slot of
  every epoch, so its E rows carry one Gaussian of L2 sensitivity √E: one 1-of-b allocation at noise
  σ/√E.

The claim is the dominating (upper) PLD bound; the dominated (lower) one says how tight it is. Both
use the package's adaptive refinement (``gaussian_allocation_epsilon_range``: the grid is refined
until upper/lower <= 1.1), both directions (add and remove) are accounted and the worse one
reported.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

from dpledger.accounting.description import MechanismDescription
from dpledger.errors import ParamsError

LOWER_GRID_FACTOR = 2.0
MAX_COMPOSED_EPOCHS = 100
"""The most epochs of redrawn bins the allocation accountant composes (each costs seconds to a
minute on 2 cores; 10,000 ran for hours)."""


@dataclass(frozen=True)
class AllocationBounds:
    """ε at δ of a random allocation: the proven upper bound and the lower bound (tightness)."""

    upper: float
    lower: float
    converged: bool


def allocation_shape(description: MechanismDescription) -> tuple[float, int, int]:
    """(noise σ, steps per allocation b, allocations E) of the random allocation the description is;
    E beyond :data:`MAX_COMPOSED_EPOCHS` is refused with one line (the composition would run for
    hours)."""
    d = description
    if d.sampler == "balls-in-bins-redrawn":
        if d.epochs > MAX_COMPOSED_EPOCHS:
            raise ParamsError(
                "params: "
                f"epochs = {d.epochs} is too large for the allocation accountant with bins redrawn every epoch: "  # noqa: E501
                f"it composes one allocation per epoch, at most {MAX_COMPOSED_EPOCHS} "
                "(minutes each beyond); use the montecarlo accountant, or balls-in-bins "
                "(bins fixed across epochs: one allocation at σ/√E)"
            )
        return d.noise_multiplier, d.batches_per_epoch, d.epochs
    return d.noise_multiplier / math.sqrt(d.epochs), d.batches_per_epoch, 1


def _memory_refused(function):
    """One line instead of a MemoryError: a loss grid too fine for this machine (a tiny ε, e.g. δ =
    0.3)."""

    @functools.wraps(function)
    def guarded(description: MechanismDescription, delta: float, *args, **kwargs):
        try:
            return function(description, delta, *args, **kwargs)
        except MemoryError:
            raise ParamsError(
                f"params: the allocation accountant ran out of memory at δ = {delta:g}, "
                f"σ = {description.noise_multiplier:.6g}: "
                "ε is so small that its loss grid does not fit; use a smaller δ (below 1/n) "
                "or less noise"
            ) from None

    return guarded


@_memory_refused
def allocation_epsilon(description: MechanismDescription, delta: float) -> AllocationBounds:
    """Upper and lower ε at δ (module docstring); cached, since σ searches revisit points."""
    sigma, bins, epochs = allocation_shape(description)
    return _bounds(sigma, bins, epochs, delta)


@functools.lru_cache(maxsize=256)
def _bounds(sigma: float, bins: int, epochs: int, delta: float) -> AllocationBounds:
    from PLD_accounting import gaussian_allocation_epsilon_range

    if bins == 1:
        return _one_bin(sigma, epochs, delta)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        upper, lower = gaussian_allocation_epsilon_range(
            delta=delta, sigma=sigma, num_steps=bins, num_epochs=epochs
        )
    converged = not any("did not converge" in str(w.message) for w in caught)
    return AllocationBounds(float(upper), float(lower), converged)


@_memory_refused
def allocation_upper(
    description: MechanismDescription, delta: float, discretization: float
) -> float:
    """The dominating bound alone on one fixed grid (loss interval ``discretization``, tail mass
    δ/1000): half the cost of :func:`allocation_epsilon`, for σ searches. A valid upper bound at any
    grid and tail mass; δ/1000 rather than δ/10 tightens it for little more time
    (benchmarks/RESULTS.md)."""
    sigma, bins, epochs = allocation_shape(description)
    if bins == 1:
        return _one_bin(sigma, epochs, delta).upper
    return _on_grid(sigma, bins, epochs, delta, discretization, "DOMINATES")


@_memory_refused
def allocation_on_grid(
    description: MechanismDescription, delta: float, discretization: float
) -> AllocationBounds:
    """Upper ε on one fixed grid (see :func:`allocation_upper`), lower ε on a grid
    LOWER_GRID_FACTOR× coarser: still a valid lower bound, at about a quarter of the cost (the
    convolution is quadratic in the grid size), so σ calibration stays within seconds; the price is
    a looser tightness figure (b = 100, E = 20, ε = 1: lower 0.919 instead of 0.947 beside the claim
    0.9999)."""
    sigma, bins, epochs = allocation_shape(description)
    if bins == 1:
        return _one_bin(sigma, epochs, delta)
    upper = _on_grid(sigma, bins, epochs, delta, discretization, "DOMINATES")
    lower = _on_grid(sigma, bins, epochs, delta, LOWER_GRID_FACTOR * discretization, "IS_DOMINATED")
    return AllocationBounds(upper, lower, upper <= 1.1 * lower)


@functools.lru_cache(maxsize=256)
def _on_grid(
    sigma: float, bins: int, epochs: int, delta: float, discretization: float, bound: str
) -> float:
    from PLD_accounting import (
        AllocationSchemeConfig,
        BoundType,
        PrivacyParams,
        gaussian_allocation_epsilon_configurable,
    )

    params = PrivacyParams(sigma=sigma, num_steps=bins, num_epochs=epochs, delta=delta)
    config = AllocationSchemeConfig(
        loss_discretization=discretization, tail_truncation=delta / 1000
    )
    return float(
        gaussian_allocation_epsilon_configurable(
            params=params, config=config, bound_type=BoundType[bound]
        )
    )


def _one_bin(sigma: float, epochs: int, delta: float) -> AllocationBounds:
    """b = 1: every example is in every step: the Gaussian mechanism of sensitivity √E
    (dp-accounting PLD, pessimistic and optimistic discretization)."""
    from dp_accounting.pld import privacy_loss_distribution

    upper, lower = (
        float(
            privacy_loss_distribution.from_gaussian_mechanism(
                standard_deviation=sigma / math.sqrt(epochs),
                value_discretization_interval=1e-4,
                pessimistic_estimate=pessimistic,
            ).get_epsilon_for_delta(delta)
        )
        for pessimistic in (True, False)
    )
    return AllocationBounds(upper, lower, True)

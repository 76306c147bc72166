"""Samplers that draw every step independently: Poisson and fixed-size uniform subsets. O(batch)
memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpledger.errors import ParamsError
from dpledger.sampling.base import Membership, PerStepSampler


def uniform_subset(rng: np.random.Generator, population: int, size: int) -> np.ndarray:
    """``size`` distinct indices drawn uniformly from 0..population-1, sorted.

    numpy draws them by Floyd's algorithm in O(size) memory while size < population/20, and by a
    partial shuffle of the population otherwise (then O(population) = O(20·size)).
    """
    return np.sort(rng.choice(population, size=size, replace=False, shuffle=False))


class PoissonSampler(PerStepSampler):
    """Each example joins each step independently with probability q (default q = B/n).

    Drawn as a Binomial(n, q) batch size followed by a uniform subset of that size, which has
    exactly the law of n independent Bernoulli(q) coins, in O(batch) time and memory. Batches may
    be empty; the trainer still takes a (noise-only) step.
    """

    name = "poisson"
    accounted_as = "poisson"
    description = (
        "each example included independently with probability q = B/n every step (variable size)"
    )
    OPTIONS = ("sample_rate",)

    def __init__(self, *, sample_rate: float | None = None, **sizes: Any) -> None:
        super().__init__(**sizes)
        rate = self.batch_size / self.dataset_size if sample_rate is None else sample_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate <= 1.0:
            raise ParamsError(
                f"sample_rate = {rate!r} is invalid: the Poisson rate q must be in (0, 1]"
            )
        self.sample_rate = float(rate)

    def options(self) -> dict[str, Any]:
        return {"sample_rate": self.sample_rate}

    def membership(self) -> Membership:
        return Membership(
            "each step independently with probability q", False, step_probability=self.sample_rate
        )

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        size = int(rng.binomial(self.dataset_size, self.sample_rate))
        return uniform_subset(rng, self.dataset_size, size)


class FixedSizeSampler(PerStepSampler):
    """B distinct examples drawn uniformly without replacement, fresh every step (001 §3.3)."""

    name = "fixed"
    accounted_as = "fixed"
    description = "B distinct examples drawn uniformly, fresh every step"

    def membership(self) -> Membership:
        return Membership(
            "each step independently with probability B/n",
            True,
            step_probability=self.batch_size / self.dataset_size,
        )

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        return uniform_subset(rng, self.dataset_size, self.batch_size)

"""The PLD accountant: dp-accounting's privacy loss distributions, pessimistic connect-the-dots
discretization (see :mod:`dpledger.accounting.pld`).

Covers poisson and fixed-size sampling with independent noise, for single examples and groups of k
(mixture of Gaussians, 001). ``auto`` tries it first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from dpledger.accounting.accountants.base import (
    base_assumptions,
    outside,
    require_support,
)
from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.pld import DISCRETIZATION, PldRun, pld_delta, pld_epsilon
from dpledger.accounting.record import AccountantResult
from dpledger.accounting.search import Calibration, bracketed_search


@dataclass(frozen=True)
class PldAccountant:
    """dp-accounting PLD, pessimistic connect-the-dots discretization (see accounting.pld)."""

    discretization: float = DISCRETIZATION
    name: str = "pld"
    deterministic: ClassVar[bool] = True
    printed_bounds: ClassVar[dict[str, str]] = {}
    auto_rank: ClassVar[int | None] = 0

    def unsupported(self, description: MechanismDescription) -> str | None:
        refusal = outside(
            description, "PLD", ("poisson", "fixed"), "poisson and fixed sampling", "montecarlo"
        )
        if refusal:
            return refusal
        if description.mechanism != "identity":
            return (
                "correlated noise (mechanism != identity) "
                "is accounted only under balls-in-bins batching (004); "
                "use sampler balls-in-bins with accountant montecarlo"
            )
        if description.sampler == "fixed" and (
            description.dataset_size is None or description.batch_size is None
        ):
            return "fixed-size sampling needs dataset_size and batch_size"
        return None

    def epsilon(self, description: MechanismDescription, delta: float) -> AccountantResult:
        require_support(self, description)
        eps = pld_epsilon(PldRun.of(description), delta, self.discretization)
        method = (
            "Poisson-subsampled Gaussian"
            if description.sampler == "poisson" and description.group_size == 1
            else "mixture of Gaussians (001)"
        )
        assumptions = base_assumptions(description) + [
            f"dp-accounting PLD of the {method}, pessimistic connect-the-dots discretization "
            f"(interval {self.discretization:g}): an upper bound on ε up to float rounding",
        ]
        return AccountantResult(
            self.name,
            eps,
            delta,
            assumptions,
            {"discretization": self.discretization, "method": method},
        )

    def delta(self, description: MechanismDescription, epsilon: float) -> float:
        require_support(self, description)
        return pld_delta(PldRun.of(description), epsilon, self.discretization)

    def calibrate(
        self, description: MechanismDescription, epsilon: float, delta: float, tolerance: float
    ) -> Calibration:
        return bracketed_search(self, description, epsilon, delta, tolerance)

    def curve_epsilon(
        self, description: MechanismDescription, delta: float, table_discretization: float
    ) -> float:
        """ε on the coarser table grid (still a pessimistic, valid upper bound)."""
        coarse = replace(self, discretization=table_discretization)
        return coarse.epsilon(description, delta).epsilon


ACCOUNTANT = PldAccountant

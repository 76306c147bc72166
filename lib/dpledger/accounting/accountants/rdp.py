"""The RDP accountant: dp-accounting's Rényi DP of the Poisson-subsampled Gaussian, converted to
(ε, δ). A looser cross-check of the PLD for poisson sampling; ``auto`` never picks it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dpledger.accounting.accountants.base import base_assumptions, require_support
from dpledger.accounting.description import MechanismDescription
from dpledger.accounting.pld import rdp_delta, rdp_epsilon
from dpledger.accounting.record import AccountantResult
from dpledger.accounting.search import Calibration, bracketed_search


@dataclass(frozen=True)
class RdpAccountant:
    """dp-accounting Rényi DP of the Poisson-subsampled Gaussian: a looser cross-check of the
    PLD."""

    name: str = "rdp"
    deterministic: ClassVar[bool] = True
    printed_bounds: ClassVar[dict[str, str]] = {}
    auto_rank: ClassVar[int | None] = None

    def unsupported(self, description: MechanismDescription) -> str | None:
        if description.sampler != "poisson":
            return (
                f"the RDP accountant here covers poisson sampling only, not {description.sampler}; "
                "use pld or montecarlo"
            )
        if description.group_size != 1:
            return (
                "the RDP accountant has no group-level analysis here; use pld "
                "(mixture of Gaussians, 001)"
            )
        if description.mechanism != "identity":
            return "correlated noise is accounted only with balls-in-bins and montecarlo"
        return None

    def epsilon(self, description: MechanismDescription, delta: float) -> AccountantResult:
        require_support(self, description)
        d = description
        eps = rdp_epsilon(d.noise_multiplier, d.sample_rate, d.steps, delta)
        assumptions = base_assumptions(d) + [
            "dp-accounting RDP (default orders), converted to (ε, δ): looser than PLD"
        ]
        return AccountantResult(self.name, eps, delta, assumptions, {})

    def delta(self, description: MechanismDescription, epsilon: float) -> float:
        require_support(self, description)
        d = description
        return rdp_delta(d.noise_multiplier, d.sample_rate, d.steps, epsilon)

    def calibrate(
        self, description: MechanismDescription, epsilon: float, delta: float, tolerance: float
    ) -> Calibration:
        return bracketed_search(self, description, epsilon, delta, tolerance)

    def curve_epsilon(
        self, description: MechanismDescription, delta: float, table_discretization: float
    ) -> float:
        """ε itself (RDP has no grid)."""
        return self.epsilon(description, delta).epsilon


ACCOUNTANT = RdpAccountant

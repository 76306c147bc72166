"""calibrate: the privacy budget and the mechanism the accountant describes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpledger.params.core import Section

AccountedSampler = Literal["poisson", "fixed", "balls-in-bins", "balls-in-bins-redrawn"]


class CalibrateParams(Section):
    """Target (epsilon, delta); the noise multiplier is calibrated to meet it."""

    epsilon: float = Field(gt=0.0, description="target epsilon")
    delta: float = Field(gt=0.0, lt=1.0, description="target delta")
    accountant: Literal["pld", "rdp", "montecarlo"] = "pld"
    sampler: AccountedSampler = Field(default="poisson", description="sampling the accountant assumes")
    mechanism: Literal["identity", "banded", "toeplitz", "blt"] = "identity"
    bands: int = Field(default=1, ge=1, description="w for a w-banded correlation matrix")
    group_sizes: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    mc_samples: int = Field(default=100_000, ge=1000, description="Monte Carlo samples (montecarlo accountant)")

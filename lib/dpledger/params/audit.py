"""audit: the canary audit that gives an empirical lower bound on epsilon."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpledger.params.bounds import (
    MAX_AUDIT_OBSERVATIONS,
    MAX_DPSGD_OBSERVATIONS,
    MAX_PATTERN_OBSERVATIONS,
)
from dpledger.params.core import Section


class AuditParams(Section):
    """Size and statistics of the audit (batched Gaussian mechanism with the sampler actually used)."""

    observations: int = Field(
        default=1_000_000, ge=100, le=MAX_AUDIT_OBSERVATIONS, description="games, half on D and half on D'"
    )
    threshold: Literal["bonferroni", "split", "max"] = Field(
        default="bonferroni", description="bonferroni | split (valid) | max (uncorrected, not a valid bound)"
    )
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    split_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="held-out fraction for split")
    backend: Literal["auto", "numpy", "torch"] = Field(default="auto", description="auto: torch on a GPU if present")
    pattern_observations: int = Field(
        default=20_000,
        ge=100,
        le=MAX_PATTERN_OBSERVATIONS,
        description="observations for samplers simulated by running them (plugins)",
    )
    dpsgd: bool = Field(default=False, description="also audit DP-SGD with gradient canaries (slow)")
    dpsgd_model: Literal["digits", "train"] = Field(
        default="digits",
        description="digits (an MLP on the embedded digits) | train (the train stage's model, loss and data)",
    )
    dpsgd_threat_model: Literal["natural", "partially-informed", "worst-case"] = "partially-informed"
    dpsgd_observations: int = Field(
        default=200, ge=4, le=MAX_DPSGD_OBSERVATIONS, description="training runs of the DP-SGD audit"
    )

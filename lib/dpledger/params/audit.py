"""audit: the canary audit that gives an empirical lower bound on epsilon."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpledger.params.bounds import (
    MAX_AUDIT_OBSERVATIONS,
    MAX_DPSGD_OBSERVATIONS,
    MAX_ONE_RUN_CANARIES,
    MAX_PATTERN_OBSERVATIONS,
)
from dpledger.params.core import Section


class OneRunParams(Section):
    """The one-run canary audit of the real training run (lib/dpledger/audit/one_run.py): the train
    stage records the canary coordinates of the released noisy sums, the audit stage bounds ε from
    them."""

    enabled: bool = Field(
        default=True, description="record canaries in the train stage and bound ε from them"
    )
    canaries: int = Field(
        default=10_000,
        ge=2,
        le=MAX_ONE_RUN_CANARIES,
        description="m, at most; a model with fewer trainable parameters gets one per parameter "
        "(recorded)",
    )
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    threshold: Literal["bonferroni", "split"] = Field(
        default="bonferroni",
        description="bonferroni (a grid of guess counts) | split (held-out canaries pick it)",
    )
    split_fraction: float = Field(
        default=0.5, gt=0.0, lt=1.0, description="held-out canaries for split"
    )
    bound: Literal["order", "order-eps-delta", "fdp", "fdp-gaussian", "steinke"] = Field(
        default="order",
        description="order (order statistics against the ledger's Gaussian family; fdp where it does not apply) | order-eps-delta (order statistics, generic (ε, δ)) | fdp (f-DP test of the (ε, δ) trade-off) | fdp-gaussian (of the Gaussian one) | steinke",  # noqa: E501
    )


class AuditParams(Section):
    """Size and statistics of the audit (batched Gaussian mechanism with the sampler actually
    used)."""

    observations: int = Field(
        default=1_000_000,
        ge=100,
        le=MAX_AUDIT_OBSERVATIONS,
        description="games, half on D and half on D'",
    )
    threshold: Literal["bonferroni", "split", "max"] = Field(
        default="bonferroni",
        description="bonferroni | split (valid) | max (uncorrected, not a valid bound)",
    )
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    split_fraction: float = Field(
        default=0.2, gt=0.0, lt=1.0, description="held-out fraction for split"
    )
    backend: Literal["auto", "numpy", "torch"] = Field(
        default="auto", description="auto: torch on a GPU if present"
    )
    pattern_observations: int = Field(
        default=20_000,
        ge=100,
        le=MAX_PATTERN_OBSERVATIONS,
        description="observations for samplers simulated by running them (plugins)",
    )
    dpsgd: bool = Field(
        default=False, description="also audit DP-SGD with gradient canaries (slow)"
    )
    dpsgd_model: Literal["digits", "train"] = Field(
        default="digits",
        description="digits (an MLP on the embedded digits) | train (the train stage's model, "
        "loss and data)",
    )
    dpsgd_threat_model: Literal["natural", "partially-informed", "worst-case"] = (
        "partially-informed"
    )
    dpsgd_observations: int = Field(
        default=200,
        ge=4,
        le=MAX_DPSGD_OBSERVATIONS,
        description="training runs of the DP-SGD audit",
    )
    one_run: OneRunParams = Field(default_factory=OneRunParams)

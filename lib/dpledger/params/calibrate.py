"""calibrate: the privacy budget and the mechanism the accountant describes.

The samplers ``calibrate.sampler`` may name are the accounting vocabulary's laws; which accountant
covers which sampler and mechanism is asked of the accountants themselves (their ``unsupported()``),
so nothing here restates either list.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from dpledger.accounting import bounds
from dpledger.accounting.accountants import ACCOUNTANTS
from dpledger.accounting.description import SAMPLERS as ACCOUNTED_SAMPLERS
from dpledger.accounting.description import describe
from dpledger.params.bounds import MAX_LIST_LENGTH
from dpledger.params.core import Section
from dpledger.sampling.registry import SAMPLERS


def coverage_refusal(accountant: str, sampler: str, mechanism: str = "identity") -> str | None:
    """Why ``accountant`` (``auto`` resolved) cannot account ``sampler`` with ``mechanism``, in its
    own words (:meth:`unsupported`), or None where it can."""
    from dpledger.accounting.accountants import get_accountant, resolve_accountant

    name = resolve_accountant(accountant, sampler, mechanism)
    probe = describe(sampler=sampler, dataset_size=2, batch_size=1, epochs=1, mechanism=mechanism)
    return get_accountant(name).unsupported(probe)


class CalibrateParams(Section):
    """Target (epsilon, delta); the noise multiplier is calibrated to meet it."""

    epsilon: float = Field(
        gt=0.0,
        le=bounds.MAX_EPSILON,
        allow_inf_nan=False,
        description=f"target epsilon (at most {bounds.MAX_EPSILON:g})",
    )
    delta: float = Field(gt=0.0, lt=1.0, allow_inf_nan=False, description="target delta")
    accountant: Literal[("auto", *ACCOUNTANTS)] = Field(  # type: ignore[valid-type]
        default="auto",
        description="auto: pld (poisson, fixed), allocation (balls-in-bins, C = I), montecarlo (C "
        "!= I)",
    )
    sampler: str = Field(
        default="poisson", validate_default=True, description="sampling the accountant assumes"
    )
    mechanism: Literal["identity", "banded", "toeplitz", "blt"] = "identity"
    bands: int = Field(
        default=1, ge=1, le=bounds.MAX_BANDS, description="w for a w-banded correlation matrix"
    )
    group_sizes: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8], min_length=1, max_length=MAX_LIST_LENGTH
    )
    mc_samples: int = Field(
        default=1 << 18,
        ge=bounds.MIN_MC_SAMPLES,
        le=bounds.MAX_MC_SAMPLES,
        description="Monte Carlo samples to estimate/calibrate",
    )
    mc_failure_probability: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        allow_inf_nan=False,
        description="Monte Carlo claim's failure probability; null: min(delta/10, 1e-6); "
        "sets the EVR sample count",
    )
    mc_device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="Monte Carlo sampling device"
    )
    mc_verification: Literal["auto", "plain", "importance"] = Field(
        default="auto",
        description="EVR sampling: auto (importance where it needs fewer fresh samples) | plain | "
        "importance",
    )
    evr_delta_ratio: float = Field(
        default=0.5, gt=0.0, lt=1.0, description="calibrate at delta' = ratio * delta"
    )
    pld_discretization: float = Field(
        default=bounds.DISCRETIZATION,
        ge=bounds.DISCRETIZATION_RANGE[0],
        le=bounds.DISCRETIZATION_RANGE[1],
        description="PLD value discretization interval",
    )
    table_discretization: float = Field(
        default=1e-3,
        ge=bounds.TABLE_DISCRETIZATION_RANGE[0],
        le=bounds.TABLE_DISCRETIZATION_RANGE[1],
        description="PLD interval of the group table and the epsilon curve (pessimistic)",
    )
    curve_points: int = Field(
        default=20, ge=2, le=200, description="points of the epsilon-vs-step curve"
    )
    blt_buffers: int = Field(default=3, ge=1, le=8, description="buffers of an optimized BLT")
    optimize_steps: int = Field(
        default=100, ge=0, le=5000, description="gradient steps optimizing toeplitz/blt C"
    )
    optimize_samples: int = Field(
        default=4096, ge=256, le=1 << 22, description="Monte Carlo samples per step"
    )
    rmse_epsilons: list[float] = Field(
        default_factory=lambda: [0.5, 1.0, 2.0, 4.0, 8.0, 16.0],
        min_length=1,
        max_length=MAX_LIST_LENGTH,
    )
    rmse_samples: int = Field(
        default=8192,
        ge=bounds.MIN_MC_SAMPLES,
        le=1 << 22,
        description="Monte Carlo samples of the RMSE plot",
    )

    @field_validator("sampler")
    @classmethod
    def _accounted_sampler(cls, value: str, info: ValidationInfo) -> str:
        if value not in ACCOUNTED_SAMPLERS:
            reason = f"; {SAMPLERS[value].unaccounted_reason}" if value in SAMPLERS else ""
            raise PydanticCustomError(
                "sampler",
                "allowed values are {allowed}{reason}",
                {"allowed": ", ".join(ACCOUNTED_SAMPLERS), "reason": reason},
            )
        accountant = info.data.get("accountant")
        if accountant not in (None, "auto") and coverage_refusal(accountant, value) is not None:
            covered = [
                sampler
                for sampler in ACCOUNTED_SAMPLERS
                if coverage_refusal(accountant, sampler) is None
            ]
            raise PydanticCustomError(
                "sampler",
                "calibrate.accountant = {accountant} supports samplers {allowed} "
                "(auto picks one that covers calibrate.sampler)",
                {"accountant": accountant, "allowed": ", ".join(covered)},
            )
        return value

    @field_validator("mechanism")
    @classmethod
    def _mechanism_covered(cls, value: str, info: ValidationInfo) -> str:
        sampler, accountant = info.data.get("sampler"), info.data.get("accountant")
        if value == "identity" or sampler is None or accountant is None:
            return value
        reason = coverage_refusal(accountant, sampler, value)
        if reason is not None:
            raise PydanticCustomError("mechanism", "{reason}", {"reason": reason})
        return value

    @field_validator("group_sizes")
    @classmethod
    def _positive_groups(cls, value: list[int]) -> list[int]:
        if any(k < 1 or k > bounds.MAX_GROUP_SIZE for k in value):
            raise PydanticCustomError(
                "group_sizes",
                "every group size must be an integer in [1, {largest}]",
                {"largest": bounds.MAX_GROUP_SIZE},
            )
        return sorted(set(value))

    @field_validator("rmse_epsilons")
    @classmethod
    def _positive_epsilons(cls, value: list[float]) -> list[float]:
        if any(not 0 < e <= bounds.MAX_EPSILON for e in value):
            raise PydanticCustomError(
                "rmse_epsilons",
                "every epsilon must lie in (0, {largest}]",
                {"largest": f"{bounds.MAX_EPSILON:g}"},
            )
        return sorted(set(value))

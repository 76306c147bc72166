"""verify: the debugging battery run against a trainer."""

from __future__ import annotations

from pydantic import Field

from dpledger.params.core import Section


class VerifyParams(Section):
    """Which trainer to test and at what significance."""

    trainer: str = Field(default="dpledger", description="'dpledger' or module:callable")
    significance: float = Field(default=0.05, gt=0.0, lt=0.5)

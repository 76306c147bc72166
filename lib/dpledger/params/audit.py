"""audit: the canary audit that gives an empirical lower bound on epsilon."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpledger.params.core import Section


class AuditParams(Section):
    """Size and statistics of the audit."""

    observations: int = Field(default=1_000_000, ge=100)
    threshold: Literal["bonferroni", "split", "max"] = "bonferroni"
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)

"""report: what the rendered report shows."""

from __future__ import annotations

from pydantic import Field

from dpledger.params.core import Section


class ReportParams(Section):
    """Rendering options of the report."""

    title: str = Field(
        default="dpledger report",
        min_length=1,
        max_length=200,
        description="heading of both report files",
    )
    mc_failure_warning: float = Field(
        default=1e-6,
        gt=0.0,
        lt=1.0,
        description="warn when the Monte Carlo failure probability exceeds this",
    )

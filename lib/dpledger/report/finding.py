"""A finding of the report's checks (:mod:`dpledger.report.checks`) and the number helpers the
checks share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

RELATIVE_SLACK = 1e-9
"""A number exceeds a limit only above limit·(1 + this): round-off in a written metric is no
finding."""


@dataclass(frozen=True)
class Finding:
    """A warning (the claim may be wrong) or a notice (evidence is missing or weak)."""

    kind: str
    severity: Literal["warning", "notice"]
    title: str
    message: str


def real(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def exceeds(value: Any, limit: Any) -> bool:
    value, limit = real(value), real(limit)
    return value is not None and limit is not None and value > limit * (1 + RELATIVE_SLACK)

"""schedule: the sampler that actually builds the batches."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpledger.params.core import Section


class ScheduleParams(Section):
    """Sampler that builds the batches used in training (sizes come from the shared ``batching`` section)."""

    sampler: str = Field(default="poisson", description="a built-in sampler name or module:callable")
    last_batch: Literal["keep", "drop"] = "keep"

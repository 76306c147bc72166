"""schedule: the sampler that actually builds the batches (names and options read from the sampler
registry)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from dpledger.params.core import Section
from dpledger.plugins import PLUGIN_PATTERN
from dpledger.sampling.registry import SAMPLERS

BUILT_SAMPLERS = tuple(SAMPLERS)


def taking(option: str) -> tuple[str, ...]:
    """The built-in samplers that take ``option``."""
    return tuple(name for name, sampler in SAMPLERS.items() if option in sampler.OPTIONS)


class ScheduleParams(Section):
    """Sampler that builds the batches used in training (sizes come from the shared ``batching``
    section)."""

    sampler: str = Field(
        default="poisson", description="a built-in sampler name or module:callable"
    )
    last_batch: Literal["keep", "drop"] = Field(
        default="keep",
        description=f"{', '.join(taking('last_batch'))}: keep or drop a short last batch",
    )
    pad_truncate: bool = Field(
        default=False,
        validate_default=True,
        description="balls-in-bins: pad or truncate every batch to exactly B",
    )
    buffer_size: int | None = Field(
        default=None,
        ge=1,
        validate_default=True,
        description="partial-shuffle: the shuffle buffer K",
    )

    @field_validator("sampler")
    @classmethod
    def _known_sampler(cls, value: str) -> str:
        if value not in BUILT_SAMPLERS and not PLUGIN_PATTERN.match(value):
            raise PydanticCustomError(
                "sampler",
                "allowed values are {allowed} or a plugin module:callable",
                {"allowed": ", ".join(BUILT_SAMPLERS)},
            )
        return value

    @field_validator("pad_truncate")
    @classmethod
    def _pad_truncate_needs_balls_in_bins(cls, value: bool, info: ValidationInfo) -> bool:
        sampler = info.data.get("sampler")
        if value and sampler is not None and sampler not in taking("pad_truncate"):
            raise PydanticCustomError(
                "pad_truncate",
                "pad/truncate applies to schedule.sampler {samplers} only",
                {"samplers": " or ".join(taking("pad_truncate"))},
            )
        return value

    @field_validator("buffer_size")
    @classmethod
    def _buffer_size_for_partial_shuffle(
        cls, value: int | None, info: ValidationInfo
    ) -> int | None:
        sampler, buffered = info.data.get("sampler"), taking("buffer_size")
        if sampler in buffered and value is None:
            raise PydanticCustomError(
                "buffer_size",
                "schedule.sampler {sampler} needs the buffer K (an integer >= 1)",
                {"sampler": sampler},
            )
        if sampler is not None and sampler not in buffered and value is not None:
            raise PydanticCustomError(
                "buffer_size",
                "only schedule.sampler {samplers} takes a buffer size (set null)",
                {"samplers": " or ".join(buffered)},
            )
        return value

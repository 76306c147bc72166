"""schedule: the sampler that actually builds the batches."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from dpledger.params.core import Section
from dpledger.plugins import PLUGIN_PATTERN

# The built-in samplers of dpledger.sampling (a test keeps the two lists equal).
BuiltSampler = Literal[
    "poisson",
    "fixed",
    "balls-in-bins",
    "balls-in-bins-redrawn",
    "shuffle",
    "sequential",
    "partial-shuffle",
    "batch-then-shuffle",
]
BUILT_SAMPLERS: tuple[str, ...] = get_args(BuiltSampler)
PAD_TRUNCATE_SAMPLERS = ("balls-in-bins", "balls-in-bins-redrawn")


class ScheduleParams(Section):
    """Sampler that builds the batches used in training (sizes come from the shared ``batching`` section)."""

    sampler: str = Field(default="poisson", description="a built-in sampler name or module:callable")
    last_batch: Literal["keep", "drop"] = Field(
        default="keep", description="shuffle, sequential, partial-shuffle, batch-then-shuffle: keep or drop a short last batch"
    )
    pad_truncate: bool = Field(
        default=False, validate_default=True, description="balls-in-bins: pad or truncate every batch to exactly B"
    )
    buffer_size: int | None = Field(
        default=None, ge=1, validate_default=True, description="partial-shuffle: the shuffle buffer K"
    )

    @field_validator("sampler")
    @classmethod
    def _known_sampler(cls, value: str) -> str:
        if value not in BUILT_SAMPLERS and not PLUGIN_PATTERN.match(value):
            raise PydanticCustomError(
                "sampler", "allowed values are {allowed} or a plugin module:callable", {"allowed": ", ".join(BUILT_SAMPLERS)}
            )
        return value

    @field_validator("pad_truncate")
    @classmethod
    def _pad_truncate_needs_balls_in_bins(cls, value: bool, info: ValidationInfo) -> bool:
        sampler = info.data.get("sampler")
        if value and sampler is not None and sampler not in PAD_TRUNCATE_SAMPLERS:
            raise PydanticCustomError(
                "pad_truncate", "pad/truncate applies to schedule.sampler balls-in-bins or balls-in-bins-redrawn only"
            )
        return value

    @field_validator("buffer_size")
    @classmethod
    def _buffer_size_for_partial_shuffle(cls, value: int | None, info: ValidationInfo) -> int | None:
        sampler = info.data.get("sampler")
        if sampler == "partial-shuffle" and value is None:
            raise PydanticCustomError("buffer_size", "schedule.sampler partial-shuffle needs the buffer K (an integer >= 1)")
        if sampler is not None and sampler != "partial-shuffle" and value is not None:
            raise PydanticCustomError("buffer_size", "only schedule.sampler partial-shuffle takes a buffer size (set null)")
        return value

"""verify: the debugging battery run against a trainer."""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from dpledger.params.core import Section


class VerifyParams(Section):
    """Which trainer to test, with which optimizer, and at what family-wise significance.

    The default significance is 0.01: a false alarm fails the pipeline, and at 0.05 a correct trainer would
    raise two or more false alarms in 20 runs about a quarter of the time.
    """

    trainer: str = Field(default="dpledger", min_length=1,
                         description="'dpledger' (the engine), 'distributed' (the engine on 2 gloo ranks), "
                                     "'reference', 'opacus', 'zoo:NAME' or module:callable")
    command: str | None = Field(default=None, description="external command template; replaces trainer when set")
    optimizer: Literal["sgd", "adam"] = "sgd"
    significance: float = Field(default=0.01, gt=0.0, lt=0.5)
    fail_pipeline: bool = Field(
        default=True,
        description="stop `dvc repro` when a bug is found; false lets it go on so the report leads with the failure",
    )

    @field_validator("command")
    @classmethod
    def _splittable_command(cls, value: str | None) -> str | None:
        # An empty command must not fall back to the built-in trainer: that would verify the wrong thing.
        if value is None:
            return value
        try:
            arguments = shlex.split(value)
        except ValueError as error:
            raise PydanticCustomError("command", "it cannot be split into arguments ({reason})", {"reason": str(error)})
        if not arguments:
            raise PydanticCustomError("command", "it is empty: give a command, or null to use verify.trainer")
        return value

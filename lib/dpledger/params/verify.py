"""verify: the debugging battery run against a trainer."""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from dpledger.params.core import Section


class VerifyParams(Section):
    """Which trainer to test, with which optimizer, and at what family-wise significance.

    The default significance is 0.01: a false alarm fails the pipeline, and at 0.05 a correct
    trainer would raise two or more false alarms in 20 runs about a quarter of the time.
    """

    trainer: str = Field(
        default="dpledger",
        min_length=1,
        description="'dpledger' (the engine), 'distributed' (the engine on 2 gloo ranks), "
        "'reference', 'opacus', 'zoo:NAME' or module:callable",
    )
    command: str | None = Field(
        default=None, description="external command template; replaces trainer when set"
    )
    model: Literal["synthetic", "train"] = Field(
        default="synthetic",
        description="synthetic (the battery's MLP) | train (the train stage's model, "
        "task loss and data)",
    )
    optimizer: Literal["sgd", "adam"] = "sgd"
    significance: float = Field(default=0.01, gt=0.0, lt=0.5)
    fail_pipeline: bool = Field(
        default=True,
        description="stop `dvc repro` when a bug is found; "
        "false lets it go on so the report leads with the failure",
    )

    @field_validator("command")
    @classmethod
    def _splittable_command(cls, value: str | None) -> str | None:
        # An empty command must not fall back to the built-in trainer: that would verify the wrong
        # thing.
        if value is None:
            return value
        try:
            arguments = shlex.split(value)
        except ValueError as error:
            raise PydanticCustomError(
                "command", "it cannot be split into arguments ({reason})", {"reason": str(error)}
            ) from None
        if not arguments:
            raise PydanticCustomError(
                "command", "it is empty: give a command, or null to use verify.trainer"
            )
        return value

    @field_validator("model")
    @classmethod
    def _command_trains_the_synthetic_model(cls, value: str, info: ValidationInfo) -> str:
        # The command's data file describes the synthetic MLP and its loss only: it cannot train
        # another model.
        if value == "train" and info.data.get("command"):
            raise PydanticCustomError(
                "model",
                "an external verify.command trains the synthetic MLP only; "
                "use verify.trainer with model: train",
            )
        return value

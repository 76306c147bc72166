"""Shared pieces of the params schema: the strict base model and the one-line error format."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from dpledger.errors import ParamsError
from dpledger.params.bounds import MAX_EPOCHS


def _bool_where_number(value: Any, annotation: Any) -> bool:
    """Whether ``value`` holds a boolean where ``annotation`` wants an int or a float (YAML's
    yes/no/on/off)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        return bool not in args and any(_bool_where_number(value, arg) for arg in args)
    if origin is list and isinstance(value, list) and args:
        return any(_bool_where_number(item, args[0]) for item in value)
    return isinstance(value, bool) and annotation in (int, float)


class Section(BaseModel):
    """A params.yaml section: unknown (typo'd) keys are refused, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads true as 1, so `epochs: yes` would silently train for one epoch.
        if info.field_name is not None and _bool_where_number(
            value, cls.model_fields[info.field_name].annotation
        ):
            raise PydanticCustomError(
                "bool_not_number", "a boolean (true/false, yes/no, on/off) is not a number", {}
            )
        return value


class DataParams(Section):
    """Which dataset to train on. ``digits`` ships inside scikit-learn, so it needs no download;
    ``text`` is a JSONL or CSV file tokenized by a local transformers tokenizer
    (lib/dpledger/data/text.py)."""

    name: Literal["digits", "npz", "cifar10", "mnist", "text"] = "digits"
    path: str | None = Field(
        default=None,
        min_length=1,
        validate_default=True,
        description="file or folder for npz / cifar10 / mnist / text",
    )
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    tokenizer: str | None = Field(
        default=None, description="text: folder of the model's own tokenizer (local files only)"
    )
    max_length: int = Field(
        default=128, gt=0, description="text: tokens kept per example (longer texts are truncated)"
    )
    text_field: str = Field(
        default="text", min_length=1, description="text: the column/key holding the text"
    )
    label_field: str = Field(
        default="label", min_length=1, description="text: the column/key holding class labels"
    )

    @field_validator("path")
    @classmethod
    def _path_matches_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        name = info.data.get("name")
        if name == "digits" and value is not None:
            raise PydanticCustomError(
                "path", "data.name = digits is embedded and reads no file (set data.path: null)"
            )
        if name not in (None, "digits") and value is None:
            raise PydanticCustomError(
                "path", "data.name = {name} reads its arrays from a file or folder", {"name": name}
            )
        return value


class BatchingParams(Section):
    """Sizes shared by the accountant (calibrate) and the sampler (schedule), so the two cannot
    drift."""

    batch_size: int = Field(default=64, ge=1, description="expected (Poisson) or fixed batch size")
    epochs: int = Field(default=5, ge=1, le=MAX_EPOCHS)


def _describe_error(err: dict[str, Any], prefix: str) -> str:
    loc = ".".join(str(part) for part in err["loc"])
    key = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
    kind = err["type"]
    if kind == "missing":
        return f"params: {key} is missing"
    if kind == "extra_forbidden":
        return f"params: {key} is not a known key (check its spelling)"
    value = err.get("input")
    message = err["msg"]
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        message = f"allowed values are {ctx['expected']}"
    return f"params: {key} = {value!r} is invalid: {message}"


def validation_error_to_params_error(error: ValidationError, prefix: str = "") -> ParamsError:
    """Turn pydantic's multi-line error into one line naming the key, the value and what is
    allowed."""
    first = error.errors()[0]
    return ParamsError(_describe_error(first, prefix))

"""train.lora: a LoRA adapter (Hu et al. 2021, via peft) trained in place of an hf model's
weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from dpledger.params.bounds import MAX_WIDTH
from dpledger.params.core import Section

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_folder(path: Any) -> bool:
    """Whether ``path`` is a folder saved by ``PeftModel.save_pretrained`` (it has
    adapter_config.json)."""
    return isinstance(path, str) and (Path(path) / ADAPTER_CONFIG).is_file()


class LoraParams(Section):
    """Rank r and scale α/r of the low-rank update B·A added to each target layer; every base weight
    frozen.

    ``dropout`` is kept as a key so that a recipe copied from a non-private one is refused, not
    silently changed: the engine trains ``lora_A`` and ``lora_B`` with its Linear rule on the
    layer's actual input, and dpledger's LoRA runs without dropout."""

    rank: int = Field(default=8, ge=1, le=MAX_WIDTH, description="r: the adapter's rank")
    alpha: float = Field(
        default=16.0,
        gt=0.0,
        allow_inf_nan=False,
        description="α: the update is scaled by α/r",
    )
    target_modules: list[str] | None = Field(
        default=None,
        description="names of the layers to adapt (null: peft's default for the model type)",
    )
    dropout: float = Field(default=0.0, description="must be 0")

    @field_validator("dropout")
    @classmethod
    def _no_dropout(cls, value: float) -> float:
        if value != 0.0:
            message = "LoRA dropout must be 0 (dpledger trains LoRA without dropout)"
            raise PydanticCustomError("dropout", message)
        return value

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not all(value)):
            raise PydanticCustomError("target_modules", "a non-empty list of layer names, or null")
        return value

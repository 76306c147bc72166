"""train: model, optimizer and clipping of the DP-SGD run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpledger.params.core import Section


class TrainParams(Section):
    """DP-SGD training settings; the noise multiplier comes from the calibrate stage."""

    model: Literal["mlp", "cnn", "transformer"] = "mlp"
    clip_norm: float = Field(default=1.0, gt=0.0)
    lr: float = Field(default=0.5, gt=0.0)
    optimizer: Literal["sgd", "momentum", "adam"] = "sgd"
    allow_sampler_mismatch: bool = False

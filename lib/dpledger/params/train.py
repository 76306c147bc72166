"""train: model, optimizer, clipping and engine settings of the DP-SGD run (σ comes from calibrate)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from dpledger.params.core import Section
from dpledger.plugins import PLUGIN_PATTERN

ZOO_MODELS = ("mlp", "cnn", "transformer")


class TrainParams(Section):
    """DP-SGD training settings; the noise multiplier and correlated-noise mechanism come from calibrate."""

    model: str = Field(
        default="mlp", description="a zoo model (mlp, cnn, transformer), hf, or a plugin module:callable"
    )
    model_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the model (hf: path, init, config, dtype)"
    )
    task: Literal["classification", "causal-lm", "sequence-classification"] = Field(
        default="classification", description="what the model predicts, hence its per-example loss and metric"
    )
    clip_norm: float = Field(default=1.0, gt=0.0, allow_inf_nan=False, description="per-example clipping threshold R")
    clipping: Literal["flat", "per-layer", "automatic"] = Field(default="flat", description="clipping style")
    automatic_gamma: float = Field(
        default=0.01, gt=0.0, allow_inf_nan=False, description="γ of automatic clipping R/(‖g‖+γ)"
    )
    lr: float = Field(default=0.5, gt=0.0, allow_inf_nan=False)
    optimizer: Literal["sgd", "momentum", "adam"] = "sgd"
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0, description="for optimizer: momentum")
    physical_batch_size: int | None = Field(
        default=None, ge=1, description="split each logical batch into physical batches of at most this size"
    )
    ghost: Literal["auto", "always", "never"] = Field(
        default="auto", description="per-layer norm method (auto: 2T² < p·d)"
    )
    secure_noise: bool = Field(default=False, description="draw noise from the OS CSPRNG (not replayable)")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32", description="CUDA autocast dtype; norms stay fp32"
    )
    checkpoint_every: int = Field(default=20, ge=1, description="steps between checkpoints (and at each epoch end)")
    allow_sampler_mismatch: bool = False
    processes: int = Field(
        default=1,
        ge=1,
        le=256,
        description="data-parallel training processes on this machine (torch.distributed; gloo/nccl)",
    )

    self_check: bool = Field(
        default=True,
        description="before the first step, prove the engine exact on the model (naive loop)",
    )
    self_check_examples: int = Field(
        default=4, ge=1, le=64, description="self-check: examples of the run's first batch compared"
    )
    self_check_parameters: list[str] = Field(
        default_factory=list,
        description="self-check: glob patterns of the parameters compared (empty: all)",
    )

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in (*ZOO_MODELS, "hf") and not PLUGIN_PATTERN.match(value):
            raise PydanticCustomError(
                "model",
                "allowed values are {allowed}, hf or a plugin module:callable",
                {"allowed": ", ".join(ZOO_MODELS)},
            )
        return value

"""train: model, optimizer, clipping and engine settings of the DP-SGD run (σ comes from
calibrate)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from dpledger.params.core import Section
from dpledger.params.lora import LoraParams, is_adapter_folder
from dpledger.plugins import PLUGIN_PATTERN

ZOO_MODELS = ("mlp", "cnn", "transformer")


class TrainParams(Section):
    """DP-SGD training settings; the noise multiplier and correlated-noise mechanism come from
    calibrate."""

    model: str = Field(
        default="mlp",
        description="a zoo model (mlp, cnn, transformer), hf, or a plugin module:callable",
    )
    model_options: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of the model (hf: path, init, config, dtype)",
    )
    prior_data: Literal["overlapping", "disjoint"] | None = Field(
        default=None,
        description="a privately trained starting point (a model_options.path folder with privacy.json): its training data overlaps this run's (its ε is composed into the claim) "  # noqa: E501
        "or is disjoint (declared; named in the card)",
    )
    task: Literal["classification", "causal-lm", "sequence-classification"] = Field(
        default="classification",
        description="what the model predicts, hence its per-example loss and metric",
    )
    clip_norm: float = Field(
        default=1.0, gt=0.0, allow_inf_nan=False, description="per-example clipping threshold R"
    )
    clipping: Literal["flat", "per-layer", "automatic"] = Field(
        default="flat", description="clipping style"
    )
    automatic_gamma: float = Field(
        default=0.01, gt=0.0, allow_inf_nan=False, description="γ of automatic clipping R/(‖g‖+γ)"
    )
    lr: float = Field(default=0.5, gt=0.0, allow_inf_nan=False)
    optimizer: Literal["sgd", "momentum", "adam", "adamw"] = "sgd"
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0, description="for optimizer: momentum")
    weight_decay: float = Field(
        default=0.0,
        ge=0.0,
        allow_inf_nan=False,
        description="torch's weight_decay (decoupled for adamw)",
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        default="constant",
        description="lr after the warm-up, per logical step: constant or decay to 0",
    )
    warmup_steps: int = Field(
        default=0,
        ge=0,
        description="logical steps of linear warm-up from 0 to lr",
    )
    lora: LoraParams | None = Field(
        default=None,
        description="hf models: train a LoRA adapter only (peft)",
    )
    export_merged: bool = Field(
        default=False, description="LoRA: also publish the base model with the adapter merged in"
    )
    physical_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="split each logical batch into physical batches of at most this size",
    )
    ghost: Literal["auto", "always", "never"] = Field(
        default="auto", description="per-layer norm method (auto: 2T² < p·d)"
    )
    secure_noise: bool = Field(
        default=False, description="draw noise from the OS CSPRNG (not replayable)"
    )
    noise_key_file: str | None = Field(
        default=None,
        description="an untracked file holding the secret noise key (hex; else DPLEDGER_NOISE_KEY or a fresh CSPRNG key)",  # noqa: E501
    )
    insecure_public_seed: bool = Field(
        default=False,
        description="derive the noise key from the tracked seed: no privacy guarantee against anyone who has this repository",  # noqa: E501
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="intra-op CPU threads of the steps (default: torch's); a resumed run keeps the count it started with, so it stays bit-identical",  # noqa: E501
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32", description="CUDA autocast dtype; norms stay fp32"
    )
    checkpoint_every: int = Field(
        default=20, ge=1, description="steps between checkpoints (and at each epoch end)"
    )
    allow_sampler_mismatch: bool = False
    processes: int = Field(
        default=1,
        ge=1,
        le=256,
        description="data-parallel training processes on this machine (torch.distributed; "
        "gloo/nccl)",
    )
    sharding: Literal["none", "fsdp"] = Field(
        default="none",
        description="fsdp: shard parameters, gradients and optimizer state over the processes "
        "(FSDP2); none: a full copy on every process",
    )

    self_check: bool = Field(
        default=True,
        description="before the first step, prove the engine exact on the model (naive loop), "
        "in float64 and in the training dtype; again at one later step on the live model",
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

    @field_validator("lora")
    @classmethod
    def _lora_on_hf(cls, value: LoraParams | None, info: ValidationInfo) -> LoraParams | None:
        model = info.data.get("model")
        if value is not None and model != "hf":
            raise PydanticCustomError(
                "lora", "LoRA adapts an hf model (train.model: hf), not '{model}'", {"model": model}
            )
        return value

    @field_validator("export_merged")
    @classmethod
    def _merged_needs_lora(cls, value: bool, info: ValidationInfo) -> bool:
        adapter = is_adapter_folder((info.data.get("model_options") or {}).get("path"))
        if value and info.data.get("lora") is None and not adapter:
            raise PydanticCustomError(
                "export_merged",
                "merged weights are a LoRA export: "
                "set train.lora or give a peft adapter folder as train.model_options.path",
            )
        return value

    @field_validator("precision")
    @classmethod
    def _no_fp16(cls, value: str) -> str:
        """fp16 has no loss scaling here: an LM head's output gradients (about 1e-7 at a 50k
        vocabulary) underflow and training silently learns little. bf16 has float32's
        range."""
        if value == "fp16":
            raise PydanticCustomError(
                "precision",
                "fp16 is refused (no loss scaling: small gradients underflow to zero); use bf16",
            )
        return value

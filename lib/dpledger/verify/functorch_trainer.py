"""A short exact DP-SGD trainer (torch.func per-example gradients) whose flaws can be switched on.

With the default :class:`Flaws` it is correct (000 Alg. 1) and serves as the battery's
``reference`` trainer; each flaw reproduces one implementation bug, so the deliberately flawed
trainers (:mod:`dpledger.verify.flawed_trainers`) are this one function with different flags rather
than copies with small variations. (The engine's correct per-example oracle is
:mod:`dpledger.engine.reference`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpledger.verify.consecutive import (
    ConsecutiveRun,
    LossFn,
    consecutive_batches,
    protocol_trainer,
)


@dataclass(frozen=True)
class Flaws:
    """Which bugs to reproduce; every field's first value is the correct behaviour."""

    clipping: Literal["per_example", "none", "mini_batch", "per_tensor"] = "per_example"
    """per_tensor: each parameter tensor of an example clipped to C on its own (total norm up to
    C·√tensors)."""
    noise_std: Literal["calibrated", "uncalibrated", "divided_twice"] = "calibrated"
    """Noise std on the clipped sum: σC (correct), σ, or σC/B (then divided by B again)."""
    noise_seed: Literal["per_run", "fixed"] = "per_run"
    """fixed: the noise generator ignores ``seed``, so every run draws the same noise."""
    noise_steps: Literal["every_step", "reused", "first_step_only"] = "every_step"
    """reused: the generator is re-seeded each step, so every step adds the same noise vector."""


CORRECT = Flaws()


def _clip_factors(norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    return torch.where(
        norms > clip_norm, clip_norm / norms.clamp_min(1e-30), torch.ones_like(norms)
    )


def _clipped_sum(
    grads: dict[str, torch.Tensor], clip_norm: float, clipping: str
) -> dict[str, torch.Tensor]:
    """Σ_b of the per-example gradients after the chosen clipping (000 Eq. 2)."""
    batch = next(iter(grads.values())).shape[0]
    if clipping == "per_example":
        norms = torch.sqrt(sum(g.reshape(batch, -1).pow(2).sum(dim=1) for g in grads.values()))
        factors = _clip_factors(norms, clip_norm)
        return {name: torch.einsum("b,b...->...", factors, g) for name, g in grads.items()}
    if clipping == "per_tensor":
        return {
            name: torch.einsum(
                "b,b...->...", _clip_factors(g.reshape(batch, -1).norm(dim=1), clip_norm), g
            )
            for name, g in grads.items()
        }
    summed = {name: g.sum(dim=0) for name, g in grads.items()}
    if clipping == "none":
        return summed
    mean_norm = torch.sqrt(sum(s.pow(2).sum() for s in summed.values())) / batch
    factor = _clip_factors(mean_norm.reshape(1), clip_norm)[0]
    return {name: factor * s for name, s in summed.items()}


def _noise_std(flaws: Flaws, clip_norm: float, noise_multiplier: float, batch_size: int) -> float:
    if flaws.noise_std == "uncalibrated":
        return noise_multiplier
    if flaws.noise_std == "divided_twice":
        return noise_multiplier * clip_norm / batch_size
    return noise_multiplier * clip_norm


def _make_optimizer(name: str, parameters, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr)
    raise ValueError(f"optimizer {name!r} is not supported; use 'sgd' or 'adam'")


@protocol_trainer
def train_with_flaws(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn,
    run: ConsecutiveRun,
    flaws: Flaws = CORRECT,
) -> None:
    """DP-SGD on consecutive batches (the protocol of :mod:`dpledger.verify.protocol`), with
    ``flaws``."""

    def example_loss(
        params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        return loss_fn(functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0)).sum()

    per_example_grads = vmap(grad(example_loss), in_dims=(None, 0, 0))
    # Only what requires a gradient is trained (LoRA: the adapter); frozen weights stay as they are.
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    optim = _make_optimizer(run.optimizer, trainable.values(), run.lr)
    noise_seed = 0 if flaws.noise_seed == "fixed" else run.seed
    generator = torch.Generator().manual_seed(noise_seed)
    std = _noise_std(flaws, run.clip_norm, run.noise_multiplier, run.batch_size)
    for step, (batch_inputs, batch_targets) in enumerate(
        consecutive_batches(inputs, targets, run.batch_size, run.steps)
    ):
        params = {name: p.detach() for name, p in trainable.items()}
        summed = _clipped_sum(
            per_example_grads(params, batch_inputs, batch_targets), run.clip_norm, flaws.clipping
        )
        if flaws.noise_steps == "reused":
            generator.manual_seed(noise_seed)
        add_noise = std > 0 and not (flaws.noise_steps == "first_step_only" and step > 0)
        for name, p in trainable.items():
            noise = torch.normal(0.0, std, size=p.shape, generator=generator) if add_noise else 0.0
            p.grad = (summed[name] + noise) / run.batch_size
        optim.step()
        optim.zero_grad(set_to_none=True)


train = partial(train_with_flaws, flaws=CORRECT)
"""The correct reference trainer."""

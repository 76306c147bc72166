"""Opacus 1.6 used correctly, as a protocol trainer: GradSampleModule + DPOptimizer, seeded noise.

No one here wrote Opacus, so it is the independent correct trainer the battery must pass. Batches are
the protocol's consecutive slices (no Poisson loader), so runs differ only in the noise.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import nn

from dpledger.engine.consecutive import consecutive_batches


def train(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    clip_norm: float,
    noise_multiplier: float,
    batch_size: int,
    steps: int,
    lr: float,
    seed: int,
    optimizer: str = "sgd",
) -> None:
    """DP-SGD with Opacus: noise σC on the clipped sum, divided by the batch size ("mean" reduction)."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    wrapped = GradSampleModule(model, loss_reduction="mean")
    optimizers = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}
    if optimizer not in optimizers:
        raise ValueError(f"optimizer {optimizer!r} is not supported; use 'sgd' or 'adam'")
    private = DPOptimizer(
        optimizers[optimizer](wrapped.parameters(), lr=lr),
        noise_multiplier=noise_multiplier,
        max_grad_norm=clip_norm,
        expected_batch_size=batch_size,
        loss_reduction="mean",
        generator=torch.Generator().manual_seed(seed),
    )
    try:
        for batch_inputs, batch_targets in consecutive_batches(inputs, targets, batch_size, steps):
            private.zero_grad(set_to_none=True)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss_fn(wrapped(batch_inputs), batch_targets).mean().backward()
            private.step()
    finally:
        wrapped._close()

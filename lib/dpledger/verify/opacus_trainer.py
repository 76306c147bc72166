"""Opacus 1.6 used correctly, as a protocol trainer: GradSampleModule + DPOptimizer, seeded noise.

No one here wrote Opacus, so it is the independent correct trainer the battery must pass. Batches
are the protocol's consecutive slices (no Poisson loader), so runs differ only in the noise.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from dpledger.verify.consecutive import (
    ConsecutiveRun,
    LossFn,
    consecutive_batches,
    protocol_trainer,
)


@protocol_trainer
def train(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn,
    run: ConsecutiveRun,
) -> None:
    """DP-SGD with Opacus: noise σC on the clipped sum, divided by the batch size ("mean"
    reduction)."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    wrapped = GradSampleModule(model, loss_reduction="mean")
    optimizers = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}
    if run.optimizer not in optimizers:
        raise ValueError(f"optimizer {run.optimizer!r} is not supported; use 'sgd' or 'adam'")
    private = DPOptimizer(
        optimizers[run.optimizer](wrapped.parameters(), lr=run.lr),
        noise_multiplier=run.noise_multiplier,
        max_grad_norm=run.clip_norm,
        expected_batch_size=run.batch_size,
        loss_reduction="mean",
        generator=torch.Generator().manual_seed(run.seed),
    )
    try:
        for batch_inputs, batch_targets in consecutive_batches(
            inputs, targets, run.batch_size, run.steps
        ):
            private.zero_grad(set_to_none=True)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss_fn(wrapped(batch_inputs), batch_targets).mean().backward()
            private.step()
    finally:
        wrapped._close()

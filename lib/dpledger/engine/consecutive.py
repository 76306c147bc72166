"""The trainer-under-test protocol of the verify stage: DP-SGD on consecutive batches, no sampling."""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
from torch import Tensor, nn

from dpledger.engine.bk import BKEngine
from dpledger.engine.optimizers import make_optimizer
from dpledger.engine.reference import ReferenceTrainer


def consecutive_indices(step: int, batch_size: int, dataset_size: int) -> np.ndarray:
    """Rows [t·B, (t+1)·B) mod n of step t."""
    return np.arange(step * batch_size, (step + 1) * batch_size) % dataset_size


def consecutive_batches(inputs: Tensor, targets: Tensor, batch_size: int, steps: int) -> Iterator[tuple[Tensor, Tensor]]:
    """The protocol's batches: ``(inputs[rows], targets[rows])`` for step t = 0 … steps − 1, rows as in
    :func:`consecutive_indices` (no sampling, so runs differ only in the noise)."""
    for step in range(steps):
        rows = consecutive_indices(step, batch_size, inputs.shape[0])
        yield inputs[rows], targets[rows]


def train_consecutive(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    *,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    clip_norm: float,
    noise_multiplier: float,
    batch_size: int,
    steps: int,
    lr: float,
    seed: int,
    optimizer: str = "sgd",
    reference: bool = False,
) -> None:
    """Train ``model`` in place with DP-SGD (the BK engine; ``reference=True``: the per-example reference).

    ``loss_fn(outputs, targets)`` returns per-example losses; each step's update is
    lr · (Σ clipped per-example gradients + σ·C·N(0, I)) / batch_size, noise seeded by ``seed``.
    """
    model.train()
    torch_optimizer = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], lr)
    if reference:
        trainer = ReferenceTrainer(model, torch_optimizer, loss_fn=loss_fn, clip_norm=clip_norm,
                                   noise_multiplier=noise_multiplier, normalizer=batch_size, seed=seed)
        for batch_inputs, batch_targets in consecutive_batches(inputs, targets, batch_size, steps):
            trainer.step(batch_inputs, batch_targets)
        return
    engine = BKEngine(model, torch_optimizer, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                      normalizer=batch_size, seed=seed)
    try:
        for batch_inputs, batch_targets in consecutive_batches(inputs, targets, batch_size, steps):
            engine.private_step(loss_fn(model(batch_inputs), batch_targets))
    finally:
        engine.detach()

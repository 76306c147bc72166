"""The trainer-under-test protocol of the verify stage: DP-SGD on consecutive batches, no sampling.

The protocol's types (:class:`ConsecutiveRun`, ``LossFn``, ``Trainer``) live here, below both
:mod:`dpledger.verify.protocol` (which loads trainers) and the flawed trainers it can load, so
neither imports the other back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from torch import Tensor, nn

from dpledger.engine.bk import BKEngine
from dpledger.engine.optimizers import make_optimizer
from dpledger.engine.reference import ReferenceTrainer
from dpledger.engine.state_guard import check_state_unchanged, state_snapshot


def consecutive_indices(step: int, batch_size: int, dataset_size: int) -> np.ndarray:
    """Rows [t·B, (t+1)·B) mod n of step t."""
    return np.arange(step * batch_size, (step + 1) * batch_size) % dataset_size


def consecutive_batches(
    inputs: Tensor, targets: Tensor, batch_size: int, steps: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """The protocol's batches: ``(inputs[rows], targets[rows])`` for step t = 0 … steps − 1, rows as
    in :func:`consecutive_indices` (no sampling, so runs differ only in the noise)."""
    for step in range(steps):
        rows = consecutive_indices(step, batch_size, inputs.shape[0])
        yield inputs[rows], targets[rows]


LossFn = Callable[[Tensor, Tensor], Tensor]
"""``loss_fn(outputs, targets)``: per-example losses."""

Trainer = Callable[..., None]
"""A DP-SGD trainer under test: a callable with the signature of :mod:`dpledger.verify.protocol`
(the built-in ones get it from :func:`protocol_trainer`)."""


@dataclass(frozen=True)
class ConsecutiveRun:
    """The settings of one protocol run: clipping norm C, noise multiplier σ, batch size B, steps,
    learning rate, noise seed and optimizer name."""

    clip_norm: float
    noise_multiplier: float
    batch_size: int
    steps: int
    lr: float
    seed: int
    optimizer: str = "sgd"


def protocol_trainer(body: Callable[..., None]) -> Callable[..., None]:
    """Give ``body(model, inputs, targets, loss_fn, run, **options)`` the keyword signature of the
    verify protocol (:mod:`dpledger.verify.protocol`): ``train(model, inputs, targets, *, loss_fn,
    clip_norm, noise_multiplier, batch_size, steps, lr, seed, optimizer="sgd", **options)``, the
    settings gathered into a :class:`ConsecutiveRun`. The signature is real (no ``__wrapped__``), so
    it can be inspected."""

    def train(
        model: nn.Module,
        inputs: Tensor,
        targets: Tensor,
        *,
        loss_fn: LossFn,
        clip_norm: float,
        noise_multiplier: float,
        batch_size: int,
        steps: int,
        lr: float,
        seed: int,
        optimizer: str = "sgd",
        **options,
    ) -> None:
        run = ConsecutiveRun(clip_norm, noise_multiplier, batch_size, steps, lr, seed, optimizer)
        body(model, inputs, targets, loss_fn, run, **options)

    train.__name__, train.__qualname__ = body.__name__, body.__qualname__
    train.__module__, train.__doc__ = body.__module__, body.__doc__
    return train


@protocol_trainer
def train_consecutive(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    loss_fn: LossFn,
    run: ConsecutiveRun,
    reference: bool = False,
) -> None:
    """Train ``model`` in place with DP-SGD (the BK engine; ``reference=True``: the per-example
    reference).

    ``loss_fn(outputs, targets)`` returns per-example losses; each step's update is
    lr · (Σ clipped per-example gradients + σ·C·N(0, I)) / batch_size, noise seeded by ``seed``.
    """
    model.train()
    torch_optimizer = make_optimizer(
        run.optimizer, [p for p in model.parameters() if p.requires_grad], run.lr
    )
    settings = {
        "clip_norm": run.clip_norm,
        "noise_multiplier": run.noise_multiplier,
        "normalizer": run.batch_size,
        "seed": run.seed,
    }
    batches = consecutive_batches(inputs, targets, run.batch_size, run.steps)
    if reference:
        trainer = ReferenceTrainer(model, torch_optimizer, loss_fn=loss_fn, **settings)
        for batch_inputs, batch_targets in batches:
            trainer.step(batch_inputs, batch_targets)
        return
    engine = BKEngine(model, torch_optimizer, **settings)
    # a model changing its own state is refused (validators)
    state = state_snapshot(model, torch_optimizer)
    try:
        for batch_inputs, batch_targets in batches:
            engine.private_step(loss_fn(model(batch_inputs), batch_targets))
            if state is not None:
                check_state_unchanged(model, torch_optimizer, state)
                state = None
    finally:
        engine.detach()

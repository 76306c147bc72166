"""Calls the trainer under test on fresh copies of the initial model and counts the training steps
used."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from dpledger.verify.errors import TrainerError
from dpledger.verify.protocol import Trainer
from dpledger.verify.task import SyntheticTask, per_example_gradient_norms


@dataclass(frozen=True)
class BatteryConfig:
    """Sizes of every test; the defaults keep the SGD battery near 150 training steps (000 App. D
    costs 500+)."""

    t1_grid_size: int = 8
    t1_grid_span: tuple[float, float] = (1e-3, 10.0)
    """T1's C grid, as multiples of the probe's gradient norm (000 App. D: 8 values)."""
    t2_batch_sizes: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    sensitivity_batch_size: int = 8
    t3_clip_values: int = 8
    t3_seeds: int = 3
    t3_steps: int = 3
    t3_batch_size: int = 16
    sgd_t3_noise_multiplier: float = 1.0
    ks_seeds: int = 4
    ks_batch_size: int = 16
    independence_steps: int = 4
    independence_seeds: int = 4
    sigma_grid: tuple[float, ...] = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
    """000 App. B's σ grid."""
    noise_step_std: float = 0.01
    """Learning rates of the noisy SGD tests are set so one step's noise has this std per
    coordinate."""
    adam_warmup_steps: int = 5
    """000 App. B/E: Adam needs a few steps before its state reflects the gradients' scale."""
    adam_lr: float = 0.01
    adam_sigma_factor: float = 10.0
    """000 App. E: DP-Adam is tested with small noise, this multiple of the heuristic σ*."""


class Runner:
    """Runs the trainer on copies of ``task.model``; under Adam every run starts with the same
    warm-up steps."""

    def __init__(
        self, trainer: Trainer, task: SyntheticTask, optimizer: str, config: BatteryConfig
    ) -> None:
        self.trainer = trainer
        self.task = task
        self.optimizer = optimizer
        self.warmup_steps = config.adam_warmup_steps if optimizer == "adam" else 0
        self.steps_used = 0

    def _warmup_rows(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every warm-up batch is B copies of one ordinary row, so its clipped mean does not depend
        on B."""
        count = self.warmup_steps * batch_size
        inputs, targets = self.task.inputs[:1], self.task.targets[:1]
        return inputs.repeat(count, *[1] * (inputs.ndim - 1)), targets.repeat(
            count, *[1] * (targets.ndim - 1)
        )

    def train(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        clip_norm: float,
        noise_multiplier: float,
        batch_size: int,
        lr: float,
        seed: int,
    ) -> nn.Module:
        """Train a copy of the initial model (warm-up first, under Adam) and return it."""
        inputs, targets = self._with_warmup(inputs, targets, batch_size)
        return self._run(
            inputs,
            targets,
            clip_norm=clip_norm,
            noise_multiplier=noise_multiplier,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
        )

    def largest_gradient_norm(self, inputs: torch.Tensor, targets: torch.Tensor, **run) -> float:
        """The largest per-example gradient norm of a run's rows (warm-up included), each batch's
        measured by the harness's own loop at the model the trainer reached before that batch: a
        σ = 0 run at any clip norm above it clips nothing. Costs one run per prefix, T·(T − 1)/2
        steps for T batches."""
        batch_size = run["batch_size"]
        inputs, targets = self._with_warmup(inputs, targets, batch_size)
        largest = 0.0
        for start in range(0, inputs.shape[0], batch_size):
            model = self.task.model
            if start:
                model = self._run(inputs[:start], targets[:start], **run)
            rows = slice(start, start + batch_size)
            loss_fn = self.task.loss_fn
            norms = per_example_gradient_norms(model, inputs[rows], targets[rows], loss_fn)
            largest = max(largest, float(norms.max()))
        return largest

    def _with_warmup(
        self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The warm-up rows (none under SGD), then ``inputs``."""
        warm_inputs, warm_targets = self._warmup_rows(batch_size)
        if inputs.shape[0] % batch_size:
            raise ValueError("the rows must fill whole batches")
        return torch.cat([warm_inputs, inputs]), torch.cat([warm_targets, targets])

    def _run(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        clip_norm: float,
        noise_multiplier: float,
        batch_size: int,
        lr: float,
        seed: int,
    ) -> nn.Module:
        """Train a copy of the initial model on exactly these rows (no warm-up added); return it."""
        steps = inputs.shape[0] // batch_size
        model = copy.deepcopy(self.task.model)
        try:
            self.trainer(
                model,
                inputs,
                targets,
                loss_fn=self.task.loss_fn,
                clip_norm=float(clip_norm),
                noise_multiplier=float(noise_multiplier),
                batch_size=int(batch_size),
                steps=int(steps),
                lr=float(lr),
                seed=int(seed),
                optimizer=self.optimizer,
            )
        except TrainerError:
            raise
        except (
            Exception
        ) as error:  # the trainer under test is foreign code: report its failure in one line
            raise TrainerError(
                f"the trainer under test raised {type(error).__name__}: {error}".splitlines()[0]
            ) from None
        self.steps_used += steps
        if changed := self.task.changed_frozen_parameter(model):
            raise TrainerError(
                f"the trainer under test changed {changed!r}, "
                "a parameter the engine does not train (requires_grad=False): "
                "that change is released without clipping or noise; "
                "train only the trainable parameters"
            )
        return model

    def parameters_after(
        self, inputs: torch.Tensor, targets: torch.Tensor, **settings
    ) -> torch.Tensor:
        """Flat float64 trainable parameters after training (see :meth:`train`)."""
        return self.task.flat(self.train(inputs, targets, **settings))

    def loss_change(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        eval_inputs: torch.Tensor,
        eval_targets: torch.Tensor,
        **settings,
    ) -> float:
        """ΔL (000 Eq. 3): summed loss on the evaluation rows after the test steps minus before
        them.

        "Before" is the initial model, or under Adam the model after the same warm-up steps alone.
        """
        after = self.train(inputs, targets, **settings)
        before = self.task.model
        if self.warmup_steps:
            before = self.train(inputs[:0], targets[:0], **settings)
        return float(
            self.task.losses(after, eval_inputs, eval_targets).sum()
            - self.task.losses(before, eval_inputs, eval_targets).sum()
        )

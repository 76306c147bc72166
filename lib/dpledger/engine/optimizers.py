"""Torch optimizers by name, and the learning-rate schedule; each consumes the private gradient the
engine writes into ``p.grad``, so neither touches privacy (post-processing of the released noisy
sums).

The schedule is counted in logical steps: the train stage calls ``scheduler.step()`` once after each
``engine.step()``, so step t of the privacy ledger runs at ``lr · LrSchedule(t)``. Its formulas are
those of transformers' ``get_{constant,linear,cosine}_schedule_with_warmup`` (Li et al. 2022 use
linear decay): a warm-up from 0 at step 0 to ``lr`` at ``warmup_steps``, then constant, linear decay
to 0 at the last step, or half a cosine to 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch

from dpledger.errors import ParamsError

OPTIMIZERS: tuple[str, ...] = ("sgd", "momentum", "adam", "adamw")
LR_SCHEDULES: tuple[str, ...] = ("constant", "linear", "cosine")


def make_optimizer(
    name: str,
    params: Iterable[torch.nn.Parameter],
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """``sgd`` (plain), ``momentum`` (SGD with momentum), ``adam`` or ``adamw``. ``weight_decay`` is
    torch's: an L2 term added to the gradient for sgd/momentum/adam, decoupled (Loshchilov & Hutter)
    for adamw. The ``foreach`` implementations on every device (a few launches per step instead of a
    few per parameter; torch chooses them only on GPUs)."""
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "momentum":
        return torch.optim.SGD(
            params, lr=lr, momentum=momentum, weight_decay=weight_decay, foreach=True
        )
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)
    allowed = ", ".join(OPTIMIZERS)
    where = f"params: train.optimizer = {name!r} is invalid"
    raise ParamsError(f"{where}: allowed values are {allowed}")


@dataclass(frozen=True)
class LrSchedule:
    """The factor on ``lr`` at logical step ``step`` (0-based) of ``total_steps``.

    A callable object rather than a function, so ``LambdaLR.state_dict()`` saves its fields (plain
    numbers and a string, readable by ``torch.load(weights_only=True)``)."""

    kind: str
    warmup_steps: int
    total_steps: int

    def __call__(self, step: int) -> float:
        # the expressions of transformers.optimization, term for term, so the two agree to the bit
        if step < self.warmup_steps:
            return float(step) / float(max(1, self.warmup_steps))
        if self.kind == "constant":
            return 1.0
        decay_steps = self.total_steps - self.warmup_steps
        if self.kind == "linear":
            return max(
                0.0,
                float(self.total_steps - step) / float(max(1, decay_steps)),
            )
        progress = float(step - self.warmup_steps) / float(max(1, decay_steps))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


def make_scheduler(
    optimizer: torch.optim.Optimizer, kind: str, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` over :class:`LrSchedule`; a warm-up that does not end before the last step is
    refused."""
    if kind not in LR_SCHEDULES:
        allowed = ", ".join(LR_SCHEDULES)
        where = f"params: train.lr_schedule = {kind!r} is invalid"
        raise ParamsError(f"{where}: allowed values are {allowed}")
    if warmup_steps and warmup_steps >= total_steps:
        raise ParamsError(
            f"params: train.warmup_steps = {warmup_steps} is invalid: "
            f"the schedule has {total_steps} logical steps and the warm-up must end before the last one"  # noqa: E501
        )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, LrSchedule(kind, warmup_steps, total_steps))

"""Torch optimizers by name; each consumes the private gradient the engine writes into ``p.grad``."""

from __future__ import annotations

from typing import Iterable

import torch

from dpledger.errors import ParamsError

OPTIMIZERS: tuple[str, ...] = ("sgd", "momentum", "adam")


def make_optimizer(
    name: str, params: Iterable[torch.nn.Parameter], lr: float, momentum: float = 0.9
) -> torch.optim.Optimizer:
    """``sgd`` (plain), ``momentum`` (SGD with momentum) or ``adam``; the ``foreach`` implementations on
    every device (a few launches per step instead of a few per parameter; torch chooses them only on GPUs)."""
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=True)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, foreach=True)
    raise ParamsError(f"params: train.optimizer = {name!r} is invalid: allowed values are {', '.join(OPTIMIZERS)}")

"""What the self-check's copy of the model runs under: dropout off where no attribute holds its
rate, batch statistics refused by name, and the name of an attribute that stops the copy.

Used by :mod:`dpledger.engine.self_check`.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from dpledger.engine.validators import BATCH_STATISTICS, UnsupportedLayerError, batch_statistics

DROPOUTS = frozenset(
    {
        F.dropout,
        F.dropout1d,
        F.dropout2d,
        F.dropout3d,
        F.alpha_dropout,
        F.feature_alpha_dropout,
        torch.dropout,
        torch.alpha_dropout,
        torch.feature_dropout,
        torch.feature_alpha_dropout,
    }
)
"""Functional dropouts; each takes its rate ``p`` as its second argument."""

ATTENTION_DROPOUT_ARG = 4
"""Position of ``dropout_p`` in ``F.scaled_dot_product_attention``'s arguments."""


class CheckedForward(TorchFunctionMode):
    """Active while the self-check runs its copy: every functional dropout and the attention
    kernel's dropout get rate 0, so that a rate written as a literal (``F.dropout(x, 0.1)``), which
    no attribute holds, draws no random mask either (the check compares one example alone with the
    same example in the batch: a random mask would make them differ). The call stays the same
    operation, only at rate 0. ``F.batch_norm(training=True)`` is refused by name: it fails on one
    example alone and mixes the examples of a batch."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if batch_statistics(func, args, kwargs):
            raise UnsupportedLayerError(BATCH_STATISTICS)
        if func in DROPOUTS:
            args, kwargs = _rate_zero(args, kwargs, 1, "p")
        elif func is F.scaled_dot_product_attention:
            args, kwargs = _rate_zero(args, kwargs, ATTENTION_DROPOUT_ARG, "dropout_p")
        return func(*args, **kwargs)


def _rate_zero(args: tuple, kwargs: dict, position: int, name: str) -> tuple[tuple, dict]:
    """The arguments with the rate (positional ``position`` or keyword ``name``) set to 0."""
    if len(args) > position:
        return (*args[:position], 0.0, *args[position + 1 :]), kwargs
    return args, {**kwargs, name: 0.0}


def uncopyable_attribute(model: nn.Module) -> str:
    """'attribute lock of module encoder (a lock)': the first attribute of a module of ``model``
    (its parameters, buffers and submodules aside) that ``copy.deepcopy`` refuses; 'an attribute'
    when each copies alone."""
    for name, module in model.named_modules():
        skip = {"_parameters", "_buffers", "_modules"}
        for attr, value in vars(module).items():
            if attr in skip:
                continue
            try:
                copy.deepcopy(value)
            except Exception:  # noqa: BLE001 (whatever the attribute's copy raises)
                return f"attribute {attr} of module {name or '<model>'} (a {type(value).__name__})"
    return "an attribute"

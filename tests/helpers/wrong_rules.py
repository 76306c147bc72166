"""Layer rules that are wrong on purpose, registered for test-only layer classes, and plugin model
factories using them (``train.model: helpers.wrong_rules:make_nudged_model``): the self-check and
the pipeline must refuse them, naming the layer."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from dpledger.engine.layers import register
from dpledger.engine.layers.linear import RULE as LINEAR_RULE

WRONG_FACTOR = 1.05


class NudgedLinear(nn.Module):
    """A custom layer (a plain linear map) that the test registers with a rule 5 % off in its
    clipped sum."""

    def __init__(self, d: int, p: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(p, d) / math.sqrt(d))
        self.bias = nn.Parameter(torch.zeros(p))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def _nudged_grads(layer, a, b, names):
    grads = LINEAR_RULE.per_example_grads(layer, a, b, names)
    return {name: WRONG_FACTOR * g if name == "weight" else g for name, g in grads.items()}


def _nudged_sum(layer, a, b, factors, out):
    LINEAR_RULE.clipped_sum(layer, a, b, WRONG_FACTOR * factors, out)


WRONG_RULE = dataclasses.replace(
    LINEAR_RULE,
    per_example_grads=_nudged_grads,
    clipped_sum=_nudged_sum,
)
register(NudgedLinear, rule=WRONG_RULE)  # a test-only class: no other layer gets this rule


class Float32BlindLinear(NudgedLinear):
    """A custom linear layer registered with a ghost-norm rule that under-reports the norm only on
    float32 activations (issue 41: exact in float64, each clipped contribution 1/0.7 R in
    training)."""


def _blind_ghost_norm(layer, a, b):
    squared = LINEAR_RULE.ghost_norm(layer, a, b)
    return squared * 0.7**2 if a.dtype == torch.float32 else squared


register(Float32BlindLinear, rule=dataclasses.replace(LINEAR_RULE, ghost_norm=_blind_ghost_norm))


def make_float32_blind_model(input_shape, num_classes):
    """A plugin model factory (train.model: helpers.wrong_rules:make_float32_blind_model)."""
    first = nn.Linear(math.prod(input_shape), 8)
    return nn.Sequential(nn.Flatten(), first, nn.Tanh(), Float32BlindLinear(8, num_classes))


def make_nudged_model(input_shape, num_classes):
    """A plugin model factory (train.model: helpers.wrong_rules:make_nudged_model)."""
    first = nn.Linear(math.prod(input_shape), 8)
    return nn.Sequential(nn.Flatten(), first, nn.Tanh(), NudgedLinear(8, num_classes))

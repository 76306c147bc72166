"""Layers whose output is changed in place after they return it (issue 26): exact, in float64,
against a naive per-example loop. A hook on the output tensor missed the gradient when the output
was a view or the layer ran under the generic rule (the private gradient of that layer silently
zero: relative error 1.0); every layer's output gradient now goes through its own identity node
(``engine/capture.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpledger.engine import BKEngine, UnsupportedLayerError
from helpers.engine_checks import check_every_parameter, compare, sum_loss

transformers = pytest.importorskip("transformers")


class _OwnForward(nn.Linear):
    """A Linear subclass with its own forward: the generic rule handles it."""

    def forward(self, x):
        return x @ self.weight.T


def _layer(kind: str, dim: int) -> nn.Module:
    if kind == "generic":
        return _OwnForward(dim, dim, bias=False)
    if kind == "conv1d":  # transformers' Conv1D returns addmm(...).view(...): a view
        return transformers.pytorch_utils.Conv1D(dim, dim)
    return nn.Linear(dim, dim)


class _Toy(nn.Module):
    """The issue's toy: h = a(x); o = b(tanh(h)); o += h (or o *= 2, or out of place)."""

    def __init__(self, kind: str, change: str) -> None:
        super().__init__()
        self.a, self.b, self.change = _layer(kind, 4), _layer(kind, 4), change

    def forward(self, x):
        h = self.a(x)
        o = self.b(torch.tanh(h))
        if self.change == "add":
            o += h
        elif self.change == "scale":
            o *= 2.0
        elif self.change == "slice":
            o[..., :2] += h[..., 2:]
        else:
            o = o + h
        return o


@pytest.mark.parametrize("change", ["add", "scale", "slice", "none"])
@pytest.mark.parametrize("kind", ["generic", "linear", "conv1d"])
@pytest.mark.parametrize("ghost", ["always", "never"])
def test_a_layer_output_changed_in_place_afterwards_is_exact(kind, change, ghost):
    torch.manual_seed(0)
    model = _Toy(kind, change)
    inputs, targets = torch.randn(4, 3, 4), torch.randn(4, 3, 4)
    engine = check_every_parameter(model, sum_loss, inputs, targets, ghost=ghost)
    assert engine.layer_methods["b"] == (
        "generic" if kind == "generic" else "ghost" if ghost == "always" else "instantiate"
    )


def test_the_issue_toy_was_wrong_only_through_its_in_place_output():
    """The toy's whole clipped sum: exact both ways (it was 0.30 relative with ``o += h`` before the
    fix)."""
    torch.manual_seed(0)
    inputs, targets = torch.randn(4, 3, 4), torch.randn(4, 3, 4)
    for change in ("add", "none"):
        error, engine = compare(_Toy("generic", change), sum_loss, inputs, targets)
        assert error < 1e-10, change


class _InputChanged(nn.Module):
    """A generic-rule layer whose INPUT is changed in place after it ran. Plain torch training
    refuses this model (the layer's weight gradient needs that input); with ghost differentiation
    only the engine's version check stops the per-example gradients being formed from the changed
    values."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = _OwnForward(4, 4, bias=False)

    def forward(self, x):
        h = self.a(x) + 1.0
        o = self.b(h)
        h.mul_(3.0)
        return o + h


def test_a_generic_layer_whose_input_is_changed_in_place_is_refused_by_name():
    model = _InputChanged()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    losses = sum_loss(model(torch.randn(4, 3, 4)), torch.randn(4, 3, 4))
    with pytest.raises(UnsupportedLayerError, match=r"layer b \(_OwnForward\).*changed in place"):
        engine.backward(losses)

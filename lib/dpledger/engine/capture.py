"""Capture of a layer's output gradient, exact even when the output is changed in place afterwards.

A tensor hook on a layer's output is not enough: when the output is a view (``o.view(...)``,
transformers' Conv1D) and the caller changes it in place (``o += h``), torch rebases the view onto a
new graph node and the hook never fires, so the layer's gradient would silently be zero. :func:`tap`
instead passes the output through an identity autograd node of its own whose backward receives
dL/d(output as the layer returned it) whatever happens to the tensor later: an in-place change adds
its node after the tap, so the tap still sees the gradient of the value the layer produced. The tap
returns an alias (no copy) that is not a view, so in-place changes to it are allowed exactly where
they were allowed on the layer's own output.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Sink = Callable[[Tensor], None]


class _Tap(torch.autograd.Function):
    """Identity; its backward hands the incoming gradient to ``sink`` and passes it on unchanged."""

    @staticmethod
    def forward(ctx, tensor: Tensor, origin: Tensor | None, sink: Sink) -> Tensor:
        ctx.sink = sink
        return tensor.detach()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, None]:
        ctx.sink(grad)
        return (grad if ctx.needs_input_grad[0] else None), None, None


def tap(tensor: Tensor, sink: Sink, origin: Tensor | None = None) -> Tensor:
    """``tensor``'s value as a fresh graph node; ``sink(dL/d tensor)`` runs when the backward pass
    reaches it.

    ``origin``: a zero-dimensional leaf that requires grad, for a tensor that does not (the first
    layers), so that the backward graph reaches this layer (003 §3.2 origin trick) without adding
    anything to the tensor."""
    return _Tap.apply(tensor, None if tensor.requires_grad else origin, sink)

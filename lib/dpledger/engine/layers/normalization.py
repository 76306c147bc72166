"""LayerNorm, GroupNorm and RMSNorm: per-example gradients are instantiated (they are tiny, 003 §2).

With x̂ the normalised input (computed again from the saved input, without the affine part),
example i's weight gradient is Σ over its non-parameter axes of x̂_i ⊙ b_i, its bias gradient Σ b_i.
BatchNorm is deliberately absent: it mixes examples, so no per-example gradient exists.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from dpledger.engine.layers.registry import LayerRule, register


def _reduce_to(param_shape: tuple[int, ...], values: Tensor) -> Tensor:
    """Sum (B, ..., *param_shape) over the middle axes -> (B, *param_shape)."""
    return values.reshape(values.shape[0], -1, *param_shape).sum(1)


def layer_norm_grads(layer: nn.Module, a: Tensor, b: Tensor, names: frozenset) -> dict[str, Tensor]:
    shape = tuple(layer.normalized_shape)
    grads = {}
    if "weight" in names:
        if isinstance(layer, nn.LayerNorm):
            normalized = F.layer_norm(a, shape, eps=layer.eps)
        else:
            normalized = F.rms_norm(a, shape, eps=layer.eps)
        grads["weight"] = _reduce_to(shape, normalized * b)
    if "bias" in names:
        grads["bias"] = _reduce_to(shape, b)
    return grads


def group_norm_grads(
    layer: nn.GroupNorm, a: Tensor, b: Tensor, names: frozenset
) -> dict[str, Tensor]:
    batch, channels = a.shape[0], a.shape[1]
    grads = {}
    if "weight" in names:
        normalized = F.group_norm(a, layer.num_groups, eps=layer.eps)
        grads["weight"] = (normalized * b).reshape(batch, channels, -1).sum(-1)
    if "bias" in names:
        grads["bias"] = b.reshape(batch, channels, -1).sum(-1)
    return grads


register(nn.LayerNorm, nn.RMSNorm, rule=LayerRule(layer_norm_grads, rowwise=True))
register(nn.GroupNorm, rule=LayerRule(group_norm_grads))

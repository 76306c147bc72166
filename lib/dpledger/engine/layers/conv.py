"""nn.Conv1d / nn.Conv2d (stride, padding incl. 'same' and non-zero modes, dilation, groups) via
unfold.

The input is unfolded (im2col) to U(a) of shape (B, groups, d, T) with d = c_in/groups · Πk and
T = output positions; the output gradient to (B, groups, p, T) with p = c_out/groups. Each group is
then a linear layer with T positions (003 §2 layer specifics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpledger.engine.layers.registry import LayerRule, register


def _as_2d(layer: nn.Module, a: Tensor) -> tuple[Tensor, tuple, tuple, tuple, tuple]:
    """The input as 4-D (N, C, H, W) plus kernel, stride, dilation and padding as 2-tuples."""
    kernel, stride, dilation = layer.kernel_size, layer.stride, layer.dilation
    explicit = not isinstance(layer.padding, str) and layer.padding_mode == "zeros"
    if not explicit:
        mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
        a = F.pad(a, layer._reversed_padding_repeated_twice, mode=mode)
    padding = layer.padding if explicit else (0,) * len(kernel)
    if isinstance(layer, nn.Conv1d):
        return a.unsqueeze(2), (1, *kernel), (1, *stride), (1, *dilation), (0, *padding)
    return a, kernel, stride, dilation, padding


def unfold(layer: nn.Module, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """(B, g, d, T) unfolded input and (B, g, p, T) output gradient."""
    a4, kernel, stride, dilation, padding = _as_2d(layer, a)
    cols = F.unfold(a4, kernel, dilation=dilation, padding=padding, stride=stride)
    batch, groups = a.shape[0], layer.groups
    cols = cols.reshape(batch, groups, -1, cols.shape[-1])
    return cols, b.reshape(batch, groups, -1, cols.shape[-1])


def per_example_grads(
    layer: nn.Module, a: Tensor, b: Tensor, names: frozenset
) -> dict[str, Tensor]:
    grads = {}
    if "weight" in names:
        cols, grads_out = unfold(layer, a, b)
        weight = torch.einsum("ngpt,ngdt->ngpd", grads_out, cols)
        grads["weight"] = weight.reshape(a.shape[0], *layer.weight.shape)
    if "bias" in names:
        grads["bias"] = b.reshape(a.shape[0], layer.out_channels, -1).sum(-1)
    return grads


def ghost_norm(layer: nn.Module, a: Tensor, b: Tensor) -> Tensor:
    cols, grads_out = unfold(layer, a, b)
    gram_a = torch.einsum("ngdt,ngds->ngts", cols, cols)
    gram_b = torch.einsum("ngpt,ngps->ngts", grads_out, grads_out)
    return (gram_a * gram_b).sum((1, 2, 3))


def clipped_sum(layer: nn.Module, a: Tensor, b: Tensor, factors: Tensor, out: Tensor) -> None:
    cols, grads_out = unfold(layer, a, b)
    weighted = grads_out * factors.to(b.dtype)[:, None, None, None]
    out.add_(torch.einsum("ngpt,ngdt->gpd", weighted, cols).reshape(layer.weight.shape))


def ghost_cost(layer: nn.Module, a: Tensor) -> tuple[int, int]:
    """Per example: 2·g·T² Gram entries against c_out·(c_in/g)·Πk gradient entries."""
    spatial = a.shape[2:]
    positions = 1
    for size, k, s, dil, pad in zip(
        spatial, layer.kernel_size, layer.stride, layer.dilation, _padding_total(layer)
    ):
        positions *= (size + pad - dil * (k - 1) - 1) // s + 1
    return 2 * layer.groups * positions * positions, layer.weight.numel()


def _padding_total(layer: nn.Module) -> tuple[int, ...]:
    if isinstance(layer.padding, str):
        return tuple(
            layer._reversed_padding_repeated_twice[2 * i]
            + layer._reversed_padding_repeated_twice[2 * i + 1]
            for i in reversed(range(len(layer.kernel_size)))
        )
    return tuple(2 * p for p in layer.padding)


RULE = register(
    nn.Conv1d,
    nn.Conv2d,
    rule=LayerRule(
        per_example_grads, ghost_norm=ghost_norm, clipped_sum=clipped_sum, ghost_cost=ghost_cost
    ),
)

"""transformers' ``Conv1D`` (GPT-2's attention and MLP projections): a Linear with a transposed weight.

s = a W + b with W of shape (d, p), so example i's weight gradient is a_iᵀ b_i (d × p), the transpose of
nn.Linear's: the same ghost norm, and book-keeping with the factors applied the same way. Registered by
name, so the engine does not import ``transformers``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpledger.engine.layers import LayerRule, add_scaled_product, register_by_name
from dpledger.engine.layers.linear import as_sequences, sequence_ghost_norm, step_sum


def per_example_grads(layer: nn.Module, a: Tensor, b: Tensor, names: frozenset) -> dict[str, Tensor]:
    a, b = as_sequences(a, b)
    grads = {}
    if "weight" in names:
        grads["weight"] = torch.bmm(a.transpose(1, 2), b)
    if "bias" in names:
        grads["bias"] = step_sum(b)
    return grads


def ghost_norm(layer: nn.Module, a: Tensor, b: Tensor) -> Tensor:
    return sequence_ghost_norm(*as_sequences(a, b))


def clipped_sum(layer: nn.Module, a: Tensor, b: Tensor, factors: Tensor, out: Tensor) -> None:
    a, b = as_sequences(a, b)
    add_scaled_product(out, factors, a, b)


def tied_factors(layer: nn.Module, a: Tensor, b: Tensor) -> tuple[str, Tensor, Tensor]:
    a, b = as_sequences(a, b)
    return "dense", b, a


def ghost_cost(layer: nn.Module, a: Tensor) -> tuple[int, int]:
    steps = a[0].numel() // a.shape[-1]
    return 2 * steps * steps, layer.weight.numel()


RULE = register_by_name(
    "transformers.pytorch_utils.Conv1D",
    rule=LayerRule(per_example_grads, ghost_norm=ghost_norm, clipped_sum=clipped_sum, ghost_cost=ghost_cost,
                   tied_factors=tied_factors),
)

"""nn.Linear with any number of leading dimensions: a (B, ..., d) -> s = a Wᵀ + b (B, ..., p).

With T the product of the middle dimensions, example i's weight gradient is b_iᵀ a_i (p × d).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpledger.engine.layers.registry import LayerRule, add_scaled_product, register
from dpledger.engine.tensor_cores import bmm_float32, has_out_dtype, promoted


def as_sequences(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Reshape activations and output gradients to (B, T, d) and (B, T, p)."""
    batch = a.shape[0]
    return a.reshape(batch, -1, a.shape[-1]), b.reshape(batch, -1, b.shape[-1])


def step_sum(b: Tensor) -> Tensor:
    """Σ_t b[:, t] of a (B, T, p) tensor: example i's bias gradient (a view when T = 1, where
    torch's ``sum`` over a singleton dimension still makes a slow copy)."""
    return b[:, 0] if b.shape[1] == 1 else b.sum(1)


GRAM_BLOCK = 32
"""Row-block height of the symmetric Grams on CPU: bmm is slow on heights that are not a multiple of
32, and smaller blocks lose more to bmm overheads than they save
(``benchmarks/bench_engine.py``)."""


def sequence_ghost_norm(a: Tensor, b: Tensor) -> Tensor:
    """‖a_iᵀ b_i‖²_F = Σ_{t,s} (a_t·a_s)(b_t·b_s) for (B, T, d), (B, T, p) without forming it (003
    Eq. 2); T = 1 is ‖a_i‖²‖b_i‖².

    On CPU both Grams are symmetric, so only the blocks on and above the diagonal are formed, row
    block by row block (a block of 32 rows against every later column): about 5/8 of the flops at T
    = 128 (off-diagonal blocks count twice; timings in benchmarks/RESULTS.md). Half-precision
    operands make float32 Grams on tensor cores where the device has them, and are promoted
    (exactly) elsewhere."""
    if not has_out_dtype(a.device.type):
        a, b = promoted(a), promoted(b)
    if a.shape[1] == 1:
        return (
            torch.linalg.vector_norm(promoted(a), dim=(1, 2)).square()
            * torch.linalg.vector_norm(promoted(b), dim=(1, 2)).square()
        )
    steps = a.shape[1]
    blocks = min(steps // GRAM_BLOCK, 8) if a.device.type == "cpu" else 1
    if blocks <= 1:  # Σ of the Grams' product as one batched dot product: three launches
        grams = (
            bmm_float32(a, a.transpose(1, 2)).view(a.shape[0], 1, -1),
            bmm_float32(b, b.transpose(1, 2)),
        )
        return torch.bmm(grams[0], grams[1].view(b.shape[0], -1, 1)).view(-1)
    height = GRAM_BLOCK * -(-steps // (GRAM_BLOCK * blocks))
    total = a.new_zeros(a.shape[0])
    for start in range(0, steps, height):
        end = min(start + height, steps)
        products = torch.bmm(a[:, start:end], a[:, start:].transpose(1, 2))
        products.mul_(torch.bmm(b[:, start:end], b[:, start:].transpose(1, 2)))
        total.add_(products.sum((1, 2)), alpha=2).sub_(products[:, :, : end - start].sum((1, 2)))
    return total


def sequence_rule(transposed: bool) -> LayerRule:
    """The rule of s = a W + b over (B, ..., d) inputs, for either weight layout: nn.Linear stores W
    as (p, d), so example i's weight gradient is b_iᵀ a_i; ``transposed`` (transformers' Conv1D)
    stores it as (d, p), the gradient a_iᵀ b_i. The ghost norm and cost are the same; the factors
    swap places."""

    def oriented(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """(left, right) of the weight gradient leftᵀ right, as (B, T, ·) sequences."""
        a, b = as_sequences(a, b)
        return (a, b) if transposed else (b, a)

    def per_example_grads(
        layer: nn.Module, a: Tensor, b: Tensor, names: frozenset
    ) -> dict[str, Tensor]:
        left, right = oriented(a, b)
        grads = {}
        if "weight" in names:
            grads["weight"] = torch.bmm(left.transpose(1, 2), right)
        if "bias" in names:
            grads["bias"] = step_sum(right if transposed else left)
        return grads

    def ghost_norm(layer: nn.Module, a: Tensor, b: Tensor) -> Tensor:
        return sequence_ghost_norm(*as_sequences(a, b))

    def clipped_sum(layer: nn.Module, a: Tensor, b: Tensor, factors: Tensor, out: Tensor) -> None:
        add_scaled_product(out, factors, *oriented(a, b))

    def tied_factors(layer: nn.Module, a: Tensor, b: Tensor) -> tuple[str, Tensor, Tensor]:
        left, right = oriented(a, b)
        return "dense", right, left

    def ghost_cost(layer: nn.Module, a: Tensor) -> tuple[int, int]:
        steps = a[0].numel() // a.shape[-1]
        return 2 * steps * steps, layer.weight.numel()

    return LayerRule(
        per_example_grads,
        ghost_norm=ghost_norm,
        clipped_sum=clipped_sum,
        ghost_cost=ghost_cost,
        tied_factors=tied_factors,
        rowwise=True,
        half_operands=True,
    )


RULE = register(nn.Linear, rule=sequence_rule(transposed=False))

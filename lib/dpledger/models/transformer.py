"""Small pre-LayerNorm transformer built from Linear, Embedding and LayerNorm only (all BK rules).

Image inputs (C, H, W) become H tokens of C·W features (a row per token); integer inputs (T,) are
token ids embedded with ``vocab_size``. Positions are an nn.Embedding called on a (B, T) index, so
every example gets its own positional gradient.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class Attention(nn.Module):
    """Multi-head self-attention with explicit Linear projections (nn.MultiheadAttention keeps raw
    parameters)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        batch, steps, dim = x.shape
        q, k, v = (
            self.qkv(x)
            .reshape(batch, steps, 3, self.heads, dim // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        mixed = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(mixed.transpose(1, 2).reshape(batch, steps, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """Token embedding + positions → ``depth`` blocks → LayerNorm → mean over tokens → Linear."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        dim: int = 64,
        depth: int = 2,
        heads: int = 4,
        mlp_ratio: int = 4,
        vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        if vocab_size is None:
            steps, features = input_shape[-2], math.prod(input_shape) // input_shape[-2]
            self.tokens: nn.Module = nn.Linear(features, dim)
        else:
            steps = input_shape[-1]
            self.tokens = nn.Embedding(vocab_size, dim)
        self.image = vocab_size is None
        self.positions = nn.Embedding(steps, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        if self.image:
            x = (
                x.reshape(x.shape[0], x.shape[-3], x.shape[-2], x.shape[-1])
                .permute(0, 2, 1, 3)
                .flatten(2)
            )
        hidden = self.tokens(x)
        index = torch.arange(hidden.shape[1], device=hidden.device).repeat(hidden.shape[0], 1)
        hidden = hidden + self.positions(index)
        return self.head(self.norm(self.blocks(hidden)).mean(1))

"""nn.Embedding: a is the (B, ...) token index tensor, b the (B, ..., dim) output gradient.

Example i's gradient scatters b_i's rows into the rows of its tokens. Its ghost norm uses
(a_i a_iᵀ)[t, t'] = 1{token_t = token_t'} directly, never a dense one-hot (003 §2); positions
holding ``padding_idx`` get no gradient, as in torch's own backward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpledger.engine.layers import LayerRule, register


def _tokens_and_grads(layer: nn.Embedding, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """(B, T) token indices and (B, T, dim) output gradients with padding positions zeroed."""
    tokens = a.reshape(a.shape[0], -1)
    grads = b.reshape(a.shape[0], -1, layer.embedding_dim)
    if layer.padding_idx is not None:
        grads = grads * (tokens != layer.padding_idx).unsqueeze(-1).to(grads.dtype)
    return tokens, grads


def per_example_grads(layer: nn.Embedding, a: Tensor, b: Tensor) -> dict[str, Tensor]:
    tokens, grads = _tokens_and_grads(layer, a, b)
    batch = tokens.shape[0]
    weight = grads.new_zeros(batch, layer.num_embeddings, layer.embedding_dim)
    rows = torch.arange(batch, device=tokens.device).unsqueeze(1).expand_as(tokens)
    weight.index_put_((rows, tokens), grads, accumulate=True)
    return {"weight": weight}


def ghost_norms(layer: nn.Embedding, a: Tensor, b: Tensor) -> dict[str, Tensor]:
    tokens, grads = _tokens_and_grads(layer, a, b)
    same_token = (tokens.unsqueeze(2) == tokens.unsqueeze(1)).to(grads.dtype)
    return {"weight": (same_token * torch.bmm(grads, grads.transpose(1, 2))).sum((1, 2))}


def clipped_sum(layer: nn.Embedding, a: Tensor, b: Tensor, factors: dict[str, Tensor], out: dict[str, Tensor]) -> None:
    tokens, grads = _tokens_and_grads(layer, a, b)
    weighted = grads * factors["weight"].to(grads.dtype)[:, None, None]
    out["weight"].index_add_(0, tokens.reshape(-1), weighted.reshape(-1, layer.embedding_dim))


def ghost_cost(layer: nn.Embedding, a: Tensor) -> tuple[int, int]:
    steps = a[0].numel()
    return 2 * steps * steps, layer.num_embeddings * layer.embedding_dim


def validate(layer: nn.Embedding) -> str | None:
    if layer.sparse:
        return "sparse=True gradients are not supported"
    if layer.scale_grad_by_freq:
        return "scale_grad_by_freq=True makes one example's gradient depend on the batch"
    return None


RULE = register(
    nn.Embedding,
    rule=LayerRule(
        per_example_grads, ghost_norms=ghost_norms, clipped_sum=clipped_sum, ghost_cost=ghost_cost, validate=validate
    ),
)

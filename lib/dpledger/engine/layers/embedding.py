"""nn.Embedding: a is the (B, ...) token index tensor, b the (B, ..., dim) output gradient.

Example i's gradient scatters b_i's rows into the rows of its tokens; positions holding
``padding_idx`` get no gradient, as in torch's own backward. Its norm never forms the dense
(vocab × dim) gradient nor a one-hot: 003 §2 writes it as Σ_{t,t'} 1{token_t = token_t'}·(b_t·b_t'),
which costs T² per example; summing b_i's rows per distinct token first (a segment sum over the
sorted (example, token) keys) gives the same value in O(T·dim), the gradient's non-zero rows only.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpledger.engine.layers.registry import LayerRule, register


def _tokens_and_grads(layer: nn.Embedding, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """(B, T) token indices and (B, T, dim) output gradients with padding positions zeroed."""
    tokens = a.reshape(a.shape[0], -1)
    grads = b.reshape(a.shape[0], -1, layer.embedding_dim)
    if layer.padding_idx is not None:
        grads = grads * (tokens != layer.padding_idx).unsqueeze(-1).to(grads.dtype)
    return tokens, grads


def per_example_grads(
    layer: nn.Embedding, a: Tensor, b: Tensor, names: frozenset
) -> dict[str, Tensor]:
    tokens, grads = _tokens_and_grads(layer, a, b)
    batch = tokens.shape[0]
    weight = grads.new_zeros(batch, layer.num_embeddings, layer.embedding_dim)
    rows = torch.arange(batch, device=tokens.device).unsqueeze(1).expand_as(tokens)
    weight.index_put_((rows, tokens), grads, accumulate=True)
    return {"weight": weight}


def ghost_norm(layer: nn.Embedding, a: Tensor, b: Tensor) -> Tensor:
    tokens, grads = _tokens_and_grads(layer, a, b)
    batch = tokens.shape[0]
    owner = torch.arange(batch, device=tokens.device).unsqueeze(1)
    keys, rows = torch.unique(owner * layer.num_embeddings + tokens, return_inverse=True)
    row_sums = grads.new_zeros(keys.numel(), layer.embedding_dim).index_add_(
        0, rows.reshape(-1), grads.reshape(-1, layer.embedding_dim)
    )
    return grads.new_zeros(batch).index_add_(
        0, keys // layer.num_embeddings, row_sums.square().sum(1)
    )


def clipped_sum(layer: nn.Embedding, a: Tensor, b: Tensor, factors: Tensor, out: Tensor) -> None:
    tokens, grads = _tokens_and_grads(layer, a, b)
    weighted = grads * factors.to(grads.dtype)[:, None, None]
    out.index_add_(0, tokens.reshape(-1), weighted.reshape(-1, layer.embedding_dim))


def tied_factors(layer: nn.Embedding, a: Tensor, b: Tensor) -> tuple[str, Tensor, Tensor]:
    tokens, grads = _tokens_and_grads(layer, a, b)
    return "onehot", grads, tokens


def ghost_cost(layer: nn.Embedding, a: Tensor) -> tuple[int, int]:
    """Per example: at most T summed rows of ``dim`` against the dense (vocab × dim) gradient."""
    return a[0].numel() * layer.embedding_dim, layer.num_embeddings * layer.embedding_dim


MAX_NORM_REASON = (
    "max_norm renormalises, in place and without noise, "
    "the rows of the tokens each forward pass looks up, "
    "so the weights show which tokens the private batch held"
)


def validate(layer: nn.Embedding) -> str | None:
    if layer.sparse:
        return "sparse=True gradients are not supported"
    if layer.max_norm is not None:
        return MAX_NORM_REASON
    if layer.scale_grad_by_freq:
        return "scale_grad_by_freq=True makes one example's gradient depend on the batch"
    return None


RULE = register(
    nn.Embedding,
    rule=LayerRule(
        per_example_grads,
        ghost_norm=ghost_norm,
        clipped_sum=clipped_sum,
        ghost_cost=ghost_cost,
        validate=validate,
        tied_factors=tied_factors,
        rowwise=True,
    ),
)

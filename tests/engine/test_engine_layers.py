"""Exactness of every layer rule: the BK clipped sum equals a naive per-example loop in float64
(1e-10)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from helpers.engine_checks import compare, cross_entropy, sum_loss

TOL = 1e-10
GHOST = ["auto", "always", "never"]
FAST = settings(max_examples=8, deadline=None)


def _targets(model, inputs):
    with torch.no_grad():
        return torch.randn_like(model(inputs))


@FAST
@given(
    batch=st.integers(1, 5),
    lead=st.lists(st.integers(1, 3), max_size=2),
    d=st.integers(1, 6),
    p=st.integers(1, 6),
    bias=st.booleans(),
    ghost=st.sampled_from(GHOST),
    seed=st.integers(0, 10_000),
)
def test_linear_with_leading_dimensions_matches_naive_loop(batch, lead, d, p, bias, ghost, seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(d, p, bias=bias), nn.Tanh(), nn.Linear(p, 2))
    inputs = torch.randn(batch, *lead, d)
    error, _ = compare(model, sum_loss, inputs, _targets(model, inputs), ghost=ghost)
    assert error < TOL


@pytest.mark.parametrize("steps", [33, 64, 100, 128, 300])
def test_linear_over_long_sequences_uses_symmetric_gram_blocks_exactly(steps):
    """T >= 64 takes the row-block path of the ghost norm on CPU (blocks of 32, a ragged last
    one)."""
    torch.manual_seed(steps)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    inputs = torch.randn(3, steps, 5)
    error, engine = compare(model, sum_loss, inputs, _targets(model, inputs), ghost="always")
    assert error < TOL
    assert set(engine.layer_methods.values()) == {"ghost"}


@FAST
@given(
    batch=st.integers(1, 4),
    c_in=st.sampled_from([2, 4]),
    groups=st.sampled_from([1, 2]),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 2),
    padding=st.sampled_from([0, 1, "same"]),
    dilation=st.integers(1, 2),
    mode=st.sampled_from(["zeros", "reflect", "circular"]),
    bias=st.booleans(),
    ghost=st.sampled_from(GHOST),
    seed=st.integers(0, 10_000),
)
def test_conv2d_matches_naive_loop(
    batch, c_in, groups, kernel, stride, padding, dilation, mode, bias, ghost, seed
):
    if padding == "same":
        stride = 1
    torch.manual_seed(seed)
    conv = nn.Conv2d(
        c_in,
        2 * groups,
        kernel,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        bias=bias,
        padding_mode=mode,
    )
    model = nn.Sequential(conv, nn.Tanh())
    inputs = torch.randn(batch, c_in, 7, 6)
    error, _ = compare(model, sum_loss, inputs, _targets(model, inputs), ghost=ghost)
    assert error < TOL


@FAST
@given(
    batch=st.integers(1, 4),
    kernel=st.integers(1, 4),
    stride=st.integers(1, 3),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
    groups=st.sampled_from([1, 3]),
    ghost=st.sampled_from(GHOST),
    seed=st.integers(0, 10_000),
)
def test_conv1d_matches_naive_loop(batch, kernel, stride, padding, dilation, groups, ghost, seed):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv1d(3, 3, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups),
        nn.Tanh(),
    )
    inputs = torch.randn(batch, 3, 11)
    error, _ = compare(model, sum_loss, inputs, _targets(model, inputs), ghost=ghost)
    assert error < TOL


class _Tokens(nn.Module):
    def __init__(self, vocab: int, dim: int, padding_idx: int | None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.head = nn.Linear(dim, 3)

    def forward(self, tokens):
        return self.head(torch.tanh(self.embed(tokens))).sum(1)


@FAST
@given(
    batch=st.integers(1, 5),
    length=st.integers(1, 6),
    vocab=st.integers(2, 6),
    padding_idx=st.sampled_from([None, 0, 1]),
    ghost=st.sampled_from(GHOST),
    seed=st.integers(0, 10_000),
)
def test_embedding_with_repeated_tokens_and_padding_idx_matches_naive_loop(
    batch, length, vocab, padding_idx, ghost, seed
):
    torch.manual_seed(seed)
    model = _Tokens(vocab, 4, padding_idx)
    tokens = torch.randint(0, vocab, (batch, length))
    targets = torch.randint(0, 3, (batch,))
    error, _ = compare(model, cross_entropy, tokens, targets, ghost=ghost)
    assert error < TOL


def test_embedding_norm_by_row_sums_is_exact_over_long_sequences_and_chosen_below_vocab_size():
    torch.manual_seed(3)
    model = _Tokens(50, 4, padding_idx=2)
    tokens = torch.randint(0, 6, (4, 40))  # many repeats of few tokens
    error, engine = compare(model, cross_entropy, tokens, torch.randint(0, 3, (4,)))
    assert error < TOL
    assert engine.layer_methods["embed"] == "ghost"
    _, engine = compare(
        _Tokens(8, 4, None), cross_entropy, torch.randint(0, 8, (2, 9)), torch.randint(0, 3, (2,))
    )
    assert engine.layer_methods["embed"] == "instantiate"


@pytest.mark.parametrize(
    "norm",
    [
        lambda: nn.LayerNorm(6),
        lambda: nn.LayerNorm(6, bias=False),
        lambda: nn.LayerNorm([3, 6]),
        lambda: nn.RMSNorm(6),
        lambda: nn.GroupNorm(3, 3),
    ],
)
def test_normalisation_layers_match_naive_loop(norm):
    torch.manual_seed(1)
    layer = norm()
    shape = (5, 3, 6) if not isinstance(layer, nn.GroupNorm) else (5, 3, 4, 2)
    model = (
        nn.Sequential(layer, nn.Tanh())
        if isinstance(layer, nn.GroupNorm)
        else nn.Sequential(nn.Linear(6, 6), layer)
    )
    inputs = torch.randn(*shape)
    error, _ = compare(model, sum_loss, inputs, _targets(model, inputs))
    assert error < TOL


@pytest.mark.parametrize("ghost", GHOST)
@pytest.mark.parametrize("frozen", ["weight", "bias"])
@pytest.mark.parametrize(
    "layer",
    [lambda: nn.Linear(6, 6), lambda: nn.Conv1d(3, 3, 3, padding=1), lambda: nn.LayerNorm(6)],
)
def test_a_frozen_weight_or_bias_leaves_the_other_parameter_exact(layer, frozen, ghost):
    """Bias-only training (frozen weights) and frozen biases: the engine handles exactly the
    trainable parameters of a layer, and never computes a frozen weight's norm."""
    torch.manual_seed(2)
    first = layer()
    getattr(first, frozen).requires_grad_(False)
    model = nn.Sequential(first, nn.Tanh(), nn.Flatten(), nn.Linear(18, 2))
    inputs = torch.randn(4, 3, 6)
    error, engine = compare(model, sum_loss, inputs, _targets(model, inputs), ghost=ghost)
    assert error < TOL
    if frozen == "weight":
        assert engine.layer_methods["0"] == "instantiate"


class _Tied(nn.Module):
    """Embedding and output head share one weight; one Linear is also applied twice."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.mix = nn.Linear(4, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        h = self.mix(torch.tanh(self.mix(self.embed(tokens))))
        return self.head(h).sum(1)


@pytest.mark.parametrize("ghost", GHOST)
def test_tied_and_reused_parameters_use_the_norm_of_the_summed_gradient(ghost):
    torch.manual_seed(2)
    tokens = torch.randint(0, 7, (6, 5))
    targets = torch.randint(0, 7, (6,))
    error, engine = compare(_Tied(), cross_entropy, tokens, targets, ghost=ghost)
    assert error < TOL
    # auto: T = 5, 7 × 4 weight
    expected = {"never": "instantiate", "always": "ghost", "auto": "instantiate"}[ghost]
    assert (
        engine.layer_methods["mix"]
        == engine.layer_methods["embed"]
        == engine.layer_methods["head"]
        == expected
    )


class _TiedHeadFirst(_Tied):
    """As _Tied, with the tied head registered before ``mix``: it owns no parameter of its own."""

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.embed = nn.Embedding(7, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.embed.weight
        self.mix = nn.Linear(4, 4)


@pytest.mark.parametrize("model_class", [_Tied, _TiedHeadFirst])
def test_per_layer_clipping_counts_only_layers_that_own_parameters(model_class):
    """L in R/√L is the number of owning layers (embed, mix), wherever the tied head is
    registered."""
    torch.manual_seed(2)
    tokens, targets = torch.randint(0, 7, (6, 5)), torch.randint(0, 7, (6,))
    error, _ = compare(model_class(), cross_entropy, tokens, targets, clipping="per-layer")
    assert error < TOL


@pytest.mark.parametrize("clipping", ["flat", "per-layer", "automatic"])
def test_clipping_modes_match_naive_loop(clipping):
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.GroupNorm(1, 2), nn.Flatten(), nn.Linear(2 * 4 * 4, 3)
    )
    inputs = torch.randn(6, 1, 6, 6)
    error, _ = compare(model, cross_entropy, inputs, torch.randint(0, 3, (6,)), clipping=clipping)
    assert error < TOL


def test_padding_rows_contribute_exactly_zero():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    inputs, targets = torch.randn(6, 4), torch.randint(0, 3, (6,))
    weights = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    error, engine = compare(model, cross_entropy, inputs, targets, weights=weights)
    assert error < TOL
    assert engine.last_norms[1] == 0 and engine.last_norms[4] == 0
    real = weights.bool()
    error_real, _ = compare(model, cross_entropy, inputs[real], targets[real])
    assert error_real < TOL


def test_in_place_activation_after_a_layer_keeps_the_layer_output_gradient():
    torch.manual_seed(5)
    model = nn.Sequential(
        nn.Linear(5, 6),
        nn.ReLU(inplace=True),
        nn.Linear(6, 6),
        nn.ReLU(inplace=True),
        nn.Linear(6, 3),
    )
    error, _ = compare(model, cross_entropy, torch.randn(7, 5), torch.randint(0, 3, (7,)))
    assert error < TOL


class _ScaledInput(nn.Linear):
    def forward(self, x):
        return nn.functional.linear(2 * x, self.weight, self.bias)


class _FlippedConv(nn.Conv2d):
    def _conv_forward(self, x, weight, bias):
        return super()._conv_forward(x.flip(-1), weight, bias)


class _PlainSubclass(nn.Linear):
    """Inherits Linear's forward: Linear's rule applies."""


@pytest.mark.parametrize(
    "layer", [lambda: _ScaledInput(3, 4), lambda: _FlippedConv(1, 2, 3)], ids=["linear", "conv"]
)
def test_a_subclass_that_changes_how_the_output_is_computed_gets_the_exact_generic_rule(layer):
    """The base class's rule assumes the base class's forward: F.linear(2·x) gave relative error
    0.39 against the naive loop and a flipped-input Conv2d 1.13, silently. Such a layer gets the
    generic rule (its own forward re-run per example); a subclass that keeps the forward (like
    torch's NonDynamicallyQuantizableLinear) keeps the base class's ghost rule."""
    torch.manual_seed(6)
    first = layer()
    model = nn.Sequential(first, nn.Tanh())
    inputs = torch.randn(4, 3) if isinstance(first, nn.Linear) else torch.randn(4, 1, 5, 5)
    error, engine = compare(model, sum_loss, inputs, _targets(model, inputs))
    assert error < TOL
    assert engine.layer_methods["0"] == "generic"
    model = nn.Sequential(_PlainSubclass(3, 4), nn.Tanh(), nn.Linear(4, 2))
    inputs = torch.randn(5, 3)
    error, engine = compare(model, sum_loss, inputs, _targets(model, inputs), ghost="always")
    assert error < TOL
    assert engine.layer_methods["0"] == "ghost"


class _EmbeddingTwiceTiedHead(nn.Module):
    """One table looked up twice (two token streams, one with padding) and used again as the output
    head: all three pairwise kinds of ghost_dot (one-hot/one-hot, dense/one-hot, one-hot/dense)
    meet."""

    def __init__(self, vocab: int, padding_idx: int | None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 4, padding_idx=padding_idx)
        self.mix = nn.Linear(4, 4)
        self.head = nn.Linear(4, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        half = tokens.shape[1] // 2
        h = self.embed(tokens[:, :half]) + torch.tanh(
            self.mix(self.embed(tokens[:, half : 2 * half]))
        )
        return self.head(h).sum(1)


@FAST
@given(
    batch=st.integers(1, 4),
    length=st.integers(1, 4),
    vocab=st.integers(2, 6),
    padding_idx=st.sampled_from([None, 0]),
    ghost=st.sampled_from(GHOST),
    seed=st.integers(0, 10_000),
)
def test_a_weight_tied_across_three_uses_keeps_an_exact_ghost_norm(
    batch, length, vocab, padding_idx, ghost, seed
):
    torch.manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, 2 * length))
    error, engine = compare(
        _EmbeddingTwiceTiedHead(vocab, padding_idx),
        cross_entropy,
        tokens,
        torch.randint(0, vocab, (batch,)),
        ghost=ghost,
    )
    assert error < TOL
    if ghost != "auto":
        assert engine.layer_methods["head"] == ("ghost" if ghost == "always" else "instantiate")

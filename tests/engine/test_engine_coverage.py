"""Layouts beyond batch-first layers (issue 26), exact in float64 against a naive per-example loop,
or refused with a dpledger error naming the layer (never a raw RuntimeError from inside the engine):
tokens flattened to (B·T, d) rows, attention that folds the batch and the heads into one bmm
dimension, and a batch-size-1 layer output the model cannot take expanded to the batch; parametrized
weights (weight_norm, spectral_norm, ...)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize

from dpledger.engine import BKEngine, UnsupportedLayerError
from helpers.engine_checks import check_every_parameter, compare, sum_loss


class _FlatRows(nn.Module):
    """LayerNorm on x.view(-1, d) (rows proved by the view), a Linear on its output (rows of a
    proved layer) and a head after tanh (through an elementwise operation): OPT's MLP layout."""

    def __init__(self, dim: int = 4) -> None:
        super().__init__()
        self.proj, self.norm, self.head = nn.Linear(dim, 6), nn.LayerNorm(dim), nn.Linear(6, 2)

    def forward(self, x):
        rows = self.proj(self.norm(x.view(-1, x.shape[-1])))
        return self.head(torch.tanh(rows)).view(x.shape[0], x.shape[1], -1)


@pytest.mark.parametrize("ghost", ["always", "never"])
def test_layers_on_tokens_flattened_to_rows_are_exact(ghost):
    torch.manual_seed(0)
    engine = check_every_parameter(
        _FlatRows(), sum_loss, torch.randn(4, 3, 4), torch.randn(4, 3, 2), ghost=ghost
    )
    assert engine.layer_methods["proj"] == ("ghost" if ghost == "always" else "instantiate")


class _UnprovenRows(_FlatRows):
    """Rows in time-major order (reshape copies x.transpose(0, 1)): taking them as example-major
    would be wrong."""

    def forward(self, x):
        rows = self.proj(self.norm(x.transpose(0, 1).reshape(-1, x.shape[-1])))
        return self.head(torch.tanh(rows)).view(x.shape[1], x.shape[0], -1).transpose(0, 1)


def test_rows_whose_examples_cannot_be_proved_are_refused_naming_the_layer():
    torch.manual_seed(0)
    match = r"layer norm \(LayerNorm\) sees 3 rows per example .*x\.view\(-1, d\)"
    with pytest.raises(UnsupportedLayerError, match=match):
        compare(_UnprovenRows(), sum_loss, torch.randn(4, 3, 4), torch.randn(4, 3, 2))


class _BatchHeadsAttention(nn.Module):
    """Self-attention written with bmm over a (B·H, T, d_head) dimension and a per-head temperature
    (the module's own parameter: generic rule; q, k, v and out keep the Linear rule)."""

    def __init__(self, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.temperature = nn.Parameter(torch.rand(heads, 1, 1) + 0.5)

    def forward(self, x):
        batch, steps, dim = x.shape
        q, k, v = (
            t.reshape(batch, steps, self.heads, -1)
            .transpose(1, 2)
            .reshape(batch * self.heads, steps, -1)
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        scale = self.temperature.repeat(batch, 1, 1)
        weights = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * scale, dim=-1)
        context = torch.bmm(weights, v).reshape(batch, self.heads, steps, -1).transpose(1, 2)
        return self.out(context.reshape(batch, steps, dim))


class _AttentionModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention, self.head = _BatchHeadsAttention(), nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.attention(x)))


def test_attention_folding_batch_and_heads_into_one_bmm_dimension_is_exact():
    torch.manual_seed(0)
    engine = check_every_parameter(
        _AttentionModel(), sum_loss, torch.randn(4, 5, 8), torch.randn(4, 5, 2)
    )
    assert engine.layer_methods["attention"] == "generic"
    assert engine.layer_methods["attention.qkv"] in ("ghost", "instantiate")


class _SharedThenFolded(nn.Module):
    """A Linear on a batch-size-1 table whose output is repeated to the batch by ``repeat``
    (DeBERTa's relative position projections): the engine's expansion to B breaks the model's
    shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(1, 3, 4), requires_grad=False)
        self.pos, self.head = nn.Linear(4, 4), nn.Linear(3, 2)

    def forward(self, x):
        position = self.pos(self.table).repeat(x.shape[0], 1, 1)
        return self.head(torch.bmm(x, position.transpose(1, 2)))


def test_a_shared_output_the_model_cannot_take_expanded_is_claimed_and_exact():
    """The probe that expands ``pos``'s size-1 output fails; ``pos`` is then kept whole, carries no
    batch, and the enclosing model claims it under the generic rule (before, a refusal)."""
    torch.manual_seed(0)
    engine = check_every_parameter(
        _SharedThenFolded(), sum_loss, torch.randn(4, 3, 4), torch.randn(4, 3, 2)
    )
    assert engine.layer_methods["<model>"] == "generic"


class _Symmetric(nn.Module):
    """A user's own parametrization: W = X + Xᵀ."""

    def forward(self, weight):
        return weight + weight.T


class _Parametrized(nn.Module):
    """weight_norm on a Linear and a Conv1d, orthogonal, a user's parametrization and
    spectral_norm."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = parametrizations.weight_norm(nn.Linear(4, 4))
        self.conv = parametrizations.weight_norm(nn.Conv1d(4, 4, 3, padding=1), dim=0)
        self.spectral = parametrizations.spectral_norm(nn.Linear(4, 4))
        self.symmetric = nn.Linear(4, 4)
        parametrize.register_parametrization(self.symmetric, "weight", _Symmetric())
        self.orthogonal = parametrizations.orthogonal(nn.Linear(4, 4))

    def forward(self, x):
        h = torch.tanh(self.linear(x))
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        return self.orthogonal(self.symmetric(torch.tanh(self.spectral(h))))


@pytest.mark.parametrize("ghost", ["auto", "always"])
def test_parametrized_weights_give_exact_gradients_of_their_originals(ghost):
    """Every original (weight_norm's g and v, ...) exact; spectral_norm without power iterations
    here, so that the naive loop's B forward passes do not each move its vectors (with them: the
    next test)."""
    torch.manual_seed(0)
    model = _Parametrized()
    model.spectral.parametrizations.weight[0].n_power_iterations = 0
    engine = check_every_parameter(
        model, sum_loss, torch.randn(4, 3, 4), torch.randn(4, 3, 4), ghost=ghost
    )
    assert "linear.parametrizations.weight.original0" in engine.parameter_names
    assert engine.layer_methods["linear"] == engine.layer_methods["conv"] == "instantiate"


def test_spectral_norm_in_training_mode_is_exact_against_per_example_copies():
    """One power iteration per forward pass: each example's reference runs on a fresh copy of the
    model, so it uses the same updated vectors as the engine's batch pass."""
    torch.manual_seed(0)
    model = nn.Sequential(
        parametrizations.spectral_norm(nn.Linear(4, 5)), nn.Tanh(), nn.Linear(5, 2)
    ).double()
    inputs, targets = torch.randn(4, 3, 4).double(), torch.randn(4, 3, 2).double()
    per_example = []
    for i in range(4):
        copy_ = copy.deepcopy(model)
        loss = sum_loss(copy_(inputs[i : i + 1]), targets[i : i + 1]).sum()
        params = [p for p in copy_.parameters()]
        per_example.append(torch.autograd.grad(loss, params))
    norms = torch.stack([torch.sqrt(sum((g**2).sum() for g in grads)) for grads in per_example])
    clip = float(norms.median())
    expected = [
        sum(min(1.0, clip / float(n)) * grads[k] for grads, n in zip(per_example, norms))
        for k in range(3)
    ]
    engine = BKEngine(model, None, clip_norm=clip, noise_multiplier=0.0, normalizer=1.0)
    engine.private_step(sum_loss(model(inputs), targets))
    for got, want in zip([p.grad for p in engine.params], expected):
        assert float((got - want).abs().max()) <= 1e-10 * float(want.abs().max())


class _UnbatchedInput(nn.Module):
    """A Linear applied to an unbatched vector whose size happens to equal the batch size (4)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(x * self.scale(torch.ones(4, dtype=x.dtype)))


@pytest.mark.parametrize("ghost", ["always", "never"])
def test_a_rule_on_an_unbatched_input_is_trained_by_its_enclosing_module(ghost):
    """The size of the shared vector equals the batch size (4): traced, it is not taken for the
    batch; the model, which returns the batch, claims the Linear under the generic rule."""
    torch.manual_seed(0)
    engine = check_every_parameter(
        _UnbatchedInput(), sum_loss, torch.randn(4, 3, 4), torch.randn(4, 3, 2), ghost=ghost
    )
    assert engine.layer_methods["<model>"] == "generic"

"""The generic exact rule, the batch-broadcast inputs and torch's attention/RNN layers (issue 17),
against a naive per-example loop in float64 (1e-10); refusals name the layer, never an internal
error."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpledger.engine import BKEngine, UnsupportedLayerError, replace_batchnorm
from helpers.engine_checks import (
    check_every_parameter,
    compare,
    cross_entropy,
    naive_clipped_sum,
    relative_error,
    sum_loss,
)

TOL = 1e-10
FAST = settings(max_examples=6, deadline=None)


class _LayerScale(nn.Module):
    """A raw parameter next to a child Linear: the generic rule covers ``gamma``, the Linear keeps
    its rule."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.inner = nn.Linear(dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x, *, shift=None):
        out = self.inner(x) * self.gamma
        return out if shift is None else out + shift


class _ScaledLinear(nn.Linear):
    """Overrides forward: Linear's rule would be wrong, the generic rule is exact."""

    def forward(self, x):
        return nn.functional.linear(2 * x, self.weight, self.bias)


class _LayerScaleModel(nn.Module):
    def __init__(self, dim: int, keyword: bool) -> None:
        super().__init__()
        self.keyword = keyword
        self.block = _LayerScale(dim)
        self.scaled = _ScaledLinear(dim, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        h = self.block(x=x, shift=torch.ones(x.shape[-1])) if self.keyword else self.block(x)
        return self.head(torch.tanh(self.scaled(h))).reshape(x.shape[0], -1, 3).sum(1)


@FAST
@given(
    batch=st.integers(1, 4),
    steps=st.integers(1, 3),
    dim=st.integers(1, 4),
    keyword=st.booleans(),
    ghost=st.sampled_from(["auto", "always", "never"]),
    seed=st.integers(0, 1000),
)
def test_generic_rule_matches_naive_loop_and_keeps_child_rules(
    batch, steps, dim, keyword, ghost, seed
):
    torch.manual_seed(seed)
    model = _LayerScaleModel(dim, keyword)
    error, engine = compare(
        model,
        cross_entropy,
        torch.randn(batch, steps, dim),
        torch.randint(0, 3, (batch,)),
        ghost=ghost,
    )
    assert error < TOL
    assert engine.layer_methods["block"] == engine.layer_methods["scaled"] == "generic"
    assert engine.layer_methods["block.inner"] in ("ghost", "instantiate")


class _Positions(nn.Module):
    """BERT-like: position ids of shape (1, T), broadcast over the batch, through an Embedding and a
    Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(9, 4)
        self.positions = nn.Embedding(8, 4)
        self.shared_proj = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        h = self.tokens(ids) + self.shared_proj(self.positions(pos))
        return self.head(torch.tanh(h)).sum(1)


@pytest.mark.parametrize("ghost", ["always", "never"])
@pytest.mark.parametrize("batch", [1, 3, 5])
def test_input_broadcast_over_the_batch_gets_each_examples_own_gradient(batch, ghost):
    torch.manual_seed(batch)
    error, engine = compare(
        _Positions(),
        cross_entropy,
        torch.randint(0, 9, (batch, 5)),
        torch.randint(0, 3, (batch,)),
        ghost=ghost,
    )
    assert error < TOL
    assert "positions" in engine.layer_methods and "shared_proj" in engine.layer_methods


class _Encoder(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(11, 8)
        self.position = nn.Parameter(0.1 * torch.randn(6, 1, 8))
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        h = self.embed(ids) + self.position.transpose(0, 1)
        mask = ids == 0
        if self.batch_first:
            return self.head(self.encoder(h, src_key_padding_mask=mask).mean(1))
        return self.head(self.encoder(h.transpose(0, 1), src_key_padding_mask=mask).mean(0))


@pytest.mark.parametrize("batch_first", [True, False])
def test_transformer_encoder_classifier_is_exact(batch_first):
    torch.manual_seed(7)
    ids = torch.randint(0, 11, (5, 6))
    engine = check_every_parameter(
        _Encoder(batch_first), cross_entropy, ids, torch.randint(0, 3, (5,))
    )
    methods = engine.layer_methods
    assert (
        methods["encoder.layers.0.self_attn"] == "generic"
        and methods["encoder.layers.0.linear1"] == "ghost"
    )
    # its weights are the attention's (used functionally)
    assert "encoder.layers.0.self_attn.out_proj" not in methods


class _Recurrent(nn.Module):
    def __init__(self, cell, batch_first: bool, initial: bool) -> None:
        super().__init__()
        self.batch_first, self.initial = batch_first, initial
        self.rnn = cell(4, 5, num_layers=2, batch_first=batch_first, bidirectional=True)
        self.head = nn.Linear(10, 3)

    def forward(self, x):
        x = x if self.batch_first else x.transpose(0, 1)
        state = None
        if self.initial:
            h0 = torch.full((4, x.shape[0 if self.batch_first else 1], 5), 0.1, dtype=x.dtype)
            state = (h0, h0.clone()) if isinstance(self.rnn, nn.LSTM) else h0
        out, last = self.rnn(x, state)
        last = last[0] if isinstance(last, tuple) else last
        out = out if self.batch_first else out.transpose(0, 1)
        return self.head(out.mean(1)) + last.sum((0, 2))[:, None]


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("batch_first,initial", [(False, False), (True, True)])
def test_recurrent_classifiers_are_exact_whatever_the_batch_dimension(cell, batch_first, initial):
    torch.manual_seed(8)
    model = _Recurrent(cell, batch_first, initial)
    engine = check_every_parameter(
        model, cross_entropy, torch.randn(4, 5, 4), torch.randint(0, 3, (4,))
    )
    assert engine.layer_methods["rnn"] == "generic"


class _Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(2, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(2, channels)

    def forward(self, x):
        return torch.relu(x + self.norm2(self.conv2(torch.relu(self.norm1(self.conv1(x))))))


def _resnet(norm=True):
    layers = [
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4) if not norm else nn.GroupNorm(2, 4),
        nn.ReLU(),
        _Block(4),
        nn.MaxPool2d(2),
        _Block(4),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
    ]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("clipping", ["flat", "per-layer", "automatic"])
def test_resnet_with_group_norm_is_exact(clipping):
    torch.manual_seed(9)
    check_every_parameter(
        _resnet(),
        cross_entropy,
        torch.randn(4, 3, 8, 8),
        torch.randint(0, 3, (4,)),
        clipping=clipping,
    )


def test_batchnorm_is_refused_with_the_replace_batchnorm_fix_which_makes_the_model_trainable():
    model = _resnet(norm=False)
    with pytest.raises(UnsupportedLayerError, match=r"1\.weight.*replace_batchnorm"):
        BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    assert replace_batchnorm(model) is model
    assert (
        isinstance(model[1], nn.GroupNorm)
        and model[1].num_groups == 4
        and model[1].num_channels == 4
    )
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    torch.manual_seed(9)
    error, _ = compare(model, cross_entropy, torch.randn(4, 3, 8, 8), torch.randint(0, 3, (4,)))
    assert error < TOL


def test_replace_batchnorm_keeps_affine_eps_and_picks_a_group_count_dividing_the_channels():
    model = nn.Sequential(
        nn.BatchNorm1d(6, eps=1e-3), nn.BatchNorm2d(48, affine=False), nn.BatchNorm3d(7)
    )
    replace_batchnorm(model)
    assert [m.num_groups for m in model] == [6, 24, 7]
    assert model[0].eps == 1e-3 and model[0].affine and not model[1].affine


def test_gradient_accumulation_over_physical_batches_with_generic_and_broadcast_layers():
    torch.manual_seed(10)
    model = nn.Sequential(_Positions()).double()
    ids, labels = torch.randint(0, 9, (6, 5)), torch.randint(0, 3, (6,))
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, ids, labels, 0.3)
    model[0].extra = _LayerScale(
        3
    ).double()  # never called: zeros (the step's noise only), never an error
    model.append(_Dead()).double()  # called, but its output never reaches the loss
    engine = BKEngine(model, None, clip_norm=0.3, noise_multiplier=0.0, normalizer=1.0)
    for part in (slice(0, 2), slice(2, 6)):
        engine.backward(cross_entropy(model(ids[part]), labels[part]))
    engine.step()
    got = dict(zip(engine.parameter_names, (p.grad for p in engine.params)))
    assert all(float(got[n].abs().max()) == 0 for n in got if ".extra." in n or n.startswith("1."))
    assert engine.layer_methods["1.side"] == "generic"
    assert relative_error({n: got[n] for n in expected}, expected) < TOL


class _Dead(nn.Module):
    """Passes its input on and computes an output nobody uses with its own parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.side = _LayerScale(3)

    def forward(self, x):
        self.side(x)
        return x


class _Mixer(nn.Module):
    """Mixes examples: a per-example gradient does not exist, so the generic rule must refuse."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return (x - x.mean(0)) * self.scale


class _Dropping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return nn.functional.dropout(x, 0.5, self.training) * self.scale


@pytest.mark.parametrize(
    "layer,match",
    [
        (_Mixer, "layer 0 \\(_Mixer\\).*mixes examples"),
        (_Dropping, "layer 0 \\(_Dropping\\).*random operations"),
    ],
)
def test_generic_rule_refuses_layers_it_cannot_split_per_example_naming_them(layer, match):
    model = nn.Sequential(layer(), nn.Linear(3, 2))
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    with pytest.raises(UnsupportedLayerError, match=match):
        engine.backward(sum_loss(model(torch.randn(4, 3)), torch.ones(4, 2)))


class _DataDependent(nn.Module):
    """Scales each row by 1 + the sum of its positive entries, found with ``nonzero``: a shape that
    depends on the data, which ``vmap`` cannot batch."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 3))

    def forward(self, x):
        rows = [row * self.scale * (1 + row[torch.nonzero(row > 0).flatten()].sum()) for row in x]
        return torch.stack(rows)


def test_a_forward_vmap_cannot_batch_is_rerun_one_example_at_a_time_and_exact():
    from dpledger.engine.layers import generic

    torch.manual_seed(0)
    model = nn.Sequential(_DataDependent(), nn.Linear(3, 2))
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    engine = check_every_parameter(model, cross_entropy, x, y)
    assert engine.layer_methods["0"] == "generic"
    assert any(isinstance(m, _DataDependent) for m in generic.LOOPED)  # vmap is not tried again
    mixing = nn.Sequential(_DataDependent(), _Mixer(), nn.Linear(3, 2))
    engine = BKEngine(mixing, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    with pytest.raises(UnsupportedLayerError, match="layer 1 \\(_Mixer\\).*mixes examples"):
        engine.backward(sum_loss(mixing(torch.randn(4, 3)), torch.ones(4, 2)))


def test_attention_with_a_batch_times_heads_mask_and_packed_sequences_are_refused_by_name():
    attention = nn.MultiheadAttention(4, 2, batch_first=True)
    BKEngine(attention, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    x = torch.randn(3, 5, 4)
    with pytest.raises(
        UnsupportedLayerError, match="<model> \\(MultiheadAttention\\).*3-D attn_mask"
    ):
        attention(x, x, x, attn_mask=torch.zeros(6, 5, 5))
    lstm = nn.LSTM(4, 3)
    BKEngine(lstm, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(5, 3, 4), [5, 4, 2])
    with pytest.raises(UnsupportedLayerError, match="PackedSequence"):
        lstm(packed)


def test_cpu_bf16_autocast_through_generic_and_attention_layers_is_within_five_percent():
    """bf16 keeps 8 bits of mantissa: the stated tolerance is 5e-2 relative against the float32
    naive loop."""
    torch.manual_seed(11)
    model = _Encoder(batch_first=True)
    ids, labels = torch.randint(1, 11, (4, 6)), torch.randint(0, 3, (4,))
    expected = naive_clipped_sum(copy.deepcopy(model), cross_entropy, ids, labels, 0.5)
    engine = BKEngine(model, None, clip_norm=0.5, noise_multiplier=0.0, normalizer=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids)
    engine.private_step(cross_entropy(logits.float(), labels))
    got = dict(zip(engine.parameter_names, (p.grad for p in engine.params)))
    assert relative_error(got, expected) < 5e-2


class _KeywordAttention(nn.Module):
    """Sequence-first attention called with keywords only, a key padding mask and a 2-D additive
    mask; both of its outputs (the attention weights too) feed the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(4, 2, kdim=3, vdim=5)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        q, k, v = (
            x[..., :4].transpose(0, 1),
            x[..., 4:7].transpose(0, 1),
            x[..., 7:].transpose(0, 1),
        )
        padding = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool)
        padding[:, -1] = True
        mask = torch.triu(torch.full((x.shape[1], x.shape[1]), -1.0, dtype=x.dtype), 1)
        out, weights = self.attention(
            query=q, key=k, value=v, key_padding_mask=padding, attn_mask=mask
        )
        return self.head(out.mean(0)) + weights.sum((1, 2))[:, None]


def test_attention_called_with_keywords_separate_key_value_dims_and_masks_is_exact():
    torch.manual_seed(12)
    error, engine = compare(
        _KeywordAttention(), cross_entropy, torch.randn(5, 6, 12), torch.randint(0, 3, (5,))
    )
    assert error < TOL
    assert engine.layer_methods["attention"] == "generic"

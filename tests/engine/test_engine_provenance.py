"""The batch dimension is traced, never read from a size: each layout exact in float64 against a
naive per-example loop at B = T and at B ≠ T, or refused by name at both (provenance.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from dpledger.engine import BKEngine, UnsupportedLayerError
from dpledger.engine.provenance import template
from helpers.engine_checks import check_every_parameter, naive_clipped_sum, relative_error, sum_loss

SHAPES = [(4, 4, 2), (3, 4, 2), (5, 5, 5)]
"""(B, T, d): the batch equal to the sequence (and to the features), and not."""


class RelBias(nn.Module):
    """Attention with a (T, T) relative-position bias looked up from positions: no batch
    dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Embedding(7, 1)

    def forward(self, x):
        steps = x.shape[1]
        rel = torch.arange(steps)[None, :] - torch.arange(steps)[:, None] + 3
        scores = x @ x.transpose(1, 2) + self.bias(rel.clamp(0, 6))[..., 0]
        return scores.softmax(-1) @ x


class NestedRelBias(nn.Module):
    """The table inside a block between two Linears: the block claims it."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(dim, dim), RelBias(), nn.Linear(dim, dim)

    def forward(self, x):
        return self.out(self.block(self.inp(x)))


class SequenceFirstNorm(nn.Module):
    """A LayerNorm and a Linear fed (T, B, d)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(dim), nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(self.norm(x.transpose(0, 1))).transpose(0, 1)


class SequenceFirstEncoder(nn.Module):
    """torch's encoder layer with batch_first=False, fed (T, B, d)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(dim, 1, 2 * dim, dropout=0.0, batch_first=False)

    def forward(self, x):
        return self.layer(x.transpose(0, 1)).transpose(0, 1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("make", [lambda d: RelBias(), NestedRelBias, SequenceFirstNorm])
def test_layouts_are_exact_whether_or_not_the_batch_equals_another_size(make, shape):
    torch.manual_seed(0)
    x, y = torch.randn(*shape), torch.randn(*shape)
    check_every_parameter(make(shape[-1]), sum_loss, x, y)


@pytest.mark.parametrize("shape", [(4, 4, 4), (3, 4, 4)])
def test_sequence_first_encoder_is_exact(shape):
    torch.manual_seed(0)
    x, y = torch.randn(*shape), torch.randn(*shape)
    check_every_parameter(SequenceFirstEncoder(shape[-1]), sum_loss, x, y)


def test_relative_table_is_claimed_by_its_enclosing_module():
    torch.manual_seed(0)
    x, y = torch.randn(4, 4, 2), torch.randn(4, 4, 2)
    engine = check_every_parameter(NestedRelBias(2), sum_loss, x, y)
    assert engine.layer_methods["block"] == "generic"
    assert engine.layer_methods["inp"] in ("ghost", "instantiate")


class TimeMajorRows(nn.Module):
    """Rows flattened time-major ((T, B) order): taking them example-major would be wrong."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        rows = self.proj(x.transpose(0, 1).reshape(-1, x.shape[-1]))
        return rows.view(x.shape[1], x.shape[0], -1).transpose(0, 1)


class BatchGram(nn.Module):
    """A Linear on each entry of the (B, B) Gram of the examples: it mixes them."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(1, 1)

    def forward(self, x):
        flat = x.reshape(x.shape[0], -1)
        mixed = self.proj((flat @ flat.T).unsqueeze(-1)).sum(1)
        return x * mixed[:, :, None]


class Selected(nn.Module):
    """A Linear on the tokens a data-dependent mask selects (as experts see their tokens)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        keep = x[..., 0] > 0
        out = torch.zeros_like(x)
        out[keep] = self.proj(x[keep])
        return out


def _selective_inputs(batch: int, steps: int, dim: int) -> torch.Tensor:
    """Example i keeps i + 1 tokens, so the selected rows are no multiple of the batch."""
    x = torch.randn(batch, steps, dim).abs()
    for i in range(batch):
        x[i, min(i + 1, steps) :, 0] *= -1
    return x


@pytest.mark.parametrize(
    ("model", "inputs", "match"),
    [
        (TimeMajorRows(4), lambda b: torch.randn(b, 4, 4), r"proj \(Linear\) sees 4 rows"),
        (BatchGram(), lambda b: torch.randn(b, 4, 3), r"proj \(Linear\).*several of its"),
        (
            Selected(3),
            lambda b: _selective_inputs(b, 4, 3),
            r"proj \(Linear\).*on the data",
        ),
    ],
)
@pytest.mark.parametrize("batch", [4, 3])
def test_untraceable_layouts_are_refused_by_name_at_every_batch_size(model, inputs, match, batch):
    torch.manual_seed(0)
    model = copy.deepcopy(model).double()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    x = inputs(batch).double()
    with pytest.raises(UnsupportedLayerError, match=match):
        engine.backward(sum_loss(model(x), torch.ones_like(x)))


def test_batchnorm_stays_refused_by_name():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with pytest.raises(UnsupportedLayerError, match=r"1 \(BatchNorm1d\).*mixes examples"):
        BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)


def test_template_marks_the_batch_and_shared_sizes():
    assert template((2, 4, 3), (3, 4, 3)) == (-1, 4, 3)
    assert template((4, 2, 8), (4, 3, 8)) == (4, -1, 8)
    assert template((8, 5), (12, 5)) == (-4, 5)
    assert template((4, 4), (4, 4)) == (4, 4)
    assert "several" in template((2, 2), (3, 3))
    assert "depends on the data" in template((3, 5), (4, 5))
    assert "rank" in template((2, 4), (3, 4, 1))


class Scale(nn.Module):
    """A layer with no rule (generic) around a Linear."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(dim) + 0.5)
        self.inner = nn.Linear(dim, dim)

    def forward(self, x):
        return self.inner(x * self.w)


class Checkpointed(nn.Module):
    """Scale inside a gradient checkpoint between two Linears (``reentrant`` None: no checkpoint,
    the naive loop's model)."""

    def __init__(self, reentrant: bool | None) -> None:
        super().__init__()
        self.a, self.s, self.b = nn.Linear(3, 4), Scale(4), nn.Linear(4, 2)
        self.reentrant = reentrant

    def forward(self, x):
        h = self.a(x)
        if self.reentrant is None:
            return self.b(self.s(h))
        return self.b(checkpoint(self.s, h, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_is_exact_step_after_step(reentrant):
    torch.manual_seed(0)
    model = Checkpointed(reentrant).double()
    reference = copy.deepcopy(model)
    reference.reentrant = None
    engine = BKEngine(model, None, clip_norm=0.5, noise_multiplier=0.0, normalizer=1.0)
    for step in range(3):  # a stale record of one step would change the next one's sum
        x, y = torch.randn(4, 5, 3).double(), torch.randn(4, 5, 2).double()
        for target, source in zip(reference.parameters(), model.parameters()):
            target.data.copy_(source.data)
        expected = naive_clipped_sum(reference, sum_loss, x, y, 0.5)
        engine.private_step(sum_loss(model(x), y))
        got = {n: p.grad for n, p in zip(engine.parameter_names, engine.params)}
        assert relative_error(got, expected) < 1e-10, step
        assert float(got["s.w"].abs().max()) > 0
    assert engine.layer_methods["s"] == "generic"


def test_a_parameter_shared_across_a_reentrant_checkpoint_is_refused():
    torch.manual_seed(0)

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.a(checkpoint(self.a, self.b(x), use_reentrant=True))

    model = Shared().double()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    x = torch.randn(3, 2, 4).double()
    with pytest.raises(UnsupportedLayerError, match=r"a \(Linear\) runs inside a reentrant"):
        engine.backward(sum_loss(model(x), x))

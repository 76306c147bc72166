"""Defect 3 of issue 21: one non-finite example must not move the model (clip factor 0, exactly zero
contribution)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpledger.engine import BKEngine
from dpledger.engine.clipping import clip_factors


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 1 * 2, 3))


def _update(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, **engine_options
) -> tuple[dict, BKEngine]:
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    engine = BKEngine(
        model, optimizer, clip_norm=1.0, noise_multiplier=0.0, normalizer=8, **engine_options
    )
    engine.backward(F.cross_entropy(model(x), y, reduction="none"))
    engine.step()
    return {k: v.clone() for k, v in model.state_dict().items()}, engine


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("ghost", ["always", "never"])
@pytest.mark.parametrize("clipping", ["flat", "per-layer", "automatic"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_one_nonfinite_pixel_is_dropped_and_the_update_equals_the_update_without_it(
    kind, ghost, clipping, bad
):
    model = _model(kind)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(6, 1, 3, 4, generator=generator)
    y = torch.randint(0, 3, (6,), generator=generator)
    poisoned = x.clone()
    poisoned[2, 0, 1, 1] = bad
    with_bad, engine = _update(model, poisoned, y, ghost=ghost, clipping=clipping)
    keep = [0, 1, 3, 4, 5]
    without, _ = _update(model, x[keep], y[keep], ghost=ghost, clipping=clipping)
    for name, value in with_bad.items():
        assert torch.isfinite(value).all(), name
        torch.testing.assert_close(value, without[name], rtol=1e-6, atol=1e-7)
    assert engine.nonfinite_examples == 1
    assert not torch.isfinite(engine.last_norms[2])


def test_padding_rows_with_nonfinite_values_are_zero_and_not_counted():
    model = _model("mlp")
    x = torch.randn(4, 1, 3, 4)
    x[3] = float("nan")
    y = torch.tensor([0, 1, 2, 0])
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    engine = BKEngine(model, optimizer, clip_norm=1.0, noise_multiplier=0.0, normalizer=4)
    engine.backward(
        F.cross_entropy(model(x), y, reduction="none"), torch.tensor([1.0, 1.0, 1.0, 0.0])
    )
    engine.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert engine.nonfinite_examples == 0


def test_the_count_is_saved_and_restored_with_the_ledger():
    model = _model("mlp")
    x = torch.randn(3, 1, 3, 4)
    x[0, 0, 0, 0] = float("nan")
    _, engine = _update(model, x, torch.tensor([0, 1, 2]))
    state = engine.state_dict()
    fresh = BKEngine(copy.deepcopy(model), clip_norm=1.0, noise_multiplier=0.0, normalizer=3)
    fresh.load_state_dict(state)
    assert fresh.nonfinite_examples == 1 and fresh.steps_taken == 1


def test_clip_factors_of_nonfinite_norms_are_zero():
    norm_sq = torch.tensor([4.0, float("nan"), float("inf"), 0.25])
    for mode in ("flat", "automatic"):
        factors = clip_factors(norm_sq, 1.0, mode)
        assert factors[1] == 0 and factors[2] == 0
        assert torch.isfinite(factors).all()
    torch.testing.assert_close(clip_factors(norm_sq, 1.0, "flat")[[0, 3]], torch.tensor([0.5, 1.0]))


def test_an_example_with_a_nan_input_through_the_generic_rule_is_dropped_not_refused():
    """A custom norm (generic rule) on a NaN example: the recomputation check treats NaN = NaN, and
    the example is dropped like any other non-finite one, so the update equals the one without
    it."""

    class ScaleNorm(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(width, dtype=torch.float64))

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return self.scale * h / h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()

    def run(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 6), ScaleNorm(6), nn.Linear(6, 3)).double()
        engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
        engine.private_step(F.cross_entropy(model(x), y, reduction="none"))
        return [v.clone() for v in engine.last_noisy_sum], engine

    torch.manual_seed(1)
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.randint(0, 3, (5,))
    poisoned = x.clone()
    poisoned[2, 1] = float("nan")
    with_nan, engine = run(poisoned, y)
    keep = torch.tensor([0, 1, 3, 4])
    without, _ = run(x[keep], y[keep])
    assert engine.nonfinite_examples == 1
    for a, b in zip(with_nan, without):
        torch.testing.assert_close(a, b)

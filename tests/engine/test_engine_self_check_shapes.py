"""The self-check runs the engine at the shapes training uses: a batch as large as the padded
sequence length (B = T) and one coprime to every other dimension, so a model or rule that is wrong
only when the batch equals another size fails the check instead of training wrong."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dpledger.engine import BKEngine
from dpledger.engine.self_check import SelfCheckError, training_batches


def _sizes(x: torch.Tensor) -> list[int]:
    return [len(b) for b in training_batches(x)]


def test_batches_hold_the_sequence_length_and_a_coprime_size_and_every_row():
    ids = torch.zeros(5, 8, dtype=torch.long)
    assert _sizes(ids) == [8, 3]
    assert _sizes(torch.zeros(4, 4, 2)) == [4, 3]
    assert _sizes(torch.zeros(4, 6, 10)) == [6, 7]
    features = torch.zeros(9, 6)  # no sequence: a coprime batch and the rows left over
    assert _sizes(features) == [5, 4]
    for x in (ids, torch.zeros(4, 4, 2), features):
        rows = torch.cat(training_batches(x))
        assert set(rows.tolist()) == set(range(len(x)))
        coprime = _sizes(x)[1 if x.dim() > 2 or not x.is_floating_point() else 0]
        assert all(math.gcd(coprime, d) == 1 for d in x.shape[1:])


class _WrongWhenSquare(nn.Module):
    """Mixes the examples only when the batch size equals the sequence length."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)

    def forward(self, x):
        if x.shape[0] == x.shape[1]:
            x = x.transpose(0, 1)
        return self.proj(x)


def _losses(model, x, y):
    return ((model(x) - y) ** 2).sum((1, 2))


def test_a_model_wrong_only_at_b_equal_t_fails_the_self_check():
    torch.manual_seed(0)
    model = _WrongWhenSquare()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=1.0, normalizer=3.0)
    x, y = torch.randn(3, 4, 2), torch.randn(3, 4, 2)
    with pytest.raises(SelfCheckError):
        engine.self_check(_losses, x, y)


def test_a_correct_model_passes_at_the_training_shapes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 2))
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=1.0, normalizer=3.0)
    result = engine.self_check(_losses, torch.randn(3, 4, 2), torch.randn(3, 4, 2))
    assert result.passed and result.max_relative_error < 1e-12

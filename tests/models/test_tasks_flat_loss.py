"""The causal-LM loss in the flat (B·T, V) layout equals the transposed (B, V, T) one it replaced,
value and gradient, padding and precision included, and stays per example."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dpledger.data.text import PAD
from dpledger.models.tasks import Task


def transposed_losses(logits, ids):
    """The former formula: cross_entropy on (B, V, T − 1), padded targets masked after the fact,
    the sum over real targets divided by their count."""
    targets = ids[:, 1:]
    real = (targets != PAD).to(torch.float64)
    tokens = F.cross_entropy(
        logits[:, :-1].double().transpose(1, 2), targets.clamp_min(0), reduction="none"
    )
    return (tokens * real).sum(1) / real.sum(1).clamp_min(1)


def _batch(batch=5, steps=9, vocab=13, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, steps, vocab, generator=generator, dtype=dtype) * 3
    ids = torch.randint(0, vocab, (batch, steps), generator=generator)
    ids[1, 6:] = PAD  # a padded row
    ids[2, 1:] = PAD  # a row with no real target: loss 0
    return logits, ids


@pytest.mark.parametrize("seed", range(3))
def test_flat_losses_equal_the_transposed_ones_with_their_gradients(seed):
    logits, ids = _batch(seed=seed)
    logits.requires_grad_(True)
    task = Task("causal-lm")
    got = task.losses_from_logits(logits, ids, ids[:, 0])
    expected = transposed_losses(logits, ids)
    assert got.shape == (5,) and torch.allclose(got, expected, rtol=1e-14, atol=0)
    assert got[2] == 0
    weights = torch.arange(1.0, 6.0, dtype=torch.float64)
    (grad,) = torch.autograd.grad((got * weights).sum(), logits)
    (reference,) = torch.autograd.grad((expected * weights).sum(), logits)
    assert torch.allclose(grad, reference, rtol=1e-12, atol=1e-15)
    assert torch.all(grad[:, -1] == 0) and torch.all(grad[1, 5:] == 0)


def test_flat_losses_are_per_example():
    """Changing one sequence's logits moves its loss alone (the engine clips per row)."""
    logits, ids = _batch()
    task = Task("causal-lm")
    before = task.losses_from_logits(logits, ids, ids[:, 0])
    logits[3] += torch.randn_like(logits[3])
    after = task.losses_from_logits(logits, ids, ids[:, 0])
    changed = before != after
    assert changed.tolist() == [False, False, False, True, False]


def test_half_precision_logits_are_scored_in_float32():
    logits, ids = _batch(dtype=torch.float32)
    task = Task("causal-lm")
    got = task.losses_from_logits(logits.bfloat16(), ids, ids[:, 0])
    expected = transposed_losses(logits.bfloat16().float(), ids)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), expected, rtol=1e-6)


def test_evaluation_is_the_token_weighted_mean():
    logits, ids = _batch()

    class Fixed(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return logits

    metrics = Task("causal-lm").evaluate(Fixed(), ids, ids[:, 0])
    targets = ids[:, 1:]
    real = targets != PAD
    tokens = F.cross_entropy(logits[:, :-1][real], targets[real], reduction="sum") / real.sum()
    assert metrics["loss"] == pytest.approx(float(tokens), rel=1e-12)

"""What is actually summed stays within R: max_i ‖C_i·g_i‖ / R of the engine's clipped
contribution as released (one example per step, B = 1, so the released sum is that example's
contribution, its norm taken in float64 of the float32 buffer), under float32 and under bf16
autocast on the CPU, on a tiny GPT-2 (tied head: ghost cross terms) and the digits MLP; every
example clipped (R far below its norm)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from test_engine_hf_models import MODELS

from dpledger.engine import BKEngine
from dpledger.engine.tensor_cores import TRUNCATION

MARGIN = 1e-5
FLOOR = {"fp32": 1 - 1e-3, "bf16": 1 - TRUNCATION}
"""Every example was clipped, so each ratio is above this: the bound is tight, not vacuous (bf16
products lower the factor to 8 significant bits: tensor_cores.scaled_parts)."""


def clipped_over_r(model, loss_fn, inputs, targets, clip_norm, context) -> list[float]:
    """‖released sum‖ / R of each example alone (noise off, normalizer 1)."""
    ratios = []
    for i in range(inputs.shape[0]):
        engine = BKEngine(model, None, clip_norm=clip_norm, noise_multiplier=0.0, normalizer=1.0)
        with context():
            losses = loss_fn(model(inputs[i : i + 1]).float(), targets[i : i + 1])
        engine.private_step(losses)
        released = engine.last_noisy_sum
        norm = torch.sqrt(sum(t.double().square().sum() for t in released))
        engine.detach()
        ratios.append(float(norm) / clip_norm)
    return ratios


CONTEXTS = {
    "fp32": contextlib.nullcontext,
    "bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
}


@pytest.mark.parametrize("precision", list(CONTEXTS))
@pytest.mark.parametrize("clip_norm", [1e-3, 0.05])
def test_gpt2_contributions_stay_within_r(precision, clip_norm):
    model, loss_fn, inputs, targets = MODELS["gpt2"]()
    model = copy.deepcopy(model).float()
    ratios = clipped_over_r(model, loss_fn, inputs, targets, clip_norm, CONTEXTS[precision])
    assert max(ratios) <= 1 + MARGIN, ratios
    assert min(ratios) > FLOOR[precision]


@pytest.mark.parametrize("precision", list(CONTEXTS))
def test_mlp_contributions_stay_within_r(precision):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    x, y = torch.randn(16, 64) * 10, torch.randint(0, 10, (16,))

    def loss_fn(out, target):
        return F.cross_entropy(out, target, reduction="none")

    ratios = clipped_over_r(model, loss_fn, x, y, 1e-3, CONTEXTS[precision])
    assert FLOOR[precision] < min(ratios) and max(ratios) <= 1 + MARGIN, ratios

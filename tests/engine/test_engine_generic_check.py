"""The generic rule's recomputation check, formed on the device (issue 30), decides exactly as the
host check it replaces: finite entries within the dtype's tolerance of the largest finite saved
entry, non-finite entries non-finite in both."""

from __future__ import annotations

import pytest
import torch

from dpledger.engine.layers.generic import close


def _host_close(recomputed: torch.Tensor, saved: torch.Tensor) -> bool:
    """The check before issue 30, three host syncs: the independent reference."""
    if not saved.numel():
        return True
    recomputed = recomputed.to(saved.dtype)
    finite = torch.isfinite(saved)
    if not torch.equal(finite, torch.isfinite(recomputed)):
        return False
    if not finite.any():
        return True
    tolerance = {torch.float64: 1e-6, torch.float32: 1e-3}.get(saved.dtype, 3e-2)
    scale = saved[finite].abs().max().clamp_min(1.0)
    return bool((recomputed[finite] - saved[finite]).abs().max() <= tolerance * scale)


def _cases(dtype: torch.dtype):
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        draw = torch.randn(3, 5, generator=generator, dtype=torch.float64)
        saved = (draw * 10 ** (trial % 5 - 2)).to(dtype)
        step = 10 ** (-float(torch.randint(1, 9, (), generator=generator)))
        noise = torch.randn(3, 5, generator=generator, dtype=torch.float64).to(dtype)
        recomputed = saved + step * noise
        if trial % 4 == 1:  # the same non-finite entries in both
            saved[0, trial % 5] = recomputed[0, trial % 5] = float("nan")
            saved[2, 1] = recomputed[2, 1] = float("inf")
        if trial % 4 == 2:  # non-finite in one only
            recomputed[1, trial % 5] = float("nan")
        if trial % 10 == 3:  # nothing finite
            saved.fill_(float("nan"))
            recomputed.fill_(float("nan"))
        yield recomputed, saved
    yield torch.zeros(0, dtype=dtype), torch.zeros(0, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_device_check_decides_as_the_host_check_did(dtype):
    decisions = []
    for recomputed, saved in _cases(dtype):
        verdict = close(recomputed, saved)
        assert verdict.dtype == torch.bool and verdict.dim() == 0
        assert bool(verdict) == _host_close(recomputed, saved), (recomputed, saved)
        decisions.append(bool(verdict))
    assert any(decisions) and not all(decisions)  # both verdicts are exercised

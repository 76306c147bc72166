"""The noise paths' reach as a tested invariant, and the δ a capped sampler would leak."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from dpledger import philox_normal
from dpledger.audit.noise_tails import noise_support, reach, tail_delta
from dpledger.engine import noise


def test_philox_reaches_beyond_nine_sigma_at_its_least_word():
    """The CPU float32 path's largest radius, from its own float32 log at the zero words."""
    radius = math.sqrt(float(philox_normal._minus_two_log(np.uint32(0), np.uint32(0))))
    assert radius == pytest.approx(reach("philox"), rel=1e-5)
    assert radius > 9.4


def test_secure_path_reaches_its_stated_support(monkeypatch):
    """os.urandom returning only zero bits gives the secure path's least uniform: |z| = k."""
    monkeypatch.setattr(noise.os, "urandom", lambda n: bytes(n))
    z = noise.secure_standard_normal(4, torch.float64)
    assert float(z.abs().max()) == pytest.approx(reach("secure"), rel=1e-9)
    assert reach("secure") > 8.6


def test_chunked_path_is_float64_draws_rounded_so_its_tail_is_float64s():
    """Every non-Philox path (CUDA's included: the same code) draws in float64 and rounds: its
    values are float64 normals from the chunk's own generator, not a float32 draw."""
    source = noise.NoiseSource(1000, seed=3)
    out = torch.empty(1000, dtype=torch.float32)
    source._torch_chunks_into(out, 5, 1.0)
    seed = noise.chunk_seeds(3, 5, 1)[0]
    wide = torch.empty(1000, dtype=torch.float64).normal_(
        0.0, 1.0, generator=torch.Generator().manual_seed(seed)
    )
    assert torch.equal(out, wide.float())
    assert reach("torch-float64") > 8.5 > reach("torch-float32") + 2.5


def test_tail_delta_bounds_the_capped_pairs_exact_leak():
    """One use of a sampler capped at k: the released value exceeds k only with the example, with
    probability Φ(k) − Φ(k − 1/σ) (the exact δ at ε = ∞); the bound is at least that and tight."""
    for k, sigma in ((5.77, 0.77), (5.2, 1.0), (6.7, 0.5)):
        exact = norm.cdf(k) - norm.cdf(k - 1.0 / sigma)
        bound = tail_delta(k, sigma, 1.0)
        assert exact <= bound <= exact * 1.01 + norm.sf(k)


def test_a_float32_cap_leaks_more_than_the_claimed_delta_and_the_engines_paths_do_not():
    """Digits at ε = 8 (σ = 0.77, about 10 uses of an example): a 5.77σ cap leaks about 4e-5 > δ =
    1e-5; the engine's paths leak below 1e-11 (10⁻⁶ of δ)."""
    assert tail_delta(reach("torch-float32"), 0.77, 10.2) > 1e-5
    for path in ("philox", "torch-float64", "secure"):
        support = noise_support(path, 0.77, 10.2)
        assert support.tail_delta < 1e-11
        assert "noise support ≥" in support.line() and "tail δ ≤" in support.line()

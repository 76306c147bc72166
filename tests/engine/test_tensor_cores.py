"""The half-precision products of ``engine/tensor_cores.py``: the factor's truncation and the exact
bfloat16 split against float64, the clipped sum of bfloat16 operands against a float64 computation
from the same operands, and the layer input rounded as autocast's product used it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpledger.engine import BKEngine, tensor_cores
from dpledger.engine.layers.registry import add_scaled_product


def _bfloat16(*shape, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale).to(torch.bfloat16)


def test_truncation_lowers_each_factor_by_less_than_two_to_the_minus_seven():
    torch.manual_seed(0)
    factors = torch.rand(10_000) * torch.logspace(-6, 0, 10_000)
    truncated = tensor_cores.truncated_to_bfloat16(factors)
    assert torch.equal(truncated.to(torch.bfloat16).float(), truncated)  # 8 significant bits
    assert (truncated <= factors).all()
    ratio = truncated.double() / factors.double()
    assert ratio.min() > 1 - tensor_cores.TRUNCATION
    assert ratio.min() < 1 - tensor_cores.TRUNCATION / 4  # it does truncate


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e6])
def test_the_split_is_exact(scale):
    torch.manual_seed(1)
    operand, factors = _bfloat16(64, 16, 48, scale=scale), torch.rand(64) / 37
    hi, lo = tensor_cores.scaled_parts(operand, factors)
    assert hi.dtype == lo.dtype == torch.bfloat16
    exact = operand.double() * tensor_cores.truncated_to_bfloat16(factors).double()[:, None, None]
    assert torch.equal(hi.double() + lo.double(), exact)
    assert (lo != 0).any()  # one bfloat16 would not have held the product


@pytest.mark.parametrize("scale_b", [True, False])
def test_clipped_sum_of_bfloat16_operands_is_the_float64_sum_of_the_same_operands(scale_b):
    torch.manual_seed(2)
    p, d = (8, 24) if scale_b else (24, 8)
    b, a, factors = _bfloat16(5, 7, p), _bfloat16(5, 7, d), torch.rand(5)
    out = torch.zeros(p, d)
    add_scaled_product(out, factors, b, a)
    truncated = tensor_cores.truncated_to_bfloat16(factors).double()
    expected = torch.einsum("i,itp,itd->pd", truncated, b.double(), a.double())
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)


def test_a_float32_input_is_rounded_as_the_bfloat16_product_used_it():
    """Under bf16 autocast a Linear multiplies bf16(x): with every x = 1 + 2⁻⁹ (bf16(x) = 1) and
    the output gradient c (bf16 values), example i's weight gradient is Σ_t c_t ⊗ 1. The engine's
    clipped sum (nothing clipped, noise off, normalizer 1) is that to float32 accumulation, not the
    0.2 % larger Σ_t c_t ⊗ x_t of the unrounded input."""
    torch.manual_seed(3)
    layer = nn.Linear(16, 4, bias=False)
    x = torch.full((8, 5, 16), 1 + 2**-9)
    c = _bfloat16(8, 5, 4).float()
    engine = BKEngine(
        layer, None, clip_norm=1e9, noise_multiplier=0.0, normalizer=1.0, ghost="always"
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = (layer(x).float() * c).sum((1, 2))
    engine.private_step(losses)
    assert set(engine.layer_methods.values()) == {"ghost"}
    expected = c.double().sum((0, 1))[:, None].expand(4, 16)
    (got,) = engine.last_noisy_sum
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_has_the_float32_output_kernels():
    assert tensor_cores.has_out_dtype("cuda")
    b, a = _bfloat16(4, 9, 16).cuda(), _bfloat16(4, 9, 16).cuda()
    gram = tensor_cores.bmm_float32(b, a.transpose(1, 2))
    assert gram.dtype == torch.float32
    torch.testing.assert_close(
        gram.double().cpu(), torch.bmm(b.double(), a.double().transpose(1, 2)).cpu()
    )

"""noise_stream yields the rows of C⁻¹Z: checked against the dense triangular solve with the same
Z."""

import numpy as np
import pytest
import torch
from scipy.linalg import solve_triangular

from dpledger.errors import ParamsError, UnsupportedMechanismError
from dpledger.mechanisms import (
    banded_params,
    coefficients,
    dense_matrix,
    inverse_coefficients,
    noise_stream,
)

STEPS, NUMEL = 37, 5

CASES = [
    ("identity", {}),
    ("banded", banded_params(4)),
    ("banded", {"coefficients": [2.0, 0.5]}),
    ("toeplitz", {"coefficients": list(1.0 / np.arange(1, STEPS + 1))}),
    ("blt", {"buffer_decays": [0.9, 0.5, 0.1], "output_scales": [0.2, 0.1, 0.3]}),
]


def _dense_rows(mechanism, params, dtype=torch.float64):
    generator = torch.Generator().manual_seed(7)
    z = torch.stack(
        [torch.randn(NUMEL, generator=generator, dtype=dtype) for _ in range(STEPS)]
    ).numpy()
    matrix = dense_matrix(coefficients(mechanism, params, STEPS))
    return solve_triangular(matrix, z, lower=True)


@pytest.mark.parametrize("mechanism,params", CASES)
def test_noise_stream_equals_dense_inverse_product(mechanism, params):
    generator = torch.Generator().manual_seed(7)
    rows = list(
        noise_stream(mechanism, params, STEPS, NUMEL, generator=generator, dtype=torch.float64)
    )
    assert len(rows) == STEPS and all(r.shape == (NUMEL,) for r in rows)
    np.testing.assert_allclose(
        torch.stack(rows).numpy(), _dense_rows(mechanism, params), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("mechanism,params", CASES)
def test_noise_stream_over_given_normals_equals_dense_inverse_product(mechanism, params):
    """``normals(t)`` (the engine's counter-based rows) takes the generator's place, row t for step
    t."""
    z = np.random.default_rng(3).standard_normal((STEPS, NUMEL))
    rows = list(
        noise_stream(
            mechanism,
            params,
            STEPS,
            NUMEL,
            normals=lambda t: torch.from_numpy(z[t].copy()),
            dtype=torch.float64,
        )
    )
    expected = solve_triangular(dense_matrix(coefficients(mechanism, params, STEPS)), z, lower=True)
    np.testing.assert_allclose(torch.stack(rows).numpy(), expected, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="exactly one of generator and normals"):
        next(noise_stream(mechanism, params, STEPS, NUMEL))


def test_noise_stream_float32_close_to_float64():
    params = CASES[4][1]
    rows = list(
        noise_stream("blt", params, STEPS, NUMEL, generator=torch.Generator().manual_seed(7))
    )
    assert rows[0].dtype == torch.float32
    np.testing.assert_allclose(torch.stack(rows).numpy(), _dense_rows("blt", params), atol=1e-4)


@pytest.mark.parametrize("mechanism,params", CASES)
def test_float32_stream_rounds_float64_normals_so_tails_are_not_cut_at_5_77_sigma(
    mechanism, params
):
    """torch's float32 randn takes the Box–Muller radius from 24-bit uniforms: |z| <= 5.768, on a
    coarse lattice in the tail. Noise capped there leaks (a shift m_t pushes a coordinate past the
    cap with probability P(5.768 − m_t/σ < Z <= 5.768); about 1e-6 per participation at σ = 1), so a
    float32 stream must be the float64 stream (53-bit uniforms, cap 8.57) rounded, not torch's
    float32 draw. (numel >= 16: torch draws fewer than 16 normals in double precision either
    way.)"""
    numel = 64

    def rows(dtype):
        generator = torch.Generator().manual_seed(7)
        return torch.stack(
            list(noise_stream(mechanism, params, STEPS, numel, generator=generator, dtype=dtype))
        )

    rows32, rows64 = rows(torch.float32), rows(torch.float64)
    assert rows32.dtype == torch.float32
    np.testing.assert_allclose(rows32.numpy(), rows64.numpy(), rtol=1e-5, atol=1e-5)


def test_identity_stream_is_standard_normal():
    rows = torch.stack(
        list(noise_stream("identity", {}, 200, 500, generator=torch.Generator().manual_seed(1)))
    )
    assert abs(rows.mean().item()) < 0.01 and abs(rows.std().item() - 1.0) < 0.01


def test_inverse_coefficients_invert_the_dense_matrix():
    values = coefficients("blt", CASES[4][1], 20)
    product = dense_matrix(values) @ dense_matrix(inverse_coefficients(values))
    np.testing.assert_allclose(product, np.eye(20), atol=1e-12)


def test_negative_coefficient_is_refused_with_appendix_a_reason():
    with pytest.raises(UnsupportedMechanismError, match="Appendix A"):
        coefficients("toeplitz", {"coefficients": [1.0, -1.0]}, 4)


@pytest.mark.parametrize(
    "mechanism,params",
    [
        ("banded", {}),
        ("toeplitz", {"coefficients": [0.0, 1.0]}),
        ("blt", {"buffer_decays": [1.5], "output_scales": [1]}),
        ("dense", {}),
    ],
)
def test_bad_mechanism_params_raise_params_error(mechanism, params):
    with pytest.raises(ParamsError):
        coefficients(mechanism, params, 4)

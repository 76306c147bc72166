"""Prefix-sum RMSE, banded choice and optimization of C under balls-in-bins amplification."""

import math

import numpy as np
import pytest
import torch

from dpledger.accounting import montecarlo as mc
from dpledger.accounting.mc_search import SigmaSearch, calibrate_sigma
from dpledger.accounting.optimize import (
    RmseSetting,
    _blt,
    _implicit_gradient,
    amplified_rmse,
    best_bands,
    blt_fit,
    optimize_banded,
    optimize_blt_unamplified,
    optimize_matrix,
    unamplified_rmse,
)
from dpledger.accounting.pld import gaussian_noise_for
from dpledger.errors import ParamsError
from dpledger.mechanisms import banded_params, coefficients, dense_matrix
from dpledger.mechanisms.matrices import blt_coefficients
from dpledger.mechanisms.rmse import prefix_error_norm, prefix_error_norm_torch, prefix_rmse


@pytest.mark.parametrize(
    "mechanism,params",
    [
        ("identity", {}),
        ("banded", banded_params(5)),
        ("blt", {"buffer_decays": [0.7], "output_scales": [0.3]}),
    ],
)
def test_prefix_rmse_equals_dense_frobenius_norm(mechanism, params):
    n = 24
    values = coefficients(mechanism, params, n)
    prefix = np.tril(np.ones((n, n)))
    dense = np.linalg.norm(prefix @ np.linalg.inv(dense_matrix(values)), "fro") / math.sqrt(n)
    assert prefix_rmse(values, 2.0) == pytest.approx(2.0 * dense, rel=1e-10)
    assert float(prefix_error_norm_torch(torch.as_tensor(values))) == pytest.approx(
        dense, rel=1e-10
    )


def test_identity_prefix_error_is_closed_form():
    n = 100
    assert prefix_error_norm(coefficients("identity", {}, n)) == pytest.approx(
        math.sqrt((n + 1) / 2)
    )


def test_square_root_factorization_beats_identity_without_amplification():
    n = 64
    assert prefix_error_norm(coefficients("banded", banded_params(n), n)) < prefix_error_norm(
        np.eye(n)[0]
    )


def test_balls_in_bins_improves_on_unamplified_rmse():
    for epsilon in (0.5, 4.0, 16.0):
        result = amplified_rmse(
            "banded", banded_params(2), RmseSetting(epsilon, 1e-5, 8, 4, samples=1 << 14)
        )
        assert result.rmse < result.unamplified_rmse
        assert (
            unamplified_rmse("banded", banded_params(2), epsilon, 1e-5, 8, 4)
            == result.unamplified_rmse
        )


def test_best_bands_is_the_minimum_over_candidates():
    best = best_bands(RmseSetting(2.0, 1e-4, 8, 4, samples=1 << 13), candidates=[1, 2, 4])
    each = [
        amplified_rmse("banded", params, RmseSetting(2.0, 1e-4, 8, 4, samples=1 << 13)).rmse
        for w in (1, 2, 4)
        for params in (banded_params(w), optimize_banded(w, 8, 4))
    ]
    assert best.rmse == pytest.approx(min(each))
    assert len(set(each)) > 3  # the optimized C differs from the square root for w > 1


def test_implicit_gradient_of_sigma_matches_finite_differences():
    """∂σ/∂θ from the implicit function theorem equals the slope of the recalibrated σ(C) (same
    samples)."""
    bins, epochs, epsilon, delta, samples = 4, 3, 1.0, 1e-2, 20_000
    n = bins * epochs
    start, to_coefficients, _ = _blt(1, 12, 4)
    raw = start.clone().requires_grad_(True)

    def sigma_of(theta: torch.Tensor) -> tuple[float, SigmaSearch, torch.Tensor]:
        gram = mc.toeplitz_gram(to_coefficients(theta, n), bins, n)
        pair = mc.DominatingPair((gram.detach().numpy(),))
        upper = gaussian_noise_for(pair.max_sensitivity(), epsilon, delta)
        search = calibrate_sigma(pair, epsilon, delta, samples, 3, upper, tolerance=1e-10)
        return search.noise_multiplier, search, gram

    sigma, search, gram = sigma_of(raw)
    norm = prefix_error_norm_torch(to_coefficients(raw, n))
    gradient = _implicit_gradient(raw, gram, norm, search, epsilon, sigma)
    grad_norm = (
        torch.autograd.grad(prefix_error_norm_torch(to_coefficients(raw, n)), raw)[0]
        / norm.detach()
    )
    implicit_sigma = (gradient - grad_norm) * sigma
    step = 1e-3
    for index in range(raw.numel()):
        shift = torch.zeros_like(raw)
        shift[index] = step
        plus, _, _ = sigma_of(raw.detach() + shift)
        minus, _, _ = sigma_of(raw.detach() - shift)
        assert float(implicit_sigma[index]) == pytest.approx(
            (plus - minus) / (2 * step), rel=0.05, abs=1e-4
        )


def test_optimized_blt_improves_on_its_start_and_is_non_negative():
    """From (nearly) DP-SGD at ε = 8, where correlated noise pays, the optimized BLT has a smaller
    RMSE than its start, both recalibrated on the same larger sample."""
    result = optimize_matrix(
        "blt", 8.0, 1e-4, 6, 4, steps=60, samples=1 << 12, buffers=2, init_bands=1
    )
    start = {"buffer_decays": [1 - 1 / 1.5, 0.5], "output_scales": [1e-2, 1e-2]}
    recalibration = RmseSetting(8.0, 1e-4, 6, 4, samples=1 << 15, seed=9)
    before = amplified_rmse("blt", start, recalibration)
    after = amplified_rmse("blt", result.mechanism_params, recalibration)
    assert after.rmse < 0.97 * before.rmse
    assert all(0 <= d < 1 for d in result.mechanism_params["buffer_decays"])
    assert all(s >= 0 for s in result.mechanism_params["output_scales"])
    assert np.all(coefficients("blt", result.mechanism_params, 24) >= 0)


def test_blt_fit_reproduces_a_geometric_target():
    target = np.concatenate([[1.0], 0.3 * 0.8 ** np.arange(30)])
    decays, scales = blt_fit(target, 3)
    np.testing.assert_allclose(
        coefficients("blt", {"buffer_decays": decays, "output_scales": scales}, 31),
        target,
        atol=0.02,
    )


def _dense_unamplified_factor(values: np.ndarray, bins: int, epochs: int) -> float:
    """max_i ‖Σ_e C[:, e·b + i]‖ · ‖A C⁻¹‖_F/√n from dense matrices (independent of the torch
    objective)."""
    n = bins * epochs
    matrix = dense_matrix(values)
    modes = np.stack([matrix[:, i::bins].sum(1) for i in range(bins)])
    error = np.linalg.norm(np.tril(np.ones((n, n))) @ np.linalg.inv(matrix), "fro") / math.sqrt(n)
    return float(np.linalg.norm(modes, axis=1).max()) * error


@pytest.mark.parametrize("bands", [2, 3, 6, 16])
def test_optimized_banded_is_a_local_minimum_of_the_unamplified_rmse_below_the_square_root(bands):
    bins, epochs = 6, 4
    params = optimize_banded(bands, bins, epochs)
    values = coefficients("banded", params, bins * epochs)
    assert (
        len(params["coefficients"]) == min(bands, bins * epochs)
        and values[0] == 1
        and np.all(values >= 0)
    )
    best = _dense_unamplified_factor(values, bins, epochs)
    square_root = _dense_unamplified_factor(
        coefficients("banded", banded_params(bands), bins * epochs), bins, epochs
    )
    assert best < square_root
    rng = np.random.default_rng(bands)
    for _ in range(20):
        nudged = values.copy()
        nudged[1 : len(params["coefficients"])] += 1e-3 * rng.standard_normal(
            len(params["coefficients"]) - 1
        )
        if np.all(nudged >= 0):
            assert _dense_unamplified_factor(nudged, bins, epochs) >= best - 1e-9


def test_unamplified_blt_is_a_local_minimum_below_its_start_above_the_best_banded_at_period_bins():
    """The BLT optimized without amplification beats the fit it starts from and no nudge of its
    parameters improves it (dense objective); at bands = bins the optimized banded C, whose columns
    of the same slot never overlap, still beats it: the geometric tail's cost."""
    bins, epochs, buffers = 8, 6, 2
    n = bins * epochs
    params = optimize_blt_unamplified(buffers, bins, epochs, init_bands=bins)
    decays, scales = np.array(params["buffer_decays"]), np.array(params["output_scales"])
    best = _dense_unamplified_factor(blt_coefficients(decays, scales, n), bins, epochs)
    start_decays, start_scales = blt_fit(coefficients("banded", banded_params(bins), n), buffers)
    start = blt_coefficients(start_decays, np.maximum(start_scales, 1e-2), n)
    assert best < _dense_unamplified_factor(start, bins, epochs)
    rng = np.random.default_rng(0)
    for _ in range(20):
        nudged_decays = np.clip(decays + 1e-4 * rng.standard_normal(buffers), 1e-6, 1 - 1e-6)
        nudged_scales = np.maximum(scales + 1e-4 * rng.standard_normal(buffers), 0)
        assert (
            _dense_unamplified_factor(
                blt_coefficients(nudged_decays, nudged_scales, n), bins, epochs
            )
            >= best - 1e-9
        )
    banded = coefficients("banded", optimize_banded(bins, bins, epochs), n)
    assert _dense_unamplified_factor(banded, bins, epochs) < best
    with pytest.raises(ParamsError, match="buffers = 0"):
        optimize_blt_unamplified(0, bins, epochs, init_bands=bins)


def test_optimize_banded_refuses_zero_bands_naming_the_parameter():
    with pytest.raises(ParamsError, match="bands = 0"):
        optimize_banded(0, 6, 4)

"""Prefix-sum error of the matrix mechanism, the utility figure C is chosen for (004 §3.7 of the
digest).

DP-FTRL's prefix sums carry the error A C⁻¹ z (A the all-ones lower-triangular n × n matrix, z ~
N(0, σ²)). We report the root mean squared error per prefix sum and model coordinate, clip norm 1:

    RMSE(C, σ) = σ · ‖A C⁻¹‖_F / √n

(the paper prints ‖A⁻¹C‖, a typo, and does not divide by √n; its results are ratios at fixed n,
where the factor cancels). For Toeplitz C, A C⁻¹ is Toeplitz with coefficients e = cumsum(C⁻¹'s), so
‖A C⁻¹‖_F² = Σ_k (n − k) e_k².
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dpledger.mechanisms.matrices import inverse_coefficients


def prefix_error_norm(values: np.ndarray) -> float:
    """‖A C⁻¹‖_F / √n for the n × n Toeplitz C with coefficients ``values`` (length n)."""
    n = values.size
    error = np.cumsum(inverse_coefficients(values))
    return math.sqrt(float(np.sum((n - np.arange(n)) * error**2)) / n)


def prefix_rmse(values: np.ndarray, noise_multiplier: float) -> float:
    """RMSE(C, σ) = σ ‖A C⁻¹‖_F / √n."""
    return noise_multiplier * prefix_error_norm(values)


def _convolve(first: torch.Tensor, second: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` coefficients of the product of two power series (FFT,
    differentiable)."""
    size = 1 << max(1, (first.shape[0] + second.shape[0] - 1).bit_length())
    product = torch.fft.irfft(torch.fft.rfft(first, size) * torch.fft.rfft(second, size), size)
    return product[:length]


def series_inverse_torch(values: torch.Tensor) -> torch.Tensor:
    """Coefficients of C⁻¹ (the power-series inverse of c) by Newton iteration d ← d(2 − cd),
    doubling the number of correct coefficients each round: O(n log n) and differentiable."""
    n = values.shape[0]
    inverse = (1.0 / values[:1]).clone()
    known = 1
    while known < n:
        known = min(2 * known, n)
        residual = -_convolve(values[:known], inverse, known)
        residual = residual + torch.nn.functional.pad(
            torch.full((1,), 2.0, dtype=values.dtype), (0, known - 1)
        )
        inverse = _convolve(inverse, residual, known)
    return inverse


def prefix_error_norm_torch(values: torch.Tensor) -> torch.Tensor:
    """Differentiable ‖A C⁻¹‖_F / √n for the Toeplitz C with coefficients ``values``."""
    n = values.shape[0]
    error = torch.cumsum(series_inverse_torch(values), dim=0)
    weights = (n - torch.arange(n)).to(values.dtype)
    return torch.sqrt(torch.sum(weights * error**2) / n)

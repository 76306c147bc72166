"""Correlation matrices of the matrix mechanism, their prefix-sum error, and the streaming noise
training adds."""

from dpledger.mechanisms.matrices import (
    MECHANISMS,
    banded_params,
    banded_sqrt_coefficients,
    blt_coefficients,
    coefficients,
    dense_matrix,
    inverse_coefficients,
)
from dpledger.mechanisms.noise import noise_stream

__all__ = [
    "MECHANISMS",
    "banded_params",
    "banded_sqrt_coefficients",
    "blt_coefficients",
    "coefficients",
    "dense_matrix",
    "inverse_coefficients",
    "noise_stream",
]

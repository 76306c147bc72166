"""Correlation matrices C of the matrix mechanism (DP-FTRL releases x + C⁻¹z), all lower-triangular
Toeplitz.

A mechanism is a name plus JSON-able ``mechanism_params``; every one here is Toeplitz, C[i, j] = c[i
- j] for i >= j, so it is described by its coefficients c (004 §4.2):

- ``identity``: c = [1] (DP-SGD, independent noise);
- ``banded``: ``{"coefficients": [c_0, ..., c_{w-1}]}``, w bands;
- ``toeplitz``: ``{"coefficients": [c_0, ...]}`` (missing trailing coefficients are 0);
- ``blt`` (buffered linear Toeplitz, Dvijotham et al. 2024): ``{"buffer_decays": θ, "output_scales":
  ω}``, c_0 = 1 and c_k = Σ_r ω_r θ_r^(k-1) for k >= 1; C⁻¹z streams with one buffer per θ_r.

The Monte Carlo accountant needs C >= 0 entrywise (004 Lemma 3.2; Appendix A shows a counterexample
otherwise), so :func:`coefficients` refuses negative or non-finite coefficients and c_0 <= 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpledger import validation
from dpledger.errors import ParamsError, UnsupportedMechanismError

MECHANISMS = ("identity", "banded", "toeplitz", "blt")


def blt_coefficients(
    buffer_decays: np.ndarray, output_scales: np.ndarray, num_steps: int
) -> np.ndarray:
    """Toeplitz coefficients c_0..c_{n-1} of a BLT: c_0 = 1, c_k = Σ_r ω_r θ_r^(k-1)."""
    decays = np.asarray(buffer_decays, dtype=np.float64)
    scales = np.asarray(output_scales, dtype=np.float64)
    powers = decays[None, :] ** np.arange(max(num_steps - 1, 0))[:, None]
    return np.concatenate([[1.0], powers @ scales])[:num_steps]


def banded_sqrt_coefficients(bands: int) -> np.ndarray:
    """The w-banded truncation of the square root of the prefix-sum matrix: c_k = binom(2k, k) /
    4^k.

    A non-negative, non-increasing C that interpolates between DP-SGD (w = 1) and the full
    square-root factorization (w = n); the banded baseline of 004 §5.1 (its coefficients are not
    optimized here).
    """
    ks = np.arange(bands)
    ratios = np.concatenate([[1.0], (2 * ks[1:] - 1) / (2 * ks[1:])])
    return np.cumprod(ratios)


def banded_params(bands: int) -> dict[str, Any]:
    """mechanism_params of the w-banded square-root matrix."""
    return {"coefficients": banded_sqrt_coefficients(bands).tolist()}


def coefficients(mechanism: str, mechanism_params: dict[str, Any], num_steps: int) -> np.ndarray:
    """The first ``num_steps`` Toeplitz coefficients of C (zero-padded), validated non-negative."""
    validation.at_least("num_steps", num_steps, 1)
    if mechanism == "identity":
        raw = np.ones(1)
    elif mechanism in ("banded", "toeplitz"):
        raw = np.asarray(
            _require(mechanism, mechanism_params, "coefficients"), dtype=np.float64
        ).ravel()
    elif mechanism == "blt":
        decays = np.asarray(
            _require(mechanism, mechanism_params, "buffer_decays"), dtype=np.float64
        ).ravel()
        scales = np.asarray(
            _require(mechanism, mechanism_params, "output_scales"), dtype=np.float64
        ).ravel()
        if decays.shape != scales.shape:
            raise ParamsError(
                f"mechanism_params of blt: buffer_decays ({decays.size}) and output_scales "
                f"({scales.size}) "
                f"must have the same length"
            )
        if decays.size and (np.any(decays < 0) or np.any(decays >= 1)):
            raise ParamsError(
                f"mechanism_params of blt: buffer_decays = {decays.tolist()} must lie in [0, 1)"
            )
        raw = blt_coefficients(decays, scales, num_steps)
    else:
        validation.one_of("mechanism", mechanism, MECHANISMS)
    check_coefficients(raw, mechanism)
    out = np.zeros(num_steps)
    out[: min(num_steps, raw.size)] = raw[:num_steps]
    return out


def check_coefficients(values: np.ndarray, mechanism: str) -> None:
    """Refuse a Toeplitz C the accountants cannot handle: c_0 <= 0, a negative or non-finite
    entry."""
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ParamsError(
            f"mechanism_params of {mechanism}: coefficients must be finite and non-empty"
        )
    if values[0] <= 0:
        raise ParamsError(
            f"mechanism_params of {mechanism}: c_0 = {values[0]} must be positive (C invertible)"
        )
    if np.any(values < 0):
        raise UnsupportedMechanismError(
            f"mechanism {mechanism} has a negative coefficient ({values.min():.3g}): "
            "the balls-in-bins accountant needs C >= 0 entrywise (004 Lemma 3.2; "
            "Appendix A shows the worst case can differ otherwise); use non-negative coefficients"
        )


def dense_matrix(values: np.ndarray, num_steps: int | None = None) -> np.ndarray:
    """The n x n lower-triangular Toeplitz matrix with first column ``values`` (padded/truncated to
    n)."""
    n = values.size if num_steps is None else num_steps
    col = np.zeros(n)
    col[: min(n, values.size)] = values[:n]
    lag = np.arange(n)[:, None] - np.arange(n)[None, :]
    return np.where(lag >= 0, col[np.clip(lag, 0, None)], 0.0)


def inverse_coefficients(values: np.ndarray) -> np.ndarray:
    """Coefficients of C⁻¹ (again lower-triangular Toeplitz): the power-series inverse of c, by
    recursion."""
    n = values.size
    inverse = np.zeros(n)
    inverse[0] = 1.0 / values[0]
    for k in range(1, n):
        inverse[k] = -np.dot(values[1 : k + 1], inverse[k - 1 :: -1][:k]) / values[0]
    return inverse


def support_length(values: np.ndarray) -> int:
    """Number of leading coefficients up to the last non-zero one (the bands of C)."""
    nonzero = np.flatnonzero(values)
    return int(nonzero[-1]) + 1 if nonzero.size else 1


def _require(mechanism: str, params: dict[str, Any], key: str) -> Any:
    if key not in params:
        raise ParamsError(f"mechanism_params of {mechanism}: key {key!r} is missing")
    return params[key]

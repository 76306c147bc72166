"""000 App. B: choosing C and σ for the noise test from one-step loss changes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpledger.verify.stats import FLAT_RELATIVE_TOLERANCE


@dataclass(frozen=True)
class Heuristics:
    """C* (ΔL stops changing above it) and σ* (ΔL starts to change above it)."""

    c_star: float
    sigma_star: float | None
    sigma_grid: tuple[float, ...]
    sigma_loss_changes: tuple[float, ...]
    sigma_zero_loss_change: float
    steps: int
    """Training steps the σ sweep used (C* reuses T1's runs at no extra cost)."""


def plateau_start(values: np.ndarray, relative_tolerance: float = FLAT_RELATIVE_TOLERANCE) -> int:
    """Smallest index k such that every value from k on equals the last one (up to rounding): App. B
    step 3."""
    values = np.asarray(values, dtype=np.float64)
    tolerance = relative_tolerance * max(float(np.max(np.abs(values))), 1e-300)
    start = len(values) - 1
    while start > 0 and abs(values[start - 1] - values[-1]) <= tolerance:
        start -= 1
    return start


def noise_onset(
    sigmas: tuple[float, ...],
    values: np.ndarray,
    noiseless: float,
    scale: float | None = None,
    relative_tolerance: float = FLAT_RELATIVE_TOLERANCE,
) -> float | None:
    """Smallest σ_i such that the value differs from the σ = 0 one for it and every larger σ (App.
    B, σ step 3).

    A difference counts when it exceeds ``relative_tolerance`` × ``scale`` (default: |noiseless|).
    """
    tolerance = relative_tolerance * (abs(noiseless) if scale is None else scale)
    visible = np.abs(np.asarray(values, dtype=np.float64) - noiseless) > tolerance
    if not visible[-1]:
        return None
    onset = len(sigmas) - 1
    while onset > 0 and visible[onset - 1]:
        onset -= 1
    return float(sigmas[onset])

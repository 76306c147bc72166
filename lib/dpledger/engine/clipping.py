"""Per-example clipping factors C_i = C(‖g_i‖; R) (003 Eq. 1) for the three clipping styles.

- ``flat``: one norm over all layers, Abadi's C_i = min(1, R/‖g_i‖) (the default; the verify tests
  of 000 expect it: an example with ‖g_i‖ ≤ R is left untouched).
- ``per-layer``: each layer clipped separately to R/√L (L layers), so the whole per-example gradient
  still has norm ≤ R and the noise σ·R keeps its meaning.
- ``automatic``: C_i = R/(‖g_i‖ + γ) (Bu et al.'s normalisation; every example is rescaled, ‖C_i
  g_i‖ < R).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from dpledger.errors import ParamsError

ClippingMode = Literal["flat", "per-layer", "automatic"]
CLIPPING_MODES: tuple[str, ...] = ("flat", "per-layer", "automatic")


def check_clipping(mode: str, clip_norm: float, gamma: float) -> None:
    """Refuse an unknown mode or a non-positive threshold or γ, with one line."""
    if mode not in CLIPPING_MODES:
        raise ParamsError(
            f"params: train.clipping = {mode!r} is invalid: "
            f"allowed values are {', '.join(CLIPPING_MODES)}"
        )
    if not clip_norm > 0 or not math.isfinite(clip_norm):
        raise ParamsError(
            f"params: train.clip_norm = {clip_norm!r} is invalid: it must be a finite number > 0"
        )
    if not gamma > 0:
        raise ParamsError(f"params: train.automatic_gamma = {gamma!r} is invalid: it must be > 0")


def group_threshold(mode: str, clip_norm: float, groups: int) -> float:
    """The threshold each clipping group gets: R for flat/automatic (one group), R/√L per layer."""
    return clip_norm / math.sqrt(groups) if mode == "per-layer" else clip_norm


def clip_factors(norm_sq: Tensor, threshold: float, mode: str, gamma: float = 0.01) -> Tensor:
    """Factors C_i from squared per-example norms; an all-zero gradient gets factor 1 (it stays
    zero).

    A norm that is not finite (NaN or inf: a non-finite input or loss) gets factor 0: min(1, R/‖g‖)
    would be NaN or 1·inf there, i.e. not bounded by R. The caller must also zero that example's
    rows (0·NaN = NaN).
    """
    norm = norm_sq.clamp_min(0).sqrt()
    if mode == "automatic":
        factors = threshold / (norm + gamma)
    else:
        factors = (threshold / norm.clamp_min(torch.finfo(norm.dtype).tiny)).masked_fill(
            norm <= threshold, 1.0
        )
    return factors.masked_fill(nonfinite_rows(norm), 0.0)


def nonfinite_rows(norm_sq: Tensor) -> Tensor:
    """Boolean mask of the examples whose squared norm is NaN or inf (they are dropped: factor 0,
    rows zeroed).

    x − x is exactly 0 for every finite x and NaN for ±inf and NaN: two launches, where
    ``~isfinite`` takes five."""
    return (norm_sq - norm_sq) != 0

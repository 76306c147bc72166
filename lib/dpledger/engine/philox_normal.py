"""Fast N(0, 1) noise for CPU float32 parameters: Philox4x32-10 bits and a vectorized Box–Muller.

torch's CPU ``normal_`` draws its uniforms from a serial Mersenne Twister: about 3.4 ns a draw, a
quarter of a non-private step of a 4M-parameter MLP. Here the bits come from Philox4x32-10 (Salmon et
al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the generator of JAX and of torch's CUDA
RNG), a counter-based generator that vectorizes, and each pair of words (u, v) becomes two normals by
the Box–Muller transform ρ·(cos θ, sin θ), ρ = √(-2 ln U), θ = 2πV, computed in float64 with
polynomial log/sin/cos (accurate to about 1e-14, so the float32 draws are correctly rounded up to one
unit) that the compiler vectorizes. Compiled by numba, without the GIL, on disjoint block ranges in
the caller's threads.

Layout (a pure function of key, step and position, so the noise does not depend on threads or
chunking): the draws come in blocks of ``4·LANES``; block b, lane l takes Philox's four words
(w0, w1, w2, w3) of counter (b·LANES + l, 0, step mod 2³², step ÷ 2³²) under the 64-bit key, and
draws t·m + l of the block (m = lanes in the block) are ρ(w0)cos θ(w1), ρ(w0)sin θ(w1),
ρ(w2)cos θ(w3), ρ(w2)sin θ(w3), with U = (w + ½)/2³² and V = (w + ½)/2³². Where w0 (or w2) is 0,
U is refined to (w' + ½)/2⁶⁴ with w' word 0 (or 2) of counter (b·LANES + l, 1, step mod 2³²,
step ÷ 2³²), so the radius reaches √(2·65·ln 2) ≈ 9.5σ: the truncated tail has mass below 1e-19
a draw (torch's 24-bit uniforms stop at 5.9σ, mass 4e-9).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

LANES = 1024
"""Counters per block (a block is 4·LANES draws); fixed, since it is part of the layout."""

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


@njit(inline="always")
def _round(c0, c1, c2, c3, k0, k1):
    """One Philox4x32 round (two 32×32→64 multiplications, the key xored in)."""
    p0 = np.uint64(c0) * _M0
    p1 = np.uint64(c2) * _M1
    return (np.uint32((p1 >> _SHIFT) ^ np.uint64(c1) ^ np.uint64(k0)), np.uint32(p1 & _LOW),
            np.uint32((p0 >> _SHIFT) ^ np.uint64(c3) ^ np.uint64(k1)), np.uint32(p0 & _LOW))


@njit(cache=True)
def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of one counter (c0..c3) under key (k0, k1): four uint32 words."""
    c0, c1, c2, c3 = np.uint32(c0), np.uint32(c1), np.uint32(c2), np.uint32(c3)
    k0, k1 = np.uint32(k0), np.uint32(k1)
    for _ in range(10):
        c0, c1, c2, c3 = _round(c0, c1, c2, c3, k0, k1)
        k0, k1 = np.uint32(k0 + _W0), np.uint32(k1 + _W1)
    return c0, c1, c2, c3


@intrinsic
def _as_int64(typingctx, value):
    """The bits of a float64 as an int64 (an LLVM bitcast, which vectorizes)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))
    return types.int64(types.float64), codegen


@intrinsic
def _as_float64(typingctx, value):
    """The float64 whose bits are an int64."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))
    return types.float64(types.int64), codegen


_LN2 = math.log(2.0)
_SQRT2 = math.sqrt(2.0)
_MANTISSA = (1 << 52) - 1
_ONE_BITS = 1023 << 52


@njit(inline="always", fastmath=True, error_model="numpy")
def _log(u):
    """ln u for normal positive float64 u: u = 2^e·m, m in [√½, √2), ln m = 2 atanh((m-1)/(m+1))."""
    bits = _as_int64(u)
    e = (bits >> 52) - 1023
    m = _as_float64((bits & _MANTISSA) | _ONE_BITS)
    big = m > _SQRT2
    m = m * 0.5 if big else m
    e = e + 1 if big else e
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    series = 1.0 + z * (1 / 3 + z * (1 / 5 + z * (1 / 7 + z * (1 / 9 + z * (1 / 11 + z * (1 / 13 + z * (
        1 / 15 + z * (1 / 17 + z * (1 / 19)))))))))
    return e * _LN2 + 2.0 * s * series


_SIN = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(8))
_COS = tuple((-1) ** k / math.factorial(2 * k) for k in range(9))


@njit(inline="always", fastmath=True, error_model="numpy")
def _sin_cos_turn(v):
    """(sin 2πv, cos 2πv) for v in [0, 1): quarter-turn reduction, then Taylor series on |r| ≤ π/4
    (truncation error below 2e-16)."""
    quarters = v * 4.0
    q = math.floor(quarters + 0.5)
    r = (quarters - q) * (math.pi / 2)
    z = r * r
    sin_r = r * (_SIN[0] + z * (_SIN[1] + z * (_SIN[2] + z * (_SIN[3] + z * (_SIN[4] + z * (
        _SIN[5] + z * (_SIN[6] + z * _SIN[7])))))))
    cos_r = _COS[0] + z * (_COS[1] + z * (_COS[2] + z * (_COS[3] + z * (_COS[4] + z * (_COS[5] + z * (
        _COS[6] + z * (_COS[7] + z * _COS[8])))))))
    quadrant = q - 4.0 * math.floor(q * 0.25)
    odd = (quadrant == 1.0) | (quadrant == 3.0)
    sin_v = (cos_r if odd else sin_r) * (-1.0 if quadrant >= 2.0 else 1.0)
    cos_v = (sin_r if odd else cos_r) * (-1.0 if (quadrant == 1.0) | (quadrant == 2.0) else 1.0)
    return sin_v, cos_v


@njit(inline="always")
def _philox_lanes(c0, c1, c2, c3, lanes, k0, k1):
    """Philox4x32-10 in place on ``lanes`` counters held as four word arrays (vectorized)."""
    a0, a1 = np.uint32(k0), np.uint32(k1)
    for _ in range(10):
        for lane in range(lanes):
            p0 = np.uint64(c0[lane]) * _M0
            p1 = np.uint64(c2[lane]) * _M1
            c0[lane] = np.uint32(p1 >> _SHIFT) ^ c1[lane] ^ a0
            c2[lane] = np.uint32(p0 >> _SHIFT) ^ c3[lane] ^ a1
            c1[lane] = np.uint32(p1 & _LOW)
            c3[lane] = np.uint32(p0 & _LOW)
        a0, a1 = np.uint32(a0 + _W0), np.uint32(a1 + _W1)


@njit(inline="always", fastmath=True, error_model="numpy")
def _box_muller(radius_words, radius_refined, angle_words, lanes, offset, values, scale):
    """scale·ρ·cos θ into values[offset + l] and scale·ρ·sin θ into values[offset + lanes + l]."""
    for lane in range(lanes):
        u = (np.float64(radius_words[lane]) + 0.5) * 2.0**-32
        u = u if radius_words[lane] != 0 else (np.float64(radius_refined[lane]) + 0.5) * 2.0**-64
        radius = math.sqrt(-2.0 * _log(u)) * scale
        sin_v, cos_v = _sin_cos_turn((np.float64(angle_words[lane]) + 0.5) * 2.0**-32)
        values[offset + lane] = np.float32(radius * cos_v)
        values[offset + lanes + lane] = np.float32(radius * sin_v)


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def _fill_blocks(out, first_block, last_block, step_lo, step_hi, scale, k0, k1):
    """Blocks [first_block, last_block) of the layout in the module docstring, scaled, into ``out``."""
    n = out.shape[0]
    c0, c1, c2, c3 = (np.empty(LANES, np.uint32), np.empty(LANES, np.uint32), np.empty(LANES, np.uint32),
                      np.empty(LANES, np.uint32))
    r0, r1, r2, r3 = (np.zeros(LANES, np.uint32), np.zeros(LANES, np.uint32), np.zeros(LANES, np.uint32),
                      np.zeros(LANES, np.uint32))
    values = np.empty(4 * LANES, np.float32)
    for block in range(first_block, last_block):
        start = block * 4 * LANES
        lanes = min(LANES, (n - start + 3) // 4)
        for lane in range(lanes):
            c0[lane] = np.uint32(block * LANES + lane)
            c1[lane] = np.uint32(0)
            c2[lane] = step_lo
            c3[lane] = step_hi
        _philox_lanes(c0, c1, c2, c3, lanes, k0, k1)
        zeros = 0
        for lane in range(lanes):
            zeros += (c0[lane] == 0) + (c2[lane] == 0)
        if zeros:  # probability about 2⁻²¹ a block: refine those radii from the block's second counters
            for lane in range(lanes):
                r0[lane], r1[lane] = np.uint32(block * LANES + lane), np.uint32(1)
                r2[lane], r3[lane] = step_lo, step_hi
            _philox_lanes(r0, r1, r2, r3, lanes, k0, k1)
        _box_muller(c0, r0, c1, lanes, 0, values, scale)
        _box_muller(c2, r2, c3, lanes, 2 * lanes, values, scale)
        count = min(4 * lanes, n - start)
        out[start:start + count] = values[:count]


def blocks(numel: int) -> int:
    """Number of blocks of ``4·LANES`` draws that cover ``numel`` draws."""
    return -(-numel // (4 * LANES))


def fill_standard_normal(out: np.ndarray, key: tuple[int, int], step: int, scale: float = 1.0,
                         block_range: tuple[int, int] | None = None) -> None:
    """Overwrite float32 ``out`` (1-D, contiguous) with scale·N(0, 1) draws of (key, step).

    ``block_range`` = (first, last) fills only those blocks, so threads can share one vector."""
    if out.dtype != np.float32 or out.ndim != 1 or not out.flags.c_contiguous:
        raise ValueError("fill_standard_normal needs a contiguous 1-D float32 array")
    if not 0 <= step < 2**64:
        raise ValueError(f"step = {step} is out of range [0, 2**64)")
    if out.shape[0] >= 2**32:
        raise ValueError(f"{out.shape[0]} draws are too many: positions must fit in 32 bits")
    first, last = block_range if block_range is not None else (0, blocks(out.shape[0]))
    _fill_blocks(out, first, last, np.uint32(step & 0xFFFFFFFF), np.uint32(step >> 32), float(scale),
                 np.uint32(key[0]), np.uint32(key[1]))

"""Fast N(0, 1) noise for CPU float32 parameters: Philox4x32-10 bits and a vectorized Box–Muller.

torch's CPU ``normal_`` draws its uniforms from a serial Mersenne Twister: about 3.4 ns a draw, a
quarter of a non-private step of a 4M-parameter MLP. Here the bits come from Philox4x32-10 (Salmon
et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the generator of JAX and of torch's
CUDA RNG), a counter-based generator whose ten rounds run in registers, and each pair of words (u,
v) becomes two normals by the Box–Muller transform ρ·(cos θ, sin θ), ρ = √(-2 ln U), θ = 2πV. The
transform runs in float32 with integer argument reduction (exact) and short polynomials, so a draw
is within 4·2⁻²⁴·ρ of the exact value of its words (about 2 units in the last place of a float32).
One fused loop per block draws the words and transforms them, 16 lanes at a time; numba compiles it,
and it runs without the GIL on disjoint block ranges, in numba's thread pool or the caller's threads
(about 1.1 ns a draw on one core, a third of torch's).

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
import os

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

LANES = 1024
"""Counters per block (a block is 4·LANES draws); fixed, since it is part of the layout."""

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
_ZERO = np.uint32(0)


@njit(inline="always")
def _round(c0, c1, c2, c3, k0, k1):
    """One Philox4x32 round (two 32×32→64 multiplications, the key xored in)."""
    p0 = np.uint64(c0) * _M0
    p1 = np.uint64(c2) * _M1
    return (
        np.uint32((p1 >> _SHIFT) ^ np.uint64(c1) ^ np.uint64(k0)),
        np.uint32(p1 & _LOW),
        np.uint32((p0 >> _SHIFT) ^ np.uint64(c3) ^ np.uint64(k1)),
        np.uint32(p0 & _LOW),
    )


@njit(inline="always")
def _key_schedule(k0, k1):
    """The round keys of key (k0, k1): Weyl increments, one pair per round."""
    keys0, keys1 = np.empty(10, np.uint32), np.empty(10, np.uint32)
    a0, a1 = np.uint32(k0), np.uint32(k1)
    for r in range(10):
        keys0[r], keys1[r] = a0, a1
        a0, a1 = np.uint32(a0 + _W0), np.uint32(a1 + _W1)
    return keys0, keys1


@njit(inline="always")
def _philox10(c0, c1, c2, c3, keys0, keys1):
    """Philox4x32-10 of one counter under a key schedule, written out so that a loop over counters
    vectorizes (a loop over rounds inside it does not)."""
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, keys0[0], keys1[0])
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, keys0[1], keys1[1])
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, keys0[2], keys1[2])
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, keys0[3], keys1[3])
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, keys0[4], keys1[4])
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, keys0[5], keys1[5])
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, keys0[6], keys1[6])
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, keys0[7], keys1[7])
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, keys0[8], keys1[8])
    return _round(c0, c1, c2, c3, keys0[9], keys1[9])


@njit(cache=True)
def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of one counter (c0..c3) under key (k0, k1): four uint32 words."""
    keys0, keys1 = _key_schedule(np.uint32(k0), np.uint32(k1))
    return _philox10(np.uint32(c0), np.uint32(c1), np.uint32(c2), np.uint32(c3), keys0, keys1)


@intrinsic
def _as_int32(typingctx, value):
    """The bits of a float32 as an int32 (an LLVM bitcast, which vectorizes)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int32))

    return types.int32(types.float32), codegen


@intrinsic
def _as_float32(typingctx, value):
    """The float32 whose bits are an int32."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return types.float32(types.int32), codegen


_F32 = np.float32
_LN2 = _F32(math.log(2.0))
_SQRT2 = _F32(math.sqrt(2.0))
_ATANH = tuple(_F32(1 / (2 * k + 1)) for k in range(8))  # 2 atanh s = 2s·Σ s^2k/(2k+1)
_SIN = tuple(_F32((-1) ** k / math.factorial(2 * k + 1)) for k in range(5))
_COS = tuple(_F32((-1) ** k / math.factorial(2 * k)) for k in range(6))
_NEAR_ONE = np.uint32(1 << 31)
_QUARTER = np.uint32(1 << 30)
_EIGHTH = np.uint32(1 << 29)
_ALL_ONES = np.uint32(0xFFFFFFFF)


@njit(inline="always", fastmath=True, error_model="numpy")
def _minus_two_log(word, refined):
    """-2 ln U in float32, U = (word + ½)/2³² (or (refined + ½)/2⁶⁴ when word is 0), to 2⁻²²
    relative.

    ln U = e·ln 2 + ln(1 + f) with ln(1 + f) = 2 atanh(f/(2 + f)). For U ≥ ½, e = 0 and
    f = -(2³² - word - ½)/2³² straight from the integer, so small radii keep their relative
    precision; below, U = 2^e·(1 + f), |f| ≤ √2 - 1, from the float32 bits of U, and e ≤ -1 leaves
    no cancellation."""
    far = (_F32(word if word != 0 else refined) + _F32(0.5)) * (
        _F32(2.0**-32) if word != 0 else _F32(2.0**-64)
    )
    bits = _as_int32(far)
    exponent = (bits >> 23) - 127
    mantissa = _as_float32((bits & 0x7FFFFF) | 0x3F800000)
    big = mantissa > _SQRT2
    mantissa = mantissa * _F32(0.5) if big else mantissa
    exponent = exponent + 1 if big else exponent
    near = word >= _NEAR_ONE
    f = -(_F32(_ALL_ONES - word) + _F32(0.5)) * _F32(2.0**-32) if near else mantissa - _F32(1.0)
    exponent = 0 if near else exponent
    s = f / (_F32(2.0) + f)
    z = s * s
    series = _ATANH[0] + z * (
        _ATANH[1]
        + z
        * (
            _ATANH[2]
            + z * (_ATANH[3] + z * (_ATANH[4] + z * (_ATANH[5] + z * (_ATANH[6] + z * _ATANH[7]))))
        )
    )
    return _F32(-2.0) * (_F32(exponent) * _LN2 + _F32(2.0) * s * series)


@njit(inline="always", fastmath=True, error_model="numpy")
def _sin_cos_turn(word):
    """(sin 2πV, cos 2πV) in float32 for V = (word + ½)/2³²: the nearest quarter turn q and the
    offset from it come exactly from the integer, then Taylor series on |r| ≤ π/4 (truncation below
    2⁻²⁸)."""
    q = ((word + _EIGHTH) >> 30) & np.uint32(3)
    offset = np.int32(word - q * _QUARTER)  # in [-2²⁹, 2²⁹)
    r = (_F32(offset) + _F32(0.5)) * _F32(math.pi / 2 * 2.0**-30)
    z = r * r
    sin_r = r * (_SIN[0] + z * (_SIN[1] + z * (_SIN[2] + z * (_SIN[3] + z * _SIN[4]))))
    cos_r = _COS[0] + z * (_COS[1] + z * (_COS[2] + z * (_COS[3] + z * (_COS[4] + z * _COS[5]))))
    odd = (q & np.uint32(1)) == np.uint32(1)
    sin_v = (cos_r if odd else sin_r) * (_F32(-1.0) if q >= np.uint32(2) else _F32(1.0))
    cos_v = (sin_r if odd else cos_r) * (
        _F32(-1.0) if (q == np.uint32(1)) | (q == np.uint32(2)) else _F32(1.0)
    )
    return sin_v, cos_v


@njit(inline="always", fastmath=True, error_model="numpy")
def _normal_pair(radius_word, refined, angle_word, scale):
    """scale·ρ·(cos θ, sin θ) of one word pair (``refined`` is used only where ``radius_word`` is
    0)."""
    radius = math.sqrt(_minus_two_log(radius_word, refined)) * scale
    sin_v, cos_v = _sin_cos_turn(angle_word)
    return radius * cos_v, radius * sin_v


@njit(inline="always", fastmath=True, error_model="numpy")
def _draw_block(target, counter, lanes, step_lo, step_hi, keys0, keys1, scale):
    """One block's draws into target[:4·lanes], assuming no radius word is 0; returns how many
    were."""
    zeros = 0
    for lane in range(lanes):
        w0, w1, w2, w3 = _philox10(np.uint32(counter + lane), _ZERO, step_lo, step_hi, keys0, keys1)
        zeros += (w0 == 0) + (w2 == 0)
        target[lane], target[lanes + lane] = _normal_pair(w0, _ZERO, w1, scale)
        target[2 * lanes + lane], target[3 * lanes + lane] = _normal_pair(w2, _ZERO, w3, scale)
    return zeros


@njit(inline="always", fastmath=True, error_model="numpy")
def _refine_block(target, counter, lanes, step_lo, step_hi, keys0, keys1, scale):
    """Redraw the pairs of a block whose radius word is 0, with U refined from the second
    counter."""
    for lane in range(lanes):
        w0, w1, w2, w3 = _philox10(np.uint32(counter + lane), _ZERO, step_lo, step_hi, keys0, keys1)
        if w0 == 0 or w2 == 0:
            r0, _, r2, _ = _philox10(
                np.uint32(counter + lane), np.uint32(1), step_lo, step_hi, keys0, keys1
            )
            target[lane], target[lanes + lane] = _normal_pair(w0, r0, w1, scale)
            target[2 * lanes + lane], target[3 * lanes + lane] = _normal_pair(w2, r2, w3, scale)


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def _fill_blocks(out, first_block, last_block, step_lo, step_hi, scale, k0, k1):
    """Blocks [first_block, last_block) of the layout in the module docstring, scaled, into
    ``out``."""
    n = out.shape[0]
    keys0, keys1 = _key_schedule(k0, k1)
    scale32 = np.float32(scale)
    spare = np.empty(4 * LANES, np.float32)  # for a last block shorter than 4·lanes
    for block in range(first_block, last_block):
        start = block * 4 * LANES
        lanes = min(LANES, (n - start + 3) // 4)
        whole = n - start >= 4 * lanes
        target = out[start : start + 4 * lanes] if whole else spare
        if _draw_block(target, block * LANES, lanes, step_lo, step_hi, keys0, keys1, scale32):
            # p ≈ 2⁻²¹
            _refine_block(target, block * LANES, lanes, step_lo, step_hi, keys0, keys1, scale32)
        if not whole:
            out[start:n] = spare[: n - start]


@njit(cache=True, nogil=True, parallel=True)
def _fill_parts(out, first_block, last_block, parts, step_lo, step_hi, scale, k0, k1):
    """``_fill_blocks`` split into ``parts`` equal block ranges run by numba's thread pool."""
    count = last_block - first_block
    for part in prange(parts):
        _fill_blocks(
            out,
            first_block + count * part // parts,
            first_block + count * (part + 1) // parts,
            step_lo,
            step_hi,
            scale,
            k0,
            k1,
        )


def blocks(numel: int) -> int:
    """Number of blocks of ``4·LANES`` draws that cover ``numel`` draws."""
    return -(-numel // (4 * LANES))


def fill_standard_normal(
    out: np.ndarray,
    key: tuple[int, int],
    step: int,
    scale: float = 1.0,
    block_range: tuple[int, int] | None = None,
    threads: int = 1,
) -> None:
    """Overwrite float32 ``out`` (1-D, contiguous) with scale·N(0, 1) draws of (key, step).

    ``block_range`` = (first, last) fills only those blocks, so threads can share one vector;
    ``threads`` > 1 splits them over numba's thread pool (see ``pool_is_usable``). The values do not
    depend on either."""
    if out.dtype != np.float32 or out.ndim != 1 or not out.flags.c_contiguous:
        raise ValueError("fill_standard_normal needs a contiguous 1-D float32 array")
    if not 0 <= step < 2**64:
        raise ValueError(f"step = {step} is out of range [0, 2**64)")
    if out.shape[0] >= 2**32:
        raise ValueError(f"{out.shape[0]} draws are too many: positions must fit in 32 bits")
    if threads < 1:
        raise ValueError(f"threads = {threads} is invalid: it must be >= 1")
    first, last = block_range if block_range is not None else (0, blocks(out.shape[0]))
    args = (
        np.uint32(step & 0xFFFFFFFF),
        np.uint32(step >> 32),
        float(scale),
        np.uint32(key[0]),
        np.uint32(key[1]),
    )
    if threads == 1:
        _fill_blocks(out, first, last, *args)
    else:
        _fill_parts(out, first, last, min(threads, last - first), *args)


_forked = False
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=lambda: globals().update(_forked=True))
_layer: str | None = None


def fill_window(
    out: np.ndarray, origin: int, total: int, key: tuple[int, int], step: int, scale: float = 1.0
) -> None:
    """Overwrite float32 ``out`` with entries [origin, origin + len(out)) of the scale·N(0, 1)
    vector of ``total`` entries that :func:`fill_standard_normal` draws for (key, step): a slice
    drawn without the rest (a rank's shards of a sharded model's noise)."""
    if out.dtype != np.float32 or out.ndim != 1 or not out.flags.c_contiguous:
        raise ValueError("fill_window needs a contiguous 1-D float32 array")
    if not 0 <= origin <= origin + out.shape[0] <= total < 2**32:
        raise ValueError(f"window [{origin}, {origin + out.shape[0]}) is outside [0, {total})")
    keys = (np.uint32(key[0]), np.uint32(key[1]))
    _fill_window(
        out, origin, total, np.uint32(step & 0xFFFFFFFF), np.uint32(step >> 32), scale, *keys
    )


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def _fill_window(out, origin, total, step_lo, step_hi, scale, k0, k1):
    """:func:`fill_window`: every block that overlaps the window drawn into a spare block (a block's
    lanes depend on where the whole vector ends, as in ``_fill_blocks``), the overlap copied."""
    n = out.shape[0]
    keys0, keys1 = _key_schedule(k0, k1)
    scale32 = np.float32(scale)
    spare = np.empty(4 * LANES, np.float32)
    for block in range(origin // (4 * LANES), (origin + n + 4 * LANES - 1) // (4 * LANES)):
        start = block * 4 * LANES
        lanes = min(LANES, (total - start + 3) // 4)
        if _draw_block(spare, block * LANES, lanes, step_lo, step_hi, keys0, keys1, scale32):
            _refine_block(spare, block * LANES, lanes, step_lo, step_hi, keys0, keys1, scale32)
        lo = max(start, origin)
        hi = min(start + 4 * lanes, origin + n)
        out[lo - origin : hi - origin] = spare[lo - start : hi - start]


def pool_is_usable() -> bool:
    """Whether ``threads`` > 1 may use numba's pool here: only on its OpenMP or TBB layer
    (thread-safe; on Python threads or on numba's workqueue layer a 2-thread draw right after a
    torch op costs as much as one thread: benchmarks/RESULTS.md), and not in a forked child (GNU
    OpenMP aborts there). Otherwise the caller splits the blocks over its own threads."""
    global _layer
    if _forked:
        return False
    if _layer is None:
        _fill_parts(
            np.empty(8 * LANES, np.float32),
            0,
            2,
            2,
            np.uint32(0),
            np.uint32(0),
            1.0,
            np.uint32(0),
            np.uint32(0),
        )
        _layer = numba.threading_layer()
    return _layer in ("omp", "tbb")

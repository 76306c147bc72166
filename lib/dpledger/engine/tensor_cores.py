"""Matrix products of half-precision operands with float32 results, and the exact split that lets a
clipped sum of bfloat16 operands run on tensor cores with the clipping bound kept
(docs/precision.md, "Tensor cores").

A product of two bfloat16 (or float16) numbers is exact in float32, so a matrix product of half
operands accumulated in float32 makes the same kind of error as the float32 product of the promoted
operands: the Grams and clipped sums computed this way keep the argument of docs/precision.md.
CUDA's ``out_dtype`` kernels run them on tensor cores; on other devices the operands are
promoted (exactly) and multiplied in float32.

A clip factor cannot scale a bfloat16 operand without rounding it, and a rounded operand no longer
matches the norm the factor came from. :func:`scaled_parts` avoids the rounding: the factor is
lowered to 8 significant bits (:func:`truncated_to_bfloat16`), so factor × operand has at most 16
significant bits and is the exact sum of two bfloat16 tensors. The clipped contribution is then the
two products' sum, each exact term by term: example i contributes exactly C̃_i·g_i with C̃_i ≤ C_i,
where g_i is formed from the operands its norm was computed from.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

HALF = (torch.bfloat16, torch.float16)

TRUNCATION = 2.0**-7
"""The most a factor loses relative to itself in :func:`truncated_to_bfloat16` (8 significant
bits)."""


@functools.cache
def has_out_dtype(device_type: str) -> bool:
    """Whether ``torch.mm`` and ``torch.bmm`` take half operands with ``out_dtype=torch.float32``
    on this device type (CUDA builds that have the kernels; never the CPU). Probed once per
    process."""
    if device_type != "cuda":
        return False
    try:
        one = torch.ones(1, 1, 1, dtype=torch.bfloat16, device=device_type)
        torch.bmm(one, one, out_dtype=torch.float32)
        torch.mm(one[0], one[0], out_dtype=torch.float32)
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True


def promoted(tensor: Tensor) -> Tensor:
    """Half-precision tensors as float32 (exact); others unchanged."""
    return tensor.float() if tensor.dtype in HALF else tensor


def promoted_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype :func:`promoted` gives a tensor of ``dtype``."""
    return torch.float32 if dtype in HALF else dtype


def _on_tensor_cores(x: Tensor, y: Tensor) -> bool:
    return x.dtype in HALF and x.dtype == y.dtype and has_out_dtype(x.device.type)


def mm_float32(x: Tensor, y: Tensor) -> Tensor:
    """x @ y with float32 (or wider) results: half operands on tensor cores where the device has
    ``out_dtype`` kernels, promoted otherwise."""
    if _on_tensor_cores(x, y):
        return torch.mm(x, y, out_dtype=torch.float32)
    return torch.mm(promoted(x), promoted(y))


def bmm_float32(x: Tensor, y: Tensor) -> Tensor:
    """As :func:`mm_float32`, batched."""
    if _on_tensor_cores(x, y):
        return torch.bmm(x, y, out_dtype=torch.float32)
    return torch.bmm(promoted(x), promoted(y))


def truncated_to_bfloat16(values: Tensor) -> Tensor:
    """Non-negative ``values`` rounded toward zero to bfloat16's 8 significant bits, as float32
    (exactly representable in bfloat16): a clip factor lowered by less than :data:`TRUNCATION` of
    itself, never raised."""
    bits = values.float().contiguous().view(torch.int32) & -65536  # keep the top 16 bits
    return bits.view(torch.float32)


def scaled_parts(operand: Tensor, factors: Tensor) -> tuple[Tensor, Tensor]:
    """(hi, lo), bfloat16, with hi + lo = C̃_i · operand_i exactly for the bfloat16 ``operand`` (B,
    ...) and C̃ = :func:`truncated_to_bfloat16` (``factors``).

    The product of two 8-bit significands has at most 16 bits, so it is exact in float32; hi is its
    nearest bfloat16 and lo = product − hi (exact in float32) spans the remaining at most 8 bits, so
    it is a bfloat16 too (outside bfloat16's subnormal range, below 1e-38)."""
    shape = (-1,) + (1,) * (operand.dim() - 1)
    # type promotion computes both in float32 inside one kernel each, without promoted copies
    product = operand * truncated_to_bfloat16(factors).view(shape)
    hi = product.to(torch.bfloat16)
    return hi, (product - hi).to(torch.bfloat16)

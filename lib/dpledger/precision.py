"""Full precision for the numbers that carry the privacy guarantee: per-example norms and clipped sums.

Two settings of the caller would otherwise leak into them. ``torch.autocast`` state follows autograd into
the backward pass, so the engine's Grams and clipped sums, computed in tensor hooks, would run in bf16/fp16
(norms off by 1e-3, clipped contributions above R, squared norms overflowing to inf in fp16). TF32
(``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``,
``torch.set_float32_matmul_precision('high'|'medium')``) rounds float32 matrix products to 10 mantissa
bits, so a norm and the clipped sum it scales round differently (an example can exceed R by about 1e-3),
and Monte Carlo's float32 screen, whose rounding margin assumes 2⁻²⁴, could rule out samples it must not.

:func:`exact` switches both off for the code it wraps and restores the caller's settings afterwards; the
model's own forward and backward keep whatever the caller chose.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Iterator, TypeVar

import torch

T = TypeVar("T")
AUTOCAST_DEVICES = ("cpu", "cuda")


def tf32_enabled() -> bool:
    """Whether any float32 product may currently be rounded to TF32 (or bf16) instead of computed in float32."""
    return (
        torch.backends.cuda.matmul.allow_tf32
        or torch.backends.cudnn.allow_tf32
        or torch.get_float32_matmul_precision() != "highest"
    )


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Autocast off on every device type inside the block. Around the whole backward pass: PyTorch's advice
    (backward ops then run in the dtypes autocast chose for their forward ops, not cast again), and the
    engine's hooks inherit it."""
    with contextlib.ExitStack() as stack:
        for device in AUTOCAST_DEVICES:
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


_lock = threading.Lock()
_holders = 0
_saved: tuple[bool, str] = (False, "highest")


@contextlib.contextmanager
def exact() -> Iterator[None]:
    """Autocast off on every device type and float32 products in full precision, inside the block only.

    The TF32 switches are process-wide, so overlapping blocks in several threads (Monte Carlo's workers)
    share one save and restore: the first to enter switches TF32 off, the last to leave restores it."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
        _holders += 1
    try:
        with autocast_off():
            yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                torch.backends.cudnn.allow_tf32 = _saved[0]
                torch.set_float32_matmul_precision(_saved[1])


def _decorator(context: Callable[[], contextlib.AbstractContextManager]) -> Callable:
    def decorate(function: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with context():
                return function(*args, **kwargs)

        return wrapper

    return decorate


exactly = _decorator(exact)
"""Decorator form of :func:`exact`."""
without_autocast = _decorator(autocast_off)
"""Decorator form of :func:`autocast_off`."""

"""Full precision for the numbers that carry the privacy guarantee: per-example norms and clipped
sums.

Two settings of the caller would otherwise leak into them. ``torch.autocast`` state follows autograd
into the backward pass, so the engine's Grams and clipped sums, computed in tensor hooks, would run
in bf16/fp16 (norms off by 1e-3, clipped contributions above R, squared norms overflowing to inf in
fp16). TF32 (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``,
``torch.set_float32_matmul_precision('high'|'medium')``) rounds float32 matrix products to 10
mantissa bits, so a norm and the clipped sum it scales round differently (an example can exceed R by
about 1e-3), and Monte Carlo's float32 screen, whose rounding margin assumes 2⁻²⁴, could rule out
samples it must not.

:func:`exact` switches both off for the code it wraps and restores the caller's settings afterwards;
the model's own forward and backward keep whatever the caller chose, except float16
(:func:`refuse_float16`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Iterator, TypeVar

import torch

from dpledger.errors import DpledgerError

T = TypeVar("T")
AUTOCAST_DEVICES = ("cpu", "cuda")


class Float16Error(DpledgerError):
    """Training in float16: without loss scaling, small output gradients underflow to zero."""


FLOAT16_ADVICE = (
    "without loss scaling its output gradients (about 1e-7 at an LM head of 50k tokens) "
    "underflow to zero and training silently learns little; use torch.bfloat16 (or float32)"
)


def refuse_float16_autocast(where: str, device: torch.device | None = None) -> None:
    """Raise :class:`Float16Error` (``where`` names the model or layer) when ``torch.autocast`` with
    dtype float16 is on for ``device``'s type (any type when None). The engine cannot scale the
    loss: it clips the gradients of the loss it is given, so fp16 has no exact use here; bf16
    (float32's range) has."""
    for device_type in (device.type,) if device is not None else AUTOCAST_DEVICES:
        if not torch.amp.is_autocast_available(device_type):  # meta: no autocast to ask about
            continue
        if not torch.is_autocast_enabled(device_type):
            continue
        if torch.get_autocast_dtype(device_type) == torch.float16:
            setting = "torch.autocast(dtype=torch.float16)"
            raise Float16Error(f"engine: {where} runs under {setting}: {FLOAT16_ADVICE}")


def refuse_float16(where: str, output: torch.Tensor) -> None:
    """:func:`refuse_float16_autocast` on ``output``'s device, and a float16 ``output`` (a float16
    model)."""
    refuse_float16_autocast(where, output.device)
    if output.dtype == torch.float16:
        message = f"engine: {where} computes in float16 (a float16 model): {FLOAT16_ADVICE}"
        raise Float16Error(message)


def _leaves() -> list[object]:
    """The per-backend float32 precision settings of torch's API (torch >= 2.9: ``fp32_precision``
    of cuBLAS, cuDNN convolutions and RNNs, oneDNN), each 'ieee', 'tf32', 'bf16' or 'none'
    (inherit)."""
    backends = torch.backends
    owners = ((backends.cuda, "matmul"), (backends.cudnn, "conv"), (backends.cudnn, "rnn"))
    owners += ((backends.mkldnn, "matmul"), (backends.mkldnn, "conv"), (backends.mkldnn, "rnn"))
    leaves = [getattr(owner, name, None) for owner, name in owners]
    return [leaf for leaf in leaves if leaf is not None and hasattr(leaf, "fp32_precision")]


REDUCED = ("tf32", "bf16")


def tf32_enabled() -> bool:
    """Whether any float32 product may currently be rounded to TF32 (or bf16) instead of computed in
    float32 (a leaf set to 'none' inherits its backend's or the global setting; any of those
    counts)."""
    leaves = _leaves()
    if not leaves:  # torch < 2.9: the legacy switches only
        return torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32
    parents = (torch.backends, torch.backends.cudnn, torch.backends.mkldnn)
    settings = [leaf.fp32_precision for leaf in leaves] + [
        getattr(p, "fp32_precision", "none") for p in parents
    ]
    return any(setting in REDUCED for setting in settings)


_lock = threading.Lock()
_holders = 0
_saved: list[tuple[object, str, object]] = []


def _set_full_precision() -> list[tuple[object, str]]:
    """Every float32 product in IEEE float32; returns what to restore."""
    leaves = _leaves()
    if not leaves:
        saved = [(torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32")]
        saved = [(owner, name, getattr(owner, name)) for owner, name in saved]
        for owner, name, _ in saved:
            setattr(owner, name, False)
        return saved
    saved = [(leaf, "fp32_precision", leaf.fp32_precision) for leaf in leaves]
    for leaf in leaves:
        leaf.fp32_precision = "ieee"
    return saved


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Autocast off on every device type inside the block. Around the whole backward pass: PyTorch's
    advice (backward ops then run in the dtypes autocast chose for their forward ops, not cast
    again), and the engine's hooks inherit it."""
    with contextlib.ExitStack() as stack:
        for device in AUTOCAST_DEVICES:
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


@contextlib.contextmanager
def exact() -> Iterator[None]:
    """Autocast off on every device type and float32 products in full precision, inside the block
    only.

    The precision switches are process-wide, so overlapping blocks in several threads (Monte Carlo's
    workers) share one save and restore: the first to enter switches TF32 off, the last to leave
    restores it. Each backend's own setting is saved and restored (never the legacy global getter,
    which raises once the legacy and per-backend settings disagree)."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = _set_full_precision()
        _holders += 1
    try:
        with autocast_off():
            yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                for owner, name, value in _saved:
                    setattr(owner, name, value)


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

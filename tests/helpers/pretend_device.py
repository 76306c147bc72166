"""A second device on a CPU-only machine, for tests that must catch device mixing without a GPU.

``with pretend_device() as device:`` yields ``torch.device("pretend", 0)``. Inside the block a
tensor moved there (``.to(device)``, ``model.to(device)``, a factory with ``device=device``) is a
CPU tensor wrapped in :class:`OnPretend`, whose ``device`` says ``pretend:0``; every operation runs
on the wrapped data and its results stay on the pretend device. What a real accelerator refuses,
this one refuses with the same message:

- an operation that mixes a pretend tensor with a CPU tensor (any but a 0-dim CPU scalar, which CUDA
  also accepts): ``Expected all tensors to be on the same device``;
- ``.numpy()`` of a pretend tensor (``can't convert pretend:0 device type tensor to numpy``).

Copies between the devices (``.cpu()``, ``.to(device)``, ``copy_``) are allowed, and counted with
the reads of a value to the host (``float(t)``, ``.item()``, ``.tolist()``, ``bool(t)``) in
``host_syncs``: on a GPU each of them waits for the device. Autograd, module hooks, in-place version
counters and ``nn.Parameter`` work as on a real device (the device is torch's PrivateUse1 backend
with a Python device guard; no kernel is registered for it: every operation is answered by the
wrapper).

Unlike ``meta`` (no data: nothing can be compared) or a model left on the CPU (nothing to mix with),
this runs the engine, the self-check and the stages with their real numbers while any tensor made
without ``device=`` is on another device than the model's.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "pretend"
MIXED = "Expected all tensors to be on the same device, but found at least two devices, {} and cpu!"
CROSS_DEVICE_OPS = {"aten::copy_", "aten::_to_copy", "aten::_copy_from", "aten::lift_fresh"}
"""Operations that may take tensors on both devices (copies between them)."""
HOST_READS = {"aten::_local_scalar_dense"}

_registered = threading.Lock()
_ready = False


def _register_backend() -> None:
    """Once per process: PrivateUse1 renamed ``pretend`` with Python hooks and a device guard
    (autograd asks the guard of every tensor's device)."""
    global _ready
    with _registered:
        if not _ready:
            from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

            if torch._C._get_privateuse1_backend_name() != NAME:
                _setup_privateuseone_for_python_backend(NAME)
            # torch.utils.checkpoint restores the autocast state of every registered backend in its
            # backward, and autocast asks each backend module which dtypes it supports
            getattr(torch, NAME).get_amp_supported_dtype = lambda: [torch.bfloat16]
            _ready = True


# At import (test collection), before any backward pass: autograd sizes its per-device queues at its
# first backward pass, and a device registered after that has none.
_register_backend()


class OnPretend(torch.Tensor):
    """A CPU tensor (``elem``) that says it lives on the pretend device."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> OnPretend:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            device=torch.device(NAME, 0),
            layout=elem.layout,
            requires_grad=elem.requires_grad,
        )
        wrapper.elem = elem
        return wrapper

    def __repr__(self) -> str:
        return f"OnPretend({self.elem!r})"

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


_state = threading.local()


def _count(kind: str) -> None:
    counter = getattr(_state, "syncs", None)
    if counter is not None:
        counter[kind] += 1


def _target(kwargs: dict) -> torch.device | None:
    device = kwargs.get("device")
    return None if device is None else torch.device(device)


def _dispatch(func, args, kwargs):
    """Run ``func`` on the wrapped data: refuse mixing, wrap what a pretend input or a
    ``device=pretend`` produces."""
    name = func._schema.name
    flat, _ = tree_flatten((args, kwargs))
    pretend = any(isinstance(t, OnPretend) for t in flat)
    plain = [t for t in flat if type(t) is torch.Tensor and t.dim() > 0]
    if pretend and plain and name not in CROSS_DEVICE_OPS:
        raise RuntimeError(MIXED.format(f"{NAME}:0") + f" (in {name})")
    if name in HOST_READS and pretend:
        _count("read")
    target = _target(kwargs)
    if target is not None:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    wrap = target.type == NAME if target is not None else pretend
    if name in ("aten::_to_copy", "aten::copy_") and pretend and not wrap:
        _count("copy")
    if name == "aten::copy_" and type(args[0]) is torch.Tensor:
        wrap = False  # a copy into a CPU tensor
    unwrapped = func(
        *tree_map(lambda t: t.elem if isinstance(t, OnPretend) else t, args),
        **tree_map(lambda t: t.elem if isinstance(t, OnPretend) else t, kwargs),
    )
    if func._schema.is_mutable and args and isinstance(args[0], OnPretend):
        return args[0]  # in place: the same wrapper (its version counter was bumped)
    if not wrap:
        return unwrapped
    return tree_map(
        lambda t: OnPretend(t) if type(t) is torch.Tensor else t,
        unwrapped,
    )


class _Moves(TorchFunctionMode):
    """``Tensor.to``/``.cuda``-style moves onto the pretend device (torch's own ``to`` would look
    for a kernel), ``.numpy()`` refused and ``.tolist()`` counted."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            moves = {k: v for k, v in kwargs.items() if k != "copy"}
            device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **moves)
            if device is not None and device.type == NAME:
                return to_pretend(args[0] if dtype is None else args[0].to(dtype))
        if func is torch.Tensor.numpy and isinstance(args[0], OnPretend):
            raise TypeError(
                f"can't convert {NAME}:0 device type tensor to numpy. "
                "Use Tensor.cpu() to copy the tensor to host memory first."
            )
        if func is torch.Tensor.tolist and isinstance(args[0], OnPretend):
            _count("read")
            return args[0].elem.tolist()
        return func(*args, **kwargs)


class _Onto(torch.autograd.Function):
    """A move onto the pretend device that keeps the graph (its backward moves the gradient
    back)."""

    @staticmethod
    def forward(ctx, tensor):
        return OnPretend(tensor.detach().clone())

    @staticmethod
    def backward(ctx, grad):
        return grad.elem if isinstance(grad, OnPretend) else grad


def to_pretend(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the pretend device (itself when already there)."""
    if isinstance(tensor, OnPretend):
        return tensor
    if tensor.requires_grad:
        return _Onto.apply(tensor)
    return OnPretend(tensor.detach().clone())


class _Dispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _factory(original):
    """``torch.tensor``/``torch.as_tensor`` with ``device=pretend`` (they build on the CPU in C++,
    out of the modes' sight)."""

    def make(data, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == NAME:
            return to_pretend(original(data, *args, **kwargs))
        return original(data, *args, device=device, **kwargs)

    return make


class _Generator:
    """``torch.Generator(device=pretend)``: a CPU generator (the noise on the pretend device is
    drawn by the wrapped CPU tensors)."""

    def __new__(cls, device="cpu"):
        device = torch.device(device)
        return torch._C.Generator("cpu" if device.type == NAME else device)


@contextlib.contextmanager
def pretend_device() -> Iterator[torch.device]:
    """The block runs with the pretend device available (see the module docstring); yields it.
    ``host_syncs()`` inside the block counts reads and copies to the host so far."""
    _register_backend()
    saved = torch.tensor, torch.as_tensor, torch.Generator
    torch.tensor, torch.as_tensor = _factory(saved[0]), _factory(saved[1])
    torch.Generator = _Generator  # type: ignore[misc]
    swap = torch.__future__.get_swap_module_params_on_conversion()
    # a wrapper's data cannot be replaced in place (``param.data = ...`` leaves ``elem`` behind):
    # ``module.to`` swaps the parameters instead
    torch.__future__.set_swap_module_params_on_conversion(True)
    _state.syncs = Counter()
    try:
        with _Moves(), _Dispatch():
            yield torch.device(NAME, 0)
    finally:
        torch.tensor, torch.as_tensor, torch.Generator = saved
        torch.__future__.set_swap_module_params_on_conversion(swap)
        _state.syncs = None


def host_syncs() -> Counter:
    """Reads (``read``) and copies (``copy``) from the pretend device to the host so far in the
    block."""
    return Counter(getattr(_state, "syncs", None) or {})


def reset_host_syncs() -> None:
    if getattr(_state, "syncs", None) is not None:
        _state.syncs.clear()

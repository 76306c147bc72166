"""Device choice and mixed precision: CUDA when present, CPU otherwise; autocast only on CUDA.

Under autocast the engine promotes saved activations and output gradients to float32 before it
computes norms and clipped sums (norms.py ``norm_precision``), so clipping never happens in half
precision.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from dpledger.devices import resolve_device
from dpledger.errors import ParamsError

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
"""fp16 is not offered: without loss scaling small gradients underflow (params/train.py refuses
it)."""


def select_device(name: str = "auto") -> torch.device:
    """``train.device`` resolved (:func:`dpledger.devices.resolve_device`)."""
    return resolve_device(name, key="train.device")


def autocast_dtype(device: torch.device, precision: str = "fp32") -> torch.dtype | None:
    """The dtype training's forward passes autocast to: bf16 on CUDA; None for fp32 or on CPU
    (where half precision is slower). The self-check runs its training-precision comparison under
    the same."""
    if precision not in PRECISIONS:
        raise ParamsError(
            f"params: train.precision = {precision!r} is invalid: "
            f"allowed values are {', '.join(PRECISIONS)}"
        )
    dtype = PRECISIONS[precision]
    return None if dtype is None or device.type != "cuda" else dtype


def autocast(device: torch.device, precision: str = "fp32") -> ContextManager:
    """torch.autocast in :func:`autocast_dtype`'s dtype; a no-op where that is None."""
    dtype = autocast_dtype(device, precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda", dtype=dtype)


def placement_problem(
    params: list[torch.nn.Parameter], device: torch.device, dtype: torch.dtype
) -> str | None:
    """Why the engine's buffers (built on ``device`` in ``dtype``) no longer fit the trainable
    parameters, or None: a model moved or cast after the engine was built (``p.grad`` would be a
    view of a buffer elsewhere), or split over several devices."""
    found = {(p.device, p.dtype) for p in params}
    if found == {(device, dtype)}:
        return None
    places = ", ".join(sorted(f"{d} {str(t).removeprefix('torch.')}" for d, t in found))
    return (
        "engine: "
        f"the trainable parameters are on {places} but the engine was built for {device} {str(dtype).removeprefix('torch.')}; "  # noqa: E501
        "move or cast the model (all of it, to one device) before building the engine"
    )

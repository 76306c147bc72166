"""The one resolver of a device setting (``auto``, ``cpu``, ``cuda`` or ``cuda:N``) to a torch
device, for every place that takes one (``train.device``, the Monte Carlo accountant's
``device``)."""

from __future__ import annotations

import torch

from dpledger.errors import ParamsError


def resolve_device(name: str | torch.device = "auto", *, key: str = "device") -> torch.device:
    """``auto``: CUDA when present, else the CPU. Asking for CUDA without a GPU is refused with one
    line naming ``key``, never a silent fallback to the CPU."""
    text = str(name)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text != "cpu" and not (text == "cuda" or text.startswith("cuda:")):
        raise ParamsError(
            f"params: {key} = {text!r} is invalid: allowed values are auto, cpu, cuda"
        )
    if text != "cpu" and not torch.cuda.is_available():
        raise ParamsError(
            f"params: {key} = {text!r} is invalid: no CUDA device is available (use auto or cpu)"
        )
    return torch.device(text)

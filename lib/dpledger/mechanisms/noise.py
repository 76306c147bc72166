"""Streaming correlated noise: row t of C⁻¹Z, one step at a time, without materialising Z.

DP-FTRL adds (C⁻¹Z)[t] (times σ·clip norm) to step t's clipped gradient sum. C is lower-triangular
Toeplitz, so y = C⁻¹z solves c_0 y_t = z_t - Σ_{k>=1} c_k y_{t-k} (forward substitution): a w-banded C
keeps the last w - 1 rows of y, a BLT keeps one buffer per decay (s_r(t+1) = θ_r s_r(t) + y_t and
y_t = z_t - Σ_r ω_r s_r(t)), identity keeps nothing. z_t is drawn as ``torch.randn(numel)`` from
``generator`` in step order, so the stream equals the dense product with Z's rows drawn the same way.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from dpledger.mechanisms.matrices import coefficients, support_length


def noise_stream(
    mechanism: str,
    mechanism_params: dict[str, Any],
    num_steps: int,
    numel: int,
    *,
    generator: torch.Generator,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Iterator[torch.Tensor]:
    """Yield, for t = 0..num_steps-1, a flat tensor distributed as row t of C⁻¹Z with Z ~ N(0, I).

    Memory is O(numel × state): state = 0 for identity, w - 1 for w-banded or Toeplitz with w non-zero
    coefficients (a dense Toeplitz keeps up to num_steps - 1 rows), d buffers for a d-buffer BLT.
    ``generator`` must live on ``device``; resuming at step s means replaying the stream's first s rows.
    """
    values = coefficients(mechanism, mechanism_params, num_steps)

    def draw() -> torch.Tensor:
        return torch.randn(numel, generator=generator, device=device, dtype=dtype)

    if mechanism == "blt":
        yield from _blt_stream(mechanism_params, num_steps, numel, draw, device, dtype)
        return
    yield from _toeplitz_stream(values[: support_length(values)], num_steps, numel, draw, device, dtype)


def _toeplitz_stream(values, num_steps, numel, draw, device, dtype) -> Iterator[torch.Tensor]:
    lead = float(values[0])
    memory = values.size - 1
    if memory == 0:
        for _ in range(num_steps):
            yield draw() / lead if lead != 1.0 else draw()
        return
    history = torch.zeros(memory, numel, device=device, dtype=dtype)
    lags = np.arange(1, memory + 1)
    for step in range(num_steps):
        z = draw()
        known = min(step, memory)
        if known:
            weights = torch.zeros(memory, device=device, dtype=dtype)
            slots = (step - lags[:known]) % memory
            weights[torch.as_tensor(slots, device=device)] = torch.as_tensor(values[1 : known + 1], device=device, dtype=dtype)
            z = z - weights @ history
        y = z / lead
        history[step % memory] = y
        yield y.clone()


def _blt_stream(mechanism_params, num_steps, numel, draw, device, dtype) -> Iterator[torch.Tensor]:
    decays = torch.as_tensor(mechanism_params["buffer_decays"], device=device, dtype=dtype).reshape(-1, 1)
    scales = torch.as_tensor(mechanism_params["output_scales"], device=device, dtype=dtype).reshape(1, -1)
    buffers = torch.zeros(decays.shape[0], numel, device=device, dtype=dtype)
    for _ in range(num_steps):
        y = draw() - (scales @ buffers).reshape(-1)
        buffers = decays * buffers + y
        yield y

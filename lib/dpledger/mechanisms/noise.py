"""Streaming correlated noise: row t of C⁻¹Z, one step at a time, without materialising Z.

DP-FTRL adds (C⁻¹Z)[t] (times σ·clip norm) to step t's clipped gradient sum. C is lower-triangular
Toeplitz, so y = C⁻¹z solves c_0 y_t = z_t - Σ_{k>=1} c_k y_{t-k} (forward substitution): a w-banded
C keeps the last w - 1 rows of y, a BLT keeps one buffer per decay (s_r(t+1) = θ_r s_r(t) + y_t and
y_t = z_t - Σ_r ω_r s_r(t)), identity keeps nothing. z_t is ``normals(t)`` when given (any N(0, I)
source: the engine passes its counter-based Philox draws), else ``torch.randn(numel)`` in float64
from ``generator`` in step order, rounded to ``dtype``, so the stream equals the dense product with
Z's rows drawn the same way. Never torch's float32 draw: its Box–Muller radius comes from 24-bit
uniforms, so |z| <= 5.768 and the tail is a coarse lattice (float64: 53 bits, 8.57). Noise capped at
5.768σ leaks: an example adding m_t to a coordinate pushes it past the cap with probability P(5.768
− m_t/σ < Z <= 5.768), a δ no accountant counts (1e-7 to 1e-5 per run at usual σ).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import torch

from dpledger.mechanisms.matrices import coefficients, support_length


def noise_stream(
    mechanism: str,
    mechanism_params: dict[str, Any],
    num_steps: int,
    numel: int,
    *,
    generator: torch.Generator | None = None,
    normals: Callable[[int], torch.Tensor] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Iterator[torch.Tensor]:
    """Yield, for t = 0..num_steps-1, a flat tensor distributed as row t of C⁻¹Z with Z ~ N(0, I).

    Memory is O(numel × state): state = 0 for identity, w - 1 for w-banded or Toeplitz with w
    non-zero coefficients (a dense Toeplitz keeps up to num_steps - 1 rows), d buffers for a
    d-buffer BLT. Exactly one of ``generator`` (on ``device``) and ``normals`` (step -> a fresh flat
    N(0, I) tensor of ``numel`` entries) is the source of z; resuming at step s means replaying the
    stream's first s rows.
    """
    if (generator is None) == (normals is None):
        raise ValueError("noise_stream: give exactly one of generator and normals")
    values = coefficients(mechanism, mechanism_params, num_steps)

    def draw(step: int) -> torch.Tensor:
        if normals is not None:
            return normals(step).to(device=device, dtype=dtype)
        return torch.randn(numel, generator=generator, device=device, dtype=torch.float64).to(dtype)

    if mechanism == "blt":
        yield from _blt_stream(mechanism_params, num_steps, numel, draw, device, dtype)
        return
    yield from _toeplitz_stream(
        values[: support_length(values)], num_steps, numel, draw, device, dtype
    )


def _toeplitz_stream(values, num_steps, numel, draw, device, dtype) -> Iterator[torch.Tensor]:
    lead = float(values[0])
    memory = values.size - 1
    if memory == 0:
        for step in range(num_steps):
            yield draw(step) / lead if lead != 1.0 else draw(step)
        return
    history = torch.zeros(memory, numel, device=device, dtype=dtype)
    lags = np.arange(1, memory + 1)
    for step in range(num_steps):
        z = draw(step)
        known = min(step, memory)
        if known:
            weights = torch.zeros(memory, device=device, dtype=dtype)
            slots = (step - lags[:known]) % memory
            weights[torch.as_tensor(slots, device=device)] = torch.as_tensor(
                values[1 : known + 1], device=device, dtype=dtype
            )
            z = z - weights @ history
        y = z / lead
        history[step % memory] = y
        yield y.clone()


def _blt_stream(mechanism_params, num_steps, numel, draw, device, dtype) -> Iterator[torch.Tensor]:
    decays = torch.as_tensor(mechanism_params["buffer_decays"], device=device, dtype=dtype).reshape(
        -1, 1
    )
    scales = torch.as_tensor(mechanism_params["output_scales"], device=device, dtype=dtype).reshape(
        1, -1
    )
    buffers = torch.zeros(decays.shape[0], numel, device=device, dtype=dtype)
    for step in range(num_steps):
        y = draw(step) - (scales @ buffers).reshape(-1)
        buffers = decays * buffers + y
        yield y

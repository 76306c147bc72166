"""The noise added once per logical step: σ·R·z_t with z_t a row of C⁻¹Z (identity C for DP-SGD).

Identity noise for step t comes from a generator seeded with (seed, t), so a resumed run draws the
same noise for the same step without replaying earlier ones, and one ``normal_`` fills one flat
buffer (the cheapest Gaussian draw torch has on CPU). Correlated noise comes from
``dpledger.mechanisms.noise_stream`` (a stateful stream: resuming replays it up to the step).
``secure=True`` draws from the operating system's CSPRNG (``os.urandom``) instead, for identity only;
it cannot be replayed, which is harmless because an interrupted step was never released.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterator

import numpy as np
import torch

from dpledger.errors import ParamsError


def step_seed(seed: int, step: int) -> int:
    """A 63-bit seed for step ``step`` derived from the run seed (independent streams per step)."""
    return int(np.random.SeedSequence([seed, step]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def secure_standard_normal(numel: int, dtype: torch.dtype, device: torch.device | str | None = None) -> torch.Tensor:
    """N(0, 1) draws from os.urandom by the Box–Muller transform in float64."""
    pairs = (numel + 1) // 2
    raw = np.frombuffer(os.urandom(16 * pairs), dtype=np.uint64).reshape(2, pairs)
    uniform = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)  # in (0, 1)
    radius = np.sqrt(-2.0 * np.log(uniform[0]))
    angle = 2.0 * math.pi * uniform[1]
    normal = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:numel]
    return torch.from_numpy(normal).to(device=device, dtype=dtype)


class NoiseSource:
    """Standard normal vectors of length ``numel``, one per logical step (the engine scales by σ·R)."""

    def __init__(
        self,
        numel: int,
        *,
        seed: int,
        mechanism: str = "identity",
        mechanism_params: dict[str, Any] | None = None,
        num_steps: int | None = None,
        secure: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if secure and mechanism != "identity":
            raise ParamsError(
                f"params: train.secure_noise = true is invalid with calibrate.mechanism = {mechanism!r}: "
                "the secure source supports only identity (DP-SGD) noise"
            )
        if mechanism != "identity" and num_steps is None:
            raise ParamsError(f"engine: correlated noise ({mechanism}) needs the total number of steps")
        self.numel, self.seed, self.mechanism = numel, seed, mechanism
        self.mechanism_params = dict(mechanism_params or {})
        self.num_steps, self.secure, self.device, self.dtype = num_steps, secure, device, dtype
        self._buffer = torch.empty(numel, device=device, dtype=dtype) if mechanism == "identity" else None
        self._stream: Iterator[torch.Tensor] | None = None
        self._stream_position = 0

    def draw(self, step: int) -> torch.Tensor:
        """z_step: i.i.d. N(0, 1) for identity, row ``step`` of C⁻¹Z otherwise. Steps must not go back."""
        if self.secure:
            return secure_standard_normal(self.numel, self.dtype, self.device)
        if self.mechanism == "identity":
            generator = torch.Generator(device=self._buffer.device).manual_seed(step_seed(self.seed, step))
            return self._buffer.normal_(generator=generator)
        return self._correlated(step)

    def _correlated(self, step: int) -> torch.Tensor:
        if self._stream is None or step < self._stream_position:
            from dpledger.mechanisms import noise_stream

            generator = torch.Generator(device=self.device or "cpu").manual_seed(self.seed)
            self._stream = iter(
                noise_stream(
                    self.mechanism, self.mechanism_params, self.num_steps, self.numel,
                    generator=generator, device=self.device, dtype=self.dtype,
                )
            )
            self._stream_position = 0
        if step >= self.num_steps:
            raise ParamsError(f"engine: step {step} is past the {self.num_steps} steps the correlated noise was built for")
        while True:
            row = next(self._stream)
            self._stream_position += 1
            if self._stream_position - 1 == step:
                return row

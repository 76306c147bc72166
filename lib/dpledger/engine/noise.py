"""The noise added once per logical step: σ·R·z_t with z_t a row of C⁻¹Z (identity C for DP-SGD).

Identity noise on the CPU in float32 (the common case) comes from ``philox_normal``: Philox4x32-10
counter-based bits and a vectorized float32 Box–Muller, a pure function of (seed, step, position),
drawn on disjoint blocks by numba's thread pool; cheaper than torch's ``normal_`` on the same
threads and than one ``normal_`` call, whose uniforms come from a serial Mersenne Twister
(benchmarks/RESULTS.md), with tails to 9.5σ instead of 5.8σ. Other devices and dtypes cut the vector
into fixed chunks of ``NOISE_CHUNK`` entries (``CUDA_NOISE_CHUNK`` on CUDA: few large draws), chunk
k drawn by torch in float64 from its own generator seeded with (seed, t, k), then rounded: torch's
float32 draws cap |z| at 5.8σ (CPU) or 6.8σ (CUDA), and noise with a cap leaks a δ no accountant
counts (``dpledger.mechanisms.noise``). Either way a resumed run draws the same noise for the same
step without replaying earlier ones, and the noise does not depend on the thread count. Correlated
noise is ``dpledger.mechanisms.noise_stream`` applied to these same rows z_t (a stateful stream:
resuming replays it up to the step). ``secure=True`` draws from the operating system's CSPRNG
(``os.urandom``) instead, for identity only; it cannot be replayed, which is harmless because an
interrupted step was never released. The ``seed`` is the noise key: whoever knows it can replay and
subtract every draw, so the train stage takes it from a secret, never from a tracked value
(``pipeline/noise_key.py``).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np
import torch

from dpledger import philox_normal
from dpledger.errors import ParamsError

NOISE_CHUNK = 1 << 18
"""Entries per independently seeded chunk of a step's noise (fixed: the noise must not depend on
threads)."""
CUDA_NOISE_CHUNK = 1 << 24
"""The chunk length on CUDA, where one chunk is one launch and threads play no part: GPT-2 small's
124M noise entries in 8 draws instead of 475. A float64 temporary of this length is 128
MiB."""


def noise_chunk(device: torch.device) -> int:
    """Entries per seeded chunk on ``device`` (part of the noise stream: changing it changes the
    noise)."""
    return CUDA_NOISE_CHUNK if device.type == "cuda" else NOISE_CHUNK


def philox_key(seed: int) -> tuple[int, int]:
    """The 64-bit Philox key of a run seed (two 32-bit words)."""
    words = np.random.SeedSequence([seed, 0x5EED]).generate_state(2, dtype=np.uint32)
    return int(words[0]), int(words[1])


def chunk_seeds(seed: int, step: int, chunks: int) -> list[int]:
    """63-bit seeds of the ``chunks`` chunks of step ``step``, derived from the run seed
    (independent streams)."""
    state = np.random.SeedSequence([seed, step]).generate_state(max(chunks, 2), dtype=np.uint64)
    return [int(word >> np.uint64(1)) for word in state[:chunks]]


def secure_standard_normal(
    numel: int, dtype: torch.dtype, device: torch.device | str | None = None
) -> torch.Tensor:
    """N(0, 1) draws from os.urandom by the Box–Muller transform in float64."""
    pairs = (numel + 1) // 2
    raw = np.frombuffer(os.urandom(16 * pairs), dtype=np.uint64).reshape(2, pairs)
    uniform = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)  # in (0, 1)
    radius = np.sqrt(-2.0 * np.log(uniform[0]))
    angle = 2.0 * math.pi * uniform[1]
    normal = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:numel]
    return torch.from_numpy(normal).to(device=device, dtype=dtype)


class NoiseSource:
    """Standard normal vectors of length ``numel``, one per logical step (the engine scales by
    σ·R)."""

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
                "params: "
                f"train.secure_noise = true is invalid with calibrate.mechanism = {mechanism!r}: "
                "the secure source supports only identity (DP-SGD) noise"
            )
        if mechanism != "identity" and num_steps is None:
            raise ParamsError(
                f"engine: correlated noise ({mechanism}) needs the total number of steps"
            )
        self.numel, self.seed, self.mechanism = numel, seed, mechanism
        self.mechanism_params = dict(mechanism_params or {})
        self.num_steps, self.secure, self.device, self.dtype = num_steps, secure, device, dtype
        self._buffer: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_owner: tuple[int, int] | None = None
        self._stream: Iterator[torch.Tensor] | None = None
        self._stream_position = 0

    def draw(self, step: int) -> torch.Tensor:
        """z_step: i.i.d. N(0, 1) for identity, row ``step`` of C⁻¹Z otherwise. Steps must not go
        back.

        The returned tensor may be a buffer reused by the next call."""
        if self.mechanism == "identity" and not self.secure:
            if self._buffer is None:
                self._buffer = torch.empty(self.numel, device=self.device, dtype=self.dtype)
            return self.draw_into(self._buffer, step, 1.0)
        return (
            self._correlated(step)
            if not self.secure
            else secure_standard_normal(self.numel, self.dtype, self.device)
        )

    def draw_into(self, out: torch.Tensor, step: int, scale: float) -> torch.Tensor:
        """Overwrite the flat tensor ``out`` with scale·z_step (the engine's σ·R·z_t, with no extra
        pass)."""
        if self.secure or self.mechanism != "identity":
            return torch.mul(self.draw(step), scale, out=out)
        return self._independent_into(out, step, scale)

    def independent(self, step: int) -> torch.Tensor:
        """A fresh tensor of i.i.d. N(0, 1) for step ``step``: the rows z_t that correlated noise
        transforms."""
        return self._independent_into(
            torch.empty(self.numel, device=self.device, dtype=self.dtype), step, 1.0
        )

    def _independent_into(self, out: torch.Tensor, step: int, scale: float) -> torch.Tensor:
        """scale·z_step into ``out``: Philox on CPU float32, torch's float64 draws on fixed chunks
        otherwise."""
        if out.device.type == "cpu" and out.dtype == torch.float32 and out.is_contiguous():
            return self._philox_into(out, step, scale)
        return self._torch_chunks_into(out, step, scale)

    def _torch_chunks_into(self, out: torch.Tensor, step: int, scale: float) -> torch.Tensor:
        """torch's ``normal_`` on fixed chunks, chunk k from a generator seeded by (seed, step,
        k)."""
        size = noise_chunk(out.device)
        chunks = -(-self.numel // size)
        seeds = chunk_seeds(self.seed, step, chunks)

        def fill(indices: range) -> None:
            wide = None
            for k in indices:
                generator = torch.Generator(device=out.device).manual_seed(seeds[k])
                chunk = out[k * size : (k + 1) * size]
                if chunk.dtype == torch.float64:
                    chunk.normal_(0.0, scale, generator=generator)
                else:
                    if wide is None:  # one float64 temporary per thread, reused by its chunks
                        wide = torch.empty(
                            min(size, self.numel), device=out.device, dtype=torch.float64
                        )
                    chunk.copy_(wide[: chunk.numel()].normal_(0.0, scale, generator=generator))

        workers = min(chunks, torch.get_num_threads()) if out.device.type == "cpu" else 1
        if workers == 1:
            fill(range(chunks))
            return out
        pool = self._thread_pool(workers)
        for future in [pool.submit(fill, range(w, chunks, workers)) for w in range(workers)]:
            future.result()
        return out

    def _philox_into(self, out: torch.Tensor, step: int, scale: float) -> torch.Tensor:
        """philox_normal draws on torch's thread count, through numba's pool where it is usable,
        else the blocks split evenly over our own threads (the values depend on neither)."""
        array, key = out.view(-1).numpy(), philox_key(self.seed)
        blocks = philox_normal.blocks(self.numel)
        workers = min(blocks, torch.get_num_threads())
        if workers == 1 or philox_normal.pool_is_usable():
            philox_normal.fill_standard_normal(array, key, step, scale, threads=workers)
            return out
        bounds = [blocks * w // workers for w in range(workers + 1)]
        pool = self._thread_pool(workers)
        futures = [
            pool.submit(philox_normal.fill_standard_normal, array, key, step, scale, (lo, hi))
            for lo, hi in zip(bounds[:-1], bounds[1:])
        ]
        for future in futures:
            future.result()
        return out

    def _thread_pool(self, workers: int) -> ThreadPoolExecutor:
        """The drawing threads, made again in a forked child (threads do not survive a fork)."""
        if self._pool is None or self._pool_owner != (os.getpid(), workers):
            if self._pool is not None and self._pool_owner[0] == os.getpid():
                self._pool.shutdown(wait=False)
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="dpledger-noise")
            self._pool_owner = (os.getpid(), workers)
        return self._pool

    def _correlated(self, step: int) -> torch.Tensor:
        if self._stream is None or step < self._stream_position:
            from dpledger.mechanisms import noise_stream

            self._stream = iter(
                noise_stream(
                    self.mechanism,
                    self.mechanism_params,
                    self.num_steps,
                    self.numel,
                    normals=self.independent,
                    device=self.device,
                    dtype=self.dtype,
                )
            )
            self._stream_position = 0
        if step >= self.num_steps:
            raise ParamsError(
                "engine: "
                f"step {step} is past the {self.num_steps} steps the correlated noise was built for"
            )
        while True:
            row = next(self._stream)
            self._stream_position += 1
            if self._stream_position - 1 == step:
                return row

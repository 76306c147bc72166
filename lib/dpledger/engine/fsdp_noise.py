"""Slices of one step's noise vector z_t: what a rank holding shards of the parameters adds.

A single process draws z_t for the whole flat vector of trainable parameters (``noise.py``): Philox
counters on the CPU in float32, or fixed chunks each drawn from its own generator seeded by (seed,
t, k) otherwise. Both are functions of the position, so a rank can draw exactly the entries
[lo, hi) of that vector without drawing the rest: the blocks (Philox) or chunks (torch) that
overlap its ranges, one at a time into a small temporary. Every rank's slices together are the
single process's z_t bit for bit, so the same seed gives the same model however the parameters are
sharded.

Correlated noise (a stateful stream over whole rows of C⁻¹Z) is refused under sharding; the secure
source (``os.urandom``) draws each slice independently, which is the same distribution and, like a
single process's secure draws, is never replayed.
"""

from __future__ import annotations

import torch

from dpledger.engine.noise import (
    NoiseSource,
    chunk_seeds,
    noise_chunk,
    philox_key,
    secure_standard_normal,
)
from dpledger.errors import ParamsError
from dpledger.philox_normal import fill_window

Range = tuple[int, int]
"""[lo, hi) of the single-process flat vector."""


def refuse_correlated(noise: NoiseSource) -> None:
    """Refuse noise that cannot be sliced: correlated mechanisms keep a stream of whole rows."""
    if noise.mechanism != "identity":
        raise ParamsError(
            f"engine: correlated noise ({noise.mechanism}) is not supported with sharded parameters (FSDPEngine); use identity noise or the data-parallel BKEngine"  # noqa: E501
        )


def draw_ranges(
    noise: NoiseSource, out: torch.Tensor, ranges: list[Range], step: int, scale: float
) -> None:
    """Overwrite the flat tensor ``out`` with scale·z_step at ``ranges`` (laid end to end in
    ``out``): the entries a single process's ``noise.draw_into`` would put there."""
    if sum(hi - lo for lo, hi in ranges) != out.numel():
        raise ValueError("the ranges do not cover the output")
    if noise.secure:
        for (lo, hi), part in zip(ranges, _parts(out, ranges)):
            part.copy_(secure_standard_normal(hi - lo, out.dtype, out.device).mul_(scale))
        return
    refuse_correlated(noise)
    if out.device.type == "cpu" and out.dtype == torch.float32:
        key = philox_key(noise.seed)
        for (lo, _), part in zip(ranges, _parts(out, ranges)):
            fill_window(part.numpy(), lo, noise.numel, key, step, scale)
        return
    _torch_chunks(noise, out, ranges, step, scale)


def _parts(out: torch.Tensor, ranges: list[Range]) -> list[torch.Tensor]:
    """``out`` cut into one slice per range."""
    return list(out.view(-1).split([hi - lo for lo, hi in ranges]))


def _torch_chunks(
    noise: NoiseSource, out: torch.Tensor, ranges: list[Range], step: int, scale: float
) -> None:
    """The torch path of ``noise.py``: every chunk that overlaps a range drawn once, in float64,
    from its own generator; the overlaps copied (and rounded to ``out``'s dtype)."""
    size = noise_chunk(out.device)
    chunks = -(-noise.numel // size)
    seeds = chunk_seeds(noise.seed, step, chunks)
    parts = _parts(out, ranges)
    wanted = sorted(
        {k for lo, hi in ranges if hi > lo for k in range(lo // size, (hi - 1) // size + 1)}
    )
    for k in wanted:
        start = k * size
        length = min(size, noise.numel - start)
        generator = torch.Generator(device=out.device).manual_seed(seeds[k])
        drawn = torch.empty(length, device=out.device, dtype=torch.float64)
        drawn.normal_(0.0, scale, generator=generator)
        for (lo, hi), part in zip(ranges, parts):
            first, last = max(lo, start), min(hi, start + length)
            if first < last:
                part[first - lo : last - lo].copy_(drawn[first - start : last - start])

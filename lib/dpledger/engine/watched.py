"""The coordinates of the released sum the one-run audit watches (``engine.watch``): entries of
the trainable parameters, gathered from whole per-parameter tensors or, under FSDP, from each rank's
shards and summed over the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Coordinates:
    """``parts``: (index of the parameter in ``engine.params`` order, flat indices into it, an
    int64 tensor on the parameters' device), in the order the watched vector lists them."""

    parts: tuple[tuple[int, Tensor], ...]

    def __call__(self, tensors: list[Tensor]) -> Tensor:
        """The watched entries of whole per-parameter ``tensors``."""
        return torch.cat(
            [torch.index_select(tensors[i].reshape(-1), 0, flat) for i, flat in self.parts]
        )

    def held(self, shards: list[Tensor], starts: list[int | None]) -> Tensor:
        """This rank's share of the watched entries: from ``shards[i]``, which holds parameter i's
        flat entries from ``starts[i]`` on, those it holds, 0 for the others and for a parameter
        whose ``starts`` is None (held by another rank). Summed over the ranks it is
        ``self(whole tensors)``; no host sync."""
        parts = []
        for i, flat in self.parts:
            shard, start = shards[i].reshape(-1), starts[i]
            if start is None or shard.numel() == 0:
                parts.append(flat.new_zeros(len(flat), dtype=shard.dtype))
                continue
            inside = (flat >= start) & (flat < start + shard.numel())
            picked = shard.index_select(0, (flat - start).clamp(0, shard.numel() - 1))
            parts.append(torch.where(inside, picked, torch.zeros_like(picked)))
        return torch.cat(parts)

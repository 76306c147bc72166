"""The schedule's batches on the training device, uploaded once.

Each step used to copy its index and padding arrays to the device: two small host-to-device
transfers per step, each a point where a GPU queue can run dry. The whole schedule is uploaded once
instead (``num_steps × B`` indices, int64), and a step's rows are a slice of it; this rank's share
of the batch is its contiguous slice (:func:`share_bounds`, possibly empty).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dpledger.engine.distributed import share_bounds
from dpledger.pipeline.distributed import Ranks
from dpledger.sampling.schedule import Schedule


@dataclass(frozen=True)
class DeviceBatches:
    """Row indices and example weights (0 for padding rows) of every step, on one device."""

    schedule: Schedule
    ranks: Ranks
    indices: Tensor
    weights: Tensor

    @classmethod
    def upload(cls, schedule: Schedule, ranks: Ranks, device: torch.device) -> DeviceBatches:
        indices = torch.from_numpy(schedule.indices.astype(np.int64)).to(device)
        weights = torch.from_numpy(~schedule.padding).to(device=device, dtype=torch.float32)
        return cls(schedule, ranks, indices, weights)

    def batch(self, step: int) -> tuple[Tensor, Tensor, float]:
        """This rank's (rows, weights) of step ``step`` on the device, and its count of real rows
        (from the host copy: no device sync)."""
        lo, hi = int(self.schedule.offsets[step]), int(self.schedule.offsets[step + 1])
        first, last = share_bounds(hi - lo, self.ranks.rank, self.ranks.world_size)
        rows = slice(lo + first, lo + last)
        real = float((~self.schedule.padding[rows]).sum())
        return self.indices[rows], self.weights[rows], real

    def real_rows(self, step: int) -> float:
        """The real (non-padding) rows of step ``step`` over all ranks, from the host copy."""
        lo, hi = int(self.schedule.offsets[step]), int(self.schedule.offsets[step + 1])
        return float((~self.schedule.padding[lo:hi]).sum())

"""Each logical step's training loss, kept on the device and read back in one transfer when it is
shown or saved.

The train loop used to read the loss back after every physical batch (``float(loss)``): a host sync
per batch, each one draining the GPU queue. The summed loss of a step now stays a float64 scalar on
the device (``_private_step``); with a process group it is summed over the ranks there, by an
all-reduce that needs no host; :meth:`StepLosses.read` copies every pending step's loss to the host
at once, when the progress line or a checkpoint needs them. The values are the same as the old
per-batch reads: each batch's sum is formed in the loss's dtype and added in float64, as Python
floats were.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from dpledger.pipeline.distributed import Ranks


class StepLosses:
    """Mean loss per real example of each step since the last :meth:`read`, on the device until
    read."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self.sums: list[Tensor] = []
        self.reals: list[float] = []

    def add(self, loss_sum: Tensor, real: float) -> None:
        """One step: ``loss_sum`` (this rank's weighted loss sum, a float64 device scalar) and the
        step's real examples over all ranks (``real``, known on the host from the schedule)."""
        if self.ranks.group is not None:
            dist.all_reduce(loss_sum, group=self.ranks.group)
        self.sums.append(loss_sum)
        self.reals.append(real)

    def read(self) -> list[float]:
        """The pending steps' mean losses (NaN for a step without real examples), in one
        device-to-host copy."""
        if not self.sums:
            return []
        sums = torch.stack(self.sums).tolist()
        means = [total / real if real else float("nan") for total, real in zip(sums, self.reals)]
        self.sums, self.reals = [], []
        return means

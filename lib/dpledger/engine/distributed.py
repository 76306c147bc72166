"""Data-parallel BK steps on ``torch.distributed``: each rank clips its share, one all-reduce, the
noise once.

Every rank of a process group runs its own :class:`~dpledger.engine.bk.BKEngine` on a disjoint share
of the logical batch (the same schedule; ``dpledger.pipeline.distributed`` cuts the shares). A
rank's ``backward`` adds Σ_i C_i·w_i·g_i of its own rows to the engine's flat buffer; at ``step``
the buffers of all ranks are summed by ONE ``all_reduce`` (SUM) over that whole flat buffer — one
bucket, one call per logical step — and every rank hands the same sum to the same optimizer, so the
models stay identical without broadcasting parameters.

The noise σ·R·z_t (a function of (seed, t), identity or correlated) and the canary enter the sum
exactly once: only the group's rank 0 fills its buffer with the noise (and adds the canary); the
others start from zeros. The normalizer stays the logical batch's, so the released noisy sum, its
scale and the ledger are those of a single-process run; only the order of the floating-point
additions differs.

What stays per rank: ``last_norms`` (the norms of this rank's rows only) and ``layer_methods``.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch import Tensor

from dpledger.errors import ParamsError


class GroupSum:
    """The engine's link to a process group: whether this rank adds the step's noise and canary
    (rank 0 of the group alone), and the SUM all-reduce of the flat buffer (once per logical
    step)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ParamsError(
                "engine: process_group needs torch.distributed initialised first "
                "(torch.distributed.init_process_group)"
            )
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    @property
    def adds_noise(self) -> bool:
        """True on the one rank whose buffer starts with the noise (and receives the canary)."""
        return self.rank == 0

    def all_reduce(self, buffer: Tensor) -> None:
        """Sum ``buffer`` over the group in place (every rank ends with the same sum)."""
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group)

    def span(self, mine: Tensor) -> tuple[Tensor, Tensor]:
        """The element-wise minimum and maximum of ``mine`` over the group's ranks (equal when all
        ranks agree)."""
        return rank_span(mine, self.group)

    def check_layout(self, numel: int, names: list[str], device: torch.device) -> None:
        """Refuse ranks whose trainable parameters differ (count or names): their flat buffers would
        not line up."""
        digest = int.from_bytes(hashlib.sha256("\n".join(names).encode()).digest()[:6], "big")
        lowest, highest = self.span(torch.tensor([numel, digest], dtype=torch.int64, device=device))
        if not torch.equal(highest, lowest):
            raise ParamsError(
                "engine: "
                f"rank {self.rank} has {numel} trainable parameter entries but another rank of the process group has a different model "  # noqa: E501
                "(count or parameter names); every rank must build the same model"
            )


def rank_span(mine: Tensor, group: dist.ProcessGroup | None) -> tuple[Tensor, Tensor]:
    """The element-wise minimum and maximum of ``mine`` over the ranks of ``group`` (equal when all
    agree)."""
    highest, lowest = mine.clone(), mine.clone()
    dist.all_reduce(highest, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN, group=group)
    return lowest, highest


def share_bounds(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """[lo, hi) of rank ``rank``'s rows among ``rows``: disjoint, covering, sizes differing by at
    most one."""
    return rows * rank // world_size, rows * (rank + 1) // world_size


def group_sum(process_group: dist.ProcessGroup | GroupSum) -> GroupSum:
    """A :class:`GroupSum` for the engine's ``process_group`` argument (a group, or a GroupSum as it
    is)."""
    return process_group if isinstance(process_group, GroupSum) else GroupSum(process_group)

"""Counting the aten ops of a step on the CPU: kernel launches and host syncs."""

from __future__ import annotations

import collections

from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = (
    "aten._local_scalar_dense",
    "aten.nonzero",
    "aten.item",
    "aten.masked_select",
    "aten.is_nonzero",
    "aten.equal",
)


class OpCounter(TorchDispatchMode):
    """Counts dispatched aten ops: all of them, those that launch a kernel, and host syncs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.launches = self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        self.launches += not func.is_view
        self.syncs += str(func).startswith(SYNC_OPS)
        return func(*args, **(kwargs or {}))

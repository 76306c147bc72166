"""The schedule uploaded once (issue 30): each step's rows on the device are exactly the host
schedule's batch, this rank's contiguous share of it, with weight 0 on the padding rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpledger.engine.distributed import share_bounds
from dpledger.pipeline.batches import DeviceBatches
from dpledger.pipeline.distributed import Ranks
from dpledger.sampling.registry import build_schedule

SAMPLERS = {"poisson": {}, "shuffle": {}, "balls-in-bins": {"pad_truncate": True}}


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("world_size", [1, 3])
def test_every_rank_gets_its_share_of_each_host_batch(sampler, world_size):
    schedule = build_schedule(
        sampler, dataset_size=50, batch_size=8, epochs=2, seed=3, **SAMPLERS[sampler]
    )
    assert schedule.padding.any() or sampler != "balls-in-bins"  # padding rows are exercised
    for rank in range(world_size):
        batches = DeviceBatches.upload(
            schedule, Ranks(rank=rank, world_size=world_size), torch.device("cpu")
        )
        for step in range(schedule.num_steps):
            indices, padding = schedule.batch(step)
            lo, hi = share_bounds(len(indices), rank, world_size)
            rows, weights, real = batches.batch(step)
            assert rows.dtype == torch.int64 and np.array_equal(rows.numpy(), indices[lo:hi])
            assert np.array_equal(weights.numpy(), (~padding[lo:hi]).astype(np.float32))
            assert real == float((~padding[lo:hi]).sum())

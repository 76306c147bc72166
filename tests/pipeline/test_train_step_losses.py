"""The train loop's loss stays on the device (issue 30): no host sync per physical batch, one read
per progress line or checkpoint, and the same numbers as the per-batch reads it replaces."""

from __future__ import annotations

import io

import numpy as np
import torch
from torch import nn

from dpledger.engine import BKEngine
from dpledger.models.tasks import Task
from dpledger.pipeline.batches import DeviceBatches
from dpledger.pipeline.distributed import SINGLE
from dpledger.pipeline.progress import LINES, Progress
from dpledger.pipeline.step_losses import StepLosses
from dpledger.pipeline.train import _private_step
from dpledger.sampling.registry import build_schedule
from helpers.op_counter import OpCounter

N, D, CLASSES = 40, 6, 3


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, CLASSES)).train()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=1.0, normalizer=8.0)
    generator = torch.Generator().manual_seed(1)
    x, y = (
        torch.randn(N, D, generator=generator),
        torch.randint(0, CLASSES, (N,), generator=generator),
    )
    return model, engine, x, y


def test_a_step_of_three_physical_batches_reads_nothing_back_and_sums_as_the_per_batch_reads_did():
    model, engine, x, y = _setup()
    task = Task("classification")
    rows, weights = torch.arange(10), torch.tensor([1.0] * 8 + [0.0] * 2)
    engine.private_step(task.losses(model, x[:4], y[:4]))  # warm-up: the first pass's checks
    expected = 0.0  # the old loop: one float() per physical batch, summed in Python
    with torch.no_grad():
        for lo in range(0, 10, 4):
            part = rows[lo : lo + 4]
            expected += float((task.losses(model, x[part], y[part]) * weights[lo : lo + 4]).sum())
    counter = OpCounter()
    with counter:
        cpu = torch.device("cpu")
        loss_sum = _private_step(engine, task, model, x, y, rows, weights, 4, cpu, "fp32")
    assert counter.syncs == 0, counter.ops
    assert loss_sum.dtype == torch.float64 and loss_sum.item() == expected


def test_step_losses_are_read_in_one_copy_with_the_old_means():
    schedule = build_schedule("poisson", dataset_size=50, batch_size=8, epochs=1, seed=3)
    batches = DeviceBatches.upload(schedule, SINGLE, torch.device("cpu"))
    sums = [torch.tensor(float(k) + 0.25, dtype=torch.float64) for k in range(schedule.num_steps)]
    losses = StepLosses(SINGLE)
    for step, loss_sum in enumerate(sums):
        losses.add(loss_sum, batches.real_rows(step))
    counter = OpCounter()
    with counter:
        means = losses.read()
    # one stack, then one .tolist(): one copy to the host
    assert list(counter.ops) == ["aten.stack.default"], counter.ops
    assert losses.read() == []
    reals = [float((~schedule.batch(step)[1]).sum()) for step in range(schedule.num_steps)]
    expected = [float(s) / r if r else float("nan") for s, r in zip(sums, reals)]
    np.testing.assert_array_equal(means, expected)


def test_the_progress_lines_ask_for_the_loss_only_where_they_show_it():
    stream = io.StringIO()
    progress = Progress(1000, 0, stream=stream)
    asked = [done for done in range(1, 1001) if progress.shows_loss(done)]
    for done in range(1, 1001):
        progress.update(loss=2.0 - done / 1000 if done in asked else None, epsilon=done / 500)
    assert len(asked) == LINES and len(stream.getvalue().splitlines()) == LINES
    assert not Progress(1000, 0, stream=stream, enabled=False).shows_loss(100)

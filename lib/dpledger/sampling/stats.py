"""Batch-size statistics of a schedule: the flat metrics of the schedule stage and its histogram."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpledger.sampling.guard import declared_equivalent
from dpledger.sampling.schedule import Schedule


def schedule_stats(schedule: Schedule) -> dict[str, Any]:
    """Flat (scalar-only) description of a schedule: sizes, batch-size moments, padding and
    coverage.

    ``truncated_examples`` counts (example, epoch) participations dropped by pad/truncate: every
    example is in exactly one bin per epoch before truncation, so it is epochs·n minus the real
    rows. ``examples_never_used`` counts examples that appear in no batch at all.
    """
    sizes = schedule.batch_sizes()
    real_rows = int(sizes.sum())
    params = schedule.sampler_params
    epochs = int(params.get("epochs", 1))
    pad_truncate = bool(params.get("pad_truncate", False))
    used = np.zeros(schedule.dataset_size, dtype=bool)
    used[schedule.indices[~schedule.padding]] = True
    declared = declared_equivalent(schedule.sampler, params)
    return {
        "sampler": schedule.sampler,
        "sampler_declared_as": declared or "none",
        "seed": schedule.seed,
        "dataset_size": schedule.dataset_size,
        "batch_size": int(params.get("batch_size", 0)),
        "epochs": epochs,
        "steps_per_epoch": schedule.steps_per_epoch,
        "num_steps": schedule.num_steps,
        "batch_size_mean": float(sizes.mean()),
        "batch_size_std": float(sizes.std()),
        "batch_size_min": int(sizes.min()),
        "batch_size_max": int(sizes.max()),
        "empty_batches": int(np.count_nonzero(sizes == 0)),
        "padding_rows": int(np.count_nonzero(schedule.padding)),
        "pad_truncate": pad_truncate,
        "truncated_examples": epochs * schedule.dataset_size - real_rows if pad_truncate else 0,
        "examples_never_used": int(schedule.dataset_size - np.count_nonzero(used)),
    }


def batch_size_histogram(schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """(batch size, number of steps with that many real examples), sizes ascending."""
    return np.unique(schedule.batch_sizes(), return_counts=True)

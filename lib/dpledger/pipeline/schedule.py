"""Stage ``schedule``: build the batches training will use and save them as an artifact.

Reads ``seed``, ``data`` (for the training-set size n), ``batching`` and ``schedule``. Writes
``artifacts/schedule/`` (schedule.npz + schedule.json), ``metrics/schedule.json`` and
``plots/schedule/`` (batch-size histogram as CSV and PNG).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dpledger import io, plotting
from dpledger.data import load_data
from dpledger.params import Params, check_dataset_size
from dpledger.sampling import Schedule, build_schedule, options_for
from dpledger.sampling.stats import batch_size_histogram, schedule_stats


def schedule_from_params(params: Params, dataset_size: int, *, progress: bool = False) -> Schedule:
    """The schedule params.yaml describes, over a training set of ``dataset_size`` examples."""
    check_dataset_size(params, dataset_size)
    settings = params.schedule
    return build_schedule(
        settings.sampler,
        dataset_size=dataset_size,
        batch_size=params.batching.batch_size,
        epochs=params.batching.epochs,
        seed=params.seed,
        progress=progress,
        **options_for(
            settings.sampler,
            last_batch=settings.last_batch,
            pad_truncate=settings.pad_truncate,
            buffer_size=settings.buffer_size,
        ),
    )


def _plot_histogram(
    path: Path, sizes: np.ndarray, counts: np.ndarray, schedule: Schedule, batch_size: int
) -> None:
    with plotting.png(path) as axes:
        axes.bar(sizes, counts, width=1.0, color="#4c72b0")
        axes.axvline(
            batch_size, color="black", linestyle="--", linewidth=1, label=f"B = {batch_size}"
        )
        axes.set_xlabel("real examples in the batch")
        axes.set_ylabel("steps")
        axes.set_title(f"Batch sizes: {schedule.sampler}, {schedule.num_steps} steps")
        axes.legend()


def run(params: Params, root: Path) -> dict[str, Any]:
    """Build, check and save the schedule; returns the flat metrics."""
    data = params.data
    dataset = load_data(data, params.seed)
    schedule = schedule_from_params(params, dataset.train_size, progress=True)
    metrics = schedule_stats(schedule)
    sizes, counts = batch_size_histogram(schedule)

    with io.atomic_dir(root / "artifacts" / "schedule") as folder:
        schedule.save(folder)
    io.write_json(root / "metrics" / "schedule.json", metrics)
    plots = root / "plots" / "schedule"
    io.write_csv(
        plots / "batch_sizes.csv", ["batch_size", "steps"], np.column_stack([sizes, counts])
    )
    _plot_histogram(plots / "batch_sizes.png", sizes, counts, schedule, params.batching.batch_size)
    return metrics

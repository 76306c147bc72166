"""Samplers by name: build one (streaming) or materialize its batches as a :class:`Schedule`."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
from tqdm import tqdm

from dpledger import validation
from dpledger.errors import ParamsError
from dpledger.sampling.balls_in_bins import BallsInBinsRedrawnSampler, BallsInBinsSampler
from dpledger.sampling.base import INDEX_DTYPE, Batch, BatchSampler
from dpledger.sampling.independent import FixedSizeSampler, PoissonSampler
from dpledger.sampling.plugin import PluginSampler, is_plugin_name
from dpledger.sampling.schedule import Schedule
from dpledger.sampling.shuffling import (
    BatchThenShuffleSampler,
    PartialShuffleSampler,
    SequentialSampler,
    ShuffleSampler,
)

SAMPLERS: dict[str, type[BatchSampler]] = {
    cls.name: cls
    for cls in (
        PoissonSampler,
        FixedSizeSampler,
        BallsInBinsSampler,
        BallsInBinsRedrawnSampler,
        ShuffleSampler,
        SequentialSampler,
        PartialShuffleSampler,
        BatchThenShuffleSampler,
    )
}


def sampler_class(name: str) -> type[BatchSampler]:
    """The class building sampler ``name`` (a built-in name or ``module:callable``)."""
    if name in SAMPLERS:
        return SAMPLERS[name]
    if is_plugin_name(name):
        return PluginSampler
    raise validation.invalid(
        "sampler", name, f"allowed values are {', '.join(SAMPLERS)} or module:callable"
    )


def options_for(name: str, **candidates: Any) -> dict[str, Any]:
    """The candidates sampler ``name`` takes, without unset (None) ones: how params feed any
    sampler."""
    taken = sampler_class(name).OPTIONS
    return {key: value for key, value in candidates.items() if key in taken and value is not None}


def build_sampler(
    name: str, *, dataset_size: int, batch_size: int, epochs: int, seed: int, **options: Any
) -> BatchSampler:
    """Sampler ``name`` over ``dataset_size`` examples; an option it does not take is refused."""
    cls = sampler_class(name)
    unknown = sorted(set(options) - set(cls.OPTIONS))
    if unknown:
        taken = ", ".join(cls.OPTIONS) or "none"
        raise ParamsError(
            f"{unknown[0]} = {options[unknown[0]]!r} is invalid: sampler {name!r} takes options: "
            f"{taken}"
        )
    sizes = {"dataset_size": dataset_size, "batch_size": batch_size, "epochs": epochs, "seed": seed}
    if cls is PluginSampler:
        return PluginSampler(name, **sizes)
    return cls(**sizes, **options)


class _RowBuffer:
    """Growable (indices, padding) arrays: the CSR rows of a schedule, filled without per-step
    lists."""

    def __init__(self, capacity: int) -> None:
        self.indices = np.empty(capacity, dtype=INDEX_DTYPE)
        self.padding = np.zeros(capacity, dtype=bool)
        self.size = 0

    def append(self, batch: Batch) -> None:
        end = self.size + batch.indices.shape[0]
        if end > self.indices.shape[0]:
            capacity = max(end, int(self.indices.shape[0] * 1.5) + 1)
            self.indices = np.resize(self.indices, capacity)
            self.padding = np.resize(self.padding, capacity)
        self.indices[self.size : end] = batch.indices
        self.padding[self.size : end] = batch.padding
        self.size = end


def materialize(sampler: BatchSampler, *, progress: bool = False) -> Schedule:
    """Draw every batch of ``sampler`` into a :class:`Schedule` (memory: the schedule plus the
    sampler's own)."""
    plugin = isinstance(sampler, PluginSampler)
    total = None if plugin else sampler.num_steps
    expected_rows = (
        total or sampler.epochs * math.ceil(sampler.dataset_size / sampler.batch_size)
    ) * sampler.batch_size
    rows = _RowBuffer(expected_rows + 6 * math.isqrt(expected_rows) + sampler.batch_size)
    offsets = [0]
    bar = tqdm(
        sampler.batches(),
        total=total,
        desc=f"schedule ({sampler.name})",
        unit="step",
        disable=not (progress and sys.stderr.isatty()),
        file=sys.stderr,
    )
    for batch in bar:
        rows.append(batch)
        offsets.append(rows.size)
    num_steps = len(offsets) - 1
    if plugin and num_steps == 0:
        raise ParamsError(f"sampler = {sampler.name!r} is invalid: the plugin yielded no batch")
    steps_per_epoch = math.ceil(num_steps / sampler.epochs) if plugin else sampler.steps_per_epoch
    return Schedule(
        indices=rows.indices[: rows.size],
        offsets=np.asarray(offsets, dtype=np.int64),
        padding=rows.padding[: rows.size],
        sampler=sampler.name,
        sampler_params=sampler.params(),
        seed=sampler.seed,
        dataset_size=sampler.dataset_size,
        steps_per_epoch=steps_per_epoch,
        normalizer=sampler.normalizer,
        metadata={"description": sampler.description},
    )


def build_schedule(
    name: str,
    *,
    dataset_size: int,
    batch_size: int,
    epochs: int,
    seed: int,
    progress: bool = False,
    **options: Any,
) -> Schedule:
    """The schedule of sampler ``name``: every step's batch, materialized (see
    :func:`build_sampler`)."""
    sampler = build_sampler(
        name, dataset_size=dataset_size, batch_size=batch_size, epochs=epochs, seed=seed, **options
    )
    return materialize(sampler, progress=progress)


def describe_samplers() -> list[dict[str, Any]]:
    """Each built-in sampler: name, the accounted sampler it is (None: no sound accountant),
    options, description."""
    return [
        {
            "name": name,
            "accounted_as": cls.accounted_as,
            "options": list(cls.OPTIONS),
            "description": cls.description,
        }
        for name, cls in SAMPLERS.items()
    ]

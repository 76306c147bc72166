"""Batch samplers and the schedule artifact: the batches actually used, and the check that they were
accounted.

``build_sampler(name, dataset_size=, batch_size=, epochs=, seed=, **options)`` streams batches
(usable as a ``torch.utils.data.DataLoader`` ``batch_sampler``); ``build_schedule`` materializes
them as a :class:`Schedule`; :func:`check_schedule` is the guard train and audit share. Each sampler
class says what it is (name, ``accounted_as``, audit law): every list of samplers elsewhere is
derived from :data:`SAMPLERS`.
"""

from dpledger.sampling.base import Batch, BatchSampler, steps_per_epoch
from dpledger.sampling.guard import (
    ACCOUNTED_SAMPLERS,
    SamplerCheck,
    check_schedule,
    schedule_description,
)
from dpledger.sampling.registry import (
    SAMPLERS,
    build_sampler,
    build_schedule,
    describe_samplers,
    materialize,
    options_for,
    sampler_class,
)
from dpledger.sampling.schedule import Schedule

__all__ = [
    "ACCOUNTED_SAMPLERS",
    "SAMPLERS",
    "Batch",
    "BatchSampler",
    "Schedule",
    "SamplerCheck",
    "build_sampler",
    "build_schedule",
    "check_schedule",
    "describe_samplers",
    "materialize",
    "options_for",
    "schedule_description",
    "sampler_class",
    "steps_per_epoch",
]

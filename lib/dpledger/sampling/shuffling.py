"""Samplers that cut an epoch's ordering of the data into consecutive batches (no sound accountant
exists).

- ``shuffle``: one uniform permutation per epoch, then fixed-size batches; O(n) memory for the
  permutation (int32 below 2³¹ examples), the one sampler here that cannot stream in O(batch).
- ``sequential``: dataset order, the same every epoch.
- ``partial-shuffle``: each window of K consecutive examples shuffled on its own, then batched
  (002 §7.1 / digest §3.6: the buffer bug; a target among the first K lands only in the first ⌈K/B⌉
  batches).
- ``batch-then-shuffle``: batches cut in dataset order, only their order shuffled each epoch
  (002 §7.2 / digest §3.7).

Each takes ``last_batch``: ``keep`` an incomplete last batch (⌈n/B⌉ steps per epoch) or ``drop`` it
(⌊n/B⌋).
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable, Iterator

import numpy as np

from dpledger import validation
from dpledger.sampling.base import (
    INDEX_DTYPE,
    Batch,
    BatchSampler,
    Membership,
    permutation,
    real_batch,
    require_int,
    steps_per_epoch,
)

LAST_BATCH_POLICIES = ("keep", "drop")
SHUFFLE_REASON = (
    "shuffling (one permutation per epoch) "
    "has no tight accountant and audits show Poisson accounting under-states its epsilon several-fold; "  # noqa: E501
    "build batches with balls-in-bins (accountant allocation) or poisson"
)


def batched(
    chunks: Iterable[np.ndarray], batch_size: int, *, drop_last: bool
) -> Iterator[np.ndarray]:
    """Cut the concatenation of ``chunks`` into batches of ``batch_size`` without materializing
    it."""
    pending: list[np.ndarray] = []
    pending_size = 0
    for chunk in chunks:
        start = 0
        while start < len(chunk):
            take = min(batch_size - pending_size, len(chunk) - start)
            pending.append(chunk[start : start + take])
            pending_size += take
            start += take
            if pending_size == batch_size:
                yield np.concatenate(pending)
                pending, pending_size = [], 0
    if pending_size and not drop_last:
        yield np.concatenate(pending)


class OrderedSampler(BatchSampler):
    """Batches are consecutive runs of an epoch's ordering of the examples (given as chunks)."""

    OPTIONS: ClassVar[tuple[str, ...]] = ("last_batch",)

    def __init__(self, *, last_batch: str = "keep", **sizes: Any) -> None:
        super().__init__(**sizes)
        validation.one_of("last_batch", last_batch, LAST_BATCH_POLICIES)
        self.last_batch = last_batch

    @property
    def drop_last(self) -> bool:
        return self.last_batch == "drop"

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.dataset_size, self.batch_size, drop_last=self.drop_last)

    def options(self) -> dict[str, Any]:
        return {"last_batch": self.last_batch}

    def epoch_order(self, epoch: int) -> Iterable[np.ndarray]:
        """The examples of epoch ``epoch`` in the order they are batched, as consecutive chunks."""
        raise NotImplementedError

    def epoch_sizes(self) -> list[int]:
        """The batch sizes of one epoch: full batches, then the short last one unless dropped."""
        full, rest = divmod(self.dataset_size, self.batch_size)
        return [self.batch_size] * full + ([] if self.drop_last or rest == 0 else [rest])

    def slot_weights(self, positions: int) -> tuple[float, ...] | None:
        """Weights of the batches a record at a uniform position in [0, positions) of the epoch's
        order lands in; None if some position falls in a dropped batch."""
        slots = np.arange(positions) // self.batch_size
        if slots.max() >= self.steps_per_epoch:
            return None
        return tuple(
            np.bincount(slots, minlength=self.steps_per_epoch).astype(np.float64) / positions
        )

    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        for indices in batched(self.epoch_order(epoch), self.batch_size, drop_last=self.drop_last):
            yield real_batch(indices)


class ShuffleSampler(OrderedSampler):
    """One fresh uniform permutation per epoch, cut into fixed batches."""

    name = "shuffle"
    description = (
        "one permutation per epoch, fixed batches (no tight accountant; "
        "Poisson accounting understates ε)"
    )
    unaccounted_reason = SHUFFLE_REASON

    def membership(self) -> Membership | None:
        weights = self.slot_weights(self.dataset_size)
        return (
            None
            if weights is None
            else Membership(
                "one slot per epoch, probability ∝ batch size", True, slot_weights=weights
            )
        )

    def epoch_order(self, epoch: int) -> Iterable[np.ndarray]:
        return [permutation(self.random_stream(epoch), self.dataset_size)]


class SequentialSampler(OrderedSampler):
    """Dataset order every epoch (no randomness: privacy amplification is nil)."""

    name = "sequential"
    description = "dataset order every epoch, no randomness"

    def membership(self) -> Membership:
        weights = (1.0,) + (0.0,) * (self.steps_per_epoch - 1)
        return Membership(
            "the first batch of every epoch", True, slot_weights=weights, same_slot_every_epoch=True
        )

    def epoch_order(self, epoch: int) -> Iterable[np.ndarray]:
        n, size = self.dataset_size, self.batch_size
        return (np.arange(lo, min(lo + size, n), dtype=INDEX_DTYPE) for lo in range(0, n, size))


class PartialShuffleSampler(OrderedSampler):
    """Known-bad: each window of ``buffer_size`` (K) consecutive examples shuffled separately, then
    batched."""

    name = "partial-shuffle"
    description = (
        "known-bad: shuffles only within windows of K consecutive examples (buffer bug, 002 §7.1)"
    )
    OPTIONS = ("last_batch", "buffer_size")

    def __init__(self, *, buffer_size: int, **options: Any) -> None:
        super().__init__(**options)
        self.buffer_size = require_int(
            "buffer_size", buffer_size, 1, what=" (the shuffle buffer K)"
        )

    def options(self) -> dict[str, Any]:
        return {**super().options(), "buffer_size": self.buffer_size}

    def membership(self) -> Membership | None:
        weights = self.slot_weights(min(self.buffer_size, self.dataset_size))
        where = (
            f"a uniform position among the first K = {self.buffer_size} of every epoch (002 §7.1)"
        )
        return None if weights is None else Membership(where, True, slot_weights=weights)

    def epoch_order(self, epoch: int) -> Iterable[np.ndarray]:
        rng = self.random_stream(epoch)
        n, window = self.dataset_size, self.buffer_size
        for lo in range(0, n, window):
            yield lo + permutation(rng, min(window, n - lo)).astype(INDEX_DTYPE)


class BatchThenShuffleSampler(OrderedSampler):
    """Known-bad: batches cut in dataset order once; only the order of the batches is shuffled each
    epoch."""

    name = "batch-then-shuffle"
    description = "known-bad: fixed consecutive batches, only their order shuffled (002 §7.2)"

    def membership(self) -> Membership | None:
        """The record's whole batch moves with it; closed form only where all batches have one
        size."""
        sizes = self.epoch_sizes()
        if len(set(sizes)) != 1:
            return None
        return Membership(
            "the first batch, at a uniform slot every epoch (002 §7.2)",
            True,
            slot_weights=(1.0,) * len(sizes),
            moves_with_batch=sizes[0],
        )

    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        order = self.random_stream(epoch).permutation(self.steps_per_epoch)
        for slot in order:
            lo = int(slot) * self.batch_size
            yield real_batch(
                np.arange(lo, min(lo + self.batch_size, self.dataset_size), dtype=INDEX_DTYPE)
            )

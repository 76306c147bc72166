"""What every batch sampler shares: sizes, seeding, the streaming interface and the DataLoader
protocol.

A sampler streams one :class:`Batch` per step. It is deterministic given its seed, and any step can
be regenerated without replaying the run: randomness comes from independent streams keyed by
(seed, step) for per-step samplers and (seed, epoch) for per-epoch ones (numpy ``SeedSequence``
spawn keys), so a resumed run draws exactly the batches it would have drawn.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from itertools import islice
from typing import Any, ClassVar, Iterator, NamedTuple

import numpy as np

from dpledger import validation
from dpledger.accounting.description import ACCOUNTED_SAMPLINGS, MechanismDescription, describe
from dpledger.errors import ParamsError

INDEX_DTYPE = np.int64


class Batch(NamedTuple):
    """One step's rows: example indices and a mask marking padding rows (zero weight in
    training)."""

    indices: np.ndarray
    padding: np.ndarray


def real_batch(indices: np.ndarray) -> Batch:
    """A batch without padding rows."""
    return Batch(np.asarray(indices, dtype=INDEX_DTYPE), np.zeros(len(indices), dtype=bool))


def permutation(rng: np.random.Generator, size: int) -> np.ndarray:
    """A uniformly random permutation of 0..size-1, in int32 where it fits (half the memory of
    int64)."""
    dtype = np.int32 if size <= np.iinfo(np.int32).max else np.int64
    order = np.arange(size, dtype=dtype)
    rng.shuffle(order)
    return order


def steps_per_epoch(dataset_size: int, batch_size: int, *, drop_last: bool = False) -> int:
    """Steps (batches, bins) per epoch: ⌈n/B⌉, or ⌊n/B⌋ when an incomplete last batch is dropped.

    The accounted samplers always use ⌈n/B⌉, so the accountant needs only the shared ``batching``
    sizes.
    """
    return dataset_size // batch_size if drop_last else math.ceil(dataset_size / batch_size)


def require_int(name: str, value: Any, low: int, high: int | None = None, *, what: str = "") -> int:
    """``value`` as an int in [low, high], else a one-line ParamsError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise validation.invalid(name, value, "it must be an integer")
    value = int(value)
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise validation.invalid(name, value, f"it must be {allowed}{what}")
    return value


@dataclass(frozen=True)
class Membership:
    """Where one example (the audited record) lands under a sampler: the law the audit's closed form
    uses.

    Either each step independently with ``step_probability``, or one slot per epoch drawn with
    ``slot_weights`` (the same slot every epoch when ``same_slot_every_epoch``).
    ``fixed_batch_size``: batch sizes do not depend on which examples are drawn (002 §3.2: the
    audit's pair then has a −1 background). ``moves_with_batch``: the size of the batch the record
    always shares, where batches are fixed once and only reordered (002 §7.2), else None.
    ``placement`` says it in words.
    """

    placement: str
    fixed_batch_size: bool
    step_probability: float | None = None
    slot_weights: tuple[float, ...] = ()
    same_slot_every_epoch: bool = False
    moves_with_batch: int | None = None


class BatchSampler(ABC):
    """A batch sampler over ``dataset_size`` examples for ``epochs`` epochs, and the one place that
    says what it is: ``name``, ``description`` (in words), ``accounted_as`` (the accounted sampling
    law of :data:`dpledger.accounting.description.ACCOUNTED_SAMPLINGS` it is, whose sentence the
    ledger prints; None with ``unaccounted_reason`` when no sound accountant exists),
    :meth:`mechanism_description` (the run as its accountant reads it) and :meth:`membership` (the
    audit's closed-form model). Every list of samplers elsewhere is derived from these.

    Iterating yields each step's real (non-padding) indices as a list, so an instance is a
    ``torch.utils.data.DataLoader`` ``batch_sampler``; :meth:`batches` yields full :class:`Batch`
    rows, padding included. ``normalizer`` is the fixed B that the gradient sum is divided by
    (pad/truncate), or None.
    """

    name: ClassVar[str]
    accounted_as: ClassVar[str | None] = None
    unaccounted_reason: ClassVar[str] = "no sound accountant exists for it"
    description: ClassVar[str] = ""
    OPTIONS: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.accounted_as is not None and cls.accounted_as not in ACCOUNTED_SAMPLINGS:
            raise TypeError(
                f"{cls.__name__}.accounted_as = {cls.accounted_as!r} is not an accounted sampler "
                f"({', '.join(ACCOUNTED_SAMPLINGS)})"
            )

    def __init__(self, *, dataset_size: int, batch_size: int, epochs: int, seed: int) -> None:
        self.dataset_size = require_int("dataset_size", dataset_size, 1)
        self.batch_size = require_int(
            "batch_size",
            batch_size,
            1,
            self.dataset_size,
            what=f" (the dataset has {self.dataset_size} examples)",
        )
        self.epochs = require_int("epochs", epochs, 1)
        self.seed = require_int("seed", seed, 0)

    def random_stream(self, *key: int) -> np.random.Generator:
        """The independent random stream of this sampler's seed named by ``key`` (a SeedSequence
        spawn key: the epoch or step), so every draw is reproducible from (seed, key) alone."""
        return np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=key))
        )

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.dataset_size, self.batch_size)

    @property
    def num_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    @property
    def normalizer(self) -> int | None:
        return None

    def options(self) -> dict[str, Any]:
        """The sampler's own options (beyond sizes and seed), for the schedule header."""
        return {}

    def membership(self) -> Membership | None:
        """The audited record's law of membership in closed form, or None: the audit then runs the
        sampler."""
        return None

    def mechanism_description(self, **accounted: Any) -> MechanismDescription:
        """This sampler's run (its n, B and epochs) as its accountant reads it, under the law it is
        accounted as; ``accounted`` adds σ, the group size or the mechanism as :func:`describe`
        takes them. A sampler no sound accountant covers is refused with the reason."""
        if self.accounted_as is None:
            raise ParamsError(
                f"sampler = {self.name!r} cannot be accounted: {self.unaccounted_reason}"
            )
        sizes = {
            "dataset_size": self.dataset_size,
            "batch_size": self.batch_size,
            "epochs": self.epochs,
        }
        return describe(sampler=self.accounted_as, **sizes, **accounted)

    def params(self) -> dict[str, Any]:
        """Everything that, with the seed, determines the batches."""
        return {"batch_size": self.batch_size, "epochs": self.epochs, **self.options()}

    def batches(self, start: int = 0) -> Iterator[Batch]:
        """Batches of steps ``start``, ``start + 1``, ..., ``num_steps - 1``."""
        require_int("start", start, 0, self.num_steps)
        first_epoch, skip = divmod(start, self.steps_per_epoch)
        for epoch in range(first_epoch, self.epochs):
            epoch_batches = self.epoch_batches(epoch)
            yield from islice(epoch_batches, skip, None) if epoch == first_epoch else epoch_batches

    @abstractmethod
    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        """The ``steps_per_epoch`` batches of epoch ``epoch``."""

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches():
            yield batch.indices[~batch.padding].tolist()

    def __len__(self) -> int:
        return self.num_steps

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dataset_size={self.dataset_size}, seed={self.seed}, "
            f"{self.params()})"
        )


class PerStepSampler(BatchSampler):
    """A sampler whose steps are independent draws: step t comes from its own stream (seed, t)."""

    @abstractmethod
    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """One step's indices from the step's stream."""

    def batch(self, step: int) -> Batch:
        """The batch of step ``step``, regenerated from its own stream."""
        return real_batch(self.draw(self.random_stream(step)))

    def batches(self, start: int = 0) -> Iterator[Batch]:
        require_int("start", start, 0, self.num_steps)
        return (self.batch(step) for step in range(start, self.num_steps))

    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        first = epoch * self.steps_per_epoch
        return (self.batch(step) for step in range(first, first + self.steps_per_epoch))

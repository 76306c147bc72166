"""Balls-in-bins batching (004 §3, Def. 3.1): every example lands in one of b bins, uniformly and
independently.

Implemented as the paper does: bin sizes (c_1..c_b) ~ Multinomial(n, 1/b each), one shuffle of the
data, and bin i is the next c_i examples of the shuffled stream. ``balls-in-bins`` draws this once
and reuses the same bins, in the same order, every epoch (each example at a fixed in-epoch slot);
``balls-in-bins-redrawn`` draws fresh bins every epoch. Default b = ⌈n/B⌉, so bins hold ≤ B on
average.

``pad_truncate`` (004 §5.2.1) makes every batch exactly B rows: a bin with c < B gets B − c padding
rows (index 0, marked, zero gradient), a bin with c > B keeps its first B examples; the gradient
sum is always divided by B. Truncated examples count as zero clipped gradients, so the privacy
analysis is unchanged. With fixed bins the same examples are truncated in every epoch.
O(n) memory for the one permutation (int32 below 2³¹ examples).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Iterator

import numpy as np

from dpledger.sampling.base import (
    INDEX_DTYPE,
    Batch,
    BatchSampler,
    Membership,
    permutation,
    real_batch,
    require_int,
)

PADDING_INDEX = 0


def draw_bins(
    rng: np.random.Generator, dataset_size: int, bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """(shuffled order, offsets): bin i is ``order[offsets[i]:offsets[i+1]]``."""
    sizes = rng.multinomial(dataset_size, np.full(bins, 1.0 / bins))
    order = permutation(rng, dataset_size)
    return order, np.concatenate([[0], np.cumsum(sizes)])


def pad_or_truncate(members: np.ndarray, size: int) -> Batch:
    """Exactly ``size`` rows: the first ``size`` members, then marked padding rows."""
    kept = members[:size].astype(INDEX_DTYPE)
    missing = size - kept.shape[0]
    indices = np.concatenate([kept, np.full(missing, PADDING_INDEX, dtype=INDEX_DTYPE)])
    padding = np.concatenate([np.zeros(kept.shape[0], dtype=bool), np.ones(missing, dtype=bool)])
    return Batch(indices, padding)


class BallsInBinsSampler(BatchSampler):
    """Balls-in-bins with bins fixed across epochs (004's implementation: one multinomial, one
    shuffle)."""

    name = "balls-in-bins"
    accounted_as = "balls-in-bins"
    description = "each example in one of b = ⌈n/B⌉ random bins, the same bins every epoch (004)"
    placement = "one uniform bin, the same in every epoch"
    same_bins_every_epoch = True
    OPTIONS = ("bins", "pad_truncate")

    def __init__(
        self, *, bins: int | None = None, pad_truncate: bool = False, **sizes: Any
    ) -> None:
        super().__init__(**sizes)
        default_bins = super().steps_per_epoch
        self.bins = (
            default_bins
            if bins is None
            else require_int("bins", bins, 1, what=" (bins per epoch, b)")
        )
        self.pad_truncate = bool(pad_truncate)

    @property
    def steps_per_epoch(self) -> int:
        return self.bins

    @property
    def normalizer(self) -> int | None:
        return self.batch_size if self.pad_truncate else None

    def options(self) -> dict[str, Any]:
        return {"bins": self.bins, "pad_truncate": self.pad_truncate}

    def membership(self) -> Membership | None:
        """One uniform bin; pad/truncate has no closed form (a truncated record sits out its
        epoch)."""
        if self.pad_truncate:
            return None
        return Membership(
            self.placement,
            False,
            slot_weights=(1.0,) * self.bins,
            same_slot_every_epoch=self.same_bins_every_epoch,
        )

    def epoch_bins(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        return self.fixed_bins

    @cached_property
    def fixed_bins(self) -> tuple[np.ndarray, np.ndarray]:
        return draw_bins(self.random_stream(), self.dataset_size, self.bins)

    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        order, offsets = self.epoch_bins(epoch)
        for lo, hi in zip(offsets[:-1], offsets[1:]):
            members = order[lo:hi]
            yield (
                pad_or_truncate(members, self.batch_size)
                if self.pad_truncate
                else real_batch(members)
            )


class BallsInBinsRedrawnSampler(BallsInBinsSampler):
    """Balls-in-bins with fresh bins every epoch."""

    name = "balls-in-bins-redrawn"
    accounted_as = "balls-in-bins-redrawn"
    description = "each example in one of b = ⌈n/B⌉ random bins, redrawn every epoch"
    placement = "one uniform bin, redrawn every epoch"
    same_bins_every_epoch = False

    def epoch_bins(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        return draw_bins(self.random_stream(epoch), self.dataset_size, self.bins)

"""Where the audited record lands under each sampler: the batched-Gaussian model to simulate and score.

The audited pair of datasets follows the sampler (002 §3.2, §7): with fixed batch sizes (shuffle,
sequential, partial shuffle, fixed-size subsets) the conjectured worst case D = (+1, −1, …, −1),
D' = (⊥, −1, …, −1), whose −1 background marks the batch holding ⊥; with random batch sizes (Poisson,
balls-in-bins) the proven worst case (+1, 0, …, 0), (⊥, 0, …, 0); for batch-then-shuffle the
paper's adapted worst case (the target's whole batch +1, every other record −1). Samplers without a
closed form (plugins, pad/truncate, a dropped last batch that can hold the record) are run for real:
the record's step memberships come from the sampler itself (``PatternModel``), one sampler run per
game, so those audits are slower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpledger.audit.models import BgmModel, PatternModel, SlotModel, StepMixtureModel
from dpledger.errors import ParamsError
from dpledger.sampling.plugin import PluginSampler
from dpledger.sampling.registry import build_sampler

TARGET_INDEX = 0
SCORE_PATTERNS = 512
PAIR_MINUS_ONE = "D = (+1, -1, ..., -1) vs D' = (⊥, -1, ..., -1)"
PAIR_ZERO = "D = (+1, 0, ..., 0) vs D' = (⊥, 0, ..., 0)"
PAIR_BATCH = "D: the target's batch all +1, every other record -1; D': the target zeroed out"


@dataclass(frozen=True)
class AuditedSampler:
    """A sampler with its sizes, the model of where the audited record lands, and the dataset pair."""

    sampler: str
    dataset_size: int
    batch_size: int
    epochs: int
    steps_per_epoch: int
    model: BgmModel
    pair: str
    placement: str

    @property
    def simulated_by_sampler(self) -> bool:
        """True when games run the sampler itself (one sampler run per game: slower)."""
        return isinstance(self.model, PatternModel)


def _epoch_sizes(dataset_size: int, batch_size: int, drop_last: bool) -> list[int]:
    full, rest = divmod(dataset_size, batch_size)
    return [batch_size] * full + ([] if drop_last or rest == 0 else [rest])


def _slot_weights_of_positions(positions: int, batch_size: int, steps: int) -> tuple[float, ...] | None:
    """Weights of the slots a record at a uniform position in [0, positions) lands in; None if some
    position falls in a dropped batch."""
    slots = np.arange(positions) // batch_size
    if slots.max() >= steps:
        return None
    return tuple(np.bincount(slots, minlength=steps).astype(np.float64) / positions)


def audited_sampler(
    sampler: str,
    *,
    dataset_size: int,
    batch_size: int,
    epochs: int,
    noise_multiplier: float,
    options: dict[str, Any] | None = None,
    seed: int = 0,
) -> AuditedSampler:
    """The batched-Gaussian model of ``sampler`` (a built-in name or ``module:callable``)."""
    options = dict(options or {})
    built = build_sampler(sampler, dataset_size=dataset_size, batch_size=batch_size, epochs=epochs, seed=seed, **options)
    analytic = _analytic_model(sampler, built, noise_multiplier) if sampler in _ANALYTIC else None
    if analytic is None:
        model = _pattern_model(sampler, dataset_size, batch_size, epochs, noise_multiplier, options, seed)
        analytic = (model, PAIR_ZERO, "memberships drawn by running the sampler itself (one run per game)")
    return AuditedSampler(sampler, dataset_size, batch_size, epochs, _steps_per_epoch(built, analytic[0]), *analytic)


def _steps_per_epoch(built: Any, model: BgmModel) -> int:
    """The sampler's steps per epoch; a plugin knows its length only once run: its pilot runs' length per epoch."""
    if isinstance(built, PluginSampler):
        return math.ceil(model.score_patterns.shape[1] / built.epochs)
    return built.steps_per_epoch


def _analytic_model(name: str, built: Any, sigma: float) -> tuple[BgmModel, str, str] | None:
    """The closed-form model of a built-in sampler, or None where its law has no closed form here."""
    n, size, epochs, steps = built.dataset_size, built.batch_size, built.epochs, built.steps_per_epoch
    if name == "poisson":
        model = StepMixtureModel(sigma, steps * epochs, built.sample_rate, 1.0, 0.0)
        return model, PAIR_ZERO, "each step independently with probability q"
    if name == "fixed":
        return StepMixtureModel(sigma, steps * epochs, size / n, 2.0, 1.0), PAIR_MINUS_ONE, "each step independently with probability B/n"
    if name in ("balls-in-bins", "balls-in-bins-redrawn"):
        if built.pad_truncate:
            return None
        fixed = name == "balls-in-bins"
        model = SlotModel(sigma, epochs, (1.0,) * steps, 1.0, 0.0, same_slot_every_epoch=fixed)
        where = "one uniform bin, the same in every epoch" if fixed else "one uniform bin, redrawn every epoch"
        return model, PAIR_ZERO, where
    sizes = _epoch_sizes(n, size, built.drop_last)
    if name == "shuffle":
        weights = _slot_weights_of_positions(n, size, len(sizes))
        if weights is None:
            return None
        return SlotModel(sigma, epochs, weights, 2.0, 1.0), PAIR_MINUS_ONE, "one slot per epoch, probability ∝ batch size"
    if name == "sequential":
        weights = (1.0,) + (0.0,) * (len(sizes) - 1)
        model = SlotModel(sigma, epochs, weights, 2.0, 1.0, same_slot_every_epoch=True)
        return model, PAIR_MINUS_ONE, "the first batch of every epoch"
    if name == "partial-shuffle":
        weights = _slot_weights_of_positions(min(built.buffer_size, n), size, len(sizes))
        if weights is None:
            return None
        where = f"a uniform position among the first K = {built.buffer_size} of every epoch (002 §7.1)"
        return SlotModel(sigma, epochs, weights, 2.0, 1.0), PAIR_MINUS_ONE, where
    if name == "batch-then-shuffle":
        if len(set(sizes)) != 1:
            return None
        first = sizes[0]
        model = SlotModel(sigma, epochs, (1.0,) * len(sizes), 2.0 * first, 2.0 * first - 1.0)
        return model, PAIR_BATCH, "the first batch, at a uniform slot every epoch (002 §7.2)"
    return None


_ANALYTIC = frozenset(
    {"poisson", "fixed", "balls-in-bins", "balls-in-bins-redrawn", "shuffle", "sequential", "partial-shuffle", "batch-then-shuffle"}
)


def record_memberships(
    sampler: str, *, dataset_size: int, batch_size: int, epochs: int, options: dict[str, Any], seed: int
) -> np.ndarray:
    """How many times the audited record (index 0) is in each step's batch, padding rows excluded."""
    built = build_sampler(sampler, dataset_size=dataset_size, batch_size=batch_size, epochs=epochs, seed=seed, **options)
    return np.asarray(
        [np.count_nonzero(batch.indices[~batch.padding] == TARGET_INDEX) for batch in built.batches()],
        dtype=np.float64,
    )


def _pattern_model(
    sampler: str, dataset_size: int, batch_size: int, epochs: int, sigma: float, options: dict[str, Any], seed: int
) -> PatternModel:
    """Score patterns from SCORE_PATTERNS pilot runs (a stream of their own); games draw fresh runs."""
    sizes = {"dataset_size": dataset_size, "batch_size": batch_size, "epochs": epochs, "options": options}

    def draw(rng: np.random.Generator, games: int) -> np.ndarray:
        rows = [record_memberships(sampler, seed=int(s), **sizes) for s in rng.integers(0, 2**62, size=games)]
        if len({row.shape[0] for row in rows}) != 1:
            raise ParamsError(f"sampler = {sampler!r} is invalid for the audit: its number of steps varies with the seed")
        return np.stack(rows)

    pilot = draw(np.random.default_rng(np.random.SeedSequence([seed, 0x5C0])), SCORE_PATTERNS)
    return PatternModel(sigma, pilot, draw, 1.0, 0.0)

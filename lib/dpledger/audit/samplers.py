"""Where the audited record lands under each sampler: the batched-Gaussian model to simulate and
score.

The audited pair of datasets follows the sampler (002 §3.2, §7): with fixed batch sizes (shuffle,
sequential, partial shuffle, fixed-size subsets) the conjectured worst case D = (+1, −1, …, −1),
D' = (⊥, −1, …, −1), whose −1 background marks the batch holding ⊥; with random batch sizes
(Poisson, balls-in-bins) the proven worst case (+1, 0, …, 0), (⊥, 0, …, 0); for batch-then-shuffle
the paper's adapted worst case (the target's whole batch +1, every other record −1). Each sampler
states its law of membership itself (:meth:`dpledger.sampling.base.BatchSampler.membership`); the
model here follows from that law, never from the sampler's name. Samplers without a closed form
(plugins that state none, pad/truncate, a dropped last batch that can hold the record) are run for
real: the record's step memberships come from the sampler itself (``PatternModel``), one sampler run
per game, so those audits are slower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpledger.audit.models import BgmModel, PatternModel, SlotModel, StepMixtureModel
from dpledger.errors import ParamsError
from dpledger.sampling.base import BatchSampler
from dpledger.sampling.plugin import PluginSampler
from dpledger.sampling.registry import build_sampler

TARGET_INDEX = 0
SCORE_PATTERNS = 512
PAIR_MINUS_ONE = "D = (+1, -1, ..., -1) vs D' = (⊥, -1, ..., -1)"
PAIR_ZERO = "D = (+1, 0, ..., 0) vs D' = (⊥, 0, ..., 0)"
PAIR_BATCH = "D: the target's batch all +1, every other record -1; D': the target zeroed out"


@dataclass(frozen=True)
class AuditedSampler:
    """A sampler with its sizes, the model of where the audited record lands, and the dataset
    pair."""

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
    built = build_sampler(
        sampler,
        dataset_size=dataset_size,
        batch_size=batch_size,
        epochs=epochs,
        seed=seed,
        **options,
    )
    analytic = _analytic_model(built, noise_multiplier)
    if analytic is None:
        model = _pattern_model(
            sampler, dataset_size, batch_size, epochs, noise_multiplier, options, seed
        )
        analytic = (
            model,
            PAIR_ZERO,
            "memberships drawn by running the sampler itself (one run per game)",
        )
    return AuditedSampler(
        sampler, dataset_size, batch_size, epochs, _steps_per_epoch(built, analytic[0]), *analytic
    )


def _steps_per_epoch(built: Any, model: BgmModel) -> int:
    """The sampler's steps per epoch; a plugin knows its length only once run: its pilot runs'
    length per epoch."""
    if isinstance(built, PluginSampler):
        return math.ceil(model.score_patterns.shape[1] / built.epochs)
    return built.steps_per_epoch


def _analytic_model(built: BatchSampler, sigma: float) -> tuple[BgmModel, str, str] | None:
    """The closed-form model of the sampler's own law of membership
    (:meth:`BatchSampler.membership`), or None."""
    law = built.membership()
    if law is None:
        return None
    if law.moves_with_batch is not None:
        shift, pair = 2.0 * law.moves_with_batch, PAIR_BATCH
    elif law.fixed_batch_size:
        shift, pair = 2.0, PAIR_MINUS_ONE
    else:
        shift, pair = 1.0, PAIR_ZERO
    if law.step_probability is not None:
        model: BgmModel = StepMixtureModel(
            sigma, built.num_steps, law.step_probability, shift, shift - 1.0
        )
    else:
        model = SlotModel(
            sigma,
            built.epochs,
            law.slot_weights,
            shift,
            shift - 1.0,
            same_slot_every_epoch=law.same_slot_every_epoch,
        )
    return model, pair, law.placement


def record_memberships(
    sampler: str,
    *,
    dataset_size: int,
    batch_size: int,
    epochs: int,
    options: dict[str, Any],
    seed: int,
) -> np.ndarray:
    """How many times the audited record (index 0) is in each step's batch, padding rows
    excluded."""
    built = build_sampler(
        sampler,
        dataset_size=dataset_size,
        batch_size=batch_size,
        epochs=epochs,
        seed=seed,
        **options,
    )
    return np.asarray(
        [
            np.count_nonzero(batch.indices[~batch.padding] == TARGET_INDEX)
            for batch in built.batches()
        ],
        dtype=np.float64,
    )


def _pattern_model(
    sampler: str,
    dataset_size: int,
    batch_size: int,
    epochs: int,
    sigma: float,
    options: dict[str, Any],
    seed: int,
) -> PatternModel:
    """Score patterns from SCORE_PATTERNS pilot runs (a stream of their own); games draw fresh
    runs."""
    sizes = {
        "dataset_size": dataset_size,
        "batch_size": batch_size,
        "epochs": epochs,
        "options": options,
    }

    def draw(rng: np.random.Generator, games: int) -> np.ndarray:
        rows = [
            record_memberships(sampler, seed=int(s), **sizes)
            for s in rng.integers(0, 2**62, size=games)
        ]
        if len({row.shape[0] for row in rows}) != 1:
            raise ParamsError(
                f"sampler = {sampler!r} is invalid for the audit: "
                "its number of steps varies with the seed"
            )
        return np.stack(rows)

    pilot = draw(np.random.default_rng(np.random.SeedSequence([seed, 0x5C0])), SCORE_PATTERNS)
    return PatternModel(sigma, pilot, draw, 1.0, 0.0)

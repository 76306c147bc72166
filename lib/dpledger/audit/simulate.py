"""Run many distinguishing games of a batched-Gaussian model in memory-bounded chunks.

Chunk i draws from its own stream (``SeedSequence(seed).spawn``), so results depend on the seed and
the chunk size only, not on the number of worker threads. numpy chunks run on threads (numpy
releases the GIL inside its kernels); on a GPU the chunks run one after another, larger.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from dpledger import validation
from dpledger.audit.backend import Backend
from dpledger.audit.models import BgmModel, PatternModel, SlotModel, StepMixtureModel

CPU_CHUNK_ENTRIES = 1 << 21
GPU_CHUNK_ENTRIES = 1 << 26


@dataclass(frozen=True)
class GameScores:
    """Scores of ``present`` games (run on D) and ``absent`` games (run on D'), one per game."""

    present: np.ndarray
    absent: np.ndarray

    @property
    def games_per_side(self) -> int:
        return int(self.present.shape[0])

    def prefix(self, games_per_side: int) -> "GameScores":
        """The first games of each side: an audit with fewer observations (games are i.i.d.)."""
        return GameScores(self.present[:games_per_side], self.absent[:games_per_side])


def entries_per_game(model: BgmModel) -> int:
    """Values one game draws (its cost in time and in chunk memory)."""
    if isinstance(model, SlotModel):
        rows = 1 if model.same_slot_every_epoch else model.epochs
        return rows * int(np.count_nonzero(np.asarray(model.slot_weights) > 0))
    if isinstance(model, StepMixtureModel):
        return model.steps
    if isinstance(model, PatternModel):
        return int(model.score_patterns.shape[1] + model.score_patterns.shape[0])
    raise TypeError(f"unknown model {type(model).__name__}")


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def simulate_scores(
    model: BgmModel,
    games_per_side: int,
    *,
    seed: int,
    backend: Backend,
    workers: int | None = None,
    chunk_games: int | None = None,
    progress: bool = True,
) -> GameScores:
    """Scores of ``games_per_side`` games on D and as many on D' (observations = 2 ×
    games_per_side)."""
    validation.at_least("games per side", games_per_side, 1, where="audit")
    budget = CPU_CHUNK_ENTRIES if backend.device == "cpu" else GPU_CHUNK_ENTRIES
    chunk = chunk_games or max(1, budget // entries_per_game(model))
    starts = list(range(0, games_per_side, chunk))
    streams = np.random.SeedSequence(seed).spawn(len(starts))
    present = np.empty(games_per_side, dtype=np.float64)
    absent = np.empty(games_per_side, dtype=np.float64)

    def run(index: int) -> int:
        start = starts[index]
        games = min(chunk, games_per_side - start)
        generator = backend.generator(streams[index])
        for side, out in ((True, present), (False, absent)):
            x = model.simulate(backend, generator, games, side)
            out[start : start + games] = backend.to_numpy(model.score(backend, x))
        return games

    bar = tqdm(
        total=2 * games_per_side,
        unit="obs",
        unit_scale=True,
        desc="audit",
        disable=not (progress and sys.stderr.isatty()),
        leave=False,
    )
    threads = (workers or default_workers()) if backend.parallel_chunks else 1
    with bar, ThreadPoolExecutor(max_workers=threads) as pool:
        for games in pool.map(run, range(len(starts))):
            bar.update(2 * games)
    return GameScores(present, absent)

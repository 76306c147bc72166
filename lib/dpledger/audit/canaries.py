"""Gradient canaries of the one-run audit, train side: where they land, and what the run released
there.

m canaries C·e_j on distinct coordinates j of the trainable parameters (drawn with a recorded seed),
each "in" with probability 1/2, placed in steps exactly as the schedule's sampler places a real
example (its :meth:`dpledger.sampling.base.BatchSampler.membership`). The recorder keeps, after each
``engine.step()``, the canary coordinates of the released noisy sum (after the data-parallel
all-reduce; rank 0 keeps them, as it alone adds the noise) and of the real examples' clipped sum
(rank 0's, measured apart from the noise): ``engine.last_watched``, gathered by the engine.
The canaries never enter the model: :func:`observe` adds them to this side copy, after removing the
real examples' clipped sum (the adversary knows the other records; see :mod:`dpledger.audit.one_run`
for why that is the run's own observation and a valid audit). The audit stage reads
``canaries.npz``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpledger import io
from dpledger.engine.watched import Coordinates
from dpledger.errors import DpledgerError, ParamsError
from dpledger.params.bounds import refuse_beyond_memory
from dpledger.sampling.registry import build_sampler, options_for
from dpledger.sampling.schedule import Schedule

ARTIFACT = "canaries.npz"
PARTS = "canaries.part-*.npz"  # the rows of each checkpoint until the run ends
# the canary plan's own stream of the run seed: independent of noise, batches and init
SEED_TAG = 0xCA7A


@dataclass(frozen=True)
class CanaryLaw:
    """Where one canary lands, as the schedule's sampler places a real example: each step
    independently
    with ``step_probability``, or one slot of ``slot_weights`` per epoch (the same slot every epoch
    when ``same_slot_every_epoch``)."""

    placement: str
    num_steps: int
    epochs: int
    step_probability: float | None = None
    slot_weights: tuple[float, ...] = ()
    same_slot_every_epoch: bool = False

    def placed(self, seed: int, canaries: int) -> np.ndarray:
        """(canaries × steps) bool: where each canary would be in a batch, from the plan's seed."""
        if self.step_probability is not None:
            rows = [
                stream(seed, 1, t).random(canaries) < self.step_probability
                for t in range(self.num_steps)
            ]
            return np.stack(rows, axis=1) if rows else np.zeros((canaries, 0), dtype=bool)
        weights = np.asarray(self.slot_weights, dtype=np.float64)
        weights = weights / weights.sum()
        epochs = 1 if self.same_slot_every_epoch else self.epochs
        slots = np.stack(
            [stream(seed, 2, e).choice(weights.size, canaries, p=weights) for e in range(epochs)]
        )
        slots = np.repeat(slots, self.epochs // epochs, axis=0)  # (epochs × canaries)
        placed = slots[:, :, None] == np.arange(weights.size)[None, None, :]
        return placed.transpose(1, 0, 2).reshape(canaries, self.num_steps)


def stream(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


def canary_law(schedule: Schedule) -> CanaryLaw:
    """The schedule's sampler's own law of membership; refused where the sampler states none."""
    params = dict(schedule.sampler_params)
    sampler = build_sampler(
        schedule.sampler,
        dataset_size=schedule.dataset_size,
        batch_size=params["batch_size"],
        epochs=params["epochs"],
        seed=schedule.seed,
        **options_for(schedule.sampler, **params),
    )
    law = sampler.membership()
    if law is None:
        raise ParamsError(
            f"audit.one_run: sampler {schedule.sampler!r} states no closed-form law of membership "
            "(plugins, pad_truncate, a droppable last batch), "
            "so canaries cannot be placed as it places an example"
        )
    if law.step_probability is not None:
        return CanaryLaw(
            law.placement, schedule.num_steps, sampler.epochs, step_probability=law.step_probability
        )
    if len(law.slot_weights) * sampler.epochs != schedule.num_steps:
        raise ParamsError(
            f"audit.one_run: sampler {schedule.sampler!r} has {schedule.num_steps} steps, "
            f"not {sampler.epochs} epochs × {len(law.slot_weights)} slots; "
            "set audit.one_run.enabled: false"
        )
    return CanaryLaw(
        law.placement,
        schedule.num_steps,
        sampler.epochs,
        slot_weights=tuple(law.slot_weights),
        same_slot_every_epoch=law.same_slot_every_epoch,
    )


@dataclass(frozen=True)
class CanaryPlan:
    """The canaries of one run: flat coordinates (in ``engine.parameter_names`` order), which are
    in,
    and the seed of their placements. Drawn from ``seed`` alone, before training."""

    seed: int
    coordinates: np.ndarray
    included: np.ndarray

    @classmethod
    def draw(cls, run_seed: int, requested: int, trainable: int) -> "CanaryPlan":
        """min(``requested``, ``trainable``) distinct coordinates, each in with probability 1/2."""
        seed = int(np.random.SeedSequence([run_seed, SEED_TAG]).generate_state(1)[0])
        canaries = min(requested, trainable)
        rng = stream(seed, 0)
        coordinates = np.sort(rng.choice(trainable, canaries, replace=False)).astype(np.int64)
        return cls(seed, coordinates, rng.random(canaries) < 0.5)


class CanaryRecorder:
    """Reads the canary coordinates of each step's released noisy sum (``raw``) and of the real
    examples' clipped sum in it (``real``), a row per step, units of the clip norm C."""

    def __init__(self, plan: CanaryPlan, engine: Any, num_steps: int, clip_norm: float) -> None:
        refuse_beyond_memory(
            f"audit.one_run.canaries = {plan.coordinates.size} observed over {num_steps} steps",
            8 * plan.coordinates.size * num_steps,
            "lower audit.one_run.canaries",
        )
        self.plan, self.engine, self.clip_norm = plan, engine, float(clip_norm)
        self._saved = 0  # rows kept on disk so far
        self._pending: list[tuple[int, torch.Tensor]] = []  # rows not yet copied to the host
        self._raw = np.full((num_steps, plan.coordinates.size), np.nan, dtype=np.float32)
        self._real = np.full_like(self._raw, np.nan)
        sizes = np.array([p.numel() for p in engine.params], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        owner = np.searchsorted(starts, plan.coordinates, side="right") - 1
        device = engine.params[0].device
        # coordinates are sorted, so gathering parameter by parameter keeps their order
        self.coordinates = Coordinates(
            tuple(
                (int(i), torch.from_numpy(plan.coordinates[owner == i] - starts[i]).to(device))
                for i in np.unique(owner)
            )
        )
        engine.watch(self.coordinates)

    def record(self, step: int) -> None:
        """Keep the canary coordinates of the noisy sum the engine released at ``step`` and of the
        real examples' clipped sum in it (kept on the device until the next ``save``)."""
        watched = self.engine.last_watched
        if watched is None:
            raise DpledgerError(f"audit.one_run: the engine released no noisy sum at step {step}")
        self._pending.append((step, watched.float()))

    def _to_host(self) -> None:
        """The rows recorded since the last call, into ``raw`` and ``real``: one copy to the host
        per checkpoint, none per step (a step never waits for the device)."""
        if self._pending:
            steps = [step for step, _ in self._pending]
            rows = torch.stack([rows for _, rows in self._pending]).cpu().numpy() / self.clip_norm
            self._raw[steps], self._real[steps] = rows[:, 0], rows[:, 1]
            self._pending = []

    @property
    def raw(self) -> np.ndarray:
        """(steps × canaries) released noisy sum at the canary coordinates, units of C (NaN where
        not recorded)."""
        self._to_host()
        return self._raw

    @property
    def real(self) -> np.ndarray:
        """(steps × canaries) the real examples' clipped sum there, units of C."""
        self._to_host()
        return self._real

    def save(self, folder: Path, key: str, steps_done: int) -> None:
        """Keep what was recorded up to ``steps_done``: at a checkpoint only the rows since the last
        one, as a part file (a checkpoint then writes O(rows) bytes, not the whole record); once the
        last step is done, the whole record as ``canaries.npz`` and the parts are removed."""
        self._to_host()
        if steps_done == self.raw.shape[0]:
            _write(
                folder / ARTIFACT,
                raw=self.raw,
                real=self.real,
                coordinates=self.plan.coordinates,
                included=self.plan.included,
                seed=np.array(self.plan.seed),
                key=np.array(key),
                noise_multiplier_used=np.array(self.engine.noise_multiplier),
            )
            for part in folder.glob(PARTS):
                part.unlink()
        elif steps_done > self._saved:
            name = f"{ARTIFACT.removesuffix('.npz')}.part-{self._saved:09d}-{steps_done:09d}.npz"
            rows = slice(self._saved, steps_done)
            _write(folder / name, raw=self.raw[rows], real=self.real[rows], key=np.array(key))
        self._saved = steps_done

    def resume(self, folder: Path, key: str, steps_done: int) -> None:
        """Reload the rows before ``steps_done`` recorded by the same run (same ``key``): from the
        whole record or from consecutive part files; rows not found stay missing (NaN), as do those
        of a record without the real examples' clipped sums (an older version's)."""
        whole = folder / ARTIFACT
        if whole.exists():
            saved = load_observations(whole)
            same = str(saved["key"]) == key and "real" in saved
            if same and saved["raw"].shape == self.raw.shape:
                self.raw[:steps_done] = saved["raw"][:steps_done]
                self.real[:steps_done] = saved["real"][:steps_done]
                self._saved = steps_done
                return
        for part in sorted(folder.glob(PARTS)):
            start, end = (int(x) for x in part.name.removesuffix(".npz").split("-")[-2:])
            saved = load_observations(part)
            other = str(saved["key"]) != key or "real" not in saved
            if other or start != self._saved or end > steps_done:
                continue
            self.raw[start:end], self.real[start:end] = saved["raw"], saved["real"]
            self._saved = end


def _write(path: Path, **arrays: np.ndarray) -> None:
    """Save ``arrays`` atomically, uncompressed: noisy sums do not compress, compressing them cost
    more than the recording itself."""
    with io.atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **arrays)


def recorder_for(
    enabled: bool, requested: int, run_seed: int, engine: Any, schedule: Schedule, clip_norm: float
):
    """The recorder of the run's canaries, or None when the one-run audit is off. It records
    whatever the sampler: placements are drawn only by the audit (:class:`CanaryLaw`)."""
    if not enabled:
        return None
    plan = CanaryPlan.draw(run_seed, requested, engine.numel)
    return CanaryRecorder(plan, engine, schedule.num_steps, clip_norm)


def load_observations(path: Path) -> dict[str, np.ndarray]:
    """The arrays of ``canaries.npz``."""
    with np.load(path) as saved:
        return {name: saved[name] for name in saved.files}


def observe(
    raw: np.ndarray,
    real: np.ndarray,
    included: np.ndarray,
    placed: np.ndarray,
) -> np.ndarray:
    """(canaries × steps) observations: the released coordinates ``raw`` less the real examples'
    clipped sum ``real`` there (both steps × canaries, units of C; the adversary knows the other
    records, :mod:`dpledger.audit.one_run`), plus 1 (the canary C·e_j) where a canary is in and
    placed."""
    residual = raw.astype(np.float64) - real.astype(np.float64)
    return residual.T + (included[:, None] & placed)

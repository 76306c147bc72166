"""Fixtures for the train-stage tests: a project folder with a calibration record and a schedule (no tests here).

The record and schedule are built directly from their contracts (not by the calibrate/schedule
stages), so these tests exercise the train stage alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from dpledger.accounting.record import CalibrationRecord
from dpledger.sampling.schedule import Schedule

TRAIN_SIZE = 1438  # the default digits split


def poisson_schedule(dataset_size: int, batch_size: int, epochs: int, seed: int, sampler: str = "poisson") -> Schedule:
    rng = np.random.default_rng(seed)
    steps_per_epoch = int(round(dataset_size / batch_size))
    batches = [np.flatnonzero(rng.random(dataset_size) < batch_size / dataset_size) for _ in range(steps_per_epoch * epochs)]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in batches])])
    indices = np.concatenate(batches)
    return Schedule(indices=indices, offsets=offsets, padding=np.zeros(len(indices), bool), sampler=sampler,
                    sampler_params={"batch_size": batch_size, "epochs": epochs}, seed=seed, dataset_size=dataset_size,
                    steps_per_epoch=steps_per_epoch)


def make_project(root: Path, *, train: dict | None = None, epochs: int = 2, batch_size: int = 64,
                 noise_multiplier: float = 1.0, sampler: str = "poisson", accounted: str = "poisson",
                 schedule: Schedule | None = None, mechanism: str = "identity", mechanism_params: dict | None = None) -> Path:
    """Write params.yaml, artifacts/calibration/calibration.json and artifacts/schedule/ under ``root``."""
    schedule = schedule or poisson_schedule(TRAIN_SIZE, batch_size, epochs, seed=7, sampler=sampler)
    steps = schedule.num_steps
    curve = [(s, 3.0 * (s / steps) ** 0.5) for s in range(10, steps + 1, 10)] + [(steps, 3.0)]
    record = CalibrationRecord(
        noise_multiplier=noise_multiplier, epsilon=3.0, delta=1e-5, accountant="pld", sampler=accounted,
        assumptions=["fixture"], steps=steps, batch_size=batch_size, dataset_size=TRAIN_SIZE, epochs=epochs,
        mechanism=mechanism, mechanism_params=mechanism_params or {}, epsilon_curve=curve,
    )
    record.save(root / "artifacts/calibration/calibration.json")
    schedule.save(root / "artifacts/schedule")
    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    params["batching"] = {"batch_size": batch_size, "epochs": epochs}
    params["train"] = {**params["train"], **(train or {})}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root / "params.yaml"
